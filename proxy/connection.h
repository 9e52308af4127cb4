// One GPU socket's connection inside the proxy: the protocol core (wire/core)
// bound to a transport endpoint, with the receive and send rings the GPU owns.
//
// This is StreamSocket's driving loop (poll CM events and completions into the
// core, drain its actions into the transport) with two differences: the rings
// are GPU-visible memory handed in by the proxy, and the application's side of
// the core (send_commit / recv_consume) is fed from the GPU's published ring
// positions instead of from send()/recv() calls.
#pragma once

#include "wire/core/stream.h"
#include "wire/transport.h"

#include <gpusock/proxy.h>

#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <memory>

namespace gpusock::proxy {

using Clock = std::chrono::steady_clock;

// A receive ring and a send ring of one connection, out of the proxy's pools.
struct BufferSet {
  uint32_t index = 0;
  void *rbuf = nullptr;  // the address the transport registers (host or GPU memory)
  void *sbuf = nullptr;
  uint32_t rbuf_size = 0;
  uint32_t sbuf_size = 0;
};

enum class ConnRole : uint8_t { kNew, kConnecting, kAccepting, kConnected, kFailed };

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
  Connection(wire::Domain *domain, const BufferSet &buffers);
  ~Connection();
  Connection(const Connection &) = delete;
  Connection &operator=(const Connection &) = delete;

  // Active side: registers the rings, creates the endpoint, starts connecting.
  int connect(const sockaddr *addr, socklen_t len);
  // Passive side: the same for a request a listener took (peer record decoded).
  int accept(wire::ConnectionRequest *request, const wire::ConnRecord &peer);

  // One progress pass; true if anything happened.
  bool progress();
  // The GPU's ring positions (absolute, monotonic; stale values are ignored).
  void apply_gpu_positions(uint64_t send_tail, uint64_t recv_read);
  int shutdown(int how);
  void begin_close(Clock::time_point deadline);
  // Drops the connection without the in-band DISCONNECT: the peer sees a reset.
  void abort();
  // Flushed and disconnected (or out of time): it may be destroyed.
  bool close_finished();

  ConnSnapshot snapshot() const;
  ConnRole role() const { return role_; }
  const BufferSet &buffers() const { return buffers_; }

 private:
  int setup(wire::ConnectionRequest *request);
  bool poll_cm();
  bool poll_completions();
  bool drain_actions();
  void transport_gone(int status);

  wire::Domain *domain_;
  BufferSet buffers_;
  ConnRole role_ = ConnRole::kNew;
  int error_ = 0;  // connect failure (negated errno)
  bool transport_established_ = false;
  bool closing_ = false;
  bool aborted_ = false;
  Clock::time_point close_deadline_{};

  std::unique_ptr<wire::Endpoint> endpoint_;
  wire::Stream core_;
  uint8_t record_[wire::kConnRecordSize] = {};
  uint8_t *meta_ = nullptr;  // target table + control staging (proxy-private host memory)
  wire::MemoryRegion sbuf_mr_{}, rbuf_mr_{}, meta_mr_{};
  uint32_t ctrl_stage_next_ = 0;

  // The GPU's positions as applied to the core.
  uint64_t send_committed_ = 0;
  uint64_t recv_reported_ = 0;
};

}  // namespace gpusock::proxy
