// gpusock device API: the leader's side of the channel to the proxy
// (gpusock/channel.h). Pushing requests onto the ring (push_request, and
// control for the calls the proxy answers), claiming socket slots, and reading
// a socket's status line. Everything here runs on one thread of a scope, its
// leader; the socket calls (socket_control.cuh, socket_data.cuh) broadcast
// what it found.
#ifndef GPUSOCK_GPU_CHANNEL_OPS_CUH
#define GPUSOCK_GPU_CHANNEL_OPS_CUH

#include <gpusock/channel.h>
#include <gpusock/gpu/primitives.cuh>
#include <gpusock/gpu/trace.cuh>
#include <gpusock/hd.h>

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

namespace gpusock {

using channel::DeviceContext;

namespace detail {

using namespace channel;

GS_HD bool valid_slot(const DeviceContext &c, int s) { return s >= 0 && static_cast<uint32_t>(s) < c.max_sockets; }

GS_HD bool stop_requested(const DeviceContext &c) { return prim::load_acquire(&c.shared->stop) != 0; }

// What a poll of a socket's status line found: its first 48 bytes. The
// counters come with acquire; the state words are not ordered with them:
// before trusting a terminal state, fence_acquire() and re-read the counters
// (the proxy publishes counters before the state bits that depend on them).
struct StatusView {
  uint64_t recv_write, send_done;
  uint32_t state, accept_queued;
  int32_t error, send_error;
  uint32_t buffer;
};

// The view of a status line's first 48 bytes, as loaded words (decoded in
// registers: a copy into a SocketStatus would go through local memory).
GS_HD StatusView status_view(const uint64_t *w) {
  static_assert(offsetof(SocketStatus, recv_write) == 0 && offsetof(SocketStatus, send_done) == 8 &&
                    offsetof(SocketStatus, state) == 16 && offsetof(SocketStatus, buffer) == 32 &&
                    offsetof(SocketStatus, accept_queued) == 36 && offsetof(SocketStatus, error) == 40 &&
                    offsetof(SocketStatus, send_error) == 44,
                "what a poll reads: the line's first 48 bytes, in this order");
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "words split low half first");
  StatusView v;
  v.recv_write = w[0];
  v.send_done = w[1];
  v.state = static_cast<uint32_t>(w[2]);
  v.buffer = static_cast<uint32_t>(w[4]);
  v.accept_queued = static_cast<uint32_t>(w[4] >> 32);
  v.error = static_cast<int32_t>(static_cast<uint32_t>(w[5]));
  v.send_error = static_cast<int32_t>(static_cast<uint32_t>(w[5] >> 32));
  return v;
}

// One thread's poll of a socket's status line: two 16-byte relaxed loads and
// one 16-byte acquire load of the counters. Issued together, but one thread's
// loads of one host line take nearly a PCIe round trip each: a scope's own
// calls poll with its warp (read_status_team); this serves a thread alone
// (gpoll, connect, accept).
GS_HD StatusView read_status(const DeviceContext &c, const SocketStatus *st) {
  (void)c;
  const uint64_t *line = reinterpret_cast<const uint64_t *>(st);
  uint64_t w[6];
  prim::load_relaxed_x2(line + 2, &w[2], &w[3]);  // state, releases, ctrl_done, ctrl_result
  prim::load_relaxed_x2(line + 4, &w[4], &w[5]);  // buffer, accept_queued, error, send_error
  // The counters last, with acquire: ring bytes published before them are
  // visible to the loads after this one, with no separate fence.
  prim::load_acquire_x2(line, &w[0], &w[1]);
  return status_view(w);
}

// An InlineRecv as one read found it (channel.h): usable only when whole.
struct InlineView {
  uint64_t w[sizeof(InlineRecv) / 8];
  GS_HD bool whole() const { return inline_check(w) == w[15]; }
  GS_HD uint64_t start() const { return w[0]; }
  GS_HD uint64_t end() const { return w[0] + static_cast<uint32_t>(w[1]); }
  GS_HD const uint8_t *data() const { return reinterpret_cast<const uint8_t *>(w + 2); }
};

// One thread's read of the status line and the socket's InlineRecv (several
// round trips, not the one a warp's load takes): the record's eight loads go
// first, the status line's after them, and only then are the record's words
// stored where take_inline can index them (a store that waited for its load
// before the status loads were issued would cost a round trip of its own: a
// warp issues in order).
GS_HD StatusView read_status(const DeviceContext &c, const SocketStatus *st, const InlineRecv *r, InlineView *iv) {
  uint64_t w[sizeof(InlineRecv) / 8];
  prim::load_relaxed_x16(reinterpret_cast<const uint64_t *>(r), w);
  const StatusView v = read_status(c, st);
  for (size_t i = 0; i < sizeof(InlineRecv) / 8; ++i) iv->w[i] = w[i];
  return v;
}

// A poll by the leader's team (prim::Team): every lane of it calls, lane 0
// gets the view of the status line and, with r, whether the InlineRecv may
// hold the bytes at recv_read (*record: then it is in *iv) (the other lanes get
// unspecified values). Lanes 0-2 load the line's 48 bytes, lanes 3-10 the
// record, 16 bytes each with acquire, in one warp-wide load: one PCIe round
// trip, where one thread's loads take nearly one apiece. The team's barrier
// orders what they acquired before lane 0's later accesses (and, by the
// scope's barrier after it, every thread's). The record's words reach lane 0
// only when its first line says it starts at or before recv_read and reaches
// past it and the published end: an idle poll moves 8 words, not 24. A team
// too small for it (a block of fewer than 11 threads) and the host backend
// read as one thread.
GS_HD StatusView read_status_team(const DeviceContext &c, const prim::Team &t, const SocketStatus *st,
                                  const InlineRecv *r, uint64_t recv_read, InlineView *iv, bool *record) {
  const unsigned need = r ? 3 + sizeof(InlineRecv) / 16 : 3;
  if (t.lanes < need) {
    StatusView v{};
    if (prim::team_leads(t)) v = r ? read_status(c, st, r, iv) : read_status(c, st);
    prim::team_sync(t);  // orders lane 0's acquire before the team's ring loads
    *record = r != nullptr;
    return v;
  }
  const unsigned lane = prim::team_rank(t);
  const uint64_t *src = lane < 3      ? reinterpret_cast<const uint64_t *>(st) + 2 * lane
                        : lane < need ? reinterpret_cast<const uint64_t *>(r) + 2 * (lane - 3)
                                      : nullptr;
  uint64_t a = 0, b = 0;
  if (src) prim::load_acquire_x2(src, &a, &b);
  prim::team_sync(t);
  uint64_t w[6];
  for (unsigned k = 0; k < 3; ++k) {
    w[2 * k] = prim::team_shfl(t, a, k);
    w[2 * k + 1] = prim::team_shfl(t, b, k);
  }
  const StatusView v = status_view(w);
  *record = false;
  if (r) {  // every lane decides alike: the same words, the same recv_read
    iv->w[0] = prim::team_shfl(t, a, 3);
    iv->w[1] = prim::team_shfl(t, b, 3);
    if (iv->start() <= recv_read && iv->end() > recv_read && iv->end() >= v.recv_write) {
      for (unsigned k = 1; k < sizeof(InlineRecv) / 16; ++k) {
        iv->w[2 * k] = prim::team_shfl(t, a, 3 + k);
        iv->w[2 * k + 1] = prim::team_shfl(t, b, 3 + k);
      }
      *record = true;
    }
  }
  return v;
}

// Counters again, after a fence_acquire() that followed the read of the state.
GS_HD void reread_counters(const SocketStatus *st, StatusView *v) {
  prim::load_relaxed_x2(&st->recv_write, &v->recv_write, &v->send_done);
}

GS_HD uint64_t deadline_after(int timeout_ms) {
  return timeout_ms < 0 ? ~uint64_t(0) : prim::now_ns() + static_cast<uint64_t>(timeout_ms) * 1000000ull;
}

// The end of one round of a leader's wait for the proxy: 0 after a pause (poll
// again), or why the wait is over: would_block for a call that must not wait
// (MSG_DONTWAIT, a non-blocking socket), -ESHUTDOWN once the host asked
// kernels to stop, -ETIMEDOUT past the deadline.
GS_HD int wait_more(const DeviceContext &c, prim::Backoff &backoff, bool dontwait, uint64_t deadline,
                    int would_block = -EAGAIN) {
  if (dontwait) return would_block;
  if (backoff.stop_check_due() && stop_requested(c)) return -ESHUTDOWN;
  if (prim::now_ns() >= deadline) return -ETIMEDOUT;
  backoff.pause();
  return 0;
}

// The error behind kStFailed / kStError, or `otherwise` when the proxy gave none.
GS_HD int status_error(const SocketStatus *st, int otherwise) {
  const int err = prim::load_acquire(&st->error);
  return err < 0 ? err : otherwise;
}

// The request ring a socket's requests go to (one per proxy thread).
struct RingView {
  Request *entries;
  unsigned long long *ticket;
  unsigned long long *consumed_seen;
  const uint64_t *consumed;
};
GS_HD RingView ring_for(const DeviceContext &c, uint32_t slot) {
  const uint32_t q = proxy_thread_of(slot, c.request_rings);
  return RingView{c.requests + size_t(q) * (c.request_mask + 1), c.ticket + q * kCounterStride,
                  c.consumed_seen + q * kCounterStride, &c.shared[q].consumed};
}

// Leader only. Takes a ticket, waits for room on the ring (back-pressure: the
// proxy has not consumed `entries` requests ago), writes the entry, publishes seq.
GS_HD int push_request(const DeviceContext &c, const Request &r, bool release = false) {
  GPUSOCK_TRACE(trace::kRequestBegin);
  const RingView ring = ring_for(c, r.slot);
  const unsigned long long ticket = prim::atomic_add(ring.ticket, 1ull);
  // Room on the ring: first against the highest `consumed` any producer saw
  // (GPU memory, cheap), and only when that is not enough across PCIe.
  if (ticket - *reinterpret_cast<volatile unsigned long long *>(ring.consumed_seen) > c.request_mask) {
    prim::Backoff backoff;
    for (;;) {
      const unsigned long long consumed = prim::load_acquire(ring.consumed);
      if (ticket - consumed <= c.request_mask) {
        prim::atomic_max(ring.consumed_seen, consumed);
        break;
      }
      if (backoff.stop_check_due() && stop_requested(c)) return -ESHUTDOWN;  // the ticket dies with the proxy
      backoff.pause();
    }
  }
  GPUSOCK_TRACE(trace::kRequestTicket);
  Request *e = ring.entries + (ticket & c.request_mask);
  // The entry as words, indexed by constants only: a GPU builds it in
  // registers (a copy of the Request would go through local memory).
  static_assert(offsetof(Request, seq) == 0 && offsetof(Request, check) == 56, "seq first, check last of line 0");
  uint64_t w[16];
  memcpy(w, &r, sizeof w);
  w[0] = ticket + 1;
  const int line1 = request_line1_words(r);
  w[7] = request_check(w, line1);
  uint64_t *dst = reinterpret_cast<uint64_t *>(e);
  // The second line when used (an address, an inline payload: covered by
  // check too), whole: four 16-byte stores the GPU sends as one write.
  if (line1 > 0) prim::store_line_relaxed(dst + 8, w + 8);
  // Release (a system-scope fence, costly): only when this block wrote ring
  // bytes the proxy will send (ordered before us by the block's barrier). The
  // request itself needs none: the proxy takes it only once check matches.
  if (release) prim::fence_release();
  prim::store_line_relaxed(dst, w);
  GPUSOCK_TRACE(trace::kRequestStored);
  return 0;
}

// Would a request for socket `slot` find room on its ring now?
GS_HD bool ring_has_room(const DeviceContext &c, int slot) {
  const RingView ring = ring_for(c, static_cast<uint32_t>(slot));
  const unsigned long long issued_now = *reinterpret_cast<volatile unsigned long long *>(ring.ticket);
  if (issued_now - *reinterpret_cast<volatile unsigned long long *>(ring.consumed_seen) <= c.request_mask) return true;
  const unsigned long long issued = *reinterpret_cast<volatile unsigned long long *>(ring.ticket);
  return issued - prim::load_acquire(ring.consumed) <= c.request_mask;
}

GS_HD Request make_request(const DeviceContext &c, int s, uint32_t op) {
  Request r{};
  const DeviceSocket &d = c.sockets[s];
  r.op = op;
  r.slot = static_cast<uint32_t>(s);
  r.gen = d.gen;
  r.send_tail = d.send_tail;
  r.recv_read = d.recv_read;
  return r;
}

// Leader only: a request the proxy answers at once, then its result.
GS_HD int control(const DeviceContext &c, int s, const Request &request) {
  Request r = request;
  DeviceSocket &d = c.sockets[s];
  r.ctrl_seq = ++d.ctrl_seq;
  int rc = push_request(c, r);
  if (rc < 0) return rc;
  // ctrl_done and ctrl_result are one 8-byte word the proxy writes at once.
  const uint64_t *word = reinterpret_cast<const uint64_t *>(&c.status[s].ctrl_done);
  prim::Backoff backoff;
  for (;;) {
    const uint64_t v = prim::load_acquire(word);  // what the proxy published before the answer is visible after it
    if (static_cast<uint32_t>(v) == r.ctrl_seq) return static_cast<int32_t>(static_cast<uint32_t>(v >> 32));
    if (backoff.stop_check_due() && stop_requested(c)) return -ESHUTDOWN;
    backoff.pause();
  }
}

// Leader only: claims a free slot. A slot is free when the GPU has claimed it
// as often as the proxy has released it.
GS_HD int claim_slot(const DeviceContext &c, bool nonblocking) {
  const uint32_t start = prim::atomic_add(c.claim_cursor, 1u);
  for (uint32_t i = 0; i < c.max_sockets; ++i) {
    const uint32_t slot = (start + i) % c.max_sockets;
    const uint32_t released = prim::load_acquire(&c.status[slot].releases);
    if (prim::atomic_cas(&c.claims[slot], released, released + 1) != released) continue;
    DeviceSocket &d = c.sockets[slot];
    d.send_tail = 0;
    d.recv_read = 0;
    d.send_done_seen = 0;
    d.gen = released + 1;
    d.ctrl_seq = 0;
    d.buffer = 0;
    d.flags = kDevOpen | (nonblocking ? kDevNonblocking : 0u);
    return static_cast<int>(slot);
  }
  return -EMFILE;
}

GS_HD int open_socket(const DeviceContext &c, int s) {
  if (!valid_slot(c, s) || !(c.sockets[s].flags & kDevOpen)) return -EBADF;
  return 0;
}

// MSG_DONTWAIT, or a non-blocking socket: calls on s must not wait.
GS_HD bool must_not_wait(const DeviceContext &c, int s, int flags) {
  return (flags & MSG_DONTWAIT) || (valid_slot(c, s) && (c.sockets[s].flags & kDevNonblocking));
}

// Leader: a request on s with arg0 that the proxy answers, and its result.
GS_HD int control_with_arg(const DeviceContext &c, int s, uint32_t op, int32_t arg0) {
  Request r = make_request(c, s, op);
  r.arg0 = arg0;
  return control(c, s, r);
}

// Leader: a request on s with an address (bind, connect) that the proxy
// answers, and its result; -EINVAL for what cannot be an address.
GS_HD int control_with_address(const DeviceContext &c, int s, uint32_t op, const sockaddr *addr, socklen_t len) {
  if (addr == nullptr || len < sizeof(sa_family_t) || len > kMaxAddrLen) return -EINVAL;
  Request r = make_request(c, s, op);
  r.addr_len = static_cast<uint32_t>(len);
  memcpy(r.addr, addr, len);
  return control(c, s, r);
}

}  // namespace detail
}  // namespace gpusock

#endif
