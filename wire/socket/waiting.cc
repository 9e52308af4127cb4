#include "wire/socket/waiting.h"

#include "wire/config.h"

#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <ctime>

namespace gpusock::socket {

namespace {

struct Waker {
  int fd = -1;
  ~Waker() {
    if (fd >= 0) close(fd);
  }
};

thread_local Waker t_waker;
thread_local int64_t t_spin_us = -1;   // -1: not yet set (starts at the ceiling)
thread_local bool t_spinning = false;  // holds one of the process's spin slots
thread_local bool t_crowded = false;   // another thread ran on this core during this wait's spin
thread_local std::chrono::steady_clock::time_point t_last_yield;  // or the spin's start
thread_local bool t_woke_self = false;  // a wake-up of this thread's own waker was kept (take_own_wake)
std::atomic<int> g_spinners{0};

}  // namespace

int thread_waker_fd() {
  if (t_waker.fd < 0) t_waker.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  return t_waker.fd;
}

void drain_thread_waker() {
  if (t_waker.fd < 0) return;
  uint64_t value;
  while (read(t_waker.fd, &value, sizeof value) > 0) {}
}

void forget_thread_waker_after_fork() {
  if (t_waker.fd >= 0) close(t_waker.fd);
  t_waker.fd = -1;
}

void wake_waker(int waker_fd) {
  const uint64_t one = 1;
  (void)!write(waker_fd, &one, sizeof one);
}

void SleeperList::remove(int waker_fd) {
  const auto it = std::find(fds_.begin(), fds_.end(), waker_fd);
  if (it != fds_.end()) fds_.erase(it);
}

void SleeperList::wake_all() const {
  for (int fd : fds_) wake_sleeper(fd);
}

void wake_sleeper(int waker_fd) {
  if (waker_fd >= 0 && waker_fd == t_waker.fd) t_woke_self = true;
  else wake_waker(waker_fd);
}

bool take_own_wake() {
  const bool woke = t_woke_self;
  t_woke_self = false;
  return woke;
}

bool polled_readable(int fd, const pollfd *polled, size_t n) {
  if (polled == nullptr || n == 0) return true;
  for (size_t i = 0; i < n; ++i)
    if (polled[i].fd == fd) return polled[i].revents != 0;
  return false;
}

int sleep_on(std::vector<pollfd> &fds, int64_t timeout_us) {
  timespec ts{};
  if (timeout_us >= 0) ts = {static_cast<time_t>(timeout_us / 1000000), static_cast<long>(timeout_us % 1000000) * 1000};
  const int n = ppoll(fds.data(), fds.size(), timeout_us >= 0 ? &ts : nullptr, nullptr);
  if (n < 0) return errno == EINTR ? -EINTR : 0;
  return n;
}

// The cores this process may run on: its affinity mask (taskset, cgroups'
// cpusets), not the machine's, so spinning is sized to the cores it has.
static long usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

int64_t SpinBudget::ceiling_us() {
  static const int64_t ceiling = [] {
    const long cores = usable_cores();
    // Long enough to ride out a peer's short preemption: a round trip that
    // falls asleep costs a wake-up many times the round trip itself.
    const int64_t fallback = cores <= 1 ? 0 : 100;
    return config::get_or(config::Id::kBusyPollUs, fallback);
  }();
  return ceiling;
}

int64_t SpinBudget::next_us() {
  static const int max_spinners = [] {
    const long cores = usable_cores();
    return static_cast<int>(config::get_or(config::Id::kMaxSpinners, std::max(1L, cores / 2)));
  }();
  if (t_spin_us < 0) t_spin_us = ceiling_us();
  if (t_spin_us == 0 || t_spinning) return t_spin_us;
  t_last_yield = std::chrono::steady_clock::now();
  if (g_spinners.fetch_add(1, std::memory_order_relaxed) >= max_spinners) {
    g_spinners.fetch_sub(1, std::memory_order_relaxed);
    return 0;  // enough threads spin already: sleep at once
  }
  t_spinning = true;
  return t_spin_us;
}

void SpinBudget::stop_spinning() {
  if (!t_spinning) return;
  g_spinners.fetch_sub(1, std::memory_order_relaxed);
  t_spinning = false;
}

void SpinBudget::record(int64_t waited_us) {
  stop_spinning();
  const int64_t ceiling = ceiling_us();
  const int64_t current = t_spin_us < 0 ? ceiling : t_spin_us;
  t_spin_us = waited_us <= ceiling && !t_crowded ? ceiling : current / 2;
  t_crowded = false;
}

bool SpinBudget::yield_core() {
  // A yield with nobody else runnable here is one system call; one that let
  // another thread run takes two context switches and that thread's work.
  constexpr auto kCrowded = std::chrono::microseconds(5);
  const auto before = std::chrono::steady_clock::now();
  sched_yield();
  t_last_yield = std::chrono::steady_clock::now();
  if (t_last_yield - before < kCrowded) return true;
  t_crowded = true;
  return false;
}

bool SpinBudget::yield_due(std::chrono::steady_clock::time_point now) {
  return now - t_last_yield >= std::chrono::microseconds(kYieldEveryUs);
}

int64_t no_fd_step_us(unsigned sleeps) { return std::min<int64_t>(int64_t(10) << std::min(sleeps, 7u), 1000); }

}  // namespace gpusock::socket
