// Test data both sides can produce independently: byte i of a stream with a
// seed, and the FNV-1a hash the CPU peers report. Host and device.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <gpusock/hd.h>

namespace gpusock::test {

GS_HD uint8_t pattern_byte(uint64_t i, uint32_t seed) {
  uint64_t x = (i >> 3) + (uint64_t(seed) << 32) + 0x9E3779B97F4A7C15ull;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 29;
  return static_cast<uint8_t>(x >> ((i & 7) * 8));
}

inline uint64_t fnv1a(const uint8_t *p, size_t n, uint64_t h = 1469598103934665603ull) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace gpusock::test
