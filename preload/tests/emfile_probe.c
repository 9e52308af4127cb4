/* emfile_probe: a server that runs out of descriptors while connections wait
 * in its backlog. The kernel keeps them queued: accept fails with EMFILE,
 * and once descriptors are free again every waiting connection is accepted;
 * no client is refused or reset. Run on kernel TCP and under the shim.
 *
 *   server PORT N    listens, waits for N clients to be connecting, lowers
 *                    its descriptor limit and fills every free number,
 *                    accepts (EMFILE expected, twice: blocking and with
 *                    SOCK_NONBLOCK), frees one at a time for a few more
 *                    accepts (a connection or EMFILE), frees the rest,
 *                    then accepts and echoes N
 *   clients PORT N   N non-blocking connects at once, then on each: "ping"
 *                    out, "ping" back
 *   echo PORT        a poll echo server for `connects`, until killed
 *   connects PORT N  N connections, then one connect with each count of
 *                    free descriptors from none to a few: each succeeds or
 *                    fails with EMFILE, nothing else (under the shim a
 *                    connection needs descriptors at several steps); then
 *                    every connection made echoes its own bytes, and a new
 *                    one does too
 *
 * Every check prints "ok: ..." or "FAIL: ..."; the exit status is the number
 * of failures. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "probe_check.h"
#include "probe_io.h"

#define MAX_CONNS 64
/* The accepts with a few descriptors free. Not under the sanitizers: their
 * check that memory is readable (UBSan's vptr check among them) writes it
 * through a pipe, and without two free descriptors reports a false error. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define EARLY_ACCEPTS 0
#else
#define EARLY_ACCEPTS 4
#endif
/* The fewest descriptors left free for a connect. Under the sanitizers
 * enough for every connect, the shim's included (see above: the sanitized
 * shim's checks need descriptors of their own at any step of a connect). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FIRST_FREE 16
#else
#define FIRST_FREE 0
#endif

/* The highest descriptor number open in this process. */
static int highest_fd(void) {
  int high = 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return 1024;
  for (struct dirent *e; (e = readdir(d));) {
    const int fd = atoi(e->d_name);
    if (fd > high) high = fd;
  }
  closedir(d);
  return high;
}

static int read_all(int fd, char *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

/* Leaves exactly `free_n` descriptor numbers free below a lowered limit;
 * returns how many fillers were opened (to be given to let_go). */
static int hold_all_but(int free_n, int *fillers, int max, struct rlimit *saved) {
  getrlimit(RLIMIT_NOFILE, saved);
  struct rlimit low = *saved;
  low.rlim_cur = (rlim_t)highest_fd() + 1 + (rlim_t)free_n;
  if (setrlimit(RLIMIT_NOFILE, &low) != 0) return -1;
  int n = 0;
  while (n < max && (fillers[n] = open("/dev/null", O_RDONLY)) >= 0) ++n;
  for (int k = 0; k < free_n && n > 0; ++k) close(fillers[--n]);
  return n;
}

/* Closes the fillers and restores the limit: 0, or -1 with errno. */
static int let_go(int *fillers, int n, const struct rlimit *saved) {
  for (int i = 0; i < n; ++i) close(fillers[i]);
  return setrlimit(RLIMIT_NOFILE, saved);
}

static int server(int port, int n) {
  int l = tcp_listen(port, 0);
  CHECK(l >= 0, "listening on %d", port);
  if (l < 0) return failures;
  printf("listening\n");
  fflush(stdout);
  sleep(2); /* the clients connect meanwhile */
  struct pollfd pl = {l, POLLIN, 0};
  CHECK(poll(&pl, 1, 10000) == 1 && (pl.revents & POLLIN), "the listener is readable: connections wait");

  /* No descriptor left: a limit just above the highest open number, and
   * every free number below it taken. */
  struct rlimit saved;
  int hogs[4096];
  int nhogs = hold_all_but(0, hogs, 4096, &saved);
  CHECK(nhogs >= 0, "descriptor limit lowered to the highest open number + 1");
  if (nhogs < 0) nhogs = 0;

  pl.revents = 0;
  CHECK(poll(&pl, 1, 10000) == 1 && (pl.revents & POLLIN), "still readable without a descriptor to accept into");
  int c = accept(l, NULL, NULL);
  CHECK(c < 0 && (errno == EMFILE || errno == ENFILE), "a blocking accept without descriptors fails with EMFILE");
  if (c >= 0) close(c);
  c = accept4(l, NULL, NULL, SOCK_NONBLOCK);
  CHECK(c < 0 && (errno == EMFILE || errno == ENFILE), "so does accept4(SOCK_NONBLOCK)");
  if (c >= 0) close(c);

  /* A few descriptors free, one more each time: too few for a connection
   * under the shim (its endpoint and the peer's region need several), so an
   * accept takes one or says EMFILE, and refuses none. */
  int early[EARLY_ACCEPTS + 1], nearly = 0;
  for (int k = 1; k <= EARLY_ACCEPTS && nhogs > 0 && nearly < n - 1; ++k) {
    close(hogs[--nhogs]);
    c = accept(l, NULL, NULL);
    if (c >= 0) early[nearly++] = c;
    else
      CHECK(errno == EMFILE || errno == ENFILE, "with descriptors short, accept takes a connection or says EMFILE (%s)",
            strerror(errno));
  }

  CHECK(let_go(hogs, nhogs, &saved) == 0, "descriptor limit restored");
  int served = 0;
  for (int i = 0; i < n; ++i) {
    c = i < nearly ? early[i] : accept(l, NULL, NULL);
    if (c < 0) {
      CHECK(0, "accept %d of %d", i + 1, n);
      break;
    }
    char buf[4];
    if (read_all(c, buf, 4) == 0 && memcmp(buf, "ping", 4) == 0 && write_all(c, buf, 4) == 0) ++served;
    close(c);
  }
  CHECK(served == n, "all %d waiting connections accepted and served afterwards (%d)", n, served);
  close(l);
  return failures;
}

/* Every connection's "ping" goes before any echo is read, and each goes as
 * soon as its connection is up, whatever the others do: the server serves
 * them in the order it accepts them, which need not be ours, and over
 * rsocket a connect completes only when the server accepts it (kernel TCP
 * completes it from the backlog), so waiting for them in our order could wait
 * for a connection the server takes only after it has served another. */
static int clients(int port, int n) {
  int fds[MAX_CONNS], up[MAX_CONNS] = {0};
  for (int i = 0; i < n; ++i) fds[i] = tcp_connect(port, SOCK_NONBLOCK);
  int waiting = 0;
  for (int i = 0; i < n; ++i) waiting += fds[i] >= 0;
  for (int rounds = 0; waiting > 0 && rounds < 600; ++rounds) {
    struct pollfd p[MAX_CONNS];
    int at[MAX_CONNS], k = 0;
    for (int i = 0; i < n; ++i)
      if (fds[i] >= 0 && !up[i]) p[k] = (struct pollfd){fds[i], POLLOUT, 0}, at[k++] = i;
    if (poll(p, (nfds_t)k, 100) < 0) break;
    for (int j = 0; j < k; ++j) {
      if (!p[j].revents) continue;
      const int i = at[j];
      int err = 0;
      socklen_t len = sizeof err;
      --waiting;
      if (getsockopt(fds[i], SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err != 0) {
        printf("connection %d: %s\n", i, strerror(err ? err : errno));
        close(fds[i]);
        fds[i] = -1;
        continue;
      }
      up[i] = 1;
      int flags = fcntl(fds[i], F_GETFL);
      fcntl(fds[i], F_SETFL, flags & ~O_NONBLOCK);
      if (write_all(fds[i], "ping", 4) != 0) printf("connection %d: ping: %s\n", i, strerror(errno));
    }
  }
  for (int i = 0; i < n; ++i)
    if (fds[i] >= 0 && !up[i]) {
      printf("connection %d: %s\n", i, strerror(ETIMEDOUT));
      close(fds[i]);
      fds[i] = -1;
    }
  int echoed = 0;
  for (int i = 0; i < n; ++i) {
    if (fds[i] < 0) continue;
    char buf[4];
    if (read_all(fds[i], buf, 4) == 0 && memcmp(buf, "ping", 4) == 0) ++echoed;
    else printf("connection %d: no echo: %s\n", i, strerror(errno));
  }
  CHECK(echoed == n, "%d of %d connections neither refused nor reset, each echoed", echoed, n);
  for (int i = 0; i < n; ++i)
    if (fds[i] >= 0) close(fds[i]);
  return failures;
}

static int echo_server(int port) {
  int l = tcp_listen(port, 0);
  CHECK(l >= 0, "listening on %d", port);
  if (l < 0) return failures;
  printf("listening\n");
  fflush(stdout);
  struct pollfd p[MAX_CONNS * 2];
  nfds_t n = 1;
  p[0] = (struct pollfd){l, POLLIN, 0};
  for (;;) {
    if (poll(p, n, -1) < 0 && errno != EINTR) return failures + 1;
    for (nfds_t i = n; i-- > 1;) {
      if (!p[i].revents) continue;
      char buf[512];
      ssize_t got = read(p[i].fd, buf, sizeof buf);
      if (got > 0 && write_all(p[i].fd, buf, (size_t)got) == 0) continue;
      close(p[i].fd); /* EOF, or a connection its client gave up */
      p[i] = p[--n];
    }
    if (p[0].revents) {
      int c = accept(l, NULL, NULL);
      if (c >= 0 && n < MAX_CONNS * 2) p[n++] = (struct pollfd){c, POLLIN, 0};
      else if (c >= 0) close(c);
    }
  }
}

static int echoes(int fd, int id) {
  char out[64], in[64];
  for (size_t i = 0; i < sizeof out; ++i) out[i] = (char)(id * 31 + (int)i);
  return write_all(fd, out, sizeof out) == 0 && read_all(fd, in, sizeof in) == 0 && !memcmp(in, out, sizeof in);
}

static int connects(int port, int n) {
  int fds[MAX_CONNS], count = 0;
  for (int i = 0; i < n; ++i) {
    const int fd = tcp_connect(port, 0);
    CHECK(fd >= 0, "connection %d", i);
    if (fd >= 0) fds[count++] = fd;
  }
  for (int free_n = FIRST_FREE; free_n <= FIRST_FREE + 8; ++free_n) {
    static int fillers[4096];
    struct rlimit saved;
    const int held = hold_all_but(free_n, fillers, 4096, &saved);
    errno = 0;
    const int fd = held < 0 ? -1 : tcp_connect(port, 0);
    const int err = errno;
    (void)let_go(fillers, held < 0 ? 0 : held, &saved);
    if (fd >= 0) {
      printf("with %d descriptors free: connected\n", free_n);
      fds[count++] = fd;
    } else {
      CHECK(err == EMFILE || err == ENFILE, "with %d descriptors free, connect succeeds or says EMFILE (%s)", free_n,
            strerror(err));
    }
  }
  int echoed = 0;
  for (int i = 0; i < count; ++i) echoed += echoes(fds[i], i);
  CHECK(echoed == count, "every connection made echoes its own bytes (%d of %d)", echoed, count);
  const int fd = tcp_connect(port, 0);
  CHECK(fd >= 0 && echoes(fd, 99), "a new connection afterwards echoes");
  if (fd >= 0) close(fd);
  for (int i = 0; i < count; ++i) close(fds[i]);
  return failures;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc == 4 && atoi(argv[3]) > 0 && atoi(argv[3]) <= MAX_CONNS) {
    if (!strcmp(argv[1], "server")) return server(atoi(argv[2]), atoi(argv[3]));
    if (!strcmp(argv[1], "clients")) return clients(atoi(argv[2]), atoi(argv[3]));
    if (!strcmp(argv[1], "connects")) return connects(atoi(argv[2]), atoi(argv[3]));
  }
  if (argc == 3 && !strcmp(argv[1], "echo")) return echo_server(atoi(argv[2]));
  fprintf(stderr, "usage: see the top of emfile_probe.c\n");
  return 2;
}
