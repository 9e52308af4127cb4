/* TEST AID ONLY - not part of gpusock.
 *
 * A tiny LD_PRELOAD library that works around two gaps of rdma-core 44's own
 * preload shim (librspreload.so), so that unmodified Debian programs
 * (memcached, libmemcached's tools) really run over rsockets in the interop
 * matrix (see /work/shared/docs/rdma-lab.md, "librspreload gaps"):
 *
 *   1. librspreload 44 turns socket() into an rsocket only when type is exactly
 *      SOCK_STREAM; with SOCK_NONBLOCK/SOCK_CLOEXEC or-ed in it silently hands
 *      out a kernel TCP socket. Here socket() strips those flags before passing
 *      the call on and re-applies them with fcntl() afterwards.
 *   2. librspreload 44 has no accept4(): here it is accept() + fcntl().
 *
 * It must come BEFORE librspreload.so in LD_PRELOAD, so that the calls it
 * passes on (RTLD_NEXT socket, accept, fcntl) reach librspreload:
 *   LD_PRELOAD="librs44_workaround.so /usr/lib/x86_64-linux-gnu/rsocket/librspreload.so"
 * (libevent users also need EVENT_NOEPOLL=1: librspreload 44 has no epoll.)
 * rdma-core 44.12 / 63 and later fix both gaps; this file is then not needed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/socket.h>

static void reapply_flags(int fd, int flags) {
  if (flags & SOCK_NONBLOCK) {
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  }
  /* F_SETFD on an rsocket fails with ENOTSUP in rdma-core 44: best effort. */
  if (flags & SOCK_CLOEXEC) fcntl(fd, F_SETFD, FD_CLOEXEC);
}

int socket(int domain, int type, int protocol) {
  static int (*next_socket)(int, int, int);
  if (!next_socket) next_socket = (int (*)(int, int, int))dlsym(RTLD_NEXT, "socket");
  const int flags = type & (SOCK_NONBLOCK | SOCK_CLOEXEC);
  const int fd = next_socket(domain, type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC), protocol);
  if (fd >= 0 && flags) reapply_flags(fd, flags);
  return fd;
}

int accept4(int sockfd, struct sockaddr *addr, socklen_t *addrlen, int flags) {
  const int fd = accept(sockfd, addr, addrlen);
  if (fd >= 0 && flags) reapply_flags(fd, flags);
  return fd;
}
