// fabric:tcp connection endpoints (fabric_msg.cc describes the flavour and
// how waiting works).
#include "wire/fabric/fabric_msg.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace gpusock::wire::fabric::msg {
namespace {

class MsgEndpoint final : public FabricEndpointBase {
 public:
  explicit MsgEndpoint(MsgDomain *domain) : domain_(domain) {}
  ~MsgEndpoint() override;

  gs_status_t init();
  // Passive side: the fid_ep from a connection request.
  gs_status_t init_from_request(MsgConnectionRequest *request);
  gs_status_t start_accept(MsgConnectionRequest *request, const void *private_data, uint32_t private_len);

  gs_status_t connect(const sockaddr *addr, socklen_t len, const void *private_data, uint32_t private_len) override;
  gs_status_t post_write(const WriteRequest &request) override;
  gs_status_t post_recv(uint32_t count) override;
  int poll(Completion *out, int max) override;
  int poll_cm(CmEvent *out) override;
  void disconnect() override;
  gs_status_t local_address(sockaddr_storage *out, socklen_t *len) const override;
  gs_status_t peer_address(sockaddr_storage *out, socklen_t *len) const override;
  int wait_fd() const override { return wait_fd_; }
  gs_status_t arm_wait() override;
  bool maybe_ready() const override;
  bool quiet_unless_fd_readable() const override;

 private:
  gs_status_t open_ep(fi_info *info);
  gs_status_t post_recvs(uint32_t count);

  // Turns what the shared CQ held for us into completions.
  int translate(const CqItem *items, int count, Completion *out);

  MsgDomain *domain_;
  fid_ep *ep_ = nullptr;
  std::shared_ptr<CqGroup> cq_group_;  // the CQ this endpoint shares
  uint32_t tag_ = 0;                   // our place in it
  int wait_fd_ = -1;                   // the CQ's wait object (an epoll fd)
  CmMailbox mailbox_;
  bool registered_ = false;
  bool rx_cq_data_ = false;
  bool cq_dirty_ = false;        // the CQ may hold entries: our last read was not empty
  uint32_t deferred_recvs_ = 0;  // FI_RX_CQ_DATA: receives asked for before the ep existed
  uint64_t last_cm_check_ms_ = 0;
  bool delivered_ = false;        // poll() returned completions since the last poll_cm
  bool cm_check_now_ = false;     // poll() saw an error: look at the EQ soon
  uint8_t peer_record_[64] = {};  // passive side: the client's private data
  uint32_t peer_record_len_ = 0;
  Creator creator_;  // only it closes the fids (tcp takes the socket out of its shared epoll set)
  static char recv_dummy_;
};

char MsgEndpoint::recv_dummy_;

gs_status_t MsgEndpoint::init() {
  rx_cq_data_ = domain_->rx_cq_data();
  gs_status_t ret = init_base(*domain_);
  if (ret < 0) return ret;
  ret = domain_->join_cq_group(&ring_, &mailbox_, &cq_group_, &tag_);
  if (ret < 0) return ret;
  wait_fd_ = cq_group_->wait_fd();
  mailbox_.wake_cq = cq_group_->cq();  // before the mailbox is registered (open_ep)
  return 0;
}

gs_status_t MsgEndpoint::open_ep(fi_info *info) {
  int ret = fi_endpoint(domain_->domain(), info, &ep_, nullptr);
  if (ret != 0) return fi_status(ret);
  ret = fi_ep_bind(ep_, &domain_->eq()->fid, 0);
  if (ret == 0) ret = fi_ep_bind(ep_, &cq_group_->cq()->fid, FI_TRANSMIT | FI_RECV);
  if (ret == 0) ret = fi_enable(ep_);
  if (ret != 0) return fi_status(ret);
  std::lock_guard<std::mutex> lock(domain_->cm_mutex());
  domain_->add_mailbox(&ep_->fid, &mailbox_);
  registered_ = true;
  return 0;
}

gs_status_t MsgEndpoint::init_from_request(MsgConnectionRequest *request) {
  gs_status_t ret = open_ep(request->info());
  if (ret < 0) return ret;
  peer_cq_tag_ = request->peer_tag();
  peer_record_len_ = request->private_len();
  std::memcpy(peer_record_, request->private_data(), peer_record_len_);
  return 0;
}

gs_status_t MsgEndpoint::start_accept(MsgConnectionRequest *request, const void *private_data, uint32_t private_len) {
  if (ep_ == nullptr || state_ != State::kIdle) return -EINVAL;
  gs_status_t ret = post_recvs(deferred_recvs_);
  if (ret < 0) return ret;
  deferred_recvs_ = 0;
  uint8_t data[kMaxPrivateData + kCqTagWireBytes];  // accept_as held private_len to caps_.max_private_data
  const uint32_t len = append_cq_tag(private_data, private_len, tag_, data);
  int rc = fi_accept(ep_, data, len);
  if (rc != 0) return fi_status(rc);
  request->mark_accepted();
  state_ = State::kAccepting;
  return 0;
}

MsgEndpoint::~MsgEndpoint() {
  if (!creator_.here()) return;  // left to its process (creator.h)
  if (ep_ != nullptr) {
    std::lock_guard<std::mutex> lock(domain_->cm_mutex());
    if (registered_) domain_->remove_mailbox(&ep_->fid);
    close_fid(ep_);  // tcp drops this fid's queued EQ events on close
  }
  for (RawCmEvent &event : mailbox_.events) {
    if (event.info != nullptr) fi_freeinfo(event.info);
  }
  if (cq_group_) domain_->leave_cq_group(cq_group_.get(), tag_);  // after the fid_ep: nothing more comes for us
}

gs_status_t MsgEndpoint::connect(const sockaddr *addr, socklen_t len, const void *private_data, uint32_t private_len) {
  sockaddr_storage peer;
  if (!copy_sockaddr(addr, len, &peer)) return -EINVAL;
  if (private_len > sizeof(peer_record_) || (private_len != 0 && private_data == nullptr)) return -EINVAL;
  if (ep_ != nullptr || state_ != State::kIdle) return -EISCONN;
  InfoPtr info = domain_->endpoint_info(addr->sa_family);
  if (!info) return -ENOMEM;
  gs_status_t ret = open_ep(info.get());
  if (ret < 0) return ret;
  ret = post_recvs(deferred_recvs_);
  if (ret < 0) return ret;
  deferred_recvs_ = 0;
  uint8_t data[kMaxPrivateData + kCqTagWireBytes];
  const uint32_t data_len = append_cq_tag(private_data, private_len, tag_, data);
  int rc = fi_connect(ep_, &peer, data, data_len);
  if (rc == -FI_ECONNREFUSED) {
    // Refused synchronously: report it the way an asynchronous refusal is.
    RawCmEvent event;
    event.type = RawCmEvent::kError;
    event.err = ECONNREFUSED;
    std::lock_guard<std::mutex> lock(domain_->cm_mutex());
    MsgDomain::deliver_locked(&mailbox_, std::move(event));
  } else if (rc != 0) {
    return fi_status(rc);
  }
  state_ = State::kConnecting;
  return 0;
}

gs_status_t MsgEndpoint::post_recvs(uint32_t count) {
  if (!rx_cq_data_) return 0;
  for (uint32_t i = 0; i < count; ++i) {
    ssize_t ret = fi_recv(ep_, &recv_dummy_, 0, nullptr, FI_ADDR_UNSPEC, nullptr);
    if (ret != 0) return fi_status(ret);
  }
  return 0;
}

gs_status_t MsgEndpoint::post_recv(uint32_t count) {
  if (!rx_cq_data_) return 0;  // tcp: remote CQ data needs no receive
  if (ep_ == nullptr) {
    deferred_recvs_ += count;
    return 0;
  }
  return post_recvs(count);
}

gs_status_t MsgEndpoint::post_write(const WriteRequest &request) { return post_write_to(ep_, 0, request); }

int MsgEndpoint::poll(Completion *out, int max) {
  if (!cq_group_ || max <= 0) return 0;
  CqItem items[kCqBatch];
  bool more = false;
  const int got = cq_group_->take(tag_, items, std::min(max, kCqBatch), &more);
  if (got < 0) return got;
  cq_dirty_ = more;  // only an empty read says the CQ is empty
  int n = translate(items, got, out);
  if (!ring_.empty()) n += ring_.drain(out + n, max - n);
  delivered_ = delivered_ || n > 0;
  return n;
}

int MsgEndpoint::translate(const CqItem *items, int count, Completion *out) {
  int n = 0;
  for (int i = 0; i < count; ++i) {
    const CqItem &item = items[i];
    if (item.entry.status != 0) cm_check_now_ = true;  // the EQ may say why
    if (!item.unmatched && take_entry(item.entry, &out[n]) > 0) ++n;
  }
  return n;
}

int MsgEndpoint::poll_cm(CmEvent *out) {
  if (out == nullptr || ep_ == nullptr) return 0;
  bool pump = true;
  if (state_ == State::kEstablished || state_ == State::kClosed) {
    // Established: the EQ only ever brings FI_SHUTDOWN, which tcp raises from
    // CQ progress, and the CM thread routes it here on its own (it sleeps on
    // the EQ's fd): a look of ours only spares that thread's hop, so it comes
    // once per 10 ms unless poll() saw an error, and a pass that delivered
    // completions leaves it to a later pass (for up to 20 ms). The look costs
    // two system calls (a progress read and the EQ's epoll_wait); once a
    // millisecond, every pass after a sleep paid them, the woken reader's and
    // the sender's last pass before it sleeps alike (loopback TCP wakes the
    // peer onto the sender's core, so the peer waited for those calls).
    const uint64_t now = coarse_ms();
    const uint64_t since = now - last_cm_check_ms_;
    const bool due = since >= 10 && (!delivered_ || since >= 20);
    delivered_ = false;
    pump = cm_check_now_ || due;
    if (pump) {
      last_cm_check_ms_ = now;
      cm_check_now_ = false;
      bool more = false;
      if (state_ == State::kEstablished && cq_group_->take(tag_, nullptr, 0, &more) >= 0) {
        cq_dirty_ = cq_dirty_ || more;  // progress only: what it read waits for poll()
      }
    }
  }
  RawCmEvent event;
  while (domain_->next_event(&mailbox_, pump, &event)) {
    *out = CmEvent{};
    switch (event.type) {
      case RawCmEvent::kConnected:
        if (state_ != State::kConnecting && state_ != State::kAccepting) continue;
        out->kind = CmEventKind::kEstablished;
        if (state_ == State::kAccepting) {
          out->peer_private_len = peer_record_len_;
          std::memcpy(out->peer_private_data, peer_record_, peer_record_len_);
        } else {
          uint32_t len = event.data_len;
          if (!split_cq_tag(event.data, &len, &peer_cq_tag_)) {
            // No tag: not a gpusock peer of this version; our writes could not reach it.
            out->kind = CmEventKind::kError;
            out->status = -EPROTO;
            state_ = State::kClosed;
            return 1;
          }
          out->peer_private_len = len;
          std::memcpy(out->peer_private_data, event.data, len);
        }
        state_ = State::kEstablished;
        return 1;
      case RawCmEvent::kShutdown:
        if (state_ == State::kClosed) continue;
        out->kind = state_ == State::kEstablished ? CmEventKind::kDisconnected : CmEventKind::kError;
        out->status = state_ == State::kEstablished ? 0 : -ECONNRESET;
        state_ = State::kClosed;
        ring_.fail_all(-ECONNRESET);
        return 1;
      case RawCmEvent::kError:
        if (state_ == State::kClosed) continue;
        out->status = -event.err;
        if (state_ == State::kConnecting) {
          out->kind = event.err == ECONNREFUSED ? CmEventKind::kRejected : CmEventKind::kError;
          // A refusal's data is the peer's: no more than the event holds.
          out->peer_private_len = std::min<uint32_t>(event.data_len, sizeof(out->peer_private_data));
          std::memcpy(out->peer_private_data, event.data, out->peer_private_len);
        } else if (state_ == State::kEstablished) {
          out->kind = CmEventKind::kDisconnected;
        } else {
          out->kind = CmEventKind::kError;
        }
        state_ = State::kClosed;
        ring_.fail_all(-ECONNRESET);
        return 1;
      default:
        if (event.info != nullptr) fi_freeinfo(event.info);
        continue;
    }
  }
  return 0;
}

void MsgEndpoint::disconnect() {
  if (ep_ == nullptr) return;
  if (state_ == State::kEstablished || state_ == State::kConnecting || state_ == State::kAccepting) {
    // tcp flushes what is queued, closes the socket and raises FI_SHUTDOWN on
    // both sides (ours included); what it flushes may be in our CQ now.
    (void)fi_shutdown(ep_, 0);
    cq_dirty_ = true;
  }
}

gs_status_t MsgEndpoint::local_address(sockaddr_storage *out, socklen_t *len) const {
  if (ep_ == nullptr) return -ENOTCONN;
  sockaddr_storage addr{};
  size_t addr_len = sizeof(addr);
  int ret = fi_getname(&ep_->fid, &addr, &addr_len);
  if (ret != 0) return fi_status(ret);
  return output_sockaddr(addr, out, len);
}

gs_status_t MsgEndpoint::peer_address(sockaddr_storage *out, socklen_t *len) const {
  if (ep_ == nullptr) return -ENOTCONN;
  sockaddr_storage addr{};
  size_t addr_len = sizeof(addr);
  int ret = fi_getpeer(ep_, &addr, &addr_len);
  if (ret != 0) return fi_status(ret);
  return output_sockaddr(addr, out, len);
}

// --- waiting -------------------------------------------------------------------

gs_status_t MsgEndpoint::arm_wait() {
  if (ring_.head_done()) return -EAGAIN;
  // Reads the CQ once more (tcp progresses the sockets on the way): -EAGAIN
  // when completions wait for us; else whoever routes to us later signals.
  const int rc = cq_group_->arm(tag_);
  if (rc != 0) return rc;
  // After arming: a router counts before it signals (MsgDomain::deliver_locked).
  return mailbox_.pending.load(std::memory_order_seq_cst) != 0 ? -EAGAIN : 0;
}

bool MsgEndpoint::maybe_ready() const {
  if (mailbox_.pending.load(std::memory_order_acquire) != 0 || ring_.head_done() || cq_dirty_ ||
      cq_group_->has_items(tag_)) {
    return true;
  }
  // Connected or about to be: bytes may wait in the kernel's socket, and no
  // look without a system call sees them (tcp turns them into completions in
  // fi_cq_read).
  return state_ == State::kConnecting || state_ == State::kAccepting || state_ == State::kEstablished;
}

// Established, with nothing of ours in flight or left in the CQ: tcp turns
// new bytes into completions only when its socket is readable (or writable
// while sends are queued), which makes our wait fd, the CQ's epoll set,
// readable; a peer's FI_SHUTDOWN comes the same way. A write still in the
// ring may complete without the fd saying so, hence ring_.empty().
bool MsgEndpoint::quiet_unless_fd_readable() const {
  return state_ == State::kEstablished && !cq_dirty_ && !cm_check_now_ && ring_.empty() &&
         mailbox_.pending.load(std::memory_order_acquire) == 0 && !cq_group_->has_items(tag_);
}

}  // namespace

gs_status_t MsgDomain::create_endpoint(ConnectionRequest *request, std::unique_ptr<Endpoint> *out) {
  return create_endpoint_as<MsgEndpoint, MsgConnectionRequest>(this, request, out);
}

gs_status_t MsgDomain::accept(Endpoint *endpoint, ConnectionRequest *request, const void *private_data,
                              uint32_t private_len) {
  return accept_as<MsgEndpoint, MsgConnectionRequest>(caps_, endpoint, request, private_data, private_len);
}

}  // namespace gpusock::wire::fabric::msg
