// Two Streams connected through the in-memory transport double (harness.h):
// bulk transfer, half-close, close, zero-length sends, keepalive
// (docs/wire-protocol.md §2, §3.1, §3.2).
#include <gtest/gtest.h>

#include <random>
#include <tuple>
#include <vector>

#include "wire/core/stream.h"
#include "wire/tests/harness.h"

namespace gpusock::wire {
namespace {

using wiretest::drain;
using wiretest::Endpoint;
using wiretest::Pair;
using wiretest::writes_only;

StreamConfig config(int variant) {
  StreamConfig c;
  switch (variant) {
    case 0:
      break;  // rsocket defaults: 128 KiB rings, sq/rq 384, inline 64
    case 1:   // tiny everything: many slot cuts, credit updates and stalls
      c.rbuf_size = 4096;
      c.sbuf_size = 4096;
      c.sq_size = 16;
      c.rq_size = 16;
      c.inline_size = 0;
      break;
    case 2:  // big receive ring, small send ring, deep queues
      c.rbuf_size = 1u << 20;
      c.sbuf_size = 65536;
      c.sq_size = 1024;
      c.rq_size = 1000;
      break;
    case 3:  // odd sizes
      c.rbuf_size = 10002;
      c.sbuf_size = 7000;
      c.sq_size = 17;
      c.rq_size = 17;
      c.inline_size = 256;
      break;
  }
  return c;
}

uint64_t random_size(std::mt19937 &rng) {
  switch (rng() % 4) {
    case 0:
      return 1 + rng() % 64;
    case 1:
      return 1 + rng() % 4096;
    case 2:
      return 1 + rng() % (256u << 10);
    default:
      return 1 + rng() % (4u << 20);
  }
}

// Random bidirectional transfer with random app behaviour and random transport
// scheduling; every byte is checked against the sender's pattern and the
// streams' FNV-1a checksums must match.
void random_transfer(uint32_t seed, int va, int vb, bool peek_commit) {
  std::mt19937 rng(seed);
  Pair p(config(va), config(vb));
  p.peek_commit = peek_commit;
  uint64_t total[2] = {0, 0};
  std::vector<uint64_t> msgs[2];
  for (int i = 0; i < 2; ++i) {
    for (int k = 0; k < 10; ++k) msgs[i].push_back(random_size(rng));
    msgs[i].push_back(4u << 20);  // at least one 4 MiB message each way
    msgs[i].push_back(1);
    for (uint64_t m : msgs[i]) total[i] += m;
  }
  size_t mi[2] = {0, 0};
  uint64_t mleft[2] = {msgs[0][0], msgs[1][0]};
  std::string err;
  uint64_t steps = 0;
  while ((p[1].app_recv < total[0] || p[0].app_recv < total[1]) && steps < 50000000) {
    ++steps;
    const uint32_t r = rng();
    const int i = r & 1;
    switch ((r >> 1) % 8) {
      case 0:  // app i sends part of its current message
        if (mi[i] < msgs[i].size()) {
          const uint64_t want = (r >> 8) % 3 == 0 ? mleft[i] : 1 + rng() % mleft[i];
          mleft[i] -= p[i].send_pattern(want);
          if (mleft[i] == 0 && ++mi[i] < msgs[i].size()) mleft[i] = msgs[i][mi[i]];
        }
        break;
      case 1:  // app i reads a random amount, or everything
        p[i].recv_check((r >> 8) % 4 == 0 ? UINT64_MAX : 1 + rng() % 70000, &err);
        break;
      default:
        p.step(rng());
    }
    if (!err.empty() || !p.ok()) break;
  }
  ASSERT_TRUE(err.empty()) << err;
  ASSERT_TRUE(p.ok()) << p.violation;
  ASSERT_EQ(p[1].app_recv, total[0]) << "A->B did not complete in " << steps << " steps";
  ASSERT_EQ(p[0].app_recv, total[1]) << "B->A did not complete in " << steps << " steps";
  ASSERT_TRUE(p.run()) << p.violation;
  EXPECT_EQ(p[0].send_sum.h, p[1].recv_sum.h);
  EXPECT_EQ(p[1].send_sum.h, p[0].recv_sum.h);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(p[i].s.state(), StreamState::kConnected);
    EXPECT_EQ(p[i].s.send_unacked(), 0u);
    EXPECT_EQ(p[i].data_bytes_posted, total[i]);
    EXPECT_LE(p[i].s.recv_available(), p[i].s.rbuf_size());
  }
}

class RandomTransfer : public ::testing::TestWithParam<std::tuple<uint32_t, int, int>> {};

TEST_P(RandomTransfer, BothDirectionsIntact) {
  const auto [seed, va, vb] = GetParam();
  random_transfer(seed, va, vb, false);
}

INSTANTIATE_TEST_SUITE_P(Configs, RandomTransfer,
                         ::testing::Values(std::make_tuple(1u, 0, 0), std::make_tuple(2u, 0, 0),
                                           std::make_tuple(3u, 1, 1), std::make_tuple(4u, 0, 1),
                                           std::make_tuple(5u, 2, 1), std::make_tuple(6u, 3, 2),
                                           std::make_tuple(7u, 3, 3)));

TEST(Pair, PeekThenCommitDriverIsConsistent) {
  // peek_action must describe exactly what commit_action then applies when
  // nothing happens in between (the harness compares them field by field).
  random_transfer(11, 0, 1, true);
}

// Runs the pair and lets both apps read everything, until nothing moves.
void settle(Pair &p, std::string *err) {
  for (int guard = 0; guard < 100000; ++guard) {
    ASSERT_TRUE(p.run()) << p.violation;
    const uint64_t r = p[0].recv_check(UINT64_MAX, err) + p[1].recv_check(UINT64_MAX, err);
    if (r == 0) {
      ASSERT_TRUE(p.run()) << p.violation;
      return;
    }
  }
  FAIL() << "settle did not converge";
}

// Sends n bytes from i (in several commits if the ring is small) and settles.
void transfer(Pair &p, int i, uint64_t n, std::string *err) {
  const uint64_t want = p[1 - i].app_recv + n;
  uint64_t left = n;
  for (int guard = 0; guard < 1000000 && (left || p[1 - i].app_recv < want); ++guard) {
    left -= p[i].send_pattern(left);
    settle(p, err);
  }
  ASSERT_EQ(p[1 - i].app_recv, want);
}

TEST(Pair, HalfCloseEachDirection) {
  // §3.1: SHUT_WR sends SHUTDOWN while still readable; the peer sees EOF
  // (recv_closed with nothing queued) but can keep sending. Then the peer's
  // SHUT_WR finds itself unreadable and sends DISCONNECT.
  Pair p;
  std::string err;
  transfer(p, 0, 300000, &err);
  ASSERT_TRUE(err.empty()) << err;

  // A commits more and half-closes before it went out: data first, then SHUTDOWN.
  ASSERT_EQ(p.a().send_pattern(200000), 131072u);  // the send ring is full
  p.a().s.shutdown(kShutWr);
  EXPECT_EQ(p.a().s.send_status(), -EPIPE);
  EXPECT_FALSE(p.a().s.writable_dir());
  EXPECT_TRUE(p.a().s.readable_dir());
  settle(p, &err);
  ASSERT_TRUE(p.ok()) << p.violation;
  ASSERT_TRUE(err.empty()) << err;
  EXPECT_EQ(p.b().app_recv, 300000u + 131072u);
  EXPECT_TRUE(p.a().shutdown_posted);
  EXPECT_FALSE(p.a().disconnect_posted);
  // B: EOF on its read side, still connected and writable.
  EXPECT_EQ(p.b().s.recv_available(), 0u);
  EXPECT_TRUE(p.b().s.recv_closed());
  EXPECT_EQ(p.b().s.state(), StreamState::kConnected);
  EXPECT_EQ(p.b().s.send_status(), 0);
  EXPECT_FALSE(p.a().s.recv_closed());

  // The other direction still works.
  transfer(p, 1, 1u << 20, &err);
  ASSERT_TRUE(err.empty()) << err;
  ASSERT_TRUE(p.ok()) << p.violation;
  EXPECT_FALSE(p.a().s.recv_closed());
  EXPECT_FALSE(p.a().s.ready_for_teardown());

  // B half-closes too: it is no longer readable, so this is a DISCONNECT.
  p.b().s.shutdown(kShutWr);
  settle(p, &err);
  ASSERT_TRUE(p.ok()) << p.violation;
  EXPECT_TRUE(p.b().disconnect_posted);
  EXPECT_EQ(p.a().s.recv_available(), 0u);
  EXPECT_TRUE(p.a().s.recv_closed());
  EXPECT_EQ(p.a().s.state(), StreamState::kDisconnected);
  EXPECT_EQ(p.b().s.state(), StreamState::kDisconnected);
  EXPECT_TRUE(p.a().s.ready_for_teardown());
  EXPECT_TRUE(p.b().s.ready_for_teardown());
  EXPECT_EQ(p.a().s.error(), 0);
  EXPECT_EQ(p.b().s.error(), 0);
  // B's DISCONNECT reached A, which had sent only a SHUTDOWN: B's close waits
  // on A's acknowledgement, so A must keep its transport (interop K6).
  EXPECT_TRUE(p.a().s.peer_closed_first());
  EXPECT_FALSE(p.b().s.peer_closed_first());
}

TEST(Pair, PeerClosedFirstOnlyOnThePassiveSide) {
  // A closes (DISCONNECT); B reads EOF, then closes too. Only B saw the peer's
  // DISCONNECT before sending its own.
  Pair p(config(1), config(1));
  std::string err;
  transfer(p, 0, 4096, &err);
  ASSERT_TRUE(err.empty()) << err;
  p.a().s.shutdown(kShutRdWr);
  settle(p, &err);
  ASSERT_TRUE(p.ok()) << p.violation;
  EXPECT_TRUE(p.b().s.recv_closed());
  EXPECT_TRUE(p.b().s.peer_closed_first());
  EXPECT_FALSE(p.a().s.peer_closed_first());
  p.b().s.shutdown(kShutRdWr);
  settle(p, &err);
  ASSERT_TRUE(p.ok()) << p.violation;
  EXPECT_TRUE(p.a().s.ready_for_teardown());
  EXPECT_TRUE(p.b().s.ready_for_teardown());
  EXPECT_FALSE(p.a().s.peer_closed_first());
  EXPECT_TRUE(p.b().s.peer_closed_first());
  EXPECT_FALSE(p.b().s.transport_closed());
  p.b().s.on_transport_closed(-ECONNRESET);  // A tore its side down
  EXPECT_TRUE(p.b().s.transport_closed());
  EXPECT_EQ(p.b().s.error(), 0);  // after a clean close, not a reset
}

TEST(Pair, HalfCloseWhilePeerKeepsStreaming) {
  // §3.1: after A's SHUTDOWN, B keeps sending large amounts (many adverts and
  // credit updates from A) and A reads them all.
  Pair p(config(1), config(1));
  std::string err;
  p.a().s.shutdown(kShutWr);
  settle(p, &err);
  EXPECT_TRUE(p.b().s.recv_closed());
  transfer(p, 1, 3u << 20, &err);
  ASSERT_TRUE(err.empty()) << err;
  ASSERT_TRUE(p.ok()) << p.violation;
  EXPECT_EQ(p.a().s.state(), StreamState::kConnected);
}

TEST(Pair, CloseSendsDisconnectAfterQueuedData) {
  // §3.1: SHUT_RDWR -> DISCONNECT, posted only after the queued data; both ends
  // reach ready_for_teardown once it completed.
  Pair p;
  std::string err;
  ASSERT_TRUE(p.run());
  ASSERT_EQ(p.a().send_pattern(100000), 100000u);
  p.a().s.shutdown(kShutRdWr);
  EXPECT_EQ(p.a().s.send_status(), -EPIPE);
  EXPECT_TRUE(p.a().s.recv_closed());
  p.poll(0);
  EXPECT_TRUE(p.a().disconnect_posted);
  EXPECT_EQ(p.a().data_bytes_posted, 100000u);
  EXPECT_FALSE(p.a().s.ready_for_teardown()) << "DISCONNECT not completed yet";
  // Nothing more from A once DISCONNECT is posted, whatever happens.
  p.a().s.request_keepalive();
  EXPECT_TRUE(writes_only(drain(p.a().s)).empty());
  while (p.deliver(0)) {}
  EXPECT_EQ(p.b().s.state(), StreamState::kDisconnected);
  EXPECT_TRUE(p.b().s.recv_closed());
  EXPECT_EQ(p.b().s.send_status(), -ECONNRESET);
  EXPECT_EQ(p.b().s.recv_available(), 100000u);  // queued data stays readable (§3.1)
  while (p.complete(0)) {}
  EXPECT_TRUE(p.a().s.ready_for_teardown());
  settle(p, &err);
  ASSERT_TRUE(err.empty()) << err;
  EXPECT_EQ(p.b().app_recv, 100000u);
  EXPECT_EQ(p.b().s.recv_available(), 0u);
  EXPECT_EQ(p.a().s.state(), StreamState::kDisconnected);
  EXPECT_TRUE(p.a().s.ready_for_teardown());
  EXPECT_TRUE(p.b().s.ready_for_teardown());
  EXPECT_EQ(p.a().controls, 1u);
  EXPECT_EQ(p.b().controls, 0u);  // the receiver of DISCONNECT sends nothing
  ASSERT_TRUE(p.ok()) << p.violation;
}

TEST(Pair, ShutRdAloneSendsNothingAndDropsIncoming) {
  // §3.1: SHUT_RD while still writable puts nothing on the wire; data that
  // still arrives is dropped without stalling the sender.
  Pair p;
  std::string err;
  ASSERT_TRUE(p.run());
  p.b().s.shutdown(kShutRd);
  EXPECT_TRUE(p.b().s.recv_closed());
  ASSERT_TRUE(p.run());
  EXPECT_EQ(p.b().controls, 0u);
  for (int k = 0; k < 40; ++k) {
    p.a().send_pattern(UINT64_MAX);
    ASSERT_TRUE(p.run()) << p.violation;
  }
  EXPECT_EQ(p.a().s.send_unacked(), 0u);
  EXPECT_GT(p.b().data_bytes_received, 4u << 20);
  EXPECT_EQ(p.b().s.recv_available(), 0u);
  // B can still send.
  transfer(p, 1, 100000, &err);
  ASSERT_TRUE(err.empty()) << err;
  // SHUT_WR now: not readable -> DISCONNECT.
  p.b().s.shutdown(kShutWr);
  ASSERT_TRUE(p.run());
  EXPECT_TRUE(p.b().disconnect_posted);
  EXPECT_TRUE(p.a().s.ready_for_teardown());
  EXPECT_TRUE(p.b().s.ready_for_teardown());
  ASSERT_TRUE(p.ok()) << p.violation;
}

TEST(Pair, ShutWrThenShutRdSendsShutdownThenDisconnect) {
  // §3.1 table.
  Pair p;
  ASSERT_TRUE(p.run());
  p.a().s.shutdown(kShutWr);
  ASSERT_TRUE(p.run());
  EXPECT_TRUE(p.a().shutdown_posted);
  EXPECT_FALSE(p.a().disconnect_posted);
  p.a().s.shutdown(kShutRd);
  ASSERT_TRUE(p.run());
  EXPECT_TRUE(p.a().disconnect_posted);
  EXPECT_EQ(p.a().controls, 2u);
  EXPECT_EQ(p.b().s.state(), StreamState::kDisconnected);
  EXPECT_TRUE(p.a().s.ready_for_teardown());
  EXPECT_TRUE(p.b().s.ready_for_teardown());
  ASSERT_TRUE(p.ok()) << p.violation;
}

TEST(Pair, SimultaneousShutWr) {
  // Both SHUT_WR at once: each gets SHUTDOWN while no longer writable, which
  // ends the connection (§3.1: SHUTDOWN received after our own).
  Pair p;
  ASSERT_TRUE(p.run());
  p.a().s.shutdown(kShutWr);
  p.b().s.shutdown(kShutWr);
  ASSERT_TRUE(p.run());
  EXPECT_EQ(p.a().s.state(), StreamState::kDisconnected);
  EXPECT_EQ(p.b().s.state(), StreamState::kDisconnected);
  EXPECT_TRUE(p.a().s.ready_for_teardown());
  EXPECT_TRUE(p.b().s.ready_for_teardown());
  EXPECT_EQ(p.a().s.error(), 0);
  ASSERT_TRUE(p.ok()) << p.violation;
}

TEST(Pair, SecondShutWrSendsNothingMore) {
  Pair p;
  ASSERT_TRUE(p.run());
  p.a().s.shutdown(kShutWr);
  p.a().s.shutdown(kShutWr);
  ASSERT_TRUE(p.run());
  p.a().s.shutdown(kShutWr);
  ASSERT_TRUE(p.run());
  EXPECT_EQ(p.a().controls, 1u);
  ASSERT_TRUE(p.ok()) << p.violation;
}

TEST(Pair, ZeroLengthSendPutsNothingOnTheWire) {
  // §2.8, §9.8: never send 0-length DATA.
  Pair p;
  p.log_writes = true;
  ASSERT_TRUE(p.run());
  const size_t before = p.a().log.size();
  p.a().s.send_commit(0);
  uint32_t off = 0;
  EXPECT_EQ(p.a().s.send_space(&off), p.a().s.sbuf_size());
  ASSERT_TRUE(p.run());
  EXPECT_EQ(p.a().log.size(), before);
  EXPECT_EQ(p.a().data_writes, 0u);
  EXPECT_FALSE(p.b().s.recv_closed());
}

TEST(Pair, KeepaliveIsAPlainZeroByteWrite) {
  // §2.1, §3.2: keepalive = RDMA WRITE of 0 bytes without immediate; it uses no
  // receive and the peer never hears of it.
  Pair p;
  p.log_writes = true;
  ASSERT_TRUE(p.run());
  const uint64_t b_posted = p.b().recv_posted;
  p.a().s.request_keepalive();
  ASSERT_EQ(p.poll(0), 1u);
  const Action &k = p.a().log.back();
  EXPECT_EQ(k.write_kind, WriteKind::kKeepalive);
  EXPECT_FALSE(k.has_imm);
  EXPECT_EQ(k.length, 0u);
  ASSERT_TRUE(p.run());
  EXPECT_EQ(p.b().recv_posted, b_posted);
  EXPECT_EQ(p.a().keepalives, 1u);
  // Only one per request.
  ASSERT_TRUE(p.run());
  EXPECT_EQ(p.a().keepalives, 1u);
  EXPECT_EQ(p.b().s.state(), StreamState::kConnected);
  ASSERT_TRUE(p.ok()) << p.violation;
}

TEST(Pair, KeepaliveWithPendingDataAndControl) {
  Pair p;
  std::string err;
  ASSERT_TRUE(p.run());
  p.a().send_pattern(50000);
  p.a().s.request_keepalive();
  p.a().s.shutdown(kShutWr);
  settle(p, &err);
  ASSERT_TRUE(err.empty()) << err;
  EXPECT_EQ(p.a().keepalives, 1u);
  EXPECT_TRUE(p.a().shutdown_posted);
  EXPECT_EQ(p.b().app_recv, 50000u);
  ASSERT_TRUE(p.ok()) << p.violation;
}

TEST(Pair, AtMostFourControlMessagesOutstanding) {
  // §2.4: <= 4 control messages outstanding (RS_QP_CTRL_SIZE).
  Pair p(config(0), config(0));
  ASSERT_TRUE(p.run());
  // B receives lots of small messages without completing its credit writes.
  for (int k = 0; k < 5000; ++k) {
    p.a().send_pattern(1);
    p.poll(0);
    while (p.deliver(0)) {}
    while (p.complete(0)) {}
    p.poll(1);
    while (p.deliver(1)) {}
    // no p.complete(1): B's control writes stay outstanding
  }
  EXPECT_LE(p.in_flight(1) + p.completions_pending(1), 4u);
  ASSERT_TRUE(p.ok()) << p.violation;
  std::string err;
  settle(p, &err);
  EXPECT_TRUE(err.empty()) << err;
}

TEST(Pair, CompletionsOutOfOrderRetireInOrder) {
  // Send-ring space comes back in posting order.
  Endpoint e(0, StreamConfig{});
  Pair donor;  // only for a valid peer record
  ASSERT_EQ(e.s.on_established(donor.b().record), 0);
  for (const Action &a : drain(e.s))
    if (a.kind == ActionKind::kWrite) e.s.on_write_done(a.token, 0);
  ASSERT_EQ(e.send_pattern(10000), 10000u);
  std::vector<Action> w = writes_only(drain(e.s));
  ASSERT_EQ(w.size(), 3u);  // 2048, 4096, 3856
  e.s.on_write_done(w[2].token, 0);
  e.s.on_write_done(w[1].token, 0);
  EXPECT_EQ(e.s.send_unacked(), 10000u);
  e.s.on_write_done(w[1].token, 0);      // duplicate: ignored
  e.s.on_write_done(w[2].token + 7, 0);  // never issued: ignored
  EXPECT_EQ(e.s.send_unacked(), 10000u);
  e.s.on_write_done(w[0].token, 0);
  EXPECT_EQ(e.s.send_unacked(), 0u);
  EXPECT_EQ(e.s.state(), StreamState::kConnected);
}

TEST(Pair, WriteErrorCompletionIsFatal) {
  // §2.7, §3.2: an error send completion while connected -> error state.
  Pair p;
  p.expect_no_errors = false;
  ASSERT_TRUE(p.run());
  p.a().send_pattern(1000);
  p.poll(0);
  ASSERT_TRUE(p.deliver(0));
  ASSERT_TRUE(p.complete(0, -EIO));
  EXPECT_EQ(p.a().s.state(), StreamState::kError);
  EXPECT_EQ(p.a().s.error(), -EIO);
  EXPECT_NE(p.a().s.error_reason(), nullptr);
  EXPECT_EQ(p.a().s.send_status(), -EIO);
  EXPECT_TRUE(p.a().s.recv_closed());
  EXPECT_TRUE(p.a().s.ready_for_teardown());
}

TEST(Pair, TransportLossWithoutDisconnectIsAnError) {
  // §3.1: a peer that vanishes without the in-band DISCONNECT is an error...
  Pair p;
  ASSERT_TRUE(p.run());
  p.a().s.on_transport_closed(0);
  EXPECT_EQ(p.a().s.state(), StreamState::kError);
  EXPECT_EQ(p.a().s.error(), -ECONNRESET);
  EXPECT_TRUE(p.a().s.ready_for_teardown());
  EXPECT_TRUE(writes_only(drain(p.a().s)).empty());
  // ... but not after our own DISCONNECT was sent.
  Pair q;
  ASSERT_TRUE(q.run());
  q.a().s.shutdown(kShutRdWr);
  q.poll(0);
  q.a().s.on_transport_closed(0);
  EXPECT_EQ(q.a().s.state(), StreamState::kDisconnected);
  EXPECT_EQ(q.a().s.error(), 0);
  EXPECT_TRUE(q.a().s.ready_for_teardown());
}

TEST(Pair, SendStatusBeforeConnect) {
  Endpoint e(0, StreamConfig{});
  EXPECT_EQ(e.s.send_status(), -ENOTCONN);
  EXPECT_EQ(e.s.state(), StreamState::kIdle);
  EXPECT_TRUE(e.s.ready_for_teardown());
}

}  // namespace
}  // namespace gpusock::wire
