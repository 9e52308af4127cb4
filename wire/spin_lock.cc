// pthread_spin_lock for the whole process, defined here so that libfabric's
// calls resolve to it: libgpusock.so and the proxy's programs export it; the
// shim, which libc precedes in the lookup order of a preloaded program's
// libraries, exports one that forwards here (gs_spin_lock).
//
// Why. libfabric's shm provider guards every endpoint's region in shared
// memory with a pthread spin lock: the owner takes it to progress, every peer
// to enqueue a command or a response. glibc's pthread_spin_lock spins until
// it gets the lock. When the holder is preempted (more runnable threads than
// cores: a client with a thread per connection, a server's workers beside
// it), each thread that wants that region spins out its time slice waiting
// for a thread that cannot run, and a server worker stuck so stalls all its
// connections: requests per second collapse and the tail grows to
// milliseconds. Here a waiter spins as glibc does for a few microseconds (a
// running holder lets go within them), then yields its core, then naps, so
// that the scheduler runs (or migrates) the holder.
//
// The lock word is glibc's: free when it holds what pthread_spin_init stores
// (1 on x86-64, where glibc counts down; 0 elsewhere), taken as glibc's
// trylock takes it, released by glibc's pthread_spin_unlock, so locks taken
// here and by glibc's own calls mix freely.
// GPUSOCK_SPIN_LOCK_YIELD=0 keeps glibc's plain spinning.
#include "wire/spin_lock.h"

#include "wire/config.h"
#include "wire/log.h"

// ThreadSanitizer intercepts the spin lock calls itself and must see every
// acquisition: under it the process keeps glibc's lock (and TSan's view).
#if defined(__SANITIZE_THREAD__)
#define GS_SPIN_LOCK_INTERPOSE 0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GS_SPIN_LOCK_INTERPOSE 0
#endif
#endif
#ifndef GS_SPIN_LOCK_INTERPOSE
#define GS_SPIN_LOCK_INTERPOSE 1
#endif

#include <dlfcn.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace gpusock::wire {

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<uint64_t> g_contended{0}, g_yields{0}, g_naps{0};
thread_local bool t_keep_core = false;

bool yield_enabled() {
  static const bool enabled = [] { return config::get(config::Id::kSpinLockYield) != 0; }();
  return enabled;
}

inline bool held(pthread_spinlock_t *lock) {
  return __atomic_load_n(reinterpret_cast<volatile int *>(lock), __ATOMIC_RELAXED) != spin_lock_free_value();
}

// glibc's trylock, done here: one compare-and-swap from the free value to
// the taken one (0 on x86-64, where free is 1; 1 elsewhere). Not a call of
// pthread_spin_trylock, which a race detector intercepts: under TSan its
// own pthread_spin_lock calls this one, and a trylock inside it would count
// every acquisition twice.
inline bool try_take(pthread_spinlock_t *lock) {
  int expected = spin_lock_free_value();
  const int taken = expected == 1 ? 0 : 1;
  return __atomic_compare_exchange_n(reinterpret_cast<volatile int *>(lock), &expected, taken, false, __ATOMIC_ACQUIRE,
                                     __ATOMIC_RELAXED);
}

// How long a waiter spins before yielding, and yields before napping: a
// holder that runs finishes a provider's critical section well within the
// first; one that does not run needs this core or another to be given up.
constexpr auto kSpinFor = std::chrono::microseconds(4);
constexpr auto kYieldFor = std::chrono::microseconds(50);
constexpr long kNapNs = 20000;

}  // namespace

int spin_lock_free_value() {
  static const int value = [] {
    pthread_spinlock_t lock;
    pthread_spin_init(&lock, PTHREAD_PROCESS_SHARED);
    const int v = static_cast<int>(lock);
    pthread_spin_destroy(&lock);
    return v;
  }();
  return value;
}

int yielding_spin_lock(pthread_spinlock_t *lock) {
  if (try_take(lock)) return 0;
  g_contended.fetch_add(1, std::memory_order_relaxed);
  if (t_keep_core || !yield_enabled()) {
    for (;;) {
      while (held(lock)) cpu_relax();
      if (try_take(lock)) return 0;
    }
  }
  const auto start = Clock::now();
  for (unsigned step = 1;; ++step) {
    if (!held(lock) && try_take(lock)) return 0;
    if (step % 32 != 0) {
      cpu_relax();
      continue;
    }
    const auto waited = Clock::now() - start;
    if (waited < kSpinFor) {
      cpu_relax();
    } else if (waited < kYieldFor) {
      g_yields.fetch_add(1, std::memory_order_relaxed);
      sched_yield();
    } else {
      g_naps.fetch_add(1, std::memory_order_relaxed);
      const timespec nap{0, kNapNs};
      nanosleep(&nap, nullptr);
    }
  }
}

void spin_lock_keep_core() { t_keep_core = true; }

SpinLockCounts spin_lock_counts() {
  return {g_contended.load(std::memory_order_relaxed), g_yields.load(std::memory_order_relaxed),
          g_naps.load(std::memory_order_relaxed)};
}

bool spin_lock_interposed() {
  if (!GS_SPIN_LOCK_INTERPOSE) return false;
  // What libfabric's own calls bind to: the first definition in the global
  // scope, which is libc's unless an object before libc defines one.
  Dl_info info{};
  void *first = dlsym(RTLD_DEFAULT, "pthread_spin_lock");
  return first != nullptr && dladdr(first, &info) != 0 && info.dli_fname != nullptr &&
         std::strstr(info.dli_fname, "libc.so") == nullptr;
}

void note_spin_lock_use() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (!log::enabled(log::kInfo)) return;
    log::write(log::kInfo, "wait", "pthread_spin_lock %s",
               spin_lock_interposed() ? "yields to a preempted holder" : "is libc's (plain spinning)");
    std::atexit([] {
      const SpinLockCounts c = spin_lock_counts();
      log::write(log::kInfo, "wait", "spin locks: %llu contended, %llu yields, %llu naps",
                 static_cast<unsigned long long>(c.contended), static_cast<unsigned long long>(c.yields),
                 static_cast<unsigned long long>(c.naps));
    });
  });
}

}  // namespace gpusock::wire

#if GS_SPIN_LOCK_INTERPOSE
extern "C" __attribute__((visibility("default"))) int pthread_spin_lock(pthread_spinlock_t *lock) {
  return gpusock::wire::yielding_spin_lock(lock);
}
#endif
