// What the libfabric endpoint flavours share: status mapping, the fabric and
// domain objects, memory registration, and the ordered write-completion ring.
#pragma once

#include "wire/fabric/fabric_attr.h"
#include "wire/transport.h"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <atomic>
#include <cstdint>
#include <ctime>
#include <memory>
#include <string>
#include <string_view>

namespace gpusock::wire::fabric {

// Opens "fabric:<provider>" (a row of kProviderAttrs). On failure `error` says
// why (provider missing, fi_getinfo's answer).
gs_status_t open_fabric_domain(std::string_view spec, std::unique_ptr<Domain> *out,
                               std::string *error);

// The two endpoint flavours (fabric_msg.cc, fabric_rdm.cc).
gs_status_t open_msg_domain(const ProviderAttr &attr, std::unique_ptr<Domain> *out, std::string *error);
gs_status_t open_rdm_domain(const ProviderAttr &attr, std::unique_ptr<Domain> *out, std::string *error);

// libfabric status (>= 0, or a negated FI_E* code) -> gs_status_t.
int fi_status(int64_t fi_ret);

// Text for a negated FI_E* code, for error messages.
std::string fi_error_text(int64_t fi_ret);

struct InfoDeleter {
  void operator()(fi_info *info) const { fi_freeinfo(info); }
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

template <class T>
void close_fid(T *&object) {
  if (object != nullptr) {
    fi_close(&object->fid);
    object = nullptr;
  }
}

// Coarse monotonic milliseconds (vDSO, a few ns): rate-limits slow checks.
inline uint64_t coarse_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000u + static_cast<uint64_t>(ts.tv_nsec) / 1000000u;
}

// Outstanding writes in posting order. The slot address is the libfabric
// operation context; completions may arrive in any order (shm's tx comp_order is
// FI_ORDER_NONE) but are handed out in posting order, as a verbs send queue
// would. Inject writes (no provider completion) take a slot that is done at once.
class TxRing {
 public:
  struct Slot {
    uint64_t token;
    int status;
    bool done;
  };

  gs_status_t init(size_t capacity);
  bool full() const { return tail_ - head_ > mask_; }
  bool empty() const { return tail_ == head_; }
  Slot *push(uint64_t token) {
    Slot &slot = slots_[tail_++ & mask_];
    slot.token = token;
    slot.status = 0;
    slot.done = false;
    return &slot;
  }
  void push_done(uint64_t token) { push(token)->done = true; }
  void unpush() { --tail_; }
  bool owns(const void *context) const {
    const Slot *p = static_cast<const Slot *>(context);
    return p >= slots_.get() && p <= slots_.get() + mask_;
  }
  static void complete(void *context, int status) {
    Slot *slot = static_cast<Slot *>(context);
    slot->status = status;
    slot->done = true;
  }
  // Completed writes at the head, in order: up to `max` into `out`.
  int drain(Completion *out, int max) {
    int n = 0;
    while (n < max && head_ != tail_) {
      Slot &slot = slots_[head_ & mask_];
      if (!slot.done) break;
      out[n].kind = CompletionKind::kWriteDone;
      out[n].status = slot.status;
      out[n].token = slot.token;
      out[n].imm = 0;
      out[n].length = 0;
      ++n;
      ++head_;
    }
    return n;
  }
  // The connection is gone: every outstanding write finishes with `status`.
  void fail_all(int status);

 private:
  std::unique_ptr<Slot[]> slots_;
  uint64_t mask_ = 0;
  uint64_t head_ = 0;
  uint64_t tail_ = 0;
};

// Fabric + domain + the fi_info they came from; memory registration. The MSG
// and RDM domains derive from it.
class FabricDomainBase : public Domain {
 public:
  ~FabricDomainBase() override;

  const TransportCaps &caps() const override { return caps_; }
  gs_status_t register_memory(void *base, size_t length, unsigned access, MemoryRegion *out) override;
  void deregister_memory(MemoryRegion *region) override;

  const ProviderAttr &attr() const { return attr_; }
  const fi_info *info() const { return info_.get(); }
  fid_fabric *fabric() const { return fabric_; }
  fid_domain *domain() const { return domain_; }
  // What the CQ data of a write carries: the 32-bit immediate in the low half,
  // and when the provider gives 8 bytes, the write's length in the high half
  // (tcp reports len 0 for remote writes, so the length travels with the data).
  bool length_in_cq_data() const { return length_in_cq_data_; }
  bool rx_cq_data() const { return rx_cq_data_; }
  uint32_t inject_size() const { return inject_size_; }

 protected:
  explicit FabricDomainBase(const ProviderAttr &attr) : attr_(attr) {}
  // fi_getinfo with our hints, fi_fabric, fi_domain.
  gs_status_t open_base(std::string *error);

  const ProviderAttr &attr_;
  InfoPtr info_;
  fid_fabric *fabric_ = nullptr;
  fid_domain *domain_ = nullptr;
  TransportCaps caps_;
  bool length_in_cq_data_ = false;
  bool rx_cq_data_ = false;
  uint32_t inject_size_ = 0;
  std::atomic<uint64_t> next_key_{1};
};

// Translate one data CQ entry that carries remote CQ data.
inline void fill_recv_imm(const fi_cq_data_entry &entry, bool length_in_data, Completion *out) {
  out->kind = CompletionKind::kRecvImm;
  out->status = 0;
  out->token = 0;
  out->imm = static_cast<uint32_t>(entry.data);
  out->length = length_in_data ? static_cast<uint32_t>(entry.data >> 32) : static_cast<uint32_t>(entry.len);
}

// The 8-byte CQ data a write carries (see length_in_cq_data()).
inline uint64_t make_cq_data(uint32_t imm, uint32_t length) {
  return static_cast<uint64_t>(imm) | (static_cast<uint64_t>(length) << 32);
}

// What an errno cannot say about this thread's last failed transport call
// (who holds a port, ...), or empty. Set by the call; with GPUSOCK_LOG set to
// info or debug it is also printed to stderr.
void set_error_detail(std::string text);
const std::string &error_detail();

// Socket address helpers.
socklen_t sockaddr_len(const sockaddr *addr);
bool copy_sockaddr(const sockaddr *addr, socklen_t len, sockaddr_storage *out);
gs_status_t output_sockaddr(const sockaddr_storage &addr, sockaddr_storage *out, socklen_t *len);

}  // namespace gpusock::wire::fabric
