/* preload_probe: an ordinary socket program (plain POSIX calls, no gpusock
 * headers) that the preload tests run under libgpusock_preload.so.
 *
 *   echo-server PORT [CONNS]        accept CONNS connections, echo each to EOF
 *   echo-client PORT BYTES          send BYTES, read them back, compare
 *   fork-server PORT                two connections: fork+exec a child that
 *                                   inherits the socket, then fork (no exec)
 *   fork-child FD                   serve one request on inherited FD
 *   fork-client PORT BYTES          one request to fork-server
 *   epoll-mix PORT                  AF_UNIX + UDP + TCP in one epoll set
 *   sockopts PORT                   print buffer/queue options of a connection
 *   hold PORT [PID PHASE]           ask memcached its version, wait for EOF
 *                                   (and SIGTERM PID PHASE ms after a tick)
 *   socket                          create one TCP socket, report the error
 *
 * Every check prints "ok: ..." or "FAIL: ..."; the exit status is the number
 * of failures. With EXPECT_GPUSOCK=1 the TCP sockets must be gpusock sockets
 * (their fd is the library's eventfd in /proc/self/fd), with EXPECT_GPUSOCK=0
 * kernel sockets. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "probe_check.h"
#include "probe_io.h"

static const char *self_path;

static uint64_t fnv(const unsigned char *p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/* "gpusock" if fd is the library's reserved eventfd, "kernel" for a socket. */
static const char *fd_kind(int fd) {
  char path[64], link[128];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, link, sizeof link - 1);
  if (n < 0) return "closed";
  link[n] = 0;
  if (strstr(link, "eventfd")) return "gpusock";
  if (!strncmp(link, "socket:", 7)) return "kernel";
  return "other";
}

static void expect_kind(int fd, const char *what) {
  const char *want = getenv("EXPECT_GPUSOCK");
  if (!want) return;
  const char *k = fd_kind(fd);
  CHECK(!strcmp(k, atoi(want) ? "gpusock" : "kernel"), "%s fd %d is a %s socket", what, fd, k);
}

static int read_all(int fd, void *buf, size_t n) {
  char *p = buf;
  while (n) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

/* ------------------------------------------------------------------ echo */

static int echo_server(int port, int conns) {
  int l = tcp_listen(port, SOCK_CLOEXEC);
  CHECK(l >= 0, "echo-server listening on %d", port);
  if (l < 0) return 1;
  expect_kind(l, "listener");
  for (int i = 0; i < conns; ++i) {
    int c = accept(l, NULL, NULL);
    if (c < 0) {
      CHECK(0, "accept");
      break;
    }
    char buf[65536];
    ssize_t n;
    while ((n = read(c, buf, sizeof buf)) > 0)
      if (write_all(c, buf, (size_t)n) < 0) break;
    close(c);
  }
  close(l);
  return failures;
}

static int echo_client(int port, size_t bytes) {
  int fd = tcp_connect(port, 0);
  CHECK(fd >= 0, "echo-client connected to %d", port);
  if (fd < 0) return 1;
  expect_kind(fd, "client");
  unsigned char *out = malloc(bytes), *in = malloc(bytes);
  for (size_t i = 0; i < bytes; ++i) out[i] = (unsigned char)(rand() >> 7);
  size_t sent = 0, got = 0;
  while (got < bytes) { /* interleave, so neither side's buffers need to hold it all */
    if (sent < bytes) {
      size_t chunk = bytes - sent < 32768 ? bytes - sent : 32768;
      if (write_all(fd, out + sent, chunk) < 0) break;
      sent += chunk;
    }
    ssize_t r = recv(fd, in + got, bytes - got, sent < bytes ? MSG_DONTWAIT : 0);
    if (r == 0) break;
    if (r > 0) got += (size_t)r;
    else if (errno != EAGAIN && errno != EINTR) break;
  }
  CHECK(got == bytes && !memcmp(out, in, bytes), "echo-client: %zu bytes echoed intact (fnv %016llx)", got,
        (unsigned long long)fnv(in, got, 1469598103934665603ull));
  shutdown(fd, SHUT_WR);
  char c;
  CHECK(read(fd, &c, 1) == 0, "echo-client: EOF after shutdown");
  close(fd);
  free(out);
  free(in);
  return failures;
}

/* ------------------------------------------------------------------ fork */

/* One request on fd: "LEN\n" then LEN bytes; reply "OK <fnv>\n" then the bytes. */
static int serve_request(int fd, const char *who) {
  char hdr[32];
  size_t i = 0;
  while (i < sizeof hdr - 1) {
    if (read_all(fd, hdr + i, 1) < 0) return -1;
    if (hdr[i++] == '\n') break;
  }
  hdr[i] = 0;
  size_t len = strtoul(hdr, NULL, 10);
  unsigned char *buf = malloc(len + 1);
  if (read_all(fd, buf, len) < 0) {
    free(buf);
    return -1;
  }
  char reply[64];
  int n =
      snprintf(reply, sizeof reply, "OK %016llx %s\n", (unsigned long long)fnv(buf, len, 1469598103934665603ull), who);
  if (write_all(fd, reply, (size_t)n) < 0 || write_all(fd, buf, len) < 0) return -1;
  free(buf);
  return 0; /* the server side closes first (HTTP/1.0 style) */
}

static int fork_child(int fd) {
  struct stat st;
  CHECK(fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode), "fork-child: inherited fd %d is a socket", fd);
  int type = 0;
  socklen_t tl = sizeof type;
  CHECK(getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) == 0 && type == SOCK_STREAM, "fork-child: SO_TYPE stream");
  /* Nothing else of the parent's sockets (its listener, the transport's own
   * kernel sockets) followed the exec. */
  int others = 0;
  for (int i = 3; i < 1024; ++i) {
    char path[64], link[128];
    snprintf(path, sizeof path, "/proc/self/fd/%d", i);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n <= 0 || i == fd) continue;
    link[n] = 0;
    if (strstr(link, "socket:") || strstr(link, "eventfd") || strstr(link, "eventpoll")) {
      printf("  inherited fd %d -> %s\n", i, link);
      ++others;
    }
  }
  CHECK(others == 0, "fork-child: no other socket, eventfd or epoll fd survived the exec (%d)", others);
  CHECK(serve_request(fd, "exec-child") == 0, "fork-child: served a request after exec");
  close(fd);
  return failures;
}

static int fork_server(int port) {
  int l = tcp_listen(port, SOCK_CLOEXEC);
  CHECK(l >= 0, "fork-server listening on %d", port);
  if (l < 0) return 1;
  expect_kind(l, "listener");
  /* 1: fork + exec; the child inherits the connected socket (not CLOEXEC). */
  int c = accept(l, NULL, NULL);
  CHECK(c >= 0, "fork-server: accepted connection 1");
  expect_kind(c, "accepted");
  pid_t pid = fork();
  if (pid == 0) {
    char fdtext[16];
    snprintf(fdtext, sizeof fdtext, "%d", c);
    execl(self_path, self_path, "fork-child", fdtext, (char *)NULL);
    _exit(127);
  }
  close(c); /* the parent's copy: the child now owns the connection */
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "fork-server: exec child exited 0 (status %d)", status);
  /* 2: fork without exec; the parent keeps its fd open and waits. */
  c = accept(l, NULL, NULL);
  CHECK(c >= 0, "fork-server: accepted connection 2");
  pid = fork();
  if (pid == 0) {
    int rc = serve_request(c, "fork-child") == 0 ? 0 : 1;
    close(c);
    _exit(rc);
  }
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "fork-server: forked child exited 0 (status %d)", status);
  close(c);
  close(l);
  return failures;
}

static int fork_client(int port, size_t bytes, const char *expect_who) {
  int fd = tcp_connect(port, 0);
  CHECK(fd >= 0, "fork-client connected");
  if (fd < 0) return 1;
  unsigned char *buf = malloc(bytes);
  for (size_t i = 0; i < bytes; ++i) buf[i] = (unsigned char)(rand() >> 5);
  char hdr[32];
  int n = snprintf(hdr, sizeof hdr, "%zu\n", bytes);
  CHECK(write_all(fd, hdr, (size_t)n) == 0 && write_all(fd, buf, bytes) == 0, "fork-client: sent %zu bytes", bytes);
  char line[96];
  size_t i = 0;
  while (i < sizeof line - 1 && read_all(fd, line + i, 1) == 0 && line[i] != '\n') ++i;
  line[i] = 0;
  char want[64];
  snprintf(want, sizeof want, "OK %016llx %s", (unsigned long long)fnv(buf, bytes, 1469598103934665603ull), expect_who);
  CHECK(!strcmp(line, want), "fork-client: reply '%s'", line);
  unsigned char *back = malloc(bytes);
  CHECK(read_all(fd, back, bytes) == 0 && !memcmp(back, buf, bytes), "fork-client: %zu bytes came back intact", bytes);
  char c;
  CHECK(read(fd, &c, 1) == 0, "fork-client: EOF when the child closed");
  close(fd);
  free(buf);
  free(back);
  return failures;
}

/* ------------------------------------------------------------------ epoll */

static volatile sig_atomic_t alarms;
static void on_alarm(int sig) {
  (void)sig;
  ++alarms;
}

struct delayed {
  int fd;
  int ms;
  const char *data;
};
static void *delayed_write(void *arg) {
  struct delayed *d = arg;
  usleep((useconds_t)d->ms * 1000);
  write_all(d->fd, d->data, strlen(d->data));
  return NULL;
}

/* Waits up to ms for events; returns a bitmask of the tags seen. */
static unsigned wait_tags(int ep, int ms, unsigned want) {
  unsigned seen = 0;
  double end = now_ms() + ms;
  for (;;) {
    double left = end - now_ms();
    if (left < 0) left = 0;
    struct epoll_event ev[16];
    int n = epoll_wait(ep, ev, 16, (int)left);
    for (int i = 0; i < n; ++i) seen |= (unsigned)ev[i].data.u64;
    if ((want && (seen & want) == want) || left <= 0) return seen;
    if (!want && n > 0) return seen;
  }
}

enum {
  T_LISTEN = 1,
  T_CLIENT = 2,
  T_UNIX = 4,
  T_UDP = 8,
  T_ACCEPTED = 16,
  T_ONESHOT = 32,
  T_SECOND = 64,
  T_EARLY = 128
};

static void drain(int fd) {
  char buf[4096];
  while (recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0) {}
}

static int epoll_mix(int port) {
  int ep = epoll_create1(EPOLL_CLOEXEC);
  CHECK(ep >= 0, "epoll_create1");
  int u[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, u) == 0, "AF_UNIX socketpair");
  int d1 = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0), d2 = socket(AF_INET, SOCK_DGRAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  bind(d1, (struct sockaddr *)&a, sizeof a);
  getsockname(d1, (struct sockaddr *)&a, &al);
  CHECK(connect(d2, (struct sockaddr *)&a, sizeof a) == 0, "UDP sockets connected");
  CHECK(!strcmp(fd_kind(u[0]), "kernel") && !strcmp(fd_kind(d1), "kernel"), "AF_UNIX and UDP stay kernel sockets");

  int l = tcp_listen(port, SOCK_NONBLOCK);
  CHECK(l >= 0, "TCP listener on %d", port);
  expect_kind(l, "listener");
  int c = tcp_connect(port, SOCK_NONBLOCK);
  CHECK(c >= 0, "non-blocking connect started");
  expect_kind(c, "client");
  struct epoll_event ev = {.events = EPOLLIN, .data.u64 = T_LISTEN};
  CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev) == 0, "ADD listener");
  CHECK(wait_tags(ep, 3000, T_LISTEN) & T_LISTEN, "listener readable in the mixed set");
  int s = accept4(l, NULL, NULL, SOCK_NONBLOCK);
  CHECK(s >= 0, "accept4");
  expect_kind(s, "accepted");

  /* Registered before its connect (a kernel socket then): the registration
   * follows the socket when connect makes it a gpusock socket. */
  int early = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  ev.events = EPOLLOUT;
  ev.data.u64 = T_EARLY;
  CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, early, &ev) == 0, "ADD a socket before its connect");
  struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(port)};
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK(connect(early, (struct sockaddr *)&to, sizeof to) == 0 || errno == EINPROGRESS, "connect it");
  expect_kind(early, "early-registered client");
  CHECK(wait_tags(ep, 3000, T_EARLY) & T_EARLY, "it reports writable once connected");
  CHECK(epoll_ctl(ep, EPOLL_CTL_DEL, early, NULL) == 0, "DEL it");
  int early_peer = -1;
  for (int i = 0; i < 300 && early_peer < 0; ++i) {
    early_peer = accept4(l, NULL, NULL, SOCK_NONBLOCK);
    if (early_peer < 0) usleep(10000);
  }
  CHECK(early_peer >= 0, "its server side accepted");
  close(early_peer);
  close(early);

  ev.events = EPOLLOUT | EPOLLET;
  ev.data.u64 = T_CLIENT;
  CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev) == 0, "ADD client EPOLLOUT|EPOLLET");
  CHECK(wait_tags(ep, 3000, T_CLIENT) & T_CLIENT, "edge: connected client reported writable");
  int err = -1;
  socklen_t el = sizeof err;
  CHECK(getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0, "SO_ERROR 0 after connect");
  CHECK(!(wait_tags(ep, 100, 0) & T_CLIENT), "edge: no second report without a write");

  ev.events = EPOLLIN;
  ev.data.u64 = T_UNIX;
  CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, u[0], &ev) == 0, "ADD AF_UNIX");
  ev.data.u64 = T_UDP;
  CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, d1, &ev) == 0, "ADD UDP");
  ev.events = EPOLLIN | EPOLLET;
  ev.data.u64 = T_ACCEPTED;
  CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) == 0, "ADD accepted EPOLLIN|EPOLLET");
  CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) < 0 && errno == EEXIST, "ADD twice: EEXIST");
  ev.events = EPOLLIN | EPOLLONESHOT;
  ev.data.u64 = T_ONESHOT;
  CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, c, &ev) == 0, "MOD client to EPOLLIN|EPOLLONESHOT");

  write_all(u[1], "u", 1);
  send(d2, "d", 1, 0);
  write_all(c, "hello", 5);
  unsigned seen = wait_tags(ep, 3000, T_UNIX | T_UDP | T_ACCEPTED);
  CHECK((seen & (T_UNIX | T_UDP | T_ACCEPTED)) == (T_UNIX | T_UDP | T_ACCEPTED),
        "one epoll_wait loop reports AF_UNIX, UDP and the gpusock socket (seen %#x)", seen);
  drain(u[0]);
  drain(d1);
  CHECK(!(wait_tags(ep, 100, 0) & T_ACCEPTED), "edge: unread data is not reported again");
  int avail = -1;
  CHECK(ioctl(s, FIONREAD, &avail) == 0 && avail == 5, "FIONREAD says 5 bytes (%d)", avail);
  char buf[64];
  CHECK(read(s, buf, sizeof buf) == 5, "read the 5 bytes");
  CHECK(read(s, buf, sizeof buf) < 0 && errno == EAGAIN, "then EAGAIN");
  write_all(c, "again", 5);
  CHECK(wait_tags(ep, 3000, T_ACCEPTED) & T_ACCEPTED, "edge: new data after EAGAIN is a new edge");
  drain(s);

  write_all(s, "x", 1);
  CHECK(wait_tags(ep, 3000, T_ONESHOT) & T_ONESHOT, "oneshot: first report");
  write_all(s, "y", 1);
  CHECK(!(wait_tags(ep, 150, 0) & T_ONESHOT), "oneshot: disarmed until EPOLL_CTL_MOD");
  CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, c, &ev) == 0, "oneshot: re-armed with MOD");
  CHECK(wait_tags(ep, 3000, T_ONESHOT) & T_ONESHOT, "oneshot: reported again after MOD");
  drain(c);

  CHECK(epoll_ctl(ep, EPOLL_CTL_DEL, u[0], NULL) == 0, "DEL AF_UNIX");
  write_all(u[1], "u", 1);
  CHECK(!(wait_tags(ep, 100, 0) & T_UNIX), "deleted AF_UNIX member not reported");
  drain(u[0]);

  int spare = socket(AF_INET, SOCK_STREAM, 0);
  ev.events = EPOLLIN;
  CHECK(epoll_ctl(ep, EPOLL_CTL_DEL, d1, NULL) == 0, "DEL UDP");
  CHECK(epoll_ctl(ep, EPOLL_CTL_DEL, d1, NULL) < 0 && errno == ENOENT, "DEL twice: ENOENT");
  close(spare);

  /* Timeouts and blocking wake-ups. */
  double t0 = now_ms();
  int n = epoll_wait(ep, (struct epoll_event[4]){0}, 4, 200);
  double took = now_ms() - t0;
  CHECK(n == 0 && took >= 190 && took < 3000, "epoll_wait(200 ms) on an idle set returns 0 after %.0f ms", took);
  ev.events = EPOLLIN;
  ev.data.u64 = T_UNIX;
  epoll_ctl(ep, EPOLL_CTL_ADD, u[0], &ev);
  pthread_t th;
  struct delayed dk = {u[1], 50, "k"};
  pthread_create(&th, NULL, delayed_write, &dk);
  t0 = now_ms();
  seen = wait_tags(ep, 5000, T_UNIX);
  took = now_ms() - t0;
  pthread_join(th, NULL);
  CHECK((seen & T_UNIX) && took < 4000, "blocked epoll_wait woken by a kernel fd after %.0f ms", took);
  drain(u[0]);
  struct delayed dg = {c, 50, "g"};
  pthread_create(&th, NULL, delayed_write, &dg);
  t0 = now_ms();
  struct epoll_event got[4];
  n = epoll_wait(ep, got, 4, 5000);
  took = now_ms() - t0;
  pthread_join(th, NULL);
  CHECK(n == 1 && got[0].data.u64 == T_ACCEPTED && took < 4000,
        "blocked epoll_wait woken by gpusock data after %.0f ms", took);

  /* poll and select over the same mix. */
  write_all(u[1], "p", 1);
  struct pollfd p[3] = {{u[0], POLLIN, 0}, {s, POLLIN, 0}, {d1, POLLIN, 0}};
  CHECK(poll(p, 3, 2000) == 2 && (p[0].revents & POLLIN) && (p[1].revents & POLLIN) && !p[2].revents,
        "poll over AF_UNIX, gpusock and UDP");
  fd_set rs;
  FD_ZERO(&rs);
  FD_SET(u[0], &rs);
  FD_SET(s, &rs);
  FD_SET(d1, &rs);
  struct timeval tv = {2, 0};
  int maxfd = u[0] > s ? u[0] : s;
  if (d1 > maxfd) maxfd = d1;
  CHECK(select(maxfd + 1, &rs, NULL, NULL, &tv) == 2 && FD_ISSET(s, &rs) && FD_ISSET(u[0], &rs) && !FD_ISSET(d1, &rs),
        "select over AF_UNIX, gpusock and UDP");
  drain(u[0]);
  drain(s);

  /* A gpusock member that stays readable hides no kernel member (the shim
   * asks the kernel less often while it has gpusock events to give), and a
   * non-blocking wait with only a kernel member ready reports it at once. */
  int ep2 = epoll_create1(EPOLL_CLOEXEC);
  ev.events = EPOLLIN;
  ev.data.u64 = T_ACCEPTED;
  CHECK(ep2 >= 0 && epoll_ctl(ep2, EPOLL_CTL_ADD, s, &ev) == 0, "second set: ADD the accepted socket, level");
  ev.data.u64 = T_UNIX;
  CHECK(epoll_ctl(ep2, EPOLL_CTL_ADD, u[0], &ev) == 0, "second set: ADD AF_UNIX");
  write_all(u[1], "k", 1);
  n = epoll_wait(ep2, got, 4, 0);
  CHECK(n == 1 && got[0].data.u64 == T_UNIX, "non-blocking epoll_wait reports the ready kernel member (%d)", n);
  drain(u[0]);
  write_all(c, "g", 1);
  CHECK(wait_tags(ep2, 3000, T_ACCEPTED) & T_ACCEPTED, "second set: the gpusock member is readable");
  write_all(u[1], "k", 1);
  unsigned both = 0;
  int calls = 0;
  t0 = now_ms();
  while (both != (T_ACCEPTED | T_UNIX) && now_ms() - t0 < 2000) {
    n = epoll_wait(ep2, got, 4, 0);
    ++calls;
    for (int i = 0; i < n; ++i) both |= (unsigned)got[i].data.u64;
  }
  CHECK(both == (T_ACCEPTED | T_UNIX),
        "a kernel member is reported beside an always-ready gpusock one (%d calls, %.1f ms)", calls, now_ms() - t0);
  close(ep2);
  drain(u[0]);
  drain(s);

  /* A signal interrupts a blocked epoll_wait with EINTR. */
  struct sigaction sa = {.sa_handler = on_alarm};
  sigaction(SIGALRM, &sa, NULL);
  struct itimerval it = {.it_value = {0, 100000}};
  setitimer(ITIMER_REAL, &it, NULL);
  t0 = now_ms();
  n = epoll_wait(ep, got, 4, 5000);
  took = now_ms() - t0;
  CHECK(n < 0 && errno == EINTR && alarms == 1 && took < 4000, "SIGALRM interrupts epoll_wait: EINTR after %.0f ms",
        took);
  /* ... and a blocking read, which an SA_RESTART handler restarts instead. */
  int fl = fcntl(s, F_GETFL);
  CHECK(fcntl(s, F_SETFL, fl & ~O_NONBLOCK) == 0 && !(fcntl(s, F_GETFL) & O_NONBLOCK), "F_SETFL clears O_NONBLOCK");
  setitimer(ITIMER_REAL, &it, NULL);
  CHECK(read(s, buf, 1) < 0 && errno == EINTR && alarms == 2, "SIGALRM interrupts a blocking read: EINTR");
  sa.sa_flags = SA_RESTART;
  sigaction(SIGALRM, &sa, NULL);
  setitimer(ITIMER_REAL, &it, NULL);
  struct delayed dr = {c, 400, "r"};
  pthread_create(&th, NULL, delayed_write, &dr);
  CHECK(read(s, buf, 1) == 1 && buf[0] == 'r' && alarms == 3, "SA_RESTART: the read restarts and returns data");
  pthread_join(th, NULL);
  int on = 1;
  CHECK(ioctl(s, FIONBIO, &on) == 0 && (fcntl(s, F_GETFL) & O_NONBLOCK), "FIONBIO sets O_NONBLOCK");
  struct timeval rcv = {0, 200000};
  CHECK(setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &rcv, sizeof rcv) == 0, "SO_RCVTIMEO set");
  fcntl(c, F_SETFL, 0);
  t0 = now_ms();
  CHECK(read(c, buf, 1) < 0 && errno == EAGAIN && now_ms() - t0 >= 150, "SO_RCVTIMEO: blocking read times out");

  /* dup, then close: the socket lives while a dup does; close leaves the set. */
  int s2 = dup(s);
  CHECK(s2 >= 0 && !strcmp(fd_kind(s2), fd_kind(s)), "dup of a TCP socket");
  close(s);
  write_all(c, "z", 1);
  struct pollfd q = {s2, POLLIN, 0};
  CHECK(poll(&q, 1, 3000) == 1 && read(s2, buf, 1) == 1 && buf[0] == 'z',
        "the dup still receives after close of the original");
  n = epoll_wait(ep, got, 4, 100);
  int stale = 0;
  for (int i = 0; i < n; ++i) stale |= got[i].data.u64 == T_ACCEPTED;
  CHECK(!stale, "a closed fd left the epoll set");
  int e2 = dup(ep);
  ev.events = EPOLLIN;
  ev.data.u64 = T_SECOND;
  CHECK(epoll_ctl(e2, EPOLL_CTL_ADD, s2, &ev) == 0, "ADD through a dup of the epoll fd");
  write_all(c, "w", 1);
  CHECK(wait_tags(ep, 3000, T_SECOND) & T_SECOND, "the original epoll fd sees members added through its dup");
  close(e2);
  close(s2);
  close(c);
  close(l);
  close(ep);
  return failures;
}

/* ------------------------------------------------------------------ options */

static int sockopts(int port) {
  int l = tcp_listen(port, 0);
  int c = tcp_connect(port, 0);
  int s = accept(l, NULL, NULL);
  CHECK(l >= 0 && c >= 0 && s >= 0, "connection on %d", port);
  int v;
  socklen_t vl = sizeof v;
  getsockopt(c, SOL_SOCKET, SO_RCVBUF, &v, &vl);
  printf("SO_RCVBUF %d\n", v);
  vl = sizeof v;
  getsockopt(c, SOL_SOCKET, SO_SNDBUF, &v, &vl);
  printf("SO_SNDBUF %d\n", v);
  for (int opt = 0; opt < 4; ++opt) {
    vl = sizeof v;
    if (getsockopt(c, 0x10000 /* SOL_RDMA */, opt, &v, &vl) == 0) printf("SOL_RDMA %d %d\n", opt, v);
  }
  fflush(stdout);
  close(s);
  close(c);
  close(l);
  return failures;
}

/* memcached's "STAT time" value (it changes when memcached's clock ticks). */
static long stat_time(int fd) {
  if (write_all(fd, "stats\r\n", 7) < 0) return -1;
  static char buf[16384];
  size_t got = 0;
  for (;;) {
    ssize_t n = read(fd, buf + got, sizeof buf - 1 - got);
    if (n <= 0) return -1;
    got += (size_t)n;
    buf[got] = 0;
    if (strstr(buf, "END\r\n")) break;
  }
  char *t = strstr(buf, "STAT time ");
  return t ? atol(t + 10) : -1;
}

/* Connects, asks memcached for its version, then waits for the server to end
 * the connection; exit 0 on an orderly EOF. With PID and PHASE: find a tick of
 * memcached's once-a-second clock (the "time" stat changes), wait PHASE ms,
 * send PID SIGTERM and print when (CLOCK_REALTIME ns). */
static int hold(int port, pid_t pid, int phase_ms) {
  int fd = tcp_connect(port, 0);
  CHECK(fd >= 0, "hold: connected to %d", port);
  if (fd < 0) return 1;
  char buf[256];
  CHECK(write_all(fd, "version\r\n", 9) == 0, "hold: sent version");
  ssize_t n = read(fd, buf, sizeof buf - 1);
  buf[n > 0 ? n : 0] = 0;
  CHECK(n > 0 && !strncmp(buf, "VERSION", 7), "hold: server answered %.20s", buf);
  printf("holding\n");
  if (pid > 0) {
    long t0 = stat_time(fd), t;
    while ((t = stat_time(fd)) == t0 && t >= 0) usleep(2000);
    CHECK(t > t0, "hold: memcached's clock ticked (time %ld -> %ld)", t0, t);
    usleep((useconds_t)phase_ms * 1000);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    kill(pid, SIGTERM);
    printf("sigterm-sent-ns %lld\n", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
  }
  double t0 = now_ms();
  while ((n = read(fd, buf, sizeof buf)) > 0) {}
  CHECK(n == 0, "hold: orderly EOF when the server stopped (after %.0f ms)", now_ms() - t0);
  close(fd);
  return failures;
}

int main(int argc, char **argv) {
  self_path = argv[0];
  setvbuf(stdout, NULL, _IOLBF, 0);
  srand((unsigned)getpid());
  signal(SIGPIPE, SIG_IGN);
  if (argc >= 3 && !strcmp(argv[1], "echo-server")) return echo_server(atoi(argv[2]), argc > 3 ? atoi(argv[3]) : 1);
  if (argc >= 4 && !strcmp(argv[1], "echo-client")) return echo_client(atoi(argv[2]), strtoul(argv[3], NULL, 0));
  if (argc >= 3 && !strcmp(argv[1], "fork-server")) return fork_server(atoi(argv[2]));
  if (argc >= 3 && !strcmp(argv[1], "fork-child")) return fork_child(atoi(argv[2]));
  if (argc >= 5 && !strcmp(argv[1], "fork-client"))
    return fork_client(atoi(argv[2]), strtoul(argv[3], NULL, 0), argv[4]);
  if (argc >= 3 && !strcmp(argv[1], "epoll-mix")) return epoll_mix(atoi(argv[2]));
  if (argc >= 3 && !strcmp(argv[1], "sockopts")) return sockopts(atoi(argv[2]));
  if (argc >= 3 && !strcmp(argv[1], "hold"))
    return hold(atoi(argv[2]), argc > 3 ? atoi(argv[3]) : 0, argc > 4 ? atoi(argv[4]) : 0);
  if (argc >= 2 && !strcmp(argv[1], "socket")) {
    int sv[2];
    printf("unix: %s\n", socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0 ? "ok" : strerror(errno));
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    printf("udp: %s\n", u >= 0 ? "ok" : strerror(errno));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
      printf("socket: %s\n", strerror(errno));
      return 3;
    }
    printf("socket: ok\n");
    return 0;
  }
  fprintf(stderr, "usage: see the top of preload_probe.c\n");
  return 2;
}
