// What the libfabric endpoint flavours (fabric_msg.cc, fabric_rdm.cc) share:
// status mapping, the fabric and domain objects, memory registration, endpoint
// CQs, the ordered write-completion ring, posting writes and reading
// completions (FabricEndpointBase), and the Domain calls that only differ in
// their types.
#pragma once

#include "wire/fabric/fabric_attr.h"
#include "wire/fabric/fabric_domain.h"
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
  // drain() would hand out a completion now.
  bool head_done() const { return head_ != tail_ && slots_[head_ & mask_].done; }
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

const std::string &error_detail();  // below: what the last failing call of this thread found

// Fabric + domain + the fi_info they came from; memory registration. The MSG
// and RDM domains derive from it.
class FabricDomainBase : public Domain {
 public:
  std::string last_error_detail() const override { return error_detail(); }
  ~FabricDomainBase() override;

  const TransportCaps &caps() const override { return caps_; }
  DeviceMemorySupport device_memory_support(void *gpu_buffer, size_t length,
                                            int cuda_device) override;  // fabric_hmem.cc
  gs_status_t register_memory(void *base, size_t length, unsigned access, MemoryRegion *out) override;
  void deregister_memory(MemoryRegion *region) override;

  const ProviderAttr &attr() const { return attr_; }
  const fi_info *info() const { return info_.get(); }
  fid_fabric *fabric() const { return fabric_; }
  fid_domain *domain() const { return domain_; }
  // What the CQ data of a write carries: the 32-bit immediate in the low half,
  // and when the provider gives 8 bytes, the target's CQ tag and the write's
  // length in the high half (make_cq_data; tcp reports len 0 for remote
  // writes, so the length travels with the data).
  bool length_in_cq_data() const { return length_in_cq_data_; }
  bool rx_cq_data() const { return rx_cq_data_; }
  uint32_t inject_size() const { return inject_size_; }
  // Endpoint::inbound_capacity of this domain's endpoints: the receive queue
  // where the provider row sizes it (shm), unbounded elsewhere.
  uint32_t inbound_capacity() const { return inbound_capacity_; }
  // A CQ for endpoints: data format, room for both queues of `endpoints`
  // endpoints opened with `info` (the domain's when null), and `wait_obj`
  // (FI_WAIT_FD: an fd to sleep on; FI_WAIT_NONE).
  gs_status_t open_endpoint_cq(fid_cq **out, fi_wait_obj wait_obj, const fi_info *info = nullptr,
                               uint32_t endpoints = 1) const;

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
  uint32_t inbound_capacity_ = UINT32_MAX;
};

// Opens a DomainT (FabricDomainBase + `open(error)`) into *out.
template <class DomainT>
gs_status_t open_domain_as(const ProviderAttr &attr, std::unique_ptr<Domain> *out, std::string *error) {
  if (out == nullptr) return -EINVAL;
  auto domain = std::make_unique<DomainT>(attr);
  gs_status_t ret = domain->open(error);
  if (ret < 0) return ret;
  *out = std::move(domain);
  return 0;
}

// Domain::create_endpoint for both flavours: an EndpointT(domain) after
// init(), and for a request (a RequestT not yet answered) init_from_request().
template <class EndpointT, class RequestT, class DomainT>
gs_status_t create_endpoint_as(DomainT *domain, ConnectionRequest *request, std::unique_ptr<Endpoint> *out) {
  if (out == nullptr) return -EINVAL;
  RequestT *typed = nullptr;
  if (request != nullptr) {
    typed = dynamic_cast<RequestT *>(request);
    if (typed == nullptr || typed->answered()) return -EINVAL;
  }
  auto endpoint = std::make_unique<EndpointT>(domain);
  gs_status_t ret = endpoint->init();
  if (ret == 0 && typed != nullptr) ret = endpoint->init_from_request(typed);
  if (ret < 0) return ret;
  *out = std::move(endpoint);
  return 0;
}

// Domain::accept for both flavours: checks, then EndpointT::start_accept.
template <class EndpointT, class RequestT>
gs_status_t accept_as(const TransportCaps &caps, Endpoint *endpoint, ConnectionRequest *request,
                      const void *private_data, uint32_t private_len) {
  auto *typed_endpoint = dynamic_cast<EndpointT *>(endpoint);
  auto *typed_request = dynamic_cast<RequestT *>(request);
  if (typed_endpoint == nullptr || typed_request == nullptr || typed_request->answered()) return -EINVAL;
  if (private_len > caps.max_private_data || (private_len != 0 && private_data == nullptr)) return -EINVAL;
  return typed_endpoint->start_accept(typed_request, private_data, private_len);
}

// The 8-byte CQ data a write carries (see length_in_cq_data()): the immediate
// in the low half; in the high half the target's completion-queue tag (which
// of the endpoints sharing the target's CQ the write is for; fabric_msg.cc,
// "Shared completion queues") and the write's length. Lengths from
// kCqDataMaxLength up read as that value (gpusock writes at most kMaxWrite).
constexpr uint32_t kCqTagBits = 12;
constexpr uint32_t kCqDataMaxLength = (1u << (32 - kCqTagBits)) - 1;
inline uint64_t make_cq_data(uint32_t imm, uint32_t length, uint32_t tag) {
  const uint32_t high =
      (tag & ((1u << kCqTagBits) - 1)) | ((length < kCqDataMaxLength ? length : kCqDataMaxLength) << kCqTagBits);
  return static_cast<uint64_t>(imm) | (static_cast<uint64_t>(high) << 32);
}
inline uint32_t cq_data_tag(uint64_t data) { return static_cast<uint32_t>(data >> 32) & ((1u << kCqTagBits) - 1); }

// Translate one data CQ entry that carries remote CQ data.
inline void fill_recv_imm(uint64_t data, size_t len, bool length_in_data, Completion *out) {
  out->kind = CompletionKind::kRecvImm;
  out->status = 0;
  out->token = 0;
  out->imm = static_cast<uint32_t>(data);
  out->length = length_in_data ? static_cast<uint32_t>(data >> (32 + kCqTagBits)) : static_cast<uint32_t>(len);
}

// What an errno cannot say about this thread's last failed transport call
// (who holds a port, ...), or empty. Set by the call; with GPUSOCK_LOG set to
// info or debug it is also printed to stderr.
void set_error_detail(std::string text);
const std::string &error_detail();

constexpr int kCqBatch = 16;  // CQ entries read per fi_cq_read

// One CQ entry as gpusock looks at it. status: 0, or the negative status of
// an error entry.
struct CqEntry {
  void *context = nullptr;
  uint64_t data = 0;
  size_t len = 0;
  uint64_t flags = 0;
  int status = 0;
};

// One fi_cq_read of at most min(max, kCqBatch) entries, each given to
// on_entry(const CqEntry &); when the read says an error entry waits, that
// one instead. Returns the entries given, 0 when the CQ is empty, or < 0.
template <class OnEntry>
int read_cq_entries(fid_cq *cq, int max, OnEntry &&on_entry) {
  fi_cq_data_entry entries[kCqBatch];
  const ssize_t got = fi_cq_read(cq, entries, static_cast<size_t>(max < kCqBatch ? max : kCqBatch));
  if (got > 0) {
    for (ssize_t i = 0; i < got; ++i) {
      const fi_cq_data_entry &e = entries[i];
      on_entry(CqEntry{e.op_context, e.data, e.len, e.flags, 0});
    }
    return static_cast<int>(got);
  }
  if (got == -FI_EAGAIN) return 0;
  if (got != -FI_EAVAIL) return fi_status(got);
  fi_cq_err_entry err{};
  if (fi_cq_readerr(cq, &err, 0) <= 0) return 0;
  const int status = fi_status(-static_cast<int64_t>(err.err != 0 ? err.err : FI_EIO));
  on_entry(CqEntry{err.op_context, err.data, err.len, err.flags, status});
  return 1;
}

// What the MSG and RDM endpoints share: the connection state, the ordered
// write ring, posting writes, and turning CQ entries into completions.
class FabricEndpointBase : public Endpoint {
 public:
  uint32_t max_inline() const override { return inject_size_; }
  uint32_t inbound_capacity() const override { return inbound_capacity_; }

 protected:
  enum class State : uint8_t { kIdle, kConnecting, kAccepting, kEstablished, kClosed };

  // The ring sized to the domain's transmit queue; CQ data layout; inject size.
  gs_status_t init_base(const FabricDomainBase &domain);
  // One write on `ep` to `dest` (0 on a connected endpoint). Inline writes
  // that fit the inject size take no provider completion (a slot done at
  // once); others carry their ring slot as context.
  gs_status_t post_write_to(fid_ep *ep, fi_addr_t dest, const WriteRequest &request);
  gs_status_t post_delivered_write(fid_ep *ep, fi_addr_t dest, const WriteRequest &request);
  // One CQ entry, if it is ours: our write is marked done in the ring (0),
  // a write carrying CQ data becomes a kRecvImm completion in *out (1), with
  // the entry's status either way; -1 for anything else.
  int take_entry(const CqEntry &entry, Completion *out) {
    if (ring_.owns(entry.context)) {
      TxRing::complete(entry.context, entry.status);
      return 0;
    }
    if ((entry.flags & FI_REMOTE_CQ_DATA) == 0) return -1;
    fill_recv_imm(entry.data, entry.len, length_in_data_, out);
    out->status = entry.status;
    return 1;
  }
  // One read_cq_entries of at most max entries, each through take_entry
  // (*produced completions in out); what is not ours goes to on_other(entry),
  // and an error entry, ours or not, then to on_error(entry, ours). Returns
  // the entries read, or < 0.
  template <class OnOther, class OnError>
  int read_cq(fid_cq *cq, Completion *out, int max, int *produced, OnOther &&on_other, OnError &&on_error);

  TxRing ring_;
  State state_ = State::kIdle;
  bool length_in_data_ = false;
  uint32_t peer_cq_tag_ = 0;  // the peer's CQ tag, carried in the CQ data of our writes
  uint32_t inject_size_ = 0;
  uint32_t inbound_capacity_ = UINT32_MAX;
  // A closing write asks for FI_DELIVERY_COMPLETE: set where a completion
  // otherwise means only that a local socket took the bytes (tcp).
  bool delivery_acks_ = false;
};

template <class OnOther, class OnError>
int FabricEndpointBase::read_cq(fid_cq *cq, Completion *out, int max, int *produced, OnOther &&on_other,
                                OnError &&on_error) {
  *produced = 0;
  if (max <= 0) return 0;
  int n = 0;
  const int got = read_cq_entries(cq, max, [&](const CqEntry &entry) {
    const int taken = take_entry(entry, &out[n]);
    n += taken > 0 ? 1 : 0;
    if (entry.status != 0) {
      on_error(entry, taken >= 0);
    } else if (taken < 0) {
      on_other(entry);
    }
  });
  *produced = n;
  return got;
}

// Socket address helpers.
socklen_t sockaddr_len(const sockaddr *addr);
bool copy_sockaddr(const sockaddr *addr, socklen_t len, sockaddr_storage *out);
gs_status_t output_sockaddr(const sockaddr_storage &addr, sockaddr_storage *out, socklen_t *len);

}  // namespace gpusock::wire::fabric
