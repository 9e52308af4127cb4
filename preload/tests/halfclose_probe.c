/* halfclose_probe: what poll, select and epoll report on a connection whose
 * peer has stopped writing while this side still has data unread, as Linux
 * TCP reports it. The test runs it on kernel TCP (no shim) and under the shim,
 * with the same expectations.
 *
 *   halfclose_probe PORT BYTES close|shutdown [TAIL]
 *
 * One process: a sender thread connects, writes BYTES (a known pattern) and
 * then closes (close) or shuts down writing and waits for our EOF before it
 * closes (shutdown). The receiver reads all but the last TAIL bytes (64 KiB),
 * stops reading (epoll events 0, as a message library does at its high-water
 * mark) and checks, once the peer's end of stream has arrived:
 *   - events 0: epoll_wait reports nothing (no EPOLLHUP: only one direction is down);
 *   - poll/epoll: POLLIN|POLLOUT|POLLRDHUP, never POLLHUP; select: readable, writable;
 *   - every byte then reads back intact, BYTES in all, then EOF;
 *   - after its own shutdown(SHUT_WR): POLLHUP (both directions down), EPOLLHUP with events 0.
 * Exit status: the number of failed checks. EXPECT_GPUSOCK=1: the sockets
 * must be gpusock sockets. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>

#include "probe_check.h"
#include "probe_io.h"

static int g_port;
static size_t g_bytes;
static int g_shutdown_mode;
static sem_t g_writes_done; /* the sender has written everything and stopped writing */
static int g_sender_failed;

static unsigned char pattern(size_t i) { return (unsigned char)(i * 131 + (i >> 13)); }

static void *sender(void *arg) {
  (void)arg;
  const int fd = tcp_connect(g_port, 0);
  unsigned char buf[65536];
  size_t sent = 0;
  while (fd >= 0 && sent < g_bytes) {
    size_t n = g_bytes - sent < sizeof buf ? g_bytes - sent : sizeof buf;
    for (size_t i = 0; i < n; ++i) buf[i] = pattern(sent + i);
    if (write_all(fd, buf, n) < 0) break;
    sent += n;
  }
  g_sender_failed = fd < 0 || sent != g_bytes;
  if (g_shutdown_mode && fd >= 0) {
    g_sender_failed |= shutdown(fd, SHUT_WR) != 0;
    sem_post(&g_writes_done);
    char c;
    while (read(fd, &c, 1) > 0) {} /* until the receiver shuts down too */
  }
  if (fd >= 0) close(fd);
  if (!g_shutdown_mode) sem_post(&g_writes_done);
  return NULL;
}

/* Reads up to n bytes that are ready now, checking each against the pattern;
 * returns the bytes read, and sets *eof at end of stream. */
static size_t read_checked(int fd, size_t at, size_t n, int *eof, int *bad) {
  unsigned char buf[65536];
  size_t got = 0;
  *eof = 0;
  while (got < n) {
    size_t want = n - got < sizeof buf ? n - got : sizeof buf;
    ssize_t r = read(fd, buf, want);
    if (r == 0) *eof = 1;
    if (r <= 0) break;
    for (ssize_t i = 0; i < r; ++i)
      if (buf[i] != pattern(at + got + (size_t)i)) ++*bad;
    got += (size_t)r;
  }
  return got;
}

static short poll_now(int fd, short events) {
  struct pollfd p = {fd, events, 0};
  return poll(&p, 1, 0) == 1 ? p.revents : 0;
}

/* What epoll_wait reports for fd registered with `events` (0: nothing within 200 ms). */
static uint32_t epoll_report(int ep, int fd, uint32_t events) {
  struct epoll_event ev = {.events = events, .data.fd = fd};
  if (epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev) < 0) return 0xffffffffu;
  struct epoll_event out;
  return epoll_wait(ep, &out, 1, 200) == 1 ? out.events : 0;
}

/* select: 1 readable, 2 writable. */
static int select_now(int fd) {
  fd_set r, w;
  FD_ZERO(&r);
  FD_ZERO(&w);
  FD_SET(fd, &r);
  FD_SET(fd, &w);
  struct timeval tv = {0, 0};
  if (select(fd + 1, &r, &w, NULL, &tv) < 0) return -1;
  return (FD_ISSET(fd, &r) ? 1 : 0) | (FD_ISSET(fd, &w) ? 2 : 0);
}

/* Half-closed: the peer stopped writing, we did not. */
static void check_half_closed(int ep, int fd, const char *when) {
  uint32_t e = epoll_report(ep, fd, 0);
  CHECK(e == 0, "%s: epoll with events 0 reports nothing (got 0x%x)", when, e);
  short r = poll_now(fd, POLLIN);
  CHECK(r == POLLIN, "%s: poll(POLLIN) gives POLLIN (got 0x%x)", when, r);
  r = poll_now(fd, POLLIN | POLLOUT | POLLRDHUP);
  CHECK(r == (POLLIN | POLLOUT | POLLRDHUP),
        "%s: poll(POLLIN|POLLOUT|POLLRDHUP) gives all three, no POLLHUP (got 0x%x)", when, r);
  e = epoll_report(ep, fd, EPOLLIN | EPOLLOUT | EPOLLRDHUP);
  CHECK(e == (EPOLLIN | EPOLLOUT | EPOLLRDHUP), "%s: epoll gives EPOLLIN|EPOLLOUT|EPOLLRDHUP, no EPOLLHUP (got 0x%x)",
        when, e);
  CHECK(select_now(fd) == 3, "%s: select: readable and writable", when);
}

static int receive(int listener, size_t tail) {
  const int fd = accept(listener, NULL, NULL);
  CHECK(fd >= 0, "accepted the sender's connection");
  if (fd < 0) return 1;
  if (expect_gpusock()) CHECK(fd_is_gpusock(fd), "the accepted fd %d is a gpusock socket", fd);
  fcntl(fd, F_SETFL, O_NONBLOCK);
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
  epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
  size_t got = 0;
  int eof = 0, bad = 0;
  while (got < g_bytes - tail && !eof) {
    struct epoll_event out;
    if (epoll_wait(ep, &out, 1, 10000) != 1) break;
    got += read_checked(fd, got, g_bytes - tail - got, &eof, &bad);
  }
  CHECK(got == g_bytes - tail && !bad, "read %zu bytes intact, %zu left unread", got, g_bytes - got);
  /* The high-water mark: nothing is wanted until the application drains. */
  epoll_report(ep, fd, 0);
  sem_wait(&g_writes_done);
  struct pollfd p = {fd, POLLRDHUP, 0};
  const int pr = poll(&p, 1, 10000);
  CHECK(pr == 1 && p.revents == POLLRDHUP, "the peer's end of stream arrives: POLLRDHUP alone, no POLLHUP (0x%x)",
        p.revents);
  check_half_closed(ep, fd, "data unread");
  got += read_checked(fd, got, tail + 1, &eof, &bad);
  CHECK(got == g_bytes && !bad && eof, "then every byte read back intact (%zu of %zu), then EOF", got, g_bytes);
  check_half_closed(ep, fd, "at EOF");
  CHECK(shutdown(fd, SHUT_WR) == 0, "shutdown(SHUT_WR) of our side");
  const short r = poll_now(fd, POLLIN | POLLOUT | POLLRDHUP);
  CHECK(r == (POLLIN | POLLOUT | POLLRDHUP | POLLHUP), "both directions down: POLLHUP (got 0x%x)", r);
  const uint32_t e = epoll_report(ep, fd, 0);
  CHECK(e == EPOLLHUP, "both directions down: epoll with events 0 reports EPOLLHUP (got 0x%x)", e);
  CHECK(select_now(fd) & 1, "both directions down: select readable");
  close(ep);
  close(fd);
  return failures;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: halfclose_probe PORT BYTES close|shutdown [TAIL]\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN);
  g_port = atoi(argv[1]);
  g_bytes = strtoul(argv[2], NULL, 0);
  g_shutdown_mode = !strcmp(argv[3], "shutdown");
  const size_t tail = argc > 4 ? strtoul(argv[4], NULL, 0) : 64 * 1024;
  if (tail > g_bytes) return 2;
  printf("== %zu bytes, the sender %s, %zu left unread at the high-water mark\n", g_bytes,
         g_shutdown_mode ? "shuts down writing" : "closes", tail);
  const int l = tcp_listen(g_port, SOCK_CLOEXEC);
  CHECK(l >= 0, "listening on 127.0.0.1:%d", g_port);
  if (l < 0) return 1;
  if (!expect_gpusock()) {
    /* Kernel TCP: a receive buffer that autotuning did not grow (a loaded
     * machine reads slowly) holds the unread tail with no window left for the
     * FIN, which then waits for a read. A fixed buffer keeps room for both. */
    const int rcvbuf = 1 << 20;
    setsockopt(l, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  }
  sem_init(&g_writes_done, 0, 0);
  pthread_t t;
  pthread_create(&t, NULL, sender, NULL);
  receive(l, tail);
  pthread_join(t, NULL);
  CHECK(!g_sender_failed, "the sender wrote %zu bytes and %s", g_bytes, g_shutdown_mode ? "shut down" : "closed");
  close(l);
  return failures;
}
