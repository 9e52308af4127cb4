// The process's pthread_spin_lock (wire/spin_lock.h), as libgpusock.so
// defines it for every caller in the process, libfabric's included: the
// definition is the one calls bind to, it shares glibc's lock word, a wait
// for a holder that does not run gives the core away, and mutual exclusion
// holds with more threads than cores. No timing is asserted.
#include "wire/spin_lock.h"

#include <gtest/gtest.h>

#include <errno.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace {

using gpusock::wire::spin_lock_counts;

// Under ThreadSanitizer the process keeps glibc's lock (spin_lock.cc).
#if defined(__SANITIZE_THREAD__)
constexpr bool kInterposed = false;
#else
constexpr bool kInterposed = true;
#endif

TEST(SpinLock, IsTheDefinitionCallsBindTo) { EXPECT_EQ(gpusock::wire::spin_lock_interposed(), kInterposed); }

TEST(SpinLock, SharesGlibcsLockWord) {
  pthread_spinlock_t lock;
  ASSERT_EQ(pthread_spin_init(&lock, PTHREAD_PROCESS_PRIVATE), 0);
  EXPECT_EQ(static_cast<int>(lock), gpusock::wire::spin_lock_free_value());
  ASSERT_EQ(pthread_spin_lock(&lock), 0);
  EXPECT_EQ(pthread_spin_trylock(&lock), EBUSY);  // glibc's trylock sees ours held
  ASSERT_EQ(pthread_spin_unlock(&lock), 0);       // and glibc's unlock frees it
  ASSERT_EQ(pthread_spin_trylock(&lock), 0);
  ASSERT_EQ(pthread_spin_unlock(&lock), 0);
  ASSERT_EQ(pthread_spin_lock(&lock), 0);  // free again: taken at once
  ASSERT_EQ(pthread_spin_unlock(&lock), 0);
  pthread_spin_destroy(&lock);
}

// A holder that sleeps stands for one that was preempted: its waiter naps
// instead of spinning until the holder lets go.
TEST(SpinLock, WaiterOfAHolderThatDoesNotRunNaps) {
  if (!kInterposed) GTEST_SKIP() << "glibc's lock under ThreadSanitizer";
  pthread_spinlock_t lock;
  ASSERT_EQ(pthread_spin_init(&lock, PTHREAD_PROCESS_PRIVATE), 0);
  ASSERT_EQ(pthread_spin_lock(&lock), 0);
  const auto before = spin_lock_counts();
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    pthread_spin_lock(&lock);
    got = true;
    pthread_spin_unlock(&lock);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_FALSE(got.load());
  pthread_spin_unlock(&lock);
  waiter.join();
  EXPECT_TRUE(got.load());
  const auto after = spin_lock_counts();
  EXPECT_GT(after.contended, before.contended);
  EXPECT_GT(after.naps, before.naps);
  pthread_spin_destroy(&lock);
}

TEST(SpinLock, ExcludesWithMoreThreadsThanCores) {
  pthread_spinlock_t lock;
  ASSERT_EQ(pthread_spin_init(&lock, PTHREAD_PROCESS_PRIVATE), 0);
  const int threads = 4 * static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  constexpr int kEach = 20000;
  long counter = 0;  // guarded by lock only
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        pthread_spin_lock(&lock);
        const long seen = counter;
        if (i % 1000 == 0) std::this_thread::yield();  // a holder that loses its core
        counter = seen + 1;
        pthread_spin_unlock(&lock);
      }
    });
  for (auto &t : pool) t.join();
  EXPECT_EQ(counter, static_cast<long>(threads) * kEach);
  pthread_spin_destroy(&lock);
}

}  // namespace
