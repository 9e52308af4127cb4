// The verbs transport (rdma_cm + RC queue pairs), wire-compatible with rsocket.
#pragma once

#include "wire/transport.h"

namespace gpusock::wire::verbs {

// Opens the first RDMA device (or GPUSOCK_VERBS_DEVICE). -ENODEV with a message
// naming what is missing when there is none.
gs_status_t open_verbs_domain(std::unique_ptr<Domain> *out, std::string *error);

}  // namespace gpusock::wire::verbs
