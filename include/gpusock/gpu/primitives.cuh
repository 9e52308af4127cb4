// gpusock device API: the primitives, the only place that knows which backend
// runs. Under nvcc's device pass (__CUDA_ARCH__) they are CUDA intrinsics and
// inline PTX; everywhere else (g++, or nvcc's host pass) they map onto the
// host backend's threads (gpusock/host/backend.h). Each group below says what its
// primitives guarantee, then gives the GPU's definitions, then the host's.
#ifndef GPUSOCK_GPU_PRIMITIVES_CUH
#define GPUSOCK_GPU_PRIMITIVES_CUH

#include <gpusock/host/backend.h>
#include <gpusock/hd.h>

#include <sched.h>
#include <stdint.h>
#include <time.h>

#include <atomic>

// How a GPU thread waits for the proxy: GPUSOCK_SPIN_POLLS polls back to back,
// then sleeps of GPUSOCK_SLEEP_MIN_NS doubling up to << GPUSOCK_SLEEP_MAX_SHIFT.
#ifndef GPUSOCK_SPIN_POLLS
#define GPUSOCK_SPIN_POLLS 32u
#endif
#ifndef GPUSOCK_SLEEP_MIN_NS
#define GPUSOCK_SLEEP_MIN_NS 256u
#endif
#ifndef GPUSOCK_SLEEP_MAX_SHIFT
#define GPUSOCK_SLEEP_MAX_SHIFT 3u
#endif

namespace gpusock {
namespace prim {

// ---- the thread's place (1-D blocks), and the block's and warp's barriers
#if defined(__CUDA_ARCH__)
GS_HD unsigned thread_rank() { return threadIdx.x; }
GS_HD unsigned block_dim() { return blockDim.x; }
GS_HD unsigned block_index() { return blockIdx.x; }
GS_HD unsigned grid_dim() { return gridDim.x; }
GS_HD unsigned warp_size() { return 32; }
#else
GS_HD unsigned thread_rank() { return host::t_thread.rank; }
GS_HD unsigned block_dim() { return host::t_thread.block->dim; }
GS_HD unsigned block_index() { return host::t_thread.block->index; }
GS_HD unsigned grid_dim() { return host::t_thread.block->grid_dim; }
GS_HD unsigned warp_size() { return host::t_thread.block->warp_size; }
#endif
GS_HD unsigned lane() { return thread_rank() % warp_size(); }
GS_HD unsigned warp_index() { return thread_rank() / warp_size(); }

#if defined(__CUDA_ARCH__)
GS_HD void sync_block() { __syncthreads(); }
GS_HD void sync_warp() { __syncwarp(); }
#else
GS_HD void sync_block() { host::t_thread.block->barrier.arrive_and_wait(); }
GS_HD void sync_warp() { host::t_thread.block->warp_barriers[warp_index()].arrive_and_wait(); }
#endif

// ---- a poll team: the lanes of one warp that read the proxy's lines together
//
// One thread's loads of host memory take nearly a PCIe round trip each, even
// in flight together, where one warp-wide load of the same line (and of a
// record beside it) takes one round trip (gpu_bench --micro measures both).
// So a wait for the proxy is polled by a warp, a lane per 16 bytes, and the
// team's first lane decides. On the host backend a team is its
// leader alone.
// Team: lanes of one warp from `first` on: the calling warp's (all of its
//   lanes but in a block's last, partial warp), or the calling lane alone
//   (solo_team, a thread that calls by itself).
// team_rank: this lane's place in the team; team_leads: rank 0, who decides.
// team_shfl: team rank `src`'s v, in every lane of the team.
// team_sync: the team's barrier, which also orders their memory accesses.
struct Team {
  unsigned lanes;  // 1 on the host backend
  unsigned mask;
  unsigned first;  // the lane of team rank 0
};
#if defined(__CUDA_ARCH__)
GS_HD Team team() {
  const unsigned left = block_dim() - warp_index() * 32;
  const unsigned lanes = left < 32 ? left : 32;
  return Team{lanes, lanes == 32 ? 0xffffffffu : (1u << lanes) - 1, 0};
}
GS_HD Team solo_team() {
  const unsigned l = lane();
  return Team{1, 1u << l, l};
}
GS_HD unsigned team_rank(const Team &t) { return lane() - t.first; }
template <class T>  // an integer of 4 or 8 bytes
GS_HD T team_shfl(const Team &t, T v, unsigned src) {
  if constexpr (sizeof(T) == 8)
    return static_cast<T>(__shfl_sync(t.mask, static_cast<unsigned long long>(v), t.first + src));
  else return static_cast<T>(__shfl_sync(t.mask, static_cast<unsigned>(v), t.first + src));
}
GS_HD void team_sync(const Team &t) { __syncwarp(t.mask); }
#else
// On the host backend a team is the one thread that calls (the scope's leader,
// or a thread alone).
GS_HD Team team() { return Team{1, 1, 0}; }
GS_HD Team solo_team() { return Team{1, 1, 0}; }
GS_HD unsigned team_rank(const Team &) { return 0; }
template <class T>
GS_HD T team_shfl(const Team &, T v, unsigned) {
  return v;
}
GS_HD void team_sync(const Team &) {}
#endif
GS_HD bool team_leads(const Team &t) { return team_rank(t) == 0; }

// ---- loads of words the proxy writes, at system scope (never a stale cached copy)
//
// load_acquire: later loads see what was published before the value read.
// load_relaxed: not ordered with each other, so several are in flight across
//   PCIe at once. Acting on what they return needs fence_acquire() first (a
//   relaxed read followed by the fence is an acquire of what was read).
// load_relaxed_x2, load_acquire_x2: two 8-byte words (16-byte aligned) in one
//   load; each word is read atomically, the pair is not.
// load_relaxed_x4: four 4-byte words (16-byte aligned) in one relaxed load.
// load_relaxed_x16: sixteen 8-byte words (16-byte aligned), all in flight at
//   once; each word is read atomically, the whole is not.
// fence_acquire: makes the relaxed loads before it acquires: later loads see
//   at least what was published before the values they returned.
//
// Two macros, one definition per backend, give the loads below, so that each
// names its PTX instruction and its host memory order once:
//   GPUSOCK_LOAD_WORD(T, name, ptx, constraint, order)  T name(const T *p)
//   GPUSOCK_LOAD_PAIR(name, ptx, order)  void name(const uint64_t *p, uint64_t *a, uint64_t *b)
#if defined(__CUDA_ARCH__)
#define GPUSOCK_LOAD_WORD(T, name, ptx, constraint, order)                  \
  GS_HD T name(const T *p) {                                                \
    T v;                                                                    \
    asm volatile(ptx " %0, [%1];" : "=" constraint(v) : "l"(p) : "memory"); \
    return v;                                                               \
  }
#define GPUSOCK_LOAD_PAIR(name, ptx, order)                                       \
  GS_HD void name(const uint64_t *p, uint64_t *a, uint64_t *b) {                  \
    asm volatile(ptx " {%0,%1}, [%2];" : "=l"(*a), "=l"(*b) : "l"(p) : "memory"); \
  }
#else
#define GPUSOCK_LOAD_WORD(T, name, ptx, constraint, order) \
  GS_HD T name(const T *p) { return __atomic_load_n(p, order); }
#define GPUSOCK_LOAD_PAIR(name, ptx, order)                      \
  GS_HD void name(const uint64_t *p, uint64_t *a, uint64_t *b) { \
    *a = __atomic_load_n(p, order);                              \
    *b = __atomic_load_n(p + 1, order);                          \
  }
#endif
GPUSOCK_LOAD_WORD(uint64_t, load_acquire, "ld.acquire.sys.b64", "l", __ATOMIC_ACQUIRE)
GPUSOCK_LOAD_WORD(uint32_t, load_acquire, "ld.acquire.sys.b32", "r", __ATOMIC_ACQUIRE)
GPUSOCK_LOAD_WORD(uint64_t, load_relaxed, "ld.relaxed.sys.b64", "l", __ATOMIC_RELAXED)
GPUSOCK_LOAD_WORD(uint32_t, load_relaxed, "ld.relaxed.sys.b32", "r", __ATOMIC_RELAXED)
GPUSOCK_LOAD_PAIR(load_relaxed_x2, "ld.relaxed.sys.v2.u64", __ATOMIC_RELAXED)
GPUSOCK_LOAD_PAIR(load_acquire_x2, "ld.acquire.sys.v2.u64", __ATOMIC_ACQUIRE)
#undef GPUSOCK_LOAD_WORD
#undef GPUSOCK_LOAD_PAIR
GS_HD int32_t load_acquire(const int32_t *p) {
  return static_cast<int32_t>(load_acquire(reinterpret_cast<const uint32_t *>(p)));
}
#if defined(__CUDA_ARCH__)
// 128 bytes as eight 16-byte loads issued back to back in one statement: the
// warp issues in order, so loads written one by one, each result stored before
// the next load, would wait a PCIe round trip apiece. No memory clobber: these
// are relaxed, ordered with nothing.
GS_HD void load_relaxed_x16(const uint64_t *p, uint64_t *w) {
  asm volatile(
      "ld.relaxed.sys.v2.u64 {%0,%1}, [%16];\n\t"
      "ld.relaxed.sys.v2.u64 {%2,%3}, [%16+16];\n\t"
      "ld.relaxed.sys.v2.u64 {%4,%5}, [%16+32];\n\t"
      "ld.relaxed.sys.v2.u64 {%6,%7}, [%16+48];\n\t"
      "ld.relaxed.sys.v2.u64 {%8,%9}, [%16+64];\n\t"
      "ld.relaxed.sys.v2.u64 {%10,%11}, [%16+80];\n\t"
      "ld.relaxed.sys.v2.u64 {%12,%13}, [%16+96];\n\t"
      "ld.relaxed.sys.v2.u64 {%14,%15}, [%16+112];"
      : "=l"(w[0]), "=l"(w[1]), "=l"(w[2]), "=l"(w[3]), "=l"(w[4]), "=l"(w[5]), "=l"(w[6]), "=l"(w[7]), "=l"(w[8]),
        "=l"(w[9]), "=l"(w[10]), "=l"(w[11]), "=l"(w[12]), "=l"(w[13]), "=l"(w[14]), "=l"(w[15])
      : "l"(p));
}
GS_HD void load_relaxed_x4(const uint32_t *p, uint32_t *w) {
  asm volatile("ld.relaxed.sys.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
               : "l"(p)
               : "memory");
}
GS_HD void fence_acquire() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
#else
GS_HD void load_relaxed_x16(const uint64_t *p, uint64_t *w) {
  for (int i = 0; i < 16; ++i) w[i] = __atomic_load_n(p + i, __ATOMIC_RELAXED);
}
GS_HD void load_relaxed_x4(const uint32_t *p, uint32_t *w) {
  for (int i = 0; i < 4; ++i) w[i] = __atomic_load_n(p + i, __ATOMIC_RELAXED);
}
GS_HD void fence_acquire() { std::atomic_thread_fence(std::memory_order_acquire); }
#endif

// ---- stores the proxy reads, and the fences that order them
//
// fence_system: orders this thread's earlier writes before its later ones as
//   seen by the proxy (another agent across PCIe on CUDA).
// store_relaxed: one 8-byte word.
// store_line_relaxed: a 64-byte line as four 16-byte stores back to back (no
//   fence between them, so the GPU can send them as one write); each 8-byte
//   word is single-copy atomic, the line is not.
// fence_release: orders this thread's earlier writes (and what it saw others
//   write) before its later ones, for every observer.
// store_release: publishes a word after this thread's earlier writes.
#if defined(__CUDA_ARCH__)
GS_HD void fence_system() { __threadfence_system(); }
GS_HD void store_relaxed(uint64_t *p, uint64_t v) {
  asm volatile("st.relaxed.sys.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
GS_HD void store_line_relaxed(uint64_t *dst, const uint64_t *src) {
  for (int i = 0; i < 8; i += 2)
    asm volatile("st.relaxed.sys.v2.u64 [%0], {%1,%2};" ::"l"(dst + i), "l"(src[i]), "l"(src[i + 1]) : "memory");
}
GS_HD void fence_release() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
GS_HD void store_release(uint64_t *p, uint64_t v) {
  asm volatile("st.release.sys.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
#else
GS_HD void fence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
GS_HD void store_relaxed(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
GS_HD void store_line_relaxed(uint64_t *dst, const uint64_t *src) {
  for (int i = 0; i < 8; ++i) __atomic_store_n(dst + i, src[i], __ATOMIC_RELAXED);
}
GS_HD void fence_release() { std::atomic_thread_fence(std::memory_order_release); }
GS_HD void store_release(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
#endif

// ---- atomics on GPU-private words (device scope: only GPU threads race on
// them), and the clock
//
// atomic_add: for unsigned long long and uint32_t; returns the old value.
// atomic_cas: for uint32_t and unsigned long long; returns the value found (== expected on success).
#if defined(__CUDA_ARCH__)
template <class T>
GS_HD T atomic_add(T *p, T v) {
  return atomicAdd(p, v);
}
GS_HD void atomic_max(unsigned long long *p, unsigned long long v) { atomicMax(p, v); }
GS_HD uint32_t atomic_cas(uint32_t *p, uint32_t expected, uint32_t desired) { return atomicCAS(p, expected, desired); }
GS_HD unsigned long long atomic_cas(unsigned long long *p, unsigned long long expected, unsigned long long desired) {
  return atomicCAS(p, expected, desired);
}
GS_HD uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#else
template <class T>
GS_HD T atomic_add(T *p, T v) {
  return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL);
}
GS_HD void atomic_max(unsigned long long *p, unsigned long long v) {
  unsigned long long cur = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (cur < v && !__atomic_compare_exchange_n(p, &cur, v, true, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {}
}
template <class T>
GS_HD T atomic_cas(T *p, T expected, T desired) {  // uint32_t, unsigned long long
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  return expected;
}
GS_HD uint64_t now_ns() { return host::now_ns(); }
#endif

// Waiting for the proxy: short pauses first (a doorbell round trip is a few
// PCIe round trips), then longer ones. On the host backend emulated threads
// may outnumber cores many times: they yield for the first part of a wait,
// then sleep.
struct Backoff {
  unsigned n = 0;
  // Whether this wait should look at the stop flag now. Every waiting block
  // reading one host line on every poll serializes them all at the host
  // bridge (reads of one line queue there; reads of their own lines do not),
  // so short waits never look and long ones look every 16th poll.
  GS_HD bool stop_check_due() const { return n >= 48 && (n & 15) == 0; }
#if !defined(__CUDA_ARCH__)
  uint64_t since = 0;
#endif
  GS_HD void pause() {
#if defined(__CUDA_ARCH__)
    // Each poll of host memory is a PCIe round trip already: spin for the
    // first ones (no added latency), then sleep, doubling up to a bound.
    if (n >= GPUSOCK_SPIN_POLLS) {
      const unsigned k = n - GPUSOCK_SPIN_POLLS;
      __nanosleep(GPUSOCK_SLEEP_MIN_NS << (k < GPUSOCK_SLEEP_MAX_SHIFT ? k : GPUSOCK_SLEEP_MAX_SHIFT));
    }
#else
    if (n < 8) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    } else {
      const uint64_t now = host::now_ns();
      if (since == 0) since = now;
      const uint64_t waited = now - since;
      if (waited < 50000) {
        sched_yield();
      } else {
        // A sixteenth of the time waited so far, 10 µs to 2 ms: a wake-up
        // comes at most ~6% late, and a hundred idle blocks do not take the
        // cores that the proxy and the peers need to make their news.
        const uint64_t pause_ns = waited / 16;
        const long ns = pause_ns < 10000 ? 10000 : (pause_ns > 2000000 ? 2000000 : static_cast<long>(pause_ns));
        timespec ts{0, ns};
        nanosleep(&ts, nullptr);
      }
    }
#endif
    ++n;
  }
};

}  // namespace prim

}  // namespace gpusock

#endif
