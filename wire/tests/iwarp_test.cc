// iWARP variant (docs/wire-protocol.md §2.11, RS_OPT_MSG_SEND): without
// write-with-immediate every message is an RDMA write plus a 4-byte send, so it
// takes two send-queue slots and two control credits, and inline is at least 4.
// No iWARP device exists here (siw is not in Debian 12's kernel), so the variant
// is proven at the core level, with the in-memory pair standing in for the wire.
#include <gtest/gtest.h>

#include "wire/core/stream.h"
#include "wire/tests/harness.h"

namespace gpusock::wire {
namespace {

using wiretest::Pair;

StreamConfig iwarp(uint16_t sq = 16) {
  StreamConfig c;
  c.msg_send = true;
  c.sq_size = sq;
  c.inline_size = 0;
  return c;
}

// Counts the write actions a stream emits while nothing completes.
int writes_until_stall(Stream &s, WriteKind kind) {
  int n = 0;
  Action a;
  while (s.next_action(&a))
    if (a.kind == ActionKind::kWrite && a.write_kind == kind) ++n;
  return n;
}

TEST(Iwarp, EachMessageTakesTwoSendQueueSlots) {
  for (bool msg_send : {false, true}) {
    StreamConfig c = iwarp(16);
    c.msg_send = msg_send;
    c.sbuf_size = 4u << 20;  // and the send ring does not either
    StreamConfig peer;
    peer.rbuf_size = 8u << 20;  // a 4 MiB half: the slot never limits here
    Pair p(c, peer);
    Stream &s = p.a().s;
    // Drain the first credit/advert action, then commit far more data than fits.
    Action a;
    while (s.peek_action(&a) && !(a.kind == ActionKind::kWrite && a.write_kind == WriteKind::kData)) s.commit_action(a);
    p.a().send_pattern(4u << 20);
    // 16 slots, 4 reserved for control, one control message (the advert) in
    // flight: 11 data messages, or 5 when each message takes two slots.
    EXPECT_EQ(writes_until_stall(s, WriteKind::kData), msg_send ? 5 : 11) << "msg_send=" << msg_send;
  }
}

TEST(Iwarp, AtMostTwoControlMessagesOutstanding) {
  StreamConfig c = iwarp(64);
  c.rq_size = 64;
  Pair p(c, c);
  Stream &s = p.b().s;
  // B receives data messages and owes a credit update every rq/2 of them; with
  // no completions, only two control messages may be in flight (4 credits / 2).
  int control = 0;
  for (int round = 0; round < 4; ++round) {  // 128 messages: within the credits granted
    for (int k = 0; k < s.rq_size() / 2; ++k) ASSERT_EQ(s.on_recv_imm(imm_data(1), 1), 0);
    s.recv_consume(static_cast<uint32_t>(s.recv_available()));
    control += writes_until_stall(s, WriteKind::kCredits);
  }
  EXPECT_EQ(control, 2);
}

TEST(Iwarp, InlineIsAtLeastTheMessageWord) {
  Pair p(iwarp(), StreamConfig{});
  p.a().send_pattern(4);
  Action a;
  bool saw = false;
  while (p.a().s.next_action(&a))
    if (a.kind == ActionKind::kWrite && a.write_kind == WriteKind::kData) {
      EXPECT_TRUE(a.inline_ok) << "a 4-byte message must be postable inline on iWARP";
      saw = true;
    }
  EXPECT_TRUE(saw);
}

TEST(Iwarp, PairTransfersIntactInBothDirections) {
  StreamConfig c = iwarp(32);
  c.rbuf_size = c.sbuf_size = 16384;
  Pair p(c, c);
  const uint64_t total = 3u << 20;
  std::string err;
  uint64_t sent[2] = {0, 0};
  for (int step = 0; step < 2000000 && (p[0].app_recv < total || p[1].app_recv < total); ++step) {
    for (int i = 0; i < 2; ++i) {
      if (sent[i] < total) sent[i] += p[i].send_pattern(std::min<uint64_t>(total - sent[i], 5000));
      p[i].recv_check(UINT64_MAX, &err);
    }
    p.step(static_cast<uint32_t>(step * 2654435761u));
    ASSERT_TRUE(err.empty()) << err;
    ASSERT_TRUE(p.ok()) << p.violation;
  }
  EXPECT_EQ(p[0].app_recv, total);
  EXPECT_EQ(p[1].app_recv, total);
}

}  // namespace
}  // namespace gpusock::wire
