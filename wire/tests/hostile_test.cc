// Hostile or broken peers (docs/wire-protocol.md §8; §2.3, §2.4, §3.1, §4). Each
// violation must put that connection in StreamState::kError with a negative
// errno and a readable reason; afterwards the core produces no write at all,
// and nothing it wrote went out of bounds (the harness checks every write's
// local and remote range). Other connections are unaffected.
#include <gtest/gtest.h>

#include <string>
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

uint64_t writes_posted(const Endpoint &e) {
  return e.data_writes + e.adverts + e.credit_only + e.controls + e.keepalives;
}

// The connection of endpoint i is dead: error state, negative errno, reason
// containing `why`; nothing the app or the peer does makes it write again.
void expect_dead(Pair &p, int i, const char *why) {
  Stream &s = p[i].s;
  ASSERT_EQ(s.state(), StreamState::kError);
  EXPECT_LT(s.error(), 0);
  ASSERT_NE(s.error_reason(), nullptr);
  EXPECT_NE(std::string(s.error_reason()).find(why), std::string::npos) << s.error_reason();
  EXPECT_EQ(s.send_status(), s.error());
  EXPECT_TRUE(s.recv_closed());
  EXPECT_TRUE(s.ready_for_teardown());
  EXPECT_LE(s.recv_available(), s.rbuf_size());
  uint32_t off = 0;
  const uint32_t span = s.recv_span(&off);
  EXPECT_LE(static_cast<uint64_t>(off) + span, s.rbuf_size());

  const int err = s.error();
  const std::string reason = s.error_reason();
  const uint64_t before = writes_posted(p[i]);
  // Whatever happens next: more peer traffic, app activity, keepalive, close.
  EXPECT_EQ(s.on_recv_imm(imm_data(1), 1), err);
  EXPECT_EQ(s.on_recv_imm(imm_credits(0x1234), 0), err);
  EXPECT_EQ(s.on_recv_imm(make_imm(ImmOp::kIomapSgl, 0), 0), err);
  uint32_t soff = 0;
  if (const uint32_t n = s.send_space(&soff)) s.send_commit(n < 100 ? n : 100);  // an app ignoring send_status
  s.request_keepalive();
  s.shutdown(kShutWr);
  s.shutdown(kShutRdWr);
  ASSERT_TRUE(p.run()) << p.violation;
  Action a;
  EXPECT_FALSE(s.next_action(&a) && a.kind == ActionKind::kWrite);
  EXPECT_EQ(writes_posted(p[i]), before) << "writes after the error";
  EXPECT_EQ(s.error(), err) << "the first error sticks";
  EXPECT_EQ(std::string(s.error_reason()), reason);
  EXPECT_TRUE(p.ok()) << p.violation;
}

Pair hostile_pair(const StreamConfig &a = StreamConfig{}, const StreamConfig &b = StreamConfig{}) {
  Pair p(a, b);
  p.expect_no_errors = false;
  return p;
}

// ---- data beyond the advertised space (§2.3, §9.5) ----

TEST(Hostile, DataLongerThanAdvertisedBeforeSecondHalf) {
  // Only H0 (the record's data_buf) is advertised until B's first credit update.
  Pair p = hostile_pair();
  const uint32_t h = p.b().half();
  EXPECT_EQ(p.inject(1, imm_data(h + 1)), -EPROTO);
  EXPECT_EQ(p.b().s.recv_available(), 0u);
  expect_dead(p, 1, "past the receive space");
}

TEST(Hostile, DataPastAFullRing) {
  Pair p = hostile_pair();
  ASSERT_TRUE(p.run());
  const uint32_t h = p.b().half();
  EXPECT_EQ(p.inject(1, imm_data(h)), 0);
  EXPECT_EQ(p.inject(1, imm_data(h)), 0);  // both halves full, nothing consumed
  EXPECT_EQ(p.inject(1, imm_data(1)), -EPROTO);
  EXPECT_EQ(p.b().s.recv_available(), 2u * h);
  expect_dead(p, 1, "past the receive space");
}

TEST(Hostile, DataOfMaximumLength) {
  Pair p = hostile_pair();
  ASSERT_TRUE(p.run());
  EXPECT_EQ(p.inject(1, imm_data(kMaxDataLength)), -EPROTO);
  EXPECT_EQ(p.b().s.recv_available(), 0u);
  expect_dead(p, 1, "past the receive space");
}

TEST(Hostile, DataCrossingAHalfBoundary) {
  // §2.3 sender rule 3: a message never spans two slots.
  Pair p = hostile_pair();
  ASSERT_TRUE(p.run());
  const uint32_t h = p.b().half();
  EXPECT_EQ(p.inject(1, imm_data(100)), 0);
  EXPECT_EQ(p.inject(1, imm_data(h)), -EPROTO);
  EXPECT_EQ(p.b().s.recv_available(), 100u);
  expect_dead(p, 1, "crosses");
}

TEST(Hostile, DataCrossingTheRingEnd) {
  Pair p = hostile_pair();
  ASSERT_TRUE(p.run());
  const uint32_t h = p.b().half();
  EXPECT_EQ(p.inject(1, imm_data(h)), 0);
  p.b().s.recv_consume(h);
  ASSERT_TRUE(p.run());  // B re-advertises H0
  EXPECT_EQ(p.inject(1, imm_data(h - 10)), 0);
  EXPECT_EQ(p.inject(1, imm_data(20)), -EPROTO);  // H1's last 10 bytes + 10 of H0
  expect_dead(p, 1, "crosses");
}

// ---- credits (§2.4) ----

TEST(Hostile, MoreDataMessagesThanCredits) {
  // §2.4: a message beyond the credits granted would overrun rsocket's queue.
  StreamConfig cb;
  cb.rq_size = 16;
  Pair p = hostile_pair(StreamConfig{}, cb);  // B never polls: no update beyond 16
  for (int k = 0; k < 16; ++k) ASSERT_EQ(p.inject(1, imm_data(1)), 0) << k;
  EXPECT_EQ(p.inject(1, imm_data(1)), -EPROTO);
  EXPECT_EQ(p.b().s.recv_available(), 16u);
  expect_dead(p, 1, "more data messages than it was granted");
}

TEST(Hostile, ZeroLengthDataStillUsesACredit) {
  StreamConfig cb;
  cb.rq_size = 16;
  Pair p = hostile_pair(StreamConfig{}, cb);
  for (int k = 0; k < 16; ++k) ASSERT_EQ(p.inject(1, imm_data(0)), 0) << k;
  EXPECT_EQ(p.inject(1, imm_data(0)), -EPROTO);
  expect_dead(p, 1, "granted");
}

TEST(Hostile, CreditSequenceGoingBackwards) {
  // §2.4: values must be monotonic mod 2^16 (S overwrites sseq_comp).
  Pair p = hostile_pair();
  ASSERT_TRUE(p.run());
  EXPECT_EQ(p.a().s.credits_available(), 384);
  EXPECT_EQ(p.inject(0, imm_credits(383)), -EPROTO);
  expect_dead(p, 0, "backwards");
}

TEST(Hostile, CreditSequenceGoingBackwardsAfterTraffic) {
  Pair p = hostile_pair();
  ASSERT_TRUE(p.run());
  for (int k = 0; k < 10; ++k) {
    p.a().send_pattern(1);
    p.poll(0);
  }
  EXPECT_EQ(p.a().s.credits_available(), 374);
  EXPECT_EQ(p.inject(0, imm_credits(384 + 5)), 0);  // a real update (rseq 5)
  EXPECT_EQ(p.a().s.credits_available(), 379);
  EXPECT_EQ(p.inject(0, imm_credits(384 + 4)), -EPROTO);
  expect_dead(p, 0, "backwards");
}

TEST(Hostile, CreditsBeyondThePeersReceiveQueue) {
  // §2.4: the peer cannot grant more than rq_size (its record's credits) ahead.
  Pair p = hostile_pair();
  ASSERT_TRUE(p.run());
  EXPECT_EQ(p.inject(0, imm_credits(385)), -EPROTO);
  expect_dead(p, 0, "more credits than its receive queue");
}

TEST(Hostile, CreditsBeyondRqAcrossTheWrap) {
  StreamConfig cb;
  cb.rq_size = 16;
  Pair p = hostile_pair(StreamConfig{}, cb);
  ASSERT_TRUE(p.run());
  EXPECT_EQ(p.inject(0, imm_credits(0xFFFF)), -EPROTO);  // 65535 ahead of sseq 0
  expect_dead(p, 0, "more credits");
}

// ---- adverts written into our target table (§2.3, §1.3.1) ----

struct BadAdvert {
  const char *name;
  int64_t off;     // from the peer ring's start (B's rbuf)
  int key_delta;   // added to the right rkey
  int64_t length;  // -1: 2^32 - 1
};

class HostileAdvert : public ::testing::TestWithParam<BadAdvert> {};

TEST_P(HostileAdvert, OutsideThePeerRingOrWrongKey) {
  const BadAdvert &bad = GetParam();
  Pair p = hostile_pair();
  ASSERT_TRUE(p.run());  // B's genuine H1 advert sits in A's slot 1, unread
  const uint32_t h = p.b().half();
  // B overwrites it with a bogus one before A gets to slot 1.
  TargetTableEntry &t = p.a().table[1];
  t.addr = p.b().rbuf_addr + static_cast<uint64_t>(bad.off);
  t.key = p.b().rbuf_key + static_cast<uint32_t>(bad.key_delta);
  t.length = bad.length < 0 ? 0xFFFFFFFFu : static_cast<uint32_t>(bad.length);
  ASSERT_EQ(p.a().send_pattern(h + 5000), h + 5000u);
  p.poll(0);
  EXPECT_EQ(p.a().data_bytes_posted, h) << "only slot 0 may be used";
  expect_dead(p, 0, "outside its receive ring");
}

INSTANTIATE_TEST_SUITE_P(
    Cases, HostileAdvert,
    ::testing::Values(BadAdvert{"past_end", 2 * 65536, 0, 65536}, BadAdvert{"below_start", -4096, 0, 65536},
                      BadAdvert{"straddles_end", 65536 + 1, 0, 65536}, BadAdvert{"wrong_rkey", 65536, 1, 65536},
                      BadAdvert{"rkey_zero", 65536, -int(0x1000 + 16 + 1), 65536}, BadAdvert{"too_long", 65536, 0, -1},
                      BadAdvert{"whole_ring_plus_one", 0, 0, 2 * 65536 + 1},
                      BadAdvert{"wraps_address_space", -int64_t((1ull << 41) + 4096), 0, 65536}),
    [](const ::testing::TestParamInfo<BadAdvert> &i) { return std::string(i.param.name); });

TEST(Hostile, AdvertInsideTheRingIsAccepted) {
  // Control for the cases above: any in-ring region with the right key is the
  // peer's own business (its own memory), e.g. the whole ring at once.
  Pair p = hostile_pair();
  ASSERT_TRUE(p.run());
  const uint32_t h = p.b().half();
  TargetTableEntry &t = p.a().table[1];
  t.addr = p.b().rbuf_addr + h;
  t.key = p.b().rbuf_key;
  t.length = h;
  ASSERT_EQ(p.a().send_pattern(h + 5000), h + 5000u);
  p.poll(0);
  EXPECT_EQ(p.a().s.state(), StreamState::kConnected);
  EXPECT_EQ(p.a().data_bytes_posted, h + 5000u);
}

// ---- iomap and control (§2.2, §4) ----

TEST(Hostile, IomapUpdateWithoutAnIomapTable) {
  // §4: we advertise target_iomap_size 0, so an iomap write has nowhere to go.
  for (uint32_t index : {0u, 1u, 0xFFFFu}) {
    Pair p = hostile_pair();
    ASSERT_TRUE(p.run());
    EXPECT_EQ(p.inject(1, make_imm(ImmOp::kIomapSgl, index)), -EPROTO);
    expect_dead(p, 1, "iomap");
  }
}

TEST(Hostile, DataAfterDisconnect) {
  // §3.1: DISCONNECT ends the peer's sending; data after it is a violation.
  Pair p = hostile_pair();
  ASSERT_TRUE(p.run());
  EXPECT_EQ(p.inject(1, imm_ctrl(kCtrlDisconnect)), 0);
  EXPECT_EQ(p.b().s.state(), StreamState::kDisconnected);
  EXPECT_EQ(p.inject(1, imm_data(10)), -EPROTO);
  EXPECT_EQ(p.b().s.recv_available(), 0u);
  expect_dead(p, 1, "after its DISCONNECT");
}

TEST(Hostile, DataBeforeEstablished) {
  Endpoint e(0, StreamConfig{});
  EXPECT_EQ(e.s.on_recv_imm(imm_data(1), 1), -EPROTO);
  EXPECT_EQ(e.s.state(), StreamState::kError);
  EXPECT_NE(e.s.error_reason(), nullptr);
  EXPECT_TRUE(writes_only(drain(e.s)).empty());
}

TEST(Hostile, DataAfterShutdownIsToleratedAndReadable) {
  // §3.1: an rsocket peer may still post data after its SHUTDOWN; the receiver
  // queues it and the app reads it, then sees EOF.
  Pair p = hostile_pair();
  ASSERT_TRUE(p.run());
  EXPECT_EQ(p.inject(1, imm_ctrl(kCtrlShutdown)), 0);
  EXPECT_TRUE(p.b().s.recv_closed());
  EXPECT_EQ(p.b().s.state(), StreamState::kConnected);
  const uint8_t payload[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_EQ(p.inject(1, imm_data(10), payload), 0);
  EXPECT_EQ(p.b().s.state(), StreamState::kConnected);
  EXPECT_EQ(p.b().s.recv_available(), 10u);
  uint32_t off = 0;
  ASSERT_EQ(p.b().s.recv_span(&off), 10u);
  EXPECT_EQ(memcmp(&p.b().rbuf[off], payload, 10), 0);
  p.b().s.recv_consume(10);
  EXPECT_EQ(p.b().s.recv_available(), 0u);
  EXPECT_TRUE(p.b().s.recv_closed());  // now EOF
  // B can still send to A.
  ASSERT_EQ(p.b().send_pattern(5000), 5000u);
  ASSERT_TRUE(p.run());
  std::string err;
  EXPECT_EQ(p.a().recv_check(UINT64_MAX, &err), 5000u);
  EXPECT_TRUE(err.empty()) << err;
}

// ---- isolation ----

TEST(Hostile, OtherConnectionsKeepWorking) {
  Pair bad = hostile_pair();
  Pair good;
  ASSERT_TRUE(bad.run());
  ASSERT_TRUE(good.run());
  std::string err;
  // Both carry some traffic, then `bad` is attacked.
  for (Pair *p : {&bad, &good}) {
    p->a().send_pattern(100000);
    ASSERT_TRUE(p->run());
    p->b().recv_check(UINT64_MAX, &err);
  }
  EXPECT_EQ(bad.inject(1, imm_data(kMaxDataLength)), -EPROTO);
  expect_dead(bad, 1, "past");
  // `good` moves 8 MiB each way afterwards.
  for (int round = 0; round < 200; ++round) {
    good.a().send_pattern(UINT64_MAX);
    good.b().send_pattern(UINT64_MAX);
    ASSERT_TRUE(good.run()) << good.violation;
    good.a().recv_check(UINT64_MAX, &err);
    good.b().recv_check(UINT64_MAX, &err);
    ASSERT_TRUE(err.empty()) << err;
  }
  ASSERT_TRUE(good.run());
  EXPECT_TRUE(good.ok()) << good.violation;
  EXPECT_GT(good.b().app_recv, 8u << 20);
  EXPECT_GT(good.a().app_recv, 8u << 20);
  EXPECT_EQ(good.a().s.state(), StreamState::kConnected);
  EXPECT_EQ(good.b().s.state(), StreamState::kConnected);
  EXPECT_EQ(bad.b().s.state(), StreamState::kError);
}

// ---- regressions: core bugs found by these tests and the fuzzer ----

TEST(CoreRegression, NoKeepaliveFromTheCallThatDetectsABadAdvert) {
  // Stream::produce() checks the state once, then tries credits, data,
  // control, keepalive in turn. produce_data() -> current_slot() can call
  // fail() (bad advert), after which produce_keepalive() still returns a
  // write from the same call: a write after the protocol error.
  Pair p = hostile_pair();
  ASSERT_TRUE(p.run());
  const uint32_t h = p.b().half();
  p.a().table[1] = TargetTableEntry{p.b().rbuf_addr + 4 * h, p.b().rbuf_key, h};  // outside the ring
  ASSERT_EQ(p.a().send_pattern(h + 5000), h + 5000u);
  p.a().s.request_keepalive();
  std::vector<std::string> after_error;
  Action a;
  while (p.a().s.next_action(&a))
    if (a.kind == ActionKind::kWrite && p.a().s.state() == StreamState::kError)
      after_error.push_back(wiretest::kind_name(a));
  ASSERT_EQ(p.a().s.state(), StreamState::kError);
  EXPECT_TRUE(after_error.empty()) << "write returned after the error: " << after_error[0];
}

TEST(CoreRegression, CommitActionAppliesThePeekedCreditUpdate) {
  // peek_action() then commit_action() recompute the action; if the app
  // consumes between them, commit applies an advert (advertised_ += half,
  // peer slot index advanced) although the transport posted the 0-byte credit
  // update it peeked: that half is never advertised, the peer stalls, and the
  // next advert goes to the wrong slot.
  StreamConfig cfg;
  cfg.rq_size = 16;
  Endpoint e(0, cfg);
  Pair donor;
  ASSERT_EQ(e.s.on_established(donor.b().record), 0);
  drain_complete(e.s);  // PostRecv + H1 advert
  const uint32_t h = e.half();
  for (int k = 0; k < 8; ++k) ASSERT_EQ(e.s.on_recv_imm(imm_data(h / 8), h / 8), 0);
  Action a;
  ASSERT_TRUE(e.s.next_action(&a));
  ASSERT_EQ(a.kind, ActionKind::kPostRecv);
  Action peeked;
  ASSERT_TRUE(e.s.peek_action(&peeked));
  ASSERT_EQ(peeked.write_kind, WriteKind::kCredits);
  ASSERT_EQ(peeked.length, 0u);  // credits only: rseq 8 = rq/2, no half free
  e.s.recv_consume(h);           // the app reads between peek and commit
  e.s.commit_action(peeked);
  // The half freed in between was not advertised yet: the next action must be
  // that advert, into the peer's slot 0 (H1 went to slot 1 already).
  Action next;
  ASSERT_TRUE(e.s.peek_action(&next));
  EXPECT_EQ(next.write_kind, WriteKind::kCredits);
  EXPECT_EQ(next.length, kSglRecordSize) << "commit applied an advert that was never posted";
  EXPECT_EQ(next.remote_addr, donor.b().record.target_sgl.addr);
}

TEST(CoreRegression, CommitActionAppliesThePeekedPostRecvCount) {
  // Same root cause: a receive completion between peek and commit makes commit
  // zero recv_posts_owed_ for one more receive than the transport posted.
  Pair p;
  ASSERT_TRUE(p.run());
  p.a().send_pattern(10);
  p.poll(0);
  ASSERT_TRUE(p.deliver(0));  // B owes 1 receive
  Action peeked;
  ASSERT_TRUE(p.b().s.peek_action(&peeked));
  ASSERT_EQ(peeked.kind, ActionKind::kPostRecv);
  ASSERT_EQ(p.inject(1, imm_ctrl(kCtrlKeepalive)), 0);  // another receive completes
  p.b().s.commit_action(peeked);
  Action next;
  ASSERT_TRUE(p.b().s.peek_action(&next));
  EXPECT_EQ(next.kind, ActionKind::kPostRecv) << "the core believes one more receive was posted";
  EXPECT_EQ(next.count, 1u);
}

TEST(CoreRegression, PeerShutdownDoesNotDropOurQueuedDataAndShutdown) {
  // Found by fuzz_stream_events (pair mode). B shuts its write side while data
  // is still queued (A's ring is full), then A's SHUTDOWN arrives. The core
  // (on_recv_imm, kCtrlShutdown with !writable_) goes straight to
  // kDisconnected: B's queued data and its own SHUTDOWN/DISCONNECT are never
  // posted, B reports ready_for_teardown, and A stays connected and readable
  // forever waiting for bytes B's app was told were committed.
  Pair p;  // honest pair: no protocol error may occur either
  ASSERT_TRUE(p.run());
  std::string err;
  ASSERT_EQ(p.b().send_pattern(131072), 131072u);
  ASSERT_TRUE(p.run());  // A's ring (both halves) is now full; A's app does not read yet
  ASSERT_EQ(p.b().send_pattern(50000), 50000u);
  ASSERT_TRUE(p.run());
  ASSERT_EQ(p.b().s.send_unposted(), 50000u);  // waits for A to free a half
  p.b().s.shutdown(kShutWr);                   // SHUTDOWN queued behind the data
  p.a().s.shutdown(kShutWr);                   // A half-closes too (typical simultaneous close)
  ASSERT_TRUE(p.run());
  for (int guard = 0; guard < 1000; ++guard) {
    ASSERT_TRUE(p.run());
    if (p.a().recv_check(UINT64_MAX, &err) == 0) break;
  }
  ASSERT_TRUE(err.empty()) << err;
  EXPECT_EQ(p.a().app_recv, 181072u) << "B's committed data was dropped";
  EXPECT_TRUE(p.a().s.recv_closed()) << "A never sees EOF";
  EXPECT_TRUE(p.b().shutdown_posted || p.b().disconnect_posted) << "B never told A it stopped writing";
  EXPECT_EQ(p.a().s.state(), p.b().s.state());
  EXPECT_TRUE(p.a().s.ready_for_teardown());
  EXPECT_TRUE(p.ok()) << p.violation;
}

}  // namespace
}  // namespace gpusock::wire
