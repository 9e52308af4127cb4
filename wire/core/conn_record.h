// The 40-byte connection record exchanged as CM private data
// (docs/wire-protocol.md §1.3, struct rs_conn_data), and the 16-byte SGL
// record of the target table.
#pragma once

#include "wire/core/constants.h"

namespace gpusock::wire {

// One scatter/gather entry, host values. On the wire and in tables the field
// order is addr, key, length (key before length).
struct SglEntry {
  uint64_t addr = 0;
  uint32_t key = 0;
  uint32_t length = 0;
};

struct ConnRecord {
  uint8_t version = kRsVersion;
  uint8_t flags = 0;
  uint16_t credits = 0;           // sender's rq_size: initial data credits granted to the peer
  uint8_t target_iomap_size = 0;  // scale code (§1.3.2)
  SglEntry target_sgl;            // length = number of entries (2), not bytes
  SglEntry data_buf;              // first half of the receive ring
};

// §1.3.2: 8-bit size code. 0..128 exact; above, multiples of 256.
GS_HD constexpr uint8_t scale_encode(uint32_t value) {
  return value <= 128 ? static_cast<uint8_t>(value) : static_cast<uint8_t>(0x80 | ((value >> 8) & 0x7F));
}
GS_HD constexpr uint32_t scale_decode(uint8_t code) {
  return code <= 128 ? code : static_cast<uint32_t>(code & 0x7F) << 8;
}

// Flags this host sends: IOMAP always (as rsocket does), NET on big-endian hosts.
GS_HD constexpr uint8_t local_conn_flags() {
  return static_cast<uint8_t>(kConnFlagIomap | (host_is_big_endian() ? kConnFlagNet : 0));
}

GS_HD void encode_conn_record(const ConnRecord &r, uint8_t out[kConnRecordSize]) {
  out[0] = r.version;
  out[1] = r.flags;
  store_be16(out + 2, r.credits);
  out[4] = out[5] = out[6] = 0;
  out[7] = r.target_iomap_size;
  store_be64(out + 8, r.target_sgl.addr);
  store_be32(out + 16, r.target_sgl.key);
  store_be32(out + 20, r.target_sgl.length);
  store_be64(out + 24, r.data_buf.addr);
  store_be32(out + 32, r.data_buf.key);
  store_be32(out + 36, r.data_buf.length);
}

enum class RecordError : uint8_t {
  kNone,
  kTooShort,
  kNotRsocket,
  kBadVersion,
  kBadSglCount,
  kNoCredits,
  kEmptyBuffer,
};

GS_HD const char *record_error_text(RecordError e) {
  switch (e) {
    case RecordError::kNone:
      return "ok";
    case RecordError::kTooShort:
      return "connection record shorter than 40 bytes (peer is not an rsocket)";
    case RecordError::kNotRsocket:
      return "peer is not an rsocket: its connection data holds no rsocket record";
    case RecordError::kBadVersion:
      return "connection record version is not 1 (peer speaks another rsocket version)";
    case RecordError::kBadSglCount:
      return "connection record target SGL table does not have 2 entries";
    case RecordError::kNoCredits:
      return "connection record grants no credits";
    case RecordError::kEmptyBuffer:
      return "connection record advertises an empty, oversized or wrapping receive buffer";
  }
  return "?";
}

// Parses and validates the first 40 bytes; longer input (CM padding) is fine.
// Returns 0, -EPROTONOSUPPORT (version), or -EPROTO (anything else malformed);
// *why says which.
GS_HD gs_status_t decode_conn_record(const uint8_t *in, size_t len, ConnRecord *r, RecordError *why) {
  RecordError e = RecordError::kNone;
  if (len < kConnRecordSize) {
    e = RecordError::kTooShort;
  } else {
    r->version = in[0];
    r->flags = in[1];
    r->credits = load_be16(in + 2);
    r->target_iomap_size = in[7];
    r->target_sgl.addr = load_be64(in + 8);
    r->target_sgl.key = load_be32(in + 16);
    r->target_sgl.length = load_be32(in + 20);
    r->data_buf.addr = load_be64(in + 24);
    r->data_buf.key = load_be32(in + 32);
    r->data_buf.length = load_be32(in + 36);
    // Version 0 is what a non-rsocket peer's zero-padded CM data reads as.
    if (r->version == 0) e = RecordError::kNotRsocket;
    else if (r->version != kRsVersion) e = RecordError::kBadVersion;
    else if (r->target_sgl.length != kSglSize) e = RecordError::kBadSglCount;
    else if (r->credits == 0) e = RecordError::kNoCredits;
    else if (r->data_buf.length == 0 || r->data_buf.length > kMaxDataLength ||
             r->data_buf.addr > UINT64_MAX - 2 * uint64_t(r->data_buf.length))
      e = RecordError::kEmptyBuffer;
  }
  if (why) *why = e;
  if (e == RecordError::kNone) return 0;
  return e == RecordError::kBadVersion ? -EPROTONOSUPPORT : -EPROTO;
}

// A 16-byte SGL record as it must sit in a table owned by a host of the given
// byte order (§2.9: owner order). Returns the bytes to RDMA-write.
GS_HD void encode_sgl_record(const SglEntry &e, bool owner_big_endian, uint8_t out[kSglRecordSize]) {
  uint64_t addr = e.addr;
  uint32_t key = e.key, length = e.length;
  if (owner_big_endian != host_is_big_endian()) {
    addr = bswap64(addr);
    key = bswap32(key);
    length = bswap32(length);
  }
  memcpy(out, &addr, 8);
  memcpy(out + 8, &key, 4);
  memcpy(out + 12, &length, 4);
}

// The local target table: kSglSize entries in host order, written by the peer.
struct TargetTableEntry {
  uint64_t addr;
  uint32_t key;
  uint32_t length;
};
static_assert(sizeof(TargetTableEntry) == kSglRecordSize, "SGL record layout");

}  // namespace gpusock::wire
