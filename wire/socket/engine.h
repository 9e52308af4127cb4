// The process-wide side of gpusock's CPU sockets: the transport domain, the fd
// table, and a background thread that keeps connections moving while no
// application thread is inside a socket call (accepting handshakes, flushing
// sends, finishing closes) — what a kernel's TCP stack does on its own.
#pragma once

#include "wire/socket/fd_table.h"
#include "wire/socket/reg_cache.h"
#include "wire/socket/ring_budget.h"
#include "wire/socket/socket_context.h"
#include "wire/socket/spin_pause.h"
#include "wire/socket/stream_socket.h"

#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace gpusock::socket {

// The engine is its sockets' context (socket_context.h).
class Engine final : public SocketContext {
 public:
  static Engine &get();

  // The transport for this process (GPUSOCK_TRANSPORT), opened on first use.
  // nullptr on failure, with *status set and last_error() naming what is missing.
  wire::Domain *domain(int *status);
  // The domain if it is open (no lock, nothing opened), else nullptr.
  wire::Domain *opened_domain() const { return opened_domain_.load(std::memory_order_acquire); }

  // Reserves an fd (an eventfd, so fd numbers never collide with the kernel's)
  // for the socket. Returns the fd or a negated errno.
  int add(std::shared_ptr<StreamSocket> socket, bool cloexec);
  // The same in two steps: a number first (or -EMFILE, -ENFILE), then the
  // socket under it (add closes the number if that fails).
  int reserve_number(bool cloexec);
  int add_at(std::shared_ptr<StreamSocket> socket, int number);
  std::shared_ptr<StreamSocket> find(int fd) const;
  // Removes the fd; once no fd refers to the socket it finishes closing in the
  // background.
  int close(int fd);
  // dup/dup2/dup3 for socket fds: the new fd refers to the same socket.
  int dup(int fd, int newfd, int flags);

  // Zero-copy sends (docs/performance.md): the registration cache of the
  // domain, made on the first large send (with the thread that watches its
  // memory); nullptr when zero-copy is off (GPUSOCK_ZCOPY=0) or cannot be
  // done safely here (no userfaultfd); and the smallest send that uses it.
  RegCache *reg_cache() override;
  size_t zcopy_min() const override { return zcopy_min_; }

  const SocketOptions &default_options() const override { return defaults_; }
  // Grown rings for connections whose ring sizes nobody chose.
  RingBudget &ring_budget() override { return ring_budget_; }
  // A socket gained work for the background thread (a listener, a connect
  // under way, bytes waiting for credits, keepalive, a close): wakes the
  // thread if it sleeps. An atomic add and a load when it does not.
  void kick() override;
  int close_flush_seconds() const override { return close_flush_s_; }

  // pthread_atfork handlers (also gs_fork_*, for raw clones): the child of
  // fork() cannot use the parent's transport state (threads are gone;
  // endpoints, kernel sockets and shm regions are shared with the parent,
  // which goes on using them).
  static void fork_prepare();
  static void fork_parent();
  static void fork_child();
  // A process made by a clone that ran no fork handlers and was not reported
  // (gs_fork_*) holds its parent's state as its own. Its first socket, close,
  // accept, listen or connect call, and its exit, abandon that state as
  // fork_child does, so that nothing of the parent's is torn down here (a
  // vfork() child, on its parent's memory, leaves it as it is).
  void adopt_if_cloned();

 private:
  Engine();
  void background_loop();
  void start_background();
  void release(std::shared_ptr<StreamSocket> socket);
  void limit_ring_budget_to_memlock();
  static void at_exit();
  void stop_background();

  std::mutex table_mu_;  // serializes the table's writers (add, close, dup); lookups take no lock
  FdTable<StreamSocket> table_;
  std::mutex closing_mu_;
  std::vector<std::shared_ptr<StreamSocket>> closing_;

  std::mutex domain_mu_;  // a mutex, not a once_flag: fork_child re-arms it
  bool domain_opened_ = false;
  std::unique_ptr<wire::Domain> domain_;
  std::atomic<wire::Domain *> opened_domain_{nullptr};  // domain_ once open
  int domain_status_ = 0;
  std::string domain_error_;
  std::unique_ptr<RegCache> reg_cache_;  // after domain_: goes first
  bool reg_cache_tried_ = false;
  size_t zcopy_min_ = 0;  // 0: zero-copy off
  size_t zcopy_cache_bytes_ = 0;
  // A forked child opens the transport its parent had, whatever its
  // environment says by then (nginx clears its workers' environment).
  std::string inherited_transport_;
  std::atomic<pid_t> process_{getpid()};  // whose state this is

  std::mutex thread_mu_;
  bool thread_started_ = false;
  std::thread background_;
  std::thread::id background_id_;
  std::atomic<bool> stopping_{false};
  // True from the thread's start until it has left its loop and dropped every
  // socket it held: at exit the transport's own destructors run after ours.
  std::atomic<bool> background_running_{false};
  // The background thread sleeps on its sockets' wait fds and on this waker;
  // kick() writes it when the thread sleeps and the epoch moved under it.
  int background_waker_ = -1;
  std::atomic<uint64_t> background_epoch_{0};
  std::atomic<bool> background_sleeping_{false};

  SocketOptions defaults_;
  RingBudget ring_budget_;
  int close_flush_s_ = 10;
};

}  // namespace gpusock::socket
