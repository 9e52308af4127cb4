// Test data both ends produce on their own and compare: a seeded byte pattern
// that any byte of can be computed directly (GPU threads fill their share of a
// buffer), and FNV-1a 64, the sum the CPU peers report. Host and device.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <gpusock/hd.h>

namespace gpusock::test {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

// FNV-1a 64 of n bytes, continuing from h.
GS_HD uint64_t fnv1a(const uint8_t *p, size_t n, uint64_t h = kFnvOffset) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
  return h;
}

// FNV-1a 64 fed piece by piece.
struct Fnv1a {
  uint64_t h = kFnvOffset;
  GS_HD void add(const uint8_t *p, size_t n) { h = fnv1a(p, n, h); }
  GS_HD void add(uint8_t b) { h = (h ^ b) * kFnvPrime; }
};

// splitmix64's finalizer: a well-mixed 64-bit value from an index or a seed
// (generated data sets: the face-verification images, the MapReduce inputs).
GS_HD uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Bytes 8w..8w+7 of the pattern with `seed`, byte 8w in the low bits.
GS_HD uint64_t pattern_word(uint64_t w, uint64_t seed) {
  uint64_t x = w + (seed << 32) + 0x9E3779B97F4A7C15ull;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 29;
  return x;
}

// Byte i of the pattern with `seed`.
GS_HD uint8_t pattern_byte(uint64_t i, uint64_t seed) {
  return static_cast<uint8_t>(pattern_word(i >> 3, seed) >> ((i & 7) * 8));
}

// Bytes [off, off + n) of the pattern with `seed`, off a multiple of 8: a
// word at a time, for streams of gigabytes.
GS_HD void fill_pattern(uint8_t *p, size_t n, uint64_t off, uint64_t seed) {
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t w = pattern_word((off + i) >> 3, seed);
    for (size_t b = 0; b < 8 && i + b < n; ++b) p[i + b] = static_cast<uint8_t>(w >> (b * 8));
  }
}

// The pattern as a stream, written or checked in pieces of any size: each
// call goes on where the previous one stopped.
class PatternStream {
 public:
  explicit PatternStream(uint64_t seed) : seed_(seed) {}
  void fill(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; ++i) p[i] = next();
  }
  // The index of the first byte that differs, or n if all match.
  size_t check(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; ++i)
      if (p[i] != next()) return i;
    return n;
  }

 private:
  uint8_t next() {
    if ((pos_ & 7) == 0) word_ = pattern_word(pos_ >> 3, seed_);
    const uint8_t b = static_cast<uint8_t>(word_ >> ((pos_ & 7) * 8));
    ++pos_;
    return b;
  }
  uint64_t seed_;
  uint64_t pos_ = 0;
  uint64_t word_ = 0;
};

}  // namespace gpusock::test
