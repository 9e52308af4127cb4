/* prefork_probe: the ways servers share a listener between processes, and
 * dual-stack listeners, written as ordinary socket programs (plain POSIX
 * calls, no gpusock headers) that the preload tests run under the shim and on
 * kernel TCP alike.
 *
 *   server MODE PORT CONNS [WORKERS]  listen on 127.0.0.1:PORT ($PREFORK_ADDR), then
 *       single         accept CONNS connections (no fork: the reference)
 *       master         fork a child that never touches the listener; the
 *                      master accepts CONNS connections itself
 *       worker         fork one worker that accepts CONNS; the master waits
 *       epoll|poll|select
 *                      fork WORKERS workers that wait on the (non-blocking)
 *                      listener with that call and accept until CONNS were
 *                      served in all; the master only waits
 *       daemon         daemonize (fork, setsid, fork; the parents exit), the
 *                      daemon accepts CONNS; its pid goes to $PIDFILE
 *       once           WORKERS workers that each accept one connection with a
 *                      blocking accept, serve it and exit; the master forks
 *                      a new one for each that exits until CONNS were served
 *                      (apache2's MaxConnectionsPerChild 1: a worker must not
 *                      take connections it will not serve)
 *     Every connection: once the client has sent its first bytes the server
 *     sends "pid N\n", then echoes to EOF.
 *     Exit status: the number of failed checks (workers report theirs).
 *   client PORT CONNS BYTES   CONNS connections one after another (4 at a
 *                             time, $PREFORK_CLIENT_THREADS): send BYTES, read
 *                             them back, compare;
 *                             print the pids that served them
 *   dualstack PORT V6ONLY     IPv4 and IPv6 wildcard listeners on one port as
 *                             the kernel has them, and clients over 127.0.0.1,
 *                             ::1 and ::ffff:127.0.0.1
 *
 * Every check prints "ok: ..." or "FAIL: ...". With EXPECT_GPUSOCK=1 accepted
 * sockets must be gpusock sockets (the library's eventfd in /proc/self/fd). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "probe_io.h"

static int failures;

#define CHECK(cond, ...)                                                    \
  do {                                                                      \
    const int ok_ = (cond);                                                 \
    const int errno_ = errno;                                               \
    printf("%s: [%d] ", ok_ ? "ok" : "FAIL", (int)getpid());                \
    printf(__VA_ARGS__);                                                    \
    if (!ok_) {                                                             \
      printf("   (%s:%d, errno %s)", __FILE__, __LINE__, strerror(errno_)); \
      ++failures;                                                           \
    }                                                                       \
    printf("\n");                                                           \
    fflush(stdout);                                                         \
  } while (0)

static void expect_gpusock(int fd, const char *what) {
  const char *want = getenv("EXPECT_GPUSOCK");
  if (want && atoi(want)) CHECK(fd_is_gpusock(fd), "%s fd %d is a gpusock socket", what, fd);
}

/* The server's address: $PREFORK_ADDR (an RDMA NIC's), else 127.0.0.1. */
static const char *server_addr(void) {
  const char *a = getenv("PREFORK_ADDR");
  return a && *a ? a : "127.0.0.1";
}

static socklen_t make_addr(struct sockaddr_storage *ss, const char *ip, int port) {
  memset(ss, 0, sizeof *ss);
  if (strchr(ip, ':')) {
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(port);
    inet_pton(AF_INET6, ip, &a->sin6_addr);
    return sizeof *a;
  }
  struct sockaddr_in *a = (struct sockaddr_in *)ss;
  a->sin_family = AF_INET;
  a->sin_port = htons(port);
  inet_pton(AF_INET, ip, &a->sin_addr);
  return sizeof *a;
}

/* v6only < 0: leave IPV6_V6ONLY as the system has it. */
static int listen_on(const char *ip, int port, int flags, int v6only) {
  struct sockaddr_storage ss;
  socklen_t len = make_addr(&ss, ip, port);
  int fd = socket(ss.ss_family, SOCK_STREAM | flags, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (v6only >= 0) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only);
  if (bind(fd, (struct sockaddr *)&ss, len) < 0 || listen(fd, 64) < 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

static int connect_to(const char *ip, int port) {
  struct sockaddr_storage ss;
  socklen_t len = make_addr(&ss, ip, port);
  for (int tries = 0; tries < 100; ++tries) {
    int fd = socket(ss.ss_family, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&ss, len) == 0) return fd;
    int e = errno;
    close(fd);
    errno = e;
    if (e != ECONNREFUSED) return -1;
    usleep(100000); /* the server may still be starting */
  }
  return -1;
}

/* One connection on the server side: once the client has spoken, say who
 * serves it, then echo to EOF. */
static int serve(int c) {
  char hello[32], buf[65536];
  int n = snprintf(hello, sizeof hello, "pid %d\n", (int)getpid());
  for (int said = 0;;) {
    ssize_t r = read(c, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return (int)r;
    if (!said++ && write_all(c, hello, (size_t)n) < 0) return -1;
    if (write_all(c, buf, (size_t)r) < 0) return -1;
  }
}

/* Accepts on a blocking listener and serves; returns how many were served. */
static int accept_serially(int lfd, int conns, const char *who) {
  int served = 0;
  for (int i = 0; i < conns; ++i) {
    int c = accept(lfd, NULL, NULL);
    if (c < 0 && errno == EINTR) {
      --i;
      continue;
    }
    CHECK(c >= 0, "%s accepted connection %d", who, i + 1);
    if (c < 0) return served;
    expect_gpusock(c, who);
    if (serve(c) == 0) ++served;
    close(c);
  }
  return served;
}

/* A worker waiting on the non-blocking listener with `how`; serves until the
 * shared counter says all were served (a pipe to the master carries counts). */
static int wait_readable(int lfd, const char *how, int epfd) {
  if (!strcmp(how, "epoll")) {
    struct epoll_event ev;
    return epoll_wait(epfd, &ev, 1, 200);
  }
  if (!strcmp(how, "poll")) {
    struct pollfd p = {lfd, POLLIN, 0};
    return poll(&p, 1, 200);
  }
  fd_set r;
  FD_ZERO(&r);
  FD_SET(lfd, &r);
  struct timeval tv = {0, 200000};
  return select(lfd + 1, &r, NULL, NULL, &tv);
}

static volatile sig_atomic_t stop;
static void on_term(int sig) {
  (void)sig;
  stop = 1;
}

static int worker(int lfd, const char *how, int report) {
  int epfd = -1, served = 0;
  if (!strcmp(how, "epoll")) {
    epfd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd};
    CHECK(epoll_ctl(epfd, EPOLL_CTL_ADD, lfd, &ev) == 0, "worker: epoll_ctl ADD of the inherited listener");
  }
  while (!stop) {
    int n = wait_readable(lfd, how, epfd);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      CHECK(0, "worker: %s on the listener", how);
      break;
    }
    for (;;) {
      int c = accept4(lfd, NULL, NULL, 0);
      if (c < 0) {
        CHECK(errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR, "worker: accept4 says EAGAIN when empty");
        break;
      }
      fcntl(c, F_SETFL, 0);
      expect_gpusock(c, "worker: accepted");
      if (serve(c) == 0) ++served;
      close(c);
      if (write(report, "x", 1) != 1) break;
    }
  }
  printf("worker %d served %d\n", (int)getpid(), served);
  return failures;
}

/* Waits for the children; their exit status is their failure count. */
static void reap(pid_t *pids, int n) {
  for (int i = 0; i < n; ++i) {
    int st = 0;
    CHECK(waitpid(pids[i], &st, 0) == pids[i] && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d exited cleanly",
          (int)pids[i]);
  }
}

static int run_server(const char *mode, int port, int conns, int workers) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  int pool = !strcmp(mode, "epoll") || !strcmp(mode, "poll") || !strcmp(mode, "select");
  int lfd = listen_on(server_addr(), port, pool ? SOCK_NONBLOCK : 0, -1);
  CHECK(lfd >= 0, "server (%s) listening on %d", mode, port);
  if (lfd < 0) return failures;
  if (!strcmp(mode, "single")) { /* no fork: the reference */
    CHECK(accept_serially(lfd, conns, "single") == conns, "served all %d connections", conns);
  } else if (!strcmp(mode, "master")) {
    pid_t child = fork();
    if (child == 0) { /* a child with other work: never touches the listener */
      usleep(200000);
      _exit(0);
    }
    CHECK(accept_serially(lfd, conns, "master") == conns, "master served all %d connections", conns);
    reap(&child, 1);
  } else if (!strcmp(mode, "worker")) {
    pid_t child = fork();
    /* exit(), not _exit(): what is still in gpusock's send rings goes out at exit */
    if (child == 0) exit(accept_serially(lfd, conns, "worker") == conns ? failures : failures + 1);
    close(lfd); /* the master keeps nothing open */
    reap(&child, 1);
  } else if (pool) {
    int report[2];
    pid_t pids[16];
    if (workers > 16) workers = 16;
    CHECK(pipe(report) == 0, "report pipe");
    signal(SIGTERM, on_term);
    for (int i = 0; i < workers; ++i) {
      pids[i] = fork();
      if (pids[i] == 0) {
        close(report[0]);
        exit(worker(lfd, mode, report[1]));
      }
    }
    close(report[1]);
    int total = 0;
    char x;
    while (total < conns && read(report[0], &x, 1) == 1) ++total;
    CHECK(total == conns, "the workers served all %d connections", conns);
    for (int i = 0; i < workers; ++i) kill(pids[i], SIGTERM);
    reap(pids, workers);
  } else if (!strcmp(mode, "once")) {
    int alive = 0, started = 0, served = 0, failed = 0;
    while (served + failed < conns) {
      for (; alive < workers && started < conns; ++alive, ++started) {
        pid_t p = fork();
        if (p == 0) {
          failures = 0; /* the master's count is not the worker's */
          exit(accept_serially(lfd, 1, "once") == 1 ? failures : failures + 1);
        }
        if (p < 0) break;
      }
      int st = 0;
      const pid_t p = wait(&st);
      if (p < 0) break;
      --alive;
      const int clean = WIFEXITED(st) && WEXITSTATUS(st) == 0;
      CHECK(clean, "once: worker %d exited cleanly (wait status 0x%x)", (int)p, st);
      if (clean) ++served;
      else ++failed;
    }
    CHECK(served == conns, "%d one-connection workers served all %d connections (%d failed)", started, conns, failed);
  } else if (!strcmp(mode, "daemon")) {
    if (fork() > 0) _exit(0); /* the parent returns to the shell at once */
    setsid();
    if (fork() > 0) _exit(0);
    const char *pidfile = getenv("PIDFILE");
    FILE *f = pidfile ? fopen(pidfile, "w") : NULL;
    if (f) {
      fprintf(f, "%d\n", (int)getpid());
      fclose(f);
    }
    CHECK(accept_serially(lfd, conns, "daemon") == conns, "daemon served all %d connections", conns);
  } else {
    fprintf(stderr, "unknown mode %s\n", mode);
    return 1;
  }
  return failures;
}

/* ------------------------------------------------------------------ clients */

struct client_job {
  int port, conns, bytes, failures;
  int served_by[64];
};

/* One connection: returns the serving pid, or -1. */
static int one_exchange(const char *ip, int port, int bytes) {
  int fd = connect_to(ip, port);
  if (fd < 0) {
    printf("client: connect to %s port %d: %s\n", ip, port, strerror(errno));
    return -1;
  }
  unsigned char *out = malloc((size_t)bytes), *in = malloc((size_t)bytes);
  for (int i = 0; i < bytes; ++i) out[i] = (unsigned char)(i * 131 + fd);
  int ok = write_all(fd, out, (size_t)bytes) == 0;
  char line[32] = {0};
  size_t got = 0;
  while (got < sizeof line - 1 && (got == 0 || line[got - 1] != '\n'))
    if (read(fd, line + got, 1) != 1) break;
    else ++got;
  int pid = -1;
  if (sscanf(line, "pid %d", &pid) != 1) pid = -1;
  size_t n = 0;
  while (ok && n < (size_t)bytes) {
    ssize_t r = read(fd, in + n, (size_t)bytes - n);
    if (r <= 0) break;
    n += (size_t)r;
  }
  ok = ok && n == (size_t)bytes && memcmp(in, out, (size_t)bytes) == 0;
  if (!ok) printf("client: connection served by %d: %zu of %d bytes back (%s)\n", pid, n, bytes, strerror(errno));
  free(out);
  free(in);
  close(fd);
  return ok ? pid : -1;
}

static void *client_thread(void *arg) {
  struct client_job *j = arg;
  for (int i = 0; i < j->conns; ++i) {
    j->served_by[i] = one_exchange(server_addr(), j->port, j->bytes);
    if (j->served_by[i] < 0) ++j->failures;
  }
  return NULL;
}

static int run_clients(int port, int conns, int bytes) {
  enum { kMaxThreads = 4 };
  /* $PREFORK_CLIENT_THREADS: 1 for clients under rdma-core 44's librspreload,
   * which is not reliable with threads. */
  const char *env = getenv("PREFORK_CLIENT_THREADS");
  int kThreads = env && atoi(env) > 0 && atoi(env) < kMaxThreads ? atoi(env) : kMaxThreads;
  struct client_job jobs[kMaxThreads];
  pthread_t t[kMaxThreads];
  for (int i = 0; i < kThreads; ++i) {
    jobs[i] = (struct client_job){port, conns / kThreads + (i < conns % kThreads), bytes, 0, {0}};
    if (jobs[i].conns > 64) jobs[i].conns = 64;
    if (kThreads > 1) pthread_create(&t[i], NULL, client_thread, &jobs[i]);
    else client_thread(&jobs[0]); /* no thread at all */
  }
  int pids[64 * kMaxThreads], npids = 0, done = 0, bad = 0;
  for (int i = 0; i < kThreads; ++i) {
    if (kThreads > 1) pthread_join(t[i], NULL);
    bad += jobs[i].failures;
    for (int k = 0; k < jobs[i].conns; ++k, ++done) {
      int p = jobs[i].served_by[k], seen = 0;
      for (int m = 0; m < npids; ++m) seen |= pids[m] == p;
      if (p > 0 && !seen) pids[npids++] = p;
    }
  }
  CHECK(bad == 0, "client: %d connections of %d bytes each echoed intact (%d failed)", done, bytes, bad);
  printf("served by %d process(es):", npids);
  for (int m = 0; m < npids; ++m) printf(" %d", pids[m]);
  printf("\n");
  return failures;
}

/* ------------------------------------------------------------------ dual stack */

/* Connects to ip, accepts on whichever of the listeners takes it; which one
 * and the peer address family are checked. */
static void dual_case(const char *ip, int port, int *lfds, const char **names, int want, int want_family) {
  int c = connect_to(ip, port);
  CHECK(c >= 0, "connect to %s port %d", ip, port);
  if (c < 0) return;
  struct pollfd p[2] = {{lfds[0], POLLIN, 0}, {lfds[1], POLLIN, 0}};
  int n = poll(p, lfds[1] >= 0 ? 2 : 1, 5000);
  int which = n > 0 ? ((p[0].revents & POLLIN) ? 0 : 1) : -1;
  CHECK(which == want, "%s reaches the %s listener", ip, want >= 0 ? names[want] : "?");
  if (which >= 0) {
    struct sockaddr_storage peer;
    socklen_t pl = sizeof peer;
    int a = accept(lfds[which], (struct sockaddr *)&peer, &pl);
    CHECK(a >= 0 && peer.ss_family == want_family, "accepted, peer address family %s",
          want_family == AF_INET6 ? "AF_INET6" : "AF_INET");
    if (a >= 0) {
      char buf[5] = {0};
      CHECK(write_all(c, "ping", 4) == 0 && read(a, buf, 4) == 4 && !strcmp(buf, "ping"), "bytes arrive");
      close(a);
    }
  }
  close(c);
}

static int run_dualstack(int port, int v6only) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *names[2];
  int lfds[2];
  if (v6only) { /* both wildcards, as memcached and redis listen */
    lfds[0] = listen_on("0.0.0.0", port, 0, -1);
    lfds[1] = listen_on("::", port, 0, 1);
    names[0] = "0.0.0.0";
    names[1] = "[::] (V6ONLY)";
    CHECK(lfds[0] >= 0 && lfds[1] >= 0, "0.0.0.0 and [::] with IPV6_V6ONLY listen on one port");
    dual_case("127.0.0.1", port, lfds, names, 0, AF_INET);
    dual_case("::1", port, lfds, names, 1, AF_INET6);
    dual_case("::ffff:127.0.0.1", port, lfds, names, 0, AF_INET);
  } else { /* one dual-stack listener, as python3 -m http.server and apache2 */
    lfds[0] = listen_on("::", port, 0, 0);
    names[0] = "[::] (dual stack)";
    CHECK(lfds[0] >= 0, "[::] without IPV6_V6ONLY listens");
    lfds[1] = listen_on("0.0.0.0", port + 1, 0, -1); /* another port: no conflict */
    names[1] = "0.0.0.0 (other port)";
    int clash = listen_on("0.0.0.0", port, 0, -1);
    CHECK(clash < 0 && errno == EADDRINUSE, "0.0.0.0 on the same port: EADDRINUSE, as the kernel says");
    if (clash >= 0) close(clash);
    dual_case("127.0.0.1", port, lfds, names, 0, AF_INET6);
    dual_case("::1", port, lfds, names, 0, AF_INET6);
    dual_case("::ffff:127.0.0.1", port, lfds, names, 0, AF_INET6);
  }
  return failures;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  if (argc >= 5 && !strcmp(argv[1], "server"))
    return run_server(argv[2], atoi(argv[3]), atoi(argv[4]), argc > 5 ? atoi(argv[5]) : 2);
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc >= 5 && !strcmp(argv[1], "client")) return run_clients(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
  if (argc >= 4 && !strcmp(argv[1], "dualstack")) return run_dualstack(atoi(argv[2]), atoi(argv[3]));
  fprintf(stderr, "usage: see the top of prefork_probe.c\n");
  return 2;
}
