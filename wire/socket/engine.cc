#include "wire/socket/engine.h"
#include "wire/config.h"
#include "wire/log.h"
#include "wire/socket/waiting.h"

#include <fcntl.h>
#include <linux/kcmp.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

namespace gpusock::socket {

namespace {

void sleep_us(long us) {
  timespec ts{us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, nullptr);
}

}  // namespace

Engine &Engine::get() {
  // Never destroyed: sockets may outlive static destructors of the application.
  static Engine *engine = [] {
    auto *e = new Engine();
    std::atexit(&Engine::at_exit);
    pthread_atfork(&Engine::fork_prepare, &Engine::fork_parent, &Engine::fork_child);
    return e;
  }();
  return *engine;
}

Engine::Engine() {
  // rsocket's defaults (§2.10): the environment, else rsocket's files (wire/config.h).
  using config::Id;
  defaults_.rbuf_size = static_cast<uint32_t>(config::get(Id::kMemDefault));
  defaults_.rbuf_auto = !config::is_set(Id::kMemDefault);
  defaults_.sbuf_size = static_cast<uint32_t>(config::get(Id::kWmemDefault));
  defaults_.sbuf_auto = !config::is_set(Id::kWmemDefault);
  // Unchosen rings grow to GPUSOCK_RING_LARGE (0: never) while the process
  // holds less than GPUSOCK_RING_BUDGET_MB of grown rings (ring_budget.h).
  ring_budget_.configure(static_cast<uint32_t>(config::get(Id::kRingLarge)),
                         static_cast<size_t>(config::get(Id::kRingBudgetMb)) << 20);
  defaults_.sq_size = static_cast<uint16_t>(config::get(Id::kSqSize));
  defaults_.rq_size = static_cast<uint16_t>(config::get(Id::kRqSize));
  defaults_.inline_size = static_cast<uint32_t>(config::get(Id::kInline));
  close_flush_s_ = static_cast<int>(config::get(Id::kCloseFlushS));
  if (config::get(Id::kZcopy) != 0) zcopy_min_ = config::get(Id::kZcopyMin);
  zcopy_cache_bytes_ = static_cast<size_t>(config::get(Id::kZcopyCacheMb)) << 20;
}

// Rings registered with a pinning transport count against RLIMIT_MEMLOCK:
// grown rings may take a quarter of a finite limit at most.
void Engine::limit_ring_budget_to_memlock() {
  rlimit lim{};
  if (!domain_->caps().registration_pins || getrlimit(RLIMIT_MEMLOCK, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY)
    return;
  const size_t share = static_cast<size_t>(lim.rlim_cur / 4);
  if (share < ring_budget_.budget()) ring_budget_.configure(ring_budget_.large(), share);
}

wire::Domain *Engine::domain(int *status) {
  {
    std::lock_guard lock(domain_mu_);
    if (!domain_opened_) {
      domain_status_ = wire::open_domain(inherited_transport_, &domain_, &domain_error_);
      if (domain_status_ == 0) {
        log::write(log::kInfo, "socket", "transport %s", domain_->caps().name);
        limit_ring_budget_to_memlock();
        opened_domain_.store(domain_.get(), std::memory_order_release);
      }
      domain_opened_ = true;
    }
  }
  *status = domain_status_;
  if (domain_status_ < 0) {
    set_last_error("%s", domain_error_.c_str());
    return nullptr;
  }
  return domain_.get();
}

RegCache *Engine::reg_cache() {
  if (zcopy_min_ == 0) return nullptr;
  std::lock_guard lock(domain_mu_);
  if (!reg_cache_tried_ && domain_) {
    reg_cache_tried_ = true;
    if (UnmapMonitor *monitor = UnmapMonitor::get())
      reg_cache_ = std::make_unique<RegCache>(domain_.get(), monitor, zcopy_cache_bytes_);
    else log::write(log::kInfo, "socket", "zero-copy sends off: no userfaultfd to watch registered memory");
  }
  return reg_cache_.get();
}

void Engine::start_background() {
  std::lock_guard lock(thread_mu_);
  if (thread_started_) return;
  if (background_waker_ < 0) background_waker_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  background_running_.store(true, std::memory_order_seq_cst);
  background_ = std::thread([this] { background_loop(); });
  (void)pthread_setname_np(background_.native_handle(), "gs-engine");  // for top -H, perf, gdb
  background_id_ = background_.get_id();
  background_.detach();
  thread_started_ = true;
}

int Engine::add(std::shared_ptr<StreamSocket> socket, bool cloexec) {
  const int fd = reserve_number(cloexec);
  return fd < 0 ? fd : add_at(std::move(socket), fd);
}

int Engine::reserve_number(bool cloexec) {
  const int fd = eventfd(0, EFD_NONBLOCK | (cloexec ? EFD_CLOEXEC : 0));
  return fd < 0 ? -errno : fd;
}

int Engine::add_at(std::shared_ptr<StreamSocket> socket, int fd) {
  {
    std::lock_guard lock(table_mu_);
    socket->fd_refs.fetch_add(1);
    int status;
    table_.put(fd, std::move(socket), &status);
    if (status < 0) {
      ::close(fd);
      return status;
    }
  }
  start_background();
  return fd;
}

std::shared_ptr<StreamSocket> Engine::find(int fd) const { return table_.get(fd); }

int Engine::close(int fd) {
  std::shared_ptr<StreamSocket> socket;
  {
    std::lock_guard lock(table_mu_);
    socket = table_.take(fd);
    if (!socket) return -EBADF;
    ::close(fd);  // under the lock: the number is not reused before its slot is empty
  }
  release(std::move(socket));
  return 0;
}

void Engine::release(std::shared_ptr<StreamSocket> socket) {
  if (socket->fd_refs.fetch_sub(1) != 1) return;  // another fd still refers to it
  socket->begin_close();
  if (socket->lingers()) {  // SO_LINGER: close blocks until flushed or the linger time passes
    while (!socket->close_finished()) sleep_us(100);
    return;
  }
  if (socket->close_finished()) return;
  {
    std::lock_guard lock(closing_mu_);
    closing_.push_back(std::move(socket));
  }
  kick();
}

int Engine::dup(int fd, int newfd, int flags) {
  std::shared_ptr<StreamSocket> socket = find(fd);
  if (!socket) return -EBADF;
  if (newfd == fd) return fd;
  std::shared_ptr<StreamSocket> replaced;
  int result;
  {
    std::lock_guard lock(table_mu_);
    result = newfd < 0 ? ::fcntl(fd, (flags & O_CLOEXEC) ? F_DUPFD_CLOEXEC : F_DUPFD, 0)
                       : ::dup3(fd, newfd, flags & O_CLOEXEC);
    if (result < 0) return -errno;
    int status;
    replaced = table_.put(result, socket, &status);  // dup2 over a socket closes it
    if (status < 0) {
      ::close(result);
      return status;
    }
    socket->fd_refs.fetch_add(1);
  }
  if (replaced) release(std::move(replaced));
  return result;
}

void Engine::kick() {
  background_epoch_.fetch_add(1, std::memory_order_seq_cst);
  if (background_sleeping_.load(std::memory_order_seq_cst) && background_waker_ >= 0) wake_waker(background_waker_);
}

// Keeps moving the sockets nobody calls into: listeners (handshakes up to the
// backlog), connects under way, bytes waiting for credits, keepalives, and
// closes (flush, DISCONNECT, teardown). Between passes it sleeps on those
// sockets' wait fds and its waker; an idle process costs no CPU.
void Engine::background_loop() {
  // Closing sockets wait on timers too (teardown linger, the peer's teardown).
  constexpr auto kClosingTick = std::chrono::milliseconds(5);
  // Events on the sockets it sleeps on wake it, and their timers bound its
  // sleep (background_need); beyond those it still looks now and then, a
  // safety net only: after 1 s, then twice as long after each pass that
  // moved nothing, up to 16 s.
  // Once a second, the look was what an idle process spent (0.25 ms of CPU
  // each on the VM, timer-aligned, so the tick sampling charged it a tick).
  constexpr std::chrono::milliseconds kIdleLookMin{1000}, kIdleLookMax{16000};
  auto idle_look = kIdleLookMin;
  std::vector<std::shared_ptr<StreamSocket>> work;  // progressed now and slept on
  std::vector<std::shared_ptr<StreamSocket>> due;   // progressed now only (timers)
  std::vector<pollfd> fds;
  while (!stopping_.load(std::memory_order_relaxed)) {
    const uint64_t epoch = background_epoch_.load(std::memory_order_seq_cst);
    auto look_by = Clock::now() + idle_look;
    bool did = false;
    work.clear();
    due.clear();
    table_.for_each([&](std::shared_ptr<StreamSocket> socket) {
      switch (socket->background_need(&look_by)) {
        case StreamSocket::Background::kEvents:
          work.push_back(std::move(socket));
          break;
        case StreamSocket::Background::kPass:
          due.push_back(std::move(socket));
          break;
        case StreamSocket::Background::kNone:
          break;
      }
    });
    for (auto &socket : work) did |= socket->try_background_progress();
    for (auto &socket : due) {
      // A pass that the application's own call took first (try_lock) is
      // retried soon, not after the next idle second.
      if (!socket->try_background_progress()) look_by = std::min(look_by, Clock::now() + kClosingTick);
    }
    {
      std::lock_guard lock(closing_mu_);
      for (size_t i = 0; i < closing_.size();) {
        if (closing_[i]->close_finished()) {
          closing_.erase(closing_.begin() + static_cast<long>(i));
          did = true;
        } else {
          work.push_back(closing_[i]);
          look_by = std::min(look_by, Clock::now() + kClosingTick);
          ++i;
        }
      }
    }
    idle_look = did ? kIdleLookMin : std::min(idle_look * 2, kIdleLookMax);
    if (did) continue;
    fds.clear();
    fds.push_back({background_waker_, POLLIN, 0});
    bool pending = false, no_fd = false;
    for (auto &socket : work) {
      const Armed armed = socket->arm_background_wait_fds(&fds);
      pending |= armed == Armed::kPending;
      no_fd |= armed == Armed::kNoFd;
    }
    if (pending) continue;
    background_sleeping_.store(true, std::memory_order_seq_cst);
    if (background_epoch_.load(std::memory_order_seq_cst) == epoch) {
      int64_t timeout_us =
          std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::microseconds>(look_by - Clock::now()).count());
      if (no_fd) timeout_us = std::min<int64_t>(timeout_us, 1000);
      sleep_on(fds, timeout_us);
    }
    background_sleeping_.store(false, std::memory_order_relaxed);
    uint64_t value;
    while (read(background_waker_, &value, sizeof value) > 0) {}
  }
  work.clear();
  due.clear();
  background_running_.store(false, std::memory_order_release);
}

// Ends the background thread's loop and waits for it to drop its sockets: a
// socket it held last would otherwise be freed by it during exit, after
// libfabric's destructor (which runs after every atexit handler) freed the
// provider's own lists.
void Engine::stop_background() {
  stopping_.store(true, std::memory_order_seq_cst);
  kick();
  std::thread::id id;
  {
    std::lock_guard lock(thread_mu_);
    if (!thread_started_) return;
    id = background_id_;
  }
  if (std::this_thread::get_id() == id) return;  // exit() called from the thread itself
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  while (background_running_.load(std::memory_order_acquire) && Clock::now() < deadline) sleep_us(100);
}

// At exit, give every connection the chance to flush and say DISCONNECT, as the
// kernel would for TCP, and release transport resources (shm segments).
void Engine::at_exit() {
  Engine &e = get();
  e.adopt_if_cloned();
  std::vector<std::shared_ptr<StreamSocket>> open;
  {
    std::lock_guard lock(e.table_mu_);
    e.table_.take_each([&](std::shared_ptr<StreamSocket> socket) { open.push_back(std::move(socket)); });
  }
  for (auto &socket : open) socket->begin_close();
  {
    std::lock_guard lock(e.closing_mu_);
    for (auto &socket : e.closing_) open.push_back(std::move(socket));
    e.closing_.clear();
  }
  const auto deadline = Clock::now() + std::chrono::seconds(std::min(e.close_flush_s_, 5));
  for (auto &socket : open)
    while (!socket->close_finished() && Clock::now() < deadline) sleep_us(100);
  e.stop_background();
  open.clear();
}

// fork(): hold every engine lock across the fork so the child's copies are
// consistent (the background thread is between passes, no fd is half-added).
void Engine::fork_prepare() {
  Engine &e = get();
  e.domain_mu_.lock();
  e.thread_mu_.lock();
  e.closing_mu_.lock();
  e.table_mu_.lock();
}

void Engine::fork_parent() {
  Engine &e = get();
  e.table_mu_.unlock();
  e.closing_mu_.unlock();
  e.thread_mu_.unlock();
  e.domain_mu_.unlock();
}

// The child abandons every inherited socket and the transport domain: nothing
// is flushed, disconnected or freed (that would act on the parent's live
// connections), and at exit there is nothing to close. Their fds stay open as
// plain eventfds (gs_* calls on them fail with ENOTSOCK) until the program
// closes them. The next socket opens a fresh domain and background thread.
void Engine::fork_child() {
  Engine &e = get();
  e.process_.store(getpid());
  e.table_.abandon();                                                  // its sockets are never freed, on purpose
  auto *abandoned = new std::vector<std::shared_ptr<StreamSocket>>();  // never freed either
  for (auto &socket : e.closing_) abandoned->push_back(std::move(socket));
  e.closing_.clear();
  if (e.domain_) e.inherited_transport_ = e.domain_->caps().name;
  (void)e.reg_cache_.release();  // its lock may be held by a parent's thread
  e.reg_cache_tried_ = false;
  (void)e.domain_.release();  // leaked with the sockets that point into it
  e.opened_domain_.store(nullptr);
  e.ring_budget_.forget_all();                 // the abandoned sockets' rings are not this process's
  StreamSocket::forget_connects_after_fork();  // the abandoned sockets' connects are not this process's
  e.domain_opened_ = false;
  e.domain_status_ = 0;
  e.domain_error_.clear();
  e.thread_started_ = false;
  e.background_ = std::thread();  // the parent's thread does not exist here
  e.background_id_ = {};
  e.background_running_ = false;
  // Eventfds are shared with the parent across fork: the child makes its own
  // (or the two processes would take each other's wake-ups).
  if (e.background_waker_ >= 0) ::close(e.background_waker_);
  e.background_waker_ = -1;
  e.background_sleeping_ = false;
  forget_thread_waker_after_fork();
  e.stopping_ = false;
  e.table_mu_.unlock();
  e.closing_mu_.unlock();
  e.thread_mu_.unlock();
  e.domain_mu_.unlock();
}

void Engine::adopt_if_cloned() {
  pid_t owner = process_.load(std::memory_order_relaxed);
  const pid_t self = getpid();  // the kernel's answer: glibc caches no pid
  if (owner == self) return;
  // A vfork() child runs on its parent's memory: this is the parent's state still.
  if (syscall(SYS_kcmp, self, owner, KCMP_VM, 0, 0) == 0) return;
  if (!process_.compare_exchange_strong(owner, self)) return;
  // The parent's threads are not in this process: a lock one of them held
  // stays held here. Nobody else holds one yet.
  new (&domain_mu_) std::mutex();
  new (&thread_mu_) std::mutex();
  new (&closing_mu_) std::mutex();
  new (&table_mu_) std::mutex();
  fork_prepare();
  fork_child();
  log::write(log::kInfo, "socket",
             "process %d made by a clone that ran no fork handlers: its parent's sockets are left to the parent",
             static_cast<int>(self));
}

}  // namespace gpusock::socket
