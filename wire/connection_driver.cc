#include "wire/connection_driver.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

namespace gpusock::wire {

namespace {

constexpr uint32_t kPollBatch = 32;
// How long a connection whose peer closed first keeps its transport for the
// peer to tear its side down (close_finished), and how long it keeps reading
// after its own DISCONNECT completed.
constexpr std::chrono::milliseconds kPeerTeardownWait{1000};
constexpr std::chrono::milliseconds kTeardownLinger{50};

size_t page_rounded(size_t size) { return (size + 4095) & ~size_t(4095); }

// Registered blocks (the rings, the meta block) come from the kernel:
// page-aligned, as rsocket's, so registrations never share a page (fork
// safety), and zero and untouched, so a short connection given large rings
// pays only for the pages it uses, not for zeroing megabytes at connect and
// accept (transports that pin, such as verbs, touch them anyway).
uint8_t *map_block(size_t size) {
  void *p = mmap(nullptr, page_rounded(size), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<uint8_t *>(p);
}

void unmap_block(uint8_t *block, size_t size) {
  if (block) munmap(block, page_rounded(size));
}

// How the application hears of a transport failing an established
// connection: libfabric's tcp provider reports what fails on a reset socket
// (a post, a completion) as FI_ENOTCONN, but to the application the
// connection was reset, not never connected. (Before it was established, ENOTCONN stays.)
gs_status_t lost_status(gs_status_t status, bool established) {
  return established && status == -ENOTCONN ? -ECONNRESET : status;
}

// The credits a connection grants: its configured rq_size, less where the
// endpoint cannot hold that many inbound messages beside the control
// messages the peer may also have in flight (a peer write into a full shm
// command queue gets EAGAIN and is retried: busy work at every count).
uint16_t credits_that_fit(uint16_t rq_size, uint32_t inbound_capacity) {
  if (inbound_capacity >= uint32_t{rq_size} + kQpCtrlSize) return rq_size;
  return static_cast<uint16_t>(std::max<uint32_t>(inbound_capacity, kQpMinSize + kQpCtrlSize) - kQpCtrlSize);
}

}  // namespace

gs_status_t ConnectionDriver::setup(ConnectionRequest *request, const DriverConfig &config) {
  release();
  const uint32_t rbuf_size = receive_ring_size(config.rbuf_size);
  const uint32_t sbuf_size = std::max<uint32_t>(config.sbuf_size, 4096);
  owns_rings_ = config.rbuf == nullptr || config.sbuf == nullptr;
  rbuf_bytes_ = rbuf_size;
  sbuf_bytes_ = sbuf_size;
  rbuf_ = owns_rings_ ? map_block(rbuf_size) : static_cast<uint8_t *>(config.rbuf);
  sbuf_ = owns_rings_ ? map_block(sbuf_size) : static_cast<uint8_t *>(config.sbuf);
  meta_ = map_block(kMetaBlockSize);
  gs_status_t rc = rbuf_ && sbuf_ && meta_ ? 0 : -ENOMEM;
  if (rc == 0) rc = domain_->register_memory(sbuf_, sbuf_size, kAccessLocal, &sbuf_mr_);
  if (rc == 0) rc = domain_->register_memory(rbuf_, rbuf_size, kAccessRemoteWrite, &rbuf_mr_);
  if (rc == 0) rc = domain_->register_memory(meta_, kMetaBlockSize, kAccessRemoteWrite, &meta_mr_);
  EndpointAttr attr;
  attr.send_depth = std::clamp<uint32_t>(config.sq_size, kQpMinSize, kMaxSendQueue);
  attr.recv_depth = std::max<uint32_t>(config.rq_size, kQpMinSize) + kQpCtrlSize;
  attr.inline_size = config.inline_size;
  if (rc == 0) rc = domain_->create_endpoint(request, attr, &endpoint_);
  if (rc < 0) {
    release();
    return rc;
  }

  LocalLayout layout;
  layout.rbuf_remote_addr = rbuf_mr_.remote_addr;
  layout.rbuf_rkey = rbuf_mr_.rkey;
  layout.table_remote_addr = meta_mr_.remote_addr;
  layout.table_rkey = meta_mr_.rkey;
  layout.table = reinterpret_cast<volatile TargetTableEntry *>(meta_);
  StreamConfig stream;
  stream.rbuf_size = rbuf_size;
  stream.sbuf_size = sbuf_size;
  stream.sq_size = config.sq_size;
  stream.rq_size = credits_that_fit(config.rq_size, endpoint_->inbound_capacity());
  stream.inline_size = std::min(config.inline_size, endpoint_->max_inline());
  stream.msg_send = !domain_->caps().write_with_imm;  // iWARP: write + 4-byte send (§2.11)
  stream.posts_receives = domain_->caps().needs_recv_posts;
  ConnRecord record;
  core_ = Stream{};
  core_.init(stream, layout, &record);
  encode_conn_record(record, record_);
  post_actions();  // receives are posted before the peer may write (§1.4, §1.5)
  return 0;
}

gs_status_t ConnectionDriver::connect(const sockaddr *addr, socklen_t len, const DriverConfig &config) {
  gs_status_t rc = setup(nullptr, config);
  if (rc == 0) rc = endpoint_->connect(addr, len, record_, kConnRecordSize);
  if (rc < 0) {
    release();
    return rc;
  }
  error_ = 0;
  state_ = DriverState::kConnecting;
  return 0;
}

gs_status_t ConnectionDriver::accept(ConnectionRequest *request, const ConnRecord &peer, const DriverConfig &config) {
  gs_status_t rc = setup(request, config);
  if (rc == 0) {
    core_.on_established(peer);
    rc = domain_->accept(endpoint_.get(), request, record_, kConnRecordSize);
  }
  if (rc < 0) {
    release();
    return rc;
  }
  error_ = 0;
  state_ = DriverState::kAccepting;
  return 0;
}

void ConnectionDriver::release() {
  if (endpoint_) {
    endpoint_->disconnect();
    endpoint_.reset();
  }
  for (MemoryRegion *mr : {&sbuf_mr_, &rbuf_mr_, &meta_mr_}) {
    if (mr->handle) domain_->deregister_memory(mr);
    *mr = MemoryRegion{};
  }
  if (owns_rings_) {
    unmap_block(rbuf_, rbuf_bytes_);
    unmap_block(sbuf_, sbuf_bytes_);
  }
  unmap_block(meta_, kMetaBlockSize);
  rbuf_ = sbuf_ = meta_ = nullptr;
  owns_rings_ = false;
  established_ = false;
  violator_cut_ = false;
  ctrl_stage_next_ = 0;
  teardown_at_ = {};
}

void ConnectionDriver::fail(gs_status_t err, const char *why) {
  error_ = err;
  state_ = DriverState::kFailed;
  release();
  if (sink_) sink_(owner_, err, why);
}

void ConnectionDriver::abort() {
  if (state_ == DriverState::kIdle) return;
  error_ = -ECONNRESET;
  state_ = DriverState::kFailed;
  release();
}

// ---------------------------------------------------------------- progress

bool ConnectionDriver::progress(int quiet_fd) {
  switch (state_) {
    case DriverState::kConnecting:
    case DriverState::kAccepting: {
      bool did = endpoint_->maybe_ready() && poll_cm();
      if (state_ == DriverState::kConnected) did |= post_actions();
      return did;
    }
    case DriverState::kConnected: {
      // maybe_ready: a few loads, so hundreds of idle connections cost a
      // pass (the proxy's) next to nothing.
      bool did = false;
      const bool fd_quiet = quiet_fd >= 0 && endpoint_->wait_fd() == quiet_fd && endpoint_->quiet_unless_fd_readable();
      if (!fd_quiet && endpoint_->maybe_ready()) {
        did = poll_completions();
        did |= poll_cm();
      }
      did |= post_actions();
      return did;
    }
    default:
      return false;
  }
}

bool ConnectionDriver::poll_cm() {
  if (!endpoint_) return false;
  CmEvent event;
  if (endpoint_->poll_cm(&event) <= 0) return false;
  const bool handshaking = state_ == DriverState::kConnecting || state_ == DriverState::kAccepting;
  switch (event.kind) {
    case CmEventKind::kEstablished:
      if (state_ == DriverState::kConnecting) {
        ConnRecord peer;
        RecordError why;
        const int rc = decode_conn_record(event.peer_private_data, event.peer_private_len, &peer, &why);
        if (rc < 0) {
          fail(rc, record_error_text(why));
          return true;
        }
        core_.on_established(peer);
      }
      established_ = true;
      state_ = DriverState::kConnected;
      break;
    case CmEventKind::kRejected:
    case CmEventKind::kError:
      if (handshaking)
        fail(event.status < 0 ? event.status : -ECONNREFUSED, event.reason ? event.reason : "connect failed");
      else on_cm_disconnect(event.status < 0 ? event.status : -ECONNRESET);
      break;
    case CmEventKind::kDisconnected:
      if (handshaking) fail(-ECONNRESET, "the peer went away during the handshake");
      else on_cm_disconnect(event.status < 0 ? event.status : -ECONNRESET);
      break;
    case CmEventKind::kNone:
      return false;
  }
  return true;
}

void ConnectionDriver::on_cm_disconnect(gs_status_t status) {
  // The in-band DISCONNECT may still sit in the completion queue: take it first,
  // so a graceful close is not mistaken for a reset (§3.1, §9.9).
  poll_completions();
  core_.on_transport_closed(status);
}

bool ConnectionDriver::poll_completions() {
  if (!endpoint_) return false;
  Completion comps[kPollBatch];
  bool did = false;
  for (;;) {
    const int n = endpoint_->poll(comps, kPollBatch);
    if (n < 0) {
      core_.on_transport_closed(lost_status(n, established_));
      return true;
    }
    if (n == 0) return did;
    did = true;
    for (int i = 0; i < n; ++i) {
      const Completion &c = comps[i];
      if (c.kind == CompletionKind::kWriteDone) {
        core_.on_write_done(c.token, lost_status(c.status, established_));
      } else if (c.status < 0) {
        core_.on_transport_closed(lost_status(c.status, established_));
      } else if (core_.on_recv_imm(c.imm, c.length) < 0) {
        cut_off_violator();
      }
    }
    if (n < static_cast<int>(kPollBatch)) return did;
  }
}

// Posts one Action: receives, a data write from the send ring (or the
// zero-copy source), or a control
// record copied into the next staging slot. At most kQpCtrlSize control writes
// are outstanding, so slots used round-robin are never overwritten in flight.
gs_status_t ConnectionDriver::post_action(const Action &a) {
  if (a.kind == ActionKind::kPostRecv) return endpoint_->post_recv(a.count);
  WriteRequest w;
  w.length = a.length;
  w.remote_addr = a.remote_addr;
  w.rkey = a.rkey;
  w.imm = a.imm;
  w.has_imm = a.has_imm;
  w.token = a.token;
  w.inline_data = a.inline_ok;
  w.closes = a.closes;
  const bool data = a.write_kind == WriteKind::kData;
  // A zero-copy source starts after everything the ring held was posted and
  // ends before anything the ring holds next, so a write is all one or the other.
  const uint64_t in_source = core_.send_posted() - source_.begin;
  if (data && in_source < source_.length) {
    w.local = source_.base + in_source;
    w.region = source_.region;
  } else if (data) {
    w.local = sbuf_ + a.sbuf_offset;
    w.region = &sbuf_mr_;
  } else {
    uint8_t *stage = meta_ + kMetaTableBytes + (ctrl_stage_next_ % kQpCtrlSize) * kSglRecordSize;
    std::memcpy(stage, a.record, sizeof a.record);
    w.local = stage;
    w.region = &meta_mr_;
  }
  const gs_status_t rc = endpoint_->post_write(w);
  if (rc == 0 && !data) ++ctrl_stage_next_;
  return rc;
}

void ConnectionDriver::cut_off_violator() {
  if (violator_cut_ || !endpoint_) return;
  violator_cut_ = true;
  if (sink_) sink_(owner_, core_.error(), core_.error_reason());
  endpoint_->disconnect();
}

bool ConnectionDriver::post_actions() {
  if (!endpoint_) return false;
  bool did = false;
  Action a;
  while (core_.peek_action(&a)) {
    if (a.kind != ActionKind::kPostRecv && !established_) break;
    const gs_status_t rc = post_action(a);
    if (rc == -EAGAIN) break;  // the transport's queue is full: retry on the next pass
    if (rc < 0) {
      core_.on_transport_closed(lost_status(rc, established_));
      return true;
    }
    core_.commit_action(a);
    did = true;
  }
  // Building a write can find a violation too (an advert outside the peer's ring).
  if (core_.state() == StreamState::kError && core_.error() == -EPROTO) cut_off_violator();
  return did;
}

// ---------------------------------------------------------------- close

gs_status_t ConnectionDriver::shutdown(int how) {
  uint8_t bits;
  switch (how) {
    case SHUT_RD:
      bits = kShutRd;
      break;
    case SHUT_WR:
      bits = kShutWr;
      break;
    case SHUT_RDWR:
      bits = kShutRdWr;
      break;
    default:
      return -EINVAL;
  }
  if (state_ != DriverState::kConnected) return -ENOTCONN;
  core_.shutdown(bits);
  post_actions();
  return 0;
}

void ConnectionDriver::begin_close(DriverClock::time_point deadline) {
  close_deadline_ = deadline;
  if (state_ == DriverState::kConnected) {
    core_.shutdown(kShutRdWr);
    post_actions();
  }
}

bool ConnectionDriver::close_finished() {
  if (state_ != DriverState::kConnected || !endpoint_) return true;
  progress();
  const auto now = DriverClock::now();
  if (now >= close_deadline_ || core_.state() == StreamState::kError) return true;
  if (!core_.ready_for_teardown()) return false;
  // Our DISCONNECT is through. Keep reading for a moment before tearing the
  // transport down: the peer may still have credit updates in flight, and a
  // kernel TCP socket closed with unread data resets the connection, which can
  // discard the tail of what we sent (fabric:tcp).
  // When the peer closed first it waits, in its close, for its own DISCONNECT
  // to complete, and that needs our side's transport-level acknowledgement:
  // Soft-RoCE hands us the DISCONNECT before it sends that ACK, so destroying
  // the QP at once can hang the peer (interop K6). The peer tears its side down
  // once its close is done, which reaches us as the transport's disconnect:
  // wait for that, bounded.
  const bool wait_for_peer = core_.peer_closed_first() && !core_.transport_closed();
  if (teardown_at_ == DriverClock::time_point{})
    teardown_at_ = now + (wait_for_peer ? kPeerTeardownWait : kTeardownLinger);
  if (core_.peer_closed_first() && core_.transport_closed()) return true;
  return now >= teardown_at_;
}

// ---------------------------------------------------------------- listeners

int next_valid_request(Listener &listener, std::unique_ptr<ConnectionRequest> *request, ConnRecord *peer,
                       ErrorSink sink, void *owner) {
  for (;;) {
    const int got = listener.get_request(request);
    if (got <= 0) return got;
    RecordError why;
    const int rc = decode_conn_record((*request)->private_data(), (*request)->private_len(), peer, &why);
    if (rc == 0) return 1;
    if (sink) sink(owner, rc, record_error_text(why));
    (*request)->reject();  // §1.5 step 3: a bad record is rejected with no data
    request->reset();
  }
}

int refuse_pending_requests(Listener &listener) {
  int refused = 0;
  std::unique_ptr<ConnectionRequest> request;
  while (listener.get_request(&request) > 0) {
    request->reject();
    request.reset();
    ++refused;
  }
  return refused;
}

}  // namespace gpusock::wire
