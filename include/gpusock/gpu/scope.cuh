// gpusock device API: the cooperative scopes a call runs in, a threadblock
// (BlockScope) or one warp (WarpScope), both a CooperativeScope: their
// threads' ranks, size, leader (rank 0), barrier, a broadcast of the leader's
// value and a count. on_leader runs the leader's part of a call; group_copy
// moves bytes with every thread of a scope.
#ifndef GPUSOCK_GPU_SCOPE_CUH
#define GPUSOCK_GPU_SCOPE_CUH

#include <gpusock/gpu/host_backend.h>
#include <gpusock/gpu/primitives.cuh>
#include <gpusock/hd.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <atomic>

namespace gpusock {
namespace detail {

// The leader's value of v in every thread of scope S, through scratch memory
// the scope shares.
template <class S, class T>
GS_HD T broadcast_via(unsigned long long *scratch, const T &v) {
  static_assert(sizeof(T) <= host::kScratchWords * 8, "broadcast up to 32 bytes");
  if (S::leader()) memcpy(scratch, &v, sizeof(T));
  S::sync();
  T out;
  memcpy(&out, scratch, sizeof(T));
  S::sync();  // nobody overwrites the scratch before everyone has read it
  return out;
}

#if !defined(__CUDA_ARCH__)
// Host backend: how many threads of scope S passed pred == true, through a
// counter the scope shares.
template <class S>
inline unsigned count_via(std::atomic<unsigned> &counter, bool pred) {
  if (S::leader()) counter.store(0, std::memory_order_relaxed);
  S::sync();
  if (pred) counter.fetch_add(1, std::memory_order_relaxed);
  S::sync();
  const unsigned n = counter.load(std::memory_order_relaxed);
  S::sync();
  return n;
}
#endif

}  // namespace detail

// Who calls together: every thread of one threadblock, or every lane of one
// warp.
enum class ScopeKind { kBlock, kWarp };

// The threads that make one call together: their ranks, size, leader (rank
// 0), barrier, a broadcast of the leader's value and a count. The two kinds
// differ only in the primitives they stand on.
template <ScopeKind K>
struct CooperativeScope {
  static constexpr bool kBlock = K == ScopeKind::kBlock;

  GS_HD static unsigned rank() { return kBlock ? prim::thread_rank() : prim::lane(); }
  GS_HD static unsigned size() { return kBlock ? prim::block_dim() : prim::warp_size(); }
  GS_HD static bool leader() { return rank() == 0; }
  GS_HD static void sync() {
    if constexpr (kBlock) prim::sync_block();
    else prim::sync_warp();
  }

  // rank 0's value of v, in every thread.
  template <class T>
  GS_HD static T broadcast(const T &v) {
#if defined(__CUDA_ARCH__)
    if constexpr (kBlock) {
      __shared__ unsigned long long scratch[host::kScratchWords];
      return detail::broadcast_via<CooperativeScope>(scratch, v);
    } else {
      static_assert(sizeof(T) <= host::kScratchWords * 8, "broadcast up to 32 bytes");
      constexpr unsigned kWords = (sizeof(T) + 3) / 4;
      unsigned words[kWords] = {};
      memcpy(words, &v, sizeof(T));
      for (unsigned i = 0; i < kWords; ++i) words[i] = __shfl_sync(0xffffffffu, words[i], 0);
      T out;
      memcpy(&out, words, sizeof(T));
      return out;
    }
#else
    host::BlockState *block = host::t_thread.block;
    return detail::broadcast_via<CooperativeScope>(
        kBlock ? block->scratch : block->warp_scratch.get() + prim::warp_index() * host::kScratchWords, v);
#endif
  }

  // How many threads passed pred == true.
  GS_HD static unsigned count(bool pred) {
#if defined(__CUDA_ARCH__)
    if constexpr (kBlock) return static_cast<unsigned>(__syncthreads_count(pred));
    else return static_cast<unsigned>(__popc(__ballot_sync(0xffffffffu, pred)));
#else
    host::BlockState *block = host::t_thread.block;
    return detail::count_via<CooperativeScope>(kBlock ? block->counter : block->warp_counters[prim::warp_index()],
                                               pred);
#endif
  }
};

using BlockScope = CooperativeScope<ScopeKind::kBlock>;
using WarpScope = CooperativeScope<ScopeKind::kWarp>;

namespace detail {

// The leader runs leader_part (the scope's talk with the proxy); every thread
// of the scope gets its result.
template <class S, class F>
GS_HD auto on_leader(const F &leader_part) {
  decltype(leader_part()) result{};
  if (S::leader()) result = leader_part();
  return S::broadcast(result);
}

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
        const uint4 a = __ldcv(s4 + i), b = __ldcv(s4 + i + k), e = __ldcv(s4 + i + 2 * k), f = __ldcv(s4 + i + 3 * k);
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

}  // namespace detail
}  // namespace gpusock

#endif
