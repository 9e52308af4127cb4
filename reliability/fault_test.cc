// Faults on the CPU sockets over GPUSOCK_TRANSPORT, with real peer processes
// (gs_test_peer): a server SIGKILLed mid-stream, a client SIGKILLed, a peer
// that stops reading, a listener whose backlog overflows. Each must end in a
// clear status, lose no byte that was acknowledged as delivered, and leave
// no fd, thread or /dev/shm entry behind. How long detection took is printed
// (docs/reliability.md), never asserted; a hang is a failure. In the Soft-RoCE
// guest (verbs): scripts/rdma-vm --env GPUSOCK_TEST_ADDR -- env
// GPUSOCK_TRANSPORT=verbs build/reliability/reliability_fault_tests
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
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace gpusock::test;

struct Peer : PeerProcess {
  explicit Peer(const std::vector<std::string> &args, PeerPipes pipes = {}) : PeerProcess(GS_TEST_PEER, args, pipes) {}
};

int connect_to(int port, int flags = 0) {
  return connect_retry(test_address(port), {.seconds = 10, .pause_ms = 10, .type_flags = flags});
}

// Ends the process if `done` does not hold within `seconds`: a hang must fail
// the test, not wait for ctest's timeout with threads stuck in calls.
template <class Done>
void within_or_die(double seconds, Done done, const char *what) {
  const Deadline deadline(seconds);
  while (!done()) {
    if (deadline.passed()) {
      std::fprintf(stderr, "HANG: %s after %.0f s\n", what, seconds);
      std::fflush(stderr);
      std::_Exit(3);
    }
    usleep(10000);
  }
}

// One connection opened, used and closed: the engine's thread and the
// transport are up, so a baseline taken after this holds them. The calling
// thread also sleeps once in gpusock (a poll with nothing to read): its waker,
// an eventfd made the first time a thread sleeps and kept for the thread's
// life, is then in the baseline too, not counted as a leak when a later call
// of this thread happens to sleep where this one's did not.
void warm_up() {
  const int port = free_port();
  Peer echo({"echo", std::to_string(port)});
  for (int i = 0; i < kWarmUpConnections; ++i) {
    const int fd = connect_to(port);
    ASSERT_GE(fd, 0) << gs_status_name(fd);
    pollfd idle{fd, POLLIN, 0};
    ASSERT_EQ(gs_poll(&idle, 1, 20), 0);
    char c = 'w';
    ASSERT_EQ(gs_send(fd, &c, 1, 0), 1);
    ASSERT_TRUE(recv_all(fd, &c, 1));
    gs_close(fd);
  }
}

// How a connection whose peer died may end: EOF, a reset, or (rsocket's own
// errno for a failed completion, seen on fabric:shm) EIO.
bool reset_or_eof(long status) { return status == 0 || status == -ECONNRESET || status == -EPIPE || status == -EIO; }

// A server SIGKILLed while its clients stream through it: every client's
// next call ends (EOF or reset), none hangs.
TEST(Faults, ServerKilledMidStreamClientsSeeResetOrEof) {
  constexpr int kClients = 8;
  const int port = free_port();
  auto server = std::make_unique<Peer>(std::vector<std::string>{"echo", std::to_string(port)});
  warm_up();
  const Resources base = settled_resources();
  struct Client {
    std::atomic<uint64_t> rounds{0};
    std::atomic<bool> done{false};
    long status = 1;
    Clock::time_point ended;
  };
  std::vector<Client> clients(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      Client &c = clients[static_cast<size_t>(i)];
      const int fd = connect_to(port);
      std::vector<uint8_t> out(16384), back(out.size());
      int err = fd < 0 ? fd : 0;
      for (uint64_t r = 0; fd >= 0; ++r) {
        fill_pattern(out.data(), out.size(), r * out.size(), static_cast<uint64_t>(i));
        if (!send_all(fd, out.data(), out.size(), &err) || !recv_all(fd, back.data(), back.size(), &err)) break;
        if (back != out) {
          err = -EILSEQ;  // corrupted: reported below
          break;
        }
        ++c.rounds;
      }
      c.ended = Clock::now();
      c.status = err;  // recv_all reports EOF as -ECONNRESET
      if (fd >= 0) gs_close(fd);
      c.done = true;
    });
  }
  within_or_die(
      30,
      [&] {
        for (auto &c : clients)
          if (c.rounds < 20 && !c.done) return false;
        return true;
      },
      "clients did not get going");
  const auto killed = Clock::now();
  server->kill9();
  within_or_die(
      20,
      [&] {
        for (auto &c : clients)
          if (!c.done) return false;
        return true;
      },
      "a client still waits on a killed server");
  for (auto &t : threads) t.join();
  double worst_ms = 0;
  std::string statuses;  // recv_all reports EOF as ECONNRESET, send_all as EPIPE
  for (auto &c : clients) {
    EXPECT_TRUE(reset_or_eof(c.status)) << gs_status_name(static_cast<int>(c.status));
    statuses += std::string(statuses.empty() ? "" : " ") + gs_status_name(static_cast<int>(c.status));
    EXPECT_GE(c.rounds.load(), 20u);
    worst_ms = std::max(worst_ms, std::chrono::duration<double, std::milli>(c.ended - killed).count());
  }
  server.reset();
  // A killed process cannot remove its files: its peers do when they see
  // it die, and the next gpusock process's sweep removes the rest (one
  // connection's, now and then: a connect that was retried). Start one.
  warm_up();
  Resources after;
  EXPECT_TRUE(back_to_baseline(base, 30, &after)) << "before: " << base.describe() << "; after: " << after.describe();
  std::printf("server killed: %d clients ended at most %.0f ms after the SIGKILL (%s)\n", kClients, worst_ms,
              statuses.c_str());
}

// Clients SIGKILLed one at a time: the server loses only that connection;
// the others keep delivering (the blast pattern, every byte checked).
TEST(Faults, ClientKilledServerLosesOnlyThatConnection) {
  constexpr int kClients = 4;
  const int port = free_port();
  const int lfd = listen_on(test_address(port), 16);
  ASSERT_GE(lfd, 0) << gs_status_name(lfd);
  std::vector<std::unique_ptr<Peer>> peers;
  std::vector<int> conns;
  for (int i = 0; i < kClients; ++i) {  // one at a time: conns[i] is peers[i]'s
    peers.push_back(std::make_unique<Peer>(std::vector<std::string>{"blast", std::to_string(port)}));
    const int c = gs_accept(lfd, nullptr, nullptr);
    ASSERT_GE(c, 0) << gs_status_name(c);
    conns.push_back(c);
  }
  std::vector<uint8_t> buf(1 << 16);
  // Reads up to `want` bytes from conns[i]; the status that ended it early, or 1.
  auto read_some = [&](int i, size_t want) -> long {
    size_t got = 0;
    while (got < want) {
      const ssize_t k = gs_recv(conns[static_cast<size_t>(i)], buf.data(), std::min(buf.size(), want - got), 0);
      if (k <= 0) return k;
      for (ssize_t j = 0; j < k; ++j)
        if (buf[static_cast<size_t>(j)] != 0x5A) return -EILSEQ;
      got += static_cast<size_t>(k);
    }
    return 1;
  };
  for (int i = 0; i < kClients; ++i) ASSERT_EQ(read_some(i, 1 << 20), 1);
  const auto killed = Clock::now();
  peers[0]->kill9();
  std::atomic<bool> ended{false};
  long status = 1;
  std::thread drain([&] {
    while ((status = read_some(0, 1 << 16)) == 1) {}
    ended = true;
  });
  within_or_die(
      20, [&] { return ended.load(); }, "the killed client's connection never ended");
  drain.join();
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - killed).count();
  EXPECT_TRUE(reset_or_eof(status)) << gs_status_name(static_cast<int>(status));
  EXPECT_EQ(gs_close(conns[0]), 0);
  for (int i = 1; i < kClients; ++i) EXPECT_EQ(read_some(i, 4 << 20), 1) << "connection " << i;
  // And the listener still takes new connections.
  Peer late({"blast", std::to_string(port)});
  const int c = gs_accept(lfd, nullptr, nullptr);
  ASSERT_GE(c, 0);
  conns.push_back(c);
  EXPECT_EQ(read_some(kClients, 1 << 20), 1);
  for (size_t i = 1; i < conns.size(); ++i) gs_close(conns[i]);
  gs_close(lfd);
  std::printf("client killed: its connection ended %.0f ms after the SIGKILL; %d others kept delivering\n", ms,
              kClients - 1);
}

// A peer that reads nothing for GS_STALL_MS (default 10 s) after the accept:
// a non-blocking sender gets EAGAIN, a blocking one waits; either way the
// bytes taken stay bounded, this process's memory too, and once the peer reads
// again it gets every byte (its "<bytes> <fnv64>" reply checks them).
void stalled_reader(bool nonblocking) {
  const uint64_t stall_ms = std::getenv("GS_STALL_MS") ? std::strtoull(std::getenv("GS_STALL_MS"), nullptr, 0) : 10000;
  const int port = free_port();
  Peer peer({"stall", std::to_string(port), std::to_string(stall_ms)});
  const int fd = connect_to(port);  // blocking: retried while the peer starts
  ASSERT_GE(fd, 0) << gs_status_name(fd);
  if (nonblocking) {
    ASSERT_EQ(gs_fcntl(fd, F_SETFL, O_NONBLOCK), 0);
  }
  const Resources base = Resources::now();
  constexpr size_t kChunk = 1 << 16;
  std::vector<uint8_t> buf(kChunk);
  Fnv1a sum;
  std::atomic<uint64_t> sent{0};
  uint64_t eagain = 0, during_stall = 0;
  long peak_rss = base.rss_kib;
  // Sends the pattern until `total` bytes went; the status that stopped it, or 0.
  auto send_until = [&](uint64_t total, const Deadline *stop) -> long {
    while (sent < total && !(stop && stop->passed())) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, total - sent));
      fill_pattern(buf.data(), n, sent, 7);
      ssize_t k = gs_send(fd, buf.data(), n, 0);
      if (k == -EAGAIN) {
        ++eagain;
        pollfd p{fd, POLLOUT, 0};
        gs_poll(&p, 1, 50);
        continue;
      }
      if (k <= 0) return k;
      sum.add(buf.data(), static_cast<size_t>(k));
      sent += static_cast<uint64_t>(k);
    }
    return 0;
  };
  constexpr uint64_t kTotal = uint64_t(256) << 20;  // far more than any buffer on the path
  if (nonblocking) {
    const Deadline stall(static_cast<double>(stall_ms) / 1000.0 * 0.8);
    ASSERT_EQ(send_until(kTotal, &stall), 0);
    during_stall = sent;
    peak_rss = std::max(peak_rss, Resources::now().rss_kib);
    EXPECT_GT(eagain, 0u) << "send never reported back-pressure";
    gs_fcntl(fd, F_SETFL, 0);  // the rest blocking: the peer reads again soon
    ASSERT_EQ(send_until(kTotal, nullptr), 0);
  } else {
    std::atomic<long> status{1};
    std::thread sender([&] { status = send_until(kTotal, nullptr); });
    usleep(static_cast<useconds_t>(stall_ms * 800));
    during_stall = sent;
    peak_rss = std::max(peak_rss, Resources::now().rss_kib);
    within_or_die(
        120, [&] { return sent == kTotal || status != 1; }, "the blocked sender never finished");
    sender.join();
    ASSERT_EQ(status.load(), 0) << gs_status_name(static_cast<int>(status.load()));
  }
  EXPECT_LT(during_stall, kTotal / 2) << "the stalled path took far more than its buffers";
  EXPECT_LT(peak_rss - base.rss_kib, 64 * 1024) << "memory grew while the peer did not read";
  ASSERT_EQ(gs_shutdown(fd, SHUT_WR), 0);
  EXPECT_EQ(read_sink_reply(fd), sink_reply(kTotal, sum.h));
  gs_close(fd);
  std::printf("stalled reader (%s, %" PRIu64 " ms): %" PRIu64 " bytes taken while it did not read, %" PRIu64
              " EAGAINs, resident memory +%ld KiB; then all %" PRIu64 " bytes delivered intact\n",
              nonblocking ? "non-blocking" : "blocking", stall_ms, during_stall, eagain, peak_rss - base.rss_kib,
              kTotal);
}

TEST(Faults, StalledReaderNonBlockingSenderGetsEagain) { stalled_reader(true); }
TEST(Faults, StalledReaderBlockingSenderWaits) { stalled_reader(false); }

// A listener that accepts nothing, with a backlog of 2, and 16 clients:
// each connect ends (connected into the backlog, or refused), none stays
// pending; when the listener goes, the connected ones see EOF or reset.
TEST(Faults, BacklogOverflowRefusesAndNothingSticks) {
  constexpr int kBacklog = 2, kClients = 16;
  const int port = free_port();
  auto peer = std::make_unique<Peer>(std::vector<std::string>{"listen", std::to_string(port), std::to_string(kBacklog)},
                                     PeerPipes{.out = true});
  std::string line;
  ASSERT_TRUE(peer->read_line(&line, 20) && line == "listening");
  warm_up();
  const Resources base = settled_resources();
  std::vector<int> fds;
  for (int i = 0; i < kClients; ++i) {
    const int fd = gs_socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ASSERT_GE(fd, 0);
    const sockaddr_in a = test_address(port);
    const int rc = gs_connect(fd, reinterpret_cast<const sockaddr *>(&a), sizeof a);
    ASSERT_TRUE(rc == 0 || rc == -EINPROGRESS || rc == -ECONNREFUSED) << gs_status_name(rc);
    fds.push_back(fd);
  }
  int connected = 0, refused = 0, pending = 0, other = 0;
  const Stopwatch clock;
  for (int fd : fds) {
    pollfd p{fd, POLLOUT, 0};
    const int n = gs_poll(&p, 1, static_cast<int>(std::max(1.0, 30000 - clock.seconds() * 1000)));
    int err = 0;
    socklen_t len = sizeof err;
    gs_getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (n == 0) ++pending;
    else if (err == 0) ++connected;
    else if (err == ECONNREFUSED) ++refused;
    else ++other;
  }
  const double settle_s = clock.seconds();
  EXPECT_EQ(pending, 0) << "connects still pending after 30 s";
  EXPECT_EQ(other, 0);
  EXPECT_GE(refused, 1) << "16 connects into a backlog of 2 that nobody accepts";
  EXPECT_GE(connected, 1);
  peer->stop();  // SIGTERM: the listener closes
  std::atomic<int> ended{0};
  int unclear = 0;
  std::thread reader([&] {
    for (int fd : fds) {
      gs_fcntl(fd, F_SETFL, 0);
      char c;
      const ssize_t k = gs_recv(fd, &c, 1, 0);
      if (k != 0 && k != -ECONNRESET && k != -ENOTCONN && k != -ECONNREFUSED) {
        std::fprintf(stderr, "after the listener left: recv %zd (%s)\n", k, gs_status_name(static_cast<int>(k)));
        ++unclear;
      }
      ++ended;
    }
  });
  within_or_die(
      20, [&] { return ended.load() == kClients; }, "a connection into the closed listener never ended");
  reader.join();
  EXPECT_EQ(unclear, 0);
  for (int fd : fds) gs_close(fd);
  peer.reset();
  Resources after;
  EXPECT_TRUE(back_to_baseline(base, 30, &after)) << "before: " << base.describe() << "; after: " << after.describe();
  std::printf("backlog %d, %d clients: %d connected, %d refused, %d pending, settled in %.1f s\n", kBacklog, kClients,
              connected, refused, pending, settle_s);
}

}  // namespace
