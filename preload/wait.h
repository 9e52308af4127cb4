// Waiting on a mix of kernel fds and gpusock sockets.
//
// Waits that involve gpusock sockets are emulated: ask the library for the
// sockets' readiness (gs_poll with a zero timeout) and the kernel for the other
// fds (timeout 0), spin for the library's adaptive budget (gs_spin_budget_us),
// then sleep in ppoll() on the kernel fds (or the real epoll fd) together with
// the fds gs_wait_begin gives for the sockets (their transports' wait fds and
// this thread's waker): any event ends the sleep at once, and a signal
// interrupts it with EINTR, as the kernel's own waits do. An idle wait costs
// no CPU. (A transport without wait fds falls back to sleeps of 10 us
// doubling to 1 ms.)
//
// Blocking calls on gpusock sockets are made of non-blocking attempts and these
// waits, never of the library's internal blocking wait: between two sleeps the
// shim sees every signal handler that ran on this thread, so a signal can never
// be lost in a spin, and SA_RESTART, SO_RCVTIMEO and SO_SNDTIMEO behave as on
// a kernel socket.
#pragma once

#include "preload/config.h"
#include "preload/fd_table.h"
#include "preload/library.h"
#include "preload/signals.h"

#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace gpusock::preload {

using Clock = std::chrono::steady_clock;

constexpr long kMaxSleepUs = 1000;

inline timespec to_timespec(Clock::duration d) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  if (ns <= 0) return {0, 0};
  return {static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
}

// Shared waiting strategy. check() collects readiness (returns count or -1);
// sleep(until, step) blocks for at most `until` (nullptr: no limit), or at
// most `step` when the sockets offer no wait fd (returns -1 with errno on
// failure, EINTR included).
template <class Check, class Sleep>
int wait_loop(const timespec *timeout, Check check, Sleep sleep) {
  const auto start = Clock::now();
  const bool forever = timeout == nullptr;
  const auto deadline =
      forever ? Clock::time_point::max()
              : start + std::chrono::seconds(timeout->tv_sec) + std::chrono::nanoseconds(timeout->tv_nsec);
  auto spin_until = start + std::chrono::microseconds(gs().spin_budget_us());
  const unsigned signals_before = t_signals;
  long backoff_us = 10;
  // Every way out tells the library how long the wait took (its spin slot
  // goes back, and the next spin adapts).
  const auto done = [&](int result) {
    gs().spin_record(
        static_cast<long>(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count()));
    return result;
  };
  for (;;) {
    const int n = check();
    if (n != 0) return done(n);
    if (!forever && timeout->tv_sec == 0 && timeout->tv_nsec == 0) return done(0);
    const auto now = Clock::now();
    if (now >= deadline) return done(0);
    if (t_signals != signals_before) {  // a handler ran while we spun
      errno = EINTR;
      return done(-1);
    }
    if (now < spin_until) {
      if (gs().spin_yield()) spin_until = now;  // another thread wants this core: sleep
      continue;
    }
    auto step = std::chrono::microseconds(backoff_us);
    if (deadline - now < step)
      step = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now) + std::chrono::microseconds(1);
    const timespec step_ts = to_timespec(step);
    const timespec until_ts = to_timespec(deadline - now + std::chrono::microseconds(1));
    static thread_local bool slack_set = false;
    if (!slack_set) {
      // The default 50 us timer slack would turn the first 10 us naps into
      // 60 us ones, a latency floor for every wake-up from a sleep.
      prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
      slack_set = true;
    }
    if (sleep(forever ? nullptr : &until_ts, &step_ts) < 0) return done(-1);
    backoff_us = std::min(backoff_us * 2, kMaxSleepUs);
  }
}

// A wait cut into pieces of at most piece_ms while retry() says something is
// to be tried again between them (it returns how many such things remain; at
// 0 the rest is waited at once). once(piece) waits one piece; a result other
// than 0 ends the wait. timeout nullptr: forever.
template <class Once, class Retry>
int wait_in_pieces(const timespec *timeout, long piece_ms, Once once, Retry retry) {
  const auto deadline =
      timeout ? Clock::now() + std::chrono::seconds(timeout->tv_sec) + std::chrono::nanoseconds(timeout->tv_nsec)
              : Clock::time_point::max();
  for (bool pieces = true;;) {
    const auto left = deadline - Clock::now();
    timespec piece = to_timespec(left);
    if (pieces && (!timeout || left > std::chrono::milliseconds(piece_ms))) piece = {0, piece_ms * 1000000};
    const int r = once(pieces || timeout ? &piece : nullptr);
    if (r != 0 || (timeout && Clock::now() >= deadline)) return r;
    if (!pieces) return 0;
    pieces = retry() != 0;
  }
}

// One sleep of wait_loop: until an event on the kernel fds `kern`, on the
// gpusock sockets `gs_fds` (through gs_wait_begin), a signal, or `until`; at most
// `step` when the sockets' transports have no wait fd. 0, or -1 with errno.
int sleep_on_events(const std::vector<pollfd> &gs_fds, const std::vector<pollfd> &kern, const timespec *until,
                    const timespec *step, const sigset_t *sigmask);

// The same for an epoll set's gpusock members, through their readiness set
// (members: how many; a set of idle members sleeps without a look at each).
int sleep_on_set(gs_ready_set_t *set, size_t members, const std::vector<pollfd> &kern, const timespec *until,
                 const timespec *step, const sigset_t *sigmask);

// Emulated multiplexing: poll over a mix of gpusock and kernel fds with a
// timespec timeout (nullptr: forever) and an optional signal mask for the
// sleeps. Returns the count, 0 on timeout, or -1 with errno.
int emulated_poll(pollfd *fds, nfds_t nfds, const timespec *timeout, const sigset_t *sigmask);

// ------------------------------------------------------------------ blocking calls

bool gs_nonblocking(int fd);

// When a blocking call on fd gives up: its SO_RCVTIMEO (a receive or accept)
// or SO_SNDTIMEO (a send or connect), never when none is set.
struct CallLimit {
  Clock::time_point deadline;
  bool has_timeout;
};
CallLimit call_limit(int fd, bool receive);

// Waits for `events` on a blocking gpusock call: 1 ready, 0 a restarted
// signal (wait again), < 0 the call's result. A handler that ran turns into
// -EINTR unless it has SA_RESTART and no timeout is set (signal(7)).
int blocking_wait(int fd, short events, const CallLimit &limit);

}  // namespace gpusock::preload
