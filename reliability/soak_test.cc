// Soak and churn of the CPU sockets over GPUSOCK_TRANSPORT, against real peer
// processes (gs_test_peer): connections opened, used and closed in churn while
// long streams run beside them, every byte checked; afterwards this process's
// fds, threads and the /dev/shm entries are back to their baseline.
// Sizes: GS_SOAK_CONNECTIONS (default 200), GS_SOAK_BYTES (default 256 MiB,
// split over kStreams streams). ctest runs the short default in CI and the
// issue's 1,000 connections and 10 GiB under the label "slow".
#include "test-support/checksum.h"
#include "test-support/gs_sockets.h"
#include "test-support/peer_modes.h"
#include "test-support/peer_process.h"
#include "test-support/resources.h"

#include <gpusock/socket.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace gpusock::test;

constexpr int kChurnThreads = 4;
constexpr size_t kChurnWindow = 4;  // connections each churn thread keeps open at once
constexpr int kStreams = 2;
constexpr size_t kChunk = 1 << 20;

uint64_t env_u64(const char *name, uint64_t fallback) {
  const char *v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 0) : fallback;
}

struct Peer : PeerProcess {
  explicit Peer(const std::vector<std::string> &args) : PeerProcess(GS_TEST_PEER, args) {}
};

int connect_to(int port) { return connect_retry(test_address(port), {.seconds = 10, .pause_ms = 10}); }

// What the workers report; any error is the first one seen, in words.
struct Tally {
  std::atomic<uint64_t> connections{0};
  std::atomic<uint64_t> echoed{0};
  std::atomic<uint64_t> streamed{0};
  std::mutex mu;
  std::string error;
  void fail(const std::string &what) {
    std::lock_guard lock(mu);
    if (error.empty()) error = what;
  }
  bool ok() {
    std::lock_guard lock(mu);
    return error.empty();
  }
};

// One open churn connection and the message it sent, to be read back.
struct Open {
  int fd;
  std::vector<uint8_t> sent;
};

// Reads a connection's echo back, compares it, sometimes half-closes first
// (the echo peer then closes: EOF), and closes.
bool finish_one(Open &o, bool half_close, Tally *t) {
  std::vector<uint8_t> back(o.sent.size());
  int err = 0;
  bool ok = recv_all(o.fd, back.data(), back.size(), &err);
  if (!ok) t->fail(std::string("echo recv: ") + gs_status_name(err));
  else if (back != o.sent) t->fail("echo came back different");
  if (ok && half_close) {
    char c;
    gs_shutdown(o.fd, SHUT_WR);
    const ssize_t k = gs_recv(o.fd, &c, 1, 0);
    if (k != 0) t->fail("no EOF after SHUT_WR: " + std::to_string(k));
  }
  if (const int rc = gs_close(o.fd); rc != 0) t->fail(std::string("close: ") + gs_status_name(rc));
  if (ok) t->echoed += back.size();
  return ok && back == o.sent;
}

// `count` connections to the echo peer, up to kChurnWindow open at once, each
// with one message of 1 byte to 64 KiB.
void churn(int port, uint64_t count, uint32_t seed, Tally *t) {
  std::mt19937 rng(seed);
  std::deque<Open> open;
  for (uint64_t i = 0; i < count && t->ok(); ++i) {
    const int fd = connect_to(port);
    if (fd < 0) {
      t->fail(std::string("connect: ") + gs_status_name(fd) + " " + gs_last_error());
      break;
    }
    ++t->connections;
    Open o{fd, std::vector<uint8_t>(1 + rng() % 65536)};
    fill_pattern(o.sent.data(), o.sent.size(), 0, (uint64_t(seed) << 32) | i);
    int err = 0;
    if (!send_all(fd, o.sent.data(), o.sent.size(), &err)) t->fail(std::string("echo send: ") + gs_status_name(err));
    open.push_back(std::move(o));
    if (open.size() > kChurnWindow) {
      finish_one(open.front(), rng() % 3 == 0, t);
      open.pop_front();
    }
  }
  for (Open &o : open) finish_one(o, false, t);
}

// `bytes` of the pattern to a sink peer; its reply "<bytes> <fnv64>" must match.
void stream(int port, uint64_t bytes, uint64_t seed, Tally *t) {
  const int fd = connect_to(port);
  if (fd < 0) return t->fail(std::string("stream connect: ") + gs_status_name(fd));
  std::vector<uint8_t> buf(kChunk);
  Fnv1a sum;
  int err = 0;
  for (uint64_t off = 0; off < bytes; off += buf.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), bytes - off));
    fill_pattern(buf.data(), n, off, seed);
    sum.add(buf.data(), n);
    if (!send_all(fd, buf.data(), n, &err)) {
      t->fail(std::string("stream send: ") + gs_status_name(err));
      gs_close(fd);
      return;
    }
    t->streamed += n;
  }
  gs_shutdown(fd, SHUT_WR);
  const std::string reply = read_sink_reply(fd), expect = sink_reply(bytes, sum.h);
  if (reply != expect) t->fail("sink replied '" + reply + "', expected '" + expect + "'");
  gs_close(fd);
}

TEST(Soak, ChurnAndStreamsLoseNothingLeakNothing) {
  const uint64_t connections = env_u64("GS_SOAK_CONNECTIONS", 200);
  const uint64_t bytes = env_u64("GS_SOAK_BYTES", uint64_t(256) << 20);
  const int echo_port = free_port();
  Peer echo({"echo", std::to_string(echo_port)});
  std::vector<std::unique_ptr<Peer>> sinks;
  std::vector<int> sink_ports;
  for (int i = 0; i < kStreams; ++i) {
    sink_ports.push_back(free_port());
    sinks.push_back(std::make_unique<Peer>(std::vector<std::string>{"sink", std::to_string(sink_ports.back())}));
  }
  // A few connections first: the process's one-time helpers are in the baseline.
  Tally warm;
  churn(echo_port, kWarmUpConnections, 1, &warm);
  ASSERT_TRUE(warm.error.empty()) << warm.error;
  const Resources base = settled_resources();
  const Stopwatch clock;

  Tally t;
  std::vector<std::thread> workers;
  for (int i = 0; i < kStreams; ++i)
    workers.emplace_back(stream, sink_ports[static_cast<size_t>(i)], bytes / kStreams, uint64_t(100 + i), &t);
  for (int i = 0; i < kChurnThreads; ++i)
    workers.emplace_back(churn, echo_port, connections / kChurnThreads, uint32_t(1000 + i), &t);
  for (auto &w : workers) w.join();
  const double seconds = clock.seconds();

  EXPECT_TRUE(t.error.empty()) << t.error;
  EXPECT_EQ(t.connections.load(), connections / kChurnThreads * kChurnThreads);
  EXPECT_EQ(t.streamed.load(), bytes / kStreams * kStreams);
  for (auto &sink : sinks) {
    int code = -1;
    EXPECT_TRUE(sink->wait_exit(20000, &code));
    EXPECT_EQ(code, 0) << "a sink peer failed";
  }
  Resources after;
  EXPECT_TRUE(back_to_baseline(base, 30, &after)) << "before: " << base.describe() << "; after: " << after.describe();
  std::printf("soak %s: %" PRIu64 " connections (%" PRIu64 " bytes echoed and checked), %" PRIu64
              " bytes streamed and checked, %.1f s; before: %s; after: %s\n",
              std::getenv("GPUSOCK_TRANSPORT") ? std::getenv("GPUSOCK_TRANSPORT") : "default", t.connections.load(),
              t.echoed.load(), t.streamed.load(), seconds, base.describe().c_str(), after.describe().c_str());
}

}  // namespace
