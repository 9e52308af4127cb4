// The reference features of one identity as stored in memcached.
//
// Key:   face:<width>x<height>:<identity>      e.g. face:128x128:4711
//        (histograms depend on the image size, so each size has its own keys)
// Value: a 16-byte header, then grid * grid * 59 counts, u16 little-endian:
//        magic "FVH1" | width u16 | height u16 | grid u16 | bins per cell u16 (59) |
//        codes u32 ((width - 2) * (height - 2))
// A server checks the header against the request and the grid it uses, so a
// reference made for another size or grid is an error, never a wrong verdict.
#ifndef FV_RECORD_H
#define FV_RECORD_H

#include <gpusock/hd.h>

#include "fv_lbp.h"
#include "fv_wire.h"

#include <stddef.h>
#include <stdint.h>

namespace fv {

inline constexpr uint32_t kRecordMagic = 0x31484656u;  // bytes 'F' 'V' 'H' '1'
inline constexpr size_t kRecordHeaderBytes = 16;
inline constexpr size_t kMaxKeyBytes = 40;  // "face:1024x1024:4294967295" and room

GS_HD size_t record_bytes(uint32_t grid) { return kRecordHeaderBytes + size_t(grid) * grid * kBins * 2; }
inline constexpr size_t kMaxRecordBytes = kRecordHeaderBytes + size_t(kMaxBins) * 2;

// Decimal digits of v into out; returns how many.
GS_HD size_t format_uint(char *out, uint64_t v) {
  char tmp[20];
  size_t n = 0;
  do {
    tmp[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  for (size_t i = 0; i < n; ++i) out[i] = tmp[n - 1 - i];
  return n;
}

// The key (not terminated); returns its length (< kMaxKeyBytes).
GS_HD size_t format_key(char *out, uint32_t width, uint32_t height, uint32_t identity) {
  const char prefix[] = "face:";
  size_t n = 0;
  for (size_t i = 0; i + 1 < sizeof prefix; ++i) out[n++] = prefix[i];
  n += format_uint(out + n, width);
  out[n++] = 'x';
  n += format_uint(out + n, height);
  out[n++] = ':';
  n += format_uint(out + n, identity);
  return n;
}

GS_HD uint32_t record_count(const uint8_t *record, uint32_t bin) {
  return static_cast<uint32_t>(load_le(record + kRecordHeaderBytes + 2 * size_t(bin), 2));
}

// Whether value (n bytes) is the reference of a f.width x f.height image with f.grid.
GS_HD bool record_matches(const uint8_t *value, size_t n, const Features &f) {
  return n == record_bytes(f.grid) && load_le(value, 4) == kRecordMagic && load_le(value + 4, 2) == f.width &&
         load_le(value + 6, 2) == f.height && load_le(value + 8, 2) == f.grid && load_le(value + 10, 2) == kBins &&
         load_le(value + 12, 4) == f.codes();
}

// The record of a histogram (the loader). Counts fit 16 bits: validate_request
// limits the codes per cell.
inline void encode_record(const Features &f, const uint32_t *hist, uint8_t *out) {
  store_le(out, kRecordMagic, 4);
  store_le(out + 4, f.width, 2);
  store_le(out + 6, f.height, 2);
  store_le(out + 8, f.grid, 2);
  store_le(out + 10, kBins, 2);
  store_le(out + 12, f.codes(), 4);
  for (uint32_t i = 0; i < f.bins(); ++i) store_le(out + kRecordHeaderBytes + 2 * size_t(i), hist[i], 2);
}

// Serial chi-square of a histogram against a record (CPU server, reference).
inline uint64_t chi2_q16(const uint32_t *hist, const uint8_t *record, uint32_t bins) {
  uint64_t sum = 0;
  for (uint32_t i = 0; i < bins; ++i) sum += chi2_term_q16(hist[i], record_count(record, i));
  return sum;
}

}  // namespace fv

#endif
