// Connection record (docs/wire-protocol.md §1.3, §1.3.1, §1.3.2, §9.1) and the
// record a Stream builds in init().
#include <gtest/gtest.h>

#include <vector>

#include "wire/connection_driver.h"
#include "wire/core/conn_record.h"
#include "wire/core/stream.h"
#include "wire/tests/harness.h"

namespace gpusock::wire {
namespace {

// §1.3 / §9.1: a typical x86 record: version 1, flags 0x02 (IOMAP, little-endian
// host), credits BE16 (384 = 0x0180), 3 reserved zero bytes, iomap scale byte at
// offset 7, then target_sgl and data_buf as addr(BE64) key(BE32) length(BE32);
// target_sgl.length is the entry count 2; data_buf.length is rbuf_size/2.
constexpr uint8_t kGoldenX86[kConnRecordSize] = {
    0x01, 0x02, 0x01, 0x80, 0x00, 0x00, 0x00, 0x00,  // version flags credits rsvd[3] iomap_scale
    0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x70, 0x00,  // target_sgl.addr
    0x00, 0x00, 0x12, 0x34, 0x00, 0x00, 0x00, 0x02,  // target_sgl.key, target_sgl.length (= 2 entries)
    0x00, 0x00, 0x7f, 0x12, 0x34, 0x5a, 0x00, 0x00,  // data_buf.addr
    0x00, 0x00, 0x56, 0x78, 0x00, 0x01, 0x00, 0x00,  // data_buf.key, data_buf.length (= 64 KiB)
};

ConnRecord golden_record() {
  ConnRecord r;
  r.version = 1;
  r.flags = 0x02;
  r.credits = 384;
  r.target_iomap_size = 0;
  r.target_sgl = {0x00007f1234567000ull, 0x00001234u, 2};
  r.data_buf = {0x00007f12345a0000ull, 0x00005678u, 0x00010000u};
  return r;
}

std::vector<uint8_t> encode(const ConnRecord &r) {
  std::vector<uint8_t> out(kConnRecordSize, 0xAA);
  encode_conn_record(r, out.data());
  return out;
}

void expect_equal(const ConnRecord &x, const ConnRecord &y) {
  EXPECT_EQ(x.version, y.version);
  EXPECT_EQ(x.flags, y.flags);
  EXPECT_EQ(x.credits, y.credits);
  EXPECT_EQ(x.target_iomap_size, y.target_iomap_size);
  EXPECT_EQ(x.target_sgl.addr, y.target_sgl.addr);
  EXPECT_EQ(x.target_sgl.key, y.target_sgl.key);
  EXPECT_EQ(x.target_sgl.length, y.target_sgl.length);
  EXPECT_EQ(x.data_buf.addr, y.data_buf.addr);
  EXPECT_EQ(x.data_buf.key, y.data_buf.key);
  EXPECT_EQ(x.data_buf.length, y.data_buf.length);
}

int decode(const std::vector<uint8_t> &bytes, ConnRecord *r, RecordError *why) {
  return decode_conn_record(bytes.data(), bytes.size(), r, why);
}

TEST(ConnRecord, SizeIs40) {
  // §1.3
  EXPECT_EQ(kConnRecordSize, 40u);
  EXPECT_EQ(sizeof(kGoldenX86), 40u);
}

TEST(ConnRecord, EncodeGoldenX86) {
  // §1.3, §9.1
  const std::vector<uint8_t> want(kGoldenX86, kGoldenX86 + kConnRecordSize);
  EXPECT_EQ(encode(golden_record()), want);
}

TEST(ConnRecord, DecodeGoldenX86) {
  // §1.3
  ConnRecord r;
  RecordError why = RecordError::kTooShort;
  ASSERT_EQ(decode_conn_record(kGoldenX86, sizeof kGoldenX86, &r, &why), 0);
  EXPECT_EQ(why, RecordError::kNone);
  expect_equal(r, golden_record());
}

TEST(ConnRecord, FieldOffsets) {
  // §1.3: each field at its offset; credits BE16; 3 reserved zero bytes; iomap
  // scale at offset 7; SGE sub-order addr, key, length (key before length).
  ConnRecord r;
  r.version = 1;
  r.flags = 0x03;
  r.credits = 0xA1B2;
  r.target_iomap_size = 0x81;
  r.target_sgl = {0x0102030405060708ull, 0x11121314u, 2};
  r.data_buf = {0x2122232425262728ull, 0x31323334u, 0x41424344u};
  const std::vector<uint8_t> want = {
      0x01, 0x03, 0xA1, 0xB2, 0x00, 0x00, 0x00, 0x81,  //
      0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,  //
      0x11, 0x12, 0x13, 0x14, 0x00, 0x00, 0x00, 0x02,  //
      0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28,  //
      0x31, 0x32, 0x33, 0x34, 0x41, 0x42, 0x43, 0x44,  //
  };
  EXPECT_EQ(encode(r), want);
}

TEST(ConnRecord, RoundTrip) {
  // §1.3
  ConnRecord r = golden_record();
  r.flags = 0x01;
  r.credits = 0xFFFE;
  r.target_iomap_size = 0xFF;
  r.data_buf.length = kMaxDataLength;
  ConnRecord back;
  ASSERT_EQ(decode(encode(r), &back, nullptr), 0);
  expect_equal(back, r);
}

TEST(ConnRecord, LocalFlagsOnLittleEndianHost) {
  // §1.3, §9.1: x86 sends 0x02 (IOMAP set, NET clear).
  if (host_is_big_endian()) GTEST_SKIP() << "big-endian host";
  EXPECT_EQ(local_conn_flags(), 0x02);
}

TEST(ConnRecord, BadVersionIsEprotonosupport) {
  // §1.3: version must be 1; other versions are another protocol.
  for (uint8_t v : {2, 3, 0x7F, 0xFF}) {
    std::vector<uint8_t> b(kGoldenX86, kGoldenX86 + kConnRecordSize);
    b[0] = v;
    ConnRecord r;
    RecordError why = RecordError::kNone;
    EXPECT_EQ(decode(b, &r, &why), -EPROTONOSUPPORT) << "version " << int(v);
    EXPECT_EQ(why, RecordError::kBadVersion);
  }
}

TEST(ConnRecord, ZeroVersionIsNotAnRsocket) {
  // A peer that is no rsocket leaves zero-padded CM data: version 0 reads as
  // "not an rsocket", not as another version of the protocol.
  std::vector<uint8_t> b(kConnRecordSize, 0);
  ConnRecord r;
  RecordError why = RecordError::kNone;
  EXPECT_EQ(decode(b, &r, &why), -EPROTO);
  EXPECT_EQ(why, RecordError::kNotRsocket);
}

TEST(ConnRecord, ShortInputIsEproto) {
  // §1.3: fewer than 40 bytes is not an rsocket record.
  for (size_t len = 0; len < kConnRecordSize; ++len) {
    ConnRecord r;
    RecordError why = RecordError::kNone;
    EXPECT_EQ(decode_conn_record(kGoldenX86, len, &r, &why), -EPROTO) << "len " << len;
    EXPECT_EQ(why, RecordError::kTooShort);
  }
}

TEST(ConnRecord, PaddedInputParsesFirst40Bytes) {
  // §1.3.1: IB CM pads private data (REQ 56, REP 196 bytes): parse the first 40.
  for (size_t len : {41u, 56u, 64u, 196u}) {
    std::vector<uint8_t> b(kGoldenX86, kGoldenX86 + kConnRecordSize);
    b.resize(len, 0x5C);  // garbage padding
    ConnRecord r;
    RecordError why = RecordError::kTooShort;
    ASSERT_EQ(decode(b, &r, &why), 0) << "len " << len;
    EXPECT_EQ(why, RecordError::kNone);
    expect_equal(r, golden_record());
  }
}

TEST(ConnRecord, SglCountOtherThanTwoIsEproto) {
  // §1.3: target_sgl.length is the entry count, always RS_SGL_SIZE = 2 (a byte
  // count such as 32 is the classic mistake).
  for (uint32_t n : {0u, 1u, 3u, 16u, 32u, 0x02000000u}) {
    ConnRecord g = golden_record();
    g.target_sgl.length = n;
    ConnRecord r;
    RecordError why = RecordError::kNone;
    EXPECT_EQ(decode(encode(g), &r, &why), -EPROTO) << n;
    EXPECT_EQ(why, RecordError::kBadSglCount);
  }
}

TEST(ConnRecord, ZeroCreditsIsEproto) {
  // §1.3, §2.4: credits = the sender's rq_size; 0 would forbid any data.
  ConnRecord g = golden_record();
  g.credits = 0;
  ConnRecord r;
  RecordError why = RecordError::kNone;
  EXPECT_EQ(decode(encode(g), &r, &why), -EPROTO);
  EXPECT_EQ(why, RecordError::kNoCredits);
}

TEST(ConnRecord, EmptyOrHugeBufferIsEproto) {
  // §1.3, §2.6: data_buf.length = rbuf_size/2, > 0 and within a 29-bit length.
  for (uint32_t len : {0u, kMaxDataLength + 1, 0xFFFFFFFFu}) {
    ConnRecord g = golden_record();
    g.data_buf.length = len;
    ConnRecord r;
    RecordError why = RecordError::kNone;
    EXPECT_EQ(decode(encode(g), &r, &why), -EPROTO) << len;
    EXPECT_EQ(why, RecordError::kEmptyBuffer);
  }
}

TEST(ConnRecord, FlagsAndReservedBytesAreNotValidated) {
  // §1.3: flags are informational (NET, IOMAP); the reserved bytes are not checked
  // by rsocket either. A tolerant receiver accepts them.
  std::vector<uint8_t> b(kGoldenX86, kGoldenX86 + kConnRecordSize);
  b[1] = 0xFF;
  b[4] = 0x12;
  b[5] = 0x34;
  b[6] = 0x56;
  ConnRecord r;
  EXPECT_EQ(decode(b, &r, nullptr), 0);
  EXPECT_EQ(r.flags, 0xFF);
}

TEST(ConnRecord, ErrorTextsAreNonEmpty) {
  for (RecordError e : {RecordError::kNone, RecordError::kTooShort, RecordError::kBadVersion, RecordError::kBadSglCount,
                        RecordError::kNoCredits, RecordError::kEmptyBuffer}) {
    ASSERT_NE(record_error_text(e), nullptr);
    EXPECT_GT(strlen(record_error_text(e)), 1u);
  }
}

TEST(ConnRecord, StreamInitFillsRecord) {
  // §1.3, §1.6: the record a Stream sends describes its own layout: credits =
  // rq_size (clamped to [16, 0xFFFE]), target SGL table with 2 entries, first
  // half of the receive ring, no iomap table.
  struct Case {
    uint16_t rq, want_rq;
  } cases[] = {{384, 384}, {1, 16}, {16, 16}, {0xFFFF, 0xFFFE}, {1000, 1000}};
  for (const Case &c : cases) {
    StreamConfig cfg;
    cfg.rq_size = c.rq;
    cfg.rbuf_size = 1u << 17;
    wiretest::Endpoint e(3, cfg);
    const ConnRecord &r = e.record;
    EXPECT_EQ(r.version, 1);
    EXPECT_EQ(r.flags, local_conn_flags());
    EXPECT_EQ(r.credits, c.want_rq);
    EXPECT_EQ(e.s.rq_size(), c.want_rq);
    EXPECT_EQ(r.target_iomap_size, 0);
    EXPECT_EQ(r.target_sgl.addr, e.table_addr);
    EXPECT_EQ(r.target_sgl.key, e.table_key);
    EXPECT_EQ(r.target_sgl.length, 2u);
    EXPECT_EQ(r.data_buf.addr, e.rbuf_addr);
    EXPECT_EQ(r.data_buf.key, e.rbuf_key);
    EXPECT_EQ(r.data_buf.length, 1u << 16);
    // The record a Stream builds always decodes.
    ConnRecord back;
    EXPECT_EQ(decode(encode(r), &back, nullptr), 0);
  }
}

TEST(ConnRecord, StreamInitClampsQueuesAndBuffers) {
  // §1.6 (sq/rq clamp), §2.10 (wmem < 2048 -> 4096, even rbuf).
  StreamConfig cfg;
  cfg.sq_size = 1;
  cfg.rq_size = 1;
  cfg.sbuf_size = 100;
  cfg.rbuf_size = 4097;
  wiretest::Endpoint e(0, cfg);
  EXPECT_EQ(e.s.sq_size(), kQpMinSize);
  EXPECT_EQ(e.s.rq_size(), kQpMinSize);
  EXPECT_EQ(e.s.sbuf_size(), 4096u);
  EXPECT_EQ(e.s.rbuf_size(), 4096u);
  EXPECT_EQ(e.record.data_buf.length, 2048u);
  cfg.sq_size = 0xFFFF;
  wiretest::Endpoint f(1, cfg);
  EXPECT_EQ(f.s.sq_size(), kMaxSendQueue);
  // Receives to post before connecting: rq_size + 4 control (§9.3).
  EXPECT_EQ(f.s.recv_posts_needed(), f.s.rq_size() + kQpCtrlSize);
}

// ---- §1.3.2 size "scale" code ----

TEST(ScaleCode, ExactUpTo128) {
  for (uint32_t v = 0; v <= 128; ++v) {
    EXPECT_EQ(scale_encode(v), v);
    EXPECT_EQ(scale_decode(static_cast<uint8_t>(v)), v);
  }
}

TEST(ScaleCode, From129To255IsCode0x80Meaning128) {
  for (uint32_t v = 129; v <= 255; ++v) {
    EXPECT_EQ(scale_encode(v), 0x80) << v;
    EXPECT_EQ(scale_decode(scale_encode(v)), 128u) << v;
  }
}

TEST(ScaleCode, GoldenValues) {
  EXPECT_EQ(scale_encode(256), 0x81);
  EXPECT_EQ(scale_decode(0x81), 256u);
  EXPECT_EQ(scale_encode(511), 0x81);
  EXPECT_EQ(scale_encode(512), 0x82);
  EXPECT_EQ(scale_encode(32512), 0xFF);  // the largest representable size
  EXPECT_EQ(scale_decode(0xFF), 32512u);
  EXPECT_EQ(scale_decode(0x80), 128u);
}

TEST(ScaleCode, EveryCodeRoundTrips) {
  for (uint32_t c = 0; c <= 0xFF; ++c) EXPECT_EQ(scale_encode(scale_decode(static_cast<uint8_t>(c))), c) << c;
}

TEST(ScaleCode, ValuesRoundToRepresentable) {
  for (uint32_t v = 0; v <= 32767; ++v) {
    const uint32_t want = v <= 128 ? v : v < 256 ? 128 : (v & ~0xFFu);
    ASSERT_EQ(scale_decode(scale_encode(v)), want) << v;
  }
}

}  // namespace
}  // namespace gpusock::wire

// The receive ring a socket asks for (SO_RCVBUF, GPUSOCK_MEM_DEFAULT) always
// gives a record the peer accepts: even, a page at least, halves within
// data_buf's limit.
TEST(RingSize, RequestsBecomeRecordsThePeerAccepts) {
  using gpusock::wire::receive_ring_size;
  EXPECT_EQ(receive_ring_size(0), 4096u);
  EXPECT_EQ(receive_ring_size(131073), 131072u);
  EXPECT_EQ(receive_ring_size(1u << 30), 2 * gpusock::wire::kMaxDataLength);
  EXPECT_EQ(receive_ring_size(~0u), 2 * gpusock::wire::kMaxDataLength);
  for (uint32_t requested : {0u, 4095u, 65536u, (1u << 29) + 3, 1u << 30, ~0u}) {
    gpusock::wire::ConnRecord r;
    r.credits = 64;
    r.target_sgl = {0x1000, 7, 2};
    r.data_buf = {0x2000, 9, receive_ring_size(requested) / 2};
    uint8_t bytes[gpusock::wire::kConnRecordSize];
    gpusock::wire::encode_conn_record(r, bytes);
    gpusock::wire::ConnRecord back;
    gpusock::wire::RecordError why;
    EXPECT_EQ(gpusock::wire::decode_conn_record(bytes, sizeof bytes, &back, &why), 0)
        << requested << ": " << gpusock::wire::record_error_text(why);
  }
}
