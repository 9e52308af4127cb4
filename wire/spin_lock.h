// A pthread spin lock that gives its core away when the holder does not let
// go: the process's pthread_spin_lock (spin_lock.cc says why and how).
#pragma once

#include <pthread.h>

#include <cstdint>

namespace gpusock::wire {

// One step of every busy wait in gpusock: the CPU's pause (spin-wait hint).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// What waiting on spin locks has cost this process so far.
struct SpinLockCounts {
  uint64_t contended;  // acquisitions that found the lock held
  uint64_t yields;     // sched_yield calls while waiting
  uint64_t naps;       // short sleeps while waiting
};
SpinLockCounts spin_lock_counts();

// Whether pthread_spin_lock, as the dynamic linker resolves it for libfabric,
// is this one (the shim must export it too: see spin_lock.cc).
bool spin_lock_interposed();

// Called by each shm domain as it opens: with GPUSOCK_LOG set, says whether
// the interposition took and, at exit, what waiting cost.
void note_spin_lock_use();

// The value of a free lock word: what pthread_spin_init stores (glibc on
// x86-64 counts down from 1; elsewhere 0 is free).
int spin_lock_free_value();

// For the calling thread: spin on a held lock as glibc does, never giving the
// core away. For a thread that owns its core and is the one everything else
// waits for (the GPU proxy's): its yields hand the core to the very threads
// it feeds.
void spin_lock_keep_core();

// The waiting acquisition itself (the shim's pthread_spin_lock forwards here).
int yielding_spin_lock(pthread_spinlock_t *lock);

}  // namespace gpusock::wire
