#include "wire/socket/stream_socket.h"

#include "wire/post_action.h"
#include "wire/socket/engine.h"

#include <gpusock/socket.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace gpusock::socket {

using namespace gpusock::wire;

namespace {

thread_local char t_last_error[256] = "";

constexpr uint32_t kMetaSize = 4096;  // target table (32 B) + control staging (4 × 16 B)
constexpr uint32_t kPollBatch = 32;
// How long a socket whose peer closed first keeps its transport for the peer
// to tear its side down (see close_finished).
constexpr std::chrono::milliseconds kPeerTeardownWait{1000};

uint8_t *alloc_buffer(size_t size) {
  // Page-aligned, as rsocket does, so registrations never share a page (fork safety).
  const size_t rounded = (size + 4095) & ~size_t(4095);
  void *p = std::aligned_alloc(4096, rounded);
  if (p) std::memset(p, 0, rounded);
  return static_cast<uint8_t *>(p);
}

size_t iov_total(const iovec *iov, int iovcnt) {
  size_t total = 0;
  for (int i = 0; i < iovcnt; ++i) total += iov[i].iov_len;
  return total;
}

// Copies between a run of bytes and an iovec array starting `skip` bytes in.
// to_iov: ring → iov (receive); else iov → ring (send).
void copy_iov(const iovec *iov, int iovcnt, size_t skip, uint8_t *ring, size_t n, bool to_iov) {
  for (int i = 0; i < iovcnt && n > 0; ++i) {
    if (skip >= iov[i].iov_len) {
      skip -= iov[i].iov_len;
      continue;
    }
    const size_t take = std::min(n, iov[i].iov_len - skip);
    uint8_t *user = static_cast<uint8_t *>(iov[i].iov_base) + skip;
    if (to_iov) std::memcpy(user, ring, take);
    else std::memcpy(ring, user, take);
    ring += take;
    n -= take;
    skip = 0;
  }
}

int system_keepalive_seconds() {
  int value = 7200;
  if (FILE *f = std::fopen("/proc/sys/net/ipv4/tcp_keepalive_time", "r")) {
    if (std::fscanf(f, "%d", &value) != 1 || value <= 0) value = 7200;
    std::fclose(f);
  }
  return value;
}

}  // namespace

void set_last_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(t_last_error, sizeof t_last_error, fmt, ap);
  va_end(ap);
}

const char *last_error() { return t_last_error; }

StreamSocket::StreamSocket(Domain *domain, int family) : domain_(domain), family_(family) {
  options_ = Engine::get().default_options();
}

StreamSocket::~StreamSocket() {
  for (auto &child : accepting_) child.reset();
  accept_queue_.clear();
  listener_.reset();
  release_connection();
}

void StreamSocket::release_connection() {
  if (endpoint_) {
    endpoint_->disconnect();
    endpoint_.reset();
  }
  for (MemoryRegion *mr : {&sbuf_mr_, &rbuf_mr_, &meta_mr_}) {
    if (mr->handle) domain_->deregister_memory(mr);
    *mr = MemoryRegion{};
  }
  std::free(sbuf_);
  std::free(rbuf_);
  std::free(meta_);
  sbuf_ = rbuf_ = meta_ = nullptr;
  transport_established_ = false;
}

int StreamSocket::fail_locked(int err, const char *why) {
  so_error_ = -err;
  note_error_locked(err, why);
  return err;
}

// Kept with the socket, because the thread that sees an error (the one calling
// recv) is often not the one that found it (the background thread).
void StreamSocket::note_error_locked(int err, const char *why) {
  char text[256];
  std::snprintf(text, sizeof text, "gpusock: %s (%s)", why, gs_status_name(err));
  error_text_ = text;
  set_last_error("%s", text);
}

std::string StreamSocket::error_text() {
  std::lock_guard lock(mu_);
  if (error_text_.empty() && role_ == Role::kConnected && core_.state() == StreamState::kError)
    note_error_locked(core_.error(), core_.error_reason() ? core_.error_reason() : "connection failed");
  return error_text_;
}

// ---------------------------------------------------------------- set-up

int StreamSocket::bind(const sockaddr *addr, socklen_t len) {
  std::lock_guard lock(mu_);
  if (role_ != Role::kNew) return -EINVAL;
  if (!addr || len < sizeof(sa_family_t) || len > sizeof(sockaddr_storage)) return -EINVAL;
  if (addr->sa_family != family_) return -EAFNOSUPPORT;
  if ((family_ == AF_INET && len < sizeof(sockaddr_in)) || (family_ == AF_INET6 && len < sizeof(sockaddr_in6)))
    return -EINVAL;
  std::memcpy(&local_addr_, addr, len);
  local_len_ = len;
  role_ = Role::kBound;
  return 0;
}

int StreamSocket::listen(int backlog) {
  std::lock_guard lock(mu_);
  backlog_ = std::clamp(backlog <= 0 ? 1 : backlog, 1, 4096);
  if (role_ == Role::kListening) return 0;
  if (role_ != Role::kNew && role_ != Role::kBound) return -EINVAL;
  if (role_ == Role::kNew) {  // like TCP: listen on an unbound socket picks any address, any port
    std::memset(&local_addr_, 0, sizeof local_addr_);
    local_addr_.ss_family = static_cast<sa_family_t>(family_);
    local_len_ = family_ == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  }
  int rc = domain_->listen(reinterpret_cast<sockaddr *>(&local_addr_), local_len_, backlog_, &listener_);
  if (rc < 0) {
    const std::string detail = domain_->last_error_detail();
    return fail_locked(rc, detail.empty() ? "listen failed" : detail.c_str());
  }
  listener_->local_address(&local_addr_, &local_len_);
  role_ = Role::kListening;
  return 0;
}

int StreamSocket::setup_connection(ConnectionRequest *request) {
  options_.rbuf_size = std::max<uint32_t>(options_.rbuf_size & ~1u, 4096);
  options_.sbuf_size = std::max<uint32_t>(options_.sbuf_size, 4096);
  sbuf_ = alloc_buffer(options_.sbuf_size);
  rbuf_ = alloc_buffer(options_.rbuf_size);
  meta_ = alloc_buffer(kMetaSize);
  if (!sbuf_ || !rbuf_ || !meta_) return -ENOMEM;
  int rc = domain_->register_memory(sbuf_, options_.sbuf_size, kAccessLocal, &sbuf_mr_);
  if (rc == 0) rc = domain_->register_memory(rbuf_, options_.rbuf_size, kAccessRemoteWrite, &rbuf_mr_);
  if (rc == 0) rc = domain_->register_memory(meta_, kMetaSize, kAccessRemoteWrite, &meta_mr_);
  EndpointAttr attr;
  attr.send_depth = std::clamp<uint32_t>(options_.sq_size, kQpMinSize, kMaxSendQueue);
  attr.recv_depth = std::max<uint32_t>(options_.rq_size, kQpMinSize) + kQpCtrlSize;
  attr.inline_size = options_.inline_size;
  if (rc == 0) rc = domain_->create_endpoint(request, attr, &endpoint_);
  if (rc < 0) return rc;

  LocalLayout layout;
  layout.rbuf_remote_addr = rbuf_mr_.remote_addr;
  layout.rbuf_rkey = rbuf_mr_.rkey;
  layout.table_remote_addr = meta_mr_.remote_addr;
  layout.table_rkey = meta_mr_.rkey;
  layout.table = reinterpret_cast<volatile TargetTableEntry *>(meta_);
  StreamConfig config;
  config.rbuf_size = options_.rbuf_size;
  config.sbuf_size = options_.sbuf_size;
  config.sq_size = options_.sq_size;
  config.rq_size = options_.rq_size;
  config.inline_size = std::min(options_.inline_size, endpoint_->max_inline());
  config.msg_send = !domain_->caps().write_with_imm;  // iWARP: write + 4-byte send
  ConnRecord record;
  core_.init(config, layout, &record);
  encode_conn_record(record, record_bytes_);
  drain_actions_locked();  // receives are posted before the peer may write (§1.4, §1.5)
  return 0;
}

int StreamSocket::connect(const sockaddr *addr, socklen_t len) {
  std::unique_lock lock(mu_);
  switch (role_) {
    case Role::kConnecting:
      return nonblocking_ ? -EALREADY : wait_connected_locked(lock);
    case Role::kConnected:
      return -EISCONN;
    case Role::kListening:
    case Role::kClosed:
    case Role::kAccepting:
      return -EINVAL;
    default:
      break;
  }
  if (!addr || len > sizeof(sockaddr_storage)) return -EINVAL;
  if (addr->sa_family != family_) return -EAFNOSUPPORT;
  std::memcpy(&peer_addr_, addr, len);
  peer_len_ = len;
  int rc = setup_connection(nullptr);
  if (rc == 0) rc = endpoint_->connect(addr, len, record_bytes_, kConnRecordSize);
  if (rc < 0) {
    release_connection();
    if (rc == -ECONNREFUSED) return rc;
    char host[INET6_ADDRSTRLEN] = "?";
    const void *ip = family_ == AF_INET6 ? static_cast<const void *>(&reinterpret_cast<const sockaddr_in6 *>(addr)->sin6_addr)
                                         : static_cast<const void *>(&reinterpret_cast<const sockaddr_in *>(addr)->sin_addr);
    inet_ntop(family_, ip, host, sizeof host);
    char why[160];
    std::snprintf(why, sizeof why, "connect to %s failed%s", host,
                  rc == -ENODEV ? ": no RDMA device serves that address (loopback never does)" : "");
    return fail_locked(rc, why);
  }
  role_ = Role::kConnecting;
  if (nonblocking_) return -EINPROGRESS;
  return wait_connected_locked(lock);
}

int StreamSocket::wait_connected_locked(std::unique_lock<std::mutex> &lock) {
  int rc = wait_locked(lock, [&] { return role_ != Role::kConnecting; }, -1);
  if (rc < 0) return rc;
  if (role_ == Role::kConnected) return 0;
  const int err = so_error_;
  so_error_ = 0;
  return err ? -err : -ECONNREFUSED;
}

int StreamSocket::accept(std::unique_ptr<StreamSocket> *out, bool wait) {
  std::unique_lock lock(mu_);
  if (role_ != Role::kListening) return -EINVAL;
  if (accept_queue_.empty()) {
    if (!wait) {
      progress_locked();
      if (accept_queue_.empty()) return -EAGAIN;
    } else {
      int rc = wait_locked(lock, [&] { return !accept_queue_.empty() || role_ != Role::kListening; }, -1);
      if (rc < 0) return rc;
      if (role_ != Role::kListening) return -EINVAL;
    }
  }
  *out = std::move(accept_queue_.front());
  accept_queue_.pop_front();
  return 0;
}

// Advances handshakes in flight and takes new requests while under the backlog.
bool StreamSocket::accept_requests_locked() {
  bool did = false;
  for (size_t i = 0; i < accepting_.size();) {
    StreamSocket &child = *accepting_[i];
    child.progress();
    if (child.role_ == Role::kAccepting) {
      ++i;
      continue;
    }
    did = true;
    if (child.role_ == Role::kConnected) accept_queue_.push_back(std::move(accepting_[i]));
    accepting_.erase(accepting_.begin() + static_cast<long>(i));
  }
  while (accepting_.size() + accept_queue_.size() < static_cast<size_t>(backlog_)) {
    std::unique_ptr<ConnectionRequest> request;
    if (listener_->get_request(&request) <= 0) break;
    did = true;
    ConnRecord peer;
    RecordError why;
    if (decode_conn_record(request->private_data(), request->private_len(), &peer, &why) < 0) {
      Engine::get().log(1, "rejecting connection: %s", record_error_text(why));
      request->reject();  // §1.5: version ≠ 1 is rejected with no data
      continue;
    }
    auto child = std::make_unique<StreamSocket>(domain_, family_);
    child->options_ = options_;  // accepted sockets inherit the listener's options (§1.5)
    std::lock_guard child_lock(child->mu_);
    child->local_addr_ = local_addr_;
    child->local_len_ = local_len_;
    int rc = child->setup_connection(request.get());
    if (rc == 0) {
      child->core_.on_established(peer);
      rc = domain_->accept(child->endpoint_.get(), request.get(), child->record_bytes_, kConnRecordSize);
    }
    if (rc < 0) {
      Engine::get().log(1, "accept failed: %s", gs_status_name(rc));
      request->reject();
      continue;
    }
    child->role_ = Role::kAccepting;
    accepting_.push_back(std::move(child));
  }
  return did;
}

// ---------------------------------------------------------------- progress

bool StreamSocket::poll_cm_locked() {
  if (!endpoint_) return false;
  CmEvent event;
  if (endpoint_->poll_cm(&event) <= 0) return false;
  switch (event.kind) {
    case CmEventKind::kEstablished: {
      if (role_ == Role::kConnecting) {
        ConnRecord peer;
        RecordError why;
        int rc = decode_conn_record(event.peer_private_data, event.peer_private_len, &peer, &why);
        if (rc < 0) {
          fail_locked(rc, record_error_text(why));
          release_connection();
          role_ = Role::kNew;
          return true;
        }
        core_.on_established(peer);
      }
      transport_established_ = true;
      role_ = Role::kConnected;
      endpoint_->local_address(&local_addr_, &local_len_);
      endpoint_->peer_address(&peer_addr_, &peer_len_);
      break;
    }
    case CmEventKind::kRejected:
    case CmEventKind::kError:
      if (role_ == Role::kConnecting || role_ == Role::kAccepting) {
        so_error_ = event.status < 0 ? -event.status : ECONNREFUSED;
        note_error_locked(-so_error_, event.reason ? event.reason : "connect failed");
        release_connection();
        role_ = role_ == Role::kConnecting ? Role::kNew : Role::kClosed;
      } else {
        handle_cm_disconnect_locked(event.status < 0 ? event.status : -ECONNRESET);
      }
      break;
    case CmEventKind::kDisconnected:
      handle_cm_disconnect_locked(event.status < 0 ? event.status : -ECONNRESET);
      break;
    case CmEventKind::kNone:
      return false;
  }
  return true;
}

void StreamSocket::handle_cm_disconnect_locked(int status) {
  // The in-band DISCONNECT may still sit in the completion queue: take it first,
  // so a graceful close is not mistaken for a reset (§3.1, checklist 9).
  poll_completions_locked();
  if (role_ == Role::kAccepting) {
    release_connection();
    role_ = Role::kClosed;
    return;
  }
  core_.on_transport_closed(status);
}

bool StreamSocket::poll_completions_locked() {
  if (!endpoint_) return false;
  Completion comps[kPollBatch];
  bool did = false;
  for (;;) {
    const int n = endpoint_->poll(comps, kPollBatch);
    if (n < 0) {
      core_.on_transport_closed(n);
      return true;
    }
    if (n == 0) return did;
    did = true;
    for (int i = 0; i < n; ++i) {
      const Completion &c = comps[i];
      if (c.kind == CompletionKind::kWriteDone) {
        core_.on_write_done(c.token, c.status);
      } else if (c.status < 0) {
        core_.on_transport_closed(c.status);
      } else if (core_.on_recv_imm(c.imm, c.length) < 0) {
        // A protocol violation ends this connection only: cut the peer off now.
        Engine::get().log(1, "closing connection: %s", core_.error_reason());
        note_error_locked(core_.error(), core_.error_reason());
        endpoint_->disconnect();
      }
    }
    if (n < static_cast<int>(kPollBatch)) return did;
  }
}

bool StreamSocket::drain_actions_locked() {
  if (!endpoint_) return false;
  bool did = false;
  Action a;
  while (core_.peek_action(&a)) {
    if (a.kind != ActionKind::kPostRecv && !transport_established_) break;
    const int rc = post_action(*endpoint_, a, {sbuf_, &sbuf_mr_, meta_, &meta_mr_}, ctrl_stage_next_);
    if (rc == -EAGAIN) break;  // the transport's queue is full: retry on the next pass
    if (rc < 0) {
      core_.on_transport_closed(rc);
      return true;
    }
    core_.commit_action(a);
    did = true;
  }
  return did;
}

void StreamSocket::keepalive_tick_locked() {
  if (!options_.keepalive || role_ != Role::kConnected) return;
  const auto now = Clock::now();
  if (now < next_keepalive_) return;
  if (next_keepalive_ != Clock::time_point{}) core_.request_keepalive();
  const int idle = options_.keepidle_s > 0 ? options_.keepidle_s : system_keepalive_seconds();
  next_keepalive_ = now + std::chrono::seconds(idle);
}

bool StreamSocket::progress_locked() {
  switch (role_) {
    case Role::kListening:
      return accept_requests_locked();
    case Role::kConnecting:
    case Role::kAccepting: {
      bool did = poll_cm_locked();
      if (role_ == Role::kConnected) did |= drain_actions_locked();
      return did;
    }
    case Role::kConnected: {
      bool did = poll_completions_locked();
      did |= poll_cm_locked();
      did |= drain_actions_locked();
      keepalive_tick_locked();
      return did;
    }
    default:
      return false;
  }
}

bool StreamSocket::progress() {
  std::lock_guard lock(mu_);
  return progress_locked();
}

bool StreamSocket::try_progress() {
  std::unique_lock lock(mu_, std::try_to_lock);
  return lock.owns_lock() && progress_locked();
}

template <class Pred>
int StreamSocket::wait_locked(std::unique_lock<std::mutex> &lock, Pred ready, int timeout_ms) {
  const Engine &engine = Engine::get();
  const auto start = Clock::now();
  const auto spin_until = start + std::chrono::microseconds(engine.busy_poll_us());
  long sleep_us = 10;
  for (unsigned step = 0;; ++step) {
    progress_locked();
    if (ready()) return 0;
    const auto now = Clock::now();
    if (timeout_ms >= 0 && now - start >= std::chrono::milliseconds(timeout_ms)) return -EAGAIN;
    lock.unlock();
    if (now < spin_until) {
      spin_pause(step);
    } else {
      // A signal interrupts a blocking socket call, as the kernel's would.
      timespec ts{0, sleep_us * 1000};
      const int slept = nanosleep(&ts, nullptr);
      sleep_us = std::min<long>(sleep_us * 2, 1000);
      if (slept < 0 && errno == EINTR) {
        lock.lock();
        return -EINTR;
      }
    }
    lock.lock();
  }
}

// ---------------------------------------------------------------- data

ssize_t StreamSocket::recv(const iovec *iov, int iovcnt, int flags) {
  const size_t total = iov_total(iov, iovcnt);
  std::unique_lock lock(mu_);
  if (role_ == Role::kConnecting && !nonblocking_ && !(flags & MSG_DONTWAIT)) {
    int rc = wait_connected_locked(lock);
    if (rc < 0) return rc;
  }
  if (role_ == Role::kConnecting) return -EAGAIN;
  if (role_ != Role::kConnected) return -ENOTCONN;
  if (total == 0) return 0;
  const bool peek = flags & MSG_PEEK;
  const bool waitall = (flags & MSG_WAITALL) && !peek;
  const bool dontwait = nonblocking_ || (flags & MSG_DONTWAIT);
  size_t done = 0;
  for (;;) {
    if (peek) {  // copy without consuming, across the ring's wrap
      const size_t n = static_cast<size_t>(std::min<uint64_t>(core_.recv_available(), total));
      uint32_t offset;
      const uint32_t first = std::min<uint32_t>(core_.recv_span(&offset), static_cast<uint32_t>(n));
      copy_iov(iov, iovcnt, 0, rbuf_ + offset, first, true);
      copy_iov(iov, iovcnt, first, rbuf_, n - first, true);
      done = n;
    } else {
      uint32_t offset, span;
      while (done < total && (span = core_.recv_span(&offset)) > 0) {
        const size_t n = std::min<size_t>(span, total - done);
        copy_iov(iov, iovcnt, done, rbuf_ + offset, n, true);
        core_.recv_consume(static_cast<uint32_t>(n));
        done += n;
      }
      if (done > 0) drain_actions_locked();  // freed space may owe the peer an advert
    }
    if (done == total || (done > 0 && !waitall)) return static_cast<ssize_t>(done);
    if (core_.recv_available() == 0 && core_.recv_closed()) {
      if (done > 0) return static_cast<ssize_t>(done);
      return core_.state() == StreamState::kError ? core_.error() : 0;
    }
    if (dontwait) return done > 0 ? static_cast<ssize_t>(done) : -EAGAIN;
    int rc = wait_locked(lock, [&] { return core_.recv_available() > 0 || core_.recv_closed(); }, -1);
    if (rc < 0) return done > 0 ? static_cast<ssize_t>(done) : rc;
  }
}

ssize_t StreamSocket::send(const iovec *iov, int iovcnt, int flags) {
  const size_t total = iov_total(iov, iovcnt);
  std::unique_lock lock(mu_);
  if (role_ == Role::kConnecting && !nonblocking_ && !(flags & MSG_DONTWAIT)) {
    int rc = wait_connected_locked(lock);
    if (rc < 0) return rc;
  }
  if (role_ == Role::kConnecting) return -EAGAIN;
  if (role_ != Role::kConnected) return -ENOTCONN;
  const bool dontwait = nonblocking_ || (flags & MSG_DONTWAIT);
  size_t done = 0;
  for (;;) {
    const int status = core_.send_status();
    if (status < 0) return done > 0 ? static_cast<ssize_t>(done) : status;
    if (total == 0) return 0;  // §2.8: nothing goes on the wire
    while (done < total) {
      uint32_t offset;
      const uint32_t space = core_.send_space(&offset);
      if (space == 0) break;
      const size_t n = std::min<size_t>(space, total - done);
      copy_iov(iov, iovcnt, done, sbuf_ + offset, n, false);
      core_.send_commit(static_cast<uint32_t>(n));
      done += n;
    }
    drain_actions_locked();
    if (done == total) return static_cast<ssize_t>(done);
    if (dontwait) return done > 0 ? static_cast<ssize_t>(done) : -EAGAIN;
    int rc = wait_locked(lock, [&] { return core_.send_free() > 0 || core_.send_status() < 0; }, -1);
    if (rc < 0) return done > 0 ? static_cast<ssize_t>(done) : rc;
  }
}

int StreamSocket::shutdown(int how) {
  std::lock_guard lock(mu_);
  uint8_t bits;
  switch (how) {
    case SHUT_RD: bits = kShutRd; break;
    case SHUT_WR: bits = kShutWr; break;
    case SHUT_RDWR: bits = kShutRdWr; break;
    default: return -EINVAL;
  }
  if (role_ != Role::kConnected) return -ENOTCONN;
  core_.shutdown(bits);
  drain_actions_locked();
  return 0;
}

void StreamSocket::begin_close() {
  std::lock_guard lock(mu_);
  closing_ = true;
  const auto linger = options_.linger_opt.l_onoff ? std::chrono::seconds(options_.linger_opt.l_linger)
                                                  : std::chrono::seconds(Engine::get().close_flush_seconds());
  close_deadline_ = Clock::now() + linger;
  listener_.reset();
  accepting_.clear();
  accept_queue_.clear();
  if (role_ == Role::kConnected) {
    core_.shutdown(kShutRdWr);
    drain_actions_locked();
  }
}

bool StreamSocket::close_finished() {
  std::lock_guard lock(mu_);
  if (role_ != Role::kConnected) return true;
  progress_locked();
  const auto now = Clock::now();
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
  if (teardown_at_ == Clock::time_point{})
    teardown_at_ = now + (wait_for_peer ? kPeerTeardownWait : std::chrono::milliseconds(50));
  if (core_.peer_closed_first() && core_.transport_closed()) return true;
  return now >= teardown_at_;
}

short StreamSocket::ready_events(short requested) {
  std::lock_guard lock(mu_);
  progress_locked();
  short ev = 0;
  switch (role_) {
    case Role::kListening:
      if (!accept_queue_.empty()) ev |= POLLIN;
      break;
    case Role::kConnecting:
    case Role::kAccepting:
      break;
    case Role::kConnected: {
      const bool closed = core_.recv_closed();
      if (core_.recv_available() > 0 || closed) ev |= POLLIN | POLLRDNORM;
      if (closed && core_.readable_dir() == false && core_.state() == StreamState::kConnected) ev |= POLLRDHUP;
      if (core_.send_status() == 0 && core_.send_free() >= std::min(kSndLowat, core_.sbuf_size()))
        ev |= POLLOUT | POLLWRNORM;
      if (core_.state() == StreamState::kDisconnected) ev |= POLLHUP | POLLRDHUP;
      if (core_.state() == StreamState::kError) ev |= POLLERR | POLLHUP | POLLOUT;
      break;
    }
    default:
      // Not connected: a failed non-blocking connect reports POLLOUT|POLLERR, as TCP does.
      ev |= POLLHUP;
      if (so_error_) ev |= POLLERR | POLLOUT;
      break;
  }
  return static_cast<short>(ev & (requested | POLLERR | POLLHUP | POLLNVAL));
}

// ---------------------------------------------------------------- options

namespace {

template <class T>
int get_value(const void *val, socklen_t len, T *out) {
  if (!val || len < sizeof(T)) return -EINVAL;
  std::memcpy(out, val, sizeof(T));
  return 0;
}

template <class T>
int put_value(void *val, socklen_t *len, T value) {
  if (!val || !len || *len < sizeof(T)) return -EINVAL;
  std::memcpy(val, &value, sizeof(T));
  *len = sizeof(T);
  return 0;
}

}  // namespace

int StreamSocket::setsockopt(int level, int name, const void *val, socklen_t len) {
  std::lock_guard lock(mu_);
  int v = 0;
  const bool unconnected = role_ == Role::kNew || role_ == Role::kBound || role_ == Role::kListening;
  if (level == SOL_SOCKET) {
    if (name == SO_LINGER) return get_value(val, len, &options_.linger_opt);
    if (int rc = get_value(val, len, &v); rc < 0) return rc;
    switch (name) {
      case SO_REUSEADDR: options_.reuseaddr = v != 0; return 0;
      case SO_REUSEPORT: return 0;
      case SO_KEEPALIVE:
        options_.keepalive = v != 0;
        next_keepalive_ = {};
        return 0;
      case SO_OOBINLINE: options_.oobinline = v != 0; return 0;
      case SO_RCVBUF:  // §7.1: the ring is twice the value; only before buffers exist
        if (unconnected && v > 0) options_.rbuf_size = static_cast<uint32_t>(std::min(v, 1 << 29)) * 2;
        return 0;
      case SO_SNDBUF:
        if (unconnected && v > 0) options_.sbuf_size = std::max<uint32_t>(std::min(v, 1 << 29) * 2, 4096);
        return 0;
      case SO_RCVLOWAT:
      case SO_SNDLOWAT:
      case SO_PRIORITY:
        return 0;
      default: return -ENOPROTOOPT;
    }
  }
  if (level == IPPROTO_TCP) {
    if (int rc = get_value(val, len, &v); rc < 0) return rc;
    switch (name) {
      case TCP_NODELAY: options_.nodelay = v != 0; return 0;  // never delays anyway
      case TCP_KEEPIDLE:
        if (v <= 0) return -EINVAL;
        options_.keepidle_s = v;
        return 0;
      case TCP_MAXSEG:
      case TCP_KEEPCNT:
      case TCP_KEEPINTVL:
      case TCP_QUICKACK:
      case TCP_CORK:
        return 0;  // accepted, no meaning here
      default: return -ENOPROTOOPT;
    }
  }
  if (level == SOL_RDMA) {
    if (!unconnected) return -EINVAL;  // sizes are fixed once the connection exists
    if (int rc = get_value(val, len, &v); rc < 0) return rc;
    if (v < 0 || v > kQpMaxSize) return -EINVAL;
    switch (name) {
      case 0: options_.sq_size = static_cast<uint16_t>(v); return 0;   // RDMA_SQSIZE
      case 1: options_.rq_size = static_cast<uint16_t>(v); return 0;   // RDMA_RQSIZE
      case 2: options_.inline_size = static_cast<uint32_t>(v); return 0;  // RDMA_INLINE
      case 3: options_.iomap_size = scale_decode(scale_encode(static_cast<uint32_t>(v))); return 0;
      default: return -ENOPROTOOPT;
    }
  }
  if (level == IPPROTO_IPV6 && name == IPV6_V6ONLY) return 0;
  if (level == IPPROTO_IP && name == IP_TOS) return 0;
  return -ENOPROTOOPT;
}

int StreamSocket::getsockopt(int level, int name, void *val, socklen_t *len) {
  std::lock_guard lock(mu_);
  if (level == SOL_SOCKET) {
    switch (name) {
      case SO_ERROR: {
        int err = so_error_;
        if (!err && role_ == Role::kConnected && core_.state() == StreamState::kError) err = -core_.error();
        so_error_ = 0;
        return put_value(val, len, err);
      }
      case SO_TYPE: return put_value(val, len, int(SOCK_STREAM));
      case SO_DOMAIN: return put_value(val, len, family_);
      case SO_PROTOCOL: return put_value(val, len, int(IPPROTO_TCP));
      case SO_ACCEPTCONN: return put_value(val, len, int(role_ == Role::kListening));
      case SO_RCVBUF: return put_value(val, len, int(options_.rbuf_size));
      case SO_SNDBUF: return put_value(val, len, int(options_.sbuf_size));
      case SO_REUSEADDR: return put_value(val, len, int(options_.reuseaddr));
      case SO_KEEPALIVE: return put_value(val, len, int(options_.keepalive));
      case SO_OOBINLINE: return put_value(val, len, int(options_.oobinline));
      case SO_LINGER: return put_value(val, len, options_.linger_opt);
      default: return -ENOPROTOOPT;
    }
  }
  if (level == IPPROTO_TCP) {
    switch (name) {
      case TCP_NODELAY: return put_value(val, len, int(options_.nodelay));
      case TCP_MAXSEG: return put_value(val, len, int(kMaxTransfer));
      case TCP_KEEPIDLE:
        return put_value(val, len, options_.keepidle_s > 0 ? options_.keepidle_s : system_keepalive_seconds());
      case TCP_KEEPCNT:
      case TCP_KEEPINTVL:
        return put_value(val, len, 1);
      default: return -ENOPROTOOPT;
    }
  }
  if (level == SOL_RDMA) {
    switch (name) {
      case 0: return put_value(val, len, int(options_.sq_size));
      case 1: return put_value(val, len, int(options_.rq_size));
      case 2: return put_value(val, len, int(options_.inline_size));
      case 3: return put_value(val, len, int(options_.iomap_size));
      default: return -ENOPROTOOPT;
    }
  }
  return -ENOPROTOOPT;
}

int StreamSocket::getsockname(sockaddr *addr, socklen_t *len) {
  std::lock_guard lock(mu_);
  if (!addr || !len) return -EFAULT;
  sockaddr_storage unbound{};
  const sockaddr_storage *src = &local_addr_;
  socklen_t src_len = local_len_;
  if (src_len == 0) {
    unbound.ss_family = static_cast<sa_family_t>(family_);
    src = &unbound;
    src_len = family_ == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  }
  std::memcpy(addr, src, std::min(*len, src_len));
  *len = src_len;
  return 0;
}

int StreamSocket::getpeername(sockaddr *addr, socklen_t *len) {
  std::lock_guard lock(mu_);
  if (!addr || !len) return -EFAULT;
  if (role_ != Role::kConnected || peer_len_ == 0) return -ENOTCONN;
  std::memcpy(addr, &peer_addr_, std::min(*len, peer_len_));
  *len = peer_len_;
  return 0;
}

}  // namespace gpusock::socket
