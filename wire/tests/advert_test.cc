// SGL records and buffer adverts (docs/wire-protocol.md §1.3.1, §2.1, §2.3, §2.9).
#include <gtest/gtest.h>

#include <vector>

#include "wire/core/stream.h"
#include "wire/tests/harness.h"

namespace gpusock::wire {
namespace {

using wiretest::drain;
using wiretest::drain_complete;
using wiretest::Endpoint;
using wiretest::Pair;
using wiretest::writes_only;

constexpr uint64_t kPeerTable = 0x0000500000000000ull;
constexpr uint32_t kPeerTableKey = 0x77;
constexpr uint64_t kPeerRing = 0x0000900000000000ull;
constexpr uint32_t kPeerRingKey = 0x88;

ConnRecord peer_record(uint32_t half = 1u << 16, uint16_t credits = 100, uint8_t flags = kConnFlagIomap) {
  ConnRecord r;
  r.flags = flags;
  r.credits = credits;
  r.target_sgl = {kPeerTable, kPeerTableKey, 2};
  r.data_buf = {kPeerRing, kPeerRingKey, half};
  return r;
}

std::vector<uint8_t> sgl_bytes(const SglEntry &e, bool owner_be) {
  std::vector<uint8_t> out(kSglRecordSize, 0xAA);
  encode_sgl_record(e, owner_be, out.data());
  return out;
}

TEST(SglRecord, LittleEndianOwnerGolden) {
  // §2.3 step 4, §2.9: {addr u64, key u32, length u32} in the owner's byte order;
  // an x86 owner gets little-endian fields.
  const SglEntry e{0x1122334455667788ull, 0xAABBCCDDu, 0x00010000u};
  const std::vector<uint8_t> want = {0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,
                                     0xDD, 0xCC, 0xBB, 0xAA, 0x00, 0x00, 0x01, 0x00};
  EXPECT_EQ(sgl_bytes(e, false), want);
}

TEST(SglRecord, BigEndianOwnerGolden) {
  // §2.9: a big-endian owner (peer flag NET) gets every field byte-swapped.
  const SglEntry e{0x1122334455667788ull, 0xAABBCCDDu, 0x00010000u};
  const std::vector<uint8_t> want = {0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88,
                                     0xAA, 0xBB, 0xCC, 0xDD, 0x00, 0x01, 0x00, 0x00};
  EXPECT_EQ(sgl_bytes(e, true), want);
}

TEST(SglRecord, HostOrderRecordMatchesTargetTableEntry) {
  // §2.3: the record lands verbatim in the owner's table slot.
  const SglEntry e{0x0000123456789ABCull, 0x01020304u, 4096};
  const std::vector<uint8_t> b = sgl_bytes(e, host_is_big_endian());
  TargetTableEntry t;
  memcpy(&t, b.data(), sizeof t);
  EXPECT_EQ(t.addr, e.addr);
  EXPECT_EQ(t.key, e.key);
  EXPECT_EQ(t.length, e.length);
}

TEST(Advert, ReceivesArePostedBeforeConnect) {
  // §1.5 step 4, §9.3: post rq_size (+4 control) receives before connect/accept.
  Endpoint e(0, StreamConfig{});
  std::vector<Action> acts = drain(e.s);
  ASSERT_EQ(acts.size(), 1u);
  EXPECT_EQ(acts[0].kind, ActionKind::kPostRecv);
  EXPECT_EQ(acts[0].count, 384u + 4u);
  EXPECT_EQ(e.s.state(), StreamState::kIdle);
}

TEST(Advert, NoReceivesPostedWhereTheTransportNeedsNone) {
  // libfabric shm takes immediates without posted receives
  // (TransportCaps::needs_recv_posts): neither at set-up nor per message is a
  // kPostRecv produced; the credits and adverts on the wire are the same.
  StreamConfig config;
  config.posts_receives = false;
  Endpoint e(0, config);
  EXPECT_TRUE(drain(e.s).empty());
  ASSERT_EQ(e.s.on_established(peer_record()), 0);
  std::vector<Action> acts = drain(e.s);
  ASSERT_EQ(acts.size(), 1u);
  EXPECT_EQ(acts[0].kind, ActionKind::kWrite);
  EXPECT_EQ(acts[0].write_kind, WriteKind::kCredits);
  EXPECT_EQ(acts[0].imm, 0x80000000u | 384u);
  ASSERT_EQ(e.s.on_recv_imm(imm_data(64), 64), 0);
  for (const Action &a : drain(e.s)) EXPECT_NE(a.kind, ActionKind::kPostRecv);
}

TEST(Advert, FirstCreditAdvertisesSecondHalfIntoSlot1) {
  // §1.3.1: slot 0 is the peer's data_buf; §2.3 step 2 / §9.7: the first credit
  // update advertises H1 (offset rbuf_size/2) into the peer's slot 1.
  Endpoint e(0, StreamConfig{});
  ASSERT_EQ(e.s.on_established(peer_record()), 0);
  std::vector<Action> acts = drain(e.s);
  ASSERT_EQ(acts.size(), 2u);
  EXPECT_EQ(acts[0].kind, ActionKind::kPostRecv);
  const Action &w = acts[1];
  ASSERT_EQ(w.kind, ActionKind::kWrite);
  EXPECT_EQ(w.write_kind, WriteKind::kCredits);
  EXPECT_TRUE(w.has_imm);
  EXPECT_EQ(w.imm, 0x80000000u | 384u);  // rseq_no 0 + rq_size 384 (§2.4)
  EXPECT_EQ(w.length, kSglRecordSize);
  EXPECT_EQ(w.remote_addr, kPeerTable + 16);
  EXPECT_EQ(w.rkey, kPeerTableKey);
  EXPECT_TRUE(w.inline_ok);  // 16 <= default inline 64 (§2.10)
  const std::vector<uint8_t> rec(w.record, w.record + kSglRecordSize);
  EXPECT_EQ(rec, sgl_bytes(SglEntry{e.rbuf_addr + (1u << 16), e.rbuf_key, 1u << 16}, false));
}

TEST(Advert, RecordIsInPeerByteOrder) {
  // §1.3.1, §2.9: a peer with RS_CONN_FLAG_NET owns a big-endian table.
  Endpoint e(0, StreamConfig{});
  ASSERT_EQ(e.s.on_established(peer_record(1u << 16, 100, kConnFlagIomap | kConnFlagNet)), 0);
  std::vector<Action> w = writes_only(drain(e.s));
  ASSERT_EQ(w.size(), 1u);
  const std::vector<uint8_t> rec(w[0].record, w[0].record + kSglRecordSize);
  EXPECT_EQ(rec, sgl_bytes(SglEntry{e.rbuf_addr + (1u << 16), e.rbuf_key, 1u << 16}, true));
  // Spelled out: addr = rbuf_addr + 0x10000 = 0x0000010000010000.
  const std::vector<uint8_t> want = {0x00, 0x00, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00,
                                     0x00, 0x00, 0x10, 0x01, 0x00, 0x01, 0x00, 0x00};
  EXPECT_EQ(rec, want);
}

TEST(Advert, SmallInlineLimitStillAdvertises) {
  // §2.10: a record larger than the inline limit goes out from a staging area;
  // identical on the wire.
  StreamConfig cfg;
  cfg.inline_size = 0;
  Endpoint e(0, cfg);
  ASSERT_EQ(e.s.on_established(peer_record()), 0);
  std::vector<Action> w = writes_only(drain(e.s));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].length, kSglRecordSize);
  EXPECT_FALSE(w[0].inline_ok);
}

// Feeds `bytes` of data in messages of `msg` bytes, as the peer would.
void receive(Stream &s, uint32_t bytes, uint32_t msg) {
  while (bytes) {
    const uint32_t n = bytes < msg ? bytes : msg;
    ASSERT_EQ(s.on_recv_imm(imm_data(n), n), 0) << (s.error_reason() ? s.error_reason() : "");
    bytes -= n;
  }
}

TEST(Advert, OnlyWhenAWholeHalfIsConsumed) {
  // §2.3 step 3, §9.6: re-advertise a half only after the app consumed all of it;
  // halves alternate H1, H0, H1, ... into peer slots 1, 0, 1, ...
  Endpoint e(0, StreamConfig{});
  const uint32_t h = e.half();
  ASSERT_EQ(e.s.on_established(peer_record()), 0);
  ASSERT_EQ(writes_only(drain_complete(e.s)).size(), 1u);  // H1 -> slot 1
  uint32_t msgs = 0;
  for (int round = 0; round < 6; ++round) {
    receive(e.s, h, 8192);  // fill the next half (8 messages, below rq/2 = 192)
    msgs += h / 8192;
    EXPECT_TRUE(writes_only(drain(e.s)).empty()) << "round " << round;
    e.s.recv_consume(h - 1);
    EXPECT_TRUE(writes_only(drain(e.s)).empty()) << "advert before the half was fully consumed, round " << round;
    e.s.recv_consume(1);
    std::vector<Action> w = writes_only(drain_complete(e.s));
    ASSERT_EQ(w.size(), 1u) << "round " << round;
    EXPECT_EQ(w[0].write_kind, WriteKind::kCredits);
    EXPECT_EQ(w[0].length, kSglRecordSize);
    const uint32_t slot = round % 2;            // 0, 1, 0, ... (after the first to slot 1)
    const uint64_t half_off = (round % 2) * h;  // H0, H1, H0, ...
    EXPECT_EQ(w[0].remote_addr, kPeerTable + 16u * slot) << "round " << round;
    EXPECT_EQ(w[0].imm, imm_credits(static_cast<uint16_t>(msgs + 384))) << "round " << round;
    const std::vector<uint8_t> rec(w[0].record, w[0].record + kSglRecordSize);
    EXPECT_EQ(rec, sgl_bytes(SglEntry{e.rbuf_addr + half_off, e.rbuf_key, h}, false)) << "round " << round;
  }
}

TEST(Advert, PartialConsumptionAcrossBothHalvesAdvertisesOnce) {
  // §2.3 step 3: free bytes >= half is what counts, not message boundaries.
  Endpoint e(0, StreamConfig{});
  const uint32_t h = e.half();
  ASSERT_EQ(e.s.on_established(peer_record()), 0);
  drain(e.s);
  receive(e.s, h, 1000);
  receive(e.s, 5000, 5000);  // into H1
  e.s.recv_consume(h / 2);
  EXPECT_TRUE(writes_only(drain(e.s)).empty());
  e.s.recv_consume(h / 2 + 4999);  // H0 done, H1 partly
  std::vector<Action> w = writes_only(drain(e.s));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].length, kSglRecordSize);
  EXPECT_EQ(w[0].remote_addr, kPeerTable);  // slot 0
  e.s.recv_consume(1);
  EXPECT_TRUE(writes_only(drain(e.s)).empty());
}

TEST(Advert, PairAlternatesAndSenderFollowsSlots) {
  // §2.3: end to end; the harness checks every advert (slot 1,0,1,..., H1,H0,...)
  // and that every data write lands at the next ring offset (slots in order).
  Pair p;
  p.log_writes = true;
  const uint64_t total = 1u << 20;
  std::string err;
  while (p.b().app_recv < total) {
    p.a().send_pattern(total - p.a().app_sent);
    ASSERT_TRUE(p.run()) << p.violation;
    p.b().recv_check(UINT64_MAX, &err);
    ASSERT_TRUE(err.empty()) << err;
  }
  ASSERT_TRUE(p.run()) << p.violation;
  EXPECT_TRUE(p.ok()) << p.violation;
  // One initial advert plus one per consumed half.
  EXPECT_EQ(p.b().adverts, 1 + total / p.b().half());
  std::vector<uint64_t> slots;
  for (const Action &a : p.b().log)
    if (a.write_kind == WriteKind::kCredits && a.length == kSglRecordSize)
      slots.push_back((a.remote_addr - p.a().table_addr) / kSglRecordSize);
  ASSERT_GE(slots.size(), 4u);
  for (size_t i = 0; i < slots.size(); ++i) EXPECT_EQ(slots[i], (i + 1) % 2) << i;
}

}  // namespace
}  // namespace gpusock::wire
