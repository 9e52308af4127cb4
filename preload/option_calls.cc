// Top layer: the control calls (shutdown, getsockname, getpeername,
// setsockopt, getsockopt, ioctl, fstat). Options of a pending socket go to the
// kernel and are recorded for the upgrade; on a gpusock socket the library
// answers, with the shim emulating what it has no notion of.
#include "preload/library.h"
#include "preload/listeners.h"
#include "preload/relay_name.h"
#include "preload/routing.h"

#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <sys/ioctl.h>

#include <algorithm>
#include <cstring>
#include <vector>

using namespace gpusock::preload;

GS_EXPORT int shutdown(int fd, int how) {
  if (t_inside || kind_of(fd) != kGs) return real().shutdown(fd, how);
  Inside guard;
  return libc_result(gs().shutdown(fd, how));
}

namespace {

// The kernel's getsockname/getpeername of fd; a fork relay's child end
// answers with its connection's addresses instead of its own AF_UNIX ones.
int kernel_name(int fd, bool peer, sockaddr *addr, socklen_t *len) {
  const socklen_t room = len ? *len : 0;
  const int r = peer ? real().getpeername(fd, addr, len) : real().getsockname(fd, addr, len);
  ConnectionNames names;
  if (r < 0 || t_inside || room < sizeof(sa_family_t) || addr->sa_family != AF_UNIX || !relay_end_names(fd, &names))
    return r;
  *len = room;
  if (peer) copy_address_out(names.peer, names.peer_len, addr, len);
  else copy_address_out(names.local, names.local_len, addr, len);
  return 0;
}

// SO_PEERCRED of a TCP connection: the kernel records no peer process.
int no_peer_credentials(void *val, socklen_t *len) {
  if (!val || !len) {
    errno = EFAULT;
    return -1;
  }
  const ucred none{0, static_cast<uid_t>(-1), static_cast<gid_t>(-1)};
  *len = std::min<socklen_t>(*len, sizeof none);
  std::memcpy(val, &none, *len);
  return 0;
}

// A kernel socket's option; on a fork relay's child end, the SOL_SOCKET
// options that would reveal AF_UNIX answer as the TCP connection's.
int kernel_getsockopt(int fd, int level, int name, void *val, socklen_t *len) {
  const int r = real().getsockopt(fd, level, name, val, len);
  if (r < 0 || t_inside || level != SOL_SOCKET || !val || !len || *len < sizeof(int)) return r;
  const bool unix_answer = (name == SO_DOMAIN && *static_cast<int *>(val) == AF_UNIX) ||
                           (name == SO_PROTOCOL && *static_cast<int *>(val) == 0) || name == SO_PEERCRED;
  ConnectionNames names;
  if (!unix_answer || !relay_end_names(fd, &names)) return r;
  if (name == SO_PEERCRED) return no_peer_credentials(val, len);
  *static_cast<int *>(val) =
      name == SO_DOMAIN ? static_cast<int>(names.local.ss_family) : static_cast<int>(IPPROTO_TCP);
  return 0;
}

// IP and TCP options on a fork relay's child end are accepted and ignored:
// the connection they would tune lives in the parent.
int kernel_setsockopt(int fd, int level, int name, const void *val, socklen_t len) {
  const int r = real().setsockopt(fd, level, name, val, len);
  if (r == 0 || (level != IPPROTO_TCP && level != IPPROTO_IP && level != IPPROTO_IPV6)) return r;
  const int saved = errno;
  if (is_relay_end(fd)) return 0;
  errno = saved;
  return r;
}

}  // namespace

GS_EXPORT int getsockname(int fd, sockaddr *addr, socklen_t *len) {
  if (!t_inside && kind_of(fd) == kDormant) {  // the address it listens on
    auto spec = dormant_spec(fd);
    if (spec && addr && len) {
      std::lock_guard lock(spec->mu);
      copy_address_out(spec->addr, spec->addr_len, addr, len);
      return 0;
    }
  }
  if (t_inside || kind_of(fd) != kGs) return kernel_name(fd, false, addr, len);
  Inside guard;
  return libc_result(gs().getsockname(fd, addr, len));
}

GS_EXPORT int getpeername(int fd, sockaddr *addr, socklen_t *len) {
  if (t_inside || kind_of(fd) != kGs) return kernel_name(fd, true, addr, len);
  Inside guard;
  return libc_result(gs().getpeername(fd, addr, len));
}

namespace {

// Kernel TCP options with no meaning on gpusock: accepted and ignored, so
// programs that tune them keep working.
bool harmless_option(int level, int name) {
  switch (level) {
    case SOL_SOCKET:
      return name == SO_DONTROUTE || name == SO_MARK || name == SO_BINDTODEVICE || name == SO_BUSY_POLL ||
             name == SO_ZEROCOPY || name == SO_MAX_PACING_RATE || name == SO_INCOMING_CPU || name == SO_TIMESTAMP ||
             name == SO_TIMESTAMPNS || name == SO_PASSCRED || name == SO_BROADCAST;
    case IPPROTO_TCP:
      return name == TCP_DEFER_ACCEPT || name == TCP_FASTOPEN || name == TCP_FASTOPEN_CONNECT ||
             name == TCP_USER_TIMEOUT || name == TCP_CONGESTION || name == TCP_NOTSENT_LOWAT ||
             name == TCP_WINDOW_CLAMP || name == TCP_SYNCNT || name == TCP_LINGER2 ||
             name == TCP_THIN_LINEAR_TIMEOUTS || name == TCP_SAVE_SYN;
    case IPPROTO_IP:
      return name == IP_TTL || name == IP_BIND_ADDRESS_NO_PORT || name == IP_FREEBIND || name == IP_TRANSPARENT ||
             name == IP_MTU_DISCOVER || name == IP_RECVERR;
    case IPPROTO_IPV6:
      return name == IPV6_TCLASS || name == IPV6_RECVERR || name == IPV6_MTU_DISCOVER;
    default:
      return false;
  }
}

}  // namespace

GS_EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len) {
  const Real &R = real();
  if (t_inside) return R.setsockopt(fd, level, name, val, len);
  const uint8_t k = kind_of(fd);
  if (k == kPending) {
    int r = 0;
    if (level != SOL_RDMA) r = R.setsockopt(fd, level, name, val, len);
    if (r == 0 && val) record_pending_option(fd, level, name, val, len);
    return r;
  }
  if (k == kDormant) {  // kept for the listener it becomes
    note_listen_option(dormant_spec(fd), level, name, val, len);
    return 0;
  }
  if (k != kGs) return kernel_setsockopt(fd, level, name, val, len);
  if (auto info = sock_info(fd); info && info->spec && !info->listening)  // a listener to be
    note_listen_option(info->spec, level, name, val, len);
  if (level == SOL_SOCKET && (name == SO_RCVTIMEO || name == SO_SNDTIMEO)) {
    if (!val || len < sizeof(timeval)) {
      errno = EINVAL;
      return -1;
    }
    note_timeout(fd, name, val, len);
    return 0;
  }
  int optname = name;
  if (level == SOL_SOCKET && name == SO_RCVBUFFORCE) optname = SO_RCVBUF;
  if (level == SOL_SOCKET && name == SO_SNDBUFFORCE) optname = SO_SNDBUF;
  Inside guard;
  const int r = gs().setsockopt(fd, level, optname, val, len);
  if (r == -ENOPROTOOPT && harmless_option(level, name)) return 0;
  return libc_result(r);
}

GS_EXPORT int getsockopt(int fd, int level, int name, void *val, socklen_t *len) {
  const Real &R = real();
  if (!t_inside && kind_of(fd) == kDormant && level == SOL_SOCKET && name == SO_ACCEPTCONN && val && len &&
      *len >= sizeof(int)) {
    *static_cast<int *>(val) = 1;  // a listener, in this process too
    *len = sizeof(int);
    return 0;
  }
  if (t_inside) return R.getsockopt(fd, level, name, val, len);
  if (kind_of(fd) != kGs) return kernel_getsockopt(fd, level, name, val, len);
  if (level == SOL_SOCKET && name == SO_PEERCRED) return no_peer_credentials(val, len);
  if (level == SOL_SOCKET && (name == SO_RCVTIMEO || name == SO_SNDTIMEO)) {
    if (!val || !len || *len < sizeof(timeval)) {
      errno = EINVAL;
      return -1;
    }
    auto info = sock_info(fd);
    const int64_t us = info ? (name == SO_RCVTIMEO ? info->rcvtimeo_us : info->sndtimeo_us).load() : 0;
    timeval tv{static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
    std::memcpy(val, &tv, sizeof tv);
    *len = sizeof tv;
    return 0;
  }
  if (level == IPPROTO_TCP && name == TCP_INFO) {
    // No kernel TCP state exists; report the connection state and nothing else.
    if (!val || !len) {
      errno = EFAULT;
      return -1;
    }
    tcp_info ti{};
    sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    auto info = sock_info(fd);
    Inside guard;
    if (info && info->listening) ti.tcpi_state = TCP_LISTEN;
    else
      ti.tcpi_state = gs().getpeername(fd, reinterpret_cast<sockaddr *>(&ss), &sl) == 0 ? TCP_ESTABLISHED : TCP_CLOSE;
    const socklen_t n = std::min<socklen_t>(*len, sizeof ti);
    std::memcpy(val, &ti, n);
    *len = n;
    return 0;
  }
  if (level == IPPROTO_TCP && name == TCP_CONGESTION) {
    if (!val || !len) {
      errno = EFAULT;
      return -1;
    }
    const char name_text[] = "gpusock";
    const socklen_t n = std::min<socklen_t>(*len, sizeof name_text);
    std::memcpy(val, name_text, n);
    *len = n;
    return 0;
  }
  Inside guard;
  return libc_result(gs().getsockopt(fd, level, name, val, len));
}

GS_EXPORT int ioctl(int fd, unsigned long req, ...) {
  va_list ap;
  va_start(ap, req);
  void *arg = va_arg(ap, void *);
  va_end(ap);
  const Real &R = real();
  if (t_inside || kind_of(fd) != kGs) return R.ioctl(fd, req, arg);
  switch (req) {
    case FIONBIO: {
      if (!arg) {
        errno = EFAULT;
        return -1;
      }
      Inside guard;
      return libc_result(gs().fcntl(fd, F_SETFL, *static_cast<int *>(arg) ? O_NONBLOCK : 0));
    }
    case FIONREAD: {
      // Bytes ready to read: peek them (the library keeps no separate count).
      if (!arg) {
        errno = EFAULT;
        return -1;
      }
      Inside guard;
      int ring = 0;
      socklen_t rl = sizeof ring;
      if (gs().getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &ring, &rl) < 0 || ring <= 0) ring = 1 << 20;
      static thread_local std::vector<char> buf;
      if (buf.size() < static_cast<size_t>(ring)) buf.resize(static_cast<size_t>(ring));
      ssize_t n = gs().recv(fd, buf.data(), static_cast<size_t>(ring), MSG_PEEK | MSG_DONTWAIT);
      if (n == -EAGAIN || n == -ENOTCONN) n = 0;
      if (n < 0) return libc_result<int>(static_cast<int>(n));
      *static_cast<int *>(arg) = static_cast<int>(n);
      return 0;
    }
    case SIOCOUTQ:
    case SIOCATMARK:
      if (!arg) {
        errno = EFAULT;
        return -1;
      }
      *static_cast<int *>(arg) = 0;
      return 0;
    default:
      if ((req & 0xff00) == 0x8900) {  // SIOCGIF* and friends: ask a kernel socket
        const int tmp = R.socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (tmp < 0) return -1;
        const int r = R.ioctl(tmp, req, arg);
        const int saved = errno;
        R.close(tmp);
        errno = saved;
        return r;
      }
      errno = ENOTTY;
      return -1;
  }
}

// fstat: a gpusock fd is a socket (its reserved kernel object is an eventfd).
GS_EXPORT int fstat(int fd, struct stat *st) {
  const int r = real().fstat(fd, st);
  if (r == 0 && !t_inside && kind_of(fd) == kGs) st->st_mode = S_IFSOCK | 0777;
  return r;
}

GS_EXPORT int fstat64(int fd, struct stat64 *st) { return fstat(fd, reinterpret_cast<struct stat *>(st)); }
