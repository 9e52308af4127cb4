// libgpusock_preload.so: poll, ppoll, select, pselect and epoll over a mix of
// kernel fds and gpusock sockets.
//
// A gpusock socket has no kernel object that becomes readable, so waits that
// involve one are emulated: ask the library for the sockets' readiness (gs_poll
// with a zero timeout) and the kernel for the other fds (timeout 0), spin for
// GPUSOCK_BUSY_POLL_US, then sleep in ppoll() on the kernel fds (or the real
// epoll fd) for 10 us doubling to 1 ms, so a kernel event ends the sleep at
// once and a signal interrupts it with EINTR, as the kernel's own waits do.
// Waits that involve no gpusock socket go straight to libc.
//
// epoll: the real epoll fd keeps every kernel member; the gpusock members live
// in a side table per epoll instance (shared by dup'ed epoll fds) with their
// events, data and edge/one-shot state.
#include "preload/shim.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/prctl.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <unordered_map>

#define GS_EXPORT extern "C" __attribute__((visibility("default")))

namespace gpusock::preload {

namespace {

using Clock = std::chrono::steady_clock;

constexpr long kMaxSleepUs = 1000;

timespec to_timespec(Clock::duration d) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  if (ns <= 0) return {0, 0};
  return {static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
}

// Shared waiting strategy. check() collects readiness (returns count or -1);
// sleep(ts) blocks on the kernel side for at most ts (returns -1 with errno on
// failure, EINTR included).
template <class Check, class Sleep>
int wait_loop(const timespec *timeout, Check check, Sleep sleep) {
  const auto start = Clock::now();
  const bool forever = timeout == nullptr;
  const auto deadline =
      forever ? Clock::time_point::max()
              : start + std::chrono::seconds(timeout->tv_sec) + std::chrono::nanoseconds(timeout->tv_nsec);
  const auto spin_until = start + std::chrono::microseconds(config().busy_poll_us);
  const unsigned signals_before = t_signals;
  long backoff_us = 10;
  for (;;) {
    const int n = check();
    if (n != 0) return n;
    if (!forever && timeout->tv_sec == 0 && timeout->tv_nsec == 0) return 0;
    const auto now = Clock::now();
    if (now >= deadline) return 0;
    if (t_signals != signals_before) {  // a handler ran while we spun
      errno = EINTR;
      return -1;
    }
    if (now < spin_until) {
      sched_yield();
      continue;
    }
    auto nap = std::chrono::microseconds(backoff_us);
    if (deadline - now < nap) nap = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now) +
                                    std::chrono::microseconds(1);
    const timespec ts = to_timespec(nap);
    static thread_local bool slack_set = false;
    if (!slack_set) {
      // The default 50 us timer slack would turn the first 10 us naps into
      // 60 us ones, a latency floor for every wake-up from a sleep.
      prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
      slack_set = true;
    }
    if (sleep(&ts) < 0) return -1;
    backoff_us = std::min(backoff_us * 2, kMaxSleepUs);
  }
}

}  // namespace

int emulated_poll(pollfd *fds, nfds_t nfds, const timespec *timeout, const sigset_t *sigmask) {
  const Real &R = real();
  std::vector<pollfd> gs, kern;
  std::vector<nfds_t> gs_index, kern_index;
  for (nfds_t i = 0; i < nfds; ++i) {
    fds[i].revents = 0;
    if (fds[i].fd < 0) continue;
    if (is_gs(fds[i].fd)) {
      if (fds[i].events & POLLIN) touch_read(fds[i].fd);
      gs.push_back(fds[i]);
      gs_index.push_back(i);
    } else {
      kern.push_back(fds[i]);
      kern_index.push_back(i);
    }
  }
  auto check = [&]() -> int {
    int ready = 0;
    if (!gs.empty()) {
      Inside guard;
      gs_poll(gs.data(), gs.size(), 0);
      for (size_t k = 0; k < gs.size(); ++k)
        if ((fds[gs_index[k]].revents = gs[k].revents)) ++ready;
    }
    if (!kern.empty()) {
      const int n = R.poll(kern.data(), kern.size(), 0);
      if (n < 0) return -1;
      for (size_t k = 0; k < kern.size(); ++k)
        if ((fds[kern_index[k]].revents = kern[k].revents)) ++ready;
    }
    return ready;
  };
  auto sleep = [&](const timespec *ts) -> int {
    const int n = R.ppoll(kern.data(), kern.size(), ts, sigmask);
    return n < 0 ? -1 : 0;
  };
  return wait_loop(timeout, check, sleep);
}

}  // namespace gpusock::preload

using namespace gpusock::preload;

namespace {

bool any_gs(const pollfd *fds, nfds_t nfds) {
  for (nfds_t i = 0; i < nfds; ++i)
    if (fds[i].fd >= 0 && is_gs(fds[i].fd)) return true;
  return false;
}

}  // namespace

// ================================================================== poll

GS_EXPORT int poll(pollfd *fds, nfds_t nfds, int timeout) {
  if (t_inside || !any_gs(fds, nfds)) return real().poll(fds, nfds, timeout);
  timespec ts{timeout / 1000, (timeout % 1000) * 1000000L};
  return emulated_poll(fds, nfds, timeout < 0 ? nullptr : &ts, nullptr);
}

GS_EXPORT int ppoll(pollfd *fds, nfds_t nfds, const timespec *timeout, const sigset_t *sigmask) {
  if (t_inside || !any_gs(fds, nfds)) return real().ppoll(fds, nfds, timeout, sigmask);
  return emulated_poll(fds, nfds, timeout, sigmask);
}

extern "C" void __chk_fail(void) __attribute__((noreturn));

GS_EXPORT int __poll_chk(pollfd *fds, nfds_t nfds, int timeout, size_t fdslen) {
  if (fdslen / sizeof(*fds) < nfds) __chk_fail();
  return poll(fds, nfds, timeout);
}

GS_EXPORT int __ppoll_chk(pollfd *fds, nfds_t nfds, const timespec *timeout, const sigset_t *sigmask, size_t fdslen) {
  if (fdslen / sizeof(*fds) < nfds) __chk_fail();
  return ppoll(fds, nfds, timeout, sigmask);
}

// ================================================================== select

namespace {

bool sets_have_gs(int nfds, fd_set *r, fd_set *w, fd_set *e) {
  for (int fd = 0; fd < nfds && fd < FD_SETSIZE; ++fd)
    if (((r && FD_ISSET(fd, r)) || (w && FD_ISSET(fd, w)) || (e && FD_ISSET(fd, e))) && is_gs(fd)) return true;
  return false;
}

int select_emulated(int nfds, fd_set *r, fd_set *w, fd_set *e, const timespec *timeout, const sigset_t *sigmask) {
  if (nfds > FD_SETSIZE) nfds = FD_SETSIZE;
  std::vector<pollfd> p;
  for (int fd = 0; fd < nfds; ++fd) {
    short ev = 0;
    if (r && FD_ISSET(fd, r)) ev |= POLLIN;
    if (w && FD_ISSET(fd, w)) ev |= POLLOUT;
    if (e && FD_ISSET(fd, e)) ev |= POLLPRI;
    if (ev) p.push_back({fd, ev, 0});
  }
  const int n = emulated_poll(p.data(), p.size(), timeout, sigmask);
  if (n < 0) return -1;
  for (const auto &q : p)
    if (q.revents & POLLNVAL) {
      errno = EBADF;
      return -1;
    }
  if (r) FD_ZERO(r);
  if (w) FD_ZERO(w);
  if (e) FD_ZERO(e);
  int count = 0;
  for (const auto &q : p) {
    if (r && (q.events & POLLIN) && (q.revents & (POLLIN | POLLHUP | POLLERR))) {
      FD_SET(q.fd, r);
      ++count;
    }
    if (w && (q.events & POLLOUT) && (q.revents & (POLLOUT | POLLERR))) {
      FD_SET(q.fd, w);
      ++count;
    }
    if (e && (q.events & POLLPRI) && (q.revents & POLLPRI)) {
      FD_SET(q.fd, e);
      ++count;
    }
  }
  return count;
}

}  // namespace

GS_EXPORT int select(int nfds, fd_set *r, fd_set *w, fd_set *e, timeval *tv) {
  if (t_inside || !sets_have_gs(nfds, r, w, e)) return real().select(nfds, r, w, e, tv);
  if (tv && (tv->tv_sec < 0 || tv->tv_usec < 0)) {
    errno = EINVAL;
    return -1;
  }
  const auto start = std::chrono::steady_clock::now();
  timespec ts{};
  if (tv) ts = {tv->tv_sec, tv->tv_usec * 1000};
  const int n = select_emulated(nfds, r, w, e, tv ? &ts : nullptr, nullptr);
  if (tv) {  // Linux reports the time left
    const auto used = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start);
    long long left = static_cast<long long>(tv->tv_sec) * 1000000 + tv->tv_usec - used.count();
    if (left < 0) left = 0;
    tv->tv_sec = static_cast<time_t>(left / 1000000);
    tv->tv_usec = static_cast<suseconds_t>(left % 1000000);
  }
  return n;
}

GS_EXPORT int pselect(int nfds, fd_set *r, fd_set *w, fd_set *e, const timespec *timeout, const sigset_t *sigmask) {
  if (t_inside || !sets_have_gs(nfds, r, w, e)) return real().pselect(nfds, r, w, e, timeout, sigmask);
  return select_emulated(nfds, r, w, e, timeout, sigmask);
}

// ================================================================== epoll

namespace gpusock::preload {

namespace {

struct Entry {
  int fd;
  uint32_t events;
  epoll_data_t data;
  bool gs;             // false: a pending socket the kernel watches (kept to move it on upgrade)
  bool disarmed = false;  // EPOLLONESHOT fired
  uint32_t reported = 0;  // edge-triggered: bits reported and not seen clear since
  uint32_t rgen = 0, wgen = 0;
};

struct EpollSet {
  std::mutex mu;
  std::vector<Entry> entries;
  std::vector<int> numbers;  // fds that refer to this instance
  std::atomic<int> gs_count{0};
  size_t next = 0;  // round-robin start among gpusock entries
};

std::mutex &epoll_mu() {
  static auto *m = new std::mutex();
  return *m;
}
std::unordered_map<int, std::shared_ptr<EpollSet>> &sets() {
  static auto *m = new std::unordered_map<int, std::shared_ptr<EpollSet>>();
  return *m;
}

}  // namespace

std::mutex &epoll_table_mutex() { return epoll_mu(); }

namespace {

std::shared_ptr<EpollSet> find_set(int epfd) {
  std::lock_guard lock(epoll_mu());
  auto it = sets().find(epfd);
  return it == sets().end() ? nullptr : it->second;
}

std::shared_ptr<EpollSet> find_or_make_set(int epfd) {
  std::lock_guard lock(epoll_mu());
  auto &s = sets()[epfd];
  if (!s) {
    s = std::make_shared<EpollSet>();
    s->numbers.push_back(epfd);
    set_kind(epfd, kEpoll);
  }
  return s;
}

std::vector<std::shared_ptr<EpollSet>> all_sets() {
  std::lock_guard lock(epoll_mu());
  std::vector<std::shared_ptr<EpollSet>> v;
  for (auto &[fd, s] : sets())
    if (std::find(v.begin(), v.end(), s) == v.end()) v.push_back(s);
  return v;
}

constexpr uint32_t kInBits = EPOLLIN | EPOLLRDNORM | EPOLLRDBAND | EPOLLPRI | EPOLLRDHUP;
constexpr uint32_t kOutBits = EPOLLOUT | EPOLLWRNORM | EPOLLWRBAND;

// Ready gpusock members into out[0..max). Caller holds set.mu.
int collect_gs(EpollSet &set, epoll_event *out, int max) {
  static thread_local std::vector<pollfd> p;
  static thread_local std::vector<size_t> idx;
  p.clear();
  idx.clear();
  for (size_t i = 0; i < set.entries.size(); ++i) {
    const Entry &e = set.entries[i];
    if (!e.gs || e.disarmed) continue;
    if (e.events & EPOLLIN) touch_read(e.fd);
    p.push_back({e.fd, static_cast<short>(e.events & 0x3fff), 0});
    idx.push_back(i);
  }
  if (p.empty()) return 0;
  {
    Inside guard;
    gs_poll(p.data(), p.size(), 0);
  }
  int n = 0;
  const size_t count = p.size();
  const size_t start = set.next % count;
  for (size_t j = 0; j < count && n < max; ++j) {
    const size_t k = (start + j) % count;
    Entry &e = set.entries[idx[k]];
    uint32_t ready = static_cast<uint16_t>(p[k].revents) & (e.events | EPOLLERR | EPOLLHUP);
    if (e.events & EPOLLET) {
      FdSlot *s = slot(e.fd);
      const uint32_t rg = s ? s->rgen.load(std::memory_order_relaxed) : 0;
      const uint32_t wg = s ? s->wgen.load(std::memory_order_relaxed) : 0;
      if (rg != e.rgen) e.reported &= ~kInBits;  // the application read since: new data is a new edge
      if (wg != e.wgen) e.reported &= ~kOutBits;
      e.rgen = rg;
      e.wgen = wg;
      e.reported &= ready;  // bits seen clear re-arm
      if (!(ready & ~e.reported)) continue;
      e.reported |= ready;
    } else if (!ready) {
      continue;
    }
    out[n].events = ready;
    out[n].data = e.data;
    ++n;
    if (e.events & EPOLLONESHOT) e.disarmed = true;
  }
  set.next = start + 1;
  return n;
}

int epoll_wait_impl(int epfd, epoll_event *events, int maxevents, const timespec *timeout, const sigset_t *sigmask) {
  const Real &R = real();
  if (maxevents <= 0 || !events) {
    errno = EINVAL;
    return -1;
  }
  auto set = find_set(epfd);
  if (!set || set->gs_count.load() == 0) {
    if (!timeout) return R.epoll_pwait(epfd, events, maxevents, -1, sigmask);
    if (timeout->tv_nsec % 1000000 != 0 && R.epoll_pwait2) {
      const int r = R.epoll_pwait2(epfd, events, maxevents, timeout, sigmask);
      if (r >= 0 || errno != ENOSYS) return r;
    }
    const long ms = static_cast<long>(timeout->tv_sec) * 1000 + (timeout->tv_nsec + 999999) / 1000000;
    return R.epoll_pwait(epfd, events, maxevents, static_cast<int>(std::min<long>(ms, INT32_MAX)), sigmask);
  }
  auto check = [&]() -> int {
    int n;
    {
      std::lock_guard lock(set->mu);
      n = collect_gs(*set, events, maxevents);
    }
    if (n < maxevents) {
      const int k = R.epoll_wait(epfd, events + n, maxevents - n, 0);
      if (k < 0) return n > 0 ? n : -1;
      n += k;
    }
    return n;
  };
  auto sleep = [&](const timespec *ts) -> int {
    pollfd p{epfd, POLLIN, 0};
    return R.ppoll(&p, 1, ts, sigmask) < 0 ? -1 : 0;
  };
  return wait_loop(timeout, check, sleep);
}

}  // namespace

void epoll_forget_fd(int fd) {
  for (auto &set : all_sets()) {
    std::lock_guard lock(set->mu);
    auto &v = set->entries;
    for (size_t i = 0; i < v.size();) {
      if (v[i].fd == fd) {
        if (v[i].gs) set->gs_count.fetch_sub(1);
        v.erase(v.begin() + static_cast<long>(i));
      } else {
        ++i;
      }
    }
  }
}

void epoll_upgrade_fd(int fd) {
  for (auto &set : all_sets()) {
    std::lock_guard lock(set->mu);
    for (auto &e : set->entries)
      if (e.fd == fd && !e.gs) {
        e.gs = true;  // the kernel dropped its registration with the old socket
        set->gs_count.fetch_add(1);
      }
  }
}

void epoll_forget_epfd(int epfd) {
  std::lock_guard lock(epoll_mu());
  auto it = sets().find(epfd);
  if (it == sets().end()) return;
  auto &nums = it->second->numbers;
  nums.erase(std::remove(nums.begin(), nums.end(), epfd), nums.end());
  sets().erase(it);
}

void epoll_dup_epfd(int oldfd, int newfd) {
  std::lock_guard lock(epoll_mu());
  auto it = sets().find(oldfd);
  if (it == sets().end()) return;
  auto set = it->second;
  set->numbers.push_back(newfd);
  sets()[newfd] = set;
  set_kind(newfd, kEpoll);
}

bool epoll_is_emulated(int epfd) { return find_set(epfd) != nullptr; }

// In a forked child the gpusock members are kernel sockets now (fork relays):
// hand them to the real epoll instance.
void epoll_after_fork_child() {
  const Real &R = real();
  for (auto &[epfd, set] : sets()) {
    if (set->numbers.empty() || set->numbers.front() != epfd) continue;
    for (auto &e : set->entries) {
      if (!e.gs) continue;
      epoll_event ev{};
      ev.events = e.disarmed ? (e.events & (EPOLLET | EPOLLONESHOT)) : e.events;
      ev.data = e.data;
      R.epoll_ctl(epfd, EPOLL_CTL_ADD, e.fd, &ev);
    }
    set->entries.erase(std::remove_if(set->entries.begin(), set->entries.end(), [](const Entry &e) { return e.gs; }),
                       set->entries.end());
    set->gs_count = 0;
  }
  // Reset the locks other threads may have held at fork time.
  for (auto &[epfd, set] : sets()) new (&set->mu) std::mutex();
}

}  // namespace gpusock::preload

// epoll_create/epoll_create1 (shim.cc) keep no state: an epoll instance gets
// its side table when its first gpusock (or pending) member is added, so calls
// from the transport's own threads never take the shim's locks.

GS_EXPORT int epoll_ctl(int epfd, int op, int fd, epoll_event *ev) {
  const Real &R = real();
  if (t_inside) return R.epoll_ctl(epfd, op, fd, ev);
  const uint8_t k = kind_of(fd);
  if (k != kGs && k != kPending) return R.epoll_ctl(epfd, op, fd, ev);
  if (R.fcntl(epfd, F_GETFD) < 0) return -1;  // EBADF
  if (epfd == fd) {
    errno = EINVAL;
    return -1;
  }
  if (op != EPOLL_CTL_DEL && !ev) {
    errno = EFAULT;
    return -1;
  }
  if (op != EPOLL_CTL_ADD && op != EPOLL_CTL_MOD && op != EPOLL_CTL_DEL) {
    errno = EINVAL;
    return -1;
  }
  auto set = find_or_make_set(epfd);
  if (k == kPending) {  // the kernel watches it; remember it for the upgrade
    const int r = R.epoll_ctl(epfd, op, fd, ev);
    if (r < 0) return r;
    std::lock_guard lock(set->mu);
    auto it = std::find_if(set->entries.begin(), set->entries.end(), [&](const Entry &e) { return e.fd == fd; });
    if (op == EPOLL_CTL_DEL) {
      if (it != set->entries.end()) set->entries.erase(it);
    } else if (it == set->entries.end()) {
      set->entries.push_back({fd, ev->events, ev->data, false});
    } else {
      it->events = ev->events;
      it->data = ev->data;
    }
    return 0;
  }
  std::lock_guard lock(set->mu);
  auto it = std::find_if(set->entries.begin(), set->entries.end(), [&](const Entry &e) { return e.fd == fd; });
  switch (op) {
    case EPOLL_CTL_ADD:
      if (it != set->entries.end()) {
        errno = EEXIST;
        return -1;
      }
      set->entries.push_back({fd, ev->events, ev->data, true});
      set->gs_count.fetch_add(1);
      return 0;
    case EPOLL_CTL_MOD:
      if (it == set->entries.end()) {
        errno = ENOENT;
        return -1;
      }
      if (ev->events & EPOLLEXCLUSIVE) {
        errno = EINVAL;
        return -1;
      }
      it->events = ev->events;
      it->data = ev->data;
      it->disarmed = false;
      it->reported = 0;
      return 0;
    default:
      if (it == set->entries.end()) {
        errno = ENOENT;
        return -1;
      }
      if (it->gs) set->gs_count.fetch_sub(1);
      set->entries.erase(it);
      return 0;
  }
}

GS_EXPORT int epoll_wait(int epfd, epoll_event *events, int maxevents, int timeout) {
  if (t_inside) return real().epoll_wait(epfd, events, maxevents, timeout);
  if (kind_of(epfd) != kEpoll) return real().epoll_wait(epfd, events, maxevents, timeout);
  timespec ts{timeout / 1000, (timeout % 1000) * 1000000L};
  return epoll_wait_impl(epfd, events, maxevents, timeout < 0 ? nullptr : &ts, nullptr);
}

GS_EXPORT int epoll_pwait(int epfd, epoll_event *events, int maxevents, int timeout, const sigset_t *sigmask) {
  if (t_inside || kind_of(epfd) != kEpoll) return real().epoll_pwait(epfd, events, maxevents, timeout, sigmask);
  timespec ts{timeout / 1000, (timeout % 1000) * 1000000L};
  return epoll_wait_impl(epfd, events, maxevents, timeout < 0 ? nullptr : &ts, sigmask);
}

GS_EXPORT int epoll_pwait2(int epfd, epoll_event *events, int maxevents, const timespec *timeout,
                           const sigset_t *sigmask) {
  const Real &R = real();
  if (t_inside || kind_of(epfd) != kEpoll) {
    if (!R.epoll_pwait2) {
      errno = ENOSYS;
      return -1;
    }
    return R.epoll_pwait2(epfd, events, maxevents, timeout, sigmask);
  }
  return epoll_wait_impl(epfd, events, maxevents, timeout, sigmask);
}
