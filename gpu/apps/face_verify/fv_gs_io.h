// fv_net.h's socket API as libgpusock's gs_* calls (the host-centric server's
// CPU sockets). gs_* return a negated errno and set errno, as status_of expects.
#ifndef FV_GS_IO_H
#define FV_GS_IO_H

#include <gpusock/socket.h>

#include "fv_net.h"

namespace fv {

struct GsIo {
  static int socket() { return gs_socket(AF_INET, SOCK_STREAM, 0); }
  static int connect(int fd, const sockaddr_in &a) { return gs_connect(fd, (const sockaddr *)&a, sizeof a); }
  static int bind(int fd, const sockaddr_in &a) { return gs_bind(fd, (const sockaddr *)&a, sizeof a); }
  static int listen(int fd, int backlog) { return gs_listen(fd, backlog); }
  static int accept(int fd) { return gs_accept(fd, nullptr, nullptr); }
  static int reuse_address(int fd) {
    const int one = 1;
    return gs_setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  }
  static ssize_t send(int fd, const void *p, size_t n) { return gs_send(fd, p, n, 0); }
  static ssize_t recv(int fd, void *p, size_t n) { return gs_recv(fd, p, n, 0); }
  static int poll(pollfd *fds, nfds_t n, int timeout_ms) { return gs_poll(fds, n, timeout_ms); }
  static int close(int fd) { return gs_close(fd); }
  static int set_nonblocking(int fd) { return gs_fcntl(fd, F_SETFL, gs_fcntl(fd, F_GETFL) | O_NONBLOCK); }
  static int socket_error(int fd) {
    int err = 0;
    socklen_t len = sizeof err;
    return gs_getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 ? errno : err;
  }
};

}  // namespace fv

#endif
