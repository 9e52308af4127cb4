#include "proxy/connection.h"

#include <algorithm>
#include <cstdio>

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
    std::fprintf(stderr, "gpusock proxy: closing connection: %s (%s)\n", why, gs_status_name(err));
}

void Connection::apply_gpu_positions(uint64_t send_tail, uint64_t recv_read) {
  const DriverState state = driver_.state();
  if (state != DriverState::kConnected && state != DriverState::kConnecting && state != DriverState::kAccepting)
    return;
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
