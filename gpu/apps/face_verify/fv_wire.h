// Face verification: the wire format between a client and every server.
//
// Request: a 24-byte header, then width * height grayscale bytes (row major).
// Reply: 32 bytes. All integers little-endian, encoded byte by byte so the
// same code runs on the CPU and on the GPU (no alignment assumed).
//
//   request  magic "FVRQ" | version u16 | flags u16 (0) | request_id u64 |
//            identity u32 | width u16 | height u16 | pixels...
//   reply    magic "FVRP" | version u16 | verdict u8 | reason u8 |
//            request_id u64 | chi2_q16 u64 | bins u32 | reserved u32 (0)
//
// The distance is chi2_q16 / 65536 / bins: the chi-square distance of the
// LBP histograms (an exact integer, fixed point 2^-16 per term, see fv_lbp.h)
// per histogram bin, so every server and the client's reference agree bit
// for bit.
#ifndef FV_WIRE_H
#define FV_WIRE_H

#include <gpusock/hd.h>

#include <stddef.h>
#include <stdint.h>

namespace fv {

inline constexpr uint32_t kRequestMagic = 0x51525646u;  // bytes 'F' 'V' 'R' 'Q'
inline constexpr uint32_t kReplyMagic = 0x50525646u;    // bytes 'F' 'V' 'R' 'P'
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kRequestHeaderBytes = 24;
inline constexpr size_t kReplyBytes = 32;
inline constexpr uint32_t kMinDim = 8;  // width and height, inclusive
inline constexpr uint32_t kMaxDim = 1024;
inline constexpr size_t kMaxRequestBytes = kRequestHeaderBytes + size_t(kMaxDim) * kMaxDim;

enum Verdict : uint8_t {
  kMatch = 0,
  kNoMatch = 1,
  kUnknownIdentity = 2,  // memcached has no reference for the identity
  kError = 3,            // `reason` says why
};

enum Reason : uint8_t {
  kReasonNone = 0,
  kBadMagic = 1,
  kBadVersion = 2,
  kBadFlags = 3,
  kBadSize = 4,    // width/height outside [kMinDim, kMaxDim], or a cell too large for the grid
  kDatabase = 5,   // memcached unreachable, timed out or answered garbage
  kBadRecord = 6,  // the stored reference has another format (size, grid)
};

GS_HD const char *verdict_name(uint8_t v) {
  switch (v) {
    case kMatch:
      return "match";
    case kNoMatch:
      return "no-match";
    case kUnknownIdentity:
      return "unknown-identity";
    case kError:
      return "error";
    default:
      return "?";
  }
}

GS_HD const char *reason_name(uint8_t r) {
  switch (r) {
    case kReasonNone:
      return "none";
    case kBadMagic:
      return "bad-magic";
    case kBadVersion:
      return "bad-version";
    case kBadFlags:
      return "bad-flags";
    case kBadSize:
      return "bad-size";
    case kDatabase:
      return "database";
    case kBadRecord:
      return "bad-record";
    default:
      return "?";
  }
}

// ---- little-endian fields
GS_HD uint64_t load_le(const uint8_t *p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
GS_HD void store_le(uint8_t *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

struct RequestHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t flags;
  uint64_t request_id;
  uint32_t identity;
  uint16_t width;
  uint16_t height;
};

struct Reply {
  uint8_t verdict;
  uint8_t reason;
  uint64_t request_id;
  uint64_t chi2_q16;
  uint32_t bins;  // histogram bins compared (0 when none were)
};

GS_HD RequestHeader decode_request_header(const uint8_t *p) {
  RequestHeader h;
  h.magic = static_cast<uint32_t>(load_le(p, 4));
  h.version = static_cast<uint16_t>(load_le(p + 4, 2));
  h.flags = static_cast<uint16_t>(load_le(p + 6, 2));
  h.request_id = load_le(p + 8, 8);
  h.identity = static_cast<uint32_t>(load_le(p + 16, 4));
  h.width = static_cast<uint16_t>(load_le(p + 20, 2));
  h.height = static_cast<uint16_t>(load_le(p + 22, 2));
  return h;
}

GS_HD void encode_request_header(const RequestHeader &h, uint8_t *p) {
  store_le(p, h.magic, 4);
  store_le(p + 4, h.version, 2);
  store_le(p + 6, h.flags, 2);
  store_le(p + 8, h.request_id, 8);
  store_le(p + 16, h.identity, 4);
  store_le(p + 20, h.width, 2);
  store_le(p + 22, h.height, 2);
}

GS_HD size_t request_bytes(const RequestHeader &h) { return kRequestHeaderBytes + size_t(h.width) * h.height; }

// The most LBP codes that fall into one cell of a grid x grid split of the
// (w - 2) x (h - 2) code area (fv_lbp.h's cell_of): stored counts are 16-bit.
GS_HD uint32_t max_cell_codes(uint32_t w, uint32_t h, uint32_t grid) {
  const uint32_t cw = w - 2, ch = h - 2;
  return ((cw + grid - 1) / grid) * ((ch + grid - 1) / grid);
}

// Checked on the first 24 bytes, before anything of the image is read or any
// memory is sized from it. kReasonNone: valid.
GS_HD Reason validate_request(const RequestHeader &h, uint32_t grid) {
  if (h.magic != kRequestMagic) return kBadMagic;
  if (h.version != kVersion) return kBadVersion;
  if (h.flags != 0) return kBadFlags;
  if (h.width < kMinDim || h.width > kMaxDim || h.height < kMinDim || h.height > kMaxDim) return kBadSize;
  if (max_cell_codes(h.width, h.height, grid) > 0xFFFFu) return kBadSize;
  return kReasonNone;
}

GS_HD void encode_reply(const Reply &r, uint8_t *p) {
  store_le(p, kReplyMagic, 4);
  store_le(p + 4, kVersion, 2);
  p[6] = r.verdict;
  p[7] = r.reason;
  store_le(p + 8, r.request_id, 8);
  store_le(p + 16, r.chi2_q16, 8);
  store_le(p + 24, r.bins, 4);
  store_le(p + 28, 0, 4);
}

// False when the bytes are not a reply of this version.
GS_HD bool decode_reply(const uint8_t *p, Reply *out) {
  if (load_le(p, 4) != kReplyMagic || load_le(p + 4, 2) != kVersion || load_le(p + 28, 4) != 0) return false;
  out->verdict = p[6];
  out->reason = p[7];
  out->request_id = load_le(p + 8, 8);
  out->chi2_q16 = load_le(p + 16, 8);
  out->bins = static_cast<uint32_t>(load_le(p + 24, 4));
  return out->verdict <= kError;
}

GS_HD Reply error_reply(uint64_t request_id, Reason reason) {
  Reply r{};
  r.verdict = kError;
  r.reason = reason;
  r.request_id = request_id;
  return r;
}

// The normalized distance (for people and plots; comparisons use the integers).
inline double reply_distance(const Reply &r) {
  return r.bins ? static_cast<double>(r.chi2_q16) / 65536.0 / r.bins : 0.0;
}

}  // namespace fv

#endif
