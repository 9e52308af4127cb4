// fabric:shm listeners: the rendezvous, REQs in, ACK/REJECT out, and waiting
// for requests on the listener endpoint's bell (fabric_rdm.cc describes the
// handshake).
#include "wire/fabric/fabric_rdm.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

namespace gpusock::wire::fabric::rdm {
namespace {

class RdmListener final : public Listener {
 public:
  explicit RdmListener(std::shared_ptr<RdmListenerCore> core) : core_(std::move(core)) {}
  ~RdmListener() override {
    ready_.clear();  // refuses them
    core_->shutdown();
  }
  int get_request(std::unique_ptr<ConnectionRequest> *out) override;
  gs_status_t local_address(sockaddr_storage *out, socklen_t *len) const override {
    return output_sockaddr(core_->bound, out, len);
  }
  int wait_fd() const override { return core_->shared->bell.fd(); }
  gs_status_t arm_wait() override { return arm(/*drain_bell=*/true); }
  gs_status_t arm_wait_fd_quiet() override { return arm(/*drain_bell=*/false); }
  bool maybe_ready() const override;

 private:
  gs_status_t arm(bool drain_bell);  // drain_bell: read the bell's datagrams first
  std::shared_ptr<RdmListenerCore> core_;
  std::deque<std::unique_ptr<ConnectionRequest>> ready_;
};

int RdmListener::get_request(std::unique_ptr<ConnectionRequest> *out) {
  if (out == nullptr) return -EINVAL;
  if (ready_.empty()) {
    std::lock_guard<std::mutex> lock(core_->mu);
    shm::Bell &bell = core_->shared->bell;
    if (bell.requests_pending()) [[unlikely]]
      bell.collect_requests();
    core_->flush_pending_locked();
    const int ringer = core_->domain->ringer();
    core_->drain_locked([&](const CtrlMsg &msg) {
      PeerRef client;
      if (insert_peer(core_->shared, msg.name, msg.pid, ringer, &client) != 0) return;  // client already gone
      // The REQ was the client's last message to the listener: the request's
      // pin (if in-process) is all that must keep its region mapped now.
      if (msg.pid == getpid()) unpin_inbound(core_->shared, msg.name);
      auto request = std::make_unique<RdmConnectionRequest>(core_, msg, std::move(client));
      // Tell the client its REQ is with the application now: from here on an
      // answer is guaranteed (ACCEPT, or REJECT when the request is dropped).
      core_->send_ack_locked(request->client().addr, &request->client().bell, msg.nonce);
      ready_.push_back(std::move(request));
    });
    if (bell.has_requesters()) [[unlikely]]
      bell.serve_requests(ringer);
  }
  if (ready_.empty()) return core_->short_of.load(std::memory_order_relaxed);  // 0, or a client waits for a descriptor
  *out = std::move(ready_.front());
  ready_.pop_front();
  return 1;
}

gs_status_t RdmListener::arm(bool drain_bell) {
  if (!ready_.empty() || core_->short_of.load(std::memory_order_relaxed) != 0) return -EAGAIN;
  std::lock_guard<std::mutex> lock(core_->mu);
  shm::Bell &bell = core_->shared->bell;
  if (!bell.valid() || (drain_bell && bell.drain_unless_drained())) return -EAGAIN;
  bell.arm();  // then look again: see shm_bell.h
  bool again = bell.signalled() || bell.requests_pending() || bell.has_requesters();
  if (!again && core_->send_blocked && !core_->pending.empty()) {
    // An ACK or REJECT the client has not made room for: it rings us back.
    int rc = core_->pending.front().bell().request_ringback(core_->shared->name);
    if (rc == 0) {
      core_->send_blocked = false;
    } else if (rc == -ECONNREFUSED) {
      core_->forget_client_locked(&core_->pending.front().owned);  // that client is gone
      core_->pending.pop_front();
      core_->pending_count.store(core_->pending.size(), std::memory_order_relaxed);
    } else if (rc == -EAGAIN && core_->domain->watchdog().ring_after(shm::bell_path(core_->shared->name), 2)) {
      rc = 0;  // its bell is full (it is awake) but will not ring us: look again after a pause
    }
    again = rc != 0;
  }
  if (again) bell.disarm();
  return again ? -EAGAIN : 0;
}

bool RdmListener::maybe_ready() const {
  const shm::Bell &bell = core_->shared->bell;
  return !ready_.empty() || !bell.valid() || bell.signalled() || bell.requests_pending() || bell.has_requesters() ||
         core_->pending_count.load(std::memory_order_relaxed) != 0 ||
         core_->short_of.load(std::memory_order_relaxed) != 0;
}

}  // namespace

// --- core --------------------------------------------------------------------

void RdmListenerCore::send_locked(PendingCtrl &&entry) {
  if (pending.empty()) {
    ssize_t ret = fi_inject(shared->ep, &entry.msg, sizeof(entry.msg), entry.addr);
    entry.bell().wake_if_armed();  // sent, or shm's name exchange queued on the way
    if (ret != -FI_EAGAIN) {
      forget_client_locked(&entry.owned);
      return;
    }
    send_blocked = true;
  }
  pending.push_back(std::move(entry));  // keeps the order of messages
  pending_count.store(pending.size(), std::memory_order_relaxed);
}

void RdmListenerCore::send_reject_locked(PeerRef &&peer, const char *peer_name, uint64_t nonce) {
  PendingCtrl entry;
  entry.addr = peer.addr;
  entry.owned = std::move(peer);
  entry.owned_name = peer_name;
  entry.msg = make_ctrl(kReject, nonce, shared->name);
  send_locked(std::move(entry));
}

void RdmListenerCore::send_ack_locked(fi_addr_t addr, const shm::PeerBell *bell, uint64_t nonce) {
  PendingCtrl entry;
  entry.addr = addr;
  entry.borrowed_bell = bell;
  entry.msg = make_ctrl(kAck, nonce, shared->name);
  send_locked(std::move(entry));
}

void RdmListenerCore::drop_pending_ack_locked(uint64_t nonce) {
  for (auto it = pending.begin(); it != pending.end();) {
    if (it->msg.type == kAck && it->msg.nonce == nonce) {
      it = pending.erase(it);
    } else {
      ++it;
    }
  }
  pending_count.store(pending.size(), std::memory_order_relaxed);
}

void RdmListenerCore::forget_client_locked(PeerRef *client) {
  if (!client->valid()) return;
  remove_peer(*shared, client);
  shared->bell.release_admissions(1);
}

// A probe comes from a client endpoint parked for us (fabric_rdm_parking.cc):
// it gave up after its name exchange and before its REQ went, so nothing else
// would take it out of our AV (shm's table of peers) or give its admission back.
void RdmListenerCore::forget_parked_client_locked(const CtrlMsg &probe) {
  PeerRef client;
  if (insert_peer(shared, probe.name, probe.pid, domain->ringer(), &client) == 0) forget_client_locked(&client);
}

// Each client dropped there will never be in our AV: its admission is free.
// False: a client's name exchange waits for a descriptor, so no progress pass.
bool RdmListenerCore::screen_name_exchanges_locked() {
  const shm::NameExchangeGuard::Screened s = name_exchanges.screen();
  shared->bell.release_admissions(static_cast<uint32_t>(s.dropped));
  short_of.store(s.out_of_descriptors ? s.why : 0, std::memory_order_relaxed);
  return !s.out_of_descriptors;
}

void RdmListenerCore::flush_pending_locked() {
  while (!pending.empty()) {
    PendingCtrl &entry = pending.front();
    ssize_t ret = fi_inject(shared->ep, &entry.msg, sizeof(entry.msg), entry.addr);
    entry.bell().wake_if_armed();
    if (ret == -FI_EAGAIN) {
      send_blocked = true;
      break;
    }
    forget_client_locked(&entry.owned);
    pending.pop_front();
  }
  pending_count.store(pending.size(), std::memory_order_relaxed);
}

template <class F>
void RdmListenerCore::drain_locked(F &&on_request) {
  fi_cq_data_entry entries[kCqBatch];
  for (;;) {
    if (!screen_name_exchanges_locked()) return;
    ssize_t got = fi_cq_read(shared->cq, entries, kCqBatch);
    if (got == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(shared->cq, &err, 0) > 0 && err.op_context != nullptr) {
        auto *buf = static_cast<CtrlMsg *>(err.op_context);
        if (buf >= bufs.data() && buf < bufs.data() + bufs.size() && err.err != FI_ECANCELED) {
          post_buf(buf - bufs.data());
        }
      }
      continue;
    }
    if (got <= 0) return;
    for (ssize_t i = 0; i < got; ++i) {
      auto *buf = static_cast<CtrlMsg *>(entries[i].op_context);
      if (buf < bufs.data() || buf >= bufs.data() + bufs.size()) continue;
      if ((entries[i].flags & FI_RECV) == 0) continue;
      const CtrlMsg msg = *buf;
      post_buf(buf - bufs.data());
      if (!valid_ctrl(msg, entries[i].len)) continue;
      if (msg.type == kProbe) forget_parked_client_locked(msg);
      if (msg.type == kReq) on_request(msg);
    }
  }
}

void RdmListenerCore::refuse_unhandled_locked() {
  drain_locked([this](const CtrlMsg &msg) {
    PeerRef peer;
    if (insert_peer(shared, msg.name, msg.pid, domain->ringer(), &peer) == 0)
      send_reject_locked(std::move(peer), msg.name, msg.nonce);
  });
  flush_for_a_moment_locked(/*read_cq=*/true);
}

void RdmListenerCore::flush_for_a_moment_locked(bool read_cq) {
  for (int spin = 0; spin < 200 && !pending.empty(); ++spin) {
    if (read_cq && screen_name_exchanges_locked()) (void)fi_cq_read(shared->cq, nullptr, 0);
    flush_pending_locked();
    if (!pending.empty()) usleep(50);
  }
}

// Refuses what waits first, while the rendezvous and the bell still say the
// listener is there, and reads its CQ never again. A client sees the closed
// bell or the rendezvous gone, gives up, and closes its endpoint, which
// unlinks its region; shm 1.17 reading that client's name exchange afterwards
// (smr_progress_connreq) maps nothing and dereferences a null region: the
// listener's process crashed at exit (one-connection workers, 1 in 8).
void RdmListenerCore::shutdown() {
  std::lock_guard<std::mutex> lock(mu);
  if (closed) return;
  closed = true;
  if (!creator.here()) return;  // its rendezvous, bell and requests are another process's
  if (shared && shared->ep != nullptr) refuse_unhandled_locked();
  if (rendezvous_fd >= 0) {
    shm_unlink(rendezvous.c_str());
    close(rendezvous_fd);  // releases the lock
    rendezvous_fd = -1;
  }
  // A REQ that lands from here on is never read: its client sees the bell
  // closed (or the rendezvous gone) and gives up.
  if (shared && shared->ep != nullptr) shared->bell.close_for_good(domain->ringer());
}

RdmListenerCore::~RdmListenerCore() {
  if (!creator.here()) {  // left to its process (creator.h), the endpoint with it
    new std::shared_ptr<RdmShared>(std::move(shared));
    new std::deque<PendingCtrl>(std::move(pending));
    return;
  }
  if (stuck_watch) domain->watchdog().unwatch(stuck_watch);
  if (rendezvous_fd >= 0) {  // listen() failed half way
    shm_unlink(rendezvous.c_str());
    close(rendezvous_fd);
  }
  std::deque<PendingCtrl> unsent;
  if (shared && shared->ep != nullptr) {
    std::lock_guard<std::mutex> lock(mu);
    // After shutdown() only the answers to requests handed out remain; the CQ
    // is not read (see shutdown()).
    if (closed) flush_for_a_moment_locked(/*read_cq=*/false);
    else refuse_unhandled_locked();
    unsent.swap(pending);
    pending_count.store(0, std::memory_order_relaxed);
  }
  retire_shared(shared, domain->ringer());
  // A REJECT still unsent: its client may not have read our name exchange
  // (fabric_rdm_parking.cc).
  for (PendingCtrl &entry : unsent)
    domain->park(ParkedEndpoint{shared, std::move(entry.owned), std::move(entry.owned_name)});
}

// --- connection request ------------------------------------------------------

RdmConnectionRequest::~RdmConnectionRequest() {
  std::lock_guard<std::mutex> lock(core_->mu);
  core_->drop_pending_ack_locked(msg_.nonce);
  if (!answered_ && client_.valid()) {
    answered_ = true;
    core_->send_reject_locked(std::move(client_), msg_.name, msg_.nonce);
  }
  core_->forget_client_locked(&client_);
}

void RdmConnectionRequest::reject() {
  std::lock_guard<std::mutex> lock(core_->mu);
  if (answered_ || !client_.valid()) return;
  answered_ = true;
  core_->send_reject_locked(std::move(client_), msg_.name, msg_.nonce);
}

// --- listen ------------------------------------------------------------------

gs_status_t RdmDomain::listen(const sockaddr *addr, socklen_t len, int /*backlog*/, const ListenOptions &options,
                              std::unique_ptr<Listener> *out) {
  sockaddr_storage bound;
  if (out == nullptr || !copy_sockaddr(addr, len, &bound)) return -EINVAL;
  auto core = std::make_shared<RdmListenerCore>();
  core->domain = this;
  set_error_detail({});
  const bool v6only = bound.ss_family == AF_INET6 && options.v6only;

  // The IPv4 and IPv6 wildcards of one port, as the kernel has them: a
  // dual-stack [::] listener (no IPV6_V6ONLY) and a 0.0.0.0 one exclude each other.
  if (sockaddr_port(bound) != 0 && is_wildcard(bound)) {
    const bool v6 = bound.ss_family == AF_INET6;
    const std::string other = shm::rendezvous_name(v6 ? "0.0.0.0" : "::", sockaddr_port(bound));
    shm::Rendezvous rv{};
    if (shm::read_rendezvous(other, &rv) && (v6 ? !v6only : !(rv.flags & shm::kRendezvousV6Only))) {
      set_error_detail("fabric:shm: " + other + " (process " + std::to_string(rv.pid) +
                       ") and this listener would both take IPv4 clients (IPV6_V6ONLY is off)");
      return -EADDRINUSE;
    }
  }

  // Claim the rendezvous name (a free ephemeral port for port 0).
  const bool any_port = sockaddr_port(bound) == 0;
  const std::string ip = sockaddr_ip(bound);
  uint64_t seed = random_u64();
  std::string detail;
  for (int attempt = 0; attempt < (any_port ? 128 : 1); ++attempt) {
    if (any_port) set_sockaddr_port(&bound, static_cast<uint16_t>(32768 + (seed >> 8) % 28232));
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    const std::string name = shm::rendezvous_name(ip, sockaddr_port(bound));
    int fd = -1;
    const int ret = shm::claim_rendezvous(name, &fd, &detail);
    if (ret == -EADDRINUSE) continue;  // a live listener owns it
    if (ret < 0) return ret;
    core->rendezvous_fd = fd;
    core->rendezvous = name;
    break;
  }
  if (core->rendezvous_fd < 0) {
    set_error_detail(any_port ? "fabric:shm: no free port for " + ip : detail);
    return -EADDRINUSE;
  }
  core->bound = bound;

  gs_status_t ret = open_shared(&core->shared, /*for_listener=*/true);
  if (ret < 0) return ret;
  core->stuck_watch = watchdog_.watch_stuck(core->shared->name);
  if (core->shared->bell.valid()) core->shared->bell.open_admissions(kListenerAdmissions);
  core->name_exchanges.open(core->shared->name);  // without it, shm's own behaviour
  core->bufs.resize(kListenerCtrlBufs);
  for (size_t i = 0; i < core->bufs.size(); ++i) {
    ret = core->post_buf(i);
    if (ret < 0) return ret;
  }
  shm::Rendezvous rv{};
  rv.magic = shm::kRendezvousMagic;
  rv.version = shm::kRendezvousVersion;
  rv.pid = getpid();
  rv.flags = v6only ? shm::kRendezvousV6Only : 0;
  std::strncpy(rv.name, core->shared->name.c_str(), sizeof(rv.name) - 1);
  if (ftruncate(core->rendezvous_fd, sizeof(rv)) != 0 ||
      pwrite(core->rendezvous_fd, &rv, sizeof(rv), 0) != static_cast<ssize_t>(sizeof(rv))) {
    return -errno;
  }
  *out = std::make_unique<RdmListener>(std::move(core));
  return 0;
}

}  // namespace gpusock::wire::fabric::rdm
