// MapReduce inputs, the same on the GPU and on the CPU (GS_HD): a synthetic
// text corpus whose words follow a Zipf law, and points around K centres.
// Both are deterministic functions of a seed and an index, so every GPU
// generates its share in its own memory and the CPU reference regenerates
// the whole without anything being copied.
#pragma once

#include <gpusock/hd.h>

#include "test-support/checksum.h"

#include <stddef.h>
#include <stdint.h>

namespace mr {

// ---------------------------------------------------------------- randomness

using gpusock::test::mix64;  // splitmix64's finalizer

struct Rng {
  uint64_t s;
  GS_HD uint64_t next() { return mix64(s++); }
};

GS_HD uint64_t fnv1a64(const char *p, unsigned n) {  // what the map hashes words with
  return gpusock::test::fnv1a(reinterpret_cast<const uint8_t *>(p), n);
}

// ---------------------------------------------------------------- word count

inline constexpr unsigned kChunkBytes = 4096;  // words never straddle chunks
inline constexpr unsigned kMaxWord = 16;       // bytes of the longest word
inline constexpr unsigned kWordPrefix = 4;     // 26^4 ranks: the prefix names the rank

// The text of word `rank`: 4 letters that spell the rank in base 26 (so words
// are distinct), then 0..6 letters from its hash. Returns the length.
GS_HD unsigned word_text(uint32_t rank, char *out) {
  uint32_t r = rank;
  for (unsigned i = 0; i < kWordPrefix; ++i, r /= 26) out[i] = static_cast<char>('a' + r % 26);
  const uint64_t h = mix64(rank);
  const unsigned extra = static_cast<unsigned>(h % 7);
  for (unsigned i = 0; i < extra; ++i) out[kWordPrefix + i] = static_cast<char>('a' + (h >> (8 + 5 * i)) % 26);
  return kWordPrefix + extra;
}

// A Zipf draw: the first rank whose cumulative share (of 2^32) exceeds a
// 32-bit uniform number. cdf has `vocabulary` entries, the last 2^32 - 1 or more.
GS_HD uint32_t zipf_rank(const uint32_t *cdf, uint32_t vocabulary, uint32_t u) {
  uint32_t lo = 0, hi = vocabulary - 1;
  while (lo < hi) {
    const uint32_t mid = (lo + hi) / 2;
    if (cdf[mid] > u) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

// The words of chunk `chunk`, in order, each handed to
// visit(rank, text, len, offset in the chunk):
// words separated by one space, until the next would not fit; the rest of the
// chunk is spaces.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable  // the CPU reference's visitor is host code, only called on the host
#endif
template <class Visit>
GS_HD void chunk_words(uint64_t seed, uint64_t chunk, const uint32_t *cdf, uint32_t vocabulary, Visit &&visit) {
  Rng rng{mix64(seed ^ mix64(chunk))};
  unsigned used = 0;
  char word[kMaxWord];
  for (;;) {
    const uint32_t rank = zipf_rank(cdf, vocabulary, static_cast<uint32_t>(rng.next() >> 32));
    const unsigned len = word_text(rank, word);
    if (used + len + 1 > kChunkBytes) return;
    visit(rank, word, len, used);
    used += len + 1;
  }
}

// ---------------------------------------------------------------- K-means

inline constexpr unsigned kDims = 4;         // coordinates per point
inline constexpr unsigned kMaxK = 32;        // clusters at most
inline constexpr int32_t kSpread = 1 << 20;  // centres lie in [-kSpread, kSpread)

// Coordinates are integers, sums int64: every GPU and the CPU get the same
// sums in any order, so the reference check is exact.
struct Point {
  int32_t x[kDims];
};

GS_HD int32_t centre_coord(uint64_t seed, unsigned k, unsigned d) {
  return static_cast<int32_t>(mix64(seed * 7919 + k * 131 + d) % (2u * kSpread)) - kSpread;
}

// Point i: around centre i % k, off by up to +-kSpread/8 per coordinate.
GS_HD Point make_point(uint64_t seed, uint64_t i, unsigned k) {
  Point p;
  const uint64_t h = mix64(seed ^ mix64(i + 0x51ED));
  const unsigned c = static_cast<unsigned>(i % k);
  for (unsigned d = 0; d < kDims; ++d) {
    const int32_t noise = static_cast<int32_t>((h >> (16 * d)) & 0xffff) - 0x8000;  // +-2^15
    p.x[d] = centre_coord(seed, c, d) + noise * (kSpread / 8 / 0x8000);
  }
  return p;
}

// Where centroid c starts: a point of a draw with k + 1 centres, so the
// starting centroids sit off the true centres.
GS_HD int32_t initial_centroid(uint64_t seed, unsigned k, unsigned c, unsigned d) {
  return make_point(seed ^ 0xC0FFEE, c, k + 1).x[d];
}

// The nearest of k centroids (squared distance; ties: the lower index).
GS_HD unsigned nearest(const Point &p, const int64_t *centroids, unsigned k) {
  unsigned best = 0;
  int64_t best_d = INT64_MAX;
  for (unsigned c = 0; c < k; ++c) {
    int64_t dist = 0;
    for (unsigned d = 0; d < kDims; ++d) {
      const int64_t diff = p.x[d] - centroids[c * kDims + d];
      dist += diff * diff;
    }
    if (dist < best_d) {
      best_d = dist;
      best = c;
    }
  }
  return best;
}

// The new centroid of a cluster from its sum and count (the old one if empty).
GS_HD int64_t centroid_coord(int64_t sum, int64_t count, int64_t old) { return count > 0 ? sum / count : old; }

// Which reducer owns a word (by its hash) or a cluster.
GS_HD unsigned owner_of_word(uint64_t hash, unsigned reducers) {
  return static_cast<unsigned>((hash >> 40) % reducers);
}
GS_HD unsigned owner_of_cluster(unsigned k, unsigned reducers) { return k % reducers; }

}  // namespace mr
