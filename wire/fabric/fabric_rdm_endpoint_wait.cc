// fabric:shm connection endpoints: dead or departed peers, and waiting on
// the endpoint's bell (fabric_rdm_endpoint.h; shm_bell.h describes waking).
#include "wire/fabric/fabric_rdm_endpoint.h"
#include "wire/status_kinds.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace gpusock::wire::fabric::rdm {

void RdmEndpoint::watch_peer(pid_t pid, const std::string &peer_region) {
  unwatch();
  if (pid <= 0 || pid == getpid()) return;  // in-process peers cannot die under us
  const std::string wake = shared_->bell.valid() ? shm::bell_path(shared_->name) : std::string();
  watch_ = domain_->watchdog().watch_pid(pid, {peer_region, shared_->name}, wake, shared_->board, shared_->hint_slot);
  if (!watch_) fallback_watch_.watch(pid);
}

void RdmEndpoint::unwatch() {
  if (watch_) {
    domain_->watchdog().unwatch(watch_);
    retired_watches_.push_back(std::move(watch_));  // leaves watch_ empty
  }
  fallback_watch_.reset();
}

void RdmEndpoint::peer_gone(bool dead_process) {
  // An endpoint gone without a BYE may be a process that died before the
  // watchdog said so: then it is a dead process here too (its files are ours
  // to remove, and no provider call may touch the connection again).
  dead_process = dead_process || (!peer_name_.empty() && !shm::endpoint_owner_alive(peer_name_));
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

bool RdmEndpoint::drain_dead_peer() {
  if (peer_died_ || !watch_ || !watch_->dead.load(std::memory_order_acquire) || state_ != State::kEstablished)
    return true;
  const shm::QueueAfterDeath queue = watch_->queue_after_death.load(std::memory_order_acquire);
  if (queue == shm::QueueAfterDeath::kUnsettled) {
    liveness_now_ = true;
    return false;
  }
  if (queue != shm::QueueAfterDeath::kWhole) return true;
  // Only this thread calls the provider on the connection now: the watchdog
  // is done with our lock, and the peer is gone.
  draining_ = true;
  Completion buffer[kCqBatch];
  for (int pass = 0; pass < kDrainPassesMax && state_ == State::kEstablished; ++pass) {
    int produced = 0;
    const int got = process_cq(buffer, kCqBatch, &produced);
    stash_.insert(stash_.end(), buffer, buffer + produced);
    if (got <= 0) break;
  }
  draining_ = false;
  return true;
}

bool RdmEndpoint::verdict_waiting() const {
  if (state_ == State::kIdle || state_ == State::kClosed) return false;
  if (watch_ && watch_->dead.load(std::memory_order_acquire)) return true;
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
      errno = 0;
      if (!shm::read_rendezvous(listener_rendezvous_, &rv)) {
        if (!out_of_descriptors(-errno)) fail_connect(-ECONNREFUSED);  // else: no descriptor to look, later
      } else if (listener_name_ != rv.name) {
        fail_connect(-ECONNREFUSED);
      }
    }
    return;
  }
  if (state_ != State::kEstablished && state_ != State::kAccepting) return;
  if (peer_dead()) {
    if (!drain_dead_peer()) return;
    if (state_ == State::kEstablished || state_ == State::kAccepting) peer_gone(true);
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

gs_status_t RdmEndpoint::arm(bool drain_bell) {
  shm::Bell &bell = shared_->bell;
  if (!bell.valid() || work_waiting()) return -EAGAIN;
  if (drain_bell && bell.drain_unless_drained()) return -EAGAIN;  // a wake-up: what it announced is for poll to find
  // The peer that would wake us: one without a bell (an older gpusock) never
  // rings, so we do not sleep on it.
  const PeerRef &waker = state_ == State::kConnecting ? listener_ : peer_;
  if (waker.valid() && !waker.bell.valid() && state_ != State::kClosed) return -EAGAIN;
  if (awaiting_admission_) {
    if (listener_.bell.admission_open() || schedule_retry_ring() < 0) return -EAGAIN;
  }
  bell.arm();  // then look again: see shm_bell.h
  bool again = signalled() || bell.requests_pending() || bell.has_requesters() || verdict_may_wait() ||
               (awaiting_admission_ && listener_.bell.admission_open());
  if (!again && send_blocked_ && still_blocked()) {
    const PeerRef &dest = ctrl_pending_ ? *pending_dest_ : peer_;
    int rc = dest.bell.request_ringback(shared_->name);
    if (rc == 0) {
      send_blocked_ = false;
      retry_pause_ms_ = 0;
    } else if (rc == -ECONNREFUSED) {
      peer_unreachable_ = liveness_now_ = true;
      send_blocked_ = false;
    } else if (rc == -EAGAIN) {
      // The peer's bell holds all the requests it can: it is awake and busy,
      // but will not know to ring us. Try again after a pause.
      rc = schedule_retry_ring();
    }
    again = rc != 0;
  }
  if (again) bell.disarm();
  return again ? -EAGAIN : 0;
}

bool RdmEndpoint::maybe_ready() const {
  const shm::Bell &bell = shared_->bell;
  if (!bell.valid()) return true;
  return signalled() || work_waiting() || still_blocked() || bell.requests_pending() || bell.has_requesters() ||
         verdict_may_wait() || (awaiting_admission_ && listener_.bell.admission_open());
}

// What we wait for comes with no ring (an admission freed up, room in a
// peer's bell for our ring-back request): the watchdog rings us after a pause
// that doubles up to kMaxRetryPauseMs, one ring per pause however often we
// arm in between. -EAGAIN: no watchdog, look again now.
gs_status_t RdmEndpoint::schedule_retry_ring() {
  constexpr uint32_t kMaxRetryPauseMs = 16;
  const uint64_t now = coarse_ms();
  if (now < retry_ring_at_) return 0;
  retry_pause_ms_ = std::min(retry_pause_ms_ == 0 ? 1 : retry_pause_ms_ * 2, kMaxRetryPauseMs);
  if (!domain_->watchdog().ring_after(shm::bell_path(shared_->name), retry_pause_ms_)) return -EAGAIN;
  retry_ring_at_ = now + retry_pause_ms_;
  return 0;
}

bool RdmEndpoint::quiet_until_hinted() const {
  const shm::Bell &bell = shared_->bell;
  return shared_->board && state_ == State::kEstablished && peer_.bell.marks_hints() && bell.valid() && !signalled() &&
         !work_waiting() && !still_blocked() && !bell.requests_pending() && !bell.has_requesters() &&
         !verdict_may_wait();
}

}  // namespace gpusock::wire::fabric::rdm
