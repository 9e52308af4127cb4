// Top layer: the data calls (read, write, readv, writev, recv, send, recvfrom,
// sendto, recvmsg, sendmsg, sendfile and the fortified entry points). On a
// gpusock socket each is one receive path (recv_iov) or one send path
// (send_iov); blocking ones are non-blocking attempts and the shim's waits.
#include "preload/library.h"
#include "preload/relay_name.h"
#include "preload/wait.h"

#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

namespace gpusock::preload {

namespace {

// Every receive-side call on a gpusock fd. call(flags) makes one attempt.
template <class F>
ssize_t gs_input(int fd, int flags, F call) {
  if (FdSlot *s = slot(fd)) {
    s->rgen.fetch_add(1, std::memory_order_relaxed);
    s->rtouch.fetch_add(1, std::memory_order_relaxed);
  }
  if ((flags & MSG_DONTWAIT) || gs_nonblocking(fd)) {
    Inside guard;
    return libc_result(call(flags));
  }
  const CallLimit limit = call_limit(fd, true);
  if (flags & MSG_WAITALL) flags &= ~MSG_WAITALL;  // handled below by the caller's loop
  for (;;) {
    ssize_t r;
    {
      Inside guard;
      r = call(flags | MSG_DONTWAIT);
    }
    if (r != -EAGAIN) return libc_result(r);
    const int w = blocking_wait(fd, POLLIN, limit);
    if (w < 0) return libc_result<ssize_t>(w);
    if (!is_gs(fd)) return libc_result<ssize_t>(-EBADF);  // closed by another thread meanwhile
  }
}

// The part of iov after `skip` bytes.
std::vector<iovec> iov_after(const iovec *iov, int iovcnt, size_t skip) {
  std::vector<iovec> out;
  for (int i = 0; i < iovcnt; ++i) {
    if (skip >= iov[i].iov_len) {
      skip -= iov[i].iov_len;
      continue;
    }
    out.push_back({static_cast<char *>(iov[i].iov_base) + skip, iov[i].iov_len - skip});
    skip = 0;
  }
  return out;
}

size_t iov_bytes(const iovec *iov, int iovcnt) {
  size_t n = 0;
  for (int i = 0; i < iovcnt; ++i) n += iov[i].iov_len;
  return n;
}

ssize_t raw_send(int fd, const iovec *iov, size_t iovcnt, int flags) {
  msghdr m{};
  m.msg_iov = const_cast<iovec *>(iov);
  m.msg_iovlen = iovcnt;
  Inside guard;
  return gs().sendmsg(fd, &m, flags);
}

ssize_t raw_recv(int fd, const iovec *iov, size_t iovcnt, int flags) {
  msghdr m{};
  m.msg_iov = const_cast<iovec *>(iov);
  m.msg_iovlen = iovcnt;
  return gs().recvmsg(fd, &m, flags);
}

ssize_t recv_iov(int fd, const iovec *iov, int iovcnt, int flags) {
  if (!(flags & MSG_WAITALL) || (flags & (MSG_PEEK | MSG_DONTWAIT)))
    return gs_input(fd, flags, [&](int f) { return raw_recv(fd, iov, static_cast<size_t>(iovcnt), f); });
  // MSG_WAITALL on a blocking socket: until the buffer is full, EOF, an error or a signal.
  const size_t total = iov_bytes(iov, iovcnt);
  size_t done = 0;
  while (done < total) {
    auto rest = iov_after(iov, iovcnt, done);
    const ssize_t r =
        gs_input(fd, flags & ~MSG_WAITALL, [&](int f) { return raw_recv(fd, rest.data(), rest.size(), f); });
    if (r <= 0) return done > 0 ? static_cast<ssize_t>(done) : r;
    done += static_cast<size_t>(r);
  }
  return static_cast<ssize_t>(done);
}

ssize_t send_iov(int fd, const iovec *iov, int iovcnt, int flags) {
  if (FdSlot *s = slot(fd)) s->wgen.fetch_add(1, std::memory_order_relaxed);
  const int call_flags = flags & ~MSG_NOSIGNAL;
  ssize_t r;
  if ((flags & MSG_DONTWAIT) || gs_nonblocking(fd)) {
    r = raw_send(fd, iov, static_cast<size_t>(iovcnt), call_flags);
  } else {
    // A blocking send returns when everything is queued, or early (with the
    // count so far) on a signal, a timeout or an error.
    const CallLimit limit = call_limit(fd, false);
    const size_t total = iov_bytes(iov, iovcnt);
    size_t done = 0;
    for (;;) {
      auto rest = iov_after(iov, iovcnt, done);
      r = raw_send(fd, rest.data(), rest.size(), call_flags | MSG_DONTWAIT);
      if (r > 0) {
        done += static_cast<size_t>(r);
        if (done >= total) break;
        continue;
      }
      if (r == 0 && total == 0) break;
      if (r != -EAGAIN) break;
      const int w = blocking_wait(fd, POLLOUT, limit);
      if (w < 0 || !is_gs(fd)) {  // or closed by another thread meanwhile
        r = w < 0 ? w : -EBADF;
        break;
      }
    }
    if (done > 0) r = static_cast<ssize_t>(done);
  }
  // A write on a connection that can no longer send raises SIGPIPE, as TCP does.
  if (r == -EPIPE && !(flags & MSG_NOSIGNAL)) raise(SIGPIPE);
  return libc_result(r);
}

// readv/writev refuse an iovcnt the kernel would (EINVAL).
bool bad_iovcnt(int iovcnt) {
  if (iovcnt >= 0 && iovcnt <= IOV_MAX) return false;
  errno = EINVAL;
  return true;
}

}  // namespace

}  // namespace gpusock::preload

using namespace gpusock::preload;

GS_EXPORT ssize_t read(int fd, void *buf, size_t n) {
  if (t_inside || kind_of(fd) != kGs) return real().read(fd, buf, n);
  iovec iov{buf, n};
  return recv_iov(fd, &iov, 1, 0);
}

GS_EXPORT ssize_t write(int fd, const void *buf, size_t n) {
  if (t_inside || kind_of(fd) != kGs) return real().write(fd, buf, n);
  iovec iov{const_cast<void *>(buf), n};
  return send_iov(fd, &iov, 1, 0);
}

GS_EXPORT ssize_t readv(int fd, const iovec *iov, int iovcnt) {
  if (t_inside || kind_of(fd) != kGs) return real().readv(fd, iov, iovcnt);
  if (bad_iovcnt(iovcnt)) return -1;
  return recv_iov(fd, iov, iovcnt, 0);
}

GS_EXPORT ssize_t writev(int fd, const iovec *iov, int iovcnt) {
  if (t_inside || kind_of(fd) != kGs) return real().writev(fd, iov, iovcnt);
  if (bad_iovcnt(iovcnt)) return -1;
  return send_iov(fd, iov, iovcnt, 0);
}

GS_EXPORT ssize_t recv(int fd, void *buf, size_t n, int flags) {
  if (t_inside || kind_of(fd) != kGs) return real().recv(fd, buf, n, flags);
  iovec iov{buf, n};
  return recv_iov(fd, &iov, 1, flags);
}

GS_EXPORT ssize_t send(int fd, const void *buf, size_t n, int flags) {
  if (t_inside || kind_of(fd) != kGs) return real().send(fd, buf, n, flags);
  iovec iov{const_cast<void *>(buf), n};
  return send_iov(fd, &iov, 1, flags);
}

GS_EXPORT ssize_t recvfrom(int fd, void *buf, size_t n, int flags, sockaddr *from, socklen_t *fromlen) {
  if (t_inside || kind_of(fd) != kGs) return real().recvfrom(fd, buf, n, flags, from, fromlen);
  iovec iov{buf, n};
  const ssize_t r = recv_iov(fd, &iov, 1, flags);
  if (r >= 0 && from && fromlen) {
    Inside guard;
    gs().getpeername(fd, from, fromlen);
  }
  return r;
}

namespace {

// A fork relay's child end is a connected AF_UNIX stream, which refuses a
// destination address (EISCONN) where TCP ignores it.
bool refused_address_on_relay_end(ssize_t r, int fd, const void *to) {
  return r < 0 && errno == EISCONN && to && !t_inside && is_relay_end(fd);
}

}  // namespace

GS_EXPORT ssize_t sendto(int fd, const void *buf, size_t n, int flags, const sockaddr *to, socklen_t tolen) {
  if (t_inside || kind_of(fd) != kGs) {
    const ssize_t r = real().sendto(fd, buf, n, flags, to, tolen);
    if (refused_address_on_relay_end(r, fd, to)) return real().sendto(fd, buf, n, flags, nullptr, 0);
    return r;
  }
  iovec iov{const_cast<void *>(buf), n};
  return send_iov(fd, &iov, 1, flags);  // connected stream: the address is ignored, as TCP does
}

GS_EXPORT ssize_t recvmsg(int fd, msghdr *msg, int flags) {
  if (t_inside || kind_of(fd) != kGs) return real().recvmsg(fd, msg, flags);
  if (!msg) {
    errno = EFAULT;
    return -1;
  }
  const ssize_t r = recv_iov(fd, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
  if (r >= 0) {
    msg->msg_namelen = 0;  // a connected stream fills no source address
    msg->msg_controllen = 0;
    msg->msg_flags = 0;
  }
  return r;
}

GS_EXPORT ssize_t sendmsg(int fd, const msghdr *msg, int flags) {
  if (t_inside || kind_of(fd) != kGs) {
    const ssize_t r = real().sendmsg(fd, msg, flags);
    if (!msg || !refused_address_on_relay_end(r, fd, msg->msg_name)) return r;
    msghdr without_address = *msg;
    without_address.msg_name = nullptr;
    without_address.msg_namelen = 0;
    return real().sendmsg(fd, &without_address, flags);
  }
  if (!msg) {
    errno = EFAULT;
    return -1;
  }
  if (msg->msg_control && msg->msg_controllen) {
    errno = EOPNOTSUPP;  // no ancillary data on gpusock streams
    return -1;
  }
  return send_iov(fd, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
}

// sendfile to a gpusock socket: read the file and send it.
GS_EXPORT ssize_t sendfile(int out, int in, off_t *offset, size_t count) {
  const Real &R = real();
  if (t_inside) return R.sendfile(out, in, offset, count);
  if (kind_of(in) == kGs) {
    errno = EINVAL;  // sockets are not a sendfile source
    return -1;
  }
  if (kind_of(out) != kGs) return R.sendfile(out, in, offset, count);
  static thread_local std::vector<char> buf;
  if (buf.empty()) buf.resize(64 * 1024);
  off_t pos = offset ? *offset : 0;
  size_t done = 0;
  while (done < count) {
    const size_t want = std::min(count - done, buf.size());
    const ssize_t got = offset ? pread(in, buf.data(), want, pos) : R.read(in, buf.data(), want);
    if (got < 0) {
      if (done) break;
      return -1;
    }
    if (got == 0) break;
    iovec iov{buf.data(), static_cast<size_t>(got)};
    const ssize_t sent = send_iov(out, &iov, 1, done ? MSG_DONTWAIT : 0);
    if (sent < 0) {
      if (!offset) lseek(in, -got, SEEK_CUR);
      if (done) break;
      return -1;
    }
    if (sent < got && !offset) lseek(in, -(got - sent), SEEK_CUR);
    done += static_cast<size_t>(sent);
    pos += sent;
    if (sent < got) break;
  }
  if (offset) *offset = pos;
  return static_cast<ssize_t>(done);
}

GS_EXPORT ssize_t sendfile64(int out, int in, off_t *offset, size_t count) { return sendfile(out, in, offset, count); }

// Fortified entry points (_FORTIFY_SOURCE builds call these instead).
extern "C" void __chk_fail(void) __attribute__((noreturn));

GS_EXPORT ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen) {
  if (n > buflen) __chk_fail();
  return read(fd, buf, n);
}

GS_EXPORT ssize_t __recv_chk(int fd, void *buf, size_t n, size_t buflen, int flags) {
  if (n > buflen) __chk_fail();
  return recv(fd, buf, n, flags);
}

GS_EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t n, size_t buflen, int flags, sockaddr *from,
                                 socklen_t *fromlen) {
  if (n > buflen) __chk_fail();
  return recvfrom(fd, buf, n, flags, from, fromlen);
}
