// The socket API of sockets.h over the kernel's own sockets (libc), in the
// gpusock status convention (>= 0 success, negated errno on failure): the
// baseline that benchmarks run the same code over (send_all<KernelSockets>).
// Only libc headers.
#pragma once

#include <fcntl.h>
#include <poll.h>

#include "test-support/sockets.h"

namespace gpusock::test {

struct KernelSockets {
  static constexpr const char *kName = "kernel";
  template <class T>
  static T status(T rc) {
    return rc < 0 ? static_cast<T>(-errno) : rc;
  }
  static int socket(int type_flags = 0) { return status(::socket(AF_INET, SOCK_STREAM | type_flags, 0)); }
  static int bind(int fd, const sockaddr_in &a) {
    return status(::bind(fd, reinterpret_cast<const sockaddr *>(&a), sizeof a));
  }
  static int listen(int fd, int backlog) { return status(::listen(fd, backlog)); }
  static int accept(int fd) { return status(::accept(fd, nullptr, nullptr)); }
  static int connect(int fd, const sockaddr_in &a) {
    return status(::connect(fd, reinterpret_cast<const sockaddr *>(&a), sizeof a));
  }
  // MSG_NOSIGNAL: a vanished peer is an error return, not SIGPIPE.
  static ssize_t send(int fd, const void *p, size_t n) { return status(::send(fd, p, n, MSG_NOSIGNAL)); }
  static ssize_t recv(int fd, void *p, size_t n) { return status(::recv(fd, p, n, 0)); }
  static int shutdown(int fd, int how) { return status(::shutdown(fd, how)); }
  static int close(int fd) { return status(::close(fd)); }
  static int poll(pollfd *fds, nfds_t n, int timeout_ms) { return status(::poll(fds, n, timeout_ms)); }
  static int setsockopt(int fd, int level, int name, const void *value, socklen_t len) {
    return status(::setsockopt(fd, level, name, value, len));
  }
  static int getsockopt(int fd, int level, int name, void *value, socklen_t *len) {
    return status(::getsockopt(fd, level, name, value, len));
  }
  static int set_nonblock(int fd) {
    const int flags = ::fcntl(fd, F_GETFL);
    return flags < 0 ? -errno : status(::fcntl(fd, F_SETFL, flags | O_NONBLOCK));
  }
  static const char *last_error() { return ""; }
};

}  // namespace gpusock::test
