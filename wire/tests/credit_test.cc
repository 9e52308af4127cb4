// Credits and flow control (docs/wire-protocol.md §1.3.1, §2.4, §2.5, §9.4, §9.5).
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

ConnRecord peer_record(uint16_t credits, uint32_t half = 1u << 16) {
  ConnRecord r;
  r.flags = kConnFlagIomap;
  r.credits = credits;
  r.target_sgl = {kPeerTable, kPeerTableKey, 2};
  r.data_buf = {kPeerRing, kPeerRingKey, half};
  return r;
}

std::vector<Action> data_writes(const std::vector<Action> &v) {
  std::vector<Action> out;
  for (const Action &a : v)
    if (a.kind == ActionKind::kWrite && a.write_kind == WriteKind::kData) out.push_back(a);
  return out;
}

TEST(Credits, InitialCreditsComeFromThePeerRecord) {
  // §1.3.1: sseq_comp := credits.
  for (uint16_t c : {1, 16, 384, 0xFFFE, 0xFFFF}) {
    Endpoint e(0, StreamConfig{});
    ASSERT_EQ(e.s.on_established(peer_record(c)), 0);
    EXPECT_EQ(e.s.credits_available(), c);
  }
}

class CreditCadence : public ::testing::TestWithParam<uint16_t> {};

TEST_P(CreditCadence, UpdateEveryHalfRqReceivedMessages) {
  // §2.4: R sends an update when rseq_no - rseq_comp >= 0, then rseq_comp :=
  // rseq_no + rq_size/2; the value is rseq_no + rq_size (16-bit). Without a
  // free half it is a 0-byte "credits only" write (§2.1).
  StreamConfig cfg;
  cfg.rq_size = GetParam();
  Endpoint e(0, cfg);
  const uint16_t rq = e.s.rq_size();
  ASSERT_EQ(e.s.on_established(peer_record(100)), 0);
  std::vector<Action> w = writes_only(drain_complete(e.s));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].imm, imm_credits(rq));  // the first advert carries rseq 0 + rq
  for (uint32_t k = 1; k <= 4u * rq; ++k) {
    ASSERT_EQ(e.s.on_recv_imm(imm_data(1), 1), 0);
    w = writes_only(drain_complete(e.s));
    if (k % (rq / 2) == 0) {
      ASSERT_EQ(w.size(), 1u) << "message " << k;
      EXPECT_EQ(w[0].write_kind, WriteKind::kCredits);
      EXPECT_EQ(w[0].length, 0u);  // no half free: credits only
      EXPECT_EQ(w[0].imm, imm_credits(static_cast<uint16_t>(k + rq))) << "message " << k;
      EXPECT_EQ(w[0].remote_addr, kPeerTable);
      EXPECT_EQ(w[0].rkey, kPeerTableKey);
    } else {
      ASSERT_TRUE(w.empty()) << "message " << k << ": update before rq/2 messages";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(RqSizes, CreditCadence, ::testing::Values(16, 17, 100, 384, 1000));

TEST(Credits, AdvertResetsTheUpdateThreshold) {
  // §2.4: rseq_comp is reset at *every* update, adverts included.
  StreamConfig cfg;
  cfg.rq_size = 16;
  Endpoint e(0, cfg);
  const uint32_t h = e.half();
  ASSERT_EQ(e.s.on_established(peer_record(100)), 0);
  drain_complete(e.s);
  // 7 messages fill H0; consuming them frees a half -> advert with value 7 + 16.
  for (int i = 0; i < 6; ++i) ASSERT_EQ(e.s.on_recv_imm(imm_data(h / 8), h / 8), 0);
  ASSERT_EQ(e.s.on_recv_imm(imm_data(h / 4), h / 4), 0);
  e.s.recv_consume(h);
  std::vector<Action> w = writes_only(drain_complete(e.s));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].length, kSglRecordSize);
  EXPECT_EQ(w[0].imm, imm_credits(7 + 16));
  // Next threshold is 7 + 8 = 15, not 8.
  for (uint32_t k = 8; k <= 15; ++k) {
    ASSERT_EQ(e.s.on_recv_imm(imm_data(1), 1), 0);
    w = writes_only(drain_complete(e.s));
    if (k < 15) {
      EXPECT_TRUE(w.empty()) << k;
    } else {
      ASSERT_EQ(w.size(), 1u);
      EXPECT_EQ(w[0].imm, imm_credits(15 + 16));
    }
  }
}

TEST(Credits, ValueIsTruncatedTo16Bits) {
  // §2.4, §9.4: value = rseq_no + rq_size, truncated to 16 bits.
  StreamConfig cfg;
  cfg.rq_size = 0xFFFE;
  Endpoint e(0, cfg);
  ASSERT_EQ(e.s.on_established(peer_record(100)), 0);
  std::vector<Action> w = writes_only(drain_complete(e.s));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].imm, 0x8000FFFEu);
  for (uint32_t k = 1; k <= 0x7FFF; ++k) ASSERT_EQ(e.s.on_recv_imm(imm_data(1), 1), 0);
  w = writes_only(drain_complete(e.s));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].imm, 0x80000000u | ((0x7FFFu + 0xFFFEu) & 0xFFFFu));  // 0x80007FFD
}

TEST(Credits, SenderNeverSendsWhenSseqNoEqualsSseqComp) {
  // §2.4: data only while sseq_no != sseq_comp.
  StreamConfig cfg;
  cfg.sq_size = 1024;
  Endpoint e(0, cfg);
  ASSERT_EQ(e.s.on_established(peer_record(16, 1u << 20)), 0);
  drain_complete(e.s);
  for (int i = 0; i < 16; ++i) {
    ASSERT_EQ(e.send_pattern(1), 1u);
    ASSERT_EQ(data_writes(drain_complete(e.s)).size(), 1u) << i;
  }
  EXPECT_EQ(e.s.credits_available(), 0);
  ASSERT_EQ(e.send_pattern(1), 1u);
  EXPECT_TRUE(data_writes(drain_complete(e.s)).empty());
  EXPECT_EQ(e.s.send_unposted(), 1u);
  // The receiver grants 8 more (rseq 8 + rq 16 = 24).
  ASSERT_EQ(e.s.on_recv_imm(imm_credits(24), 0), 0);
  EXPECT_EQ(e.s.credits_available(), 8);
  EXPECT_EQ(data_writes(drain_complete(e.s)).size(), 1u);
  EXPECT_EQ(e.s.credits_available(), 7);
}

TEST(Credits, BulkSendStopsAfterExactlyTheGrantedMessages) {
  // §2.4: a large commit is cut into at most `credits` messages.
  StreamConfig cfg;
  cfg.sbuf_size = 8u << 20;
  cfg.sq_size = 1024;
  Endpoint e(0, cfg);
  ASSERT_EQ(e.s.on_established(peer_record(16, 16u << 20)), 0);
  drain_complete(e.s);
  ASSERT_EQ(e.send_pattern(8u << 20), 8u << 20);  // more than 16 writes of at most kMaxWrite
  EXPECT_EQ(data_writes(drain_complete(e.s)).size(), 16u);
  EXPECT_EQ(e.s.credits_available(), 0);
  EXPECT_GT(e.s.send_unposted(), 0u);
  EXPECT_TRUE(drain(e.s).empty());
}

TEST(Credits, SenderSequenceWrapsPast65535) {
  // §2.4: sseq_no / sseq_comp are 16-bit and compared mod 2^16; the receiver's
  // absolute values keep coming across the wrap.
  Endpoint e(0, StreamConfig{});
  ASSERT_EQ(e.s.on_established(peer_record(16, 1u << 20)), 0);
  drain_complete(e.s);
  uint32_t sent = 0;
  const uint32_t half = 1u << 20;  // 70000 bytes stay inside slot 0
  for (uint32_t i = 0; i < 70000; ++i) {
    ASSERT_EQ(e.send_pattern(1), 1u);
    std::vector<Action> d = data_writes(drain_complete(e.s));
    ASSERT_EQ(d.size(), 1u) << "stalled at message " << i;
    EXPECT_EQ(d[0].remote_addr, kPeerRing + sent % half);
    ++sent;
    if (sent % 8 == 0) {  // what an rq 16 receiver sends after each 8 messages
      ASSERT_EQ(e.s.on_recv_imm(imm_credits(static_cast<uint16_t>(sent + 16)), 0), 0) << e.s.error_reason();
    }
  }
  EXPECT_EQ(e.s.state(), StreamState::kConnected);
}

// Drives `msgs` messages of 1 byte in each direction through a pair, several
// per transport pass, consuming everything; the harness checks every credit
// value against rseq_no + rq_size and every data write's placement.
void wrap_pair(uint16_t rq_a, uint16_t rq_b, uint32_t msgs) {
  StreamConfig ca, cb;
  ca.rq_size = rq_a;
  cb.rq_size = rq_b;
  Pair p(ca, cb);
  std::string err;
  uint32_t sent = 0;
  while (sent < msgs) {
    for (int k = 0; k < 4 && sent < msgs; ++k, ++sent) {
      ASSERT_EQ(p.a().send_pattern(1), 1u);
      ASSERT_EQ(p.b().send_pattern(1), 1u);
      p.poll(0);
      p.poll(1);
    }
    ASSERT_TRUE(p.run()) << p.violation;
    ASSERT_TRUE(p.ok()) << p.violation;
    // Never stalls: everything committed went out and completed.
    ASSERT_EQ(p.a().s.send_unacked(), 0u) << "A stalled after " << sent;
    ASSERT_EQ(p.b().s.send_unacked(), 0u) << "B stalled after " << sent;
    p.a().recv_check(UINT64_MAX, &err);
    p.b().recv_check(UINT64_MAX, &err);
    ASSERT_TRUE(err.empty()) << err;
  }
  ASSERT_TRUE(p.run()) << p.violation;
  EXPECT_EQ(p.a().data_writes, msgs);
  EXPECT_EQ(p.b().data_msgs_received, msgs);
  EXPECT_EQ(p.b().data_writes, msgs);
  EXPECT_EQ(p.a().data_msgs_received, msgs);
  EXPECT_EQ(p.a().app_recv, msgs);
  EXPECT_EQ(p.b().app_recv, msgs);
  EXPECT_EQ(p.a().send_sum.h, p.b().recv_sum.h);
  EXPECT_EQ(p.b().send_sum.h, p.a().recv_sum.h);
  // The receivers' absolute credit values wrapped at 65535.
  EXPECT_GE(p.a().credit_value_wraps, 1u);
  EXPECT_GE(p.b().credit_value_wraps, 1u);
  EXPECT_EQ(p.a().s.state(), StreamState::kConnected);
  EXPECT_EQ(p.b().s.state(), StreamState::kConnected);
}

TEST(Credits, PairWrapAroundRq16) { wrap_pair(16, 16, 70000); }
TEST(Credits, PairWrapAroundMixedRq) { wrap_pair(17, 384, 70000); }
TEST(Credits, PairWrapAroundMaxRq) { wrap_pair(0xFFFE, 16, 140000); }

}  // namespace
}  // namespace gpusock::wire
