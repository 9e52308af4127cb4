// Provider capability table (see fabric_attr.h). Facts are for libfabric 1.17:
//
// tcp  (prov/tcp, "tcpx"): FI_EP_MSG over one kernel TCP socket per endpoint.
//      mode 0 (no FI_RX_CQ_DATA: a write with remote CQ data needs no posted
//      receive), mr_mode 0 (scalable: the peer addresses a region by its
//      0-based offset, keys are ours), inject_size 128, tx/rx size 256,
//      cq_data_size 8, CM private data up to 256 bytes. No FI_HMEM. A write
//      completes once the kernel socket took it; with FI_DELIVERY_COMPLETE,
//      once the peer's provider acknowledged it.
// shm  (prov/shm): FI_EP_RDM over a /dev/shm region per endpoint, RMA through
//      CMA or the region's bounce buffers (a plain write: the initiator's
//      process_vm_writev; a write with CQ data: the target's progress pulls
//      it with process_vm_readv, under its region's lock). mode 0,
//      mr_mode FI_MR_VIRT_ADDR when offered (keys are ours), inject_size 4096
//      (0 when FI_HMEM is asked for), tx/rx size 1024, cq_data_size 8,
//      FI_PROGRESS_MANUAL data progress, no CM: gpusock carries its own
//      handshake (fabric_rdm.cc) and private data in it. FI_HMEM capable.
#include "wire/fabric/fabric_attr.h"
#include "wire/fabric/fabric_domain.h"

#include <rdma/fi_domain.h>

namespace gpusock::wire::fabric {

namespace {
constexpr uint64_t kOfferedMrMode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
}  // namespace

const ProviderAttr kProviderAttrs[] = {
    {
        .spec = "fabric:tcp",
        .prov_name = "tcp",
        .ep_type = FI_EP_MSG,
        .device_memory = false,
        .imm_consumes_recv = false,
        .max_private_data = 64,
        .mr_mode = kOfferedMrMode,
        .mode = FI_RX_CQ_DATA,
        .queue_entries = config::Id::kCount,
        .closing_write_acked = true,
    },
    {
        .spec = "fabric:shm",
        .prov_name = "shm",
        .ep_type = FI_EP_RDM,
        .device_memory = true,
        .imm_consumes_recv = false,
        .max_private_data = 64,
        .mr_mode = kOfferedMrMode,
        // FI_RX_CQ_DATA is not offered for RDM: our handshake messages share the
        // receive queue, and zero-length receives would swallow them.
        .mode = 0,
        // GPUSOCK_SHM_QUEUE (1024, shm's own default). The sizes decide
        // shm's free stacks of each endpoint and its completion queue (its
        // private memory, ~1.5 KiB an entry) and how many commands may wait
        // at the peer: a write with immediate takes 2 of the peer's command
        // slots, and the peer's credits allow GPUSOCK_RQSIZE (384) data
        // writes in flight. shm rounds its region up to a power of two and
        // zero-fills (strncpy) from the name to the end; those pages are
        // given back (shm::release_region_tail), so /dev/shm barely depends
        // on them.
        .queue_entries = config::Id::kShmQueueEntries,
        // A completion of a write with immediate means the target's progress
        // pulled the bytes into its memory.
        .closing_write_acked = false,
    },
};

const size_t kProviderAttrCount = sizeof(kProviderAttrs) / sizeof(kProviderAttrs[0]);

bool is_fabric_spec(std::string_view spec) { return find_provider_attr(spec) != nullptr; }

const ProviderAttr *find_provider_attr(std::string_view spec) {
  for (size_t i = 0; i < kProviderAttrCount; ++i) {
    if (spec == kProviderAttrs[i].spec) return &kProviderAttrs[i];
  }
  return nullptr;
}

}  // namespace gpusock::wire::fabric
