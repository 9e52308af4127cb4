// fabric:shm connection endpoints: gpusock's handshake (client and server
// side), data, dead peers, and waiting on the endpoint's bell (fabric_rdm.cc
// describes the flavour, shm_bell.h the waking).
#include "wire/fabric/fabric_rdm.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace gpusock::wire::fabric::rdm {
namespace {

using shm::PeerWatch;
using shm::PidWatch;
using shm::ProviderCall;

class RdmEndpoint final : public FabricEndpointBase {
 public:
  explicit RdmEndpoint(RdmDomain *domain) : domain_(domain) {}
  ~RdmEndpoint() override;

  gs_status_t init();
  gs_status_t init_from_request(RdmConnectionRequest *request);
  gs_status_t start_accept(RdmConnectionRequest *request, const void *private_data, uint32_t private_len);

  gs_status_t connect(const sockaddr *addr, socklen_t len, const void *private_data,
                      uint32_t private_len) override;
  gs_status_t post_write(const WriteRequest &request) override;
  gs_status_t post_recv(uint32_t) override { return 0; }  // shm: remote CQ data needs no receive
  int poll(Completion *out, int max) override;
  int poll_cm(CmEvent *out) override;
  void disconnect() override;
  gs_status_t local_address(sockaddr_storage *out, socklen_t *len) const override {
    return output_sockaddr(local_, out, len);
  }
  gs_status_t peer_address(sockaddr_storage *out, socklen_t *len) const override {
    return output_sockaddr(peer_sockaddr_, out, len);
  }
  int wait_fd() const override { return shared_->bell.fd(); }
  gs_status_t arm_wait() override;
  bool maybe_ready() const override;

 private:
  gs_status_t post_ctrl_buf(int index) {
    return fi_status(
        fi_recv(shared_->ep, &ctrl_bufs_[index], sizeof(CtrlMsg), nullptr, FI_ADDR_UNSPEC, &ctrl_bufs_[index]));
  }
  void queue_event(CmEventKind kind, int status, const uint8_t *data = nullptr, uint32_t len = 0) {
    CmEvent event;
    event.kind = kind;
    event.status = status;
    if (data != nullptr && len != 0) {
      event.peer_private_len = len;
      std::memcpy(event.peer_private_data, data, len);
    }
    events_.push_back(event);
  }
  // Send (or keep pending) one control message.
  void send_ctrl(const PeerRef &dest, const CtrlMsg &msg);
  void flush_ctrl();
  void on_ctrl_sent(uint16_t type);
  void handle_ctrl(const CtrlMsg &msg, size_t len);
  // Reads the CQ: immediates into out (at most max), writes marked in the ring,
  // control messages handled; then wakes the peer if it sleeps (it may wait
  // for what this pass did). Returns entries read, or < 0.
  int process_cq(Completion *out, int max, int *produced);
  // Around a progress pass: ring-back requests collected before, served after.
  void before_pass() {
    if (shared_->bell.requests_pending()) [[unlikely]] shared_->bell.collect_requests();
  }
  void after_pass() {
    if (shared_->bell.has_requesters()) [[unlikely]] shared_->bell.serve_requests(domain_->ringer());
  }
  // Watch a cross-process peer (or the listener while connecting): the
  // watchdog releases the locks of its region and ours when it dies.
  void watch_peer(pid_t pid, const std::string &peer_region);
  void unwatch();
  bool peer_dead() const {
    if (peer_died_) return true;
    if (watch_) return watch_->dead.load(std::memory_order_acquire);
    return fallback_watch_.dead();
  }
  // A verdict check_liveness would turn into an event, seen without a system
  // call (fallback_watch_ has none: it always says maybe).
  bool verdict_waiting() const;
  // Something to report without asking the provider.
  bool work_waiting() const {
    return !events_.empty() || !stash_.empty() || cq_dirty_ || ring_.head_done() || liveness_now_;
  }
  // Guards every provider call on this connection (see "Torn enqueues").
  ProviderCall provider_call() const { return ProviderCall(peer_died_, watch_); }
  void check_liveness();
  void peer_gone(bool dead_process);
  void fail_connect(int status);

  RdmDomain *domain_;
  std::shared_ptr<RdmShared> shared_;
  CtrlMsg ctrl_bufs_[kConnCtrlBufs];
  std::deque<CmEvent> events_;
  std::vector<Completion> stash_;   // data completions read by poll_cm
  bool ctrl_pending_ = false;
  CtrlMsg pending_msg_;
  const PeerRef *pending_dest_ = nullptr;  // &listener_ or &peer_
  PeerRef peer_;
  PeerRef listener_;
  std::string listener_rendezvous_;
  std::string listener_name_;
  std::shared_ptr<PeerWatch> watch_;
  PidWatch fallback_watch_;  // when the watchdog is unavailable
  std::string peer_name_;
  pid_t peer_pid_ = 0;
  // Passive side, until established: the listener the request came through,
  // which can still refuse the client should our ACCEPT never leave.
  std::shared_ptr<RdmListenerCore> origin_;
  uint64_t nonce_ = 0;
  bool req_acked_ = false;  // the listener handed our REQ to its application
  uint8_t peer_record_[64] = {};
  uint32_t peer_record_len_ = 0;
  sockaddr_storage local_{};
  sockaddr_storage peer_sockaddr_{};
  uint32_t idle_polls_ = 0;
  uint64_t last_liveness_ms_ = 0;
  bool peer_died_ = false;  // its process is gone: no provider call on this connection again
  // Waiting (shm_bell.h).
  bool cq_dirty_ = false;          // the CQ may hold entries: our last read was not empty, or we posted since
  bool tx_blocked_ = false;        // a write met -FI_EAGAIN and none went since
  bool send_blocked_ = false;      // a send met -FI_EAGAIN since we last asked its peer to ring back
  bool liveness_now_ = false;      // check_liveness at once
  bool peer_unreachable_ = false;  // a ring-back request found the peer's bell gone: its endpoint is
};

gs_status_t RdmEndpoint::init() {
  gs_status_t ret = init_base(*domain_);
  if (ret < 0) return ret;
  ret = domain_->open_shared(&shared_);
  if (ret < 0) return ret;
  for (int i = 0; i < kConnCtrlBufs; ++i) {
    ret = post_ctrl_buf(i);
    if (ret < 0) return ret;
  }
  stash_.reserve(64);
  return 0;
}

gs_status_t RdmEndpoint::init_from_request(RdmConnectionRequest *request) {
  const CtrlMsg &msg = request->msg();
  gs_status_t ret = insert_peer(shared_, msg.name, msg.pid, domain_->ringer(), &peer_);
  if (ret < 0) return ret;
  peer_name_ = msg.name;
  peer_pid_ = msg.pid;
  nonce_ = msg.nonce;
  local_ = msg.dst;
  peer_sockaddr_ = msg.src;
  peer_record_len_ = msg.private_len;
  std::memcpy(peer_record_, msg.private_data, msg.private_len);
  origin_ = request->core();
  return 0;
}

gs_status_t RdmEndpoint::start_accept(RdmConnectionRequest *request, const void *private_data,
                                      uint32_t private_len) {
  if (state_ != State::kIdle || !peer_.valid() || request->msg().nonce != nonce_) return -EINVAL;
  CtrlMsg msg = make_ctrl(kAccept, nonce_, shared_->name);
  msg.src = local_;
  msg.private_len = private_len;
  if (private_len != 0) std::memcpy(msg.private_data, private_data, private_len);
  request->mark_accepted();
  watch_peer(peer_pid_, peer_name_);
  state_ = State::kAccepting;
  send_ctrl(peer_, msg);
  return 0;
}

RdmEndpoint::~RdmEndpoint() {
  if (shared_ && shared_->ep != nullptr) {
    if (state_ == State::kEstablished) {
      disconnect();
    } else if (state_ == State::kAccepting && ctrl_pending_ && origin_) {
      // The ACCEPT never left (the client has not progressed since): have the
      // listener refuse it, over the path the REQ already opened.
      ctrl_pending_ = false;
      std::lock_guard<std::mutex> lock(origin_->mu);
      PeerRef client;
      if (insert_peer(origin_->shared, peer_name_.c_str(), peer_pid_, domain_->ringer(), &client) == 0) {
        origin_->send_reject_locked(std::move(client), nonce_);
      }
    }
    // A BYE (or REJECT) the peer has not made room for yet: give it a moment.
    for (int spin = 0; spin < 200 && ctrl_pending_ && !peer_dead(); ++spin) {
      if (ProviderCall call = provider_call()) (void)fi_cq_read(shared_->cq, nullptr, 0);
      flush_ctrl();
      if (ctrl_pending_) usleep(50);
    }
    remove_peer(shared_->av, &peer_);
    remove_peer(shared_->av, &listener_);
  }
  unwatch();
  retire_shared(shared_, domain_->ringer());
}

void RdmEndpoint::watch_peer(pid_t pid, const std::string &peer_region) {
  unwatch();
  if (pid <= 0 || pid == getpid()) return;  // in-process peers cannot die under us
  const std::string wake = shared_->bell.valid() ? shm::bell_path(shared_->name) : std::string();
  watch_ = domain_->watchdog().watch_pid(pid, {peer_region, shared_->name}, wake);
  if (!watch_) fallback_watch_.watch(pid);
}

void RdmEndpoint::unwatch() {
  if (watch_) domain_->watchdog().unwatch(watch_);
  watch_.reset();
  fallback_watch_.reset();
}

void RdmEndpoint::fail_connect(int status) {
  queue_event(CmEventKind::kRejected, status);
  state_ = State::kClosed;
  ctrl_pending_ = false;
  unwatch();
  if (shared_) remove_peer(shared_->av, &listener_);
}

gs_status_t RdmEndpoint::connect(const sockaddr *addr, socklen_t len, const void *private_data,
                                 uint32_t private_len) {
  sockaddr_storage dst;
  if (!copy_sockaddr(addr, len, &dst)) return -EINVAL;
  if (private_len > sizeof(CtrlMsg{}.private_data) || (private_len != 0 && private_data == nullptr)) return -EINVAL;
  if (state_ != State::kIdle || peer_.valid()) return -EISCONN;
  peer_sockaddr_ = dst;

  // Our own address: the IP we dialled (loopback for a wildcard), and a port
  // made from pid and endpoint number.
  local_ = dst;
  if (is_wildcard(dst)) {
    if (dst.ss_family == AF_INET) {
      reinterpret_cast<sockaddr_in &>(local_).sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    } else {
      reinterpret_cast<sockaddr_in6 &>(local_).sin6_addr = in6addr_loopback;
    }
  }
  const uint64_t seq = std::strtoull(shared_->name.c_str() + shared_->name.rfind('-') + 1, nullptr, 10);
  set_sockaddr_port(&local_, static_cast<uint16_t>(49152 + ((static_cast<uint64_t>(getpid()) * 7919 + seq) % 16384)));

  state_ = State::kConnecting;
  shm::Rendezvous rv{};
  bool found = false;
  for (const std::string &name : rendezvous_candidates(dst)) {
    if (shm::read_rendezvous(name, &rv)) {
      listener_rendezvous_ = name;
      found = true;
      break;
    }
  }
  if (!found) {
    fail_connect(-ECONNREFUSED);  // reported by poll_cm, like tcp's refusal
    return 0;
  }
  if (insert_peer(shared_, rv.name, rv.pid, domain_->ringer(), &listener_) < 0) {
    fail_connect(-ECONNREFUSED);
    return 0;
  }
  listener_name_ = rv.name;
  watch_peer(rv.pid, rv.name);
  nonce_ = random_u64();
  CtrlMsg msg = make_ctrl(kReq, nonce_, shared_->name);
  msg.src = local_;
  msg.dst = dst;
  msg.private_len = private_len;
  if (private_len != 0) std::memcpy(msg.private_data, private_data, private_len);
  send_ctrl(listener_, msg);
  return 0;
}

void RdmEndpoint::send_ctrl(const PeerRef &dest, const CtrlMsg &msg) {
  pending_msg_ = msg;
  pending_dest_ = &dest;
  ctrl_pending_ = true;
  flush_ctrl();
}

void RdmEndpoint::flush_ctrl() {
  if (!ctrl_pending_) return;
  ProviderCall call = provider_call();
  if (!call) {
    ctrl_pending_ = false;  // nobody left to hear it
    return;
  }
  ssize_t ret = fi_inject(shared_->ep, &pending_msg_, sizeof(pending_msg_), pending_dest_->addr);
  // Sent, or refused after shm queued its name exchange: either way the peer
  // has something to progress.
  pending_dest_->bell.wake_if_armed();
  if (ret == -FI_EAGAIN) {  // the peer has to progress first: it rings back (arm_wait)
    send_blocked_ = true;
    return;
  }
  ctrl_pending_ = false;
  send_blocked_ = tx_blocked_;
  if (ret != 0) {
    if (state_ == State::kConnecting) {
      fail_connect(-ECONNREFUSED);
    } else if (state_ == State::kAccepting) {
      queue_event(CmEventKind::kError, fi_status(ret));
      state_ = State::kClosed;
    }
    return;
  }
  on_ctrl_sent(pending_msg_.type);
}

void RdmEndpoint::on_ctrl_sent(uint16_t type) {
  if (type == kAccept && state_ == State::kAccepting) {
    origin_.reset();
    state_ = State::kEstablished;
    queue_event(CmEventKind::kEstablished, 0, peer_record_, peer_record_len_);
  }
}

void RdmEndpoint::handle_ctrl(const CtrlMsg &msg, size_t len) {
  if (!valid_ctrl(msg, len) || msg.nonce != nonce_) return;
  switch (msg.type) {
    case kAccept: {
      if (state_ != State::kConnecting) return;
      PeerRef server;
      if (insert_peer(shared_, msg.name, msg.pid, domain_->ringer(), &server) < 0) {
        fail_connect(-ECONNREFUSED);
        return;
      }
      peer_ = std::move(server);
      peer_name_ = msg.name;
      peer_pid_ = msg.pid;
      watch_peer(msg.pid, msg.name);
      remove_peer(shared_->av, &listener_);
      ctrl_pending_ = false;
      state_ = State::kEstablished;
      queue_event(CmEventKind::kEstablished, 0, msg.private_data, msg.private_len);
      return;
    }
    case kAck:
      if (state_ == State::kConnecting) req_acked_ = true;
      return;
    case kReject:
      if (state_ != State::kConnecting) return;
      fail_connect(-ECONNREFUSED);
      return;
    case kBye:
      if (state_ != State::kEstablished && state_ != State::kAccepting) return;
      queue_event(CmEventKind::kDisconnected, 0);
      state_ = State::kClosed;
      ring_.fail_all(-ECONNRESET);
      unwatch();
      return;
    default:
      return;
  }
}

int RdmEndpoint::process_cq(Completion *out, int max, int *produced) {
  ProviderCall call = provider_call();
  if (!call) {
    *produced = 0;
    cq_dirty_ = false;
    return 0;
  }
  auto ctrl_index = [this](void *context) {
    auto *buf = static_cast<CtrlMsg *>(context);
    return buf >= ctrl_bufs_ && buf < ctrl_bufs_ + kConnCtrlBufs ? static_cast<int>(buf - ctrl_bufs_) : -1;
  };
  const int got = read_cq(
      shared_->cq, out, max, produced,
      [&](const fi_cq_data_entry &entry) {  // a control message
        const int index = (entry.flags & FI_RECV) != 0 ? ctrl_index(entry.op_context) : -1;
        if (index < 0) return;
        const CtrlMsg msg = ctrl_bufs_[index];
        post_ctrl_buf(index);
        handle_ctrl(msg, entry.len);
      },
      [&](const fi_cq_err_entry &err, bool matched) {
        const int index = matched ? -1 : ctrl_index(err.op_context);
        if (index >= 0 && err.err != FI_ECANCELED) post_ctrl_buf(index);
      });
  cq_dirty_ = got != 0;  // only an empty read says the CQ is empty
  // Its commands consumed, its writes answered: the peer may sleep on that.
  peer_.bell.wake_if_armed();
  return got;
}

void RdmEndpoint::peer_gone(bool dead_process) {
  const bool established = state_ == State::kEstablished;
  queue_event(established ? CmEventKind::kDisconnected : CmEventKind::kError, -ECONNRESET);
  state_ = State::kClosed;
  ctrl_pending_ = false;
  ring_.fail_all(-ECONNRESET);
  // A dead process's watch stays until we are destroyed: the watchdog may
  // still have our region's lock to settle (see "Torn enqueues").
  if (dead_process) peer_died_ = true;
  else unwatch();
  // shm cannot unlink the region of a killed process; we know its name.
  if (dead_process && !peer_name_.empty()) shm::unlink_endpoint_files(peer_name_);
}

bool RdmEndpoint::verdict_waiting() const {
  if (state_ == State::kIdle || state_ == State::kClosed) return false;
  if (watch_ && watch_->dead.load(std::memory_order_acquire)) return true;
  if (fallback_watch_.active()) return true;
  if (peer_.pin && !peer_.pin->alive.load(std::memory_order_acquire)) return true;
  // A listener that closed before it took our REQ (check_liveness reads the
  // rendezvous to be sure).
  return state_ == State::kConnecting && !req_acked_ && listener_.bell.closed();
}

void RdmEndpoint::check_liveness() {
  // The cheap verdicts are loads; the rest costs system calls.
  const bool urgent = liveness_now_ || verdict_waiting();
  const uint64_t now = coarse_ms();
  if (!urgent && now - last_liveness_ms_ < kLivenessIntervalMs) return;
  last_liveness_ms_ = now;
  liveness_now_ = false;
  const bool unreachable = peer_unreachable_;
  peer_unreachable_ = false;
  if (state_ == State::kConnecting) {
    if (peer_dead() || unreachable) {
      fail_connect(-ECONNREFUSED);
      return;
    }
    if (!req_acked_) {
      // REQ not yet with the application: is that listener still there?
      shm::Rendezvous rv{};
      if (!shm::read_rendezvous(listener_rendezvous_, &rv) || listener_name_ != rv.name) fail_connect(-ECONNREFUSED);
    }
    return;
  }
  if (state_ != State::kEstablished && state_ != State::kAccepting) return;
  if (peer_dead()) {
    peer_gone(true);
  } else if (unreachable || (peer_.pin && !peer_.pin->alive.load(std::memory_order_acquire))) {
    peer_gone(false);  // its endpoint was destroyed without a BYE reaching us
  } else if (state_ == State::kAccepting && ctrl_pending_ && !peer_.pin) {
    // ACCEPT still waiting for the client: is its endpoint still there?
    int fd = shm_open(peer_name_.c_str(), O_RDONLY, 0);
    if (fd >= 0) {
      close(fd);
    } else if (errno == ENOENT) {
      peer_gone(false);
    }
  }
}

int RdmEndpoint::poll(Completion *out, int max) {
  if (max <= 0) return 0;
  int n = 0;
  if (!stash_.empty()) [[unlikely]] {
    const int take = std::min<int>(max, static_cast<int>(stash_.size()));
    std::copy(stash_.begin(), stash_.begin() + take, out);
    stash_.erase(stash_.begin(), stash_.begin() + take);
    n = take;
  }
  // A dead peer is noticed before the provider is called again (see "Torn enqueues").
  if (liveness_now_ || verdict_waiting()) [[unlikely]] check_liveness();
  before_pass();
  if (ctrl_pending_) [[unlikely]] flush_ctrl();
  int produced = 0;
  const int got = process_cq(out + n, max - n, &produced);
  after_pass();
  if (got < 0) [[unlikely]] return got;
  n += produced;
  if (got == 0 && (++idle_polls_ & 15) == 0) check_liveness();
  if (!ring_.empty()) n += ring_.drain(out + n, max - n);
  return n;
}

int RdmEndpoint::poll_cm(CmEvent *out) {
  if (out == nullptr) return 0;
  if (events_.empty() && state_ != State::kClosed && state_ != State::kIdle) {
    before_pass();
    if (ctrl_pending_) flush_ctrl();
    Completion buffer[kCqBatch];
    int produced = 0;
    if (process_cq(buffer, kCqBatch, &produced) >= 0) stash_.insert(stash_.end(), buffer, buffer + produced);
    after_pass();
    if (events_.empty()) check_liveness();
  }
  if (events_.empty()) return 0;
  *out = events_.front();
  events_.pop_front();
  return 1;
}

void RdmEndpoint::disconnect() {
  if (state_ == State::kEstablished || state_ == State::kAccepting) {
    send_ctrl(peer_, make_ctrl(kBye, nonce_, shared_->name));
    queue_event(CmEventKind::kDisconnected, 0);
    state_ = State::kClosed;
  } else if (state_ == State::kConnecting) {
    ctrl_pending_ = false;
    fail_connect(-ECONNABORTED);
  }
}

gs_status_t RdmEndpoint::post_write(const WriteRequest &request) {
  ProviderCall call = provider_call();
  if (!call) return -ECONNRESET;
  const bool ring_full = ring_.full();
  const gs_status_t ret = post_write_to(shared_->ep, peer_.addr, request);
  if (ret == 0) [[likely]] {
    cq_dirty_ = true;  // shm completes inline and inject writes in our CQ at once
    tx_blocked_ = false;
    send_blocked_ = ctrl_pending_;
    peer_.bell.wake_if_armed();
  } else if (ret == -EAGAIN && !ring_full) {
    // The peer has to progress (shm may have queued its name exchange on the
    // way): wake it; it rings back (arm_wait).
    tx_blocked_ = send_blocked_ = true;
    peer_.bell.wake_if_armed();
  }
  return ret;
}

// --- waiting -------------------------------------------------------------------

gs_status_t RdmEndpoint::arm_wait() {
  shm::Bell &bell = shared_->bell;
  if (!bell.valid() || work_waiting()) return -EAGAIN;
  if (bell.drain()) return -EAGAIN;  // a wake-up: what it announced is for poll to find
  // The peer that would wake us: one without a bell (an older gpusock) never
  // rings, so we do not sleep on it.
  const PeerRef &waker = state_ == State::kConnecting ? listener_ : peer_;
  if (waker.valid() && !waker.bell.valid() && state_ != State::kClosed) return -EAGAIN;
  bell.arm();  // then look again: see shm_bell.h
  bool again = bell.signalled() || bell.requests_pending() || bell.has_requesters() || verdict_waiting();
  if (!again && send_blocked_) {
    const PeerRef &dest = ctrl_pending_ ? *pending_dest_ : peer_;
    const int rc = dest.bell.request_ringback(shared_->name);
    if (rc == 0) {
      send_blocked_ = false;
    } else if (rc == -ECONNREFUSED) {
      peer_unreachable_ = liveness_now_ = true;
      send_blocked_ = false;
    }
    again = rc != 0;
  }
  if (again) bell.disarm();
  return again ? -EAGAIN : 0;
}

bool RdmEndpoint::maybe_ready() const {
  const shm::Bell &bell = shared_->bell;
  if (!bell.valid()) return true;
  return bell.signalled() || work_waiting() || ctrl_pending_ || tx_blocked_ || bell.requests_pending() ||
         bell.has_requesters() || verdict_waiting();
}

}  // namespace

gs_status_t RdmDomain::create_endpoint(ConnectionRequest *request, std::unique_ptr<Endpoint> *out) {
  return create_endpoint_as<RdmEndpoint, RdmConnectionRequest>(this, request, out);
}

gs_status_t RdmDomain::accept(Endpoint *endpoint, ConnectionRequest *request, const void *private_data,
                              uint32_t private_len) {
  return accept_as<RdmEndpoint, RdmConnectionRequest>(caps_, endpoint, request, private_data, private_len);
}

}  // namespace gpusock::wire::fabric::rdm
