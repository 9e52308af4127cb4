// Top layer: the fd calls (close, close_range, closefrom, dup, dup2, dup3,
// fcntl), which keep the shim's tables in step with the fd numbers, and the
// calls that make kernel objects the transport may make for itself
// (socketpair, eventfd, pipe, pipe2, epoll_create, epoll_create1), which only
// note those.
#include "preload/fork.h"
#include "preload/library.h"
#include "preload/routing.h"

#include <fcntl.h>
#include <stdarg.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

using namespace gpusock::preload;

namespace {

// newfd is a kernel-level copy of oldfd (of kind k): an epoll fd or a dormant
// listener brings its shim state along.
void note_dup(uint8_t k, int oldfd, int newfd) {
  if (k == kEpoll) epoll_dup_epfd(oldfd, newfd);
  if (k == kDormant)
    if (auto spec = dormant_spec(oldfd)) add_dormant(newfd, std::move(spec));
}

}  // namespace

GS_EXPORT int close(int fd) {
  if (t_inside) {
    if (fd == t_skip_close) {
      t_skip_close = -1;
      return 0;
    }
    if (kind_of(fd) == kTransport) set_kind(fd, kKernel);
    return real().close(fd);
  }
  if (const uint8_t k = kind_of(fd); (k == kGs || k == kDormant) && adopt_if_cloned() == Tables::kVforkChild)
    return real().close(fd);
  return close_fd(fd);
}

GS_EXPORT int close_range(unsigned first, unsigned last, int flags) {
  const Real &R = real();
  if (!R.close_range) {
    errno = ENOSYS;
    return -1;
  }
  if (t_inside || (flags & CLOSE_RANGE_CLOEXEC)) return R.close_range(first, last, flags);
  std::vector<int> ours;
  for (auto &[fd, info] : all_gs_fds())
    if (static_cast<unsigned>(fd) >= first && static_cast<unsigned>(fd) <= last) ours.push_back(fd);
  for (int fd : ours) close_fd(fd);
  // Pending and epoll fds: drop the shim's state; the kernel closes them below.
  for_each_slot(first, last, [](int fd, FdSlot &s) {
    const uint8_t k = s.kind.load(std::memory_order_acquire);
    if (k == kPending || k == kEpoll || k == kDormant) drop_fd_state(fd);
  });
  return R.close_range(first, last, flags);
}

GS_EXPORT void closefrom(int lowfd) {
  if (lowfd < 0) lowfd = 0;
  if (close_range(static_cast<unsigned>(lowfd), ~0u, 0) < 0) {
    const int top = static_cast<int>(sysconf(_SC_OPEN_MAX));
    for (int fd = lowfd; fd < top; ++fd) close(fd);
  }
}

GS_EXPORT int dup(int fd) {
  const Real &R = real();
  if (t_inside) return R.dup(fd);
  const uint8_t k = kind_of(fd);
  if (k == kGs) {
    int r;
    {
      Inside guard;
      r = gs().dup(fd);
    }
    if (r < 0) return libc_result(r);
    attach_gs_fd(r, sock_info(fd));
    return r;
  }
  const int r = R.dup(fd);
  if (r >= 0) note_dup(k, fd, r);
  return r;
}

namespace {

int dup_common(int oldfd, int newfd, int flags, bool is_dup3) {
  const Real &R = real();
  const uint8_t k = kind_of(oldfd);
  if (oldfd == newfd) {
    if (is_dup3) {
      errno = EINVAL;
      return -1;
    }
    return R.fcntl(oldfd, F_GETFD) < 0 ? -1 : newfd;
  }
  if (k == kGs) {
    if (R.fcntl(oldfd, F_GETFD) < 0) return -1;
    auto info = sock_info(oldfd);
    drop_fd_state(newfd);  // a gpusock target is released by the library's dup itself
    int r;
    {
      Inside guard;
      r = gs().dup3(oldfd, newfd, flags);
    }
    if (r < 0) return libc_result(r);
    attach_gs_fd(newfd, info);
    return newfd;
  }
  if (R.fcntl(oldfd, F_GETFD) < 0) return -1;  // EBADF before touching newfd
  release_gs_target(newfd);
  const int r = is_dup3 ? R.dup3(oldfd, newfd, flags) : R.dup2(oldfd, newfd);
  if (r >= 0) note_dup(k, oldfd, newfd);
  return r;
}

}  // namespace

GS_EXPORT int dup2(int oldfd, int newfd) {
  if (t_inside) return real().dup2(oldfd, newfd);
  return dup_common(oldfd, newfd, 0, false);
}

GS_EXPORT int dup3(int oldfd, int newfd, int flags) {
  if (t_inside) return real().dup3(oldfd, newfd, flags);
  return dup_common(oldfd, newfd, flags, true);
}

namespace {

int fcntl_common(int fd, int cmd, void *arg) {
  const Real &R = real();
  if (t_inside) return R.fcntl(fd, cmd, arg);
  const uint8_t k = kind_of(fd);
  if (k == kGs) {
    const long v = reinterpret_cast<long>(arg);
    switch (cmd) {
      case F_GETFL:
      case F_GETFD:
      case F_SETFD: {
        Inside guard;
        return libc_result(gs().fcntl(fd, cmd, v));
      }
      case F_SETFL: {
        if (FdSlot *s = slot(fd)) s->wgen.fetch_add(1, std::memory_order_relaxed);
        Inside guard;
        return libc_result(gs().fcntl(fd, cmd, v & O_NONBLOCK));
      }
      case F_DUPFD:
      case F_DUPFD_CLOEXEC: {
        // The kernel picks the number (>= arg); the library then adopts it.
        const int n = R.fcntl(fd, cmd, arg);
        if (n < 0) return n;
        int r;
        {
          Inside guard;
          r = gs().dup3(fd, n, cmd == F_DUPFD_CLOEXEC ? O_CLOEXEC : 0);
        }
        if (r < 0) {
          R.close(n);
          return libc_result(r);
        }
        attach_gs_fd(n, sock_info(fd));
        return n;
      }
      default:
        return R.fcntl(fd, cmd, arg);  // F_SETOWN, locks...: the reserved fd answers
    }
  }
  const int r = R.fcntl(fd, cmd, arg);
  if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)) note_dup(k, fd, r);
  return r;
}

}  // namespace

GS_EXPORT int fcntl(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  void *arg = va_arg(ap, void *);
  va_end(ap);
  return fcntl_common(fd, cmd, arg);
}

// The same function under its large-file name.
GS_EXPORT int fcntl64(int fd, int cmd, ...) __attribute__((alias("fcntl")));

// Kernel objects the transport makes for itself are remembered (fork).
GS_EXPORT int socketpair(int domain, int type, int protocol, int sv[2]) {
  const int r = real().socketpair(domain, type, protocol, sv);
  if (r == 0 && transport_caller(__builtin_return_address(0))) {
    mark_transport_fd(sv[0]);
    mark_transport_fd(sv[1]);
  }
  return r;
}

GS_EXPORT int eventfd(unsigned initval, int flags) {
  const int fd = real().eventfd(initval, flags);
  if (fd >= 0 && !(flags & EFD_CLOEXEC) && transport_caller(__builtin_return_address(0))) mark_transport_fd(fd);
  return fd;
}

GS_EXPORT int pipe(int fds[2]) {
  const int r = real().pipe(fds);
  if (r == 0 && transport_caller(__builtin_return_address(0))) {
    mark_transport_fd(fds[0]);
    mark_transport_fd(fds[1]);
  }
  return r;
}

GS_EXPORT int pipe2(int fds[2], int flags) {
  const int r = real().pipe2(fds, flags);
  if (r == 0 && !(flags & O_CLOEXEC) && transport_caller(__builtin_return_address(0))) {
    mark_transport_fd(fds[0]);
    mark_transport_fd(fds[1]);
  }
  return r;
}

GS_EXPORT int epoll_create(int size) {
  const int fd = real().epoll_create(size);
  if (fd >= 0 && transport_caller(__builtin_return_address(0))) mark_transport_fd(fd);
  return fd;
}

GS_EXPORT int epoll_create1(int flags) {
  const int fd = real().epoll_create1(flags);
  if (fd >= 0 && !(flags & EPOLL_CLOEXEC) && transport_caller(__builtin_return_address(0))) mark_transport_fd(fd);
  return fd;
}
