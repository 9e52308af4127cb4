// Capabilities of the libfabric providers gpusock drives, kept as data in the
// way libfabric keeps its own *_attr.c tables: one row per provider. The code in
// fabric_msg.cc / fabric_rdm.cc reads these rows; it does not test provider
// names itself.
#pragma once

#include "wire/config.h"

#include <rdma/fabric.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gpusock::wire::fabric {

struct ProviderAttr {
  const char *spec;           // transport spec: "fabric:tcp"
  const char *prov_name;      // libfabric provider name: "tcp"
  fi_ep_type ep_type;         // FI_EP_MSG (kernel connections) or FI_EP_RDM
  bool device_memory;         // provider can register device memory (FI_HMEM)
  bool imm_consumes_recv;     // remote CQ data consumes a posted receive
                              // (FI_RX_CQ_DATA); the mode bit fi_getinfo
                              // returns has the last word at run time
  uint32_t max_private_data;  // bytes connect/accept can carry (we cap at 64)
  uint64_t mr_mode;           // mr_mode bits we offer in the hints
  uint64_t mode;              // mode bits we can honour
  // The setting that sizes the transmit and receive queues we ask for
  // (config::Id::kCount: the provider's defaults).
  config::Id queue_entries;
  bool closing_write_acked;  // the DISCONNECT asks FI_DELIVERY_COMPLETE: a
                             // plain completion means only that a local
                             // socket took the bytes
};

// All rows; kProviderAttrCount of them.
extern const ProviderAttr kProviderAttrs[];
extern const size_t kProviderAttrCount;

// The row for a spec ("fabric:tcp"), or nullptr.
const ProviderAttr *find_provider_attr(std::string_view spec);

}  // namespace gpusock::wire::fabric
