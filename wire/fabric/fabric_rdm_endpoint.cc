// fabric:shm connection endpoints: gpusock's handshake (client and server
// side), data and teardown (fabric_rdm_endpoint.h).
#include "wire/fabric/fabric_rdm_endpoint.h"
#include "wire/status_kinds.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace gpusock::wire::fabric::rdm {

namespace {

// A connect that fails for want of a resource says which; any other failure
// to reach the listener reads as a refusal, as tcp's does.
int connect_error(int status) { return out_of_resources(status) ? status : -ECONNREFUSED; }

}  // namespace

gs_status_t RdmEndpoint::init() {
  gs_status_t ret = init_base(*domain_);
  if (ret < 0) return ret;
  ret = domain_->open_shared(&shared_);
  if (ret < 0) return ret;
  for (int i = 0; i < kConnCtrlBufs; ++i) {
    ret = post_ctrl_buf(i);
    if (ret < 0) {
      set_error_detail("fabric:shm: fi_recv of a control buffer: " + fi_error_text(ret));
      return ret;
    }
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
  local_ = as_family(msg.dst, request->core()->bound.ss_family);
  peer_sockaddr_ = as_family(msg.src, request->core()->bound.ss_family);
  peer_record_len_ = msg.private_len;
  std::memcpy(peer_record_, msg.private_data, msg.private_len);
  origin_ = request->core();
  return 0;
}

gs_status_t RdmEndpoint::start_accept(RdmConnectionRequest *request, const void *private_data, uint32_t private_len) {
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
  PeerRef *unread_by = nullptr;  // the peer to park for (fabric_rdm_parking.cc)
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
        origin_->send_reject_locked(std::move(client), peer_name_.c_str(), nonce_);
      }
    }
    // A BYE (or REJECT) the peer has not made room for yet: give it a moment.
    for (int spin = 0; spin < 200 && ctrl_pending_ && !peer_dead(); ++spin) {
      screen_name_exchange();
      if (ProviderCall call = provider_call()) (void)fi_cq_read(shared_->cq, nullptr, 0);
      flush_ctrl();
      if (ctrl_pending_) usleep(50);
    }
    // A dead peer reads nothing (and gets no provider call again).
    unread_by = unread_by_ == &peer_ ? &peer_ : unread_by_ == &listener_ ? &listener_ : nullptr;
    if (peer_dead()) unread_by = nullptr;
    for (PeerRef *ref : {&peer_, &listener_})
      if (ref != unread_by) remove_peer(*shared_, ref);
  }
  // A killed peer cannot unlink its endpoint's files; its connected peer
  // does, also when the connection ended (a failed write, a reset) before
  // the death was seen (peer_gone). One read of /proc per connection.
  if (!peer_name_.empty() && (peer_died_ || !shm::endpoint_owner_alive(peer_name_)))
    shm::unlink_endpoint_files(peer_name_);
  unwatch();
  retire_shared(shared_, domain_->ringer());
  if (unread_by != nullptr) {
    std::string name = unread_by == &peer_ ? peer_name_ : listener_name_;
    domain_->park(ParkedEndpoint{std::move(shared_), std::move(*unread_by), std::move(name)});
  }
}

void RdmEndpoint::fail_connect(int status, const char *reason) {
  queue_event(CmEventKind::kRejected, status);
  events_.back().reason = reason;
  state_ = State::kClosed;
  ctrl_pending_ = false;
  awaiting_admission_ = false;  // nothing sent: no admission held
  name_exchange_.close();
  unwatch();
  // Kept while the listener may not have read our name exchange: the
  // endpoint is parked for it when it goes.
  if (shared_ && unread_by_ != &listener_) remove_peer(*shared_, &listener_);
}

gs_status_t RdmEndpoint::connect(const sockaddr *addr, socklen_t len, const void *private_data, uint32_t private_len) {
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
  uid_t owner = 0;
  errno = 0;
  for (const std::string &name : rendezvous_candidates(dst)) {
    if (shm::read_rendezvous(name, &rv, &owner) && !(ipv4_client(dst) && (rv.flags & shm::kRendezvousV6Only))) {
      listener_rendezvous_ = name;
      found = true;
      break;
    }
  }
  if (!found) {
    // Reported by poll_cm, like tcp's refusal; or the lookup's want of a descriptor.
    const int why = out_of_descriptors(-errno) ? -errno : -ECONNREFUSED;
    fail_connect(why, why == -ECONNREFUSED ? nullptr : "fabric:shm: no descriptor left to connect");
    return 0;
  }
  // shm makes our region readable by our user only: a listener of another
  // user (root aside) could not map it, and shm 1.17 crashes on that.
  if (owner != geteuid() && owner != 0) {
    set_error_detail("fabric:shm: the listener at " + listener_rendezvous_ + " runs as user " + std::to_string(owner) +
                     ", which cannot map this process's (user " + std::to_string(geteuid()) + ") memory");
    fail_connect(-ECONNREFUSED,
                 "fabric:shm: the listener runs as another user, which cannot map this process's memory");
    return 0;
  }
  if (const gs_status_t rc = insert_peer(shared_, rv.name, rv.pid, domain_->ringer(), &listener_); rc < 0) {
    fail_connect(connect_error(rc));
    return 0;
  }
  if (!name_exchange_.open(shared_->name) && out_of_descriptors(-errno)) {
    fail_connect(-errno, "fabric:shm: no descriptor left to connect");
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
  if (!listener_.bell.take_admission()) {
    pending_msg_ = msg;
    awaiting_admission_ = true;
    return 0;
  }
  send_ctrl(listener_, msg);
  return 0;
}

void RdmEndpoint::try_admission() {
  if (state_ != State::kConnecting) {
    awaiting_admission_ = false;
    return;
  }
  if (!listener_.bell.take_admission()) return;
  awaiting_admission_ = false;
  retry_pause_ms_ = 0;
  const CtrlMsg msg = pending_msg_;
  send_ctrl(listener_, msg);
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
    unread_by_ = pending_dest_;
    return;
  }
  if (unread_by_ == pending_dest_) unread_by_ = nullptr;
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
      if (const gs_status_t rc = insert_peer(shared_, msg.name, msg.pid, domain_->ringer(), &server); rc < 0) {
        fail_connect(connect_error(rc));
        return;
      }
      name_exchange_.close();
      peer_ = std::move(server);
      peer_name_ = msg.name;
      peer_pid_ = msg.pid;
      watch_peer(msg.pid, msg.name);
      remove_peer(*shared_, &listener_);
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

void RdmEndpoint::screen_name_exchange() {
  if (!name_exchange_.is_open()) return;
  const auto screened = name_exchange_.screen(shm::NameExchangeGuard::Short::kDrop);
  if (screened.out_of_descriptors && state_ == State::kConnecting)
    fail_connect(screened.why, "fabric:shm: no descriptor left to map the listener's endpoint");
}

int RdmEndpoint::process_cq(Completion *out, int max, int *produced) {
  screen_name_exchange();
  ProviderCall call = provider_call();
  if (!call && !draining_) {
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
      [&](const CqEntry &entry) {  // a control message
        const int index = (entry.flags & FI_RECV) != 0 ? ctrl_index(entry.context) : -1;
        if (index < 0) return;
        const CtrlMsg msg = ctrl_bufs_[index];
        post_ctrl_buf(index);
        handle_ctrl(msg, entry.len);
      },
      [&](const CqEntry &err, bool matched) {
        const int index = matched ? -1 : ctrl_index(err.context);
        if (index >= 0 && err.status != -ECANCELED) post_ctrl_buf(index);
      });
  cq_dirty_ = got != 0;  // only an empty read says the CQ is empty
  // Its commands consumed, its writes answered: the peer may sleep on that.
  peer_.bell.wake_if_armed();
  return got;
}

int RdmEndpoint::poll(Completion *out, int max) {
  if (max <= 0) return 0;
  int n = 0;
  // A dead peer is noticed before the provider is called again (see "Torn
  // enqueues"); what it sent before it died comes out of the stash here.
  if (liveness_now_ || verdict_waiting()) [[unlikely]]
    check_liveness();
  if (!stash_.empty()) [[unlikely]] {
    const int take = std::min<int>(max, static_cast<int>(stash_.size()));
    std::copy(stash_.begin(), stash_.begin() + take, out);
    stash_.erase(stash_.begin(), stash_.begin() + take);
    n = take;
  }
  before_pass();
  if (awaiting_admission_) [[unlikely]]
    try_admission();
  if (ctrl_pending_) [[unlikely]]
    flush_ctrl();
  int produced = 0;
  const int got = process_cq(out + n, max - n, &produced);
  after_pass();
  if (got < 0) [[unlikely]]
    return got;
  cq_read_for_cm_ = true;
  n += produced;
  if (got == 0 && (++idle_polls_ & 15) == 0) check_liveness();
  if (!ring_.empty()) n += ring_.drain(out + n, max - n);
  return n;
}

int RdmEndpoint::poll_cm(CmEvent *out) {
  if (out == nullptr) return 0;
  // A progress pass polls completions first: when that read the CQ, the
  // control messages it held are in events_ already. A second read here cost
  // half of an idle pass and could only stash what the next poll() reads.
  const bool cq_just_read = cq_read_for_cm_;
  cq_read_for_cm_ = false;
  if (cq_just_read) {
    if (events_.empty()) check_liveness();
  } else if (events_.empty() && state_ != State::kClosed && state_ != State::kIdle) {
    before_pass();
    if (awaiting_admission_) try_admission();
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
  // A peer that died is reported by the next poll, after what it sent first.
  if (!call) return state_ == State::kEstablished ? -EAGAIN : -ECONNRESET;
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

gs_status_t RdmDomain::create_endpoint(ConnectionRequest *request, std::unique_ptr<Endpoint> *out) {
  return create_endpoint_as<RdmEndpoint, RdmConnectionRequest>(this, request, out);
}

gs_status_t RdmDomain::accept(Endpoint *endpoint, ConnectionRequest *request, const void *private_data,
                              uint32_t private_len) {
  return accept_as<RdmEndpoint, RdmConnectionRequest>(caps_, endpoint, request, private_data, private_len);
}

}  // namespace gpusock::wire::fabric::rdm
