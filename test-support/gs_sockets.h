// The socket API of sockets.h over gpusock's CPU sockets (gs_*), the default
// of its helpers: send_all(fd, p, n) there means gs_send underneath. Programs
// that include this link gpusock.
#pragma once

#include <gpusock/socket.h>

#include <fcntl.h>
#include <poll.h>

#include "test-support/sockets.h"

namespace gpusock::test {

struct GsSockets {
  static constexpr const char *kName = "gpusock";
  static int socket(int type_flags = 0) { return gs_socket(AF_INET, SOCK_STREAM | type_flags, 0); }
  static int bind(int fd, const sockaddr_in &a) {
    return gs_bind(fd, reinterpret_cast<const sockaddr *>(&a), sizeof a);
  }
  static int listen(int fd, int backlog) { return gs_listen(fd, backlog); }
  static int accept(int fd) { return gs_accept(fd, nullptr, nullptr); }
  static int connect(int fd, const sockaddr_in &a) {
    return gs_connect(fd, reinterpret_cast<const sockaddr *>(&a), sizeof a);
  }
  static ssize_t send(int fd, const void *p, size_t n) { return gs_send(fd, p, n, 0); }
  static ssize_t recv(int fd, void *p, size_t n) { return gs_recv(fd, p, n, 0); }
  static int shutdown(int fd, int how) { return gs_shutdown(fd, how); }
  static int close(int fd) { return gs_close(fd); }
  static int poll(pollfd *fds, nfds_t n, int timeout_ms) { return gs_poll(fds, n, timeout_ms); }
  static int setsockopt(int fd, int level, int name, const void *value, socklen_t len) {
    return gs_setsockopt(fd, level, name, value, len);
  }
  static int getsockopt(int fd, int level, int name, void *value, socklen_t *len) {
    return gs_getsockopt(fd, level, name, value, len);
  }
  static int set_nonblock(int fd) { return gs_fcntl(fd, F_SETFL, O_NONBLOCK); }
  static const char *last_error() { return gs_last_error(); }
};

}  // namespace gpusock::test
