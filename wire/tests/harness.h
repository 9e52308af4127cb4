// Test double for the sans-I/O protocol core (wire/core): an in-memory
// "transport" that connects two Streams the way an RC queue pair would.
//
// Each endpoint owns a send ring, a receive ring and a 2-slot target table in
// ordinary memory, at fake remote addresses with fake rkeys. Write actions are
// queued per direction (RC order), then delivered: the bytes are copied into
// the peer's memory at remote_addr (after an address/rkey/bounds check, like a
// NIC would do), the peer gets on_recv_imm (consuming one posted receive; if
// none is posted the delivery waits, like an RNR NAK), and the writer later gets
// on_write_done. Every action is checked against the protocol when it is taken
// from the core (docs/wire-protocol.md §2.1, §2.3, §2.4, §2.6, §3.1).
//
// No gtest here: the libFuzzer targets (wire/fuzz) use it too. Problems are
// collected in Pair::violation (first one wins; later ones are appended up to a
// small cap).
#pragma once

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "wire/core/stream.h"

namespace gpusock::wire::wiretest {

// Deterministic payload: byte `pos` of logical stream `stream_id`. Cheap (one
// multiply) and position dependent with period 2^32, so misplaced, duplicated
// or reordered bytes show up.
inline uint8_t pattern_byte(uint32_t stream_id, uint64_t pos) {
  const uint32_t x = (static_cast<uint32_t>(pos) ^ (stream_id << 24)) * 2654435761u;
  return static_cast<uint8_t>((x >> 24) ^ (x >> 11));
}

// FNV-1a, 64 bit, streaming.
struct Checksum {
  uint64_t h = 0xcbf29ce484222325ull;
  void add(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  }
};

inline const char *kind_name(const Action &a) {
  if (a.kind == ActionKind::kPostRecv) return "PostRecv";
  if (a.kind == ActionKind::kNone) return "None";
  switch (a.write_kind) {
    case WriteKind::kData:
      return "Data";
    case WriteKind::kCredits:
      return "Credits";
    case WriteKind::kControl:
      return "Control";
    case WriteKind::kKeepalive:
      return "Keepalive";
  }
  return "?";
}

inline bool is_write(const Action &a) { return a.kind == ActionKind::kWrite; }

// Field-wise equality (Action has padding, so no memcmp).
inline bool same_action(const Action &x, const Action &y) {
  return x.kind == y.kind && x.write_kind == y.write_kind && x.has_imm == y.has_imm && x.inline_ok == y.inline_ok &&
         x.count == y.count && x.imm == y.imm && x.length == y.length && x.sbuf_offset == y.sbuf_offset &&
         memcmp(x.record, y.record, sizeof x.record) == 0 && x.remote_addr == y.remote_addr && x.rkey == y.rkey &&
         x.token == y.token;
}

// Drains a stream's actions (peek+commit in one step); for single-stream tests.
inline std::vector<Action> drain(Stream &s, size_t max = 1000000) {
  std::vector<Action> out;
  Action a;
  while (out.size() < max && s.next_action(&a)) out.push_back(a);
  return out;
}

// Drains and reports every write as completed at once (an ideal transport).
inline std::vector<Action> drain_complete(Stream &s, size_t max = 1000000) {
  std::vector<Action> out = drain(s, max);
  for (const Action &a : out)
    if (a.kind == ActionKind::kWrite) s.on_write_done(a.token, 0);
  return out;
}

inline std::vector<Action> writes_only(const std::vector<Action> &v) {
  std::vector<Action> out;
  for (const Action &a : v)
    if (is_write(a)) out.push_back(a);
  return out;
}

// Decodes a 16-byte SGL record written for a little-endian owner (§2.9).
inline SglEntry decode_le_sgl(const uint8_t rec[kSglRecordSize]) {
  SglEntry e;
  e.addr = 0;
  e.key = 0;
  e.length = 0;
  for (int i = 7; i >= 0; --i) e.addr = (e.addr << 8) | rec[i];
  for (int i = 3; i >= 0; --i) e.key = (e.key << 8) | rec[8 + i];
  for (int i = 3; i >= 0; --i) e.length = (e.length << 8) | rec[12 + i];
  return e;
}

class Endpoint {
 public:
  Endpoint(int id, const StreamConfig &cfg) : id_(id) {
    rbuf_addr = (static_cast<uint64_t>(id) + 1) << 40;
    table_addr = rbuf_addr + (1ull << 36);
    rbuf_key = 0x1000u + 16u * static_cast<uint32_t>(id) + 1;
    table_key = 0x1000u + 16u * static_cast<uint32_t>(id) + 2;
    memset(table, 0, sizeof(table));
    layout.rbuf_remote_addr = rbuf_addr;
    layout.rbuf_rkey = rbuf_key;
    layout.table_remote_addr = table_addr;
    layout.table_rkey = table_key;
    layout.table = table;
    s.init(cfg, layout, &record);
    sbuf.assign(s.sbuf_size(), 0);
    rbuf.assign(s.rbuf_size(), 0);
  }
  Endpoint(const Endpoint &) = delete;
  Endpoint &operator=(const Endpoint &) = delete;

  int id() const { return id_; }
  uint32_t half() const { return s.rbuf_size() / 2; }

  // App: commit up to `max` bytes of the pattern of stream `send_stream`.
  // Respects send_status() and send_space() as an application must.
  uint64_t send_pattern(uint64_t max) {
    uint64_t total = 0;
    while (total < max && s.send_status() == 0) {
      uint32_t off = 0;
      uint32_t n = s.send_space(&off);
      if (n == 0) break;
      if (n > max - total) n = static_cast<uint32_t>(max - total);
      for (uint32_t k = 0; k < n; ++k) sbuf[off + k] = pattern_byte(send_stream, app_sent + k);
      send_sum.add(&sbuf[off], n);
      s.send_commit(n);
      app_sent += n;
      total += n;
    }
    return total;
  }

  // App: read up to `max` bytes, verifying the pattern of stream `recv_stream`.
  // Returns bytes read; sets *err on the first mismatch or bounds problem.
  uint64_t recv_check(uint64_t max, std::string *err) {
    uint64_t total = 0;
    while (total < max) {
      uint32_t off = 0;
      uint32_t n = s.recv_span(&off);
      if (n == 0) break;
      if (static_cast<uint64_t>(off) + n > rbuf.size()) {
        if (err && err->empty()) *err = "recv_span outside the receive ring";
        return total;
      }
      if (n > max - total) n = static_cast<uint32_t>(max - total);
      for (uint32_t k = 0; k < n; ++k) {
        if (rbuf[off + k] != pattern_byte(recv_stream, app_recv + k)) {
          if (err && err->empty()) {
            char buf[160];
            snprintf(buf, sizeof buf, "endpoint %d: payload mismatch at stream byte %llu (ring offset %u)", id_,
                     static_cast<unsigned long long>(app_recv + k), off + k);
            *err = buf;
          }
          break;
        }
      }
      recv_sum.add(&rbuf[off], n);
      s.recv_consume(n);
      app_recv += n;
      total += n;
    }
    return total;
  }

  // Stream and its memory.
  Stream s;
  ConnRecord record;
  LocalLayout layout;
  TargetTableEntry table[kSglSize];
  std::vector<uint8_t> sbuf, rbuf;
  uint64_t rbuf_addr = 0, table_addr = 0;
  uint32_t rbuf_key = 0, table_key = 0;

  // Transport model.
  uint64_t recv_posted = 0;  // receive WQEs currently posted

  // What this endpoint posted (as a writer).
  uint64_t data_writes = 0, data_bytes_posted = 0;
  uint64_t adverts = 0, credit_only = 0, controls = 0, keepalives = 0;
  uint64_t post_recv_total = 0;
  bool disconnect_posted = false, shutdown_posted = false;
  uint32_t credit_value_wraps = 0;
  bool have_credit_value = false;
  uint16_t last_credit_value = 0;
  std::vector<Action> log;  // every write, when Pair::log_writes

  // What this endpoint received (as a reader of imms).
  uint64_t data_msgs_received = 0, data_bytes_received = 0;

  // Application model.
  uint32_t send_stream = 0, recv_stream = 0;
  uint64_t app_sent = 0, app_recv = 0;
  Checksum send_sum, recv_sum;

 private:
  int id_;
};

class Pair {
 public:
  Pair(const StreamConfig &ca, const StreamConfig &cb) {
    ep_[0] = std::make_unique<Endpoint>(0, ca);
    ep_[1] = std::make_unique<Endpoint>(1, cb);
    ep_[0]->send_stream = ep_[1]->recv_stream = 0xA0;
    ep_[1]->send_stream = ep_[0]->recv_stream = 0xB0;
    // Exchange the records through their 40-byte wire form (§1.3).
    for (int i = 0; i < 2; ++i) {
      uint8_t bytes[kConnRecordSize];
      encode_conn_record(ep_[1 - i]->record, bytes);
      ConnRecord peer;
      RecordError why = RecordError::kNone;
      if (decode_conn_record(bytes, sizeof bytes, &peer, &why) != 0)
        fail("record %d does not decode: %s", 1 - i, record_error_text(why));
      if (ep_[i]->s.on_established(peer) != 0) fail("on_established failed on %d", i);
    }
  }
  Pair() : Pair(StreamConfig{}, StreamConfig{}) {}

  Endpoint &operator[](int i) { return *ep_[i]; }
  Endpoint &a() { return *ep_[0]; }
  Endpoint &b() { return *ep_[1]; }

  bool ok() const { return violation.empty(); }

  // Takes up to `max` actions from endpoint i; returns how many.
  size_t poll(int i, size_t max = SIZE_MAX) {
    Endpoint &me = *ep_[i];
    size_t n = 0;
    while (n < max) {
      const StreamState before = me.s.state();
      Action a;
      if (peek_commit) {
        if (!me.s.peek_action(&a)) break;
        Action c = a;
        me.s.commit_action(c);
        if (!same_action(c, a)) fail("endpoint %d: commit_action applied a different action than peeked", i);
      } else if (!me.s.next_action(&a)) {
        break;
      }
      ++n;
      if (a.kind == ActionKind::kPostRecv) {
        if (a.count == 0) fail("endpoint %d: PostRecv with count 0", i);
        me.recv_posted += a.count;
        me.post_recv_total += a.count;
        continue;
      }
      if (a.kind != ActionKind::kWrite) {
        fail("endpoint %d: action of kind None returned", i);
        continue;
      }
      check_write(i, a, before);
      if (log_writes) me.log.push_back(a);
      wire_[i].push_back(a);
      if (n > 10000000) {
        fail("endpoint %d: action loop does not terminate", i);
        break;
      }
    }
    return n;
  }

  // Delivers the oldest write in flight from i to its peer. False if none, or
  // if it needs a receive the peer has not posted (RNR: retried later).
  bool deliver(int i) {
    if (wire_[i].empty()) return false;
    const Action a = wire_[i].front();
    Endpoint &me = *ep_[i];
    Endpoint &peer = *ep_[1 - i];
    if (a.has_imm && peer.recv_posted == 0) return false;
    wire_[i].pop_front();
    if (a.length > 0) {
      const uint8_t *src = a.write_kind == WriteKind::kData ? &me.sbuf[a.sbuf_offset] : a.record;
      if (a.write_kind == WriteKind::kData && static_cast<uint64_t>(a.sbuf_offset) + a.length > me.sbuf.size()) {
        fail("endpoint %d: data write reads past its send ring", i);
      } else if (a.write_kind != WriteKind::kData && a.length > kSglRecordSize) {
        fail("endpoint %d: control write with %u bytes of payload", i, a.length);
      } else if (uint8_t *dst = resolve(peer, a.remote_addr, a.rkey, a.length)) {
        memcpy(dst, src, a.length);
      } else {
        fail("endpoint %d: remote access error writing %u bytes at 0x%llx rkey 0x%x", i, a.length,
             static_cast<unsigned long long>(a.remote_addr), a.rkey);
      }
    }
    if (a.has_imm) {
      --peer.recv_posted;
      const int rc = peer.s.on_recv_imm(a.imm, a.length);
      if (rc == 0 && imm_is_data(imm_op(a.imm))) {
        ++peer.data_msgs_received;
        peer.data_bytes_received += imm_value(a.imm);
      }
      if (rc != 0 && expect_no_errors)
        fail("endpoint %d rejected an honest write (%s imm 0x%08x): %d %s", 1 - i, kind_name(a), a.imm, rc,
             peer.s.error_reason() ? peer.s.error_reason() : "(no reason)");
      if (peer.s.recv_available() > peer.s.rbuf_size())
        fail("endpoint %d: recv_available %llu > rbuf_size", 1 - i,
             static_cast<unsigned long long>(peer.s.recv_available()));
    }
    done_[i].push_back(a.token);
    return true;
  }

  // Reports the oldest delivered write of i as completed.
  bool complete(int i, int status = 0) {
    if (done_[i].empty()) return false;
    const uint64_t t = done_[i].front();
    done_[i].pop_front();
    ep_[i]->s.on_write_done(t, status);
    return true;
  }

  // Runs everything until nothing moves. Returns false if it hit `limit`.
  bool run(size_t limit = 100000000) {
    for (size_t iter = 0; iter < limit; ++iter) {
      bool progress = false;
      for (int i = 0; i < 2; ++i) progress |= poll(i) > 0;
      for (int i = 0; i < 2; ++i)
        while (deliver(i)) progress = true;
      for (int i = 0; i < 2; ++i)
        while (complete(i)) progress = true;
      if (!progress) return true;
    }
    fail("run() did not quiesce");
    return false;
  }

  // One randomly chosen transport step (r is any random number).
  bool step(uint32_t r) {
    const int i = static_cast<int>(r & 1);
    switch ((r >> 1) % 3) {
      case 0:
        return poll(i, 1 + ((r >> 4) % 4)) > 0;
      case 1:
        return deliver(i);
      default:
        return complete(i);
    }
  }

  size_t in_flight(int i) const { return wire_[i].size(); }
  size_t completions_pending(int i) const { return done_[i].size(); }

  // Simulates the peer of `to` writing an arbitrary immediate (hostile tests).
  // Data payload, if any, is placed where the core expects it.
  int inject(int to, uint32_t imm, const uint8_t *payload = nullptr) {
    Endpoint &e = *ep_[to];
    if (e.recv_posted > 0) --e.recv_posted;
    const uint32_t len = imm_is_data(imm_op(imm)) ? imm_value(imm) : 0;
    const int rc = e.s.on_recv_imm(imm, len);
    if (rc == 0 && imm_is_data(imm_op(imm))) {
      if (payload) {
        const uint64_t off = e.data_bytes_received % e.rbuf.size();
        memcpy(&e.rbuf[off], payload, len);
      }
      ++e.data_msgs_received;
      e.data_bytes_received += len;
    }
    return rc;
  }

  std::string violation;
  bool expect_no_errors = true;     // honest pair: any protocol error is a violation
  bool strict_error_writes = true;  // a write returned by the call that raised an error counts too
  bool peek_commit = false;         // drive with peek_action + commit_action
  bool log_writes = false;

  void fail(const char *fmt, ...) __attribute__((format(printf, 2, 3))) {
    if (violation.size() > 4000) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (!violation.empty()) violation += "; ";
    violation += buf;
  }

 private:
  // Address translation with rkey and bounds check, as the peer's NIC does.
  static uint8_t *resolve(Endpoint &peer, uint64_t addr, uint32_t rkey, uint32_t len) {
    if (rkey == peer.rbuf_key) {
      const uint64_t off = addr - peer.rbuf_addr;
      if (addr >= peer.rbuf_addr && off <= peer.rbuf.size() && len <= peer.rbuf.size() - off) return &peer.rbuf[off];
    } else if (rkey == peer.table_key) {
      const uint64_t off = addr - peer.table_addr;
      if (addr >= peer.table_addr && off <= sizeof(peer.table) && len <= sizeof(peer.table) - off)
        return reinterpret_cast<uint8_t *>(peer.table) + off;
    }
    return nullptr;
  }

  void check_write(int i, const Action &a, StreamState before) {
    Endpoint &me = *ep_[i];
    Endpoint &peer = *ep_[1 - i];
    if (before == StreamState::kError) fail("endpoint %d: %s write after a protocol error", i, kind_name(a));
    else if (strict_error_writes && me.s.state() == StreamState::kError)
      fail("endpoint %d: %s write returned by the call that raised error '%s'", i, kind_name(a),
           me.s.error_reason() ? me.s.error_reason() : "?");
    if (me.disconnect_posted) fail("endpoint %d: %s write after its DISCONNECT", i, kind_name(a));
    if (a.token != me_tokens_[i])
      fail("endpoint %d: token %llu, expected %llu", i, static_cast<unsigned long long>(a.token),
           static_cast<unsigned long long>(me_tokens_[i]));
    me_tokens_[i] = a.token + 1;
    // Only the DISCONNECT ends the stream (the transport is torn down after it).
    if (a.closes != (a.write_kind == WriteKind::kControl && a.imm == 0xE0000000u))
      fail("endpoint %d: %s write %s marked as the closing write", i, kind_name(a), a.closes ? "wrongly" : "not");
    switch (a.write_kind) {
      case WriteKind::kData: {
        const uint32_t prb = peer.s.rbuf_size(), half = prb / 2;
        const uint64_t expect_off = me.data_bytes_posted % prb;
        if (!a.has_imm || imm_op(a.imm) != ImmOp::kData || imm_value(a.imm) != a.length)
          fail("endpoint %d: data write imm 0x%08x does not carry its length %u", i, a.imm, a.length);
        if (a.length == 0) fail("endpoint %d: zero-length data write (reads as EOF, §2.8)", i);
        if (a.length > kMaxWrite) fail("endpoint %d: data write of %u bytes > 512 KiB", i, a.length);
        if (static_cast<uint64_t>(a.sbuf_offset) + a.length > me.s.sbuf_size())
          fail("endpoint %d: data write [%u,+%u) outside the send ring of %u", i, a.sbuf_offset, a.length,
               me.s.sbuf_size());
        if (a.sbuf_offset != me.data_bytes_posted % me.s.sbuf_size())
          fail("endpoint %d: data write from send offset %u, expected %llu", i, a.sbuf_offset,
               static_cast<unsigned long long>(me.data_bytes_posted % me.s.sbuf_size()));
        if (a.rkey != peer.rbuf_key) fail("endpoint %d: data write with rkey 0x%x", i, a.rkey);
        const uint64_t off = a.remote_addr - peer.rbuf_addr;
        if (a.remote_addr < peer.rbuf_addr || off + a.length > prb)
          fail("endpoint %d: data write outside the peer ring", i);
        else if (off != expect_off)
          fail("endpoint %d: data write at ring offset %llu, expected %llu (slots out of order)", i,
               static_cast<unsigned long long>(off), static_cast<unsigned long long>(expect_off));
        else if (off % half + a.length > half) fail("endpoint %d: data write crosses a half/slot boundary", i);
        ++me.data_writes;
        me.data_bytes_posted += a.length;
        break;
      }
      case WriteKind::kCredits: {
        const uint16_t expect = static_cast<uint16_t>(me.data_msgs_received + me.s.rq_size());
        if (!a.has_imm || imm_op(a.imm) != ImmOp::kSgl) fail("endpoint %d: credit write imm 0x%08x", i, a.imm);
        else if (imm_value(a.imm) != expect)
          fail("endpoint %d: credit value %u, expected rseq_no + rq_size = %u", i, imm_value(a.imm), expect);
        const uint16_t v = static_cast<uint16_t>(imm_value(a.imm));
        if (me.have_credit_value && v < me.last_credit_value) ++me.credit_value_wraps;
        me.have_credit_value = true;
        me.last_credit_value = v;
        if (a.rkey != peer.table_key) fail("endpoint %d: credit write with rkey 0x%x", i, a.rkey);
        if (a.length == kSglRecordSize) {
          const uint64_t slot = (me.adverts + 1) % kSglSize;  // 1, 0, 1, 0, ... (§2.3)
          if (a.remote_addr != peer.table_addr + slot * kSglRecordSize)
            fail("endpoint %d: advert %llu written to 0x%llx, expected slot %llu", i,
                 static_cast<unsigned long long>(me.adverts), static_cast<unsigned long long>(a.remote_addr),
                 static_cast<unsigned long long>(slot));
          const SglEntry e = decode_le_sgl(a.record);
          const uint64_t half_off = ((me.adverts + 1) % 2) * me.half();  // H1, H0, H1, ...
          if (e.addr != me.rbuf_addr + half_off || e.key != me.rbuf_key || e.length != me.half())
            fail("endpoint %d: advert %llu describes {0x%llx, 0x%x, %u}", i,
                 static_cast<unsigned long long>(me.adverts), static_cast<unsigned long long>(e.addr), e.key, e.length);
          ++me.adverts;
        } else if (a.length == 0) {
          ++me.credit_only;
        } else {
          fail("endpoint %d: credit write of %u bytes", i, a.length);
        }
        break;
      }
      case WriteKind::kControl:
        if (!a.has_imm || a.length != 0 || (a.imm != 0xE0000000u && a.imm != 0xE0000002u))
          fail("endpoint %d: bad control write imm 0x%08x len %u", i, a.imm, a.length);
        if (a.imm == 0xE0000000u) me.disconnect_posted = true;
        if (a.imm == 0xE0000002u) {
          if (me.shutdown_posted) fail("endpoint %d: second SHUTDOWN", i);
          me.shutdown_posted = true;
        }
        if (me.data_bytes_posted != me.app_sent)
          fail("endpoint %d: control message posted before all committed data", i);
        ++me.controls;
        break;
      case WriteKind::kKeepalive:
        if (a.has_imm || a.length != 0) fail("endpoint %d: keepalive must be a plain 0-byte write", i);
        ++me.keepalives;
        break;
    }
  }

  std::unique_ptr<Endpoint> ep_[2];
  std::deque<Action> wire_[2];
  std::deque<uint64_t> done_[2];
  uint64_t me_tokens_[2] = {0, 0};
};

}  // namespace gpusock::wire::wiretest
