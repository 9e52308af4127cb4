// The verbs endpoint: rdma_cm in the RDMA_PS_TCP port space and an RC queue
// pair, set up exactly as rdma-core's rsocket does (docs/wire-protocol.md §1),
// so an unmodified rsocket peer sees nothing unusual; and its wait objects.
#include "wire/verbs/verbs_endpoint.h"

#include <arpa/inet.h>
#include <endian.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <vector>

namespace gpusock::wire::verbs {
namespace {

constexpr int kResolveTimeoutMs = 2000;
constexpr uint32_t kDefaultInline = 64;
constexpr int kPostRecvBatch = 64;
constexpr uint64_t kSkipCompletion = ~uint64_t(0);
// Receives carry this tag: a failed completion defines only wr_id and status,
// not the opcode, so wr_id alone must tell receives from writes (tokens are
// sequence numbers and never reach bit 62).
constexpr uint64_t kRecvTag = uint64_t(1) << 62;

// rsocket's connection parameters (§1.4 step 4, §9.2).
rdma_conn_param rsocket_conn_param(const void *private_data, uint32_t private_len, bool iwarp) {
  rdma_conn_param p{};
  p.private_data = private_data;
  p.private_data_len = static_cast<uint8_t>(private_len);
  p.responder_resources = 0;
  p.initiator_depth = iwarp ? 1 : 0;  // rsocket's work-around for an iWARP RDMA READ at connect
  p.flow_control = 1;
  p.retry_count = 7;
  p.rnr_retry_count = 7;  // 7 = retry for ever on RNR NAK
  return p;
}

int status_of_cm_failure(rdma_cm_event_type type) {
  switch (type) {
    case RDMA_CM_EVENT_REJECTED:
      return -ECONNREFUSED;
    case RDMA_CM_EVENT_ADDR_ERROR:
      return -EADDRNOTAVAIL;
    case RDMA_CM_EVENT_ROUTE_ERROR:
      return -ENETUNREACH;
    case RDMA_CM_EVENT_UNREACHABLE:
      return -EHOSTUNREACH;
    case RDMA_CM_EVENT_CONNECT_ERROR:
      return -ECONNREFUSED;
    default:
      return -EIO;
  }
}

class VerbsEndpoint final : public Endpoint {
 public:
  VerbsEndpoint(const VerbsDevice *device, const EndpointAttr &attr, bool iwarp)
      : device_(device), attr_(attr), iwarp_(iwarp) {}
  ~VerbsEndpoint() override { destroy(); }

  int init_active();
  int init_passive(VerbsRequest *request);
  int accept(VerbsRequest *request, const void *private_data, uint32_t private_len);

  gs_status_t connect(const sockaddr *addr, socklen_t len, const void *private_data, uint32_t private_len) override {
    if (!id_ || private_len > sizeof private_) return -EINVAL;
    std::memcpy(private_, private_data, private_len);
    private_len_ = private_len;
    copy_addr(addr, &peer_, &peer_len_);
    (void)len;
    if (rdma_resolve_addr(id_, nullptr, const_cast<sockaddr *>(addr), kResolveTimeoutMs)) return -errno;
    return 0;
  }

  gs_status_t post_write(const WriteRequest &r) override {
    if (!qp_) return -ENOTCONN;
    const bool msg_send = iwarp_ && r.has_imm;
    ibv_sge sge{}, word{};
    ibv_send_wr wr{}, msg{}, *bad = nullptr;
    wr.wr_id = r.token;
    wr.opcode = r.has_imm && !msg_send ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    if (r.has_imm && !msg_send) wr.imm_data = htobe32(r.imm);
    wr.wr.rdma.remote_addr = r.remote_addr;
    wr.wr.rdma.rkey = r.rkey;
    if (r.length > 0) {
      sge.addr = reinterpret_cast<uintptr_t>(r.local);
      sge.length = r.length;
      sge.lkey = r.region ? static_cast<ibv_mr *>(r.region->desc)->lkey : 0;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      if (r.inline_data && r.length <= max_inline_) wr.send_flags = IBV_SEND_INLINE;
    }
    ibv_send_wr *first = &wr;
    if (msg_send) {
      // iWARP: the payload as a plain write (if any), then the 4-byte message
      // word as an inline send, in host order (§2.9). The send's completion
      // carries the token; the write's is skipped.
      wr.wr_id = kSkipCompletion;
      word.addr = reinterpret_cast<uintptr_t>(&r.imm);
      word.length = sizeof r.imm;
      msg.wr_id = r.token;
      msg.opcode = IBV_WR_SEND;
      msg.sg_list = &word;
      msg.num_sge = 1;
      msg.send_flags = IBV_SEND_INLINE;
      if (r.length > 0) wr.next = &msg;
      else first = &msg;
    }
    const int rc = ibv_post_send(qp_, first, &bad);
    return rc == 0 ? 0 : (rc == ENOMEM ? -EAGAIN : -rc);
  }

  gs_status_t post_recv(uint32_t count) override {
    if (!qp_) {  // before the QP exists (active side): post once it does
      deferred_recvs_ += count;
      return 0;
    }
    // §1.6: receives carry no scatter entries; immediates need no buffer. On
    // iWARP each receive takes the peer's 4-byte message word into a slot of
    // our own registered array, which receives fill in order.
    ibv_recv_wr wrs[kPostRecvBatch]{};
    ibv_sge words[kPostRecvBatch]{};
    while (count > 0) {
      const int n = static_cast<int>(std::min<uint32_t>(count, kPostRecvBatch));
      for (int i = 0; i < n; ++i) {
        wrs[i].wr_id = kRecvTag;
        wrs[i].num_sge = 0;
        if (!msg_words_.empty()) {
          const uint32_t slot = msg_next_post_++ % msg_words_.size();
          words[i] = {reinterpret_cast<uintptr_t>(&msg_words_[slot]), sizeof(uint32_t), msg_mr_->lkey};
          wrs[i].wr_id = kRecvTag | slot;
          wrs[i].sg_list = &words[i];
          wrs[i].num_sge = 1;
        }
        wrs[i].next = i + 1 < n ? &wrs[i + 1] : nullptr;
      }
      ibv_recv_wr *bad = nullptr;
      const int rc = ibv_post_recv(qp_, wrs, &bad);
      if (rc) return rc == ENOMEM ? -EAGAIN : -rc;
      count -= static_cast<uint32_t>(n);
    }
    return 0;
  }

  int poll(Completion *out, int max) override {
    if (!cq_ || max <= 0) return 0;
    int produced = 0;
    size_t taken = 0;
    // What arm_wait found after re-arming comes first, in order.
    while (taken < stash_.size() && produced < max) produced += to_completion(stash_[taken++], &out[produced]);
    stash_.erase(stash_.begin(), stash_.begin() + static_cast<std::ptrdiff_t>(taken));
    if (produced == max) return produced;
    ibv_wc wc[32];
    const int n = ibv_poll_cq(cq_, std::min(max - produced, 32), wc);
    if (n < 0) return produced > 0 ? produced : -EIO;
    for (int i = 0; i < n; ++i) produced += to_completion(wc[i], &out[produced]);
    return produced;
  }

  int poll_cm(CmEvent *out) override;
  void disconnect() override { shut(); }
  uint32_t max_inline() const override { return max_inline_; }
  gs_status_t local_address(sockaddr_storage *out, socklen_t *len) const override {
    if (!id_) return -ENOTCONN;
    copy_addr(rdma_get_local_addr(id_), out, len);
    return 0;
  }
  gs_status_t peer_address(sockaddr_storage *out, socklen_t *len) const override {
    if (!id_) return -ENOTCONN;
    copy_addr(rdma_get_peer_addr(id_), out, len);
    return 0;
  }
  // One epoll fd over the CQ's completion channel and the rdma_cm event
  // channel: readable when a completion was notified or a CM event waits.
  int wait_fd() const override { return epfd_; }
  gs_status_t arm_wait() override;
  // ibv_poll_cq is the only look at the CQ, and it takes the provider's lock.
  bool maybe_ready() const override { return true; }

 private:
  int init_wait();
  int create_qp();
  int move_qp(ibv_qp_state state, uint8_t depth);
  int ready_qp(uint8_t responder_resources, uint8_t initiator_depth);
  void established(const rdma_cm_event &event, CmEvent *out);
  // One work completion as a Completion: 1, or 0 for the payload half of an
  // iWARP message (its send completes the token).
  int to_completion(const ibv_wc &wc, Completion *out) const {
    if (wc.wr_id == kSkipCompletion && wc.status == IBV_WC_SUCCESS) return 0;
    Completion &c = *out;
    c = Completion{};
    c.status = wc.status == IBV_WC_SUCCESS ? 0 : (wc.status == IBV_WC_WR_FLUSH_ERR ? -ECONNRESET : -EIO);
    if (wc.wr_id != kSkipCompletion && (wc.wr_id & kRecvTag)) {
      c.kind = CompletionKind::kRecvImm;
      if (wc.status != IBV_WC_SUCCESS) {
        // flushed or failed: no immediate to report
      } else if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        c.imm = be32toh(wc.imm_data);
        c.length = wc.byte_len;
      } else if (!msg_words_.empty()) {  // iWARP message word, sender's host order
        c.imm = msg_words_[(wc.wr_id & ~kRecvTag) % msg_words_.size()];
      }
    } else {
      c.kind = CompletionKind::kWriteDone;
      c.token = wc.wr_id;
    }
    return 1;
  }
  // The QP to error (iWARP: SQD), as rdma_disconnect does to a QP of rdma_cm's,
  // then the DREQ.
  void shut() {
    if (!id_ || !connected_) return;
    connected_ = false;
    if (qp_) set_qp_state(iwarp_ ? IBV_QPS_SQD : IBV_QPS_ERR);
    rdma_disconnect(id_);
  }
  void set_qp_state(ibv_qp_state state) {
    ibv_qp_attr a{};
    a.qp_state = state;
    ibv_modify_qp(qp_, &a, IBV_QP_STATE);
  }
  void destroy() {
    shut();
    if (qp_) ibv_destroy_qp(qp_);
    qp_ = nullptr;
    if (cq_) ibv_destroy_cq(cq_);
    cq_ = nullptr;
    if (msg_mr_) ibv_dereg_mr(msg_mr_);
    msg_mr_ = nullptr;
    if (id_) rdma_destroy_id(id_);
    id_ = nullptr;
    if (channel_) rdma_destroy_event_channel(channel_);
    channel_ = nullptr;
    if (comp_channel_) ibv_destroy_comp_channel(comp_channel_);  // after its CQ
    comp_channel_ = nullptr;
    if (epfd_ >= 0) close(epfd_);
    epfd_ = -1;
  }

  const VerbsDevice *device_;
  EndpointAttr attr_;
  bool iwarp_;
  rdma_event_channel *channel_ = nullptr;
  ibv_comp_channel *comp_channel_ = nullptr;  // the CQ's notifications
  int epfd_ = -1;                             // wait_fd: both channels
  std::vector<ibv_wc> stash_;                 // completions arm_wait polled
  rdma_cm_id *id_ = nullptr;
  ibv_cq *cq_ = nullptr;
  ibv_qp *qp_ = nullptr;
  uint32_t max_inline_ = 0;
  uint32_t deferred_recvs_ = 0;
  std::vector<uint32_t> msg_words_;  // iWARP: one receive slot per posted receive
  ibv_mr *msg_mr_ = nullptr;
  uint64_t msg_next_post_ = 0;
  bool connected_ = false;
  uint8_t private_[64] = {};
  uint32_t private_len_ = 0;
  sockaddr_storage peer_{};
  socklen_t peer_len_ = 0;
};

int VerbsEndpoint::init_wait() {
  channel_ = rdma_create_event_channel();
  if (!channel_) return -errno;
  if (int rc = set_nonblocking(channel_->fd); rc < 0) return rc;
  comp_channel_ = ibv_create_comp_channel(device_->context);
  if (!comp_channel_) return errno ? -errno : -ENOMEM;
  if (int rc = set_nonblocking(comp_channel_->fd); rc < 0) return rc;
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epfd_ < 0) return -errno;
  for (int fd : {channel_->fd, comp_channel_->fd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) return -errno;
  }
  return 0;
}

int VerbsEndpoint::init_active() {
  if (int rc = init_wait(); rc < 0) return rc;
  if (rdma_create_id(channel_, &id_, this, RDMA_PS_TCP)) return -errno;
  return 0;
}

int VerbsEndpoint::init_passive(VerbsRequest *request) {
  if (int rc = init_wait(); rc < 0) return rc;
  id_ = request->take_id();
  if (rdma_migrate_id(id_, channel_)) return -errno;  // events of this connection come here
  return create_qp();                                 // §1.5 step 4: QP and receives exist before the reply
}

int VerbsEndpoint::create_qp() {
  // Registered memory belongs to the domain's device (its own context of it).
  if (!id_->verbs || id_->verbs->device != device_->context->device) return -EXDEV;
  const auto &dev = device_->attr;
  const int max_wr = dev.max_qp_wr > 0 ? dev.max_qp_wr : 1024;
  const int send_depth = std::min<int>(static_cast<int>(attr_.send_depth), max_wr);
  const int recv_depth = std::min<int>(static_cast<int>(attr_.recv_depth), max_wr);
  cq_ = ibv_create_cq(device_->context, send_depth + recv_depth, nullptr, comp_channel_, 0);
  if (!cq_) return -ENOMEM;
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = cq_;
  qa.qp_type = IBV_QPT_RC;
  qa.sq_sig_all = 1;  // §1.6: every send signalled
  qa.cap.max_send_wr = static_cast<uint32_t>(send_depth);
  qa.cap.max_recv_wr = static_cast<uint32_t>(recv_depth);
  qa.cap.max_send_sge = 2;
  qa.cap.max_recv_sge = 1;
  qa.cap.max_inline_data = attr_.inline_size ? attr_.inline_size : kDefaultInline;
  if (iwarp_) {
    qa.cap.max_inline_data = std::max<uint32_t>(qa.cap.max_inline_data, 4);  // the message word goes inline
    msg_words_.assign(static_cast<size_t>(recv_depth), 0);
    msg_mr_ = ibv_reg_mr(device_->pd, msg_words_.data(), msg_words_.size() * sizeof(uint32_t), IBV_ACCESS_LOCAL_WRITE);
    if (!msg_mr_) return -ENOMEM;
  }
  qp_ = ibv_create_qp(device_->pd, &qa);
  if (!qp_) return errno ? -errno : -ENOMEM;
  if (int rc = move_qp(IBV_QPS_INIT, 0); rc < 0) return rc;  // what rdma_create_qp does
  max_inline_ = qa.cap.max_inline_data;                      // what the provider granted
  const uint32_t deferred = deferred_recvs_;
  deferred_recvs_ = 0;
  return deferred ? post_recv(deferred) : 0;
}

// The QP is ours, not rdma_cm's (verbs_transport.cc says why), so the state
// changes rdma_cm makes to a QP of its own are made here, with the attributes
// rdma_cm gives for the connection (rdma_init_qp_attr), as librdmacm makes them.
int VerbsEndpoint::move_qp(ibv_qp_state state, uint8_t depth) {
  ibv_qp_attr a{};
  int mask = 0;
  a.qp_state = state;
  if (rdma_init_qp_attr(id_, &a, &mask)) return -errno;
  if (state == IBV_QPS_RTR) {
    ibv_port_attr port{};
    // librdmacm's work-around for an rdma_ucm bug: RoCE's mask bits 21-24 off on InfiniBand.
    if (ibv_query_port(device_->context, id_->port_num, &port) == 0 && port.link_layer == IBV_LINK_LAYER_INFINIBAND)
      mask &= ~0xe00000;
    if (depth != RDMA_MAX_RESP_RES) a.max_dest_rd_atomic = depth;
  } else if (state == IBV_QPS_RTS && depth != RDMA_MAX_INIT_DEPTH) {
    a.max_rd_atomic = depth;
  }
  const int rc = ibv_modify_qp(qp_, &a, mask);
  return rc ? -rc : 0;
}

int VerbsEndpoint::ready_qp(uint8_t responder_resources, uint8_t initiator_depth) {
  int rc = move_qp(IBV_QPS_INIT, 0);  // again: rdma_cm's values replace the defaults
  if (rc == 0) rc = move_qp(IBV_QPS_RTR, responder_resources);
  if (rc == 0) rc = move_qp(IBV_QPS_RTS, initiator_depth);
  if (rc < 0) set_qp_state(IBV_QPS_ERR);
  return rc;
}

int VerbsEndpoint::accept(VerbsRequest *request, const void *private_data, uint32_t private_len) {
  // §1.5 step 6: accept with the request's own parameters, our record as data.
  rdma_conn_param param = request->param();
  param.private_data = private_data;
  param.private_data_len = static_cast<uint8_t>(private_len);
  param.qp_num = qp_->qp_num;
  param.srq = 0;
  if (int rc = ready_qp(param.responder_resources, param.initiator_depth); rc < 0) return rc;
  if (rdma_accept(id_, &param)) {
    const int rc = -errno;
    set_qp_state(IBV_QPS_ERR);
    return rc;
  }
  return 0;
}

void VerbsEndpoint::established(const rdma_cm_event &event, CmEvent *out) {
  connected_ = true;
  out->kind = CmEventKind::kEstablished;
  const auto &conn = event.param.conn;
  out->peer_private_len = std::min<uint32_t>(conn.private_data_len, sizeof out->peer_private_data);
  if (conn.private_data) std::memcpy(out->peer_private_data, conn.private_data, out->peer_private_len);
}

// The verbs way to sleep: take the notifications already delivered, re-arm
// the CQ, then poll it once more, since a completion that came before the
// re-arm notifies nobody (kept in stash_ for poll). CM events: the channel is
// readable while one waits.
gs_status_t VerbsEndpoint::arm_wait() {
  if (!stash_.empty()) return -EAGAIN;
  if (cq_) {
    ibv_cq *event_cq = nullptr;
    void *context = nullptr;
    unsigned events = 0;
    while (ibv_get_cq_event(comp_channel_, &event_cq, &context) == 0) ++events;
    if (events > 0) ibv_ack_cq_events(cq_, events);
    if (ibv_req_notify_cq(cq_, 0) != 0) return -EIO;
    ibv_wc wc[32];
    const int n = ibv_poll_cq(cq_, 32, wc);
    if (n < 0) return -EIO;
    if (n > 0) {
      stash_.insert(stash_.end(), wc, wc + n);
      return -EAGAIN;
    }
  }
  return fd_readable(channel_->fd) ? -EAGAIN : 0;
}

int VerbsEndpoint::poll_cm(CmEvent *out) {
  if (!channel_) return 0;
  rdma_cm_event *event = nullptr;
  if (rdma_get_cm_event(channel_, &event)) return 0;
  const rdma_cm_event_type type = event->event;
  *out = CmEvent{};
  int result = 1;
  switch (type) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      if (rdma_resolve_route(id_, kResolveTimeoutMs)) {
        out->kind = CmEventKind::kRejected;
        out->status = -errno;
        out->reason =
            "rdma_cm could not resolve a route to that address (no RDMA device serves it; loopback never does)";
      } else {
        result = 0;
      }
      break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED: {
      int rc = create_qp();
      if (rc == 0) {
        rdma_conn_param param = rsocket_conn_param(private_, private_len_, iwarp_);
        param.qp_num = qp_->qp_num;
        if (rdma_connect(id_, &param)) rc = -errno;
      }
      if (rc < 0) {
        out->kind = CmEventKind::kRejected;
        out->status = rc;
        out->reason = rc == -EXDEV
                          ? "the address resolves to another RDMA device than the one in use (GPUSOCK_VERBS_DEVICE)"
                          : "could not create the queue pair or send the connect request";
      } else {
        result = 0;
      }
      break;
    }
    case RDMA_CM_EVENT_CONNECT_RESPONSE: {
      // The server accepted: with a QP of our own rdma_cm leaves readying it
      // and the RTU (rdma_establish) to us, as librdmacm does for its own QPs.
      int rc = ready_qp(RDMA_MAX_RESP_RES, RDMA_MAX_INIT_DEPTH);
      if (rc == 0 && rdma_establish(id_)) rc = -errno;
      if (rc < 0) {
        set_qp_state(IBV_QPS_ERR);
        out->kind = CmEventKind::kRejected;
        out->status = rc;
        out->reason = "could not make the queue pair ready for the accepted connection";
      } else {
        established(*event, out);
      }
      break;
    }
    case RDMA_CM_EVENT_ESTABLISHED:  // the server's side (the client's comes as CONNECT_RESPONSE)
      if (connected_) result = 0;
      else established(*event, out);
      break;
    case RDMA_CM_EVENT_DISCONNECTED:
      out->kind = CmEventKind::kDisconnected;
      out->status = -ECONNRESET;
      shut();
      break;
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      out->kind = CmEventKind::kError;
      out->status = -ENODEV;
      break;
    case RDMA_CM_EVENT_REJECTED:
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_CONNECT_ERROR:
      out->kind = CmEventKind::kRejected;
      // The event's own status says most (e.g. -ENODEV for loopback, which
      // rdma_cm cannot reach); a reject carries a CM reason instead.
      out->status = type != RDMA_CM_EVENT_REJECTED && event->status < 0 ? event->status : status_of_cm_failure(type);
      out->reason = type == RDMA_CM_EVENT_REJECTED
                        ? "the peer rejected the connection (no rsocket listener on that port, or a bad record)"
                    : type == RDMA_CM_EVENT_ADDR_ERROR
                        ? "rdma_cm could not resolve the address to an RDMA device (ADDR_ERROR)"
                    : type == RDMA_CM_EVENT_ROUTE_ERROR ? "rdma_cm could not resolve a route to the peer (ROUTE_ERROR)"
                    : type == RDMA_CM_EVENT_UNREACHABLE ? "the peer is unreachable over RDMA (UNREACHABLE)"
                                                        : "the RDMA connection failed (CONNECT_ERROR)";
      break;
    default:
      result = 0;  // TIMEWAIT_EXIT and friends: nothing for the caller
      break;
  }
  rdma_ack_cm_event(event);
  return result;
}

}  // namespace

gs_status_t create_verbs_endpoint(const VerbsDevice *device, const EndpointAttr &attr, bool iwarp,
                                  VerbsRequest *request, std::unique_ptr<Endpoint> *out) {
  auto ep = std::make_unique<VerbsEndpoint>(device, attr, iwarp);
  const int rc = request ? ep->init_passive(request) : ep->init_active();
  if (rc < 0) return rc;
  *out = std::move(ep);
  return 0;
}

gs_status_t accept_verbs_endpoint(Endpoint *endpoint, VerbsRequest *request, const void *private_data,
                                  uint32_t private_len) {
  return static_cast<VerbsEndpoint *>(endpoint)->accept(request, private_data, private_len);
}

}  // namespace gpusock::wire::verbs
