// Clocks for tests and benchmarks: how long something took (Stopwatch),
// whether a time limit has passed (Deadline), polling a condition until one
// does (wait_until). All on the steady clock.
#pragma once

#include <unistd.h>

#include <chrono>

namespace gpusock::test {

using Clock = std::chrono::steady_clock;

class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  double ns() const { return std::chrono::duration<double, std::nano>(Clock::now() - start_).count(); }

 private:
  Clock::time_point start_;
};

class Deadline {
 public:
  explicit Deadline(double seconds)
      : end_(Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds))) {}
  bool passed() const { return Clock::now() > end_; }
  // Milliseconds left, 0 once passed.
  long long ms_left() const {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end_ - Clock::now()).count();
    return left > 0 ? left : 0;
  }

 private:
  Clock::time_point end_;
};

// Polls pred every millisecond until it holds (true) or ms pass (false).
template <class Pred>
bool wait_until(Pred pred, int ms) {
  const Deadline deadline(ms / 1000.0);
  while (!pred()) {
    if (deadline.passed()) return false;
    usleep(1000);
  }
  return true;
}

}  // namespace gpusock::test
