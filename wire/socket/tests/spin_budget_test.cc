// The spin-then-sleep policy of blocking waits, through the C hooks code that
// waits itself uses (gs_spin_budget_us, gs_spin_record, gs_spin_yield). The
// policy's state is per thread, so each case runs on a fresh thread. No
// timing is asserted: a crowded core is made certain by pinning a busy thread
// to the waiting thread's CPU. GPUSOCK_BUSY_POLL_US=64 (CMakeLists) fixes the
// ceiling.
#include <gpusock/socket.h>

#include <gtest/gtest.h>

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <thread>

namespace {

constexpr long kCeiling = 64;

// One wait as a waiting loop makes it: take the budget, then say how long it took.
long budget_then_record(long waited_us) {
  const long budget = gs_spin_budget_us();
  gs_spin_record(waited_us);
  return budget;
}

template <class F>
void on_fresh_thread(F f) {
  std::thread t(f);
  t.join();
}

bool pin_to(pthread_t thread, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(thread, sizeof set, &set) == 0;
}

}  // namespace

TEST(SpinBudget, ShortWaitsKeepTheCeilingLongOnesHalveIt) {
  on_fresh_thread([] {
    EXPECT_EQ(budget_then_record(1), kCeiling);
    EXPECT_EQ(budget_then_record(10 * kCeiling), kCeiling);      // this wait was long...
    EXPECT_EQ(budget_then_record(10 * kCeiling), kCeiling / 2);  // ...so this one spun half
    EXPECT_EQ(budget_then_record(1), kCeiling / 4);
    EXPECT_EQ(budget_then_record(1), kCeiling);  // a short wait restores the ceiling
  });
}

// A thread whose spin yields its core to another runnable thread stops
// spinning (gs_spin_yield says so) and its next spins are halved, even when
// the wait itself was short: on a machine with more runnable threads than
// cores a spinning waiter only delays the thread it waits for.
TEST(SpinBudget, ACrowdedCoreEndsTheSpinAndHalvesTheNext) {
  on_fresh_thread([] {
    const int cpu = sched_getcpu();
    ASSERT_GE(cpu, 0);
    ASSERT_TRUE(pin_to(pthread_self(), cpu));
    std::atomic<bool> stop{false};
    std::thread busy([&] {
      while (!stop.load(std::memory_order_relaxed)) {}
    });
    ASSERT_TRUE(pin_to(busy.native_handle(), cpu));

    const long budget = gs_spin_budget_us();
    EXPECT_EQ(budget, kCeiling);
    bool crowded = false;
    for (int i = 0; i < 10000 && !crowded; ++i) crowded = gs_spin_yield() == 1;
    gs_spin_record(1);
    stop.store(true);
    busy.join();
    EXPECT_TRUE(crowded) << "a busy thread on this CPU never ran during 10,000 yields";
    EXPECT_EQ(budget_then_record(1), kCeiling / 2);
    EXPECT_EQ(budget_then_record(1), kCeiling);  // alone again: the whole ceiling
  });
}
