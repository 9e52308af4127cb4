// gs_rstream: rdma-core's rstream test (librdmacm/examples/rstream.c) on
// gpusock's CPU socket API, so an unmodified `rstream` can be the other side.
// It speaks the same conversation as rstream's custom mode:
//   1. a 16-byte sync: client → server, then server → client;
//   2. for each of -I iterations: the client sends -C transfers of -S bytes,
//      the server receives them, then the server sends -C × -S back;
//   3. shutdown(SHUT_RDWR) and close.
// With -T v both programs fill what they send from one running byte counter
// (0, 1, ..., 255, 0, ...) and check what they receive against their own, so
// every byte of both directions is verified across the two implementations.
// Options as rstream's: -s server (client mode) | -b bind address (server
// mode), -p port, -S size, -C count, -I iterations, -B buffer size (SO_SNDBUF/
// SO_RCVBUF; default 512 KiB as rstream), -T a|b|n|v (async poll, blocking,
// non-blocking (default), verify; repeatable). Client only: it retries a
// refused connect for up to 20 s (the server may still be starting). Not in
// rstream: -W waits (up to 20 s) for the peer to close before closing.
// Exit status 0 only if the whole conversation passed.
#include "interop-tests/common.h"

#include "test-support/gs_sockets.h"

#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

using namespace interop;

namespace {

const char *g_dst = nullptr;
const char *g_src = nullptr;
int g_port = 7471;
long g_size = 1000, g_count = 1000, g_iters = 1, g_bufsize = 0;
bool g_async = false, g_verify = false, g_wait_peer_close = false;
int g_flags = MSG_DONTWAIT;  // rstream's default: non-blocking calls
int g_poll_timeout = 0;
int g_rs = -1;
std::vector<uint8_t> g_buf;
uint8_t g_fmt_next = 0, g_ver_next = 0;  // rstream's two running counters
uint64_t g_ver_total = 0;

[[noreturn]] void die(const char *what, int rc) {
  std::printf("FAIL gs_rstream %s: %s: %s [last_error: %s]\n", g_dst ? "client" : "server", what, errname(rc),
              gs_last_error());
  std::fflush(stdout);
  std::exit(1);
}

// rstream's do_poll: poll until something is ready; error bits count as
// failure. One deliberate difference: POLLHUP that comes WITH the requested
// event is not a failure here (as with TCP, data that arrived before the
// peer's close is still readable). rstream itself fails on any POLLHUP, which
// races with the DISCONNECT its peer sends right after the last transfer,
// against rsocket and gpusock alike (see the matrix's pollhup row).
int wait_ready(short events) {
  pollfd p{g_rs, events, 0};
  int rc;
  do {
    rc = gs_poll(&p, 1, g_poll_timeout);
  } while (rc == 0);
  if (rc < 0) return rc;
  if (p.revents & POLLERR) return -ECONNRESET;
  return (p.revents & POLLHUP) && !(p.revents & events) ? -ECONNRESET : 0;
}

void send_xfer(long size) {
  if (g_verify)
    for (long i = 0; i < size; ++i) g_buf[static_cast<size_t>(i)] = g_fmt_next++;
  for (long off = 0; off < size;) {
    if (g_async)
      if (int rc = wait_ready(POLLOUT); rc) die("poll POLLOUT", rc);
    const ssize_t r = gs_send(g_rs, g_buf.data() + off, static_cast<size_t>(size - off), g_flags);
    if (r > 0) off += r;
    else if (r != -EAGAIN) die("send", r == 0 ? -EPIPE : static_cast<int>(r));
  }
}

void recv_xfer(long size) {
  for (long off = 0; off < size;) {
    if (g_async)
      if (int rc = wait_ready(POLLIN); rc) die("poll POLLIN", rc);
    const ssize_t r = gs_recv(g_rs, g_buf.data() + off, static_cast<size_t>(size - off), g_flags);
    if (r > 0) off += r;
    else if (r == 0) die("recv (peer closed early)", -ECONNRESET);
    else if (r != -EAGAIN) die("recv", static_cast<int>(r));
  }
  if (g_verify) {
    for (long i = 0; i < size; ++i, ++g_ver_total) {
      if (g_buf[static_cast<size_t>(i)] != g_ver_next++) {
        std::printf("FAIL gs_rstream: data verification failed at byte %" PRIu64 "\n", g_ver_total);
        std::exit(1);
      }
    }
  }
}

void set_options(int fd) {
  const int val = g_bufsize ? static_cast<int>(g_bufsize) : (1 << 19);
  gs_setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &val, sizeof val);
  gs_setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &val, sizeof val);
  const int one = 1;
  gs_setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (g_flags & MSG_DONTWAIT) gs_fcntl(fd, F_SETFL, O_NONBLOCK);
}

void server_connect() {
  const char *call = "";
  const int lrs = gpusock::test::listen_on(make_addr(g_src, g_port), 1, 0, &call);
  if (lrs < 0) die(call, lrs);
  set_options(lrs);
  std::printf("gs_rstream: listening on %s:%d\n", g_src, g_port);
  std::fflush(stdout);
  for (;;) {
    if (g_async) {
      pollfd p{lrs, POLLIN, 0};
      int rc;
      do {
        rc = gs_poll(&p, 1, g_poll_timeout);
      } while (rc == 0);
      if (rc < 0) die("poll (listener)", rc);
    }
    g_rs = gs_accept(lrs, nullptr, nullptr);
    if (g_rs >= 0) break;
    if (g_rs != -EAGAIN) die("accept", g_rs);
    if (!g_async) sleep_ms(1);
  }
  set_options(g_rs);
  gs_close(lrs);
}

void client_connect() {
  const sockaddr_in a = make_addr(g_dst, g_port);
  const double end = now_s() + 20;
  for (;;) {
    g_rs = gs_socket(AF_INET, SOCK_STREAM, 0);
    if (g_rs < 0) die("socket", g_rs);
    set_options(g_rs);
    int rc = gs_connect(g_rs, reinterpret_cast<const sockaddr *>(&a), sizeof a);
    if (rc == -EINPROGRESS) {
      pollfd p{g_rs, POLLOUT, 0};
      do {
        rc = gs_poll(&p, 1, g_poll_timeout);
      } while (rc == 0);
      int err = 0;
      socklen_t len = sizeof err;
      gs_getsockopt(g_rs, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err ? -err : 0;
    }
    if (rc == 0) return;
    gs_close(g_rs);
    if (rc != -ECONNREFUSED || now_s() > end) die("connect", rc);
    sleep_ms(100);
  }
}

}  // namespace

int main(int argc, char **argv) {
  int op;
  while ((op = getopt(argc, argv, "s:b:p:S:C:I:B:T:i:W")) != -1) {
    switch (op) {
      case 's':
        g_dst = optarg;
        break;
      case 'b':
        g_src = optarg;
        break;
      case 'p':
        g_port = std::atoi(optarg);
        break;
      case 'S':
        g_size = std::atol(optarg);
        break;
      case 'C':
        g_count = std::atol(optarg);
        break;
      case 'I':
        g_iters = std::atol(optarg);
        break;
      case 'B':
        g_bufsize = std::atol(optarg);
        break;
      case 'i':
        break;  // inline size: rstream's custom mode leaves it at the default
      case 'W':
        g_wait_peer_close = true;
        break;
      case 'T':
        switch (optarg[0]) {
          case 'a':
            g_async = true;
            break;
          case 'b':
            g_flags = (g_flags & ~MSG_DONTWAIT) | MSG_WAITALL;
            break;
          case 'n':
            g_flags |= MSG_DONTWAIT;
            break;
          case 'v':
            g_verify = true;
            break;
          default:
            std::fprintf(stderr, "unknown -T %s\n", optarg);
            return 2;
        }
        break;
      default:
        std::fprintf(stderr,
                     "usage: %s -s ADDR|-b ADDR [-p PORT] [-S SIZE] [-C COUNT] [-I ITER] [-B BUF] [-T a|b|n|v]...\n",
                     argv[0]);
        return 2;
    }
  }
  if (!g_dst == !g_src) {
    std::fprintf(stderr, "gs_rstream: give exactly one of -s (client) or -b (server)\n");
    return 2;
  }
  if (!(g_flags & MSG_DONTWAIT)) g_poll_timeout = -1;
  g_buf.resize(static_cast<size_t>(std::max(g_size, 16L)));

  if (g_dst) client_connect();
  else server_connect();

  // sync
  if (g_dst) send_xfer(16), recv_xfer(16);
  else recv_xfer(16), send_xfer(16);

  const double t0 = now_s();
  for (long i = 0; i < g_iters; ++i) {
    for (long t = 0; t < g_count; ++t) g_dst ? send_xfer(g_size) : recv_xfer(g_size);
    for (long t = 0; t < g_count; ++t) g_dst ? recv_xfer(g_size) : send_xfer(g_size);
  }
  const double secs = now_s() - t0;
  const double bytes = 2.0 * static_cast<double>(g_iters) * static_cast<double>(g_count) * static_cast<double>(g_size);
  if (g_wait_peer_close) {
    // -W: let the peer close first. rstream -T a treats the POLLHUP of an
    // early DISCONNECT as a failure even when its last bytes are still
    // unread (a race against any peer); waiting for its own close avoids it.
    uint8_t b[256];
    for (const double end = now_s() + 20; now_s() < end;) {
      pollfd p{g_rs, POLLIN, 0};
      gs_poll(&p, 1, 100);
      const ssize_t r = gs_recv(g_rs, b, sizeof b, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && r != -EAGAIN)) break;
    }
  }
  gs_shutdown(g_rs, SHUT_RDWR);
  gs_close(g_rs);
  std::printf("OK gs_rstream %s: %ld x %ld B x %ld iter, %.0f bytes, %.2fs, %.3f Gb/s, %.2f usec/xfer%s\n",
              g_dst ? "client" : "server", g_count, g_size, g_iters, bytes, secs, bytes * 8 / 1e9 / secs,
              secs * 1e6 / static_cast<double>(g_iters) / static_cast<double>(2 * g_count),
              g_verify ? ", every byte verified" : "");
  return 0;
}
