// Portability for the protocol core: it compiles for the host and, under nvcc,
// for the device. No system calls, no allocation, no exceptions.
#pragma once

#include <errno.h>  // error numbers only: the core returns them, never reads errno
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <gpusock/hd.h>
#include <gpusock/status.h>  // gs_status_t: >= 0 success, a negated errno on failure

namespace gpusock::wire {

template <class T>
GS_HD constexpr T gs_min(T a, T b) {
  return a < b ? a : b;
}
template <class T>
GS_HD constexpr T gs_max(T a, T b) {
  return a < b ? b : a;
}

GS_HD constexpr bool host_is_big_endian() {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  return true;
#else
  return false;
#endif
}

GS_HD constexpr uint16_t bswap16(uint16_t v) { return static_cast<uint16_t>((v >> 8) | (v << 8)); }
GS_HD constexpr uint32_t bswap32(uint32_t v) {
  return ((v & 0xFFu) << 24) | ((v & 0xFF00u) << 8) | ((v >> 8) & 0xFF00u) | (v >> 24);
}
GS_HD constexpr uint64_t bswap64(uint64_t v) {
  return (static_cast<uint64_t>(bswap32(static_cast<uint32_t>(v))) << 32) | bswap32(static_cast<uint32_t>(v >> 32));
}

// Big-endian loads and stores on byte arrays (alignment-free).
GS_HD void store_be16(uint8_t *p, uint16_t v) {
  p[0] = uint8_t(v >> 8);
  p[1] = uint8_t(v);
}
GS_HD void store_be32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (24 - 8 * i));
}
GS_HD void store_be64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (56 - 8 * i));
}
GS_HD uint16_t load_be16(const uint8_t *p) { return uint16_t((p[0] << 8) | p[1]); }
GS_HD uint32_t load_be32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | p[i];
  return v;
}
GS_HD uint64_t load_be64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

}  // namespace gpusock::wire
