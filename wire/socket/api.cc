// The C ABI of gpusock's CPU sockets (include/gpusock/socket.h): look the fd
// up, call the socket, translate the status. No exception crosses this file.
#include <gpusock/socket.h>

#include "wire/socket/engine.h"
#include "wire/socket/ready_set.h"
#include "wire/socket/waiting.h"
#include "wire/spin_lock.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <new>
#include <cstdarg>
#include <cstring>
#include <vector>

using gpusock::socket::Armed;
using gpusock::socket::Engine;
using gpusock::socket::SleepMember;
using gpusock::socket::StreamSocket;

namespace {

// gs_wait_begin looks at the wait fds in one poll(2) before arming from this
// many on (below it, that call costs what it saves).
constexpr size_t kQuietLookMin = 4;

// Status contract: negative errno returned and mirrored into errno.
template <class T>
T finish(T status) {
  if (status < 0) errno = static_cast<int>(-status);
  return status;
}

template <class F>
auto guarded(F f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::bad_alloc &) {
    return finish<decltype(f())>(-ENOMEM);
  } catch (...) {
    return finish<decltype(f())>(-EIO);
  }
}

// Unregisters this thread's waker from the sockets, and takes its wake-ups
// (`slept`: the sleep's wait fds as poll(2) left them, if known; a waker not
// found readable there is not read: a wake-up that came later ends the next
// sleep at once, and that sleep reads it).
void end_sleep(const std::vector<std::shared_ptr<StreamSocket>> &sockets, const pollfd *slept = nullptr,
               size_t nslept = 0) {
  const int waker = gpusock::socket::thread_waker_fd();
  for (const auto &socket : sockets) socket->remove_sleeper(waker);
  // No wait fds polled (a transport without them: a timed step): read it.
  if (gpusock::socket::polled_readable(waker, slept, nslept)) gpusock::socket::drain_thread_waker();
}

void end_sleep(const std::vector<SleepMember> &members, size_t count) {
  std::vector<std::shared_ptr<StreamSocket>> sockets;
  for (size_t i = 0; i < count; ++i) sockets.push_back(members[i].socket);
  end_sleep(sockets);
}

// gs_wait_begin over sockets: the fds to sleep on (and `extra_fd`, if any)
// into wait[0..max) and their count, 0 (no wait fd: short steps), -EAGAIN
// or -ENOSPC.
int begin_sleep(const std::vector<SleepMember> &members, pollfd *wait, nfds_t max, int extra_fd = -1) {
  gpusock::socket::SpinBudget::stop_spinning();  // about to sleep: the spin slot goes back
  const int waker = gpusock::socket::thread_waker_fd();
  if (waker < 0) return -errno;
  (void)gpusock::socket::take_own_wake();
  std::vector<pollfd> look, out;
  for (const SleepMember &m : members) m.socket->list_wait_fds(&look);
  // Many wait fds: one poll(2) of them all first, and those found quiet are
  // armed without reading their wake-ups (Endpoint::arm_wait_fd_quiet): one
  // system call instead of one per endpoint.
  std::vector<int> quiet;
  if (look.size() >= kQuietLookMin && ::poll(look.data(), look.size(), 0) >= 0) {
    for (const pollfd &p : look)
      if (p.revents == 0) quiet.push_back(p.fd);
    std::sort(quiet.begin(), quiet.end());
  }
  bool no_fd = false;
  for (size_t i = 0; i < members.size(); ++i) {
    const SleepMember &m = members[i];
    const Armed armed = m.socket->prepare_sleep(waker, m.events, &out, quiet.empty() ? nullptr : &quiet, m.known_quiet);
    if (armed == Armed::kPending) {
      end_sleep(members, i);  // unregister what was registered
      return -EAGAIN;
    }
    no_fd |= armed == Armed::kNoFd;
  }
  // Arming a later member woke an earlier one (a socket listed twice, for
  // reading and for writing): that news is for a look, not a sleep.
  if (gpusock::socket::take_own_wake()) {
    end_sleep(members, members.size());
    return -EAGAIN;
  }
  if (no_fd) return 0;  // the sleepers stay registered until the sleep ends
  out.push_back({waker, POLLIN, 0});
  if (extra_fd >= 0) out.push_back({extra_fd, POLLIN, 0});
  std::sort(out.begin(), out.end(), [](const pollfd &a, const pollfd &b) { return a.fd < b.fd; });
  out.erase(std::unique(out.begin(), out.end(), [](const pollfd &a, const pollfd &b) { return a.fd == b.fd; }),
            out.end());
  if (out.size() > max) {
    end_sleep(members, members.size());
    return -ENOSPC;
  }
  std::copy(out.begin(), out.end(), wait);
  return static_cast<int>(out.size());
}

std::shared_ptr<StreamSocket> lookup(int fd, int *status) {
  auto socket = Engine::get().find(fd);
  if (!socket) *status = fcntl(fd, F_GETFD) < 0 ? -EBADF : -ENOTSOCK;
  return socket;
}

// Looks fd up and runs f on its socket under the status contract.
template <class T, class F>
T with_socket(int fd, F f) {
  return guarded([&]() -> T {
    int status = 0;
    auto socket = lookup(fd, &status);
    if (!socket) return finish<T>(status);
    const T result = static_cast<T>(f(*socket));
    if (result < 0 && result != -EAGAIN && result != -EINPROGRESS) {
      const std::string text = socket->error_text();
      if (!text.empty()) gpusock::socket::set_last_error("%s", text.c_str());
    }
    return finish<T>(result);
  });
}

int register_accepted(std::unique_ptr<StreamSocket> child, int flags, sockaddr *addr, socklen_t *addrlen, int number) {
  child->set_nonblocking(flags & SOCK_NONBLOCK);  // accepted sockets start blocking, as with TCP
  if (addr && addrlen) child->getpeername(addr, addrlen);
  return Engine::get().add_at(std::shared_ptr<StreamSocket>(std::move(child)), number);
}

}  // namespace

extern "C" {

const char *gs_last_error(void) { return gpusock::socket::last_error(); }

int gs_dup(int fd) {
  return guarded([&]() -> int { return finish(Engine::get().dup(fd, -1, 0)); });
}
int gs_dup2(int fd, int newfd) {
  if (newfd < 0) return finish(-EBADF);
  return guarded([&]() -> int { return finish(Engine::get().dup(fd, newfd, 0)); });
}
int gs_dup3(int fd, int newfd, int flags) {
  if (newfd < 0 || fd == newfd || (flags & ~O_CLOEXEC)) return finish(-EINVAL);
  return guarded([&]() -> int { return finish(Engine::get().dup(fd, newfd, flags)); });
}

int gs_is_socket(int fd) { return Engine::get().find(fd) != nullptr; }

int gs_socket(int domain, int type, int protocol) {
  return guarded([&]() -> int {
    if (domain != AF_INET && domain != AF_INET6) return finish(-EAFNOSUPPORT);
    if ((type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC)) != SOCK_STREAM) return finish(-ESOCKTNOSUPPORT);
    if (protocol != 0 && protocol != IPPROTO_TCP) return finish(-EPROTONOSUPPORT);
    Engine::get().adopt_if_cloned();
    int status = 0;
    auto *transport = Engine::get().domain(&status);
    if (!transport) return finish(status);
    auto socket = std::make_shared<StreamSocket>(Engine::get(), transport, domain);
    socket->set_nonblocking(type & SOCK_NONBLOCK);
    return finish(Engine::get().add(std::move(socket), type & SOCK_CLOEXEC));
  });
}

int gs_bind(int fd, const struct sockaddr *addr, socklen_t len) {
  return with_socket<int>(fd, [&](StreamSocket &sock) {
    auto *s = &sock;
    return s->bind(addr, len);
  });
}
int gs_listen(int fd, int backlog) {
  Engine::get().adopt_if_cloned();
  return with_socket<int>(fd, [&](StreamSocket &sock) {
    auto *s = &sock;
    return s->listen(backlog);
  });
}
int gs_connect(int fd, const struct sockaddr *addr, socklen_t len) {
  Engine::get().adopt_if_cloned();
  return with_socket<int>(fd, [&](StreamSocket &sock) {
    auto *s = &sock;
    return s->connect(addr, len);
  });
}
int gs_shutdown(int fd, int how) {
  return with_socket<int>(fd, [&](StreamSocket &sock) {
    auto *s = &sock;
    return s->shutdown(how);
  });
}

int gs_accept4(int fd, struct sockaddr *addr, socklen_t *addrlen, int flags) {
  Engine::get().adopt_if_cloned();
  return guarded([&]() -> int {
    int status = 0;
    auto listener = lookup(fd, &status);
    if (!listener) return finish(status);
    if (flags & ~(SOCK_NONBLOCK | SOCK_CLOEXEC)) return finish(-EINVAL);
    std::unique_ptr<StreamSocket> child;
    status = listener->accept(&child, !listener->nonblocking());
    if (status < 0) return finish(status);
    // A connection leaves the queue only with a number to go to: without one
    // it goes back to the head, as the kernel's accept fails with EMFILE and
    // leaves it queued.
    const int number = Engine::get().reserve_number(flags & SOCK_CLOEXEC);
    if (number < 0) {
      listener->return_accepted(std::move(child));
      return finish(number);
    }
    return finish(register_accepted(std::move(child), flags, addr, addrlen, number));
  });
}

int gs_accept(int fd, struct sockaddr *addr, socklen_t *addrlen) { return gs_accept4(fd, addr, addrlen, 0); }

int gs_close(int fd) {
  Engine::get().adopt_if_cloned();
  return guarded([&]() -> int { return finish(Engine::get().close(fd)); });
}

ssize_t gs_recvmsg(int fd, struct msghdr *msg, int flags) {
  if (!msg) return finish<ssize_t>(-EFAULT);
  msg->msg_controllen = 0;  // no ancillary data on stream rsockets
  msg->msg_flags = 0;
  return with_socket<ssize_t>(fd, [&](StreamSocket &sock) {
    auto *s = &sock;
    return s->recv(msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
  });
}

ssize_t gs_sendmsg(int fd, const struct msghdr *msg, int flags) {
  if (!msg) return finish<ssize_t>(-EFAULT);
  if (msg->msg_control && msg->msg_controllen) return finish<ssize_t>(-ENOTSUP);
  return with_socket<ssize_t>(fd, [&](StreamSocket &sock) {
    auto *s = &sock;
    return s->send(msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
  });
}

ssize_t gs_recv(int fd, void *buf, size_t len, int flags) {
  iovec iov{buf, len};
  return with_socket<ssize_t>(fd, [&](StreamSocket &sock) {
    auto *s = &sock;
    return s->recv(&iov, 1, flags);
  });
}

ssize_t gs_recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *src, socklen_t *srclen) {
  iovec iov{buf, len};
  return with_socket<ssize_t>(fd, [&](StreamSocket &sock) {
    auto *s = &sock;
    return ([&]() -> ssize_t {
      ssize_t n = s->recv(&iov, 1, flags);
      if (n >= 0 && src && srclen) s->getpeername(src, srclen);
      return n;
    }());
  });
}

ssize_t gs_send(int fd, const void *buf, size_t len, int flags) {
  iovec iov{const_cast<void *>(buf), len};
  return with_socket<ssize_t>(fd, [&](StreamSocket &sock) {
    auto *s = &sock;
    return s->send(&iov, 1, flags);
  });
}

ssize_t gs_sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *, socklen_t) {
  return gs_send(fd, buf, len, flags);  // connected stream: the address is ignored, as TCP does
}

ssize_t gs_read(int fd, void *buf, size_t count) { return gs_recv(fd, buf, count, 0); }
ssize_t gs_write(int fd, const void *buf, size_t count) { return gs_send(fd, buf, count, 0); }
ssize_t gs_readv(int fd, const struct iovec *iov, int iovcnt) {
  if (iovcnt < 0 || iovcnt > IOV_MAX) return finish<ssize_t>(-EINVAL);
  return with_socket<ssize_t>(fd, [&](StreamSocket &sock) {
    auto *s = &sock;
    return s->recv(iov, iovcnt, 0);
  });
}
ssize_t gs_writev(int fd, const struct iovec *iov, int iovcnt) {
  if (iovcnt < 0 || iovcnt > IOV_MAX) return finish<ssize_t>(-EINVAL);
  return with_socket<ssize_t>(fd, [&](StreamSocket &sock) {
    auto *s = &sock;
    return s->send(iov, iovcnt, 0);
  });
}

int gs_getpeername(int fd, struct sockaddr *addr, socklen_t *len) {
  return with_socket<int>(fd, [&](StreamSocket &sock) {
    auto *s = &sock;
    return s->getpeername(addr, len);
  });
}
int gs_getsockname(int fd, struct sockaddr *addr, socklen_t *len) {
  return with_socket<int>(fd, [&](StreamSocket &sock) {
    auto *s = &sock;
    return s->getsockname(addr, len);
  });
}
int gs_setsockopt(int fd, int level, int name, const void *val, socklen_t len) {
  return with_socket<int>(fd, [&](StreamSocket &sock) {
    auto *s = &sock;
    return s->setsockopt(level, name, val, len);
  });
}
int gs_getsockopt(int fd, int level, int name, void *val, socklen_t *len) {
  return with_socket<int>(fd, [&](StreamSocket &sock) {
    auto *s = &sock;
    return s->getsockopt(level, name, val, len);
  });
}

int gs_fcntl(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  const long arg = (cmd == F_SETFL || cmd == F_SETFD) ? va_arg(ap, long) : 0;
  va_end(ap);
  return with_socket<int>(fd, [&](StreamSocket &sock) {
    auto *s = &sock;
    return ([&]() -> int {
      switch (cmd) {
        case F_GETFL:
          return O_RDWR | (s->nonblocking() ? O_NONBLOCK : 0);
        case F_SETFL:
          s->set_nonblocking(arg & O_NONBLOCK);
          return 0;
        case F_GETFD:
        case F_SETFD: {  // FD_CLOEXEC lives on the reserved kernel fd
          const int r = ::fcntl(fd, cmd, static_cast<int>(arg));
          return r < 0 ? -errno : r;
        }
        default:
          return -EINVAL;
      }
    }());
  });
}

int gs_wait_begin(const struct pollfd *fds, nfds_t nfds, struct pollfd *wait, nfds_t max) {
  return guarded([&]() -> int {
    std::vector<SleepMember> members;
    for (nfds_t i = 0; i < nfds; ++i)
      if (fds[i].fd >= 0)
        if (auto socket = Engine::get().find(fds[i].fd)) members.push_back({std::move(socket), fds[i].events, false});
    return finish(begin_sleep(members, wait, max));
  });
}

void gs_wait_end_polled(const struct pollfd *fds, nfds_t nfds, const struct pollfd *slept, nfds_t nslept) {
  guarded([&]() -> int {
    std::vector<std::shared_ptr<StreamSocket>> sockets;
    for (nfds_t i = 0; i < nfds; ++i)
      if (fds[i].fd >= 0)
        if (auto socket = Engine::get().find(fds[i].fd)) sockets.push_back(std::move(socket));
    end_sleep(sockets, slept, nslept);
    return 0;
  });
}

void gs_wait_end(const struct pollfd *fds, nfds_t nfds) { gs_wait_end_polled(fds, nfds, nullptr, 0); }

struct gs_ready_set {
  gpusock::socket::ReadySet set;
};

gs_ready_set_t *gs_ready_set_create(void) {
  auto *set = new (std::nothrow) gs_ready_set;
  if (set == nullptr) errno = ENOMEM;
  return set;
}

void gs_ready_set_destroy(gs_ready_set_t *set) { delete set; }

int gs_ready_set_ctl(gs_ready_set_t *set, int op, int fd, short events) {
  if (set == nullptr) return finish(-EINVAL);
  return guarded([&] { return finish(set->set.ctl(op, fd, events)); });
}

int gs_ready_set_wait_begin(gs_ready_set_t *set, struct pollfd *wait, nfds_t max) {
  if (set == nullptr || wait == nullptr) return finish(-EINVAL);
  return guarded([&] {
    std::vector<SleepMember> members;
    int group_fd = -1;
    if (!set->set.begin_sleep(&members, &group_fd)) return finish(-EAGAIN);  // news since the last look
    const int n = begin_sleep(members, wait, max, group_fd);
    if (n < 0) set->set.end_sleep(nullptr);  // begin_sleep unregistered what it registered
    return finish(n);
  });
}

void gs_ready_set_wait_end_polled(gs_ready_set_t *set, const struct pollfd *slept, nfds_t nslept) {
  if (set == nullptr) return;
  guarded([&] {
    std::vector<std::shared_ptr<StreamSocket>> armed;
    if (set->set.end_sleep(&armed, slept, nslept)) end_sleep(armed, slept, nslept);
    return 0;
  });
}

void gs_ready_set_wait_end(gs_ready_set_t *set) { gs_ready_set_wait_end_polled(set, nullptr, 0); }

int gs_ready_set_poll(gs_ready_set_t *set, struct pollfd *out, int max, int *all) {
  if (set == nullptr || out == nullptr || max <= 0) return finish(-EINVAL);
  return guarded([&] {
    bool full = false;
    const int n = set->set.poll(out, max, &full);
    if (all != nullptr) *all = full ? 1 : 0;
    return finish(n);
  });
}

long gs_spin_budget_us(void) { return static_cast<long>(gpusock::socket::SpinBudget::next_us()); }
void gs_spin_record(long waited_us) { gpusock::socket::SpinBudget::record(waited_us); }
int gs_spin_yield(void) { return gpusock::socket::SpinBudget::yield_core() ? 0 : 1; }
int gs_spin_lock(pthread_spinlock_t *lock) { return gpusock::wire::yielding_spin_lock(lock); }

void gs_fork_prepare(void) { Engine::fork_prepare(); }
void gs_fork_parent(void) { Engine::fork_parent(); }
void gs_fork_child(void) { Engine::fork_child(); }

int gs_poll(struct pollfd *fds, nfds_t nfds, int timeout) {
  return guarded([&]() -> int {
    std::vector<std::shared_ptr<StreamSocket>> sockets(nfds);
    // One system call per pass looks at the kernel's fds (batch's first
    // kernel_index.size() entries) and, for sockets whose transport lets a
    // quiet wait fd stand for an idle endpoint (tcp), at those fds (the
    // rest): only sockets found readable are polled by their transport (a
    // system call each on tcp), so a pass over 1,000 idle connections costs
    // one poll(2), as it does for kernel sockets.
    std::vector<pollfd> batch, gs;
    std::vector<nfds_t> kernel_index;
    for (nfds_t i = 0; i < nfds; ++i) {
      fds[i].revents = 0;
      if (fds[i].fd < 0) continue;
      sockets[i] = Engine::get().find(fds[i].fd);
      if (sockets[i]) {
        gs.push_back(fds[i]);
      } else {
        batch.push_back(fds[i]);
        kernel_index.push_back(i);
      }
    }
    const size_t kernel_count = batch.size();
    std::vector<int> look_at(nfds, -1);  // a socket's entry in batch, or -1
    for (nfds_t i = 0; i < nfds; ++i) {
      if (!sockets[i]) continue;
      if (const int fd = sockets[i]->look_fd(); fd >= 0) {
        look_at[i] = static_cast<int>(batch.size());
        batch.push_back({fd, POLLIN, 0});
      }
    }
    using gpusock::socket::Clock;
    const auto start = Clock::now();
    const auto deadline = timeout < 0 ? Clock::time_point::max() : start + std::chrono::milliseconds(timeout);
    auto spin_until = start + std::chrono::microseconds(gpusock::socket::SpinBudget::next_us());
    std::vector<pollfd> sleep_fds;
    unsigned sleeps = 0;
    for (unsigned step = 0;; ++step) {
      int ready = 0;
      if (!batch.empty() && ::poll(batch.data(), batch.size(), 0) < 0) return finish(-errno);
      for (size_t k = 0; k < kernel_count; ++k)
        if ((fds[kernel_index[k]].revents = batch[k].revents)) ++ready;
      for (nfds_t i = 0; i < nfds; ++i) {
        if (!sockets[i]) continue;
        const int quiet_fd = look_at[i] >= 0 && batch[look_at[i]].revents == 0 ? batch[look_at[i]].fd : -1;
        if ((fds[i].revents = sockets[i]->ready_events(fds[i].events, quiet_fd))) ++ready;
      }
      const auto now = Clock::now();
      const auto waited_us = std::chrono::duration_cast<std::chrono::microseconds>(now - start).count();
      if (ready || timeout == 0 || now >= deadline) {
        gpusock::socket::SpinBudget::record(waited_us);
        return ready;
      }
      if (now < spin_until) {
        if (!gpusock::socket::spin_step(step, now)) spin_until = now;  // another thread wants this core: sleep
        continue;
      }
      // Sleep on the kernel fds, the sockets' wait fds and this thread's waker.
      sleep_fds.assign(gs.size() + 8, pollfd{});
      int n = gs.empty() ? 0 : gs_wait_begin(gs.data(), gs.size(), sleep_fds.data(), sleep_fds.size());
      while (n == -ENOSPC) {
        sleep_fds.resize(sleep_fds.size() * 2);
        n = gs_wait_begin(gs.data(), gs.size(), sleep_fds.data(), sleep_fds.size());
      }
      if (n == -EAGAIN) continue;  // a socket got ready meanwhile
      if (n < 0) {
        gpusock::socket::SpinBudget::record(waited_us);
        return finish(n);
      }
      sleep_fds.resize(static_cast<size_t>(n));
      int64_t timeout_us = deadline == Clock::time_point::max()
                               ? -1
                               : std::chrono::duration_cast<std::chrono::microseconds>(deadline - now).count() + 1;
      if (n == 0 && !gs.empty())  // a transport without wait fds: short steps
        timeout_us = timeout_us < 0 ? gpusock::socket::no_fd_step_us(sleeps)
                                    : std::min(timeout_us, gpusock::socket::no_fd_step_us(sleeps));
      ++sleeps;
      sleep_fds.insert(sleep_fds.end(), batch.begin(), batch.begin() + static_cast<long>(kernel_count));
      const int slept = gpusock::socket::sleep_on(sleep_fds, timeout_us);
      if (!gs.empty()) gs_wait_end_polled(gs.data(), gs.size(), sleep_fds.data(), static_cast<nfds_t>(n));
      if (slept == -EINTR) {
        gpusock::socket::SpinBudget::record(waited_us);
        return finish(-EINTR);
      }
    }
  });
}

}  // extern "C"
