// Event-driven waiting for CPU sockets: a thread that must block spins for a
// short, adaptive while, then sleeps in poll() on its sockets' transport wait
// fds (wire/transport.h: wait_fd, arm_wait) and on its own waker, an eventfd
// that another thread writes when its progress changed a socket this thread
// sleeps on (two threads may sleep on one socket: a reader and a writer, or
// gs_poll beside a blocking call; the engine's background thread may take a
// wake-up first). An idle socket costs no CPU.
#pragma once

#include "wire/socket/spin_pause.h"

#include <poll.h>

#include <chrono>
#include <cstdint>
#include <vector>

namespace gpusock::socket {

// This thread's waker: an eventfd made on first use, closed when the thread ends.
int thread_waker_fd();
// Takes whatever wake-ups reached this thread's waker.
void drain_thread_waker();
// In a child of fork(): the calling thread's waker is the parent's eventfd;
// close it so the next use makes one of the child's own.
void forget_thread_waker_after_fork();
// Wakes the thread whose waker is `waker_fd`.
void wake_waker(int waker_fd);
// wake_waker for a sleeper of a socket or set, but the calling thread's own
// waker is not written: the thread is awake. Sleepers' lists name it only
// while it arms the sockets of a sleep (gs_wait_begin), where a wake-up of a
// socket armed earlier in the same sleep must still stop that sleep: the
// wake-up is kept, and take_own_wake() says (once) whether one was.
void wake_sleeper(int waker_fd);
bool take_own_wake();
// Whether a sleep's poll(2) may have found `fd` readable: what it left in
// `polled` (n fds) says, and with none known (null, or no fds polled) it may.
bool polled_readable(int fd, const pollfd *polled, size_t n);

// The wakers of the threads sleeping on one socket (guarded by its mutex).
class SleeperList {
 public:
  void add(int waker_fd) { fds_.push_back(waker_fd); }
  void remove(int waker_fd);
  bool empty() const { return fds_.empty(); }
  void wake_all() const;  // wake_sleeper for each

 private:
  std::vector<int> fds_;
};

// What a socket's arming said (StreamSocket::arm_wait_fds).
enum class Armed : uint8_t {
  kSleep,    // its fds were added: anything new makes one readable
  kPending,  // something is there already: progress again instead of sleeping
  kNoFd,     // its transport has no wait fd: sleep in short steps
};

// Sleeps in poll() on fds for at most timeout_us (< 0: no limit). Returns the
// number of ready fds, 0 at the timeout, -EINTR when a signal arrived.
int sleep_on(std::vector<pollfd> &fds, int64_t timeout_us);

// How long this thread spins before it sleeps. It adapts: a wait that ended
// within the ceiling (it would have ended in a spin) lets the next ones spin
// the whole ceiling, a longer one halves it, so a ping-pong keeps spinning
// and an idle thread soon sleeps at once. The ceiling is GPUSOCK_BUSY_POLL_US,
// else 100 us (0 with 1 core). A spin also watches its core (yield_core): when
// another thread ran on it during one of the spin's yields, the machine has
// more runnable threads than cores and the spin only delays them (memcached's
// workers and clients on two cores), so the wait sleeps at once and the next
// spins are halved. And at most half the cores spin at once in a process
// (GPUSOCK_MAX_SPINNERS): a thread that finds them taken sleeps at once, so a
// hundred blocked threads never spin a machine down (a spin slot is held from
// next_us() until the thread sleeps or the wait ends).
class SpinBudget {
 public:
  static int64_t next_us();
  static void stop_spinning();  // this thread is about to sleep
  static void record(int64_t waited_us);
  static int64_t ceiling_us();
  // Yields the core once: true when this thread had it to itself (the yield
  // came straight back), false when another thread ran meanwhile (stop
  // spinning; the budget shrinks at record()).
  static bool yield_core();
  // Whether this wait's spin last yielded kYieldEveryUs or more before `now`
  // (a wait's first yield comes that long after next_us()).
  static bool yield_due(std::chrono::steady_clock::time_point now);
  static constexpr int64_t kYieldEveryUs = 4;
};

// One step of a spinning wait at time `now` (the caller's clock, read at most
// a few steps ago): a pause, and a yield_core() once every kYieldEveryUs,
// looked at every fourth step. By time, not by steps: a tcp
// progress pass makes a system call, so a fixed number of them could outlast
// the whole spin, and a thread the kernel woke onto this core (the peer's
// reply, sync wake-ups of loopback TCP) waited behind the spin for its end.
// False: stop spinning and sleep.
inline bool spin_step(unsigned step, std::chrono::steady_clock::time_point now) {
  if (step % 4 == 3 && SpinBudget::yield_due(now)) return SpinBudget::yield_core();
  cpu_relax();
  return true;
}

// The short sleep step for a transport without a wait fd, doubling from 10 µs
// to 1 ms.
int64_t no_fd_step_us(unsigned sleeps);

}  // namespace gpusock::socket
