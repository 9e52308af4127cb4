// Top layer: poll, ppoll, select, pselect and epoll over a mix of kernel fds
// and gpusock sockets (wait.h says how a wait is emulated). Waits that involve
// no gpusock socket go straight to libc.
//
// epoll: the real epoll fd keeps every kernel member; the gpusock members live
// in a side table per epoll instance (epoll_table.h) with their events, data
// and edge/one-shot state; epoll_wait reports them from there.
#include "preload/epoll_table.h"
#include "preload/library.h"
#include "preload/listeners.h"
#include "preload/wait.h"

#include <fcntl.h>

#include <algorithm>
#include <chrono>
#include <vector>

using namespace gpusock::preload;

namespace {

// Is any fd a gpusock socket, or a dormant listener (listeners.h)?
bool any_ours(const pollfd *fds, nfds_t nfds) {
  for (nfds_t i = 0; i < nfds; ++i) {
    const uint8_t k = fds[i].fd >= 0 ? kind_of(fds[i].fd) : static_cast<uint8_t>(kKernel);
    if (k == kGs || k == kDormant) return true;
  }
  return false;
}

bool any_gs(const pollfd *fds, nfds_t nfds) {
  for (nfds_t i = 0; i < nfds; ++i)
    if (fds[i].fd >= 0 && is_gs(fds[i].fd)) return true;
  return false;
}

// One wait over fds: emulated when gpusock sockets are among them.
int poll_once(pollfd *fds, nfds_t nfds, const timespec *timeout, const sigset_t *sigmask) {
  if (any_gs(fds, nfds)) return emulated_poll(fds, nfds, timeout, sigmask);
  return real().ppoll(fds, nfds, timeout, sigmask);
}

// poll over a mix with dormant listeners: they are activated first; those
// whose port another process holds report nothing, and the wait is cut into
// pieces of kRetryMs to try them again.
int poll_mixed(pollfd *fds, nfds_t nfds, const timespec *timeout, const sigset_t *sigmask) {
  if (activate_dormant(fds, nfds) == 0) return poll_once(fds, nfds, timeout, sigmask);
  auto once = [&](const timespec *piece) {
    std::vector<std::pair<nfds_t, int>> hidden;
    for (nfds_t i = 0; i < nfds; ++i)
      if (fds[i].fd >= 0 && kind_of(fds[i].fd) == kDormant) {
        hidden.push_back({i, fds[i].fd});
        fds[i].fd = -1;  // ignored: revents 0
      }
    const int r = poll_once(fds, nfds, piece, sigmask);
    for (auto &[i, fd] : hidden) fds[i].fd = fd;
    return r;
  };
  return wait_in_pieces(timeout, kRetryMs, once, [&] { return activate_dormant(fds, nfds); });
}

}  // namespace

// ================================================================== poll

GS_EXPORT int poll(pollfd *fds, nfds_t nfds, int timeout) {
  if (t_inside || !any_ours(fds, nfds)) return real().poll(fds, nfds, timeout);
  timespec ts{timeout / 1000, (timeout % 1000) * 1000000L};
  return poll_mixed(fds, nfds, timeout < 0 ? nullptr : &ts, nullptr);
}

GS_EXPORT int ppoll(pollfd *fds, nfds_t nfds, const timespec *timeout, const sigset_t *sigmask) {
  if (t_inside || !any_ours(fds, nfds)) return real().ppoll(fds, nfds, timeout, sigmask);
  return poll_mixed(fds, nfds, timeout, sigmask);
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
    if (((r && FD_ISSET(fd, r)) || (w && FD_ISSET(fd, w)) || (e && FD_ISSET(fd, e))) &&
        (is_gs(fd) || kind_of(fd) == kDormant))
      return true;
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
  const int n = poll_mixed(p.data(), p.size(), timeout, sigmask);
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

namespace {

constexpr uint32_t kInBits = EPOLLIN | EPOLLRDNORM | EPOLLRDBAND | EPOLLPRI | EPOLLRDHUP;
constexpr uint32_t kOutBits = EPOLLOUT | EPOLLWRNORM | EPOLLWRBAND;

// Ready gpusock members into out[0..max): the library's readiness set says
// which to look at (ready_set.h), so a pass costs what the members with
// news cost. Caller holds set.mu.
int collect_gs(EpollSet &set, epoll_event *out, int max) {
  if (set.ready == nullptr) return 0;
  static thread_local std::vector<pollfd> p;
  if (p.size() < static_cast<size_t>(max)) p.resize(static_cast<size_t>(max));
  int all = 0;
  int k;
  {
    Inside guard;
    k = gs().ready_set_poll(set.ready, p.data(), max, &all);
  }
  if (all)  // the application waits on these (relay.cc, listeners.cc watch that)
    for (const EpollEntry &e : set.entries)
      if (e.gs && !e.disarmed && (e.events & EPOLLIN)) touch_read(e.fd);
  int n = 0;
  for (int j = 0; j < k && n < max; ++j) {
    EpollEntry *found = find_entry(set, p[j].fd);
    if (found == nullptr || !found->gs || found->disarmed) continue;
    EpollEntry &e = *found;
    if (e.events & EPOLLIN) touch_read(e.fd);
    const uint32_t ready = static_cast<uint16_t>(p[j].revents) & (e.events | EPOLLERR | EPOLLHUP);
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
    if (e.events & EPOLLONESHOT) {
      e.disarmed = true;
      update_ready_member(set, e);
    }
  }
  return n;
}

// A dormant listener whose port another process holds: a member nobody
// watches (not even the kernel) until it is activated (listeners.h).
int dormant_ctl(EpollSet &set, int op, int fd, epoll_event *ev) {
  std::lock_guard lock(set.mu);
  EpollEntry *it = find_entry(set, fd);
  if (op == EPOLL_CTL_ADD) {
    if (it != nullptr) {
      errno = EEXIST;
      return -1;
    }
    EpollEntry e{fd, ev->events, ev->data, false};
    e.dormant = true;
    add_entry(set, e);
    return 0;
  }
  if (it == nullptr) {
    errno = ENOENT;
    return -1;
  }
  if (op == EPOLL_CTL_MOD) {
    it->events = ev->events;
    it->data = ev->data;
    return 0;
  }
  remove_entry(set, fd);
  return 0;
}

// The set's dormant listeners, activated if they can be; how many remain.
int activate_members(EpollSet &set) {
  std::vector<pollfd> dormant;
  {
    std::lock_guard lock(set.mu);
    for (const EpollEntry &e : set.entries)
      if (e.dormant) dormant.push_back({e.fd, 0, 0});
  }
  return activate_dormant(dormant.data(), dormant.size());
}

// The kernel's epoll wait with a timespec timeout (nullptr: forever).
int real_epoll_wait(int epfd, epoll_event *events, int maxevents, const timespec *timeout, const sigset_t *sigmask) {
  const Real &R = real();
  if (!timeout) return R.epoll_pwait(epfd, events, maxevents, -1, sigmask);
  if (timeout->tv_nsec % 1000000 != 0 && R.epoll_pwait2) {
    const int r = R.epoll_pwait2(epfd, events, maxevents, timeout, sigmask);
    if (r >= 0 || errno != ENOSYS) return r;
  }
  const long ms = static_cast<long>(timeout->tv_sec) * 1000 + (timeout->tv_nsec + 999999) / 1000000;
  return R.epoll_pwait(epfd, events, maxevents, static_cast<int>(std::min<long>(ms, INT32_MAX)), sigmask);
}

// How often a wait that has gpusock events to return, or spins, asks the
// kernel about the kernel members: a look is a system call, and a spin or a
// busy event loop asked at every step (memcached's workers: the largest share of their
// system calls). A wait's first look, and its look after each sleep, ask
// always when no gpusock member is ready, so a non-blocking wait misses
// nothing the kernel holds and a sleep that the real epoll fd (polled beside
// the sockets' wait fds) ended finds what ended it.
constexpr int64_t kKernelLookEveryNs = 50000;

bool kernel_look_due(EpollSet &set, bool must) {
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  if (!must && now - set.kernel_look_ns.load(std::memory_order_relaxed) < kKernelLookEveryNs) return false;
  set.kernel_look_ns.store(now, std::memory_order_relaxed);
  return true;
}

// An epoll wait with gpusock members: kernel members through the real epoll
// fd, gpusock ones from the side table.
int emulated_epoll_wait(int epfd, EpollSet *set, epoll_event *events, int maxevents, const timespec *timeout,
                        const sigset_t *sigmask) {
  const Real &R = real();
  bool first = true;
  auto check = [&]() -> int {
    int n;
    {
      std::lock_guard lock(set->mu);
      n = collect_gs(*set, events, maxevents);
    }
    if (n < maxevents && kernel_look_due(*set, first && n == 0)) {
      const int k = R.epoll_wait(epfd, events + n, maxevents - n, 0);
      if (k < 0) return n > 0 ? n : -1;
      n += k;
    }
    first = false;
    return n;
  };
  auto sleep = [&](const timespec *until, const timespec *step) -> int {
    gs_ready_set_t *ready;
    {
      std::lock_guard lock(set->mu);
      ready = set->ready;
    }
    // The look after a sleep asks the kernel: the real epoll fd may be what
    // ended it, and skipping the look would sleep again at once.
    first = true;
    return sleep_on_set(ready, static_cast<size_t>(set->gs_count.load()), {pollfd{epfd, POLLIN, 0}}, until, step,
                        sigmask);
  };
  return wait_loop(timeout, check, sleep);
}

int epoll_wait_impl(int epfd, epoll_event *events, int maxevents, const timespec *timeout, const sigset_t *sigmask) {
  if (maxevents <= 0 || !events) {
    errno = EINVAL;
    return -1;
  }
  auto set = find_epoll_set(epfd);
  auto once = [&](const timespec *t) {
    if (!set || set->gs_count.load() == 0) return real_epoll_wait(epfd, events, maxevents, t, sigmask);
    return emulated_epoll_wait(epfd, set.get(), events, maxevents, t, sigmask);
  };
  // Dormant listeners whose port another process holds: tried again between pieces.
  if (set && set->dormant_count.load() > 0 && activate_members(*set) > 0)
    return wait_in_pieces(timeout, kRetryMs, once, [&] { return activate_members(*set); });
  return once(timeout);
}

}  // namespace

// epoll_create/epoll_create1 (fd_calls.cc) keep no state: an epoll instance gets
// its side table when its first gpusock (or pending) member is added, so calls
// from the transport's own threads never take the shim's locks.

GS_EXPORT int epoll_ctl(int epfd, int op, int fd, epoll_event *ev) {
  const Real &R = real();
  if (t_inside) return R.epoll_ctl(epfd, op, fd, ev);
  uint8_t k = kind_of(fd);
  if (k == kDormant && op != EPOLL_CTL_DEL && activate(fd) == 1) k = kGs;  // waited on: it is used
  if (k != kGs && k != kPending && k != kDormant) return R.epoll_ctl(epfd, op, fd, ev);
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
  auto set = find_or_make_epoll_set(epfd);
  if (k == kDormant) return dormant_ctl(*set, op, fd, ev);
  if (k == kPending) {  // the kernel watches it; remember it for the upgrade
    const int r = R.epoll_ctl(epfd, op, fd, ev);
    if (r < 0) return r;
    std::lock_guard lock(set->mu);
    EpollEntry *it = find_entry(*set, fd);
    if (op == EPOLL_CTL_DEL) {
      remove_entry(*set, fd);
    } else if (it == nullptr) {
      add_entry(*set, {fd, ev->events, ev->data, false});
    } else {
      it->events = ev->events;
      it->data = ev->data;
    }
    return 0;
  }
  std::lock_guard lock(set->mu);
  EpollEntry *it = find_entry(*set, fd);
  switch (op) {
    case EPOLL_CTL_ADD:
      if (it != nullptr) {
        errno = EEXIST;
        return -1;
      }
      add_entry(*set, {fd, ev->events, ev->data, true});
      return 0;
    case EPOLL_CTL_MOD:
      if (it == nullptr) {
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
      update_ready_member(*set, *it);
      return 0;
    default:
      if (it == nullptr) {
        errno = ENOENT;
        return -1;
      }
      remove_entry(*set, fd);
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
