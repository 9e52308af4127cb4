// Emulated waits over kernel fds and gpusock sockets, and the waits of
// blocking gpusock calls (wait.h).
#include "preload/library.h"
#include "preload/wait.h"

#include <fcntl.h>

#include <vector>

namespace gpusock::preload {

int emulated_poll(pollfd *fds, nfds_t nfds, const timespec *timeout, const sigset_t *sigmask) {
  const Real &R = real();
  std::vector<pollfd> gs_fds, kern;
  std::vector<nfds_t> gs_index, kern_index;
  for (nfds_t i = 0; i < nfds; ++i) {
    fds[i].revents = 0;
    if (fds[i].fd < 0) continue;
    if (is_gs(fds[i].fd)) {
      if (fds[i].events & POLLIN) touch_read(fds[i].fd);
      waiter_enter(fds[i].fd);
      gs_fds.push_back(fds[i]);
      gs_index.push_back(i);
    } else {
      kern.push_back(fds[i]);
      kern_index.push_back(i);
    }
  }
  auto check = [&]() -> int {
    int ready = 0;
    if (!gs_fds.empty()) {
      Inside guard;
      gs().poll(gs_fds.data(), gs_fds.size(), 0);
      for (size_t k = 0; k < gs_fds.size(); ++k) {
        // Closed by another thread while we waited (its number may be another
        // file's already): what poll says of a closed fd.
        if (!is_gs(gs_fds[k].fd)) gs_fds[k].revents = POLLNVAL;
        if ((fds[gs_index[k]].revents = gs_fds[k].revents)) ++ready;
      }
    }
    if (!kern.empty()) {
      const int n = R.poll(kern.data(), kern.size(), 0);
      if (n < 0) return -1;
      for (size_t k = 0; k < kern.size(); ++k)
        if ((fds[kern_index[k]].revents = kern[k].revents)) ++ready;
    }
    return ready;
  };
  auto sleep = [&](const timespec *until, const timespec *step) -> int {
    return sleep_on_events(gs_fds, kern, until, step, sigmask);
  };
  const int n = wait_loop(timeout, check, sleep);
  const int saved = errno;
  for (const pollfd &p : gs_fds) waiter_leave(p.fd);
  errno = saved;
  return n;
}

namespace {

// One sleep of sleep_on_events, the gpusock side given by begin(wait, max)
// and end(slept, n) (gs_wait_begin/end over a list, or over a readiness
// set; `slept`: the wait fds as ppoll left them).
template <class Begin, class End>
int sleep_on(Begin begin, End end, size_t gs_count, const std::vector<pollfd> &kern, const timespec *until,
             const timespec *step, const sigset_t *sigmask) {
  const Real &R = real();
  static thread_local std::vector<pollfd> fds;
  int n = 0;
  if (gs_count > 0) {
    fds.assign(gs_count + 8, pollfd{});
    Inside guard;
    while ((n = begin(fds.data(), fds.size())) == -ENOSPC) fds.resize(fds.size() * 2);
    if (n == -EAGAIN) return 0;  // a socket got ready meanwhile: look again
    if (n < 0) {
      errno = -n;
      return -1;
    }
  }
  fds.resize(static_cast<size_t>(n));
  fds.insert(fds.end(), kern.begin(), kern.end());
  // No wait fd from a socket's transport: sleep a step, not the whole timeout.
  const timespec *ts = (n == 0 && gs_count > 0) ? step : until;
  if (n == 0 && gs_count > 0 && until &&
      (until->tv_sec < step->tv_sec || (until->tv_sec == step->tv_sec && until->tv_nsec < step->tv_nsec)))
    ts = until;
  const int r = R.ppoll(fds.data(), fds.size(), ts, sigmask);
  const int saved = errno;
  if (gs_count > 0) {
    Inside guard;
    end(fds.data(), static_cast<size_t>(n));
  }
  errno = saved;
  return r < 0 ? -1 : 0;
}

}  // namespace

int sleep_on_set(gs_ready_set_t *set, size_t members, const std::vector<pollfd> &kern, const timespec *until,
                 const timespec *step, const sigset_t *sigmask) {
  return sleep_on([&](pollfd *wait, size_t max) { return gs().ready_set_wait_begin(set, wait, max); },
                  [&](const pollfd *slept, size_t n) { gs().ready_set_wait_end_polled(set, slept, n); },
                  set != nullptr ? members : 0, kern, until, step, sigmask);
}

int sleep_on_events(const std::vector<pollfd> &gs_fds, const std::vector<pollfd> &kern, const timespec *until,
                    const timespec *step, const sigset_t *sigmask) {
  auto begin = [&](pollfd *wait, size_t max) {
    const int n = gs().wait_begin(gs_fds.data(), gs_fds.size(), wait, max);
    if (n < 0) return n;
    // A socket closed by another thread before gs_wait_begin saw it was left
    // out of the sleep, and its close woke nobody: look again (POLLNVAL).
    // After this check a close still to come wakes us (the shim forgets the
    // fd before gpusock closes the socket).
    for (const pollfd &p : gs_fds)
      if (!is_gs(p.fd)) {
        gs().wait_end_polled(gs_fds.data(), gs_fds.size(), nullptr, 0);
        return -EAGAIN;
      }
    return n;
  };
  return sleep_on(
      begin, [&](const pollfd *slept, size_t n) { gs().wait_end_polled(gs_fds.data(), gs_fds.size(), slept, n); },
      gs_fds.size(), kern, until, step, sigmask);
}

// ------------------------------------------------------------------ blocking calls

namespace {

// Waits for events on a gpusock fd until deadline (max(): none). Returns 0
// when ready, -EAGAIN at the deadline, -EINTR when a signal handler ran.
int wait_gs(int fd, short events, Clock::time_point deadline) {
  pollfd p{fd, events, 0};
  if (deadline == Clock::time_point::max()) {
    const int n = emulated_poll(&p, 1, nullptr, nullptr);
    return n < 0 ? -errno : 0;
  }
  const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now()).count();
  if (left <= 0) return -EAGAIN;
  timespec ts{static_cast<time_t>(left / 1000000), static_cast<long>(left % 1000000) * 1000};
  const int n = emulated_poll(&p, 1, &ts, nullptr);
  if (n < 0) return -errno;
  return n == 0 ? -EAGAIN : 0;
}

}  // namespace

bool gs_nonblocking(int fd) {
  Inside guard;
  const int fl = gs().fcntl(fd, F_GETFL);
  return fl >= 0 && (fl & O_NONBLOCK);
}

CallLimit call_limit(int fd, bool receive) {
  auto info = sock_info(fd);
  const int64_t timeo = info ? (receive ? info->rcvtimeo_us : info->sndtimeo_us).load() : 0;
  return {timeo > 0 ? Clock::now() + std::chrono::microseconds(timeo) : Clock::time_point::max(), timeo > 0};
}

int blocking_wait(int fd, short events, const CallLimit &limit) {
  const unsigned before = t_signals;
  const int w = wait_gs(fd, events, limit.deadline);
  if (w == -EINTR && !limit.has_timeout && restart_after_eintr(before)) return 0;
  return w < 0 ? w : 1;
}

}  // namespace gpusock::preload
