/* plain_echo_client: a client for any echo server written with nothing but
 * libc sockets (no gpusock, no rsocket API), so that it can run unmodified
 * under a preload shim: rdma-core's librspreload.so in the interop matrix,
 * gpusock's libgpusock_preload.so in scripts/demo.
 *
 *   plain_echo_client HOST PORT [--sizes 1,64,2048] [--iters N]
 *                     [--bulk BYTES] [--chunk BYTES] [--seed S]
 *
 * Ping-pong: for each size, N round trips of one message; every echoed byte
 * is compared with what was sent (seeded pattern). Prints per size the median
 * and mean round trip in microseconds.
 * Bulk: streams BYTES through the echo server with send and receive
 * interleaved by poll() (so an echo server with small buffers cannot
 * deadlock it), compares every byte, prints MB/s and the FNV-1a sums of both
 * directions.
 * Last line: "OK ..." (exit 0) or "FAIL ..." (exit 1). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* Byte i of the stream with seed s: cheap, position-dependent, not periodic
 * at any power of two a ring size could hide. */
static uint8_t pattern(uint64_t s, uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ s;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return (uint8_t)(x >> 56);
}

static uint64_t fnv(uint64_t h, const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

static int fail(const char *what) {
  printf("FAIL plain_echo_client: %s: %s\n", what, errno ? strerror(errno) : "mismatch");
  return 1;
}

static int write_all(int fd, const uint8_t *p, size_t n) {
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

static int read_all(int fd, uint8_t *p, size_t n) {
  while (n) {
    ssize_t k = read(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) errno = ECONNRESET;
    if (k <= 0) return -1;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s HOST PORT [--sizes 1,64,...] [--iters N] [--bulk BYTES] [--chunk BYTES] [--seed S]\n",
            argv[0]);
    return 2;
  }
  const char *host = argv[1], *port = argv[2], *sizes = "1,64,2048,65536";
  long iters = 100;
  unsigned long long bulk = 0, chunk = 65536, seed = 1;
  for (int i = 3; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--sizes")) sizes = argv[i + 1];
    else if (!strcmp(argv[i], "--iters")) iters = atol(argv[i + 1]);
    else if (!strcmp(argv[i], "--bulk")) bulk = strtoull(argv[i + 1], NULL, 0);
    else if (!strcmp(argv[i], "--chunk")) chunk = strtoull(argv[i + 1], NULL, 0);
    else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 0);
    else {
      fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (iters < 1 || chunk < 1) return 2;

  struct addrinfo hints = {0}, *ai = NULL;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host, port, &hints, &ai) != 0) return fail("getaddrinfo");
  int fd = -1;
  for (int attempt = 0; attempt < 50; ++attempt) { /* the server may still be starting */
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return fail("socket");
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
    close(fd);
    fd = -1;
    usleep(100000);
  }
  freeaddrinfo(ai);
  if (fd < 0) return fail("connect");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

  /* Ping-pong. */
  size_t max = 1;
  for (const char *p = sizes; *p;) {
    size_t n = strtoull(p, (char **)&p, 0);
    if (n > max) max = n;
    if (*p == ',') ++p;
    else if (*p) return 2;
  }
  uint8_t *out = malloc(max > chunk ? max : chunk), *in = malloc(max > chunk ? max : chunk);
  double *rtt = malloc(sizeof(double) * (size_t)iters);
  if (!out || !in || !rtt) return fail("malloc");
  uint64_t stream = 0; /* position in the seeded stream: every message differs */
  char summary[1024] = "";
  for (const char *p = sizes; *p;) {
    size_t n = strtoull(p, (char **)&p, 0);
    if (*p == ',') ++p;
    if (n == 0) continue;
    double sum = 0;
    for (long it = 0; it < iters; ++it) {
      for (size_t i = 0; i < n; ++i) out[i] = pattern(seed, stream + i);
      stream += n;
      double t0 = now_us();
      if (write_all(fd, out, n)) return fail("write (ping-pong)");
      if (read_all(fd, in, n)) return fail("read (ping-pong)");
      rtt[it] = now_us() - t0;
      sum += rtt[it];
      if (memcmp(in, out, n)) {
        errno = 0;
        return fail("echoed bytes differ (ping-pong)");
      }
    }
    qsort(rtt, (size_t)iters, sizeof(double), cmp_double);
    printf("RTT size=%zu iters=%ld median_us=%.2f mean_us=%.2f verified\n", n, iters, rtt[iters / 2], sum / iters);
    size_t len = strlen(summary);
    snprintf(summary + len, sizeof summary - len, "%s%zuB %.1fus", len ? ", " : "", n, rtt[iters / 2]);
    fflush(stdout);
  }

  /* Bulk, with send and receive interleaved. */
  if (bulk) {
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) return fail("fcntl O_NONBLOCK");
    unsigned long long sent = 0, got = 0;
    uint64_t h_out = 0xcbf29ce484222325ull, h_in = 0xcbf29ce484222325ull;
    size_t out_len = 0, out_off = 0;
    double t0 = now_us(), last_progress = t0;
    while (got < bulk) {
      struct pollfd pf = {fd, POLLIN | (sent < bulk ? POLLOUT : 0), 0};
      int r = poll(&pf, 1, 1000);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return fail("poll");
      if (now_us() - last_progress > 30e6) {
        errno = ETIMEDOUT;
        return fail("bulk stalled for 30 s");
      }
      if ((pf.revents & POLLOUT) && sent < bulk) {
        if (out_off == out_len) {
          out_len = (size_t)(bulk - sent < chunk ? bulk - sent : chunk);
          for (size_t i = 0; i < out_len; ++i) out[i] = pattern(seed, stream + sent + i);
          h_out = fnv(h_out, out, out_len);
          out_off = 0;
        }
        ssize_t k = write(fd, out + out_off, out_len - out_off);
        if (k > 0) {
          out_off += (size_t)k;
          sent += (unsigned long long)k;
          last_progress = now_us();
        } else if (k < 0 && errno != EAGAIN && errno != EINTR) return fail("write (bulk)");
      }
      if (pf.revents & (POLLIN | POLLHUP | POLLERR)) {
        ssize_t k = read(fd, in, chunk);
        if (k == 0) {
          errno = ECONNRESET;
          return fail("echo server closed during bulk");
        }
        if (k < 0 && errno != EAGAIN && errno != EINTR) return fail("read (bulk)");
        if (k > 0) {
          for (ssize_t i = 0; i < k; ++i)
            if (in[i] != pattern(seed, stream + got + (unsigned long long)i)) {
              errno = 0;
              printf("FAIL plain_echo_client: bulk byte %llu differs\n", got + (unsigned long long)i);
              return 1;
            }
          h_in = fnv(h_in, in, (size_t)k);
          got += (unsigned long long)k;
          last_progress = now_us();
        }
      }
    }
    double s = (now_us() - t0) / 1e6;
    printf("BULK bytes=%llu seconds=%.3f MBps=%.1f fnv_sent=%016llx fnv_received=%016llx verified\n", bulk, s,
           bulk / s / 1e6, (unsigned long long)h_out, (unsigned long long)h_in);
    size_t len = strlen(summary);
    snprintf(summary + len, sizeof summary - len, "%sbulk %llu B %.1f MB/s fnv %016llx", len ? "; " : "", bulk,
             bulk / s / 1e6, (unsigned long long)h_in);
  }
  shutdown(fd, SHUT_WR);
  /* The echo server must answer our EOF with its own. */
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) < 0) return fail("fcntl");
  ssize_t k = read(fd, in, 1);
  if (k != 0) {
    errno = k < 0 ? errno : 0;
    return fail("expected EOF after shutdown");
  }
  close(fd);
  printf("OK plain_echo_client: %s; every byte verified, EOF seen\n", summary);
  return 0;
}
