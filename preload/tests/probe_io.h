/* Helpers shared by the test programs of the shim (preload_probe.c,
 * prefork_probe.c, halfclose_probe.c, relay_addr_probe.c): plain POSIX, no
 * gpusock headers. */
#pragma once

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Writes all n bytes (retrying after EINTR): 0, or -1 with errno. */
static inline int write_all(int fd, const void *buf, size_t n) {
  const char *p = (const char *)buf;
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* 1 if fd is a gpusock socket under the shim (the library's reserved eventfd). */
static inline int fd_is_gpusock(int fd) {
  char path[64], link[128];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, link, sizeof link - 1);
  if (n < 0) return 0;
  link[n] = 0;
  return strstr(link, "eventfd") != NULL;
}

/* A TCP listener on 127.0.0.1:port (SO_REUSEADDR), or -1 with errno. */
static inline int tcp_listen(int port, int flags) {
  int fd = socket(AF_INET, SOCK_STREAM | flags, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 16) < 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

/* A TCP connection to 127.0.0.1:port, retried while refused (the server may
 * still be starting), or -1 with errno. */
static inline int tcp_connect(int port, int flags) {
  int fd = socket(AF_INET, SOCK_STREAM | flags, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int tries = 0;; ++tries) {
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 || errno == EINPROGRESS) return fd;
    if (errno != ECONNREFUSED || tries > 50) break;
    usleep(100000);
  }
  int e = errno;
  close(fd);
  errno = e;
  return -1;
}
