// One fabric:shm connection endpoint (fabric_rdm.cc describes the flavour,
// shm_bell.h the waking). fabric_rdm_endpoint.cc: the handshake, data and
// teardown; fabric_rdm_endpoint_wait.cc: dead or departed peers, and waiting.
#pragma once

#include "wire/fabric/fabric_rdm.h"
#include "wire/fabric/shm_name_exchange.h"

#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace gpusock::wire::fabric::rdm {

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

  gs_status_t connect(const sockaddr *addr, socklen_t len, const void *private_data, uint32_t private_len) override;
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
  gs_status_t arm_wait() override { return arm(/*drain_bell=*/true); }
  gs_status_t arm_wait_fd_quiet() override { return arm(/*drain_bell=*/false); }
  bool maybe_ready() const override;
  int32_t hint_slot() const override { return shared_->board ? shared_->hint_slot : -1; }
  bool quiet_until_hinted() const override;
  void hint_self() override {
    if (shared_->board) shared_->board->mark(shared_->hint_slot);
  }

 private:
  // arm_wait; drain_bell: read the bell's datagrams first (unless the caller
  // just found its fd quiet).
  gs_status_t arm(bool drain_bell);
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
    if (shared_->bell.requests_pending()) [[unlikely]]
      shared_->bell.collect_requests();
  }
  void after_pass() {
    if (shared_->bell.has_requesters()) [[unlikely]]
      shared_->bell.serve_requests(domain_->ringer());
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
  // call.
  bool verdict_waiting() const;
  // The same, or no way to tell without one (fallback_watch_ polls).
  bool verdict_may_wait() const {
    return verdict_waiting() || (fallback_watch_.active() && state_ != State::kIdle && state_ != State::kClosed);
  }
  // Something to report without asking the provider.
  bool work_waiting() const {
    return !events_.empty() || !stash_.empty() || cq_dirty_ || ring_.head_done() || liveness_now_;
  }
  // shm has enqueued or answered: a progress pass has work. Not once the peer
  // died: no provider call is made again, and what it left stays signalled.
  bool signalled() const { return !peer_died_ && shared_->bell.signalled(); }
  // A send that met -FI_EAGAIN still matters (a control message, or a write
  // while the connection lasts).
  bool still_blocked() const { return ctrl_pending_ || (tx_blocked_ && state_ == State::kEstablished); }
  // Guards every provider call on this connection (see "Torn enqueues").
  ProviderCall provider_call() const { return ProviderCall(peer_died_, watch_.get()); }
  void check_liveness();
  // False while the watchdog has not yet looked at our queue (look again).
  bool drain_dead_peer();
  void peer_gone(bool dead_process);
  void fail_connect(int status, const char *reason = nullptr);  // reason: static text
  // Before each read of the CQ while connecting (shm_name_exchange.h).
  void screen_name_exchange();
  void try_admission();
  gs_status_t schedule_retry_ring();

  RdmDomain *domain_;
  std::shared_ptr<RdmShared> shared_;
  CtrlMsg ctrl_bufs_[kConnCtrlBufs];
  std::deque<CmEvent> events_;
  std::vector<Completion> stash_;  // data completions read by poll_cm
  bool ctrl_pending_ = false;
  CtrlMsg pending_msg_;
  const PeerRef *pending_dest_ = nullptr;  // &listener_ or &peer_
  // The last control message to it met -FI_EAGAIN: it may not have read our
  // name exchange, and this endpoint is parked for it when it goes.
  const PeerRef *unread_by_ = nullptr;
  PeerRef peer_;
  PeerRef listener_;
  std::string listener_rendezvous_;
  std::string listener_name_;
  std::shared_ptr<PeerWatch> watch_;
  // Watches replaced or dropped, alive until the endpoint goes: a provider
  // call in progress may still hold one (ProviderCall). A few per endpoint.
  std::vector<std::shared_ptr<PeerWatch>> retired_watches_;
  PidWatch fallback_watch_;               // when the watchdog is unavailable
  shm::NameExchangeGuard name_exchange_;  // open while connecting
  std::string peer_name_;
  pid_t peer_pid_ = 0;
  // Passive side, until established: the listener the request came through,
  // which can still refuse the client should our ACCEPT never leave.
  std::shared_ptr<RdmListenerCore> origin_;
  uint64_t nonce_ = 0;
  bool req_acked_ = false;  // the listener handed our REQ to its application
  // Our REQ waits in pending_msg_ for an admission to the listener
  // (shm_bell.h, "Admission").
  bool awaiting_admission_ = false;
  // Sleeps that only the watchdog ends (schedule_retry_ring).
  uint32_t retry_pause_ms_ = 0;
  uint64_t retry_ring_at_ = 0;
  uint8_t peer_record_[64] = {};
  uint32_t peer_record_len_ = 0;
  sockaddr_storage local_{};
  sockaddr_storage peer_sockaddr_{};
  uint32_t idle_polls_ = 0;
  uint64_t last_liveness_ms_ = 0;
  bool peer_died_ = false;  // its process is gone: no provider call on this connection again
  bool draining_ = false;   // reading what a dead peer left whole (drain_dead_peer)
  // Waiting (shm_bell.h).
  bool cq_dirty_ = false;          // the CQ may hold entries: our last read was not empty, or we posted since
  bool tx_blocked_ = false;        // a write met -FI_EAGAIN and none went since
  bool send_blocked_ = false;      // a send met -FI_EAGAIN since we last asked its peer to ring back
  bool liveness_now_ = false;      // check_liveness at once
  bool cq_read_for_cm_ = false;    // poll() read the CQ since poll_cm last looked: poll_cm need not
  bool peer_unreachable_ = false;  // a ring-back request found the peer's bell gone: its endpoint is
};

}  // namespace gpusock::wire::fabric::rdm
