// The CPU side of the GPU socket tests: a separate process using the gs_* API
// over the transport named by GPUSOCK_TRANSPORT. The tests posix_spawn it.
// Modes (exit 0 = everything checked out):
//   echo    PORT                         poll-driven echo server, until SIGTERM
//   sink    PORT COUNT [DELAY_US]        accept COUNT connections one after the other;
//                                        read each to EOF (sleeping DELAY_US per 4 KiB
//                                        read), reply "<bytes> <fnv64>", close
//   source  PORT BYTES SEED              connect, send BYTES of pattern(SEED), SHUT_WR,
//                                        expect an 8-byte count == BYTES back, then EOF
//   clients PORT CONNS MSGS MAXSIZE SEED CONNS connections; MSGS rounds of one message
//                                        of 1..MAXSIZE bytes on each, echo verified;
//                                        then SHUT_WR and EOF on each
//   blast   PORT                         connect and send until killed
//   eofwait-accept  PORT [BYTES]         accept one connection, read until EOF or an
//   eofwait-connect PORT SEND            error (connect: first send SEND bytes); exit 0
//                                        on EOF (after exactly BYTES, if given), 10 on
//                                        ECONNRESET or another error, 1 otherwise
//   echo1    PORT                         accept one connection, echo it with blocking
//                                        recv/send until EOF (the CPU twin of a GPU echo block)
//   pingpong PORT SIZE ITERS OUTFILE     connect, ITERS rounds of SIZE bytes echoed back;
//                                        writes the mean round trip in ns to OUTFILE
//   stream   PORT BYTES CHUNK OUTFILE    connect, send BYTES in CHUNK-byte sends, SHUT_WR,
//                                        read an 8-byte count; writes MB/s to OUTFILE
//   drain    PORT COUNT CHUNK            COUNT times: accept, read to EOF in CHUNK-byte
//                                        reads, reply with the 8-byte count, close
//   drains   PORT COUNT CHUNK            the same for COUNT connections at once, a thread each
//   streams  PORT CONNS BYTES CHUNK OUT  CONNS connections at once, a thread each: stream as
//                                        `stream` does; writes the total MB/s to OUT
#include "test-support/peer_modes.h"
#include "test-support/resources.h"
#include "test-support/timing.h"

#include <netinet/tcp.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include <atomic>

namespace {

using namespace gpusock::test;

// The GPU side may not be listening yet: retry for 20 s.
int connect_to(int port) {
  const char *call = "";
  const int fd = connect_retry(loopback(port), RetryPolicy{.seconds = 20, .pause_ms = 10, .any_error = true}, &call);
  if (fd < 0) die(std::strcmp(call, "socket") == 0 ? 2 : 5, call, fd);
  return fd;
}

int listen_on(int port, int flags) { return listen_or_die(loopback(port), flags); }

int source_client(int port, uint64_t bytes, uint32_t seed) {
  const int fd = connect_to(port);
  std::vector<uint8_t> buf(1 << 16);
  for (uint64_t off = 0; off < bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), bytes - off));
    for (size_t i = 0; i < n; ++i) buf[i] = pattern_byte(off + i, seed);
    if (!send_all(fd, buf.data(), n)) die(6, "source send", -errno);
    off += n;
  }
  if (int rc = gs_shutdown(fd, SHUT_WR); rc < 0) die(6, "shutdown", rc);
  uint64_t count = 0;
  if (!recv_all(fd, reinterpret_cast<uint8_t *>(&count), sizeof count)) die(7, "reply", -errno);
  if (count != bytes) {
    std::fprintf(stderr, "gpu_test_peer: GPU counted %" PRIu64 " bytes, sent %" PRIu64 "\n", count, bytes);
    return 8;
  }
  char tmp[16];
  ssize_t k = gs_recv(fd, tmp, sizeof tmp, 0);
  if (k != 0) die(9, "expected EOF after the reply", k);
  gs_close(fd);
  return 0;
}

int echo_clients(int port, int conns, int msgs, size_t max_size, uint32_t seed) {
  std::vector<int> fds;
  for (int i = 0; i < conns; ++i) fds.push_back(connect_to(port));
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(max_size), in(max_size);
  uint64_t total = 0;
  for (int m = 0; m < msgs; ++m) {
    std::vector<size_t> sizes(fds.size());
    for (size_t i = 0; i < fds.size(); ++i) {
      sizes[i] = 1 + rng() % max_size;
      for (size_t b = 0; b < sizes[i]; ++b) out[b] = pattern_byte(b + m * 7919 + i, seed);
      if (!send_all(fds[i], out.data(), sizes[i])) die(10, "clients send", -errno);
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!recv_all(fds[i], in.data(), sizes[i])) die(11, "clients recv", -errno);
      for (size_t b = 0; b < sizes[i]; ++b)
        if (in[b] != pattern_byte(b + m * 7919 + i, seed)) {
          std::fprintf(stderr, "gpu_test_peer: connection %zu message %d byte %zu differs\n", i, m, b);
          return 12;
        }
      total += sizes[i];
    }
  }
  for (int fd : fds) gs_shutdown(fd, SHUT_WR);
  for (int fd : fds) {
    char tmp[16];
    ssize_t k = gs_recv(fd, tmp, sizeof tmp, 0);
    if (k != 0) die(13, "expected EOF from the GPU server", k);
    gs_close(fd);
  }
  std::printf("echoed %" PRIu64 " bytes on %d connections\n", total, conns);
  return 0;
}

// Reads until EOF or an error; reports which.
int wait_for_end(int fd, long expect_bytes) {
  std::vector<uint8_t> buf(1 << 16);
  uint64_t got = 0;
  for (;;) {
    const ssize_t n = gs_recv(fd, buf.data(), buf.size(), 0);
    if (n > 0) {
      got += static_cast<uint64_t>(n);
      continue;
    }
    if (n == 0) {
      std::printf("gpu_test_peer: EOF after %" PRIu64 " bytes\n", got);
      gs_close(fd);
      return expect_bytes < 0 || got == static_cast<uint64_t>(expect_bytes) ? 0 : 1;
    }
    std::printf("gpu_test_peer: %s after %" PRIu64 " bytes\n", gs_status_name(static_cast<int>(n)), got);
    gs_close(fd);
    return 10;
  }
}

int eofwait_accept(int port, long expect_bytes) {
  const int lfd = listen_on(port, 0);
  const int c = gs_accept(lfd, nullptr, nullptr);
  if (c < 0) die(3, "accept", c);
  gs_close(lfd);
  return wait_for_end(c, expect_bytes);
}

int eofwait_connect(int port, long send_bytes) {
  const int fd = connect_to(port);
  std::vector<uint8_t> buf(static_cast<size_t>(send_bytes), 0x33);
  if (!send_all(fd, buf.data(), buf.size())) die(6, "send", -errno);
  return wait_for_end(fd, -1);
}

bool write_result(const char *path, double value) {
  FILE *f = std::fopen(path, "w");
  if (!f) return false;
  std::fprintf(f, "%.3f\n", value);
  return std::fclose(f) == 0;
}

int pingpong_client(int port, size_t size, long iters, const char *out) {
  const int fd = connect_to(port);
  int one = 1;
  gs_setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<uint8_t> a(size, 0x42), b(size);
  for (int i = 0; i < 100; ++i)
    if (!send_all(fd, a.data(), size) || !recv_all(fd, b.data(), size)) die(10, "pingpong warm-up", -errno);
  const Stopwatch watch;
  for (long i = 0; i < iters; ++i)
    if (!send_all(fd, a.data(), size) || !recv_all(fd, b.data(), size)) die(10, "pingpong", -errno);
  const double ns = watch.ns() / double(iters);
  gs_shutdown(fd, SHUT_WR);
  char tmp[16];
  while (gs_recv(fd, tmp, sizeof tmp, 0) > 0) {}
  gs_close(fd);
  return write_result(out, ns) ? 0 : 1;
}

int stream_client(int port, uint64_t bytes, size_t chunk, const char *out) {
  const int fd = connect_to(port);
  std::vector<uint8_t> buf(chunk, 0x5C);
  const Stopwatch watch;
  for (uint64_t off = 0; off < bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, bytes - off));
    if (!send_all(fd, buf.data(), n)) die(6, "stream send", -errno);
    off += n;
  }
  gs_shutdown(fd, SHUT_WR);
  uint64_t count = 0;
  if (!recv_all(fd, reinterpret_cast<uint8_t *>(&count), sizeof count)) die(7, "stream reply", -errno);
  const double secs = watch.seconds();
  gs_close(fd);
  if (count != bytes) {
    std::fprintf(stderr, "gpu_test_peer: server counted %" PRIu64 " of %" PRIu64 " bytes\n", count, bytes);
    return 8;
  }
  return write_result(out, double(bytes) / secs / 1e6) ? 0 : 1;
}

int echo_one(int port) {
  const int lfd = listen_on(port, 0);
  const int c = gs_accept(lfd, nullptr, nullptr);
  if (c < 0) die(3, "accept", c);
  std::vector<uint8_t> buf(1 << 16);
  for (;;) {
    const ssize_t n = gs_recv(c, buf.data(), buf.size(), 0);
    if (n <= 0) break;
    if (!send_all(c, buf.data(), static_cast<size_t>(n))) break;
  }
  gs_shutdown(c, SHUT_WR);
  gs_close(c);
  gs_close(lfd);
  return 0;
}

// Reads connection c to EOF in chunk-byte reads, replies with the count, closes.
void drain_one(int c, size_t chunk) {
  std::vector<uint8_t> buf(chunk);
  uint64_t bytes = 0;
  for (;;) {
    const ssize_t n = gs_recv(c, buf.data(), buf.size(), 0);
    if (n < 0) die(4, "drain recv", n);
    if (n == 0) break;
    bytes += static_cast<uint64_t>(n);
  }
  send_all(c, reinterpret_cast<uint8_t *>(&bytes), sizeof bytes);
  gs_shutdown(c, SHUT_WR);
  gs_close(c);
}

// count connections, one after the other (parallel = false) or at once.
int drain_server(int port, int count, size_t chunk, bool parallel) {
  const int lfd = listen_on(port, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < count; ++i) {
    const int c = gs_accept(lfd, nullptr, nullptr);
    if (c < 0) die(3, "accept", c);
    if (parallel) threads.emplace_back(drain_one, c, chunk);
    else drain_one(c, chunk);
  }
  for (auto &t : threads) t.join();
  gs_close(lfd);
  return 0;
}

// conns streams at once, each as stream_client; the total rate.
int stream_clients(int port, int conns, uint64_t bytes, size_t chunk, const char *out) {
  std::vector<int> fds;
  for (int i = 0; i < conns; ++i) fds.push_back(connect_to(port));
  std::vector<std::thread> threads;
  std::atomic<int> failed{0};
  const Stopwatch watch;
  for (int fd : fds)
    threads.emplace_back([&, fd] {
      std::vector<uint8_t> buf(chunk, 0x5C);
      for (uint64_t off = 0; off < bytes;) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, bytes - off));
        if (!send_all(fd, buf.data(), n)) {
          failed = 1;
          return;
        }
        off += n;
      }
      gs_shutdown(fd, SHUT_WR);
      uint64_t count = 0;
      if (!recv_all(fd, reinterpret_cast<uint8_t *>(&count), sizeof count) || count != bytes) failed = 1;
    });
  for (auto &t : threads) t.join();
  const double secs = watch.seconds();
  for (int fd : fds) gs_close(fd);
  if (failed) return 8;
  return write_result(out, double(bytes) * conns / secs / 1e6) ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
  peer_signals();
  raise_fd_limit();  // drains and streams hold a connection per GPU block
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s echo|sink|source|clients|blast PORT ...\n", argv[0]);
    return 1;
  }
  const std::string mode = argv[1];
  const int port = std::atoi(argv[2]);
  auto arg = [&](int i, long dflt) { return argc > i ? std::atol(argv[i]) : dflt; };
  if (mode == "echo") return echo_server(loopback(port), EchoOnClose::kAtOnce);
  if (mode == "sink")
    return sink_server(loopback(port), static_cast<int>(arg(3, 1)), SinkPace{static_cast<int>(arg(4, 0)), 0, false});
  if (mode == "sink-gated") return sink_server(loopback(port), 1, SinkPace{0, 0, true});
  if (mode == "source") return source_client(port, static_cast<uint64_t>(arg(3, 0)), static_cast<uint32_t>(arg(4, 1)));
  if (mode == "clients")
    return echo_clients(port, static_cast<int>(arg(3, 1)), static_cast<int>(arg(4, 1)),
                        static_cast<size_t>(arg(5, 1024)), static_cast<uint32_t>(arg(6, 1)));
  if (mode == "blast") return blast(connect_to(port));
  if (mode == "eofwait-accept") return eofwait_accept(port, arg(3, -1));
  if (mode == "eofwait-connect") return eofwait_connect(port, arg(3, 0));
  if (mode == "echo1") return echo_one(port);
  if (mode == "pingpong" && argc > 5)
    return pingpong_client(port, static_cast<size_t>(arg(3, 64)), arg(4, 1000), argv[5]);
  if (mode == "stream" && argc > 5)
    return stream_client(port, static_cast<uint64_t>(arg(3, 0)), static_cast<size_t>(arg(4, 65536)), argv[5]);
  if (mode == "drain")
    return drain_server(port, static_cast<int>(arg(3, 1)), static_cast<size_t>(arg(4, 65536)), false);
  if (mode == "drains")
    return drain_server(port, static_cast<int>(arg(3, 1)), static_cast<size_t>(arg(4, 65536)), true);
  if (mode == "streams" && argc > 6)
    return stream_clients(port, static_cast<int>(arg(3, 1)), static_cast<uint64_t>(arg(4, 0)),
                          static_cast<size_t>(arg(5, 65536)), argv[6]);
  return 1;
}
