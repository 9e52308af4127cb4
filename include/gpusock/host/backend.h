// gpusock device API: the host backend. Emulated threadblocks and warps on
// std::threads: gpusock::Grid (launch.cuh) runs a "kernel" functor on
// blocks x threads host threads, and the primitives (primitives.cuh) map
// __syncthreads/__syncwarp, broadcasts and counts onto the state kept here.
// Host code only: nothing here runs on a GPU.
#ifndef GPUSOCK_HOST_BACKEND_H
#define GPUSOCK_HOST_BACKEND_H

#include <errno.h>
#include <sched.h>
#include <stdint.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <thread>
#include <vector>

namespace gpusock {
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

}  // namespace gpusock

#endif
