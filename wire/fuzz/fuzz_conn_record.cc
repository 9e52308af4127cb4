// libFuzzer target: decode_conn_record on arbitrary bytes (docs/wire-protocol.md
// §1.3, §1.3.2, §2.9).
//
// Checks: decode never reads past `size` (ASan), its result and RecordError
// agree, a record that decodes OK satisfies every validation rule, and
// encode(decode(bytes)) reproduces the first 40 bytes (reserved bytes 4..6
// are written as zero) and decodes to the same record. Also exercises the
// scale code and the SGL record encoder on the same bytes.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "wire/core/conn_record.h"

#define CHECK(c)                                                             \
  do {                                                                       \
    if (!(c)) {                                                              \
      fprintf(stderr, "CHECK failed: %s (%s:%d)\n", #c, __FILE__, __LINE__); \
      abort();                                                               \
    }                                                                        \
  } while (0)

using namespace gpusock::wire;

namespace {

bool same(const ConnRecord &x, const ConnRecord &y) {
  return x.version == y.version && x.flags == y.flags && x.credits == y.credits &&
         x.target_iomap_size == y.target_iomap_size && x.target_sgl.addr == y.target_sgl.addr &&
         x.target_sgl.key == y.target_sgl.key && x.target_sgl.length == y.target_sgl.length &&
         x.data_buf.addr == y.data_buf.addr && x.data_buf.key == y.data_buf.key &&
         x.data_buf.length == y.data_buf.length;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // Copy into an exact-size heap block so ASan catches any over-read.
  std::vector<uint8_t> in(data, data + size);
  const uint8_t *p = size ? in.data() : nullptr;

  ConnRecord r;
  RecordError why = static_cast<RecordError>(0xEE);
  const int rc = decode_conn_record(p, size, &r, &why);
  CHECK(rc == 0 || rc == -EPROTO || rc == -EPROTONOSUPPORT);
  CHECK((rc == 0) == (why == RecordError::kNone));
  CHECK((rc == -EPROTONOSUPPORT) == (why == RecordError::kBadVersion));
  CHECK(record_error_text(why) != nullptr);
  if (size < kConnRecordSize) CHECK(why == RecordError::kTooShort);

  if (rc == 0) {
    CHECK(size >= kConnRecordSize);
    CHECK(r.version == kRsVersion);
    CHECK(r.target_sgl.length == kSglSize);
    CHECK(r.credits != 0);
    CHECK(r.data_buf.length != 0 && r.data_buf.length <= kMaxDataLength);
    // Round trip: bytes -> record -> bytes (reserved zeroed) -> record.
    uint8_t out[kConnRecordSize];
    memset(out, 0xA5, sizeof out);
    encode_conn_record(r, out);
    for (uint32_t i = 0; i < kConnRecordSize; ++i) {
      if (i >= 4 && i <= 6) CHECK(out[i] == 0);
      else CHECK(out[i] == p[i]);
    }
    ConnRecord back;
    RecordError why2 = RecordError::kTooShort;
    CHECK(decode_conn_record(out, sizeof out, &back, &why2) == 0);
    CHECK(why2 == RecordError::kNone);
    CHECK(same(back, r));
    // Trailing CM padding never changes the result (§1.3.1).
    ConnRecord exact;
    CHECK(decode_conn_record(p, kConnRecordSize, &exact, nullptr) == 0);
    CHECK(same(exact, r));
  } else if (size >= kConnRecordSize) {
    // Same verdict on the exact 40 bytes.
    ConnRecord exact;
    RecordError why2 = RecordError::kNone;
    CHECK(decode_conn_record(p, kConnRecordSize, &exact, &why2) == rc);
    CHECK(why2 == why);
  }

  // §1.3.2 scale code.
  if (size >= 1) {
    const uint8_t c = p[0];
    CHECK(scale_encode(scale_decode(c)) == c);
    CHECK(scale_decode(c) <= 32512);
  }
  if (size >= 4) {
    const uint32_t v = load_be32(p) % 32768;
    const uint32_t d = scale_decode(scale_encode(v));
    CHECK(d <= v);
    CHECK(v <= 128 ? d == v : (v < 256 ? d == 128 : d == (v & ~0xFFu)));
  }

  // §2.9 SGL record: the big-endian form is the byte-swapped little-endian one.
  if (size >= kSglRecordSize) {
    SglEntry e{load_be64(p), load_be32(p + 8), load_be32(p + 12)};
    uint8_t le[kSglRecordSize], be[kSglRecordSize];
    encode_sgl_record(e, false, le);
    encode_sgl_record(e, true, be);
    for (int i = 0; i < 8; ++i) CHECK(le[i] == be[7 - i]);
    for (int i = 0; i < 4; ++i) CHECK(le[8 + i] == be[11 - i]);
    for (int i = 0; i < 4; ++i) CHECK(le[12 + i] == be[15 - i]);
    CHECK(memcmp(be, p, kSglRecordSize) == 0);  // BE form of a BE-loaded entry is the input
  }
  return 0;
}
