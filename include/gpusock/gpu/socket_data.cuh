// gpusock device API: the socket calls that move data (recv, send) or wait
// for it (poll), each a template on the scope that runs it (BlockScope,
// WarpScope or ThreadScope, scope.cuh). The leader plans from the socket's status line
// (channel_ops.cuh) and broadcasts the plan; every thread of the scope copies
// its share of the bytes. calls.cuh gives them their public names.
#ifndef GPUSOCK_GPU_SOCKET_DATA_CUH
#define GPUSOCK_GPU_SOCKET_DATA_CUH

#include <gpusock/channel.h>
#include <gpusock/gpu/channel_ops.cuh>
#include <gpusock/gpu/primitives.cuh>
#include <gpusock/gpu/scope.cuh>
#include <gpusock/gpu/trace.cuh>
#include <gpusock/hd.h>

#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

namespace gpusock {

using gpollfd = ::pollfd;

namespace detail {

using namespace channel;

// ---- per-call plans: what the leader found, broadcast to the scope ----
struct Plan {
  int64_t n;        // bytes to move now (> 0), or the call's result (<= 0)
  uint64_t offset;  // ring offset
  uint64_t ring;    // ring base (a GPU pointer)
  uint64_t pos;     // the absolute ring position the bytes start at: the leader's
                    // bookkeeping after the copy needs no load of it (GPU memory,
                    // a few hundred ns on the path of every message)
};

// A plan that moves nothing: the call's result.
GS_HD Plan plan_result(int64_t result) { return Plan{result, 0, 0, 0}; }

// pos % size and whether [before, after) crosses a multiple of size, for ring
// positions: by masks when size is a power of two (the default rings), since a
// 64-bit division is a software routine on a GPU (~100 instructions).
GS_HD uint64_t ring_offset(uint64_t pos, uint64_t size) {
  return (size & (size - 1)) == 0 ? pos & (size - 1) : pos % size;
}
GS_HD bool crosses(uint64_t before, uint64_t after, uint64_t size) {
  return (size & (size - 1)) == 0 ? (before ^ after) >= size : before / size != after / size;
}

// The plan for moving up to `want` bytes at absolute position `pos` of buffer
// set `buffer`'s ring (ring_size bytes each, from `rings`) when `avail` bytes
// there may be moved: never past the ring's end.
GS_HD Plan ring_plan(const uint8_t *rings, uint32_t ring_size, uint32_t buffer, uint64_t pos, uint64_t avail,
                     size_t want) {
  const uint64_t offset = ring_offset(pos, ring_size);
  uint64_t n = avail;
  if (n > ring_size - offset) n = ring_size - offset;
  if (n > want) n = want;
  return Plan{static_cast<int64_t>(n), offset,
              reinterpret_cast<uint64_t>(rings + static_cast<size_t>(buffer) * ring_size), pos};
}

// Leader: when the socket's InlineRecv, read with its status, holds all the
// bytes published (and those from recv_read on), copies up to `want` of them
// to dst and says how many; 0 when the ring must be read.
GS_HD uint64_t take_inline(const InlineView &iv, uint64_t recv_read, uint64_t recv_write, size_t want, uint8_t *dst) {
  if (!iv.whole() || iv.start() > recv_read || iv.end() <= recv_read || iv.end() < recv_write) return 0;
  uint64_t n = iv.end() - recv_read;
  if (n > want) n = want;
  memcpy(dst, iv.data() + (recv_read - iv.start()), static_cast<size_t>(n));
  return n;
}

// Leader: what one poll (v, and the inline record iv where used) means for a
// recv: true with the plan when bytes can be read or the call is over, false
// to wait. A small message that came inline is copied to inline_dst at once:
// the plan then says how many bytes, with no ring (ring == 0).
GS_HD bool recv_verdict(const DeviceContext &c, int s, StatusView v, const InlineView *iv, size_t want,
                        uint8_t *inline_dst, Plan *p) {
  DeviceSocket &d = c.sockets[s];
  const SocketStatus *st = c.status + s;
  if (iv) {
    if (const uint64_t n = take_inline(*iv, d.recv_read, v.recv_write, want, inline_dst)) {
      GPUSOCK_TRACE(trace::kRecvSeen);
      *p = Plan{static_cast<int64_t>(n), 0, 0, d.recv_read};
      return true;
    }
  }
  const uint32_t state = v.state;
  const bool terminal = (state & (kStError | kStFailed | kStRecvClosed | kStHangup)) != 0;
  if (terminal && v.recv_write <= d.recv_read) {
    prim::fence_acquire();    // the state and the counters came in no order: order the counters after it
    reread_counters(st, &v);  // counters are published before the state bits
  }
  const uint64_t written = v.recv_write;
  if (written > d.recv_read) {
    GPUSOCK_TRACE(trace::kRecvSeen);
    *p = ring_plan(c.rbufs, c.rbuf_size, d.buffer, d.recv_read, written - d.recv_read, want);
    return true;
  }
  if (state & (kStError | kStFailed)) *p = plan_result(status_error(st, -ECONNRESET));
  else if (state & (kStRecvClosed | kStHangup)) *p = plan_result(0);  // EOF
  else if (!(state & kStConnected) && !(d.flags & kDevConnecting)) *p = plan_result(-ENOTCONN);
  else {
    GPUSOCK_TRACE(trace::kRecvPolled);  // after branches on what the read returned: it has come back
    return false;
  }
  return true;
}

// The poll team's loop behind recv_plan and send_plan (every lane of the
// leader's team calls; the team polls, lane 0 decides, and its plan is the one
// that counts): lane 0's first(&p) settles the call without a poll or not;
// then each round every lane takes part in poll() and lane 0 judges what it
// read with verdict(view, &p), waiting a little more when that says not yet.
template <class First, class Poll, class Verdict>
GS_HD Plan team_plan(const DeviceContext &c, const prim::Team &t, bool dontwait, uint64_t deadline, First first,
                     Poll poll, Verdict verdict) {
  const bool lead = prim::team_leads(t);
  Plan p{};
  int done = lead ? first(&p) : 0;
  if (prim::team_shfl(t, done, 0)) return p;
  prim::Backoff backoff;
  for (;;) {
    const auto view = poll();
    if (lead) {
      done = verdict(view, &p);
      if (!done) {
        if (const int rc = wait_more(c, backoff, dontwait, deadline); rc < 0) {
          p = plan_result(rc);
          done = 1;
        }
      }
    }
    if (prim::team_shfl(t, done, 0)) return p;
  }
}

// The leader's poll team (S::in_poll_team): how much may be read now, or the
// result if nothing can be (team_plan).
GS_HD Plan recv_plan(const DeviceContext &c, const prim::Team &t, int s, size_t want, bool dontwait, uint64_t deadline,
                     uint8_t *inline_dst) {
  const InlineRecv *record = (c.flags & kCtxInlineRecv) ? c.inline_recv + s : nullptr;
  InlineView iv;
  struct View {
    StatusView v;
    bool has_record;
  };
  auto first = [&](Plan *p) {
    if (const int rc = open_socket(c, s); rc < 0) *p = plan_result(rc);
    else if (c.sockets[s].flags & kDevShutRd) *p = plan_result(0);  // EOF after our own SHUT_RD
    else return 0;
    return 1;
  };
  auto poll = [&] {
    GPUSOCK_TRACE(trace::kRecvPollIssued);
    View view{};
    // c.sockets[s].recv_read: every lane, the same (only this call moves it)
    view.v = read_status_team(c, t, c.status + s, record, c.sockets[s].recv_read, &iv, &view.has_record);
    return view;
  };
  auto verdict = [&](const View &view, Plan *p) {
    return recv_verdict(c, s, view.v, view.has_record ? &iv : nullptr, want, inline_dst, p) ? 1 : 0;
  };
  return team_plan(c, t, dontwait, deadline, first, poll, verdict);
}

template <class S>
GS_HD ssize_t recv(const DeviceContext &c, int s, void *buf, size_t len, int flags, int timeout_ms) {
  const bool waitall = (flags & MSG_WAITALL) != 0;
  const uint64_t deadline = S::leader() ? deadline_after(timeout_ms) : 0;  // only the leader waits
  const bool dontwait = must_not_wait(c, s, flags);
  size_t done = 0;
  while (done < len) {
    Plan p{};
    if (S::in_poll_team())
      p = recv_plan(c, S::poll_team(), s, len - done, dontwait, deadline, static_cast<uint8_t *>(buf) + done);
    p = S::broadcast(p);
    if (p.n <= 0) return done > 0 ? static_cast<ssize_t>(done) : static_cast<ssize_t>(p.n);
    const uint8_t *ring = reinterpret_cast<const uint8_t *>(p.ring);
    if (ring)  // else the leader copied the bytes from the inline record
      group_copy<S>(static_cast<uint8_t *>(buf) + done, ring + p.offset, static_cast<size_t>(p.n), true);
    S::sync();  // every thread is done reading before the space is handed back
    if (S::leader()) {
      GPUSOCK_TRACE(trace::kRecvCopied);
      DeviceSocket &d = c.sockets[s];
      const uint64_t before = p.pos;
      d.recv_read = p.pos + static_cast<uint64_t>(p.n);
      // The core advertises the ring in halves: consumption matters to the
      // proxy only when it completes a half, so only then is it worth a doorbell.
      const uint64_t half = c.rbuf_size / 2;
      if (crosses(before, d.recv_read, half)) push_request(c, make_request(c, s, kOpData));
      GPUSOCK_TRACE(trace::kRecvDone);
    }
    done += static_cast<size_t>(p.n);
    if (!waitall) break;
  }
  return static_cast<ssize_t>(done);
}

// Leader: whether the send ring has room with the transport done with what
// precedes send_done (and, for MSG_DONTWAIT, the request ring has room for the
// request that follows); if so, where the next bytes go.
GS_HD bool send_room(const DeviceContext &c, int s, const DeviceSocket &d, uint64_t send_done, size_t want,
                     bool dontwait, Plan *p) {
  const uint64_t used = d.send_tail - send_done;
  if (used >= c.sbuf_size || (dontwait && !ring_has_room(c, s))) return false;
  *p = ring_plan(c.sbufs, c.sbuf_size, d.buffer, d.send_tail, c.sbuf_size - used, want);
  return true;
}

// Leader: what one poll of the status line means for a send: true with the
// plan when bytes can go into the send ring or the call is over, false to wait.
GS_HD bool send_verdict(const DeviceContext &c, int s, const StatusView &v, size_t want, bool dontwait, Plan *p) {
  DeviceSocket &d = c.sockets[s];
  const uint32_t state = v.state;
  if (v.send_error < 0) {
    *p = plan_result(v.send_error);
    return true;
  }
  if (state & (kStError | kStFailed)) {
    prim::fence_acquire();
    *p = plan_result(status_error(c.status + s, -ECONNRESET));
    return true;
  }
  if (state & kStConnected) {
    if (send_room(c, s, d, v.send_done, want, dontwait, p)) {
      // send_done was an acquire: the transport is done with that space.
      d.send_done_seen = v.send_done;
      d.flags |= kDevConnectedSeen;
      return true;
    }
  } else if (!(d.flags & kDevConnecting)) {
    *p = plan_result(-ENOTCONN);
    return true;
  }
  return false;
}

// The leader's poll team (S::in_poll_team): where the next bytes may go into
// the send ring, or the result (team_plan).
GS_HD Plan send_plan(const DeviceContext &c, const prim::Team &t, int s, size_t want, bool dontwait,
                     uint64_t deadline) {
  auto first = [&](Plan *p) {
    if (const int rc = open_socket(c, s); rc < 0) {
      *p = plan_result(rc);
      return 1;
    }
    const DeviceSocket &d = c.sockets[s];
    // Fast path: room known from an earlier look at send_done (which only
    // grows) needs no PCIe round trip. Errors then show once the ring
    // fills, as with a TCP send buffer.
    if (d.flags & kDevShutWr) *p = plan_result(-EPIPE);
    else if (!(d.flags & kDevConnectedSeen) || !send_room(c, s, d, d.send_done_seen, want, dontwait, p)) return 0;
    return 1;
  };
  auto poll = [&] {
    bool unused = false;
    return read_status_team(c, t, c.status + s, nullptr, 0, nullptr, &unused);
  };
  auto verdict = [&](const StatusView &v, Plan *p) { return send_verdict(c, s, v, want, dontwait, p) ? 1 : 0; };
  return team_plan(c, t, dontwait, deadline, first, poll, verdict);
}

// Leader: an inline message's bytes into its request, 16 at a time where the
// source allows (byte loads of GPU memory would be on the path of every small
// send).
GS_HD void copy_payload(uint8_t *dst, const uint8_t *src, size_t len) {
#if defined(__CUDA_ARCH__)
  size_t i = 0;
  if ((reinterpret_cast<uintptr_t>(src) & 15) == 0 && (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
    uint4 words[kInlineSendBytes / 16];
    const size_t whole = len / 16;
    for (size_t k = 0; k < whole; ++k) words[k] = reinterpret_cast<const uint4 *>(src)[k];  // all in flight
    for (size_t k = 0; k < whole; ++k) reinterpret_cast<uint4 *>(dst)[k] = words[k];
    i = whole * 16;
  }
  for (; i < len; ++i) dst[i] = src[i];
#else
  memcpy(dst, src, len);
#endif
}

// A large send goes in pieces of a quarter ring, each announced by its own
// request: the proxy starts sending the first while the scope copies the next.
GS_HD size_t send_piece(const DeviceContext &c, size_t left) {
  const size_t piece = c.sbuf_size / 4 > 4096 ? c.sbuf_size / 4 : 4096;
  return left < piece ? left : piece;
}

template <class S>
GS_HD ssize_t send(const DeviceContext &c, int s, const void *buf, size_t len, int flags, int timeout_ms) {
  GPUSOCK_TRACE(trace::kSendCalled);
  const uint64_t deadline = S::leader() ? deadline_after(timeout_ms) : 0;  // only the leader waits
  const bool dontwait = must_not_wait(c, s, flags);
  size_t done = 0;
  do {
    Plan p{};
    if (S::in_poll_team()) {
      p = send_plan(c, S::poll_team(), s, send_piece(c, len - done), dontwait, deadline);
      GPUSOCK_TRACE(trace::kSendPlanned);
    }
    p = S::broadcast(p);
    if (p.n < 0 || (p.n == 0 && len > 0)) return done > 0 ? static_cast<ssize_t>(done) : static_cast<ssize_t>(p.n);
    if (len == 0) return 0;
    if ((c.flags & kCtxInlineSend) && done == 0 && len <= kInlineSendBytes && static_cast<size_t>(p.n) == len) {
      // A whole small message rides in the request (kOpDataInline): the proxy
      // writes it into the ring, so the GPU writes no ring byte and needs no
      // release fence. The plan's broadcast was the barrier after which the
      // leader may read every thread's bytes.
      if (S::leader()) {
        Request r = make_request(c, s, kOpDataInline);
        r.send_tail = p.pos + len;
        c.sockets[s].send_tail = r.send_tail;
        r.arg0 = static_cast<int32_t>(len);
        copy_payload(r.payload, static_cast<const uint8_t *>(buf), len);
        push_request(c, r);
      }
      return static_cast<ssize_t>(len);
    }
    uint8_t *ring = reinterpret_cast<uint8_t *>(p.ring);
    group_copy<S>(ring + p.offset, static_cast<const uint8_t *>(buf) + done, static_cast<size_t>(p.n), false);
    // No fence per thread: the barrier orders every thread's ring writes before
    // the leader's release store of the request's seq, which is cumulative, so
    // the proxy that acquires seq sees them all.
    S::sync();
    if (S::leader()) {
      Request r = make_request(c, s, kOpData);
      r.send_tail = p.pos + static_cast<uint64_t>(p.n);
      c.sockets[s].send_tail = r.send_tail;
      push_request(c, r, /*release=*/true);
    }
    done += static_cast<size_t>(p.n);
  } while (done < len);  // MSG_DONTWAIT: the plan says -EAGAIN once the ring is full
  return static_cast<ssize_t>(done);
}

// poll(2) events of one socket now (any thread).
GS_HD short ready_events(const DeviceContext &c, const gpollfd &f) {
  if (f.fd < 0) return 0;
  if (!valid_slot(c, f.fd) || !(c.sockets[f.fd].flags & kDevOpen)) return POLLNVAL;
  const DeviceSocket &d = c.sockets[f.fd];
  const StatusView v = read_status(c, c.status + f.fd);  // one round trip per socket
  const uint32_t state = v.state;
  short ev = 0;
  if (state & kStListening) {
    if (v.accept_queued > 0) ev |= POLLIN | POLLRDNORM;
  } else {
    const bool eof = (state & (kStRecvClosed | kStHangup | kStError | kStFailed)) != 0;
    if (v.recv_write > d.recv_read || eof || (d.flags & kDevShutRd)) ev |= POLLIN | POLLRDNORM;
    if ((state & kStConnected) && !(state & kStError) && v.send_error == 0 && !(d.flags & kDevShutWr)) {
      const uint64_t free_bytes = c.sbuf_size - (d.send_tail - v.send_done);
      const uint64_t lowat = c.sbuf_size < 2048 ? c.sbuf_size : 2048;
      if (free_bytes >= lowat) ev |= POLLOUT | POLLWRNORM;
    }
    if ((state & kStRecvClosed) && !(state & (kStHangup | kStError))) ev |= POLLRDHUP;
    if (state & kStHangup) ev |= POLLHUP | POLLRDHUP;
    if (state & (kStError | kStFailed)) ev |= POLLERR | POLLHUP | POLLOUT;
  }
  return static_cast<short>(ev & (f.events | POLLERR | POLLHUP | POLLNVAL));
}

template <class S>
GS_HD int poll(const DeviceContext &c, gpollfd *fds, int nfds, int timeout_ms) {
  if (nfds < 0) return -EINVAL;
  uint64_t deadline = 0;
  if (S::leader()) deadline = deadline_after(timeout_ms);
  // Threads may still be reading the revents of the previous call: nobody
  // writes new ones before everyone has arrived.
  S::sync();
  prim::Backoff backoff;
  for (;;) {
    unsigned ready = 0;
    for (int base = 0; base < nfds; base += static_cast<int>(S::size())) {
      const int i = base + static_cast<int>(S::rank());
      bool hit = false;
      if (i < nfds) {
        fds[i].revents = ready_events(c, fds[i]);
        hit = fds[i].revents != 0;
      }
      ready += S::count(hit);
    }
    int verdict = 1;  // 1: wait more
    if (S::leader()) {
      if (ready > 0) verdict = static_cast<int>(ready);
      else if (timeout_ms == 0 || prim::now_ns() >= deadline) verdict = 0;
      else if (backoff.stop_check_due() && stop_requested(c)) verdict = -ESHUTDOWN;
      else verdict = -1000;  // keep waiting (distinct from every result)
    }
    verdict = S::broadcast(verdict);
    if (verdict != -1000) return verdict;
    backoff.pause();
  }
}

}  // namespace detail
}  // namespace gpusock

#endif
