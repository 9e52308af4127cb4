// CPU-side socket helpers of the face verification programs, written once for
// any socket API with POSIX semantics: `Io` is LibcIo here (plain sockets: the
// CPU server, the loader, the client; under gpusock's LD_PRELOAD shim they go
// over gpusock) or GsIo (fv_gs_io.h: libgpusock's gs_* calls, the host-centric
// server). Every call returns >= 0 or a negated errno.
#ifndef FV_NET_H
#define FV_NET_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <string>

namespace fv {

inline uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

struct LibcIo {
  static int socket() { return ::socket(AF_INET, SOCK_STREAM, 0); }  // no SOCK_NONBLOCK: librspreload
  static int connect(int fd, const sockaddr_in &a) { return ::connect(fd, (const sockaddr *)&a, sizeof a); }
  static int bind(int fd, const sockaddr_in &a) { return ::bind(fd, (const sockaddr *)&a, sizeof a); }
  static int listen(int fd, int backlog) { return ::listen(fd, backlog); }
  static int accept(int fd) { return ::accept(fd, nullptr, nullptr); }
  static int reuse_address(int fd) {
    const int one = 1;
    return ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  }
  static ssize_t send(int fd, const void *p, size_t n) { return ::send(fd, p, n, MSG_NOSIGNAL); }
  static ssize_t recv(int fd, void *p, size_t n) { return ::recv(fd, p, n, 0); }
  static int poll(pollfd *fds, nfds_t n, int timeout_ms) { return ::poll(fds, n, timeout_ms); }
  static int close(int fd) { return ::close(fd); }
  static int set_nonblocking(int fd) { return ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }
  static int socket_error(int fd) {
    int err = 0;
    socklen_t len = sizeof err;
    return ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 ? errno : err;
  }
};

// A call's result in the status convention (libc: -1 and errno).
inline long status_of(long rc) { return rc < 0 ? -errno : rc; }

// "A.B.C.D:PORT" (IPv4, numeric) into addr; false when malformed.
inline bool parse_endpoint(const std::string &s, sockaddr_in *addr) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos) return false;
  const std::string host = s.substr(0, colon);
  const long port = strtol(s.c_str() + colon + 1, nullptr, 10);
  *addr = sockaddr_in{};
  addr->sin_family = AF_INET;
  addr->sin_port = htons(static_cast<uint16_t>(port));
  return port > 0 && port < 65536 && inet_pton(AF_INET, host.c_str(), &addr->sin_addr) == 1;
}

// Waits for events on one socket: > 0 ready, -ETIMEDOUT, or an error.
template <class Io>
int wait_for(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  const long rc = status_of(Io::poll(&p, 1, timeout_ms));
  if (rc == 0) return -ETIMEDOUT;
  return static_cast<int>(rc);
}

// A non-blocking connected socket within timeout_ms, or a negated errno.
template <class Io>
int connect_nonblocking(const sockaddr_in &addr, int timeout_ms) {
  const int fd = static_cast<int>(status_of(Io::socket()));
  if (fd < 0) return fd;
  long rc = status_of(Io::set_nonblocking(fd));
  if (rc == 0) rc = status_of(Io::connect(fd, addr));
  if (rc == -EINPROGRESS || rc == -EALREADY) {
    rc = wait_for<Io>(fd, POLLOUT, timeout_ms);
    if (rc > 0) rc = -Io::socket_error(fd);
  }
  if (rc < 0) {
    Io::close(fd);
    return static_cast<int>(rc);
  }
  return fd;
}

// All n bytes, waiting at most timeout_ms for each bit of progress.
template <class Io>
int send_all(int fd, const void *buf, size_t n, int timeout_ms) {
  const uint8_t *p = static_cast<const uint8_t *>(buf);
  while (n > 0) {
    const long k = status_of(Io::send(fd, p, n));
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
    } else if (k == -EAGAIN || k == -EWOULDBLOCK || k == -EINTR) {
      const int w = wait_for<Io>(fd, POLLOUT, timeout_ms);
      if (w < 0) return w;
    } else {
      return k == 0 ? -EPIPE : static_cast<int>(k);
    }
  }
  return 0;
}

// At least one byte (up to n) within timeout_ms; 0 at EOF.
template <class Io>
long recv_some(int fd, void *buf, size_t n, int timeout_ms) {
  for (;;) {
    const long k = status_of(Io::recv(fd, buf, n));
    if (k != -EAGAIN && k != -EWOULDBLOCK && k != -EINTR) return k;
    const int w = wait_for<Io>(fd, POLLIN, timeout_ms);
    if (w < 0) return w;
  }
}

// Command-line flags "--name value": next() returns the value or "" at the end.
struct Flags {
  int argc;
  char **argv;
  int i = 1;
  bool done() const { return i >= argc; }
  std::string name() { return argv[i++]; }
  const char *next() { return i < argc ? argv[i++] : ""; }
  long number() { return strtol(next(), nullptr, 0); }
};

}  // namespace fv

#endif
