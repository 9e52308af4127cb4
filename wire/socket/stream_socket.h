// One gpusock stream socket on the CPU: socket semantics (roles, options,
// blocking, the listener's accept queue) around one wire::ConnectionDriver,
// which binds the protocol core to a transport endpoint.
//
// Concurrency: every method that touches connection state takes `mu`. Blocking
// calls drop it between progress passes, so a sender and a receiver thread, and
// the engine's background thread, can all drive the same socket.
#pragma once

#include "wire/connection_driver.h"
#include "wire/socket/socket_context.h"
#include "wire/socket/waiting.h"

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace gpusock::socket {

using Clock = std::chrono::steady_clock;

struct SocketOptions {
  uint32_t rbuf_size = wire::kDefaultBufSize;
  uint32_t sbuf_size = wire::kDefaultBufSize;
  // Nobody chose the size (SO_RCVBUF/SO_SNDBUF, GPUSOCK_(W)MEM_DEFAULT,
  // rsocket's files): the connection may take grown rings (ring_budget.h).
  bool rbuf_auto = true;
  bool sbuf_auto = true;
  uint16_t sq_size = wire::kDefaultSqSize;
  uint16_t rq_size = wire::kDefaultRqSize;
  uint32_t inline_size = wire::kDefaultInline;
  uint32_t iomap_size = 0;
  bool reuseaddr = false;
  bool keepalive = false;
  bool nodelay = false;
  bool oobinline = false;
  bool accept_on_demand = false;  // SOL_GPUSOCK GS_ACCEPT_ON_DEMAND (listeners)
  int keepidle_s = 0;             // 0: system default
  int v6only = -1;                // IPV6_V6ONLY; -1: the system's default (net.ipv6.bindv6only)
  linger linger_opt{0, 0};
};

enum class Role : uint8_t { kNew, kBound, kListening, kConnecting, kAccepting, kConnected, kClosed };

class StreamSocket {
 public:
  // context: the engine (socket_context.h); it outlives the socket.
  StreamSocket(SocketContext &context, wire::Domain *domain, int family);
  ~StreamSocket();
  StreamSocket(const StreamSocket &) = delete;
  StreamSocket &operator=(const StreamSocket &) = delete;

  int family() const { return family_; }
  bool nonblocking() const { return nonblocking_; }
  void set_nonblocking(bool on) { nonblocking_ = on; }

  // Socket calls. Each returns >= 0 or a negated errno.
  int bind(const sockaddr *addr, socklen_t len);
  int listen(int backlog);
  // Takes one established connection off the accept queue (or -EAGAIN; or
  // -EMFILE/-ENFILE while a connection waits that this process has no
  // descriptor to take).
  int accept(std::unique_ptr<StreamSocket> *out, bool wait);
  // Puts a connection accept() gave back at the head of the queue.
  void return_accepted(std::unique_ptr<StreamSocket> child);
  int connect(const sockaddr *addr, socklen_t len);
  ssize_t recv(const iovec *iov, int iovcnt, int flags);
  ssize_t send(const iovec *iov, int iovcnt, int flags);
  int shutdown(int how);
  int setsockopt(int level, int name, const void *val, socklen_t len);
  int getsockopt(int level, int name, void *val, socklen_t *len);
  int getsockname(sockaddr *addr, socklen_t *len);
  int getpeername(sockaddr *addr, socklen_t *len);

  // poll(2) events that are ready now (after one progress pass). quiet_fd:
  // this socket's look_fd(), found not readable by the caller just before
  // (ConnectionDriver::progress), or -1.
  short ready_events(short requested, int quiet_fd = -1);
  // The fd a caller polling many sockets may look at in one system call
  // before ready_events (the endpoint's wait fd, when its transport lets a
  // quiet fd stand for an idle endpoint), or -1.
  int look_fd();
  // Event-driven waiting (waiting.h) for the engine's background thread: adds
  // the fds to sleep on for this socket after arming its transport, or says
  // why not to sleep.
  Armed arm_background_wait_fds(std::vector<pollfd> *fds);
  // A thread about to sleep until `requested` events: registers its waker
  // (woken when another thread's progress changes the socket), then, unless
  // the events are ready already (kPending, and not registered), arms.
  // quiet_fds (sorted, or null): wait fds the caller has just polled and
  // found not readable (Endpoint::arm_wait_fd_quiet).
  // known_quiet: a readiness set found it not ready and quiet since
  // (ready_set.h): armed without a progress pass first (the arming's own
  // look at its endpoint sees what came since).
  Armed prepare_sleep(int waker_fd, short requested, std::vector<pollfd> *fds,
                      const std::vector<int> *quiet_fds = nullptr, bool known_quiet = false);
  // For a readiness set (ready_set.h): ready_events(requested, quiet_fd);
  // then *slot: its endpoint's hint slot (-1: no hints), and *quiet: until a
  // hint comes for that slot, nothing new can be found here.
  short look_for_set(short requested, int quiet_fd, int32_t *slot, bool *quiet);
  // Appends the fds prepare_sleep would sleep on (no arming).
  void list_wait_fds(std::vector<pollfd> *fds);
  void remove_sleeper(int waker_fd);
  // What the engine's background thread must do for this socket while nobody
  // calls into it, and (in *look_by) by when it must look again at the latest.
  enum class Background : uint8_t {
    kNone,    // nothing now (a keepalive's next time is in *look_by)
    kPass,    // one progress pass now (a keepalive is due); nothing to sleep on
    kEvents,  // a pass now and whenever its transport has news: a listener, a
              // connect under way, a send ring waiting for credits
  };
  Background background_need(Clock::time_point *look_by);
  // One progress pass. Returns true if anything happened.
  bool progress();
  // The background thread's pass: only if nobody else holds the socket, and
  // for an accept-on-demand listener without taking new requests.
  bool try_background_progress();
  // Begin an orderly close: flush, send DISCONNECT; true once it may be freed.
  void begin_close();
  bool close_finished();
  bool lingers() const { return options_.linger_opt.l_onoff != 0; }
  int v6only() const;  // IPV6_V6ONLY in force (caller holds mu or owns the socket)
  // What went wrong last on this socket, in words ("" if nothing did).
  std::string error_text();

  // In a child of fork(): no connect of the parent's is under way here.
  static void forget_connects_after_fork();

  // How many fds refer to this socket (dup); the last close closes it.
  std::atomic<int> fd_refs{0};

 private:
  wire::DriverConfig driver_config();
  void adopt_driver_state_locked();
  int fail_locked(int err, const char *why);
  void note_error_locked(int err, const char *why);
  static void on_driver_error(void *self, gs_status_t err, const char *why);
  int wait_connected_locked(std::unique_lock<std::mutex> &lock);
  // A blocking send of one large buffer, written from the buffer itself
  // (stream_socket_zcopy.cc): false when it does not apply (the caller copies).
  bool send_zero_copy_locked(std::unique_lock<std::mutex> &lock, const iovec &iov, ssize_t *result);
  int wait_zero_copy_retired_locked(std::unique_lock<std::mutex> &lock, uint64_t end);
  int ready_for_data_locked(std::unique_lock<std::mutex> &lock, int flags);
  void keepalive_tick_locked();
  // by_application: a call of the application's (not the background thread);
  // only such a pass takes requests off an accept-on-demand listener, one at
  // a time.
  bool progress_locked(bool by_application = true, int quiet_fd = -1);
  bool accept_requests_locked(bool by_application);
  bool takes_requests(bool by_application) const;
  // Counts this socket among the process's connects under way (or not).
  void count_connect_locked(bool on);
  Armed arm_wait_fds_locked(std::vector<pollfd> *fds, bool by_application = true,
                            const std::vector<int> *quiet_fds = nullptr);
  Armed arm_endpoints_locked(std::vector<pollfd> *fds, bool by_application, const std::vector<int> *quiet_fds,
                             bool list_only = false);
  short ready_events_locked(short requested, int quiet_fd = -1);  // a progress pass, then readiness_locked
  short readiness_locked(short requested) const;
  void wake_sleepers_locked() {
    if (!sleepers_.empty()) sleepers_.wake_all();
  }
  template <class Pred>
  int wait_locked(std::unique_lock<std::mutex> &lock, Pred ready, int timeout_ms);
  // wait_locked for files that do not see its definition.
  int wait_for_locked(std::unique_lock<std::mutex> &lock, const std::function<bool()> &ready, int timeout_ms);

  std::mutex mu_;
  SocketContext &context_;
  wire::Domain *domain_;
  int family_;
  std::atomic<bool> nonblocking_{false};
  Role role_ = Role::kNew;
  SocketOptions options_;
  int so_error_ = 0;
  std::string error_text_;
  sockaddr_storage local_addr_{};
  socklen_t local_len_ = 0;
  sockaddr_storage peer_addr_{};
  socklen_t peer_len_ = 0;

  SleeperList sleepers_;

  // connection
  wire::ConnectionDriver conn_;
  bool closing_ = false;
  bool connect_counted_ = false;
  size_t grown_ring_bytes_ = 0;    // taken from context_.ring_budget(), returned when freed
  bool zero_copy_active_ = false;  // a send writes from its caller's buffer: no one else commits
  Clock::time_point next_keepalive_{};

  // listener
  std::unique_ptr<wire::Listener> listener_;
  int backlog_ = 0;
  std::vector<std::unique_ptr<StreamSocket>> accepting_;
  std::deque<std::unique_ptr<StreamSocket>> accept_queue_;
  int listener_short_ = 0;  // -EMFILE/-ENFILE: the listener holds a request it cannot take yet
  std::unique_ptr<wire::ConnectionRequest> held_request_;  // that request, when it came out already
  wire::ConnRecord held_peer_{};
};

// The kernel's TCP keepalive idle time (tcp_keepalive_time), the default of TCP_KEEPIDLE.
int system_keepalive_seconds();

// The last error explanation of this thread (gs_last_error).
void set_last_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *last_error();

}  // namespace gpusock::socket
