// One GPU socket's connection inside the proxy: a wire::ConnectionDriver over
// rings the GPU owns, fed from the GPU's published ring positions instead of
// from send()/recv() calls, and read back as what the GPU polls.
#pragma once

#include "wire/connection_driver.h"

#include <gpusock/channel.h>

#include <sys/socket.h>

#include <chrono>
#include <cstdint>

namespace gpusock::proxy {

using Clock = std::chrono::steady_clock;
using wire::DriverState;

// A receive ring and a send ring of one connection, out of the proxy's pools.
struct BufferSet {
  uint32_t index = 0;
  void *rbuf = nullptr;  // the address the transport registers (host or GPU memory)
  void *sbuf = nullptr;
  uint32_t rbuf_size = 0;
  uint32_t sbuf_size = 0;
};

// What the GPU sees of a connection (channel::SocketStatus fields).
struct ConnSnapshot {
  uint64_t recv_write = 0;
  uint64_t send_done = 0;
  uint32_t state = 0;
  int32_t error = 0;
  int32_t send_error = 0;
};

class Connection {
 public:
  Connection(wire::Domain *domain, const BufferSet &buffers)
      : buffers_(buffers), driver_(domain, &Connection::on_driver_error, this) {}
  Connection(const Connection &) = delete;
  Connection &operator=(const Connection &) = delete;

  // Active side: registers the rings, creates the endpoint, starts connecting.
  int connect(const sockaddr *addr, socklen_t len) { return driver_.connect(addr, len, config()); }
  // Passive side: the same for a request a listener took (peer record decoded).
  int accept(wire::ConnectionRequest *request, const wire::ConnRecord &peer) {
    return driver_.accept(request, peer, config());
  }

  // One progress pass; true if anything happened.
  bool progress() { return driver_.progress(); }
  // The GPU's ring positions (absolute, monotonic; stale values are ignored).
  void apply_gpu_positions(uint64_t send_tail, uint64_t recv_read);
  int shutdown(int how) { return driver_.shutdown(how); }
  void begin_close(Clock::time_point deadline) { driver_.begin_close(deadline); }
  // Drops the connection without the in-band DISCONNECT: the peer sees a reset.
  void abort() { driver_.abort(); }
  // Flushed and disconnected (or out of time): it may be destroyed.
  bool close_finished() { return driver_.close_finished(); }

  // kOpDataInline: the payload is the send ring's bytes [send_tail - n,
  // send_tail): written there, unless the request is stale.
  void write_inline_send(uint64_t send_tail, const uint8_t *payload, uint32_t n);
  // The receive ring's bytes the GPU has not consumed (as far as its requests
  // told), when they all fit into an InlineRecv: copied into *out (which is
  // left alone otherwise). True if it wrote.
  bool fill_inline_recv(channel::InlineRecv *out) const;

  // GPU turnaround (ProxyStats): bytes for the GPU were published at `now`;
  // and, when a request hands bytes to send, how long since (0: none pending).
  void note_data_published(Clock::time_point now) {
    if (data_published_ == Clock::time_point{}) data_published_ = now;
  }
  uint64_t turnaround_ns(Clock::time_point now);

  ConnSnapshot snapshot() const;
  DriverState state() const { return driver_.state(); }
  const BufferSet &buffers() const { return buffers_; }

 private:
  wire::DriverConfig config() const;
  static void on_driver_error(void *self, gs_status_t err, const char *why);

  BufferSet buffers_;
  wire::ConnectionDriver driver_;
  // The GPU's positions as applied to the core.
  uint64_t send_committed_ = 0;
  uint64_t recv_reported_ = 0;
  Clock::time_point data_published_{};
};

}  // namespace gpusock::proxy
