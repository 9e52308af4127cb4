/* odd_calls: odd but legal socket calls from a plain POSIX program, run under
 * libgpusock_preload.so against an echo server (gs_test_peer echo PORT):
 * MSG_PEEK, MSG_WAITALL, zero-length sends, shutdown twice, close during a
 * blocking recv in another thread, dup2 over a gpusock fd, SO_LINGER. Each
 * must give what the kernel's TCP gives or a clear errno; never a crash or a
 * hang (the test runs it under timeout).
 *   odd_calls PORT
 * Every check prints "ok: ..." or "FAIL: ..."; the exit status is the number
 * of failures. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "preload/tests/probe_check.h"

static int port;

static int connect_echo(void) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int tries = 0; tries < 100; ++tries) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) return fd;
    close(fd);
    usleep(100000); /* the server may still be starting */
  }
  return -1;
}

static int send_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* One byte there and back: the connection still works. */
static int round_trip(int fd, char c) {
  char back = 0;
  return send_all(fd, &c, 1) == 0 && recv(fd, &back, 1, MSG_WAITALL) == 1 && back == c;
}

static void peek(void) {
  int fd = connect_echo();
  const char msg[] = "hello, peek";
  CHECK(fd >= 0 && send_all(fd, msg, sizeof msg) == 0, "peek: connected and sent");
  struct pollfd p = {fd, POLLIN, 0};
  poll(&p, 1, 5000);
  char a[64] = {0}, b[64] = {0}, c[64] = {0};
  ssize_t n1 = recv(fd, a, sizeof a, MSG_PEEK);
  ssize_t n2 = recv(fd, b, sizeof b, MSG_PEEK);
  CHECK(n1 > 0 && n2 >= n1 && !memcmp(a, msg, (size_t)n1) && !memcmp(b, msg, (size_t)n1),
        "peek: MSG_PEEK twice shows the same bytes (%zd, %zd)", n1, n2);
  ssize_t n3 = recv(fd, c, sizeof msg, MSG_WAITALL);
  CHECK(n3 == (ssize_t)sizeof msg && !memcmp(c, msg, sizeof msg), "peek: then recv takes them (%zd)", n3);
  close(fd);
}

static void waitall(void) {
  int fd = connect_echo();
  enum { kBytes = 300000 };
  static char out[kBytes], in[kBytes];
  for (size_t i = 0; i < kBytes; ++i) out[i] = (char)(i * 131 + 7);
  CHECK(fd >= 0 && send_all(fd, out, kBytes) == 0, "waitall: sent %d bytes", kBytes);
  ssize_t n = recv(fd, in, kBytes, MSG_WAITALL);
  CHECK(n == kBytes && !memcmp(in, out, kBytes), "waitall: one MSG_WAITALL recv returned all of them (%zd)", n);
  close(fd);
}

static void zero_length(void) {
  int fd = connect_echo();
  char buf[4];
  CHECK(fd >= 0 && send(fd, buf, 0, 0) == 0, "zero-length send returns 0");
  CHECK(write(fd, buf, 0) == 0, "zero-length write returns 0");
  CHECK(send(fd, NULL, 0, 0) == 0, "zero-length send of NULL returns 0");
  CHECK(recv(fd, buf, 0, MSG_DONTWAIT) == 0, "zero-length recv returns 0");
  CHECK(round_trip(fd, 'z'), "zero-length calls: the connection still works");
  close(fd);
}

static void shutdown_twice(void) {
  int fd = connect_echo();
  CHECK(fd >= 0 && round_trip(fd, 's'), "shutdown: connected");
  CHECK(shutdown(fd, SHUT_WR) == 0, "shutdown(SHUT_WR)");
  int rc = shutdown(fd, SHUT_WR);
  CHECK(rc == 0 || errno == ENOTCONN, "shutdown(SHUT_WR) again: %d", rc);
  char c;
  CHECK(recv(fd, &c, 1, 0) == 0, "shutdown: the echo server answers with EOF");
  rc = shutdown(fd, SHUT_RDWR);
  CHECK(rc == 0 || errno == ENOTCONN, "shutdown(SHUT_RDWR) after that: %d", rc);
  rc = shutdown(fd, 99);
  CHECK(rc == -1 && errno == EINVAL, "shutdown(99): EINVAL");
  CHECK(close(fd) == 0, "shutdown: close");
}

struct blocked_recv {
  int fd;
  ssize_t rc;
  int err;
  volatile int done;
};

static void *recv_thread(void *arg) {
  struct blocked_recv *b = arg;
  char c;
  b->rc = recv(b->fd, &c, 1, 0);
  b->err = errno;
  __atomic_store_n(&b->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* The kernel's TCP leaves such a recv blocked until data or a FIN arrives;
 * gpusock ends it: EBADF (or 0). Either way it must end once the peer has
 * gone, never hang. */
static void close_during_recv(void) {
  struct blocked_recv b = {connect_echo(), 0, 0, 0};
  CHECK(b.fd >= 0, "close during recv: connected");
  pthread_t t;
  pthread_create(&t, NULL, recv_thread, &b);
  usleep(300000);
  double t0 = now_ms();
  CHECK(close(b.fd) == 0, "close during recv: close returned");
  while (!__atomic_load_n(&b.done, __ATOMIC_ACQUIRE) && now_ms() - t0 < 10000) usleep(1000);
  int done = __atomic_load_n(&b.done, __ATOMIC_ACQUIRE);
  CHECK(done && (b.rc == 0 || (b.rc < 0 && (b.err == EBADF || b.err == ECONNRESET))),
        "close during recv: the blocked recv ended (%zd, %s) %.0f ms after the close", b.rc,
        done ? strerror(b.err) : "still blocked", now_ms() - t0);
  if (done) pthread_join(t, NULL);
}

static void dup2_over(void) {
  int a = connect_echo(), b = connect_echo(), c = connect_echo();
  CHECK(a >= 0 && b >= 0 && c >= 0, "dup2: three connections");
  int p[2];
  CHECK(pipe(p) == 0, "dup2: a pipe");
  CHECK(dup2(p[1], a) == a, "dup2(pipe, gpusock fd) replaces the socket");
  char z = 0;
  CHECK(write(a, "z", 1) == 1 && read(p[0], &z, 1) == 1 && z == 'z', "dup2: that fd is the pipe now");
  CHECK(round_trip(b, 'b'), "dup2: the other connections still work");
  CHECK(dup2(b, c) == c, "dup2(gpusock fd, gpusock fd)");
  char back = 0;
  CHECK(send_all(c, "c", 1) == 0 && recv(b, &back, 1, MSG_WAITALL) == 1 && back == 'c',
        "dup2: both fds are one socket now");
  CHECK(close(b) == 0 && round_trip(c, 'd'), "dup2: the copy lives on after the original closes");
  close(c);
  close(a);
  close(p[0]);
}

static void linger(void) {
  int fd = connect_echo();
  struct linger l = {1, 0}, got = {0, 0};
  socklen_t len = sizeof got;
  CHECK(fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l) == 0, "SO_LINGER {1, 0} set");
  CHECK(getsockopt(fd, SOL_SOCKET, SO_LINGER, &got, &len) == 0 && got.l_onoff == 1 && got.l_linger == 0,
        "SO_LINGER reads back {%d, %d}", got.l_onoff, got.l_linger);
  CHECK(setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, 3) == -1 && errno == EINVAL, "SO_LINGER with 3 bytes: EINVAL");
  CHECK(round_trip(fd, 'l'), "SO_LINGER: the connection works");
  double t0 = now_ms();
  CHECK(close(fd) == 0, "SO_LINGER {1, 0}: close returned after %.0f ms", now_ms() - t0);

  fd = connect_echo();
  struct linger l2 = {1, 2};
  CHECK(fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_LINGER, &l2, sizeof l2) == 0, "SO_LINGER {1, 2} set");
  static char buf[1 << 20];
  CHECK(send_all(fd, buf, sizeof buf) == 0, "SO_LINGER {1, 2}: 1 MiB queued, nothing read back");
  t0 = now_ms();
  CHECK(close(fd) == 0, "SO_LINGER {1, 2}: close returned after %.0f ms", now_ms() - t0);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PORT\n", argv[0]);
    return 1;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  port = atoi(argv[1]);
  peek();
  waitall();
  zero_length();
  shutdown_twice();
  dup2_over();
  linger();
  close_during_recv(); /* last: a recv that never ends leaves a thread behind */
  printf("%d failure(s)\n", failures);
  return failures;
}
