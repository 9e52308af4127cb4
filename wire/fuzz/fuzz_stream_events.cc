// libFuzzer target: drive the protocol core (wire/core/stream.h) with an
// arbitrary sequence of events decoded from the input (docs/wire-protocol.md §2, §3).
//
// The first byte picks a mode:
//   even: one Stream against a hostile peer. Arbitrary immediates, arbitrary
//         or plausible adverts written into its target table, app sends and
//         receives within the spans the core returns, completions of tokens it
//         issued, shutdowns, keepalives, transport loss, action draining (with
//         next_action and with peek + commit).
//   odd:  an honest pair through the in-memory transport of wire/tests/harness.h
//         with a fuzzer-chosen schedule. No protocol error may ever occur, every
//         byte must arrive intact, and at the end the pair must be live (all
//         committed data delivered) or cleanly closed on both ends.
//
// Invariants after every step: each write's local range lies inside the send
// ring and follows the previous one; each data write's remote range lies
// inside the peer ring advertised in the peer record, with its rkey; data only
// with a credit; adverts describe a half of our own ring and go to the peer's
// table slots 1,0,1,...; credit values are rseq_no + rq_size; control messages
// only after all committed data and nothing after DISCONNECT; recv_span inside
// the receive ring; recv_available <= rbuf_size; no write after a protocol
// error; errors are sticky and have a reason.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "wire/tests/harness.h"

#define CHECK(c)                                                             \
  do {                                                                       \
    if (!(c)) {                                                              \
      fprintf(stderr, "CHECK failed: %s (%s:%d)\n", #c, __FILE__, __LINE__); \
      abort();                                                               \
    }                                                                        \
  } while (0)

#define CHECK_MSG(c, msg)                                                                                  \
  do {                                                                                                     \
    if (!(c)) {                                                                                            \
      fprintf(stderr, "CHECK failed: %s (%s:%d): %s\n", #c, __FILE__, __LINE__, std::string(msg).c_str()); \
      abort();                                                                                             \
    }                                                                                                      \
  } while (0)

using namespace gpusock::wire;
using gpusock::wire::wiretest::Endpoint;
using gpusock::wire::wiretest::Pair;

namespace {

StreamConfig fuzz_config(FuzzedDataProvider &f) {
  static const uint32_t rbufs[] = {2, 256, 4096, 10002, 65536, 131072};
  static const uint32_t sbufs[] = {100, 4096, 7000, 65536, 131072};
  static const uint16_t sqs[] = {1, 16, 17, 64, 384, 1024};
  static const uint16_t rqs[] = {1, 16, 17, 100, 384, 0xFFFE};
  StreamConfig c;
  c.rbuf_size = rbufs[f.ConsumeIntegralInRange<size_t>(0, 5)];
  c.sbuf_size = sbufs[f.ConsumeIntegralInRange<size_t>(0, 4)];
  c.sq_size = sqs[f.ConsumeIntegralInRange<size_t>(0, 5)];
  c.rq_size = rqs[f.ConsumeIntegralInRange<size_t>(0, 5)];
  c.inline_size = f.ConsumeBool() ? 64 : 0;
  return c;
}

void check_stream_state(const Stream &s) {
  CHECK(s.recv_available() <= s.rbuf_size());
  uint32_t off = 0;
  const uint32_t span = s.recv_span(&off);
  CHECK(off < s.rbuf_size());
  CHECK(static_cast<uint64_t>(off) + span <= s.rbuf_size());
  CHECK(span <= s.recv_available());
  CHECK(s.send_unacked() <= s.sbuf_size());
  CHECK(s.send_unposted() <= s.send_unacked());
  uint32_t soff = 0;
  const uint32_t space = s.send_space(&soff);
  CHECK(soff < s.sbuf_size());
  CHECK(static_cast<uint64_t>(soff) + space <= s.sbuf_size());
  CHECK(space <= s.send_free());
  if (s.state() == StreamState::kError) {
    CHECK(s.error() < 0);
    CHECK(s.error_reason() != nullptr);
    CHECK(s.recv_closed());
    CHECK(s.send_status() == s.error());
    CHECK(s.ready_for_teardown());
  }
}

// ------------------------------------------------------------------ solo mode

struct Solo {
  explicit Solo(const StreamConfig &cfg) : e(0, cfg), inline_size(cfg.inline_size) {}
  Endpoint e;
  uint32_t inline_size;
  ConnRecord peer;
  bool peer_be = false;
  uint64_t ring_addr = 0;
  uint64_t ring_len = 0;
  // bookkeeping of what the core posted
  std::vector<uint64_t> outstanding;
  uint64_t next_token = 0;
  uint64_t committed = 0, data_posted = 0, data_msgs = 0;
  uint64_t accepted_data_msgs = 0;  // rseq_no as the core must count it
  uint64_t adverts = 0;
  bool disconnect_posted = false;
  bool error_seen = false;
  int error = 0;
  std::string reason;
};

ConnRecord fuzz_peer_record(FuzzedDataProvider &f) {
  static const uint32_t halves[] = {1, 100, 2048, 65536, 1u << 20};
  static const uint16_t credits[] = {1, 16, 17, 384, 0xFFFE, 0xFFFF};
  ConnRecord r;
  if (f.ConsumeBool()) {
    uint8_t bytes[kConnRecordSize] = {};
    const std::vector<uint8_t> v = f.ConsumeBytes<uint8_t>(kConnRecordSize);
    if (!v.empty()) memcpy(bytes, v.data(), v.size());
    ConnRecord d;
    if (decode_conn_record(bytes, sizeof bytes, &d, nullptr) == 0) return d;
  }
  r.version = kRsVersion;
  r.flags = f.ConsumeIntegral<uint8_t>() & 3;
  r.credits = credits[f.ConsumeIntegralInRange<size_t>(0, 5)];
  r.target_sgl = {0x0000700000000000ull, 0x4321, kSglSize};
  r.data_buf = {0x0000800000000000ull, 0x8765, halves[f.ConsumeIntegralInRange<size_t>(0, 4)]};
  return r;
}

SglEntry record_entry(const Action &a, bool owner_be) {
  SglEntry e = wiretest::decode_le_sgl(a.record);
  if (owner_be) {
    e.addr = bswap64(e.addr);
    e.key = bswap32(e.key);
    e.length = bswap32(e.length);
  }
  return e;
}

void check_solo_action(Solo &s, const Action &a, StreamState before, uint16_t credits_before) {
  Stream &st = s.e.s;
  if (a.kind == ActionKind::kPostRecv) {
    CHECK(a.count > 0);
    CHECK(before != StreamState::kError);
    return;
  }
  CHECK(a.kind == ActionKind::kWrite);
  CHECK_MSG(before != StreamState::kError, "write after a protocol error");
  CHECK_MSG(st.state() != StreamState::kError, "write from the erroring call");
  CHECK(!s.disconnect_posted);
  CHECK(a.token == s.next_token);
  ++s.next_token;
  s.outstanding.push_back(a.token);
  switch (a.write_kind) {
    case WriteKind::kData: {
      CHECK(a.has_imm);
      CHECK(a.length > 0 && a.length <= kMaxWrite);
      CHECK(a.imm == imm_data(a.length));
      CHECK(a.sbuf_offset == s.data_posted % st.sbuf_size());
      CHECK(static_cast<uint64_t>(a.sbuf_offset) + a.length <= st.sbuf_size());
      CHECK(s.data_posted + a.length <= s.committed);
      CHECK_MSG(credits_before != 0, "data without a credit");
      CHECK(st.credits_available() == static_cast<uint16_t>(credits_before - 1));
      CHECK(a.rkey == s.peer.data_buf.key);
      const uint64_t off = a.remote_addr - s.ring_addr;  // mod 2^64
      CHECK_MSG(off <= s.ring_len && a.length <= s.ring_len - off, "data write outside the peer ring");
      CHECK(a.inline_ok == (a.length <= s.inline_size));
      s.data_posted += a.length;
      ++s.data_msgs;
      break;
    }
    case WriteKind::kCredits: {
      CHECK(a.has_imm);
      CHECK(imm_op(a.imm) == ImmOp::kSgl);
      CHECK(imm_value(a.imm) == static_cast<uint16_t>(s.accepted_data_msgs + st.rq_size()));
      CHECK(a.rkey == s.peer.target_sgl.key);
      if (a.length == kSglRecordSize) {
        const uint64_t slot = (s.adverts + 1) % kSglSize;
        CHECK(a.remote_addr == s.peer.target_sgl.addr + slot * kSglRecordSize);
        const SglEntry e = record_entry(a, s.peer_be);
        const uint32_t half = st.rbuf_size() / 2;
        CHECK(e.addr == s.e.rbuf_addr + ((s.adverts + 1) % 2) * half);
        CHECK(e.key == s.e.rbuf_key);
        CHECK(e.length == half);
        ++s.adverts;
      } else {
        CHECK(a.length == 0);
      }
      break;
    }
    case WriteKind::kControl:
      CHECK(a.has_imm && a.length == 0);
      CHECK(a.imm == imm_ctrl(kCtrlDisconnect) || a.imm == imm_ctrl(kCtrlShutdown));
      CHECK_MSG(s.data_posted == s.committed, "control message before the committed data");
      if (a.imm == imm_ctrl(kCtrlDisconnect)) s.disconnect_posted = true;
      break;
    case WriteKind::kKeepalive:
      CHECK(!a.has_imm && a.length == 0);
      break;
  }
}

void solo_drain(Solo &s, FuzzedDataProvider &f) {
  Stream &st = s.e.s;
  const int max = f.ConsumeIntegralInRange<int>(1, 64);
  const bool peek_mode = f.ConsumeBool();
  for (int i = 0; i < max; ++i) {
    const StreamState before = st.state();
    const uint16_t credits_before = st.credits_available();
    Action a;
    if (peek_mode) {
      if (!st.peek_action(&a)) break;
      const StreamState mid = st.state();
      if (mid == before) {
        Action again;
        CHECK(st.peek_action(&again));
        CHECK_MSG(wiretest::same_action(again, a), "peek_action is not repeatable");
      }
      Action c = a;
      st.commit_action(c);
      if (mid == before) {
        CHECK_MSG(wiretest::same_action(c, a), "commit differs from peek");
      } else {
        // The peek itself raised the error (bad advert found while looking for
        // data space) yet returned an action: the known write-from-the-erroring-
        // call bug. The transport posted `a`; commit now returns nothing.
        CHECK(mid == StreamState::kError);
        CHECK(c.kind == ActionKind::kNone);
      }
    } else if (!st.next_action(&a)) {
      break;
    }
    check_solo_action(s, a, before, credits_before);
  }
}

void solo_event(Solo &s, FuzzedDataProvider &f) {
  Stream &st = s.e.s;
  const StreamState before = st.state();
  switch (f.ConsumeIntegralInRange<int>(0, 14)) {
    case 0: {  // any immediate
      const uint32_t imm = f.ConsumeIntegral<uint32_t>();
      const uint64_t avail = st.recv_available();
      const int rc = st.on_recv_imm(imm, 0);
      if (rc == 0 && imm_is_data(imm_op(imm)) && before != StreamState::kError) ++s.accepted_data_msgs;
      if (rc != 0) CHECK(st.recv_available() == avail);
      break;
    }
    case 1: {  // data of a plausible length
      const uint32_t len = f.ConsumeIntegralInRange<uint32_t>(0, st.rbuf_size() + 1);
      const uint64_t avail = st.recv_available();
      const int rc = st.on_recv_imm(imm_data(len), len);
      if (rc == 0 && before != StreamState::kError) ++s.accepted_data_msgs;
      if (rc != 0) CHECK(st.recv_available() == avail);
      break;
    }
    case 2: {  // credit update near what an honest peer would send
      const int spread = s.peer.credits;
      const int d = f.ConsumeIntegralInRange<int>(-spread, spread);
      st.on_recv_imm(imm_credits(static_cast<uint16_t>(s.data_msgs + static_cast<uint64_t>(d))), 0);
      CHECK(st.state() == StreamState::kError || st.credits_available() <= s.peer.credits);
      break;
    }
    case 3: {  // arbitrary advert into a slot
      const int slot = f.ConsumeIntegralInRange<int>(0, 1);
      TargetTableEntry t;
      t.addr = f.ConsumeBool() ? s.ring_addr + f.ConsumeIntegral<uint32_t>() : f.ConsumeIntegral<uint64_t>();
      t.key = f.ConsumeBool() ? s.peer.data_buf.key : f.ConsumeIntegral<uint32_t>();
      t.length = f.ConsumeIntegral<uint32_t>();
      s.e.table[slot] = t;
      break;
    }
    case 4: {  // plausible advert: a half (or part of the ring) into a slot
      const int slot = f.ConsumeIntegralInRange<int>(0, 1);
      const uint32_t half = s.peer.data_buf.length;
      const uint32_t which = f.ConsumeIntegralInRange<uint32_t>(0, 1);
      TargetTableEntry t;
      t.addr = s.ring_addr + uint64_t(which) * half;
      t.key = s.peer.data_buf.key;
      t.length = f.ConsumeBool() ? half : f.ConsumeIntegralInRange<uint32_t>(0, half + 1);
      s.e.table[slot] = t;
      break;
    }
    case 5:  // control codes
      st.on_recv_imm(imm_ctrl(f.ConsumeIntegralInRange<uint32_t>(0, 3)), 0);
      break;
    case 6: {  // app send within send_space
      if (st.send_status() != 0) break;
      uint32_t off = 0;
      const uint32_t space = st.send_space(&off);
      const uint32_t n = f.ConsumeIntegralInRange<uint32_t>(0, space);
      CHECK(static_cast<uint64_t>(off) + n <= s.e.sbuf.size());
      st.send_commit(n);
      s.committed += n;
      break;
    }
    case 7: {  // app receive within recv_span
      uint32_t off = 0;
      const uint32_t span = st.recv_span(&off);
      st.recv_consume(f.ConsumeIntegralInRange<uint32_t>(0, span));
      break;
    }
    case 8: {  // complete one outstanding write (any order)
      if (s.outstanding.empty()) break;
      const size_t i = f.ConsumeIntegralInRange<size_t>(0, s.outstanding.size() - 1);
      const uint64_t t = s.outstanding[i];
      s.outstanding.erase(s.outstanding.begin() + static_cast<long>(i));
      st.on_write_done(t, f.ConsumeIntegralInRange<int>(0, 31) == 0 ? -EIO : 0);
      break;
    }
    case 9:
      for (uint64_t t : s.outstanding) st.on_write_done(t, 0);
      s.outstanding.clear();
      break;
    case 10:
      st.shutdown(static_cast<uint8_t>(f.ConsumeIntegralInRange<int>(1, 3)));
      break;
    case 11:
      st.request_keepalive();
      break;
    case 12:
      if (f.ConsumeIntegralInRange<int>(0, 7) == 0) st.on_transport_closed(f.ConsumeBool() ? 0 : -ETIMEDOUT);
      break;
    default:
      solo_drain(s, f);
      break;
  }
  check_stream_state(st);
  if (s.error_seen) {
    CHECK_MSG(st.state() == StreamState::kError, "left the error state");
    CHECK(st.error() == s.error);
    CHECK(s.reason == st.error_reason());
  } else if (st.state() == StreamState::kError) {
    s.error_seen = true;
    s.error = st.error();
    s.reason = st.error_reason();
  }
}

void run_solo(FuzzedDataProvider &f) {
  Solo s(fuzz_config(f));
  s.peer = fuzz_peer_record(f);
  s.peer_be = (s.peer.flags & kConnFlagNet) != 0;
  s.ring_addr = s.peer.data_buf.addr;
  s.ring_len = 2ull * s.peer.data_buf.length;
  const bool established = f.ConsumeIntegralInRange<int>(0, 15) != 0;
  if (established) CHECK(s.e.s.on_established(s.peer) == 0);
  for (int steps = 0; steps < 4000 && f.remaining_bytes() > 0; ++steps) solo_event(s, f);
  // Final drain with everything completed.
  for (uint64_t t : s.outstanding) s.e.s.on_write_done(t, 0);
  s.outstanding.clear();
  for (int i = 0; i < 4; ++i) {
    const StreamState before = s.e.s.state();
    const uint16_t cb = s.e.s.credits_available();
    Action a;
    if (!s.e.s.next_action(&a)) break;
    check_solo_action(s, a, before, cb);
  }
  check_stream_state(s.e.s);
}

// ------------------------------------------------------------------ pair mode

std::string describe(Pair &p) {
  std::string out;
  for (int i = 0; i < 2; ++i) {
    const Endpoint &e = p[i];
    char buf[512];
    snprintf(buf, sizeof buf,
             "\n  [%d] state=%d rd=%d wr=%d err=%d shutdown_posted=%d disconnect_posted=%d unposted=%llu unacked=%llu "
             "in_flight=%zu completions=%zu recv_posted=%llu credits=%u app_sent=%llu app_recv=%llu ready=%d",
             i, static_cast<int>(e.s.state()), e.s.readable_dir(), e.s.writable_dir(), e.s.error(), e.shutdown_posted,
             e.disconnect_posted, static_cast<unsigned long long>(e.s.send_unposted()),
             static_cast<unsigned long long>(e.s.send_unacked()), p.in_flight(i), p.completions_pending(i),
             static_cast<unsigned long long>(e.recv_posted), e.s.credits_available(),
             static_cast<unsigned long long>(e.app_sent), static_cast<unsigned long long>(e.app_recv),
             e.s.ready_for_teardown());
    out += buf;
  }
  return out;
}

void check_pair(Pair &p, const std::string &err) {
  CHECK_MSG(err.empty(), err);
  CHECK_MSG(p.ok(), p.violation);
  for (int i = 0; i < 2; ++i) {
    CHECK_MSG(p[i].s.state() != StreamState::kError,
              std::string("honest pair hit an error: ") + (p[i].s.error_reason() ? p[i].s.error_reason() : "?"));
    check_stream_state(p[i].s);
  }
}

void run_pair(FuzzedDataProvider &f) {
  const StreamConfig ca = fuzz_config(f), cb = fuzz_config(f);
  Pair p(ca, cb);
  p.peek_commit = f.ConsumeBool();
  bool shut_rd[2] = {false, false};
  std::string err;
  for (int steps = 0; steps < 2000 && f.remaining_bytes() > 0; ++steps) {
    const int i = f.ConsumeBool() ? 1 : 0;
    switch (f.ConsumeIntegralInRange<int>(0, 11)) {
      case 0: {
        // Bounded by a few peer rings' worth, so tiny rings stay cheap.
        const uint64_t cap = std::min<uint64_t>(70000, 4ull * p[1 - i].s.rbuf_size());
        p[i].send_pattern(f.ConsumeIntegralInRange<uint64_t>(0, f.ConsumeBool() ? std::min<uint64_t>(100, cap) : cap));
      } break;
      case 1:
        p[i].recv_check(f.ConsumeIntegralInRange<uint64_t>(0, f.ConsumeBool() ? 100 : 140000), &err);
        break;
      case 2: {
        const uint8_t how = static_cast<uint8_t>(f.ConsumeIntegralInRange<int>(1, 3));
        if (f.ConsumeIntegralInRange<int>(0, 3) == 0) {
          p[i].s.shutdown(how);
          if (how & kShutRd) shut_rd[i] = true;
        }
        break;
      }
      case 3:
        p[i].s.request_keepalive();
        break;
      case 4:
        p.run();
        break;
      default:
        p.step(f.ConsumeIntegral<uint32_t>());
        break;
    }
    check_pair(p, err);
  }
  // Settle: both apps read everything, the transport runs until quiet.
  for (int guard = 0; guard < 100000; ++guard) {
    CHECK(p.run());
    const uint64_t r = p[0].recv_check(UINT64_MAX, &err) + p[1].recv_check(UINT64_MAX, &err);
    check_pair(p, err);
    if (r == 0) break;
  }
  CHECK(p.run());
  check_pair(p, err);
  const bool conn0 = p[0].s.state() == StreamState::kConnected;
  const bool conn1 = p[1].s.state() == StreamState::kConnected;
  CHECK_MSG(conn0 == conn1, "one end disconnected, the other still connected" + describe(p));
  if (conn0 && conn1) {
    // Liveness: everything committed went out, completed, and was read.
    for (int i = 0; i < 2; ++i) {
      CHECK_MSG(p[i].s.send_unacked() == 0, "sender stalled" + describe(p));
      CHECK(p[i].data_bytes_posted == p[i].app_sent);
      if (!shut_rd[1 - i]) CHECK_MSG(p[1 - i].app_recv == p[i].app_sent, "data lost" + describe(p));
    }
  } else {
    for (int i = 0; i < 2; ++i)
      CHECK_MSG(p[i].s.ready_for_teardown(), "closed but not ready for teardown" + describe(p));
  }
  CHECK(p[0].send_sum.h == p[1].recv_sum.h || shut_rd[1] || !conn0);
  CHECK(p[1].send_sum.h == p[0].recv_sum.h || shut_rd[0] || !conn0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  FuzzedDataProvider f(data + 1, size - 1);
  if (data[0] & 1) run_pair(f);
  else run_solo(f);
  return 0;
}
