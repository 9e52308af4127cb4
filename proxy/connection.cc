#include "proxy/connection.h"
#include "wire/log.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace gpusock::proxy {

using namespace gpusock::wire;

wire::DriverConfig Connection::config() const {
  DriverConfig config;  // rsocket's queue sizes; the rings are the proxy's
  config.rbuf = buffers_.rbuf;
  config.sbuf = buffers_.sbuf;
  config.rbuf_size = buffers_.rbuf_size;
  config.sbuf_size = buffers_.sbuf_size;
  return config;
}

// A refused connect reaches the GPU as the socket's error; only a peer cut off
// after it connected (a protocol violation) is worth a line on stderr.
void Connection::on_driver_error(void *self, gs_status_t err, const char *why) {
  if (static_cast<Connection *>(self)->driver_.state() == DriverState::kConnected)
    log::write(log::kWarn, "proxy", "closing connection: %s (%s)", why, gs_status_name(err));
}

uint64_t Connection::turnaround_ns(Clock::time_point now) {
  if (data_published_ == Clock::time_point{}) return 0;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now - data_published_).count();
  data_published_ = {};
  return ns > 0 ? static_cast<uint64_t>(ns) : 1;
}

void Connection::apply_gpu_positions(uint64_t send_tail, uint64_t recv_read) {
  const DriverState state = driver_.state();
  if (state != DriverState::kConnected && state != DriverState::kConnecting && state != DriverState::kAccepting) return;
  Stream &core = driver_.core();
  if (send_tail > send_committed_) {
    // The GPU wrote only into space we published as free, so this always fits.
    core.send_commit(static_cast<uint32_t>(send_tail - send_committed_));
    send_committed_ = send_tail;
  }
  if (recv_read > recv_reported_) {
    // After SHUT_RD or our DISCONNECT the core drops arriving bytes itself;
    // never consume more than it holds.
    const uint64_t n = std::min<uint64_t>(recv_read - recv_reported_, core.recv_available());
    core.recv_consume(static_cast<uint32_t>(n));
    recv_reported_ = recv_read;
  }
  if (state == DriverState::kConnected) driver_.post_actions();
}

namespace {

// Copies n bytes from/to a ring at absolute position pos, across its end.
void ring_copy(uint8_t *ring, uint32_t size, uint64_t pos, uint8_t *bytes, uint32_t n, bool to_ring) {
  const uint32_t offset = static_cast<uint32_t>(pos % size);
  const uint32_t first = std::min(n, size - offset);
  if (to_ring) {
    std::memcpy(ring + offset, bytes, first);
    std::memcpy(ring, bytes + first, n - first);
  } else {
    std::memcpy(bytes, ring + offset, first);
    std::memcpy(bytes + first, ring, n - first);
  }
}

}  // namespace

void Connection::write_inline_send(uint64_t send_tail, const uint8_t *payload, uint32_t n) {
  // Only the bytes this request adds: a stale or repeated request changes nothing.
  if (n == 0 || n > channel::kInlineSendBytes || send_tail < n || send_tail - n != send_committed_) return;
  // The GPU writes only into space published free; a request that says
  // otherwise is not believed.
  const uint64_t send_done = send_committed_ - driver_.core().send_unacked();
  if (send_tail - send_done > buffers_.sbuf_size) return;
  ring_copy(static_cast<uint8_t *>(buffers_.sbuf), buffers_.sbuf_size, send_tail - n, const_cast<uint8_t *>(payload), n,
            true);
}

bool Connection::fill_inline_recv(channel::InlineRecv *out) const {
  if (driver_.state() != DriverState::kConnected) return false;
  const uint64_t end = recv_reported_ + driver_.core().recv_available();
  const uint64_t n = end - recv_reported_;
  if (n == 0 || n > channel::kInlineRecvBytes) return false;
  channel::InlineRecv r{};
  r.start = recv_reported_;
  r.length = static_cast<uint32_t>(n);
  ring_copy(static_cast<uint8_t *>(buffers_.rbuf), buffers_.rbuf_size, r.start, r.data, r.length, false);
  r.check = channel::inline_check(reinterpret_cast<const uint64_t *>(&r));
  // Word by word (the GPU reads words, and checks what it read), check last.
  const uint64_t *src = reinterpret_cast<const uint64_t *>(&r);
  uint64_t *dst = reinterpret_cast<uint64_t *>(out);
  for (size_t i = 0; i < sizeof r / 8; ++i) __atomic_store_n(dst + i, src[i], __ATOMIC_RELAXED);
  return true;
}

ConnSnapshot Connection::snapshot() const {
  ConnSnapshot s;
  switch (driver_.state()) {
    case DriverState::kFailed:
      s.state = channel::kStFailed;
      s.error = driver_.error() < 0 ? driver_.error() : -ECONNREFUSED;
      return s;
    case DriverState::kConnected:
      break;
    default:
      return s;
  }
  const Stream &core = driver_.core();
  s.recv_write = recv_reported_ + core.recv_available();
  s.send_done = send_committed_ - core.send_unacked();
  s.state = channel::kStConnected;
  if (core.recv_closed()) s.state |= channel::kStRecvClosed;
  if (core.state() == StreamState::kDisconnected) s.state |= channel::kStHangup;
  if (core.state() == StreamState::kError) {
    s.state |= channel::kStError;
    s.error = core.error() < 0 ? core.error() : -ECONNRESET;
  }
  const int send_status = core.send_status();
  if (send_status < 0) s.send_error = send_status;
  return s;
}

}  // namespace gpusock::proxy
