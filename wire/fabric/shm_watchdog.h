// Dead peers and the shm region locks they leave held (fabric:shm).
//
// Every shm region has a process-shared spinlock, taken by its owner while it
// progresses and by every sender while it enqueues. A process SIGKILLed inside
// such a section leaves the lock held for good, and the next fi_writedata,
// fi_inject or fi_cq_read that needs it spins forever. A per-domain watchdog
// thread watches each cross-process peer's pidfd; when the peer dies it marks
// the connection dead, rings the endpoint's bell (shm_bell.h: a sleeper must
// hear of it), and releases the locks of the two regions the connection uses
// (the peer's and ours). After the peer's death only our endpoint's thread
// touches those locks, so releasing them cannot break a live holder. Listener
// regions take REQs from processes not yet known, so there the watchdog
// releases the lock only when it stayed held for GPUSOCK_SHM_STUCK_LOCK_MS (10 s) with no
// command enqueued or consumed meanwhile: a busy listener's lock can be seen
// held at every look for seconds while it changes hands, and releasing it
// under a live holder lets two threads into shm's queues and inject pool.
//
// Torn enqueues. A write with remote CQ data is two commands in the receiver's
// queue (the write, then its RMA iov), committed one after the other under
// the receiver's lock; shm's consumer takes the second as "the head after the
// first" without checking that it was committed. A sender SIGKILLed between
// the two commits leaves a write whose iov the consumer reads from a stale
// slot; it then discards one slot more than was written, keeps walking stale
// slots of earlier laps, and dies on the first stale name-exchange command
// whose inject buffer has been reused (a NULL peer region: SIGSEGV in
// fi_cq_read). So, once a peer is dead: our endpoint never calls
// the provider on that connection again (poll, writes, control messages), and
// when the dead peer died holding OUR region's lock (the only way an enqueue
// can be torn), the watchdog drops what is pending in our command queue
// before it releases that lock, for a thread of ours that was already
// spinning on it inside fi_cq_read. It knows whether one was: the endpoint
// marks its provider calls (PeerWatch::in_provider, ProviderCall).
//
// What a peer sent before it exited. A process that writes, closes and exits
// at once leaves its last data and its disconnect in our command queue. When
// our region's lock was free at its death, every command there is whole
// (QueueAfterDeath::kWhole), and the endpoint reads the queue once more before
// it reports the connection lost: the peer's close arrives as a close.
//
// Reaching the lock needs shm's region layout (shm_region.h).
#pragma once

#include "wire/fabric/shm_hints.h"
#include "wire/fabric/shm_region.h"

#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace gpusock::wire::fabric::shm {

// A pidfd for one peer process, shared by every watch of that process: a
// server with a thousand connections from one client holds one, not a
// thousand. Closed (and taken out of the watchdog's epoll set) with the last
// watch that holds it.
struct PeerPidfd {
  PeerPidfd(int fd, int epfd, uint64_t id) : fd(fd), epfd(epfd), id(id) {}
  PeerPidfd(const PeerPidfd &) = delete;
  PeerPidfd &operator=(const PeerPidfd &) = delete;
  ~PeerPidfd();
  const int fd;
  const int epfd;
  const uint64_t id;     // the epoll event's data: never reused, unlike an address
  bool in_epoll = true;  // until the process died (level-triggered: taken out then)
};

// What the watchdog found in our region's command queue once the peer died.
enum class QueueAfterDeath : int {
  kUnsettled,  // not yet looked (our region's lock held by a thread of ours)
  kWhole,      // the lock was free: every command in it was committed whole
  kDropped,    // held by the dead peer (dropped), or not ours to look at
};

// One watched peer (or, in stuck mode, one listener region). For a peer,
// locks[0] is the peer's region, locks[1] (when there) our endpoint's.
struct PeerWatch {
  std::atomic<bool> dead{false};
  std::atomic<QueueAfterDeath> queue_after_death{QueueAfterDeath::kUnsettled};
  // Threads of our endpoint inside a provider call on this connection.
  std::atomic<int> in_provider{0};
  pid_t pid = 0;
  std::shared_ptr<PeerPidfd> pidfd;  // none: looked for with kill()
  bool stuck_mode = false;
  bool own_lock_pending = false;  // dead, and our region's lock not yet settled
  uint64_t held_since_ms = 0;
  uint64_t activity_seen = 0;        // stuck mode: the region's queue counters then
  std::string wake_path;             // the bell to ring when the peer dies
  std::shared_ptr<HintBoard> board;  // and the hint to mark (its sleep group may watch it)
  int32_t slot = -1;
  std::vector<std::unique_ptr<RegionLock>> locks;
};

// One provider call on a watched connection, marked for the watchdog (see
// "Torn enqueues"): false, and no call may be made, once the peer is dead.
// It holds the watch by a plain pointer: a call may replace the endpoint's
// watch, so the endpoint keeps every watch it had until it is destroyed
// (RdmEndpoint::unwatch), and a reference count per provider call (two more
// locked instructions on every poll of a connection) buys nothing.
class ProviderCall {
 public:
  ProviderCall(bool peer_died, PeerWatch *watch) {
    if (peer_died) {
      ok_ = false;
      return;
    }
    if (!watch) return;
    watch_ = watch;
    watch_->in_provider.fetch_add(1, std::memory_order_seq_cst);
    ok_ = !watch_->dead.load(std::memory_order_seq_cst);
  }
  ~ProviderCall() {
    if (watch_) watch_->in_provider.fetch_sub(1, std::memory_order_release);
  }
  ProviderCall(const ProviderCall &) = delete;
  ProviderCall &operator=(const ProviderCall &) = delete;
  explicit operator bool() const { return ok_; }

 private:
  PeerWatch *watch_ = nullptr;
  bool ok_ = true;
};

// Watches a peer process for its death without the watchdog (when its thread
// could not start): polled.
class PidWatch {
 public:
  ~PidWatch() { reset(); }
  void watch(pid_t pid);
  void reset();
  bool active() const { return pid_ > 0; }
  bool dead() const;

 private:
  pid_t pid_ = 0;
  int fd_ = -1;
};

class ShmWatchdog {
 public:
  ~ShmWatchdog();

  // When `pid` dies: mark the watch dead, ring the bell at `wake_path`, mark
  // `slot` on `board` (if any), and release the regions' locks. nullptr if
  // the watchdog cannot run.
  std::shared_ptr<PeerWatch> watch_pid(pid_t pid, const std::vector<std::string> &regions, const std::string &wake_path,
                                       std::shared_ptr<HintBoard> board = nullptr, int32_t slot = -1);
  // Release `region`'s lock when it stays held for GPUSOCK_SHM_STUCK_LOCK_MS.
  std::shared_ptr<PeerWatch> watch_stuck(const std::string &region);
  void unwatch(const std::shared_ptr<PeerWatch> &watch);
  // One ring of the bell at `bell_path` after `ms` (a client waiting to be
  // admitted, shm_bell.h). False if the watchdog cannot run.
  bool ring_after(const std::string &bell_path, uint32_t ms);

 private:
  static void add_locks(PeerWatch *watch, const std::vector<std::string> &regions);
  bool start_locked();               // the thread, its epoll set and wake fd (mu_ held)
  int next_timer_ms_locked() const;  // until the first timer; -1: none
  void ring_due_locked();
  // The shared pidfd of `pid` (mu_ held): the one a live watch holds, else a
  // new one in the epoll set; nullptr without pidfd_open.
  std::shared_ptr<PeerPidfd> pidfd_of(pid_t pid);
  void wake();
  bool add(const std::shared_ptr<PeerWatch> &watch);
  void fire(PeerWatch *watch);
  static void settle_own_lock(PeerWatch *watch);
  void run();

  std::mutex mu_;
  std::thread thread_;
  bool started_ = false;
  bool stop_ = false;
  int epfd_ = -1;
  int wakefd_ = -1;
  int ringer_ = -1;
  std::vector<std::shared_ptr<PeerWatch>> watches_;
  std::unordered_map<pid_t, std::weak_ptr<PeerPidfd>> pidfds_;
  std::multimap<uint64_t, std::string> timers_;  // coarse_ms deadline -> bell path
  uint64_t next_pidfd_id_ = 1;
};

}  // namespace gpusock::wire::fabric::shm
