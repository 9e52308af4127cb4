// gpusock GPU sockets: the device API (GPUnet's call names), header-only.
//
// Calls come in two cooperative forms:
//   gsend(ctx, ...)       threadblock: every thread of the block calls with the
//                         same arguments; all threads move the data
//   gsend_warp(ctx, ...)  warp: every lane of one warp calls; the warp owns the
//                         socket, so one block can serve many sockets at once
// Every call returns >= 0 or a negated errno. Blocking calls take timeout_ms
// (-1: none) and return -ETIMEDOUT when it passes; MSG_DONTWAIT or a
// SOCK_NONBLOCK socket give -EAGAIN instead of waiting. When the host calls
// Proxy::request_kernel_stop(), blocking calls return -ESHUTDOWN and
// gshould_stop() turns true, so persistent kernels can leave their loop.
//
// One source, two backends. Under nvcc's device pass (__CUDA_ARCH__) the
// primitives below map to CUDA intrinsics. Everywhere else (g++, or nvcc's host
// pass) they map to host threads: gpusock::Grid runs a "kernel" functor on
// blocks x threads std::threads, with barriers for __syncthreads/__syncwarp.
// The socket code above the primitives is the same for both; the host backend
// is how CI tests it without a GPU, and a fallback where no GPU exists.
#ifndef GPUSOCK_GPU_CUH
#define GPUSOCK_GPU_CUH

#include <gpusock/hd.h>
#include <gpusock/proxy.h>

#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include <sched.h>
#include <time.h>
#if defined(__CUDACC__)
#include <cuda_runtime.h>
#endif


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

using channel::DeviceContext;
using gpollfd = ::pollfd;

// ======================================================================
// Host emulation of threadblocks and warps (the host backend).
// ======================================================================
namespace host {

// A reusable barrier: the last arriver opens the next generation. Waiters spin
// briefly, then sleep on the generation word (futex), so idle emulated threads
// cost no CPU.
class Barrier {
 public:
  void init(unsigned count) { count_ = count; }
  void arrive_and_wait() {
    const uint32_t gen = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == count_) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_acq_rel);
      generation_.notify_all();
      return;
    }
    for (int i = 0; i < 128 && generation_.load(std::memory_order_acquire) == gen; ++i) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    // A futex wake-up costs tens of µs on a loaded machine: yield a while first.
    const auto yield_until = std::chrono::steady_clock::now() + std::chrono::microseconds(30);
    while (generation_.load(std::memory_order_acquire) == gen && std::chrono::steady_clock::now() < yield_until)
      sched_yield();
    while (generation_.load(std::memory_order_acquire) == gen) generation_.wait(gen, std::memory_order_acquire);
  }

 private:
  unsigned count_ = 1;
  std::atomic<uint32_t> arrived_{0};
  std::atomic<uint32_t> generation_{0};
};

inline constexpr unsigned kScratchWords = 4;  // broadcast values up to 32 bytes

struct BlockState {
  unsigned index = 0, grid_dim = 1, dim = 1, warp_size = 1;
  Barrier barrier;
  std::unique_ptr<Barrier[]> warp_barriers;
  alignas(64) unsigned long long scratch[kScratchWords] = {};
  std::atomic<unsigned> counter{0};
  std::unique_ptr<unsigned long long[]> warp_scratch;  // kScratchWords per warp
  std::unique_ptr<std::atomic<unsigned>[]> warp_counters;
};

struct ThreadState {
  BlockState *block = nullptr;
  unsigned rank = 0;
};

inline thread_local ThreadState t_thread;

inline uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

// Runs a functor on blocks x threads host threads.
class HostGrid {
 public:
  HostGrid() = default;
  HostGrid(const HostGrid &) = delete;
  HostGrid &operator=(const HostGrid &) = delete;
  ~HostGrid() { join(); }

  template <class F>
  int start(unsigned blocks, unsigned threads, unsigned warp_size, const F &kernel) {
    if (blocks == 0 || threads == 0 || warp_size == 0 || threads % warp_size != 0) return -EINVAL;
    join();
    blocks_.clear();
    for (unsigned b = 0; b < blocks; ++b) {
      auto block = std::make_unique<BlockState>();
      block->index = b;
      block->grid_dim = blocks;
      block->dim = threads;
      block->warp_size = warp_size;
      block->barrier.init(threads);
      const unsigned warps = threads / warp_size;
      block->warp_barriers = std::make_unique<Barrier[]>(warps);
      for (unsigned w = 0; w < warps; ++w) block->warp_barriers[w].init(warp_size);
      block->warp_scratch = std::make_unique<unsigned long long[]>(warps * kScratchWords);
      block->warp_counters = std::make_unique<std::atomic<unsigned>[]>(warps);
      blocks_.push_back(std::move(block));
    }
    try {
      for (unsigned b = 0; b < blocks; ++b)
        for (unsigned t = 0; t < threads; ++t)
          threads_.emplace_back([kernel, block = blocks_[b].get(), t] {
            t_thread = ThreadState{block, t};
            kernel();
          });
    } catch (...) {
      // Threads already started would wait forever at their first barrier;
      // nothing sane can be done but report it (no exception crosses gpusock).
      std::terminate();
    }
    return 0;
  }
  void join() {
    for (auto &t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }
  bool running() const { return !threads_.empty(); }

 private:
  std::vector<std::unique_ptr<BlockState>> blocks_;
  std::vector<std::thread> threads_;
};

}  // namespace host

// ======================================================================
// Primitives: the only place that knows which backend runs.
// ======================================================================
namespace prim {

GS_HD unsigned thread_rank() {
#if defined(__CUDA_ARCH__)
  return threadIdx.x;
#else
  return host::t_thread.rank;
#endif
}
GS_HD unsigned block_dim() {
#if defined(__CUDA_ARCH__)
  return blockDim.x;
#else
  return host::t_thread.block->dim;
#endif
}
GS_HD unsigned block_index() {
#if defined(__CUDA_ARCH__)
  return blockIdx.x;
#else
  return host::t_thread.block->index;
#endif
}
GS_HD unsigned grid_dim() {
#if defined(__CUDA_ARCH__)
  return gridDim.x;
#else
  return host::t_thread.block->grid_dim;
#endif
}
GS_HD unsigned warp_size() {
#if defined(__CUDA_ARCH__)
  return 32;
#else
  return host::t_thread.block->warp_size;
#endif
}
GS_HD unsigned lane() { return thread_rank() % warp_size(); }
GS_HD unsigned warp_index() { return thread_rank() / warp_size(); }

GS_HD void sync_block() {
#if defined(__CUDA_ARCH__)
  __syncthreads();
#else
  host::t_thread.block->barrier.arrive_and_wait();
#endif
}
GS_HD void sync_warp() {
#if defined(__CUDA_ARCH__)
  __syncwarp();
#else
  host::t_thread.block->warp_barriers[warp_index()].arrive_and_wait();
#endif
}

// Orders this thread's earlier writes before its later ones as seen by the
// proxy (another agent across PCIe on CUDA).
GS_HD void fence_system() {
#if defined(__CUDA_ARCH__)
  __threadfence_system();
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

// Loads of words the proxy writes: acquire at system scope, never cached stale.
GS_HD uint64_t load_acquire(const uint64_t *p) {
#if defined(__CUDA_ARCH__)
  uint64_t v;
  asm volatile("ld.acquire.sys.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}
GS_HD uint32_t load_acquire(const uint32_t *p) {
#if defined(__CUDA_ARCH__)
  uint32_t v;
  asm volatile("ld.acquire.sys.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}
GS_HD int32_t load_acquire(const int32_t *p) {
  return static_cast<int32_t>(load_acquire(reinterpret_cast<const uint32_t *>(p)));
}
// Relaxed loads at system scope: never a stale cached copy, but not ordered
// with each other, so several are in flight across PCIe at once. Acting on what
// they return needs fence_acquire() first (a relaxed read followed by the
// fence is an acquire of what was read).
GS_HD uint64_t load_relaxed(const uint64_t *p) {
#if defined(__CUDA_ARCH__)
  uint64_t v;
  asm volatile("ld.relaxed.sys.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
#else
  return __atomic_load_n(p, __ATOMIC_RELAXED);
#endif
}
GS_HD uint32_t load_relaxed(const uint32_t *p) {
#if defined(__CUDA_ARCH__)
  uint32_t v;
  asm volatile("ld.relaxed.sys.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
#else
  return __atomic_load_n(p, __ATOMIC_RELAXED);
#endif
}
// Two 8-byte words (16-byte aligned) in one relaxed load; each word is read
// atomically, the pair is not.
GS_HD void load_relaxed_x2(const uint64_t *p, uint64_t *a, uint64_t *b) {
#if defined(__CUDA_ARCH__)
  asm volatile("ld.relaxed.sys.v2.u64 {%0,%1}, [%2];" : "=l"(*a), "=l"(*b) : "l"(p) : "memory");
#else
  *a = __atomic_load_n(p, __ATOMIC_RELAXED);
  *b = __atomic_load_n(p + 1, __ATOMIC_RELAXED);
#endif
}
// The same with acquire: later loads see what was published before them.
GS_HD void load_acquire_x2(const uint64_t *p, uint64_t *a, uint64_t *b) {
#if defined(__CUDA_ARCH__)
  asm volatile("ld.acquire.sys.v2.u64 {%0,%1}, [%2];" : "=l"(*a), "=l"(*b) : "l"(p) : "memory");
#else
  *a = __atomic_load_n(p, __ATOMIC_ACQUIRE);
  *b = __atomic_load_n(p + 1, __ATOMIC_ACQUIRE);
#endif
}
// Four 4-byte words (16-byte aligned) in one relaxed load.
GS_HD void load_relaxed_x4(const uint32_t *p, uint32_t *w) {
#if defined(__CUDA_ARCH__)
  asm volatile("ld.relaxed.sys.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
               : "l"(p)
               : "memory");
#else
  for (int i = 0; i < 4; ++i) w[i] = __atomic_load_n(p + i, __ATOMIC_RELAXED);
#endif
}
// Makes the relaxed loads before it acquires: later loads see at least what
// was published before the values they returned.
GS_HD void fence_acquire() {
#if defined(__CUDA_ARCH__)
  asm volatile("fence.acq_rel.sys;" ::: "memory");
#else
  std::atomic_thread_fence(std::memory_order_acquire);
#endif
}

GS_HD void store_relaxed(uint64_t *p, uint64_t v) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.relaxed.sys.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
  __atomic_store_n(p, v, __ATOMIC_RELAXED);
#endif
}
// A 64-byte line as four 16-byte stores back to back (no fence between them,
// so the GPU can send them as one write); each 8-byte word is single-copy
// atomic, the line is not.
GS_HD void store_line_relaxed(uint64_t *dst, const uint64_t *src) {
#if defined(__CUDA_ARCH__)
  for (int i = 0; i < 8; i += 2)
    asm volatile("st.relaxed.sys.v2.u64 [%0], {%1,%2};" ::"l"(dst + i), "l"(src[i]), "l"(src[i + 1]) : "memory");
#else
  for (int i = 0; i < 8; ++i) __atomic_store_n(dst + i, src[i], __ATOMIC_RELAXED);
#endif
}
// Orders this thread's earlier writes (and what it saw others write) before
// its later ones, for every observer.
GS_HD void fence_release() {
#if defined(__CUDA_ARCH__)
  asm volatile("fence.acq_rel.sys;" ::: "memory");
#else
  std::atomic_thread_fence(std::memory_order_release);
#endif
}

// Publishes a word after this thread's earlier writes.
GS_HD void store_release(uint64_t *p, uint64_t v) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.release.sys.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

// Atomics on GPU-private words (device scope: only GPU threads race on them).
GS_HD unsigned long long atomic_add(unsigned long long *p, unsigned long long v) {
#if defined(__CUDA_ARCH__)
  return atomicAdd(p, v);
#else
  return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL);
#endif
}
GS_HD uint32_t atomic_add(uint32_t *p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  return atomicAdd(p, v);
#else
  return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL);
#endif
}
GS_HD void atomic_max(unsigned long long *p, unsigned long long v) {
#if defined(__CUDA_ARCH__)
  atomicMax(p, v);
#else
  unsigned long long cur = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (cur < v && !__atomic_compare_exchange_n(p, &cur, v, true, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
  }
#endif
}
// Returns the value found (== expected on success).
GS_HD uint32_t atomic_cas(uint32_t *p, uint32_t expected, uint32_t desired) {
#if defined(__CUDA_ARCH__)
  return atomicCAS(p, expected, desired);
#else
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  return expected;
#endif
}

GS_HD uint64_t now_ns() {
#if defined(__CUDA_ARCH__)
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  return host::now_ns();
#endif
}

// Waiting for the proxy: short pauses first (a doorbell round trip is ~2 µs on
// a GPU), then longer ones. On the host backend emulated threads may outnumber
// cores many times: they yield for the first ~50 µs of a wait, then sleep.
struct Backoff {
  unsigned n = 0;
  // Whether this wait should look at the stop flag now. Every waiting block
  // reading one host line on every poll serializes them all at the host
  // bridge (~1 µs per read, measured: 132 blocks polling one line get 0.9 M
  // reads/s together, their own lines 88 M/s), so short waits never look and
  // long ones look every 16th poll.
  GS_HD bool stop_check_due() const { return n >= 48 && (n & 15) == 0; }
#if !defined(__CUDA_ARCH__)
  uint64_t since = 0;
#endif
  GS_HD void pause() {
#if defined(__CUDA_ARCH__)
    // Each poll of host memory is a PCIe round trip (~1 µs) already: spin for
    // the first ones (no added latency), then sleep 256 ns .. 2 µs.
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
        const long us = waited < 1000000 ? 10 : (waited < 10000000 ? 50 : 100);
        timespec ts{0, us * 1000};
        nanosleep(&ts, nullptr);
      }
    }
#endif
    ++n;
  }
};

}  // namespace prim

// ======================================================================
// Cooperative scopes: a threadblock, or one warp.
// ======================================================================

struct BlockScope {
  GS_HD static unsigned rank() { return prim::thread_rank(); }
  GS_HD static unsigned size() { return prim::block_dim(); }
  GS_HD static bool leader() { return rank() == 0; }
  GS_HD static void sync() { prim::sync_block(); }

  // rank 0's value of v, in every thread.
  template <class T>
  GS_HD static T broadcast(const T &v) {
    static_assert(sizeof(T) <= host::kScratchWords * 8, "broadcast up to 32 bytes");
#if defined(__CUDA_ARCH__)
    __shared__ unsigned long long scratch[host::kScratchWords];
#else
    unsigned long long *scratch = host::t_thread.block->scratch;
#endif
    if (leader()) memcpy(scratch, &v, sizeof(T));
    sync();
    T out;
    memcpy(&out, scratch, sizeof(T));
    sync();  // nobody overwrites the scratch before everyone has read it
    return out;
  }

  // How many threads passed pred == true.
  GS_HD static unsigned count(bool pred) {
#if defined(__CUDA_ARCH__)
    return static_cast<unsigned>(__syncthreads_count(pred));
#else
    std::atomic<unsigned> &counter = host::t_thread.block->counter;
    if (leader()) counter.store(0, std::memory_order_relaxed);
    sync();
    if (pred) counter.fetch_add(1, std::memory_order_relaxed);
    sync();
    const unsigned n = counter.load(std::memory_order_relaxed);
    sync();
    return n;
#endif
  }
};

struct WarpScope {
  GS_HD static unsigned rank() { return prim::lane(); }
  GS_HD static unsigned size() { return prim::warp_size(); }
  GS_HD static bool leader() { return rank() == 0; }
  GS_HD static void sync() { prim::sync_warp(); }

  template <class T>
  GS_HD static T broadcast(const T &v) {
    static_assert(sizeof(T) <= host::kScratchWords * 8, "broadcast up to 32 bytes");
#if defined(__CUDA_ARCH__)
    constexpr unsigned kWords = (sizeof(T) + 3) / 4;
    unsigned words[kWords] = {};
    memcpy(words, &v, sizeof(T));
    for (unsigned i = 0; i < kWords; ++i) words[i] = __shfl_sync(0xffffffffu, words[i], 0);
    T out;
    memcpy(&out, words, sizeof(T));
    return out;
#else
    unsigned long long *scratch =
        host::t_thread.block->warp_scratch.get() + prim::warp_index() * host::kScratchWords;
    if (leader()) memcpy(scratch, &v, sizeof(T));
    sync();
    T out;
    memcpy(&out, scratch, sizeof(T));
    sync();
    return out;
#endif
  }

  GS_HD static unsigned count(bool pred) {
#if defined(__CUDA_ARCH__)
    return static_cast<unsigned>(__popc(__ballot_sync(0xffffffffu, pred)));
#else
    std::atomic<unsigned> &counter = host::t_thread.block->warp_counters[prim::warp_index()];
    if (leader()) counter.store(0, std::memory_order_relaxed);
    sync();
    if (pred) counter.fetch_add(1, std::memory_order_relaxed);
    sync();
    const unsigned n = counter.load(std::memory_order_relaxed);
    sync();
    return n;
#endif
  }
};

// ======================================================================
// The socket calls.
// ======================================================================
namespace detail {

using namespace channel;

// Copies n bytes with every thread of the scope. On the GPU consecutive threads
// take consecutive 16-byte words (coalesced); on the host each thread takes one
// contiguous chunk (no false sharing).
template <class S>
GS_HD void group_copy(uint8_t *dst, const uint8_t *src, size_t n, bool src_is_ring) {
  const unsigned r = S::rank(), k = S::size();
#if defined(__CUDA_ARCH__)
  size_t head = 0;
  if (((reinterpret_cast<uintptr_t>(dst) ^ reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
    head = (16 - (reinterpret_cast<uintptr_t>(src) & 15)) & 15;
    if (head > n) head = n;
    const size_t words = (n - head) / 16;
    const uint4 *s4 = reinterpret_cast<const uint4 *>(src + head);
    uint4 *d4 = reinterpret_cast<uint4 *>(dst + head);
    // Ring bytes are written by the NIC / the proxy's transport: load them
    // uncached (__ldcv) so no stale line from an earlier lap is used.
    // Four loads in flight per thread before the first store: host memory is
    // a PCIe round trip away, and a store may alias the next load.
    size_t i = r;
    if (src_is_ring) {
      for (; i + 3 * k < words; i += 4 * k) {
        const uint4 a = __ldcv(s4 + i), b = __ldcv(s4 + i + k), e = __ldcv(s4 + i + 2 * k),
                    f = __ldcv(s4 + i + 3 * k);
        d4[i] = a;
        d4[i + k] = b;
        d4[i + 2 * k] = e;
        d4[i + 3 * k] = f;
      }
      for (; i < words; i += k) d4[i] = __ldcv(s4 + i);
    } else {
      for (; i + 3 * k < words; i += 4 * k) {
        const uint4 a = s4[i], b = s4[i + k], e = s4[i + 2 * k], f = s4[i + 3 * k];
        d4[i] = a;
        d4[i + k] = b;
        d4[i + 2 * k] = e;
        d4[i + 3 * k] = f;
      }
      for (; i < words; i += k) d4[i] = s4[i];
    }
    for (size_t i = r; i < head; i += k) dst[i] = src_is_ring ? __ldcv(src + i) : src[i];
    for (size_t i = head + words * 16 + r; i < n; i += k) dst[i] = src_is_ring ? __ldcv(src + i) : src[i];
  } else {
    for (size_t i = r; i < n; i += k) dst[i] = src_is_ring ? __ldcv(src + i) : src[i];
  }
#else
  (void)src_is_ring;
  const size_t chunk = ((n + k - 1) / k + 63) & ~size_t(63);
  const size_t begin = static_cast<size_t>(r) * chunk;
  if (begin < n) memcpy(dst + begin, src + begin, (n - begin < chunk ? n - begin : chunk));
#endif
}

GS_HD bool valid_slot(const DeviceContext &c, int s) { return s >= 0 && static_cast<uint32_t>(s) < c.max_sockets; }

GS_HD bool stop_requested(const DeviceContext &c) { return prim::load_acquire(&c.shared->stop) != 0; }

// One poll of a socket's status line: two 16-byte relaxed loads and one
// 16-byte acquire load of the counters, in flight together (one PCIe round
// trip, not one per field). The counters are acquires; the state words are
// not ordered with them: before trusting a terminal state, fence_acquire()
// and re-read the counters (the proxy publishes counters before the state
// bits that depend on them).
struct StatusView {
  uint64_t recv_write, send_done;
  uint32_t state, accept_queued;
  int32_t error, send_error;
  uint32_t buffer;
};

GS_HD StatusView read_status(const DeviceContext &c, const SocketStatus *st) {
  (void)c;
  StatusView v;
  uint32_t a[4], b[4];
  prim::load_relaxed_x4(&st->state, a);    // state, releases, ctrl_done, ctrl_result
  prim::load_relaxed_x4(&st->buffer, b);   // buffer, accept_queued, error, send_error
  // The counters last, with acquire: ring bytes published before them are
  // visible to the loads after this one, with no separate fence.
  prim::load_acquire_x2(&st->recv_write, &v.recv_write, &v.send_done);
  v.state = a[0];
  v.buffer = b[0];
  v.accept_queued = b[1];
  v.error = static_cast<int32_t>(b[2]);
  v.send_error = static_cast<int32_t>(b[3]);
  return v;
}
// Counters again, after a fence_acquire() that followed the read of the state.
GS_HD void reread_counters(const SocketStatus *st, StatusView *v) {
  prim::load_relaxed_x2(&st->recv_write, &v->recv_write, &v->send_done);
}

GS_HD uint64_t deadline_after(int timeout_ms) {
  return timeout_ms < 0 ? ~uint64_t(0) : prim::now_ns() + static_cast<uint64_t>(timeout_ms) * 1000000ull;
}

// Leader only. Takes a ticket, waits for room on the ring (back-pressure: the
// proxy has not consumed `entries` requests ago), writes the entry, publishes seq.
GS_HD int push_request(const DeviceContext &c, const Request &r, bool release = false) {
  const unsigned long long ticket = prim::atomic_add(c.ticket, 1ull);
  // Room on the ring: first against the highest `consumed` any producer saw
  // (GPU memory, cheap), and only when that is not enough across PCIe.
  if (ticket - *reinterpret_cast<volatile unsigned long long *>(c.consumed_seen) > c.request_mask) {
    prim::Backoff backoff;
    for (;;) {
      const unsigned long long consumed = prim::load_acquire(&c.shared->consumed);
      if (ticket - consumed <= c.request_mask) {
        if (c.consumed_seen) prim::atomic_max(c.consumed_seen, consumed);
        break;
      }
      if (backoff.stop_check_due() && stop_requested(c)) return -ESHUTDOWN;  // the ticket dies with the proxy
      backoff.pause();
    }
  }
  Request *e = c.requests + (ticket & c.request_mask);
  Request w = r;
  w.seq = ticket + 1;
  w.check = request_check(reinterpret_cast<const uint64_t *>(&w), w.addr_len > 0);
  const uint64_t *src = reinterpret_cast<const uint64_t *>(&w);
  uint64_t *dst = reinterpret_cast<uint64_t *>(e);
  if (r.addr_len > 0)  // the address line (covered by check too)
    for (unsigned i = 8; i < 12; ++i) prim::store_relaxed(dst + i, src[i]);
  // Release (a fence, ~0.7 µs on an H100): only when this block wrote ring
  // bytes the proxy will send (ordered before us by the block's barrier). The
  // request itself needs none: the proxy takes it only once check matches.
  if (release) prim::fence_release();
  prim::store_line_relaxed(dst, src);
  return 0;
}

GS_HD bool ring_has_room(const DeviceContext &c) {
  const unsigned long long issued_now = *reinterpret_cast<volatile unsigned long long *>(c.ticket);
  if (c.consumed_seen && issued_now - *reinterpret_cast<volatile unsigned long long *>(c.consumed_seen) <= c.request_mask)
    return true;
  const unsigned long long issued = *reinterpret_cast<volatile unsigned long long *>(c.ticket);
  return issued - prim::load_acquire(&c.shared->consumed) <= c.request_mask;
}

GS_HD Request make_request(const DeviceContext &c, int s, uint32_t op) {
  Request r{};
  const DeviceSocket &d = c.sockets[s];
  r.op = op;
  r.slot = static_cast<uint32_t>(s);
  r.gen = d.gen;
  r.send_tail = d.send_tail;
  r.recv_read = d.recv_read;
  return r;
}

// Leader only: a request the proxy answers at once, then its result.
GS_HD int control(const DeviceContext &c, int s, const Request &request) {
  Request r = request;
  DeviceSocket &d = c.sockets[s];
  r.ctrl_seq = ++d.ctrl_seq;
  int rc = push_request(c, r);
  if (rc < 0) return rc;
  // ctrl_done and ctrl_result are one 8-byte word the proxy writes at once.
  const uint64_t *word = reinterpret_cast<const uint64_t *>(&c.status[s].ctrl_done);
  prim::Backoff backoff;
  for (;;) {
    const uint64_t v = prim::load_acquire(word);  // what the proxy published before the answer is visible after it
    if (static_cast<uint32_t>(v) == r.ctrl_seq) return static_cast<int32_t>(static_cast<uint32_t>(v >> 32));
    if (backoff.stop_check_due() && stop_requested(c)) return -ESHUTDOWN;
    backoff.pause();
  }
}

// Leader only: claims a free slot. A slot is free when the GPU has claimed it
// as often as the proxy has released it.
GS_HD int claim_slot(const DeviceContext &c, bool nonblocking) {
  const uint32_t start = prim::atomic_add(c.claim_cursor, 1u);
  for (uint32_t i = 0; i < c.max_sockets; ++i) {
    const uint32_t slot = (start + i) % c.max_sockets;
    const uint32_t released = prim::load_acquire(&c.status[slot].releases);
    if (prim::atomic_cas(&c.claims[slot], released, released + 1) != released) continue;
    DeviceSocket &d = c.sockets[slot];
    d.send_tail = 0;
    d.recv_read = 0;
    d.send_done_seen = 0;
    d.gen = released + 1;
    d.ctrl_seq = 0;
    d.buffer = 0;
    d.flags = kDevOpen | (nonblocking ? kDevNonblocking : 0u);
    return static_cast<int>(slot);
  }
  return -EMFILE;
}

GS_HD int open_socket(const DeviceContext &c, int s) {
  if (!valid_slot(c, s) || !(c.sockets[s].flags & kDevOpen)) return -EBADF;
  return 0;
}

// ---- per-call plans: what the leader found, broadcast to the scope ----
struct Plan {
  int64_t n;        // bytes to move now (> 0), or the call's result (<= 0)
  uint64_t offset;  // ring offset
  uint64_t ring;    // ring base (a GPU pointer)
};

template <class S>
GS_HD int socket(const DeviceContext &c, int domain, int type) {
  int rc = 0;
  if (S::leader()) {
    if (domain != AF_INET && domain != AF_INET6) rc = -EAFNOSUPPORT;
    else if ((type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC)) != SOCK_STREAM) rc = -EPROTONOSUPPORT;
    else rc = claim_slot(c, (type & SOCK_NONBLOCK) != 0);
  }
  return S::broadcast(rc);
}

template <class S>
GS_HD int bind(const DeviceContext &c, int s, const sockaddr *addr, socklen_t len) {
  int rc = 0;
  if (S::leader()) {
    rc = open_socket(c, s);
    if (rc == 0 && (addr == nullptr || len < sizeof(sa_family_t) || len > kMaxAddrLen)) rc = -EINVAL;
    if (rc == 0) {
      Request r = make_request(c, s, kOpBind);
      r.addr_len = static_cast<uint32_t>(len);
      memcpy(r.addr, addr, len);
      rc = control(c, s, r);
    }
  }
  return S::broadcast(rc);
}

template <class S>
GS_HD int listen(const DeviceContext &c, int s, int backlog) {
  int rc = 0;
  if (S::leader()) {
    rc = open_socket(c, s);
    if (rc == 0) {
      Request r = make_request(c, s, kOpListen);
      r.arg0 = backlog;
      rc = control(c, s, r);
    }
  }
  return S::broadcast(rc);
}

// Leader: waits for the connect started earlier on s.
GS_HD int wait_connected(const DeviceContext &c, int s, uint64_t deadline, bool nonblocking) {
  DeviceSocket &d = c.sockets[s];
  const SocketStatus *st = c.status + s;
  prim::Backoff backoff;
  for (;;) {
    const StatusView v = read_status(c, st);
    if (v.state & kStConnected) {
      prim::fence_acquire();
      d.flags &= ~kDevConnecting;
      return 0;
    }
    if (v.state & (kStFailed | kStError)) {
      prim::fence_acquire();
      d.flags &= ~kDevConnecting;
      const int err = prim::load_acquire(&st->error);
      return err < 0 ? err : -ECONNREFUSED;
    }
    if (nonblocking) return -EALREADY;
    if (backoff.stop_check_due() && stop_requested(c)) return -ESHUTDOWN;
    if (prim::now_ns() >= deadline) return -ETIMEDOUT;
    backoff.pause();
  }
}

template <class S>
GS_HD int connect(const DeviceContext &c, int s, const sockaddr *addr, socklen_t len, int timeout_ms) {
  int rc = 0;
  if (S::leader()) {
    rc = open_socket(c, s);
    DeviceSocket &d = c.sockets[s];
    const bool nonblocking = rc == 0 && (d.flags & kDevNonblocking);
    if (rc == 0 && (d.flags & kDevConnecting)) {
      rc = wait_connected(c, s, deadline_after(timeout_ms), nonblocking);
    } else if (rc == 0 && (prim::load_acquire(&c.status[s].state) & kStConnected)) {
      rc = -EISCONN;
    } else if (rc == 0) {
      if (addr == nullptr || len < sizeof(sa_family_t) || len > kMaxAddrLen) rc = -EINVAL;
      if (rc == 0) {
        Request r = make_request(c, s, kOpConnect);
        r.addr_len = static_cast<uint32_t>(len);
        memcpy(r.addr, addr, len);
        rc = control(c, s, r);
      }
      if (rc == 0) {
        d.buffer = prim::load_acquire(&c.status[s].buffer);  // published before the completion
        d.flags |= kDevConnecting;
        rc = nonblocking ? -EINPROGRESS : wait_connected(c, s, deadline_after(timeout_ms), false);
      }
    }
  }
  return S::broadcast(rc);
}

template <class S>
GS_HD int accept(const DeviceContext &c, int listener, int flags, int timeout_ms) {
  int rc = 0;
  if (S::leader()) {
    rc = open_socket(c, listener);
    const bool nonblocking = rc == 0 && (c.sockets[listener].flags & kDevNonblocking);
    const uint64_t deadline = deadline_after(timeout_ms);
    const SocketStatus *lst = c.status + listener;
    int slot = -1;
    prim::Backoff backoff;
    while (rc == 0) {
      const StatusView v = read_status(c, lst);
      if (!(v.state & kStListening)) {
        rc = -EINVAL;
        break;
      }
      if (v.accept_queued > 0) {
        if (slot < 0) {
          slot = claim_slot(c, (flags & SOCK_NONBLOCK) != 0);
          if (slot < 0) {
            rc = slot;
            break;
          }
        }
        Request r = make_request(c, slot, kOpAccept);
        r.arg0 = listener;
        r.arg1 = static_cast<int32_t>(c.sockets[listener].gen);
        const int got = control(c, slot, r);
        if (got == 0) {
          c.sockets[slot].buffer = prim::load_acquire(&c.status[slot].buffer);
          rc = slot;
          slot = -1;
          break;
        }
        if (got != -EAGAIN) {  // -EAGAIN: another block took that connection
          rc = got;
          break;
        }
        continue;
      }
      if (nonblocking) rc = -EAGAIN;
      else if (backoff.stop_check_due() && stop_requested(c)) rc = -ESHUTDOWN;
      else if (prim::now_ns() >= deadline) rc = -ETIMEDOUT;
      else backoff.pause();
    }
    if (slot >= 0) {  // claimed for nothing: hand it back
      push_request(c, make_request(c, slot, kOpClose));
      c.sockets[slot].flags = 0;
    }
  }
  return S::broadcast(rc);
}

// Leader: how much may be read now, or the result if nothing can be.
GS_HD Plan recv_plan(const DeviceContext &c, int s, size_t want, bool dontwait, uint64_t deadline) {
  Plan p{0, 0, 0};
  if (int rc = open_socket(c, s); rc < 0) {
    p.n = rc;
    return p;
  }
  DeviceSocket &d = c.sockets[s];
  if (d.flags & kDevShutRd) return p;  // 0: EOF after our own SHUT_RD
  const SocketStatus *st = c.status + s;
  prim::Backoff backoff;
  for (;;) {
    StatusView v = read_status(c, st);
    const uint32_t state = v.state;
    const bool terminal = (state & (kStError | kStFailed | kStRecvClosed | kStHangup)) != 0;
    if (terminal && v.recv_write <= d.recv_read) {
      prim::fence_acquire();  // the state was read relaxed: order the counters after it
      reread_counters(st, &v);  // counters are published before the state bits
    }
    const uint64_t written = v.recv_write;
    if (written > d.recv_read) {
      const uint64_t offset = d.recv_read % c.rbuf_size;
      uint64_t n = written - d.recv_read;
      if (n > c.rbuf_size - offset) n = c.rbuf_size - offset;
      if (n > want) n = want;
      p.n = static_cast<int64_t>(n);
      p.offset = offset;
      p.ring = reinterpret_cast<uint64_t>(c.rbufs + static_cast<size_t>(d.buffer) * c.rbuf_size);
      return p;
    }
    if (state & (kStError | kStFailed)) {
      const int err = prim::load_acquire(&st->error);
      p.n = err < 0 ? err : -ECONNRESET;
      return p;
    }
    if (state & (kStRecvClosed | kStHangup)) return p;  // EOF
    if (!(state & kStConnected) && !(d.flags & kDevConnecting)) {
      p.n = -ENOTCONN;
      return p;
    }
    if (dontwait) p.n = -EAGAIN;
    else if (backoff.stop_check_due() && stop_requested(c)) p.n = -ESHUTDOWN;
    else if (prim::now_ns() >= deadline) p.n = -ETIMEDOUT;
    if (p.n < 0) return p;
    backoff.pause();
  }
}

template <class S>
GS_HD ssize_t recv(const DeviceContext &c, int s, void *buf, size_t len, int flags, int timeout_ms) {
  const bool waitall = (flags & MSG_WAITALL) != 0;
  const uint64_t deadline = S::leader() ? deadline_after(timeout_ms) : 0;  // only the leader waits
  const bool dontwait = (flags & MSG_DONTWAIT) || (valid_slot(c, s) && (c.sockets[s].flags & kDevNonblocking));
  size_t done = 0;
  while (done < len) {
    Plan p{};
    if (S::leader()) p = recv_plan(c, s, len - done, dontwait, deadline);
    p = S::broadcast(p);
    if (p.n <= 0) return done > 0 ? static_cast<ssize_t>(done) : static_cast<ssize_t>(p.n);
    const uint8_t *ring = reinterpret_cast<const uint8_t *>(p.ring);
    group_copy<S>(static_cast<uint8_t *>(buf) + done, ring + p.offset, static_cast<size_t>(p.n), true);
    S::sync();  // every thread is done reading before the space is handed back
    if (S::leader()) {
      DeviceSocket &d = c.sockets[s];
      const uint64_t before = d.recv_read;
      d.recv_read += static_cast<uint64_t>(p.n);
      // The core advertises the ring in halves: consumption matters to the
      // proxy only when it completes a half, so only then is it worth a doorbell.
      const uint64_t half = c.rbuf_size / 2;
      if (before / half != d.recv_read / half) push_request(c, make_request(c, s, kOpData));
    }
    done += static_cast<size_t>(p.n);
    if (!waitall) break;
  }
  return static_cast<ssize_t>(done);
}

// Leader: where the next bytes may go into the send ring, or the result.
GS_HD Plan send_plan(const DeviceContext &c, int s, size_t want, bool dontwait, uint64_t deadline) {
  Plan p{0, 0, 0};
  if (int rc = open_socket(c, s); rc < 0) {
    p.n = rc;
    return p;
  }
  DeviceSocket &d = c.sockets[s];
  if (d.flags & kDevShutWr) {
    p.n = -EPIPE;
    return p;
  }
  // Fast path: room known from an earlier look at send_done (which only grows)
  // needs no PCIe round trip. Errors then show once the ring fills, as with a
  // TCP send buffer.
  if (d.flags & kDevConnectedSeen) {
    const uint64_t used = d.send_tail - d.send_done_seen;
    if (used < c.sbuf_size && (!dontwait || ring_has_room(c))) {
      const uint64_t offset = d.send_tail % c.sbuf_size;
      uint64_t n = c.sbuf_size - used;
      if (n > c.sbuf_size - offset) n = c.sbuf_size - offset;
      if (n > want) n = want;
      p.n = static_cast<int64_t>(n);
      p.offset = offset;
      p.ring = reinterpret_cast<uint64_t>(c.sbufs + static_cast<size_t>(d.buffer) * c.sbuf_size);
      return p;
    }
  }
  const SocketStatus *st = c.status + s;
  prim::Backoff backoff;
  for (;;) {
    const StatusView v = read_status(c, st);
    const uint32_t state = v.state;
    if (v.send_error < 0) {
      p.n = v.send_error;
      return p;
    }
    if (state & (kStError | kStFailed)) {
      prim::fence_acquire();
      const int err = prim::load_acquire(&st->error);
      p.n = err < 0 ? err : -ECONNRESET;
      return p;
    }
    if (state & kStConnected) {
      const uint64_t used = d.send_tail - v.send_done;
      if (used < c.sbuf_size && (!dontwait || ring_has_room(c))) {
        // send_done was an acquire: the transport is done with that space.
        d.send_done_seen = v.send_done;
        d.flags |= kDevConnectedSeen;
        const uint64_t offset = d.send_tail % c.sbuf_size;
        uint64_t n = c.sbuf_size - used;
        if (n > c.sbuf_size - offset) n = c.sbuf_size - offset;
        if (n > want) n = want;
        p.n = static_cast<int64_t>(n);
        p.offset = offset;
        p.ring = reinterpret_cast<uint64_t>(c.sbufs + static_cast<size_t>(d.buffer) * c.sbuf_size);
        return p;
      }
    } else if (!(d.flags & kDevConnecting)) {
      p.n = -ENOTCONN;
      return p;
    }
    if (dontwait) p.n = -EAGAIN;
    else if (backoff.stop_check_due() && stop_requested(c)) p.n = -ESHUTDOWN;
    else if (prim::now_ns() >= deadline) p.n = -ETIMEDOUT;
    if (p.n < 0) return p;
    backoff.pause();
  }
}

template <class S>
GS_HD ssize_t send(const DeviceContext &c, int s, const void *buf, size_t len, int flags, int timeout_ms) {
  const uint64_t deadline = S::leader() ? deadline_after(timeout_ms) : 0;  // only the leader waits
  const bool dontwait = (flags & MSG_DONTWAIT) || (valid_slot(c, s) && (c.sockets[s].flags & kDevNonblocking));
  size_t done = 0;
  do {
    Plan p{};
    if (S::leader()) p = send_plan(c, s, len - done, dontwait, deadline);
    p = S::broadcast(p);
    if (p.n < 0 || (p.n == 0 && len > 0))
      return done > 0 ? static_cast<ssize_t>(done) : static_cast<ssize_t>(p.n);
    if (len == 0) return 0;
    uint8_t *ring = reinterpret_cast<uint8_t *>(p.ring);
    group_copy<S>(ring + p.offset, static_cast<const uint8_t *>(buf) + done, static_cast<size_t>(p.n), false);
    // No fence per thread: the barrier orders every thread's ring writes before
    // the leader's release store of the request's seq, which is cumulative, so
    // the proxy that acquires seq sees them all.
    S::sync();
    if (S::leader()) {
      c.sockets[s].send_tail += static_cast<uint64_t>(p.n);
      push_request(c, make_request(c, s, kOpData), /*release=*/true);
    }
    done += static_cast<size_t>(p.n);
  } while (done < len);  // MSG_DONTWAIT: the plan says -EAGAIN once the ring is full
  return static_cast<ssize_t>(done);
}

template <class S>
GS_HD int shutdown(const DeviceContext &c, int s, int how) {
  int rc = 0;
  if (S::leader()) {
    rc = open_socket(c, s);
    if (rc == 0 && how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) rc = -EINVAL;
    if (rc == 0) {
      Request r = make_request(c, s, kOpShutdown);
      r.arg0 = how;
      rc = control(c, s, r);
      if (rc == 0) {
        if (how == SHUT_RD || how == SHUT_RDWR) c.sockets[s].flags |= kDevShutRd;
        if (how == SHUT_WR || how == SHUT_RDWR) c.sockets[s].flags |= kDevShutWr;
      }
    }
  }
  return S::broadcast(rc);
}

template <class S>
GS_HD int close(const DeviceContext &c, int s) {
  int rc = 0;
  if (S::leader()) {
    rc = open_socket(c, s);
    if (rc == 0) {
      rc = push_request(c, make_request(c, s, kOpClose));  // flushed and released by the proxy
      c.sockets[s].flags = 0;
    }
  }
  return S::broadcast(rc);
}

// poll(2) events of one socket now (any thread).
GS_HD short ready_events(const DeviceContext &c, const gpollfd &f) {
  if (f.fd < 0) return 0;
  if (!valid_slot(c, f.fd) || !(c.sockets[f.fd].flags & kDevOpen)) return POLLNVAL;
  const DeviceSocket &d = c.sockets[f.fd];
  const StatusView v = read_status(c, c.status + f.fd);  // one round trip per socket
  const uint32_t state = v.state;
  short ev = 0;
  if (state & kStListening) {
    if (v.accept_queued > 0) ev |= POLLIN | POLLRDNORM;
  } else {
    const bool eof = (state & (kStRecvClosed | kStHangup | kStError | kStFailed)) != 0;
    if (v.recv_write > d.recv_read || eof || (d.flags & kDevShutRd)) ev |= POLLIN | POLLRDNORM;
    if ((state & kStConnected) && !(state & kStError) && v.send_error == 0 && !(d.flags & kDevShutWr)) {
      const uint64_t free_bytes = c.sbuf_size - (d.send_tail - v.send_done);
      const uint64_t lowat = c.sbuf_size < 2048 ? c.sbuf_size : 2048;
      if (free_bytes >= lowat) ev |= POLLOUT | POLLWRNORM;
    }
    if ((state & kStRecvClosed) && !(state & (kStHangup | kStError))) ev |= POLLRDHUP;
    if (state & kStHangup) ev |= POLLHUP | POLLRDHUP;
    if (state & (kStError | kStFailed)) ev |= POLLERR | POLLHUP | POLLOUT;
  }
  return static_cast<short>(ev & (f.events | POLLERR | POLLHUP | POLLNVAL));
}

template <class S>
GS_HD int poll(const DeviceContext &c, gpollfd *fds, int nfds, int timeout_ms) {
  if (nfds < 0) return -EINVAL;
  uint64_t deadline = 0;
  if (S::leader()) deadline = deadline_after(timeout_ms);
  // Threads may still be reading the revents of the previous call: nobody
  // writes new ones before everyone has arrived.
  S::sync();
  prim::Backoff backoff;
  for (;;) {
    unsigned ready = 0;
    for (int base = 0; base < nfds; base += static_cast<int>(S::size())) {
      const int i = base + static_cast<int>(S::rank());
      bool hit = false;
      if (i < nfds) {
        fds[i].revents = ready_events(c, fds[i]);
        hit = fds[i].revents != 0;
      }
      ready += S::count(hit);
    }
    int verdict = 1;  // 1: wait more
    if (S::leader()) {
      if (ready > 0) verdict = static_cast<int>(ready);
      else if (timeout_ms == 0 || prim::now_ns() >= deadline) verdict = 0;
      else if (backoff.stop_check_due() && stop_requested(c)) verdict = -ESHUTDOWN;
      else verdict = -1000;  // keep waiting (distinct from every result)
    }
    verdict = S::broadcast(verdict);
    if (verdict != -1000) return verdict;
    backoff.pause();
  }
}

template <class S>
GS_HD bool should_stop(const DeviceContext &c) {
  bool stop = false;
  if (S::leader()) stop = stop_requested(c);
  return S::broadcast(stop);
}

// A request the proxy answers at once: one doorbell round trip.
template <class S>
GS_HD int nop(const DeviceContext &c, int s) {
  int rc = 0;
  if (S::leader()) {
    rc = open_socket(c, s);
    if (rc == 0) rc = control(c, s, make_request(c, s, kOpNop));
  }
  return S::broadcast(rc);
}

}  // namespace detail

// ---------------------------------------------------------------- block calls
// Every thread of the block calls with the same arguments; all get the result.

GS_HD int gsocket(const DeviceContext &c, int domain, int type, int protocol = 0) {
  (void)protocol;
  return detail::socket<BlockScope>(c, domain, type);
}
GS_HD int gbind(const DeviceContext &c, int s, const sockaddr *addr, socklen_t len) {
  return detail::bind<BlockScope>(c, s, addr, len);
}
GS_HD int glisten(const DeviceContext &c, int s, int backlog) { return detail::listen<BlockScope>(c, s, backlog); }
// flags: SOCK_NONBLOCK for the new socket. The listener's own mode decides
// whether gaccept waits.
GS_HD int gaccept(const DeviceContext &c, int s, int flags = 0, int timeout_ms = -1) {
  return detail::accept<BlockScope>(c, s, flags, timeout_ms);
}
GS_HD int gconnect(const DeviceContext &c, int s, const sockaddr *addr, socklen_t len, int timeout_ms = -1) {
  return detail::connect<BlockScope>(c, s, addr, len, timeout_ms);
}
// Blocking: returns once all len bytes are in the send ring. MSG_DONTWAIT:
// what fits now, or -EAGAIN.
GS_HD ssize_t gsend(const DeviceContext &c, int s, const void *buf, size_t len, int flags = 0,
                     int timeout_ms = -1) {
  return detail::send<BlockScope>(c, s, buf, len, flags, timeout_ms);
}
// What is available (at least 1 byte), 0 at EOF; MSG_WAITALL: all len bytes.
GS_HD ssize_t grecv(const DeviceContext &c, int s, void *buf, size_t len, int flags = 0, int timeout_ms = -1) {
  return detail::recv<BlockScope>(c, s, buf, len, flags, timeout_ms);
}
GS_HD int gshutdown(const DeviceContext &c, int s, int how) { return detail::shutdown<BlockScope>(c, s, how); }
GS_HD int gclose(const DeviceContext &c, int s) { return detail::close<BlockScope>(c, s); }
// Threads of the block share the fds; returns how many have revents, 0 on timeout.
GS_HD int gpoll(const DeviceContext &c, gpollfd *fds, int nfds, int timeout_ms) {
  return detail::poll<BlockScope>(c, fds, nfds, timeout_ms);
}
GS_HD bool gshould_stop(const DeviceContext &c) { return detail::should_stop<BlockScope>(c); }
GS_HD int gnop(const DeviceContext &c, int s) { return detail::nop<BlockScope>(c, s); }

// ---------------------------------------------------------------- warp calls
// Every lane of one warp calls with the same arguments.

GS_HD int gsocket_warp(const DeviceContext &c, int domain, int type, int protocol = 0) {
  (void)protocol;
  return detail::socket<WarpScope>(c, domain, type);
}
GS_HD int gbind_warp(const DeviceContext &c, int s, const sockaddr *addr, socklen_t len) {
  return detail::bind<WarpScope>(c, s, addr, len);
}
GS_HD int glisten_warp(const DeviceContext &c, int s, int backlog) { return detail::listen<WarpScope>(c, s, backlog); }
GS_HD int gaccept_warp(const DeviceContext &c, int s, int flags = 0, int timeout_ms = -1) {
  return detail::accept<WarpScope>(c, s, flags, timeout_ms);
}
GS_HD int gconnect_warp(const DeviceContext &c, int s, const sockaddr *addr, socklen_t len, int timeout_ms = -1) {
  return detail::connect<WarpScope>(c, s, addr, len, timeout_ms);
}
GS_HD ssize_t gsend_warp(const DeviceContext &c, int s, const void *buf, size_t len, int flags = 0,
                          int timeout_ms = -1) {
  return detail::send<WarpScope>(c, s, buf, len, flags, timeout_ms);
}
GS_HD ssize_t grecv_warp(const DeviceContext &c, int s, void *buf, size_t len, int flags = 0,
                          int timeout_ms = -1) {
  return detail::recv<WarpScope>(c, s, buf, len, flags, timeout_ms);
}
GS_HD int gshutdown_warp(const DeviceContext &c, int s, int how) { return detail::shutdown<WarpScope>(c, s, how); }
GS_HD int gclose_warp(const DeviceContext &c, int s) { return detail::close<WarpScope>(c, s); }
GS_HD int gpoll_warp(const DeviceContext &c, gpollfd *fds, int nfds, int timeout_ms) {
  return detail::poll<WarpScope>(c, fds, nfds, timeout_ms);
}
GS_HD bool gshould_stop_warp(const DeviceContext &c) { return detail::should_stop<WarpScope>(c); }
GS_HD int gnop_warp(const DeviceContext &c, int s) { return detail::nop<WarpScope>(c, s); }

// ---------------------------------------------------------------- helpers

// Kernel-side helpers that work on both backends (threadIdx/__syncthreads are
// CUDA-only; these are what a kernel written for both uses).
using prim::block_dim;
using prim::block_index;
using prim::grid_dim;
using prim::lane;
using prim::now_ns;
using prim::sync_block;
using prim::sync_warp;
using prim::thread_rank;
using prim::warp_index;
using prim::warp_size;

// Sleeps about ns nanoseconds (the GPU caps one __nanosleep at ~1 ms).
GS_HD void pause_ns(uint32_t ns) {
#if defined(__CUDA_ARCH__)
  __nanosleep(ns);
#else
  if (ns < 2000) {
    sched_yield();
  } else {
    timespec ts{0, static_cast<long>(ns)};
    nanosleep(&ts, nullptr);
  }
#endif
}

// An IPv4 address for gbind/gconnect, built without htons (not a device function).
GS_HD sockaddr_in ipv4_address(uint8_t a, uint8_t b, uint8_t c, uint8_t d, uint16_t port) {
  sockaddr_in s{};
  s.sin_family = AF_INET;
  uint8_t *p = reinterpret_cast<uint8_t *>(&s.sin_port);
  p[0] = static_cast<uint8_t>(port >> 8);
  p[1] = static_cast<uint8_t>(port);
  uint8_t *q = reinterpret_cast<uint8_t *>(&s.sin_addr.s_addr);
  q[0] = a;
  q[1] = b;
  q[2] = c;
  q[3] = d;
  return s;
}

// ======================================================================
// Running kernels: the same functor on the GPU or on host threads.
// ======================================================================

enum class Backend : uint8_t { kHost, kCuda };

inline const char *backend_name(Backend b) { return b == Backend::kCuda ? "cuda" : "host"; }

struct LaunchShape {
  unsigned blocks = 1;
  unsigned threads = 32;
  unsigned host_warp_size = 0;  // host backend: 0 = min(32, threads); CUDA warps are 32
};

// True when this binary has CUDA code and a GPU is present.
inline bool cuda_available() {
#if defined(__CUDACC__)
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
  return false;
#endif
}

// The GPU when there is one (and force_host is false), else the host backend.
inline Backend choose_backend(bool force_host) {
  return !force_host && cuda_available() ? Backend::kCuda : Backend::kHost;
}

#if defined(__CUDACC__)
template <class F>
__global__ void gpusock_kernel_entry(F kernel) {
  kernel();
}
#endif

// A running grid. The functor is copied by value (as a kernel parameter) and
// needs a GS_HD operator()() const.
class Grid {
 public:
  Grid() = default;
  Grid(const Grid &) = delete;
  Grid &operator=(const Grid &) = delete;
  ~Grid() { wait(); }

  template <class F>
  int start(Backend backend, const LaunchShape &shape, const F &kernel) {
    backend_ = backend;
    if (backend == Backend::kHost) {
      unsigned warp = shape.host_warp_size ? shape.host_warp_size : (shape.threads < 32 ? shape.threads : 32);
      return host_.start(shape.blocks, shape.threads, warp, kernel);
    }
#if defined(__CUDACC__)
    if (shape.threads % 32 != 0) return -EINVAL;  // warp calls need whole warps
    if (cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess) return -ENODEV;
    gpusock_kernel_entry<F><<<shape.blocks, shape.threads, 0, stream_>>>(kernel);
    if (cudaGetLastError() != cudaSuccess) return -EINVAL;
    running_ = true;
    return 0;
#else
    return -ENODEV;
#endif
  }

  // Waits for the kernel to finish: 0, or -EIO if it failed on the GPU.
  int wait() {
    if (backend_ == Backend::kHost) {
      host_.join();
      return 0;
    }
#if defined(__CUDACC__)
    if (!running_) return 0;
    running_ = false;
    const cudaError_t err = cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
    stream_ = nullptr;
    if (err != cudaSuccess) {
      last_error_ = cudaGetErrorString(err);
      return -EIO;
    }
#endif
    return 0;
  }
  const char *last_error() const { return last_error_; }

 private:
  Backend backend_ = Backend::kHost;
  host::HostGrid host_;
  const char *last_error_ = "";
#if defined(__CUDACC__)
  cudaStream_t stream_ = nullptr;
  bool running_ = false;
#endif
};

#if defined(__CUDACC__)
// Memory for a proxy serving a real GPU: host-mapped pinned memory (the GPU
// reads and writes it over PCIe, the CPU at DRAM speed) and GPU memory.
class CudaMemoryResource final : public MemoryResource {
 public:
  explicit CudaMemoryResource(int device) : device_(device) {
    snprintf(name_, sizeof name_, "cuda:%d", device);
  }
  const char *name() const override { return name_; }
  bool has_device_memory() const override { return true; }
  int allocate(MemoryKind kind, size_t size, MemoryBlock *out) override {
    if (cudaSetDevice(device_) != cudaSuccess) return -ENODEV;
    *out = MemoryBlock{};
    out->size = size;
    out->kind = kind;
    if (kind == MemoryKind::kHostMapped) {
      void *p = nullptr;
      if (cudaHostAlloc(&p, size, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) return -ENOMEM;
      memset(p, 0, size);
      void *d = nullptr;
      if (cudaHostGetDevicePointer(&d, p, 0) != cudaSuccess) {
        cudaFreeHost(p);
        return -ENODEV;
      }
      out->host = p;
      out->device = d;
      return 0;
    }
    void *d = nullptr;
    if (cudaMalloc(&d, size) != cudaSuccess) return -ENOMEM;
    if (cudaMemset(d, 0, size) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
      cudaFree(d);
      return -EIO;
    }
    out->device = d;
    return 0;
  }
  void release(MemoryBlock *block) override {
    if (block->kind == MemoryKind::kHostMapped && block->host) cudaFreeHost(block->host);
    if (block->kind == MemoryKind::kDevice && block->device) cudaFree(block->device);
    *block = MemoryBlock{};
  }

 private:
  int device_;
  char name_[32];
};

inline std::unique_ptr<MemoryResource> cuda_memory_resource(int device = 0) {
  return std::make_unique<CudaMemoryResource>(device);
}
#endif

// The memory a backend needs: CUDA memory for the GPU, plain memory for host threads.
inline std::unique_ptr<MemoryResource> memory_resource_for(Backend backend) {
#if defined(__CUDACC__)
  if (backend == Backend::kCuda) return cuda_memory_resource(0);
#else
  (void)backend;
#endif
  return host_memory_resource();
}

}  // namespace gpusock

#endif
