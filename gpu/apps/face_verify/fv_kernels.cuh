// The features on the GPU: one threadblock computes one image's histogram and
// its chi-square against a stored record, with the block's threads. Used by
// both GPU servers (the GPU-native one per request, the host-centric one per
// batch item); on the host backend the same code runs on emulated blocks.
#ifndef FV_KERNELS_CUH
#define FV_KERNELS_CUH

#include <gpusock/gpu.cuh>

#include "fv_lbp.h"
#include "fv_record.h"

namespace fv {

// Per-block working memory: GPU shared memory on the GPU; on the host
// backend, `host_scratch`: kHostScratchBytes of the block's own.
struct BlockScratch {
  uint32_t *hist;            // kMaxBins
  uint8_t *table;            // 256: code -> uniform bin
  unsigned long long *chi2;  // the block's sum
};
inline constexpr size_t kHostScratchBytes = sizeof(uint32_t) * kMaxBins + 256 + 64;

GS_HD BlockScratch block_scratch(uint8_t *host_scratch) {
#if defined(__CUDA_ARCH__)
  (void)host_scratch;
  __shared__ uint32_t hist[kMaxBins];
  __shared__ uint8_t table[256];
  __shared__ unsigned long long chi2;
  return BlockScratch{hist, table, &chi2};
#else
  uint8_t *base = host_scratch;
  return BlockScratch{reinterpret_cast<uint32_t *>(base), base + sizeof(uint32_t) * kMaxBins,
                      reinterpret_cast<unsigned long long *>(base + sizeof(uint32_t) * kMaxBins + 256)};
#endif
}

// Fills the block's uniform-bin table (once per kernel).
GS_HD void block_init_table(const BlockScratch &s) {
  build_uniform_table(s.table, gpusock::thread_rank(), gpusock::block_dim());
  gpusock::sync_block();
}

// s.hist[f.bins()] = the histogram of img, with every thread of the block:
// consecutive threads take consecutive codes of a row (coalesced loads),
// shared-memory atomics count them.
GS_HD void block_histogram(const uint8_t *img, const Features &f, const BlockScratch &s) {
  const unsigned rank = gpusock::thread_rank(), size = gpusock::block_dim();
  for (uint32_t i = rank; i < f.bins(); i += size) s.hist[i] = 0;
  gpusock::sync_block();
  const uint32_t cw = f.code_w(), n = f.codes();
  for (uint32_t i = rank; i < n; i += size) {
    const uint32_t y = i / cw, x = i - y * cw;
    const uint8_t *row = img + size_t(y) * f.width;
    const uint32_t code = lbp_code(row, row + f.width, row + 2 * f.width, x);
    gpusock::prim::atomic_add(&s.hist[f.bin_of(x, y, code, s.table)], 1u);
  }
  gpusock::sync_block();
}

// dst[0, n) = src[0, n) with every thread of the block: the GPU-native server
// keeps each histogram of a batch (s.hist) in GPU memory while the next is
// counted, and brings it back for its chi-square.
GS_HD void block_copy_bins(uint32_t *dst, const uint32_t *src, uint32_t n) {
  const unsigned rank = gpusock::thread_rank(), size = gpusock::block_dim();
  for (uint32_t i = rank; i < n; i += size) dst[i] = src[i];
  gpusock::sync_block();
}

// The chi-square (2^-16 units) of s.hist against a stored record, in every thread.
GS_HD uint64_t block_chi2(const uint8_t *record, const Features &f, const BlockScratch &s) {
  const unsigned rank = gpusock::thread_rank(), size = gpusock::block_dim();
  if (rank == 0) *s.chi2 = 0;
  gpusock::sync_block();
  unsigned long long sum = 0;
  for (uint32_t i = rank; i < f.bins(); i += size) sum += chi2_term_q16(s.hist[i], record_count(record, i));
  gpusock::prim::atomic_add(s.chi2, sum);
  gpusock::sync_block();
  const uint64_t total = *s.chi2;
  gpusock::sync_block();  // nobody resets it before everyone has read it
  return total;
}

}  // namespace fv

#endif
