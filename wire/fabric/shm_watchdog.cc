#include "wire/fabric/shm_watchdog.h"

#include "wire/config.h"
#include "wire/fabric/fabric_common.h"
#include "wire/fabric/shm_bell.h"
#include "wire/log.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace gpusock::wire::fabric::shm {
namespace {

// A listener's lock held this long with no command moving is taken for one a
// killed client left (GPUSOCK_SHM_STUCK_LOCK_MS, 10 s). A live holder can keep
// it for seconds inside one command: a pass that maps a hundred new clients'
// regions on a loaded machine.
uint64_t stuck_lock_ms() {
  static const uint64_t ms = static_cast<uint64_t>(config::get(config::Id::kShmStuckLockMs));
  return ms;
}
// Our region's lock still held this long after its peer died, by a thread of
// ours inside the provider: that thread is spinning on it, not holding it (a
// progress pass holds it for microseconds).
constexpr uint64_t kDeadHolderMs = 1000;
constexpr int kWatchdogTickMs = 10;
// A listener region's lock is looked at this often while it is free: a lock
// that stays held is released after stuck_lock_ms() anyway, so an idle server's
// watchdog wakes once a second, not every tick (docs/performance.md, the idle
// rows), and the release comes at most this much later.
constexpr int kStuckIdleTickMs = 1000;

int pidfd_open(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

}  // namespace

PeerPidfd::~PeerPidfd() {
  if (in_epoll) epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
  close(fd);
}

// --- PidWatch --------------------------------------------------------------------

void PidWatch::watch(pid_t pid) {
  reset();
  if (pid <= 0 || pid == getpid()) return;  // our own process cannot die under us
  pid_ = pid;
  fd_ = pidfd_open(pid);
}

void PidWatch::reset() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  pid_ = 0;
}

bool PidWatch::dead() const {
  if (pid_ <= 0) return false;
  if (fd_ >= 0) {
    pollfd pfd{fd_, POLLIN, 0};
    return ::poll(&pfd, 1, 0) > 0;
  }
  return kill(pid_, 0) != 0 && errno == ESRCH;
}

// --- ShmWatchdog -----------------------------------------------------------------

ShmWatchdog::~ShmWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake();
  if (thread_.joinable()) thread_.join();
  watches_.clear();  // their pidfds leave the epoll set before it closes
  pidfds_.clear();
  if (epfd_ >= 0) close(epfd_);
  if (wakefd_ >= 0) close(wakefd_);
  if (ringer_ >= 0) close(ringer_);
}

std::shared_ptr<PeerWatch> ShmWatchdog::watch_pid(pid_t pid, const std::vector<std::string> &regions,
                                                  const std::string &wake_path, std::shared_ptr<HintBoard> board,
                                                  int32_t slot) {
  auto watch = std::make_shared<PeerWatch>();
  watch->pid = pid;
  watch->wake_path = wake_path;
  watch->board = std::move(board);
  watch->slot = slot;
  add_locks(watch.get(), regions);
  return add(watch) ? watch : nullptr;
}

std::shared_ptr<PeerWatch> ShmWatchdog::watch_stuck(const std::string &region) {
  auto watch = std::make_shared<PeerWatch>();
  watch->stuck_mode = true;
  add_locks(watch.get(), {region});
  if (watch->locks.empty()) return nullptr;
  return add(watch) ? watch : nullptr;
}

void ShmWatchdog::unwatch(const std::shared_ptr<PeerWatch> &watch) {
  if (!watch) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = watches_.begin(); it != watches_.end(); ++it) {
    if (*it == watch) {
      watch->pidfd.reset();  // the last watch of its process closes it
      watches_.erase(it);
      return;
    }
  }
}

void ShmWatchdog::add_locks(PeerWatch *watch, const std::vector<std::string> &regions) {
  for (const std::string &name : regions) {
    auto region = std::make_unique<RegionLock>();
    if (region->open(name)) watch->locks.push_back(std::move(region));
  }
}

void ShmWatchdog::wake() {
  if (wakefd_ < 0) return;
  const uint64_t one = 1;
  (void)!write(wakefd_, &one, sizeof(one));
}

bool ShmWatchdog::start_locked() {
  if (started_) return true;
  // All or nothing: a later call starts from scratch.
  const auto give_up = [this] {
    for (int *fd : {&epfd_, &wakefd_, &ringer_}) {
      if (*fd >= 0) close(*fd);
      *fd = -1;
    }
    return false;
  };
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  wakefd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  ringer_ = open_ringer();
  if (epfd_ < 0 || wakefd_ < 0 || ringer_ < 0) return give_up();
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;  // the wake fd; pidfds have ids from 1
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, wakefd_, &ev) != 0) return give_up();
  try {
    thread_ = std::thread([this] { run(); });
    (void)pthread_setname_np(thread_.native_handle(), "gs-shm-watch");  // for top -H, perf, gdb
  } catch (...) {
    return give_up();
  }
  started_ = true;
  return true;
}

bool ShmWatchdog::ring_after(const std::string &bell_path, uint32_t ms) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!start_locked()) return false;
  const uint64_t at = coarse_ms() + ms;
  const bool first = timers_.empty() || at < timers_.begin()->first;
  timers_.emplace(at, bell_path);
  if (first) wake();  // the thread may sleep longer than that
  return true;
}

int ShmWatchdog::next_timer_ms_locked() const {
  if (timers_.empty()) return -1;
  const uint64_t now = coarse_ms(), at = timers_.begin()->first;
  return at > now ? static_cast<int>(at - now) : 0;
}

void ShmWatchdog::ring_due_locked() {
  const uint64_t now = coarse_ms();
  while (!timers_.empty() && timers_.begin()->first <= now) {
    (void)send_to_bell(ringer_, timers_.begin()->second, "t", 1);  // gone: nobody waits any more
    timers_.erase(timers_.begin());
  }
}

bool ShmWatchdog::add(const std::shared_ptr<PeerWatch> &watch) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!start_locked()) return false;
  if (!watch->stuck_mode) watch->pidfd = pidfd_of(watch->pid);
  watches_.push_back(watch);
  if (watch->stuck_mode || !watch->pidfd) wake();  // switch the thread to ticking
  return true;
}

std::shared_ptr<PeerPidfd> ShmWatchdog::pidfd_of(pid_t pid) {
  auto &slot = pidfds_[pid];
  if (auto shared = slot.lock(); shared && shared->in_epoll) return shared;
  // None yet, or the one there saw its process die: a process now under
  // that pid is another one.
  slot.reset();
  const int fd = pidfd_open(pid);
  if (fd < 0) return nullptr;
  auto shared = std::make_shared<PeerPidfd>(fd, epfd_, next_pidfd_id_++);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = shared->id;
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    shared->in_epoll = false;
    return nullptr;
  }
  slot = shared;
  // Forget processes whose last watch went, now and then.
  if (pidfds_.size() > 2 * watches_.size() + 16)
    std::erase_if(pidfds_, [](const auto &entry) { return entry.second.expired(); });
  return shared;
}

// With mu_ held. The peer's lock is released at once (a thread of ours may
// be spinning on it to enqueue); ours only as settle_own_lock says.
void ShmWatchdog::fire(PeerWatch *watch) {
  if (watch->dead.load(std::memory_order_relaxed)) return;
  if (watch->pidfd && watch->pidfd->in_epoll) {
    epoll_ctl(epfd_, EPOLL_CTL_DEL, watch->pidfd->fd, nullptr);
    watch->pidfd->in_epoll = false;
  }
  // seq_cst, paired with the endpoint's seq_cst in_provider increment and
  // dead load: either it sees dead and stays out, or we see it inside. The
  // endpoint re-checks `dead` after arming its bell, so ringing after the
  // store loses no sleeper.
  watch->dead.store(true, std::memory_order_seq_cst);
  if (!watch->wake_path.empty()) {
    const char one = 1;
    (void)send_to_bell(ringer_, watch->wake_path, &one, 1);
  }
  // The dead process may have taken our group's armed word and died before
  // its ring: this ring is the one it owed.
  if (watch->board) watch->board->mark_and_ring(watch->slot);
  if (!watch->locks.empty() && watch->locks[0]->held()) watch->locks[0]->release();
  if (watch->locks.size() > 1) {
    watch->own_lock_pending = true;
    watch->held_since_ms = coarse_ms();
    settle_own_lock(watch);
  } else {
    watch->queue_after_death.store(QueueAfterDeath::kDropped, std::memory_order_release);
  }
}

// Our region's lock after its peer died. Free: nothing was torn. Held with
// no thread of ours in the provider: the dead peer holds it, possibly over a
// torn enqueue: drop what is pending, release. Held with one of ours inside:
// it holds the lock (released in microseconds) or spins on the dead peer's
// (held for kDeadHolderMs: treat as the dead peer's).
void ShmWatchdog::settle_own_lock(PeerWatch *watch) {
  if (!watch->own_lock_pending) return;
  RegionLock &own = *watch->locks[1];
  if (!own.held()) {
    watch->own_lock_pending = false;
    watch->queue_after_death.store(QueueAfterDeath::kWhole, std::memory_order_release);
    return;
  }
  if (watch->in_provider.load(std::memory_order_seq_cst) == 0 || coarse_ms() - watch->held_since_ms >= kDeadHolderMs) {
    own.drop_pending_commands();
    own.release();
    watch->own_lock_pending = false;
    watch->queue_after_death.store(QueueAfterDeath::kDropped, std::memory_order_release);
  }
}

void ShmWatchdog::run() {
  epoll_event events[16];
  for (;;) {
    int tick_ms = -1;  // none: wait for a pidfd or the wake fd
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      for (const auto &watch : watches_) {
        // A peer without a pidfd is looked for with kill(); a listener
        // region (stuck_mode: no pidfd, many peers) ticks fast only while
        // its lock is seen held.
        const bool fast = watch->own_lock_pending ||
                          (watch->stuck_mode ? watch->held_since_ms != 0 : !watch->pidfd && !watch->dead.load());
        if (fast) tick_ms = kWatchdogTickMs;
        else if (watch->stuck_mode && tick_ms < 0) tick_ms = kStuckIdleTickMs;
      }
      const int timer_ms = next_timer_ms_locked();
      if (timer_ms >= 0 && (tick_ms < 0 || timer_ms < tick_ms)) tick_ms = timer_ms;
    }
    const int n = epoll_wait(epfd_, events, 16, tick_ms);
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == 0) {
        uint64_t value;
        (void)!read(wakefd_, &value, sizeof(value));
        continue;
      }
      // Every connection to the process that died.
      for (const auto &watch : watches_) {
        if (watch->pidfd && watch->pidfd->id == events[i].data.u64) fire(watch.get());
      }
    }
    ring_due_locked();
    const uint64_t now = coarse_ms();
    for (const auto &watch : watches_) {
      settle_own_lock(watch.get());
      if (watch->stuck_mode) {
        RegionLock &lock = *watch->locks[0];
        const bool held = lock.held();
        const uint64_t activity = held ? lock.activity() : 0;
        if (!held) {
          watch->held_since_ms = 0;
        } else if (watch->held_since_ms == 0 || activity != watch->activity_seen) {
          watch->held_since_ms = now;  // held, but by whoever came last
          watch->activity_seen = activity;
        } else if (now - watch->held_since_ms >= stuck_lock_ms()) {
          log::write(log::kInfo, "fabric",
                     "fabric:shm: a listener's region lock held %llu ms with no command moving: released",
                     static_cast<unsigned long long>(now - watch->held_since_ms));
          lock.release();
          watch->held_since_ms = 0;
        }
      } else if (!watch->pidfd && !watch->dead.load(std::memory_order_relaxed) && kill(watch->pid, 0) != 0 &&
                 errno == ESRCH) {
        fire(watch.get());
      }
    }
  }
}

}  // namespace gpusock::wire::fabric::shm
