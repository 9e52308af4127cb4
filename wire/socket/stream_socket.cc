#include "wire/socket/stream_socket.h"
#include "wire/status_kinds.h"
#include "wire/log.h"

#include "wire/socket/ring_budget.h"
#include "wire/socket_rules.h"

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

}  // namespace

void set_last_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(t_last_error, sizeof t_last_error, fmt, ap);
  va_end(ap);
}

const char *last_error() { return t_last_error; }

StreamSocket::StreamSocket(SocketContext &context, Domain *domain, int family)
    : context_(context), domain_(domain), family_(family), conn_(domain, &StreamSocket::on_driver_error, this) {
  options_ = context_.default_options();
}

namespace {
// Connects under way in this process. While there is one, accept-on-demand
// listeners take requests in the background too: the connect may be to one
// of them, from a thread that accepts only after it (kernel TCP allows that).
std::atomic<int> g_connects_under_way{0};
}  // namespace

void StreamSocket::count_connect_locked(bool on) {
  if (on == connect_counted_) return;
  connect_counted_ = on;
  g_connects_under_way.fetch_add(on ? 1 : -1, std::memory_order_seq_cst);
}

void StreamSocket::forget_connects_after_fork() { g_connects_under_way.store(0); }

// Would a pass take new requests now? On demand, a process holds at most one
// request the application has not accepted: one it took belongs to it alone,
// and is reset if the process exits first (a prefork worker told to exit
// after serving a connection), where kernel TCP would have left it in the
// shared queue for another process. A connect under way in this process lifts
// the limit up to the backlog: it may be to this listener, and must complete
// before the application accepts.
bool StreamSocket::takes_requests(bool by_application) const {
  if (!options_.accept_on_demand || !domain_->caps().requests_wait) return true;
  if (g_connects_under_way.load(std::memory_order_seq_cst) > 0) return true;
  return by_application && accepting_.empty() && accept_queue_.empty();
}

StreamSocket::~StreamSocket() {
  count_connect_locked(false);
  for (auto &child : accepting_) child.reset();
  accept_queue_.clear();
  held_request_.reset();  // refused before its listener goes
  listener_.reset();
  conn_.release();
  context_.ring_budget().release(grown_ring_bytes_);
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

// The driver's failures (a refused connect, a hostile peer), with mu_ held.
void StreamSocket::on_driver_error(void *self, gs_status_t err, const char *why) {
  log::write(log::kInfo, "socket", "connection failed: %s (%s)", why, gs_status_name(err));
  static_cast<StreamSocket *>(self)->note_error_locked(err, why);
}

std::string StreamSocket::error_text() {
  std::lock_guard lock(mu_);
  const Stream &core = conn_.core();
  if (error_text_.empty() && role_ == Role::kConnected && core.state() == StreamState::kError)
    note_error_locked(core.error(), core.error_reason() ? core.error_reason() : "connection failed");
  return error_text_;
}

// ---------------------------------------------------------------- set-up

int StreamSocket::bind(const sockaddr *addr, socklen_t len) {
  std::lock_guard lock(mu_);
  if (role_ != Role::kNew) return -EINVAL;
  if (const int rc = rules::check_address(addr, len, family_); rc < 0) return rc;
  std::memcpy(&local_addr_, addr, len);
  local_len_ = len;
  role_ = Role::kBound;
  return 0;
}

int StreamSocket::listen(int backlog) {
  std::lock_guard lock(mu_);
  backlog_ = rules::clamp_backlog(backlog);
  if (role_ == Role::kListening) return 0;
  if (role_ != Role::kNew && role_ != Role::kBound) return -EINVAL;
  if (role_ == Role::kNew) local_len_ = rules::any_address(family_, &local_addr_);
  ListenOptions listen_options;
  listen_options.v6only = family_ == AF_INET6 && v6only();
  int rc =
      domain_->listen(reinterpret_cast<sockaddr *>(&local_addr_), local_len_, backlog_, listen_options, &listener_);
  if (rc < 0) {
    const std::string detail = domain_->last_error_detail();
    return fail_locked(rc, detail.empty() ? "listen failed" : detail.c_str());
  }
  listener_->local_address(&local_addr_, &local_len_);
  role_ = Role::kListening;
  context_.kick();  // it accepts handshakes from now on
  return 0;
}

// Also makes the options say what the driver sizes the rings to (SO_RCVBUF).
// Unchosen sizes are decided here, once: grown rings while the process's
// budget lasts (ring_budget.h).
wire::DriverConfig StreamSocket::driver_config() {
  RingBudget &budget = context_.ring_budget();
  grown_ring_bytes_ += budget.reserve(options_.rbuf_auto, &options_.rbuf_size, options_.sbuf_auto, &options_.sbuf_size);
  if (budget.first_refusal())
    log::write(log::kInfo, "socket",
               "%zu MiB of grown rings in use: further connections get the default rings until some close "
               "(GPUSOCK_RING_BUDGET_MB, GPUSOCK_RING_LARGE)",
               budget.held() >> 20);
  options_.rbuf_auto = options_.sbuf_auto = false;
  options_.rbuf_size = rules::receive_ring_size(options_.rbuf_size);
  options_.sbuf_size = rules::send_ring_size(options_.sbuf_size);
  wire::DriverConfig config;
  config.rbuf_size = options_.rbuf_size;
  config.sbuf_size = options_.sbuf_size;
  config.sq_size = options_.sq_size;
  config.rq_size = options_.rq_size;
  config.inline_size = options_.inline_size;
  return config;
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
  if (const int rc = rules::check_address(addr, len, family_); rc < 0) return rc;
  std::memcpy(&peer_addr_, addr, len);
  peer_len_ = len;
  const int rc = conn_.connect(addr, len, driver_config());
  if (rc < 0) {
    if (rc == -ECONNREFUSED) return rc;
    char host[INET6_ADDRSTRLEN] = "?";
    const void *ip = family_ == AF_INET6
                         ? static_cast<const void *>(&reinterpret_cast<const sockaddr_in6 *>(addr)->sin6_addr)
                         : static_cast<const void *>(&reinterpret_cast<const sockaddr_in *>(addr)->sin_addr);
    inet_ntop(family_, ip, host, sizeof host);
    char why[160];
    std::snprintf(why, sizeof why, "connect to %s failed%s", host,
                  rc == -ENODEV ? ": no RDMA device serves that address (loopback never does)" : "");
    return fail_locked(rc, why);
  }
  role_ = Role::kConnecting;
  count_connect_locked(true);
  context_.kick();  // the handshake goes on in the background (and on-demand listeners take requests)
  if (nonblocking_) return -EINPROGRESS;
  return wait_connected_locked(lock);
}

int StreamSocket::wait_connected_locked(std::unique_lock<std::mutex> &lock) {
  int rc = wait_locked(
      lock, [&] { return role_ != Role::kConnecting; }, -1);
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
      if (accept_queue_.empty()) return listener_short_ != 0 ? listener_short_ : -EAGAIN;
    } else {
      int rc = wait_locked(
          lock, [&] { return !accept_queue_.empty() || listener_short_ != 0 || role_ != Role::kListening; }, -1);
      if (rc < 0) return rc;
      if (role_ != Role::kListening) return -EINVAL;
      if (accept_queue_.empty()) return listener_short_;
    }
  }
  *out = std::move(accept_queue_.front());
  accept_queue_.pop_front();
  return 0;
}

void StreamSocket::return_accepted(std::unique_ptr<StreamSocket> child) {
  std::lock_guard lock(mu_);
  accept_queue_.push_front(std::move(child));
}

// Advances handshakes in flight and takes new requests while under the
// backlog and takes_requests() allows.
bool StreamSocket::accept_requests_locked(bool by_application) {
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
  if (!takes_requests(by_application)) return did;
  const auto rejected = [](void *, int, const char *why) {
    log::write(log::kInfo, "socket", "rejecting connection: %s", why);
  };
  while (accepting_.size() + accept_queue_.size() < static_cast<size_t>(backlog_)) {
    std::unique_ptr<ConnectionRequest> request;
    ConnRecord peer;
    if (held_request_) {  // taken before, when this process had no descriptor for it
      request = std::move(held_request_);
      peer = held_peer_;
      listener_short_ = 0;
    } else {
      const int got = next_valid_request(*listener_, &request, &peer, rejected, nullptr);
      listener_short_ = wire::out_of_descriptors(got) ? got : 0;
      if (got <= 0) break;
    }
    did = true;
    auto child = std::make_unique<StreamSocket>(context_, domain_, family_);
    child->options_ = options_;  // accepted sockets inherit the listener's options (§1.5)
    std::lock_guard child_lock(child->mu_);
    child->local_addr_ = local_addr_;
    child->local_len_ = local_len_;
    if (int rc = child->conn_.accept(request.get(), peer, child->driver_config()); rc < 0) {
      if (wire::out_of_descriptors(rc)) {
        // Out of descriptors: the kernel keeps such a connection in the
        // backlog and accept says EMFILE; so do we, and take it again later.
        held_request_ = std::move(request);
        held_peer_ = peer;
        listener_short_ = rc;
        break;
      }
      log::write(log::kInfo, "socket", "accept failed: %s", gs_status_name(rc));
      request->reject();
      continue;
    }
    child->role_ = Role::kAccepting;
    accepting_.push_back(std::move(child));
    if (!takes_requests(by_application)) return did;  // on demand: one at a time
  }
  if (accepting_.size() + accept_queue_.size() >= static_cast<size_t>(backlog_)) {
    if (const int refused = refuse_pending_requests(*listener_); refused > 0) {
      log::write(log::kInfo, "socket", "backlog of %d full: %d connection(s) refused", backlog_, refused);
      did = true;
    }
  }
  return did;
}

// ---------------------------------------------------------------- progress

// A handshake the driver finished (or failed) becomes the socket's role.
void StreamSocket::adopt_driver_state_locked() {
  if (role_ != Role::kConnecting && role_ != Role::kAccepting) return;
  switch (conn_.state()) {
    case DriverState::kConnected:
      count_connect_locked(false);
      role_ = Role::kConnected;
      if (Endpoint *ep = conn_.endpoint()) {
        ep->local_address(&local_addr_, &local_len_);
        ep->peer_address(&peer_addr_, &peer_len_);
      }
      break;
    case DriverState::kFailed:
      count_connect_locked(false);
      so_error_ = -conn_.error();
      role_ = role_ == Role::kConnecting ? Role::kNew : Role::kClosed;
      break;
    default:
      break;
  }
}

void StreamSocket::keepalive_tick_locked() {
  if (!options_.keepalive || role_ != Role::kConnected) return;
  const auto now = Clock::now();
  if (now < next_keepalive_) return;
  if (next_keepalive_ != Clock::time_point{}) conn_.core().request_keepalive();
  const int idle = options_.keepidle_s > 0 ? options_.keepidle_s : system_keepalive_seconds();
  next_keepalive_ = now + std::chrono::seconds(idle);
}

bool StreamSocket::progress_locked(bool by_application, int quiet_fd) {
  switch (role_) {
    case Role::kListening: {
      const bool did = accept_requests_locked(by_application);
      if (did) wake_sleepers_locked();
      return did;
    }
    case Role::kConnecting:
    case Role::kAccepting:
    case Role::kConnected: {
      keepalive_tick_locked();  // first: a keepalive it asks for is posted by this pass
      const bool did = conn_.progress(quiet_fd);
      adopt_driver_state_locked();
      if (did) wake_sleepers_locked();
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

bool StreamSocket::try_background_progress() {
  std::unique_lock lock(mu_, std::try_to_lock);
  return lock.owns_lock() && progress_locked(/*by_application=*/false);
}

// Blocks until ready() (re-checked after every progress pass), the timeout
// (-EAGAIN) or a signal (-EINTR): spins for the thread's adaptive budget,
// then sleeps on the transport's wait fds and this thread's waker (waiting.h).
template <class Pred>
int StreamSocket::wait_locked(std::unique_lock<std::mutex> &lock, Pred ready, int timeout_ms) {
  const auto start = Clock::now();
  const auto deadline = timeout_ms < 0 ? Clock::time_point::max() : start + std::chrono::milliseconds(timeout_ms);
  auto spin_until = start + std::chrono::microseconds(SpinBudget::next_us());
  std::vector<pollfd> fds;
  unsigned sleeps = 0;
  auto now = start;
  for (unsigned step = 0;; ++step) {
    progress_locked();
    // While spinning, the clock is read every fourth step: a read costs ~16 ns
    // on a VM, a tenth of an idle step, and the budgets are microseconds.
    if (step % 4 == 0 || now >= spin_until) now = Clock::now();
    if (ready()) {
      SpinBudget::record(std::chrono::duration_cast<std::chrono::microseconds>(now - start).count());
      return 0;
    }
    if (now >= deadline) {
      SpinBudget::record(std::chrono::duration_cast<std::chrono::microseconds>(now - start).count());
      return -EAGAIN;
    }
    if (now < spin_until) {
      lock.unlock();
      const bool alone = spin_step(step, now);
      lock.lock();
      if (!alone) spin_until = now;  // another thread wants this core: sleep
      continue;
    }
    fds.clear();
    const Armed armed = arm_wait_fds_locked(&fds);
    if (armed == Armed::kPending) continue;
    const int waker = thread_waker_fd();
    fds.push_back({waker, POLLIN, 0});
    int64_t timeout_us = deadline == Clock::time_point::max()
                             ? -1
                             : std::chrono::duration_cast<std::chrono::microseconds>(deadline - now).count() + 1;
    if (armed == Armed::kNoFd)
      timeout_us = timeout_us < 0 ? no_fd_step_us(sleeps) : std::min(timeout_us, no_fd_step_us(sleeps));
    ++sleeps;
    sleepers_.add(waker);
    SpinBudget::stop_spinning();
    lock.unlock();
    const int n = sleep_on(fds, timeout_us);  // a signal interrupts a blocking call, as the kernel's would
    lock.lock();
    sleepers_.remove(waker);
    if (fds.back().revents) drain_thread_waker();
    if (n == -EINTR) {
      SpinBudget::record(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count());
      return -EINTR;
    }
  }
}

int StreamSocket::wait_for_locked(std::unique_lock<std::mutex> &lock, const std::function<bool()> &ready,
                                  int timeout_ms) {
  return wait_locked(lock, ready, timeout_ms);
}

// What to sleep on: the listener and its handshakes in flight, or the
// connection's endpoint; each armed first (Endpoint::arm_wait). Several
// threads may sleep on one endpoint (a blocked call and the engine's
// background thread), and an endpoint's wake-up is one: a thread whose
// arming finds it pending (it drained the wake-up, or disarmed after
// looking) wakes the socket's other sleepers, which would miss it.
Armed StreamSocket::arm_wait_fds_locked(std::vector<pollfd> *fds, bool by_application,
                                        const std::vector<int> *quiet_fds) {
  const Armed armed = arm_endpoints_locked(fds, by_application, quiet_fds);
  if (armed == Armed::kPending) wake_sleepers_locked();
  return armed;
}

Armed StreamSocket::arm_endpoints_locked(std::vector<pollfd> *fds, bool by_application,
                                         const std::vector<int> *quiet_fds, bool list_only) {
  Armed result = Armed::kSleep;
  const auto add = [&](auto *source) {
    const int fd = source->wait_fd();
    const auto arm = [&] {
      const bool quiet = quiet_fds != nullptr && std::binary_search(quiet_fds->begin(), quiet_fds->end(), fd);
      return quiet ? source->arm_wait_fd_quiet() : source->arm_wait();
    };
    if (fd < 0) {
      if (result == Armed::kSleep) result = Armed::kNoFd;
    } else if (!list_only && arm() != 0) {
      result = Armed::kPending;
    } else {
      fds->push_back({fd, POLLIN, 0});
    }
  };
  switch (role_) {
    case Role::kListening:
      // A listener whose requests this thread would not take is not slept on:
      // its fd would stay readable.
      if (takes_requests(by_application)) add(listener_.get());
      for (auto &child : accepting_) {
        std::lock_guard child_lock(child->mu_);
        if (Endpoint *ep = child->conn_.endpoint()) add(ep);
      }
      return result;
    case Role::kConnecting:
    case Role::kAccepting:
    case Role::kConnected:
      if (Endpoint *ep = conn_.endpoint()) {
        add(ep);
        return result;
      }
      return Armed::kNoFd;  // cut off: nothing will come, the caller's check ends the wait
    default:
      return Armed::kPending;  // nothing to wait for: its state is final
  }
}

Armed StreamSocket::arm_background_wait_fds(std::vector<pollfd> *fds) {
  std::lock_guard lock(mu_);
  return arm_wait_fds_locked(fds, /*by_application=*/false);
}

void StreamSocket::remove_sleeper(int waker_fd) {
  std::lock_guard lock(mu_);
  sleepers_.remove(waker_fd);
}

StreamSocket::Background StreamSocket::background_need(Clock::time_point *look_by) {
  std::lock_guard lock(mu_);
  switch (role_) {
    case Role::kListening:  // on demand: only its handshakes in flight
      return takes_requests(false) || !accepting_.empty() ? Background::kEvents : Background::kNone;
    case Role::kConnecting:
    case Role::kAccepting:
      return Background::kEvents;
    case Role::kConnected: {
      const Stream &core = conn_.core();
      if (core.send_unposted() > 0) return Background::kEvents;  // bytes waiting for credits or an advert
      // Keepalive is a timer: sleeping on the connection's events too woke
      // the thread on every message (memcached sets SO_KEEPALIVE: ~40k
      // wake-ups a second beside its workers).
      if (!options_.keepalive || core.state() != StreamState::kConnected) return Background::kNone;
      if (next_keepalive_ == Clock::time_point{} || Clock::now() >= next_keepalive_) return Background::kPass;
      *look_by = std::min(*look_by, next_keepalive_);
      return Background::kNone;
    }
    default:
      return Background::kNone;
  }
}

// ---------------------------------------------------------------- data

// recv/send on a socket still connecting wait for the connect (or -EAGAIN when
// they must not block), as TCP does; 0 once connected.
int StreamSocket::ready_for_data_locked(std::unique_lock<std::mutex> &lock, int flags) {
  if (role_ == Role::kConnecting && !nonblocking_ && !(flags & MSG_DONTWAIT)) {
    int rc = wait_connected_locked(lock);
    if (rc < 0) return rc;
  }
  if (role_ == Role::kConnecting) return -EAGAIN;
  return role_ == Role::kConnected ? 0 : -ENOTCONN;
}

ssize_t StreamSocket::recv(const iovec *iov, int iovcnt, int flags) {
  const size_t total = iov_total(iov, iovcnt);
  std::unique_lock lock(mu_);
  if (int rc = ready_for_data_locked(lock, flags); rc < 0) return rc;
  if (total == 0) return 0;
  const bool peek = flags & MSG_PEEK;
  const bool waitall = (flags & MSG_WAITALL) && !peek;
  const bool dontwait = nonblocking_ || (flags & MSG_DONTWAIT);
  // Nothing here yet: take what has arrived (no thread moves an idle socket
  // for us; a non-blocking reader that never polls must still see its data).
  if (conn_.core().recv_available() == 0) progress_locked();
  size_t done = 0;
  for (;;) {
    if (peek) {  // copy without consuming, across the ring's wrap
      const size_t n = static_cast<size_t>(std::min<uint64_t>(conn_.core().recv_available(), total));
      uint32_t offset;
      const uint32_t first = std::min<uint32_t>(conn_.core().recv_span(&offset), static_cast<uint32_t>(n));
      copy_iov(iov, iovcnt, 0, conn_.rbuf() + offset, first, true);
      copy_iov(iov, iovcnt, first, conn_.rbuf(), n - first, true);
      done = n;
    } else {
      uint32_t offset, span;
      while (done < total && (span = conn_.core().recv_span(&offset)) > 0) {
        const size_t n = std::min<size_t>(span, total - done);
        copy_iov(iov, iovcnt, done, conn_.rbuf() + offset, n, true);
        conn_.core().recv_consume(static_cast<uint32_t>(n));
        done += n;
      }
      if (done > 0) conn_.post_actions();  // freed space may owe the peer an advert
    }
    if (done == total || (done > 0 && !waitall)) return static_cast<ssize_t>(done);
    if (conn_.core().recv_available() == 0 && conn_.core().recv_closed()) {
      if (done > 0) return static_cast<ssize_t>(done);
      return conn_.core().state() == StreamState::kError ? conn_.core().error() : 0;
    }
    if (dontwait) return done > 0 ? static_cast<ssize_t>(done) : -EAGAIN;
    int rc = wait_locked(
        lock, [&] { return conn_.core().recv_available() > 0 || conn_.core().recv_closed(); }, -1);
    if (rc < 0) return done > 0 ? static_cast<ssize_t>(done) : rc;
  }
}

ssize_t StreamSocket::send(const iovec *iov, int iovcnt, int flags) {
  const size_t total = iov_total(iov, iovcnt);
  std::unique_lock lock(mu_);
  if (int rc = ready_for_data_locked(lock, flags); rc < 0) return rc;
  const bool dontwait = nonblocking_ || (flags & MSG_DONTWAIT);
  if (ssize_t sent; !dontwait && iovcnt == 1 && send_zero_copy_locked(lock, iov[0], &sent)) return sent;
  size_t done = 0;
  bool progressed = false;
  for (;;) {
    const int status = conn_.core().send_status();
    if (status < 0) return done > 0 ? static_cast<ssize_t>(done) : status;
    if (total == 0) return 0;  // §2.8: nothing goes on the wire
    if (zero_copy_active_) {   // another thread's bytes go out from its buffer first
      if (dontwait) return done > 0 ? static_cast<ssize_t>(done) : -EAGAIN;
      int rc = wait_locked(
          lock, [&] { return !zero_copy_active_; }, -1);
      if (rc < 0) return done > 0 ? static_cast<ssize_t>(done) : rc;
      continue;
    }
    while (done < total) {
      uint32_t offset;
      uint32_t space = conn_.core().send_space(&offset);
      if (space == 0 && !progressed) {
        // The ring is full of bytes the transport may be done with: take its
        // completions before saying so (no thread moves an idle socket for
        // us; a non-blocking sender that never polls must see the room).
        progress_locked();
        progressed = true;
        space = conn_.core().send_space(&offset);
      }
      if (space == 0) break;
      const size_t n = std::min<size_t>(space, total - done);
      copy_iov(iov, iovcnt, done, conn_.sbuf() + offset, n, false);
      conn_.core().send_commit(static_cast<uint32_t>(n));
      done += n;
    }
    conn_.post_actions();
    // Bytes that wait for credits or an advert are the background thread's
    // to post if nobody calls in again.
    if (conn_.core().send_unposted() > 0) context_.kick();
    if (done == total) return static_cast<ssize_t>(done);
    if (dontwait) return done > 0 ? static_cast<ssize_t>(done) : -EAGAIN;
    int rc = wait_locked(
        lock, [&] { return conn_.core().send_free() > 0 || conn_.core().send_status() < 0; }, -1);
    if (rc < 0) return done > 0 ? static_cast<ssize_t>(done) : rc;
  }
}

int StreamSocket::shutdown(int how) {
  std::lock_guard lock(mu_);
  if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) return -EINVAL;
  if (role_ != Role::kConnected) return -ENOTCONN;
  const int rc = conn_.shutdown(how);
  wake_sleepers_locked();                                // a reader blocked in another thread sees EOF now
  if (Endpoint *ep = conn_.endpoint()) ep->hint_self();  // and an event loop's next pass looks
  return rc;
}

void StreamSocket::begin_close() {
  std::lock_guard lock(mu_);
  closing_ = true;
  const auto linger = options_.linger_opt.l_onoff ? std::chrono::seconds(options_.linger_opt.l_linger)
                                                  : std::chrono::seconds(context_.close_flush_seconds());
  held_request_.reset();
  listener_.reset();
  accepting_.clear();
  accept_queue_.clear();
  if (role_ == Role::kListening) role_ = Role::kClosed;  // a blocked accept returns -EINVAL
  conn_.begin_close(Clock::now() + linger);
  wake_sleepers_locked();
}

bool StreamSocket::close_finished() {
  std::lock_guard lock(mu_);
  return role_ != Role::kConnected || conn_.close_finished();
}

short StreamSocket::ready_events(short requested, int quiet_fd) {
  std::lock_guard lock(mu_);
  return ready_events_locked(requested, quiet_fd);
}

int StreamSocket::look_fd() {
  std::lock_guard lock(mu_);
  if (role_ != Role::kConnected || !domain_->caps().quiet_fd_means_idle) return -1;
  const Endpoint *ep = conn_.endpoint();
  return ep != nullptr ? ep->wait_fd() : -1;
}

short StreamSocket::look_for_set(short requested, int quiet_fd, int32_t *slot, bool *quiet) {
  std::lock_guard lock(mu_);
  const short ready = ready_events_locked(requested, quiet_fd);
  const Endpoint *ep = role_ == Role::kConnected && !closing_ ? conn_.endpoint() : nullptr;
  *slot = ep != nullptr ? ep->hint_slot() : -1;
  *quiet = *slot >= 0 && ep->quiet_until_hinted();
  return ready;
}

void StreamSocket::list_wait_fds(std::vector<pollfd> *fds) {
  std::lock_guard lock(mu_);
  (void)arm_endpoints_locked(fds, /*by_application=*/true, nullptr, /*list_only=*/true);
}

Armed StreamSocket::prepare_sleep(int waker_fd, short requested, std::vector<pollfd> *fds,
                                  const std::vector<int> *quiet_fds, bool known_quiet) {
  std::lock_guard lock(mu_);
  sleepers_.add(waker_fd);  // first: from here on, another thread's progress wakes us
  const size_t before = fds->size();
  const short ready = known_quiet ? readiness_locked(requested) : ready_events_locked(requested);
  const Armed armed = ready != 0 ? Armed::kPending : arm_wait_fds_locked(fds, true, quiet_fds);
  if (armed == Armed::kPending) {
    sleepers_.remove(waker_fd);
    fds->resize(before);
  }
  return armed;
}

short StreamSocket::ready_events_locked(short requested, int quiet_fd) {
  progress_locked(/*by_application=*/true, quiet_fd);
  return readiness_locked(requested);
}

short StreamSocket::readiness_locked(short requested) const {
  short ev = 0;
  switch (role_) {
    case Role::kListening:
      if (!accept_queue_.empty() || listener_short_ != 0) ev |= POLLIN;  // the kernel's: readable, accept says EMFILE
      break;
    case Role::kConnecting:
    case Role::kAccepting:
      break;
    case Role::kConnected: {
      // As Linux's tcp_poll: a direction that is down reads as EOF (POLLIN,
      // POLLRDHUP) or writes without blocking (POLLOUT, the write fails);
      // POLLHUP only once both are down, and a reset (kError) is all of them.
      // The peer's DISCONNECT ends its writing only: ours stays up until we
      // shut it down, as a peer's FIN leaves TCP in CLOSE_WAIT.
      const wire::Stream &core = conn_.core();
      const bool failed = core.state() == StreamState::kError;
      const bool in_down = core.recv_closed();
      const bool out_down = !core.writable_dir() || failed;
      if (core.recv_available() > 0 || in_down) ev |= POLLIN | POLLRDNORM;
      if (in_down) ev |= POLLRDHUP;
      if (out_down || core.state() == StreamState::kDisconnected ||
          core.send_free() >= std::min(kSndLowat, core.sbuf_size()))
        ev |= POLLOUT | POLLWRNORM;
      if (in_down && out_down) ev |= POLLHUP;
      if (failed) ev |= POLLERR;
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

}  // namespace gpusock::socket
