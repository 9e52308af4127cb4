// The libfabric transport as the transport factory (wire/transport.cc) sees
// it: which specs it serves and how to open one. No libfabric header here, so
// the factory and what links it never see libfabric's.
#pragma once

#include "wire/transport.h"

#include <memory>
#include <string>
#include <string_view>

namespace gpusock::wire::fabric {

// Whether `spec` names a provider of the table ("fabric:tcp", "fabric:shm").
bool is_fabric_spec(std::string_view spec);

// Opens "fabric:<provider>" (a row of kProviderAttrs). On failure `error` says
// why (provider missing, fi_getinfo's answer).
gs_status_t open_fabric_domain(std::string_view spec, std::unique_ptr<Domain> *out, std::string *error);

}  // namespace gpusock::wire::fabric
