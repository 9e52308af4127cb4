// gpusock device API: the scopes a call runs in, a threadblock (BlockScope),
// one warp (WarpScope) or one thread alone (ThreadScope), each a
// CooperativeScope: their threads' ranks, size, leader (rank 0), barrier, a
// broadcast of the leader's value, a count, and the team that polls the
// proxy's lines. on_leader runs the leader's part of a call; group_copy moves
// bytes with every thread of a scope.
#ifndef GPUSOCK_GPU_SCOPE_CUH
#define GPUSOCK_GPU_SCOPE_CUH

#include <gpusock/host/backend.h>
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

// Who calls together: every thread of one threadblock, every lane of one warp,
// or one thread by itself (UCX's device levels BLOCK, WARP, THREAD).
enum class ScopeKind { kBlock, kWarp, kThread };

// The threads that make one call together: their ranks, size, leader (rank
// 0), barrier, a broadcast of the leader's value and a count. The kinds differ
// only in the primitives they stand on.
template <ScopeKind K>
struct CooperativeScope {
  static constexpr ScopeKind kKind = K;
  static constexpr bool kBlock = K == ScopeKind::kBlock;
  static constexpr bool kThread = K == ScopeKind::kThread;

  GS_HD static unsigned rank() { return kThread ? 0 : kBlock ? prim::thread_rank() : prim::lane(); }
  GS_HD static unsigned size() { return kThread ? 1 : kBlock ? prim::block_dim() : prim::warp_size(); }
  GS_HD static bool leader() { return rank() == 0; }
  // How many such scopes a block holds, and which one of the grid's this is
  // (a block's, a warp's or a thread's number across the whole launch).
  GS_HD static unsigned per_block() {
    return kThread ? prim::block_dim() : kBlock ? 1 : (prim::block_dim() + prim::warp_size() - 1) / prim::warp_size();
  }
  GS_HD static unsigned index() {
    const unsigned within = kThread ? prim::thread_rank() : kBlock ? 0 : prim::warp_index();
    return prim::block_index() * per_block() + within;
  }
  // Whether this thread is in the leader's poll team (prim::Team): the
  // leader's warp on a GPU, the leader alone on the host backend.
  GS_HD static bool in_poll_team() {
#if defined(__CUDA_ARCH__)
    return kBlock ? prim::warp_index() == 0 : true;
#else
    return leader();
#endif
  }
  // The team that polls for the scope: a thread alone polls by itself.
  GS_HD static prim::Team poll_team() { return kThread ? prim::solo_team() : prim::team(); }
  GS_HD static void sync() {
    if constexpr (kBlock) prim::sync_block();
    else if constexpr (!kThread) prim::sync_warp();
  }

  // rank 0's value of v, in every thread.
  template <class T>
  GS_HD static T broadcast(const T &v) {
    if constexpr (kThread) return v;
    else return broadcast_in_group(v);
  }

  // How many threads passed pred == true.
  GS_HD static unsigned count(bool pred) {
    if constexpr (kThread) return pred ? 1u : 0u;
    else return count_in_group(pred);
  }

 private:
  template <class T>
  GS_HD static T broadcast_in_group(const T &v) {
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

  GS_HD static unsigned count_in_group(bool pred) {
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
using ThreadScope = CooperativeScope<ScopeKind::kThread>;

namespace detail {

// The leader runs leader_part (the scope's talk with the proxy); every thread
// of the scope gets its result.
template <class S, class F>
GS_HD auto on_leader(const F &leader_part) {
  decltype(leader_part()) result{};
  if (S::leader()) result = leader_part();
  return S::broadcast(result);
}

#if defined(__CUDA_ARCH__)
// One 16-byte word of a group copy. Ring bytes are written by the NIC / the
// proxy's transport and published by a release the leader's poll acquired;
// the scope's barrier orders every thread's loads after that acquire, so
// plain loads see them (the PTX memory model), and .cg skips the L1 besides.
// Not strong loads at system scope: a warp's such loads of host memory do not
// overlap (four in flight take four PCIe round trips; gpu_bench --micro
// compares them with .cg). The side in GPU memory may be unaligned and goes
// bytewise.
__device__ inline uint4 copy_load(const uint8_t *p, bool src_is_ring, bool aligned) {
  if (src_is_ring) return __ldcg(reinterpret_cast<const uint4 *>(p));  // aligned: the ring side anchors the words
  uint4 v;
  if (aligned) v = *reinterpret_cast<const uint4 *>(p);
  else memcpy(&v, p, 16);
  return v;
}
__device__ inline void copy_store(uint8_t *p, const uint4 &v, bool aligned) {
  if (aligned) *reinterpret_cast<uint4 *>(p) = v;
  else memcpy(p, &v, 16);
}
#endif

// Copies n bytes with every thread of the scope. On the GPU consecutive threads
// take consecutive 16-byte words (coalesced), aligned on the side in host
// memory (the ring: receive's source, send's destination), which is a PCIe
// round trip away: it is read or written in whole words, four per thread in
// flight before the first store (a store may alias the next load), and only
// the GPU-memory side goes bytewise when the two disagree mod 16 (byte loads
// from the ring made a 16 KiB receive ~60 round trips long). On the host each
// thread takes one contiguous chunk (no false sharing).
template <class S>
GS_HD void group_copy(uint8_t *dst, const uint8_t *src, size_t n, bool src_is_ring) {
  const unsigned r = S::rank(), k = S::size();
#if defined(__CUDA_ARCH__)
  const uintptr_t ring_side = reinterpret_cast<uintptr_t>(src_is_ring ? src : dst);
  size_t head = (16 - (ring_side & 15)) & 15;
  if (head > n) head = n;
  const size_t words = (n - head) / 16;
  const uint8_t *s = src + head;
  uint8_t *d = dst + head;
  const bool s_aligned = (reinterpret_cast<uintptr_t>(s) & 15) == 0;
  const bool d_aligned = (reinterpret_cast<uintptr_t>(d) & 15) == 0;
  size_t i = r;
  for (; i + 3 * k < words; i += 4 * k) {
    const uint4 a = copy_load(s + 16 * i, src_is_ring, s_aligned),
                b = copy_load(s + 16 * (i + k), src_is_ring, s_aligned),
                e = copy_load(s + 16 * (i + 2 * k), src_is_ring, s_aligned),
                f = copy_load(s + 16 * (i + 3 * k), src_is_ring, s_aligned);
    copy_store(d + 16 * i, a, d_aligned);
    copy_store(d + 16 * (i + k), b, d_aligned);
    copy_store(d + 16 * (i + 2 * k), e, d_aligned);
    copy_store(d + 16 * (i + 3 * k), f, d_aligned);
  }
  for (; i < words; i += k) copy_store(d + 16 * i, copy_load(s + 16 * i, src_is_ring, s_aligned), d_aligned);
  for (size_t j = r; j < head; j += k) dst[j] = src_is_ring ? __ldcg(src + j) : src[j];
  for (size_t j = head + words * 16 + r; j < n; j += k) dst[j] = src_is_ring ? __ldcg(src + j) : src[j];
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
