#include "proxy/connection.h"

#include "wire/post_action.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace gpusock::proxy {

using namespace gpusock::wire;

namespace {

constexpr uint32_t kMetaSize = 4096;  // target table (2 x 16 B) + control staging (4 x 16 B)
constexpr uint32_t kPollBatch = 32;

}  // namespace

Connection::Connection(Domain *domain, const BufferSet &buffers) : domain_(domain), buffers_(buffers) {}

Connection::~Connection() {
  if (endpoint_) {
    endpoint_->disconnect();
    endpoint_.reset();
  }
  for (MemoryRegion *mr : {&sbuf_mr_, &rbuf_mr_, &meta_mr_})
    if (mr->handle) domain_->deregister_memory(mr);
  std::free(meta_);
}

int Connection::setup(ConnectionRequest *request) {
  meta_ = static_cast<uint8_t *>(std::aligned_alloc(4096, kMetaSize));
  if (!meta_) return -ENOMEM;
  std::memset(meta_, 0, kMetaSize);
  int rc = domain_->register_memory(buffers_.sbuf, buffers_.sbuf_size, kAccessLocal, &sbuf_mr_);
  if (rc == 0) rc = domain_->register_memory(buffers_.rbuf, buffers_.rbuf_size, kAccessRemoteWrite, &rbuf_mr_);
  if (rc == 0) rc = domain_->register_memory(meta_, kMetaSize, kAccessRemoteWrite, &meta_mr_);
  EndpointAttr attr;
  attr.send_depth = kDefaultSqSize;
  attr.recv_depth = kDefaultRqSize + kQpCtrlSize;
  attr.inline_size = kDefaultInline;
  if (rc == 0) rc = domain_->create_endpoint(request, attr, &endpoint_);
  if (rc < 0) return rc;

  LocalLayout layout;
  layout.rbuf_remote_addr = rbuf_mr_.remote_addr;
  layout.rbuf_rkey = rbuf_mr_.rkey;
  layout.table_remote_addr = meta_mr_.remote_addr;
  layout.table_rkey = meta_mr_.rkey;
  layout.table = reinterpret_cast<volatile TargetTableEntry *>(meta_);
  StreamConfig config;
  config.rbuf_size = buffers_.rbuf_size;
  config.sbuf_size = buffers_.sbuf_size;
  config.inline_size = std::min(kDefaultInline, endpoint_->max_inline());
  config.msg_send = !domain_->caps().write_with_imm;
  ConnRecord record;
  core_.init(config, layout, &record);
  encode_conn_record(record, record_);
  drain_actions();  // receives are posted before the peer may write
  return 0;
}

int Connection::connect(const sockaddr *addr, socklen_t len) {
  int rc = setup(nullptr);
  if (rc == 0) rc = endpoint_->connect(addr, len, record_, kConnRecordSize);
  if (rc < 0) return rc;
  role_ = ConnRole::kConnecting;
  return 0;
}

int Connection::accept(ConnectionRequest *request, const ConnRecord &peer) {
  int rc = setup(request);
  if (rc == 0) {
    core_.on_established(peer);
    rc = domain_->accept(endpoint_.get(), request, record_, kConnRecordSize);
  }
  if (rc < 0) return rc;
  role_ = ConnRole::kAccepting;
  return 0;
}

void Connection::transport_gone(int status) { core_.on_transport_closed(status); }

bool Connection::poll_cm() {
  if (!endpoint_) return false;
  CmEvent event;
  if (endpoint_->poll_cm(&event) <= 0) return false;
  switch (event.kind) {
    case CmEventKind::kEstablished:
      if (role_ == ConnRole::kConnecting) {
        ConnRecord peer;
        RecordError why;
        const int rc = decode_conn_record(event.peer_private_data, event.peer_private_len, &peer, &why);
        if (rc < 0) {
          error_ = rc;
          role_ = ConnRole::kFailed;
          return true;
        }
        core_.on_established(peer);
      }
      transport_established_ = true;
      role_ = ConnRole::kConnected;
      break;
    case CmEventKind::kRejected:
    case CmEventKind::kError:
      if (role_ == ConnRole::kConnecting || role_ == ConnRole::kAccepting) {
        error_ = event.status < 0 ? event.status : -ECONNREFUSED;
        role_ = ConnRole::kFailed;
      } else {
        poll_completions();
        transport_gone(event.status < 0 ? event.status : -ECONNRESET);
      }
      break;
    case CmEventKind::kDisconnected:
      if (role_ == ConnRole::kAccepting) {
        error_ = -ECONNRESET;
        role_ = ConnRole::kFailed;
        break;
      }
      // The in-band DISCONNECT may still sit in the completion queue: take it
      // first, so a graceful close is not mistaken for a reset.
      poll_completions();
      transport_gone(event.status < 0 ? event.status : -ECONNRESET);
      break;
    case CmEventKind::kNone:
      return false;
  }
  return true;
}

bool Connection::poll_completions() {
  if (!endpoint_) return false;
  Completion comps[kPollBatch];
  bool did = false;
  for (;;) {
    const int n = endpoint_->poll(comps, kPollBatch);
    if (n < 0) {
      transport_gone(n);
      return true;
    }
    if (n == 0) return did;
    did = true;
    for (int i = 0; i < n; ++i) {
      const Completion &c = comps[i];
      if (c.kind == CompletionKind::kWriteDone) {
        core_.on_write_done(c.token, c.status);
      } else if (c.status < 0) {
        transport_gone(c.status);
      } else if (core_.on_recv_imm(c.imm, c.length) < 0) {
        // A protocol violation ends this connection only: cut the peer off now.
        std::fprintf(stderr, "gpusock proxy: closing connection: %s\n", core_.error_reason());
        endpoint_->disconnect();
      }
    }
    if (n < static_cast<int>(kPollBatch)) return did;
  }
}

bool Connection::drain_actions() {
  if (!endpoint_) return false;
  bool did = false;
  Action a;
  while (core_.peek_action(&a)) {
    if (a.kind != ActionKind::kPostRecv && !transport_established_) break;
    const ConnectionMemory memory{static_cast<uint8_t *>(buffers_.sbuf), &sbuf_mr_, meta_, &meta_mr_};
    const int rc = post_action(*endpoint_, a, memory, ctrl_stage_next_);
    if (rc == -EAGAIN) break;  // the transport's queue is full: retry on the next pass
    if (rc < 0) {
      transport_gone(rc);
      return true;
    }
    core_.commit_action(a);
    did = true;
  }
  return did;
}

bool Connection::progress() {
  switch (role_) {
    case ConnRole::kConnecting:
    case ConnRole::kAccepting: {
      bool did = poll_cm();
      if (role_ == ConnRole::kConnected) did |= drain_actions();
      return did;
    }
    case ConnRole::kConnected: {
      bool did = poll_completions();
      did |= poll_cm();
      did |= drain_actions();
      return did;
    }
    default:
      return false;
  }
}

void Connection::apply_gpu_positions(uint64_t send_tail, uint64_t recv_read) {
  if (role_ != ConnRole::kConnected && role_ != ConnRole::kConnecting && role_ != ConnRole::kAccepting) return;
  if (send_tail > send_committed_) {
    // The GPU wrote only into space we published as free, so this always fits.
    core_.send_commit(static_cast<uint32_t>(send_tail - send_committed_));
    send_committed_ = send_tail;
  }
  if (recv_read > recv_reported_) {
    // After SHUT_RD or our DISCONNECT the core drops arriving bytes itself;
    // never consume more than it holds.
    const uint64_t n = std::min<uint64_t>(recv_read - recv_reported_, core_.recv_available());
    core_.recv_consume(static_cast<uint32_t>(n));
    recv_reported_ = recv_read;
  }
  if (role_ == ConnRole::kConnected) drain_actions();
}

int Connection::shutdown(int how) {
  if (role_ != ConnRole::kConnected) return -ENOTCONN;
  uint8_t bits;
  switch (how) {
    case SHUT_RD: bits = kShutRd; break;
    case SHUT_WR: bits = kShutWr; break;
    case SHUT_RDWR: bits = kShutRdWr; break;
    default: return -EINVAL;
  }
  core_.shutdown(bits);
  drain_actions();
  return 0;
}

void Connection::begin_close(Clock::time_point deadline) {
  closing_ = true;
  close_deadline_ = deadline;
  if (role_ == ConnRole::kConnected) {
    core_.shutdown(kShutRdWr);
    drain_actions();
  }
}

void Connection::abort() {
  closing_ = true;
  aborted_ = true;
  if (endpoint_) {
    endpoint_->disconnect();
    endpoint_.reset();
  }
}

bool Connection::close_finished() {
  if (aborted_ || role_ != ConnRole::kConnected) return true;
  progress();
  return core_.ready_for_teardown() || Clock::now() >= close_deadline_;
}

ConnSnapshot Connection::snapshot() const {
  ConnSnapshot s;
  switch (role_) {
    case ConnRole::kFailed:
      s.state = channel::kStFailed;
      s.error = error_ < 0 ? error_ : -ECONNREFUSED;
      return s;
    case ConnRole::kConnected:
      break;
    default:
      return s;
  }
  s.recv_write = recv_reported_ + core_.recv_available();
  s.send_done = send_committed_ - core_.send_unacked();
  s.state = channel::kStConnected;
  if (core_.recv_closed()) s.state |= channel::kStRecvClosed;
  if (core_.state() == StreamState::kDisconnected) s.state |= channel::kStHangup;
  if (core_.state() == StreamState::kError) {
    s.state |= channel::kStError;
    s.error = core_.error() < 0 ? core_.error() : -ECONNRESET;
  }
  const int send_status = core_.send_status();
  if (send_status < 0) s.send_error = send_status;
  return s;
}

}  // namespace gpusock::proxy
