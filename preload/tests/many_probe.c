/* many_probe: many connections in one process, plain POSIX calls and one
 * epoll set on each side, the way event-driven servers and load generators
 * hold them. The preload tests run it under libgpusock_preload.so.
 *
 *   server PORT CONNS        a single-threaded epoll echo server: after one
 *                            connection to itself, accepts until CONNS + 1
 *                            connections (the clients' warm-up and CONNS)
 *                            have come and gone, echoing each to EOF; prints
 *                            its open fds when CONNS are open and after all
 *                            closed, against those after its warm-up
 *   clients PORT CONNS BYTES one warm-up connection, then CONNS: through one
 *                            epoll set sends BYTES of a pattern of its own on
 *                            each and checks every byte of the echo; prints
 *                            its open fds with all open and after close
 *
 * Every check prints "ok: ..." or "FAIL: ..."; the exit status is the number
 * of failures. "fds: NAME N" lines are for the test to compare. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "probe_check.h"

/* Descriptors a process makes once, at the first use of something a warm-up
 * connection does not use (the zero-copy path's watcher at the first large
 * send): allowed beside the baseline, however many connections came. */
#define LAZY_FDS 4

static int open_fds(void) {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  for (struct dirent *e; (e = readdir(d));)
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n - 1; /* the directory's own */
}

/* A field of /proc/self/status in kB (RssAnon, RssShmem), -1 if absent. */
static long status_kb(const char *field) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long kb = -1;
  const size_t len = strlen(field);
  while (kb < 0 && fgets(line, sizeof line, f))
    if (!strncmp(line, field, len) && line[len] == ':') kb = strtol(line + len + 1, NULL, 10);
  fclose(f);
  return kb;
}

/* "mem: WHO anon_kB shmem_kB": the process's private and shared resident
 * memory, for scripts/conn-memory to compare against its baseline. */
static void print_mem(const char *who) {
  printf("mem: %s %ld %ld\n", who, status_kb("RssAnon"), status_kb("RssShmem"));
}

/* The byte at offset i of connection c's stream. */
static unsigned char pattern(int c, size_t i) { return (unsigned char)((c * 131u + i * 7u + (i >> 9)) ^ 0x5a); }

static void raise_fd_limit(void) {
  struct rlimit r;
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

static double now_s(void) { return now_ms() / 1e3; }

/* After every connection closed: back to `baseline` descriptors (closes
 * finish in the background, DISCONNECT then teardown: give them time). */
static void check_back_to(int baseline, const char *who) {
  int after = open_fds();
  for (double until = now_s() + 10; after > baseline + LAZY_FDS && now_s() < until; after = open_fds()) usleep(20000);
  printf("fds: %s-after %d\n", who, after - baseline);
  CHECK(after <= baseline + LAZY_FDS, "%s: back to %d fds after every connection closed (%d)", who, baseline, after);
}

/* ------------------------------------------------------------------ server */

static int server(int port, int conns) {
  raise_fd_limit();
  int l = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK(l >= 0 && bind(l, (struct sockaddr *)&a, sizeof a) == 0 && listen(l, 4096) == 0, "server listening on %d",
        port);
  if (failures) return failures;
  /* One connection to itself first: what a process makes once, at its first
   * connection (the transport's helpers), is then in the baseline. */
  int self = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  CHECK(connect(self, (struct sockaddr *)&a, sizeof a) == 0 || errno == EINPROGRESS, "server: warm-up connect");
  int peer = -1;
  for (double until = now_s() + 10; peer < 0 && now_s() < until;)
    if ((peer = accept4(l, NULL, NULL, SOCK_CLOEXEC)) < 0) usleep(1000);
  CHECK(peer >= 0, "server: warm-up connection accepted");
  close(peer);
  close(self);
  usleep(300000);
  const int baseline = open_fds();
  print_mem("server-base");
  int ep = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = l};
  CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev) == 0, "server: listener in the epoll set");
  int accepted = 0, open_now = 0, closed = 0, peak_fds = 0, said_mem = 0;
  static char buf[65536];
  const int expected = conns + 1; /* the clients' warm-up connection too */
  while (closed < expected) {
    struct epoll_event evs[256];
    int n = epoll_wait(ep, evs, 256, 60000);
    if (n <= 0) {
      CHECK(0, "server: epoll_wait returned %d (%s) with %d of %d closed", n, strerror(errno), closed, expected);
      break;
    }
    for (int i = 0; i < n; ++i) {
      int fd = evs[i].data.fd;
      if (fd == l) {
        for (int c; (c = accept4(l, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0;) {
          struct epoll_event cev = {.events = EPOLLIN, .data.fd = c};
          if (epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev) != 0) CHECK(0, "server: ADD connection %d", c);
          ++accepted;
          if (++open_now >= conns) { /* all open (the warm-up's close may lag) */
            const int n_fds = open_fds();
            if (n_fds > peak_fds) peak_fds = n_fds;
            if (!said_mem) print_mem("server-open");
            said_mem = 1;
          }
        }
        continue;
      }
      ssize_t r;
      while ((r = read(fd, buf, sizeof buf)) > 0) {
        for (ssize_t off = 0; off < r;) { /* the client reads as it writes: a blocking-ish push is fine */
          ssize_t w = write(fd, buf + off, (size_t)(r - off));
          if (w > 0) off += w;
          else if (w < 0 && errno != EAGAIN && errno != EINTR) break;
        }
      }
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
        epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
        close(fd);
        --open_now;
        ++closed;
      }
    }
  }
  printf("fds: server-open %d\n", peak_fds - baseline);
  CHECK(accepted == expected, "server: accepted %d of %d connections", accepted, expected);
  CHECK(closed == expected, "server: all %d connections closed by their clients", expected);
  close(ep);
  check_back_to(baseline, "server");
  close(l);
  return failures;
}

/* ------------------------------------------------------------------ clients */

struct conn {
  int fd;
  size_t sent, got;
};

static int clients(int port, int conns, size_t bytes) {
  raise_fd_limit();
  struct conn *cs = calloc((size_t)conns, sizeof *cs);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  /* A warm-up connection, as the server's: the baseline holds what a process
   * makes once. The server counts it as one of its connections. */
  int warm = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK(warm >= 0 && connect(warm, (struct sockaddr *)&a, sizeof a) == 0, "clients: warm-up connection");
  shutdown(warm, SHUT_WR);
  char c;
  CHECK(read(warm, &c, 1) == 0, "clients: warm-up connection ended by the server");
  close(warm);
  usleep(300000);
  /* The epoll set first, as load generators make theirs: with the
   * connections made until the descriptor limit, none would be left for it. */
  int ep = epoll_create1(EPOLL_CLOEXEC);
  CHECK(ep >= 0, "clients: epoll set");
  const int baseline = open_fds();
  print_mem("clients-base");
  int opened = 0;
  for (int i = 0; i < conns; ++i) {
    cs[i].fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (cs[i].fd < 0 || connect(cs[i].fd, (struct sockaddr *)&a, sizeof a) != 0) {
      CHECK(0, "clients: connection %d: %s", i, strerror(errno));
      break;
    }
    fcntl(cs[i].fd, F_SETFL, O_NONBLOCK);
    ++opened;
  }
  CHECK(opened == conns, "clients: %d of %d connections open", opened, conns);
  printf("fds: clients-open %d\n", open_fds() - baseline);
  print_mem("clients-open");
  for (int i = 0; i < opened; ++i) {
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.u32 = (uint32_t)i};
    epoll_ctl(ep, EPOLL_CTL_ADD, cs[i].fd, &ev);
  }
  static unsigned char out[16384], in[65536];
  int done = 0, bad = 0;
  while (done < opened) {
    struct epoll_event evs[256];
    int n = epoll_wait(ep, evs, 256, 60000);
    if (n <= 0) {
      CHECK(0, "clients: epoll_wait returned %d with %d of %d echoed", n, done, opened);
      break;
    }
    for (int k = 0; k < n; ++k) {
      struct conn *c = &cs[evs[k].data.u32];
      const int id = (int)evs[k].data.u32;
      if ((evs[k].events & EPOLLOUT) && c->sent < bytes) {
        size_t len = bytes - c->sent < sizeof out ? bytes - c->sent : sizeof out;
        for (size_t i = 0; i < len; ++i) out[i] = pattern(id, c->sent + i);
        ssize_t w = write(c->fd, out, len);
        if (w > 0) c->sent += (size_t)w;
        if (c->sent == bytes) { /* nothing more to write: watch reads only */
          struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)id};
          epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
        }
      }
      if (evs[k].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        ssize_t r;
        while ((r = read(c->fd, in, sizeof in)) > 0) {
          for (ssize_t i = 0; i < r; ++i)
            if (in[i] != pattern(id, c->got + (size_t)i)) ++bad;
          c->got += (size_t)r;
        }
        if (c->got >= bytes || r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
          epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
          ++done;
        }
      }
    }
  }
  size_t total = 0;
  int short_ones = 0;
  for (int i = 0; i < opened; ++i) {
    total += cs[i].got;
    if (cs[i].got != bytes) ++short_ones;
  }
  CHECK(short_ones == 0 && bad == 0, "clients: %d connections x %zu bytes echoed intact (%zu bytes, %d short, %d bad)",
        opened, bytes, total, short_ones, bad);
  for (int i = 0; i < opened; ++i) close(cs[i].fd);
  check_back_to(baseline, "clients");
  close(ep);
  free(cs);
  return failures;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN);
  if (argc >= 4 && !strcmp(argv[1], "server")) return server(atoi(argv[2]), atoi(argv[3]));
  if (argc >= 5 && !strcmp(argv[1], "clients")) return clients(atoi(argv[2]), atoi(argv[3]), strtoul(argv[4], NULL, 0));
  fprintf(stderr, "usage: see the top of many_probe.c\n");
  return 2;
}
