// One connection's driver: the protocol core (wire/core) bound to a transport
// endpoint (wire/transport.h) and the three registered buffers they share.
//
// It is the one driving loop of gpusock. The CPU socket (wire/socket) and the
// GPU proxy (proxy/) each own one per connection and keep only what differs:
// the socket locks and feeds the core from send()/recv(), the proxy feeds it
// from the GPU's published ring positions; each reports failures its own way
// (the ErrorSink). A pass polls CM events and completions into the core and
// posts the core's actions; nothing here is thread-safe (owners serialise).
#pragma once

#include "wire/core/stream.h"
#include "wire/transport.h"

#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <memory>

namespace gpusock::wire {

using DriverClock = std::chrono::steady_clock;

// The meta block of a connection (one page): the target table the peer writes
// its adverts into, then kQpCtrlSize staging slots for outgoing control records.
inline constexpr uint32_t kMetaTableBytes = kSglSize * kSglRecordSize;
inline constexpr uint32_t kMetaBlockSize = 4096;
static_assert(kMetaTableBytes + kQpCtrlSize * kSglRecordSize <= kMetaBlockSize, "the meta block holds both");

// The receive ring a requested size becomes: even (it is advertised in
// halves), at least a page, each half at most kMaxDataLength (§1.3).
inline uint32_t receive_ring_size(uint32_t requested) {
  const uint32_t even = requested & ~1u;
  return even < 4096 ? 4096 : (even > 2 * kMaxDataLength ? 2 * kMaxDataLength : even);
}

// What a connection is sized to. The rings may be handed in (the proxy's
// pools); null rings are allocated, page-aligned and zeroed, and freed by the
// driver (the CPU socket).
struct DriverConfig {
  void *rbuf = nullptr;
  void *sbuf = nullptr;
  uint32_t rbuf_size = kDefaultBufSize;  // even, >= 4096
  uint32_t sbuf_size = kDefaultBufSize;  // >= 4096
  uint16_t sq_size = kDefaultSqSize;
  uint16_t rq_size = kDefaultRqSize;
  uint32_t inline_size = kDefaultInline;
};

enum class DriverState : uint8_t {
  kIdle,        // nothing set up
  kConnecting,  // active side, waiting for the peer's record
  kAccepting,   // passive side, waiting for the transport to establish
  kConnected,   // records exchanged: data may flow (the core has the rest)
  kFailed,      // set-up failed or was refused: error() says why; transport released
};

// How an owner hears why a connection failed or was cut off: a refused or
// failed set-up (state kFailed), or a peer that broke the protocol (the core is
// in kError and the transport is cut). `why` is static text.
using ErrorSink = void (*)(void *owner, gs_status_t err, const char *why);

class ConnectionDriver {
 public:
  ConnectionDriver(Domain *domain, ErrorSink sink, void *owner) : domain_(domain), sink_(sink), owner_(owner) {}
  ~ConnectionDriver() { release(); }
  ConnectionDriver(const ConnectionDriver &) = delete;
  ConnectionDriver &operator=(const ConnectionDriver &) = delete;

  // Active side: registers the buffers, creates the endpoint, posts the first
  // receives and starts connecting (kConnecting). On failure nothing is held.
  gs_status_t connect(const sockaddr *addr, socklen_t len, const DriverConfig &config);
  // Passive side: the same for a request a listener took, whose record
  // decoded to `peer` (kAccepting until the transport says established).
  gs_status_t accept(ConnectionRequest *request, const ConnRecord &peer, const DriverConfig &config);

  // One progress pass; true if anything happened. quiet_fd: a wait fd the
  // caller has just polled and found not readable (-1: none); when it is this
  // endpoint's and the endpoint says that settles it
  // (Endpoint::quiet_unless_fd_readable), the transport is not polled.
  bool progress(int quiet_fd = -1);
  // Posts what the core has to post now; true if anything was posted.
  bool post_actions();

  // shutdown(2) on the connection: SHUT_RD, SHUT_WR or SHUT_RDWR.
  gs_status_t shutdown(int how);
  // Orderly close: SHUT_RDWR (flush, then DISCONNECT); close_finished() says
  // when the transport may go. A connection that never connected is finished.
  void begin_close(DriverClock::time_point deadline);
  bool close_finished();
  // Cuts the transport without the in-band DISCONNECT: the peer sees a reset.
  void abort();
  // Disconnects and deregisters; frees what the driver allocated.
  void release();

  // Zero-copy sends: the stream bytes [begin, begin + length) are written from
  // `base` (inside `region`) instead of the send ring. The owner commits them
  // to the core without copying, commits nothing after them until they are
  // acknowledged (core().send_acked()), and keeps `base` unchanged till then.
  void set_send_source(uint64_t begin, const uint8_t *base, uint64_t length, const MemoryRegion *region) {
    source_ = {begin, base, length, region};
  }
  void clear_send_source() { source_ = {}; }

  DriverState state() const { return state_; }
  gs_status_t error() const { return error_; }  // kFailed: a negated errno
  Stream &core() { return core_; }
  const Stream &core() const { return core_; }
  Endpoint *endpoint() const { return endpoint_.get(); }
  uint8_t *rbuf() const { return rbuf_; }
  uint8_t *sbuf() const { return sbuf_; }

 private:
  gs_status_t setup(ConnectionRequest *request, const DriverConfig &config);
  gs_status_t post_action(const Action &a);
  bool poll_cm();
  bool poll_completions();
  void on_cm_disconnect(gs_status_t status);
  void fail(gs_status_t err, const char *why);
  // A protocol violation the core found (EPROTO) ends this connection only,
  // at once: the peer is cut off and the owner told, once.
  void cut_off_violator();

  Domain *domain_;
  ErrorSink sink_;
  void *owner_;
  DriverState state_ = DriverState::kIdle;
  gs_status_t error_ = 0;
  bool established_ = false;   // the transport may carry writes
  bool violator_cut_ = false;  // cut_off_violator ran
  bool owns_rings_ = false;
  DriverClock::time_point close_deadline_{};
  DriverClock::time_point teardown_at_{};

  std::unique_ptr<Endpoint> endpoint_;
  Stream core_;
  uint8_t record_[kConnRecordSize] = {};
  uint8_t *rbuf_ = nullptr;
  uint8_t *sbuf_ = nullptr;
  uint8_t *meta_ = nullptr;  // target table + control staging
  uint32_t rbuf_bytes_ = 0, sbuf_bytes_ = 0;
  MemoryRegion rbuf_mr_{}, sbuf_mr_{}, meta_mr_{};
  uint32_t ctrl_stage_next_ = 0;
  struct SendSource {
    uint64_t begin = 0;
    const uint8_t *base = nullptr;
    uint64_t length = 0;
    const MemoryRegion *region = nullptr;
  } source_;
};

// A listener's next connection request whose record decodes (into *peer):
// 1, or 0 if none is pending, or < 0 on error. Requests whose record we cannot
// take are rejected on the way (§1.5), each reported to the sink.
int next_valid_request(Listener &listener, std::unique_ptr<ConnectionRequest> *request, ConnRecord *peer,
                       ErrorSink sink, void *owner);

// Refuses every request waiting in a listener whose backlog is full; returns
// how many. rdma_cm refuses a connection beyond the backlog (the client's
// connect fails with ECONNREFUSED) rather than leave it waiting for room.
int refuse_pending_requests(Listener &listener);

}  // namespace gpusock::wire
