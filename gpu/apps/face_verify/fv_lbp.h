// Face verification features (Ahonen et al.): uniform LBP(8,1) codes
// histogrammed per cell of a grid x grid split of the image, compared by the
// chi-square distance against a reference with a threshold.
//
// - LBP(8,1): the 8 neighbours of a pixel at radius 1 (the 3x3 square),
//   clockwise from the top-left; bit i is set when neighbour i >= the centre.
//   Codes exist for the (w - 2) x (h - 2) interior pixels.
// - Uniform: at most 2 circular 0/1 transitions (58 codes), one bin each;
//   all other codes share bin 58: 59 bins. Bin order: 0 for 00000000, then by
//   the number of ones k = 1..7 and the bit where the run of ones starts
//   (1 + 8 (k - 1) + start), 57 for 11111111, 58 non-uniform.
// - Cells: code (x, y) belongs to cell (x * grid / cw, y * grid / ch) of the
//   cw x ch code area; bin of a code = cell * 59 + uniform bin.
// - Chi-square: sum over bins of (a - b)^2 / (a + b), each term computed in
//   integers as floor((a - b)^2 * 2^16 / (a + b)) so that any summation order
//   (serial on the CPU, atomics on the GPU) gives the same number.
// - Verdict: match when chi2 <= threshold * bins (threshold in 2^-16 units):
//   a threshold per bin holds across image sizes, as the expected chi-square
//   of two samples of one texture grows with the number of bins, not codes.
#ifndef FV_LBP_H
#define FV_LBP_H

#include <gpusock/hd.h>

#include "fv_wire.h"

#include <stdint.h>
#include <string.h>

namespace fv {

inline constexpr uint32_t kBins = 59;        // per cell
inline constexpr uint32_t kDefaultGrid = 8;  // cells per side
inline constexpr uint32_t kMaxGrid = 12;     // 144 cells x 59 bins x 4 B = 34 KB of GPU shared memory
inline constexpr uint32_t kMaxBins = kMaxGrid * kMaxGrid * kBins;
// 0.5 per bin: with the generated data set (fv_dataset.h) genuine probes
// stay below ~0.4 and impostors above ~0.6 at 64, 128 and 256 pixels
// (fv_headers_test checks a sample of both).
inline constexpr uint32_t kDefaultThresholdQ16 = 32768;

GS_HD uint32_t popcount8(uint32_t v) {
  uint32_t n = 0;
  for (int i = 0; i < 8; ++i) n += (v >> i) & 1u;
  return n;
}

// The uniform bin of an 8-bit LBP code (the order in the file comment).
GS_HD uint8_t uniform_bin(uint32_t code) {
  code &= 0xFFu;
  const uint32_t rotated = ((code >> 1) | (code << 7)) & 0xFFu;  // bit i -> bit i - 1
  if (popcount8(code ^ rotated) > 2) return 58;
  const uint32_t k = popcount8(code);
  if (k == 0) return 0;
  if (k == 8) return 57;
  uint32_t start = 0;  // the set bit whose lower neighbour (circularly) is clear
  for (uint32_t i = 0; i < 8; ++i)
    if (((code >> i) & 1u) && !((code >> ((i + 7) & 7u)) & 1u)) start = i;
  return static_cast<uint8_t>(1 + 8 * (k - 1) + start);
}

// table[code] = uniform_bin(code); rank/stride let a group of threads share it.
GS_HD void build_uniform_table(uint8_t *table, unsigned rank = 0, unsigned stride = 1) {
  for (unsigned c = rank; c < 256; c += stride) table[c] = uniform_bin(c);
}

// The LBP code of the pixel at column x + 1 of row `mid`, with rows above/below.
GS_HD uint32_t lbp_code(const uint8_t *above, const uint8_t *mid, const uint8_t *below, uint32_t x) {
  const uint8_t c = mid[x + 1];
  return uint32_t(above[x] >= c) | uint32_t(above[x + 1] >= c) << 1 | uint32_t(above[x + 2] >= c) << 2 |
         uint32_t(mid[x + 2] >= c) << 3 | uint32_t(below[x + 2] >= c) << 4 | uint32_t(below[x + 1] >= c) << 5 |
         uint32_t(below[x] >= c) << 6 | uint32_t(mid[x] >= c) << 7;
}

// Geometry of the features of a width x height image.
struct Features {
  uint32_t width, height, grid;
  GS_HD uint32_t code_w() const { return width - 2; }
  GS_HD uint32_t code_h() const { return height - 2; }
  GS_HD uint32_t codes() const { return code_w() * code_h(); }
  GS_HD uint32_t bins() const { return grid * grid * kBins; }
  GS_HD uint32_t cell_col(uint32_t x) const { return x * grid / code_w(); }
  GS_HD uint32_t cell_row(uint32_t y) const { return y * grid / code_h(); }
  // Histogram index of code (x, y) in code coordinates.
  GS_HD uint32_t bin_of(uint32_t x, uint32_t y, uint32_t code, const uint8_t *table) const {
    return (cell_row(y) * grid + cell_col(x)) * kBins + table[code];
  }
};

GS_HD uint64_t chi2_term_q16(uint32_t a, uint32_t b) {
  const uint32_t sum = a + b;
  if (sum == 0) return 0;
  const uint64_t d = a > b ? a - b : b - a;
  return ((d * d) << 16) / sum;
}

GS_HD uint8_t decide(uint64_t chi2_q16, uint32_t bins, uint32_t threshold_q16) {
  return chi2_q16 <= uint64_t(threshold_q16) * bins ? kMatch : kNoMatch;
}

// The reply to a request whose histogram was compared with its reference.
GS_HD Reply verdict_reply(uint64_t request_id, const Features &f, uint64_t chi2_q16, uint32_t threshold_q16) {
  Reply r{};
  r.verdict = decide(chi2_q16, f.bins(), threshold_q16);
  r.request_id = request_id;
  r.chi2_q16 = chi2_q16;
  r.bins = f.bins();
  return r;
}

// ---- the CPU implementation (the CPU server's hot loop and everyone's reference)

// The codes of one row: a loop the compiler vectorizes (-O3).
inline void lbp_row_codes(const uint8_t *above, const uint8_t *mid, const uint8_t *below, uint32_t n, uint8_t *codes) {
  for (uint32_t x = 0; x < n; ++x) codes[x] = static_cast<uint8_t>(lbp_code(above, mid, below, x));
}

// hist[f.bins()] = the per-cell uniform LBP histogram of img (f.width x f.height).
inline void lbp_histogram(const uint8_t *img, const Features &f, const uint8_t *table, uint32_t *hist) {
  const uint32_t cw = f.code_w(), ch = f.code_h();
  uint32_t col_base[kMaxDim];  // histogram offset of each column's cell
  uint8_t codes[kMaxDim];
  for (uint32_t x = 0; x < cw; ++x) col_base[x] = f.cell_col(x) * kBins;
  memset(hist, 0, sizeof(uint32_t) * f.bins());
  for (uint32_t y = 0; y < ch; ++y) {
    const uint8_t *row = img + size_t(y) * f.width;
    lbp_row_codes(row, row + f.width, row + 2 * f.width, cw, codes);
    uint32_t *cells = hist + f.cell_row(y) * f.grid * kBins;
    for (uint32_t x = 0; x < cw; ++x) ++cells[col_base[x] + table[codes[x]]];
  }
}

}  // namespace fv

#endif
