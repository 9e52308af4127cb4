// End-to-end tests of the CPU sockets over a real libfabric provider, with the
// peer in a separate process (test_peer). The provider comes from
// GPUSOCK_TRANSPORT; ctest runs this binary once per transport.
#include "test-support/checksum.h"
#include "test-support/gs_sockets.h"
#include "test-support/peer_process.h"
#include "test-support/resources.h"

#include <gpusock/socket.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace gpusock::test;  // Clock, fnv1a, free_port, send_all, recv_all, test_address

// A spawned test_peer process, terminated (then killed) when the test ends.
struct Peer : PeerProcess {
  explicit Peer(const std::vector<std::string> &args) : PeerProcess(GS_TEST_PEER, args) {}
};

// Connects, retrying while the freshly spawned server is not listening yet.
int connect_to(int port, int flags = 0) {
  return connect_retry(test_address(port), {.seconds = 10, .pause_ms = 10, .type_flags = flags});
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < n; i += 4) {
    const uint32_t r = rng();
    std::memcpy(v.data() + i, &r, std::min<size_t>(4, n - i));
  }
  return v;
}

class SocketE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = free_port();
    echo_ = std::make_unique<Peer>(std::vector<std::string>{"echo", std::to_string(port_)});
    ASSERT_GT(echo_->pid(), 0);
  }
  int port_ = 0;
  std::unique_ptr<Peer> echo_;
};

TEST_F(SocketE2E, EchoRoundTrip) {
  int fd = connect_to(port_);
  ASSERT_GE(fd, 0) << gs_status_name(fd) << " " << gs_last_error();
  const char msg[] = "hello, rsocket";
  ASSERT_EQ(gs_send(fd, msg, sizeof msg, 0), static_cast<ssize_t>(sizeof msg));
  char back[sizeof msg] = {};
  ASSERT_TRUE(recv_all(fd, reinterpret_cast<uint8_t *>(back), sizeof back));
  EXPECT_STREQ(back, msg);
  EXPECT_EQ(gs_send(fd, msg, 0, 0), 0);  // zero-length send puts nothing on the wire
  for (int i = 0; i < 200; ++i) {
    uint64_t v = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull, w = 0;
    ASSERT_EQ(gs_write(fd, &v, sizeof v), 8);
    ASSERT_TRUE(recv_all(fd, reinterpret_cast<uint8_t *>(&w), sizeof w));
    ASSERT_EQ(v, w);
  }
  EXPECT_EQ(gs_close(fd), 0);
}

// SO_KEEPALIVE with a one-second idle time: the engine's background thread
// sends keepalives on its timer while nobody calls in (it no longer sleeps on
// the connection's events for that), and the stream is intact afterwards.
TEST_F(SocketE2E, IdleKeepaliveConnectionKeepsWorking) {
  int fd = connect_to(port_);
  ASSERT_GE(fd, 0) << gs_status_name(fd) << " " << gs_last_error();
  int one = 1;
  ASSERT_EQ(gs_setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one), 0);
  ASSERT_EQ(gs_setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &one, sizeof one), 0);
  for (int round = 0; round < 2; ++round) {
    uint64_t v = 0x1234567800000000ull + static_cast<uint64_t>(round), w = 0;
    ASSERT_EQ(gs_write(fd, &v, sizeof v), 8);
    ASSERT_TRUE(recv_all(fd, reinterpret_cast<uint8_t *>(&w), sizeof w));
    ASSERT_EQ(v, w);
    std::this_thread::sleep_for(std::chrono::milliseconds(2300));  // two keepalives go out
  }
  EXPECT_EQ(gs_close(fd), 0);
}

// Echo of a large random buffer: one thread writes while this one reads, so the
// protocol's flow control is exercised in both directions at once.
void echo_bulk(int port, size_t size, uint32_t seed) {
  int fd = connect_to(port);
  ASSERT_GE(fd, 0) << gs_last_error();
  const auto data = random_bytes(size, seed);
  std::thread writer([&] {
    size_t off = 0;
    std::mt19937 rng(seed + 1);
    while (off < size) {  // random write sizes, vectored now and then
      size_t n = std::min<size_t>(size - off, 1 + rng() % (300 * 1024));
      ssize_t k;
      if (n > 2 && (rng() & 1)) {
        iovec iov[2] = {{const_cast<uint8_t *>(data.data() + off), n / 2},
                        {const_cast<uint8_t *>(data.data() + off + n / 2), n - n / 2}};
        k = gs_writev(fd, iov, 2);
      } else {
        k = gs_send(fd, data.data() + off, n, 0);
      }
      if (k <= 0) return;
      off += static_cast<size_t>(k);
    }
    gs_shutdown(fd, SHUT_WR);
  });
  std::vector<uint8_t> back(size);
  size_t got = 0;
  std::mt19937 rng(seed + 2);
  while (got < size) {
    ssize_t k = gs_recv(fd, back.data() + got, std::min<size_t>(size - got, 1 + rng() % (512 * 1024)), 0);
    if (k <= 0) break;
    got += static_cast<size_t>(k);
  }
  writer.join();
  ASSERT_EQ(got, size);
  EXPECT_EQ(fnv1a(back.data(), size), fnv1a(data.data(), size));
  char extra;
  EXPECT_EQ(gs_recv(fd, &extra, 1, 0), 0);  // the server half-closed after echoing: EOF
  gs_close(fd);
}

TEST_F(SocketE2E, BulkEchoSegmentationBoundaries) {
  for (size_t size : {size_t(1), size_t(2047), size_t(2048), size_t(65535), size_t(65536), size_t(65537),
                      size_t(131072), size_t(1) << 20})
    echo_bulk(port_, size, static_cast<uint32_t>(size));
}

TEST_F(SocketE2E, BulkEchoRandomSizesUpTo64MiB) {
  std::mt19937 rng(42);
  for (int i = 0; i < 4; ++i) echo_bulk(port_, 1 + rng() % (8u << 20), rng());
  echo_bulk(port_, size_t(64) << 20, 7);
}

TEST_F(SocketE2E, OneWayBulkWithServerChecksum) {
  const int sink_port = free_port();
  Peer sink({"sink", std::to_string(sink_port)});
  int fd = connect_to(sink_port);
  ASSERT_GE(fd, 0);
  const size_t size = (size_t(32) << 20) + 12345;
  const auto data = random_bytes(size, 99);
  ASSERT_TRUE(send_all(fd, data.data(), size));
  ASSERT_EQ(gs_shutdown(fd, SHUT_WR), 0);
  char reply[64] = {};
  size_t got = 0;
  for (ssize_t k; (k = gs_recv(fd, reply + got, sizeof reply - 1 - got, 0)) > 0;) got += static_cast<size_t>(k);
  char expect[64];
  std::snprintf(expect, sizeof expect, "%zu %016" PRIx64, size, fnv1a(data.data(), size));
  EXPECT_STREQ(reply, expect);
  gs_close(fd);
  int code = -1;  // exit code, or 128 + signal
  ASSERT_TRUE(sink.wait_exit(10000, &code));
  EXPECT_EQ(code, 0);
}

// A process that exits while a close still flushes: the library's exit
// handler ends its background thread, so that no socket the thread held is
// freed after libfabric's own destructor has freed the provider's state
// (test_peer's send-close exits 8 if the thread outlived the handler).
TEST_F(SocketE2E, ExitWhileACloseStillFlushes) {
  for (int round = 0; round < 2; ++round) {
    const int sink_port = free_port();
    Peer sink({"stall", std::to_string(sink_port), "200"});
    Peer sender({"send-close", std::to_string(sink_port), std::to_string(4 << 20)});
    int code = -1;  // exit code, or 128 + signal
    ASSERT_TRUE(sender.wait_exit(20000, &code)) << "round " << round;
    EXPECT_EQ(code, 0) << "round " << round;
    ASSERT_TRUE(sink.wait_exit(20000, &code)) << "round " << round;
    EXPECT_EQ(code, 0) << "round " << round;
  }
}

TEST_F(SocketE2E, HundredConcurrentConnections) {
  constexpr int kConns = 100;
  std::vector<int> fds;
  for (int i = 0; i < kConns; ++i) {
    int fd = connect_to(port_);
    ASSERT_GE(fd, 0) << "connection " << i << ": " << gs_status_name(fd) << " " << gs_last_error();
    fds.push_back(fd);
  }
  for (int i = 0; i < kConns; ++i) {
    std::string msg = "conn-" + std::to_string(i) + std::string(static_cast<size_t>(i) * 37, 'x');
    ASSERT_TRUE(send_all(fds[static_cast<size_t>(i)], reinterpret_cast<const uint8_t *>(msg.data()), msg.size()));
  }
  for (int i = 0; i < kConns; ++i) {
    std::string msg = "conn-" + std::to_string(i) + std::string(static_cast<size_t>(i) * 37, 'x');
    std::string back(msg.size(), '\0');
    ASSERT_TRUE(recv_all(fds[static_cast<size_t>(i)], reinterpret_cast<uint8_t *>(back.data()), back.size()));
    EXPECT_EQ(back, msg);
  }
  for (int fd : fds) EXPECT_EQ(gs_close(fd), 0);
}

// Hundreds of clients connect at once to a server that accepts none of them
// yet (a backlog of 1024), then all are served: more than one listener
// endpoint can hold peers on fabric:shm (libfabric 1.17's shm: 256), so
// clients wait to be admitted; none is refused or lost.
TEST(SocketStorm, FourHundredConnectsBeforeTheFirstAccept) {
  constexpr int kConns = 400;
  raise_fd_limit();  // fabric:tcp takes several descriptors a connection
  const int port = free_port();
  PeerProcess server(GS_TEST_PEER, {"gated-echo", std::to_string(port)}, {.in = true, .out = true});
  std::string line;
  ASSERT_TRUE(server.read_line(&line, 10) && line == "listening");
  const sockaddr_in a = test_address(port);
  std::vector<int> fds;
  for (int i = 0; i < kConns; ++i) {
    const int fd = gs_socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ASSERT_GE(fd, 0) << gs_last_error();
    const int rc = gs_connect(fd, reinterpret_cast<const sockaddr *>(&a), sizeof a);
    ASSERT_TRUE(rc == 0 || rc == -EINPROGRESS) << "connection " << i << ": " << gs_status_name(rc);
    fds.push_back(fd);
  }
  ASSERT_EQ(write(server.stdin_fd(), "g", 1), 1);  // now accept them
  std::vector<pollfd> waiting;
  for (int fd : fds) waiting.push_back({fd, POLLOUT, 0});
  for (const auto end = Clock::now() + std::chrono::seconds(120); !waiting.empty();) {
    ASSERT_LT(Clock::now(), end) << waiting.size() << " connections still connecting";
    ASSERT_GE(gs_poll(waiting.data(), waiting.size(), 1000), 0);
    std::vector<pollfd> still;
    for (const pollfd &p : waiting) {
      if (p.revents == 0) {
        still.push_back({p.fd, POLLOUT, 0});
        continue;
      }
      int err = -1;
      socklen_t len = sizeof err;
      ASSERT_EQ(gs_getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &err, &len), 0);
      ASSERT_EQ(err, 0) << "a connection failed: " << std::strerror(err);
    }
    waiting.swap(still);
  }
  for (int i = 0; i < kConns; ++i) {
    const int fd = fds[static_cast<size_t>(i)];
    ASSERT_EQ(gs_fcntl(fd, F_SETFL, 0), 0);
    const std::string msg = "storm-" + std::to_string(i);
    ASSERT_TRUE(send_all(fd, reinterpret_cast<const uint8_t *>(msg.data()), msg.size()));
    std::string back(msg.size(), '\0');
    ASSERT_TRUE(recv_all(fd, reinterpret_cast<uint8_t *>(back.data()), back.size()));
    EXPECT_EQ(back, msg);
  }
  for (int fd : fds) EXPECT_EQ(gs_close(fd), 0);
}

// Connections whose ring sizes nobody chose take grown rings (4 MiB receive
// and 4 MiB send) while the process holds less than its budget of them
// (64 MiB: 8 connections), then rsocket's 128 KiB; a chosen SO_RCVBUF is
// kept; a closed connection returns its share. (The bulk echo tests above
// stream through grown rings: theirs are each process's first connections.)
TEST_F(SocketE2E, AdaptiveRingsWhileTheBudgetLasts) {
  const auto ring = [](int fd) {
    int v = 0;
    socklen_t len = sizeof v;
    EXPECT_EQ(gs_getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, &len), 0);
    return v;
  };
  const auto echo_once = [](int fd) {
    const char ping[] = "ring";
    char back[sizeof ping] = {};
    return send_all(fd, reinterpret_cast<const uint8_t *>(ping), sizeof ping) &&
           recv_all(fd, reinterpret_cast<uint8_t *>(back), sizeof back) && std::memcmp(ping, back, sizeof ping) == 0;
  };
  constexpr int kLarge = 4 << 20, kDefault = 128 << 10;
  std::vector<int> fds;
  for (int i = 0; i < 9; ++i) {
    const int fd = connect_to(port_);
    ASSERT_GE(fd, 0) << gs_last_error();
    fds.push_back(fd);
    EXPECT_EQ(ring(fd), i < 8 ? kLarge : kDefault) << "connection " << i;
    EXPECT_TRUE(echo_once(fd)) << "connection " << i;
  }

  const int chosen = gs_socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(chosen, 0);
  int v = 256 << 10;
  ASSERT_EQ(gs_setsockopt(chosen, SOL_SOCKET, SO_RCVBUF, &v, sizeof v), 0);
  sockaddr_in a = test_address(port_);
  ASSERT_EQ(gs_connect(chosen, reinterpret_cast<sockaddr *>(&a), sizeof a), 0) << gs_last_error();
  EXPECT_EQ(ring(chosen), 512 << 10);  // doubled, as the kernel does; not grown, not shrunk
  EXPECT_TRUE(echo_once(chosen));
  EXPECT_EQ(gs_close(chosen), 0);

  // The first connection's share comes back once it has finished closing.
  EXPECT_EQ(gs_close(fds[0]), 0);
  fds.erase(fds.begin());
  int grown = -1;
  for (const auto end = Clock::now() + std::chrono::seconds(20); grown < 0 && Clock::now() < end;) {
    const int fd = connect_to(port_);
    ASSERT_GE(fd, 0) << gs_last_error();
    if (ring(fd) == kLarge) {
      grown = fd;
      break;
    }
    EXPECT_EQ(gs_close(fd), 0);
    usleep(20000);
  }
  ASSERT_GE(grown, 0) << "a closed connection's rings never returned to the budget";
  EXPECT_TRUE(echo_once(grown));
  EXPECT_EQ(gs_close(grown), 0);
  for (int fd : fds) EXPECT_EQ(gs_close(fd), 0);
}

TEST_F(SocketE2E, HalfCloseThenEof) {
  int fd = connect_to(port_);
  ASSERT_GE(fd, 0);
  const auto data = random_bytes(300000, 5);
  ASSERT_TRUE(send_all(fd, data.data(), data.size()));
  ASSERT_EQ(gs_shutdown(fd, SHUT_WR), 0);
  EXPECT_EQ(gs_send(fd, "x", 1, 0), -EPIPE);  // our write side is closed
  std::vector<uint8_t> back(data.size());
  ASSERT_TRUE(recv_all(fd, back.data(), back.size()));  // reading still works after SHUT_WR
  EXPECT_EQ(back, data);
  char c;
  EXPECT_EQ(gs_recv(fd, &c, 1, 0), 0);  // server half-closed too: EOF, repeatedly
  EXPECT_EQ(gs_recv(fd, &c, 1, 0), 0);
  pollfd p{fd, POLLIN, 0};
  EXPECT_EQ(gs_poll(&p, 1, 1000), 1);
  EXPECT_TRUE(p.revents & POLLIN);
  gs_close(fd);
}

TEST_F(SocketE2E, NonBlockingWithPoll) {
  // Non-blocking connect: EINPROGRESS, then POLLOUT, then SO_ERROR tells. Retry
  // while the freshly spawned server is not listening yet.
  int fd = -1;
  const auto connect_end = Clock::now() + std::chrono::seconds(10);
  for (int err = ECONNREFUSED; err == ECONNREFUSED && Clock::now() < connect_end;) {
    if (fd >= 0) {
      gs_close(fd);
      usleep(10000);
    }
    fd = gs_socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in a = test_address(port_);
    const int rc = gs_connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a);
    if (rc == -ECONNREFUSED) continue;
    ASSERT_TRUE(rc == 0 || rc == -EINPROGRESS) << gs_status_name(rc);
    pollfd p{fd, POLLOUT, 0};
    ASSERT_EQ(gs_poll(&p, 1, 10000), 1);
    ASSERT_TRUE(p.revents & POLLOUT);
    socklen_t len = sizeof err;
    ASSERT_EQ(gs_getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len), 0);
  }
  char c;
  EXPECT_EQ(gs_recv(fd, &c, 1, 0), -EAGAIN);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_EQ(gs_fcntl(fd, F_GETFL) & O_NONBLOCK, O_NONBLOCK);

  // Fill every buffer on the path without reading: send must report EAGAIN.
  std::vector<uint8_t> chunk(1 << 16, 0xAB);
  size_t sent = 0;
  const auto end = Clock::now() + std::chrono::seconds(30);
  int eagain_streak = 0;
  while (eagain_streak < 50 && Clock::now() < end) {
    ssize_t k = gs_send(fd, chunk.data(), chunk.size(), 0);
    if (k == -EAGAIN) {
      ++eagain_streak;
      pollfd w{fd, POLLOUT, 0};
      gs_poll(&w, 1, 20);
      continue;
    }
    ASSERT_GT(k, 0);
    eagain_streak = 0;
    sent += static_cast<size_t>(k);
  }
  ASSERT_GE(eagain_streak, 50) << "send never reported back-pressure";
  EXPECT_GT(sent, size_t(256) * 1024);
  // Now drain: everything sent comes back, nothing lost.
  size_t got = 0;
  std::vector<uint8_t> buf(1 << 16);
  const auto drain_end = Clock::now() + std::chrono::seconds(60);
  while (got < sent && Clock::now() < drain_end) {
    pollfd r{fd, POLLIN, 0};
    gs_poll(&r, 1, 100);
    ssize_t k = gs_recv(fd, buf.data(), buf.size(), 0);
    if (k > 0) {
      for (ssize_t i = 0; i < k; ++i) ASSERT_EQ(buf[static_cast<size_t>(i)], 0xAB);
      got += static_cast<size_t>(k);
    }
  }
  EXPECT_EQ(got, sent);
  gs_close(fd);
}

TEST_F(SocketE2E, PollMixesKernelFds) {
  int fd = connect_to(port_);
  ASSERT_GE(fd, 0);
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pollfd p[2] = {{fd, POLLIN, 0}, {pipefd[0], POLLIN, 0}};
  EXPECT_EQ(gs_poll(p, 2, 50), 0);
  ASSERT_EQ(write(pipefd[1], "k", 1), 1);
  EXPECT_EQ(gs_poll(p, 2, 1000), 1);
  EXPECT_TRUE(p[1].revents & POLLIN);
  ASSERT_EQ(gs_send(fd, "z", 1, 0), 1);
  char c;
  ASSERT_EQ(read(pipefd[0], &c, 1), 1);
  p[0].revents = p[1].revents = 0;
  EXPECT_EQ(gs_poll(p, 2, 5000), 1);
  EXPECT_TRUE(p[0].revents & POLLIN);
  close(pipefd[0]);
  close(pipefd[1]);
  gs_close(fd);
}

// One thread drives many non-blocking connections from gs_poll's revents
// alone, as an event loop does: data and back-pressure on a few of them while
// the rest are idle. gs_poll looks at idle tcp connections through one
// poll(2) of their wait fds and progresses only those found readable, so a
// byte or a write completion it overlooked would stall this loop. Polls with
// timeout 0 (passes only) and short sleeps alternate.
TEST_F(SocketE2E, EventLoopOverManyConnections) {
  constexpr int kConns = 64;
  struct Flow {
    int fd = -1;
    std::vector<uint8_t> out, back;
    size_t sent = 0;
  };
  std::vector<Flow> flows(kConns);
  for (int i = 0; i < kConns; ++i) {
    Flow &f = flows[static_cast<size_t>(i)];
    f.fd = connect_to(port_);
    ASSERT_GE(f.fd, 0) << "connection " << i << ": " << gs_status_name(f.fd);
    ASSERT_EQ(gs_fcntl(f.fd, F_SETFL, O_NONBLOCK), 0);
    // Most connections send little; every eighth sends enough to fill the rings.
    f.out = random_bytes(i % 8 == 0 ? 600000 + static_cast<size_t>(i) * 1000 : 1 + static_cast<size_t>(i) * 13,
                         static_cast<uint32_t>(100 + i));
  }
  std::vector<uint8_t> buf(1 << 16);
  size_t done = 0;
  const auto end = Clock::now() + std::chrono::seconds(60);
  for (unsigned round = 0; done < flows.size() && Clock::now() < end; ++round) {
    std::vector<pollfd> p;
    std::vector<size_t> which;
    for (size_t i = 0; i < flows.size(); ++i) {
      Flow &f = flows[i];
      if (f.back.size() == f.out.size()) continue;
      p.push_back({f.fd, static_cast<short>(POLLIN | (f.sent < f.out.size() ? POLLOUT : 0)), 0});
      which.push_back(i);
    }
    const int n = gs_poll(p.data(), p.size(), round % 2 == 0 ? 0 : 50);
    ASSERT_GE(n, 0) << gs_status_name(n);
    for (size_t k = 0; k < p.size(); ++k) {
      Flow &f = flows[which[k]];
      ASSERT_FALSE(p[k].revents & (POLLERR | POLLNVAL)) << "connection " << which[k];
      if (p[k].revents & POLLOUT) {
        const ssize_t m = gs_send(f.fd, f.out.data() + f.sent, f.out.size() - f.sent, 0);
        ASSERT_TRUE(m > 0 || m == -EAGAIN) << gs_status_name(static_cast<int>(m));
        if (m > 0) f.sent += static_cast<size_t>(m);
      }
      if (p[k].revents & (POLLIN | POLLHUP)) {
        const ssize_t m = gs_recv(f.fd, buf.data(), buf.size(), 0);
        ASSERT_TRUE(m > 0 || m == -EAGAIN) << "connection " << which[k] << ": " << gs_status_name(static_cast<int>(m));
        if (m > 0) f.back.insert(f.back.end(), buf.begin(), buf.begin() + m);
        if (f.back.size() == f.out.size()) ++done;
      }
    }
  }
  for (size_t i = 0; i < flows.size(); ++i) {
    EXPECT_EQ(flows[i].back.size(), flows[i].out.size()) << "connection " << i << " stalled";
    EXPECT_TRUE(flows[i].back == flows[i].out) << "connection " << i;
    EXPECT_EQ(gs_close(flows[i].fd), 0);
  }
}

TEST_F(SocketE2E, DupSharesTheSocket) {
  int fd = connect_to(port_);
  ASSERT_GE(fd, 0);
  const int copy = gs_dup(fd);
  ASSERT_GE(copy, 0);
  EXPECT_NE(copy, fd);
  EXPECT_EQ(gs_is_socket(copy), 1);
  ASSERT_EQ(gs_close(fd), 0);  // the socket lives on through the copy
  EXPECT_EQ(gs_is_socket(fd), 0);
  ASSERT_EQ(gs_send(copy, "dup", 3, 0), 3);
  char back[3];
  ASSERT_TRUE(recv_all(copy, reinterpret_cast<uint8_t *>(back), 3));
  EXPECT_EQ(std::string(back, 3), "dup");
  const int third = gs_dup3(copy, 200, O_CLOEXEC);
  ASSERT_EQ(third, 200);
  EXPECT_EQ(gs_fcntl(third, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  EXPECT_EQ(gs_close(copy), 0);
  ASSERT_EQ(gs_send(third, "x", 1, 0), 1);
  ASSERT_TRUE(recv_all(third, reinterpret_cast<uint8_t *>(back), 1));
  EXPECT_EQ(gs_close(third), 0);
}

TEST(SocketErrors, ConnectToClosedPortIsRefused) {
  const int port = free_port();
  sockaddr_in a = test_address(port);
  int fd = gs_socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0) << gs_last_error();
  EXPECT_EQ(gs_connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a), -ECONNREFUSED);
  EXPECT_EQ(errno, ECONNREFUSED);
  gs_close(fd);

  fd = gs_socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  int rc = gs_connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a);
  if (rc == -EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    ASSERT_EQ(gs_poll(&p, 1, 10000), 1);
    EXPECT_TRUE(p.revents & (POLLERR | POLLOUT));
    int err = 0;
    socklen_t len = sizeof err;
    ASSERT_EQ(gs_getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len), 0);
    EXPECT_EQ(err, ECONNREFUSED);
  } else {
    EXPECT_EQ(rc, -ECONNREFUSED);
  }
  gs_close(fd);
}

// fabric:shm: a listener of another user cannot map a client's memory (shm
// makes it readable by its owner only). A root client is refused at once with
// the reason, and the listener, which would have crashed in libfabric on
// that client, serves on and exits cleanly.
TEST(SocketErrors, ShmListenerOfAnotherUserRefusesAndSurvives) {
  const char *transport = getenv("GPUSOCK_TRANSPORT");
  if (geteuid() != 0 || transport == nullptr || std::string(transport) != "fabric:shm")
    GTEST_SKIP() << "needs root and fabric:shm";
  const int port = free_port();
  const pid_t server = fork();
  ASSERT_GE(server, 0);
  if (server == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(90);
    execl(GS_TEST_PEER, GS_TEST_PEER, "echo", std::to_string(port).c_str(), static_cast<char *>(nullptr));
    _exit(91);
  }
  const sockaddr_in a = test_address(port);
  int rc = -ECONNREFUSED;
  for (int tries = 0; tries < 500 && rc == -ECONNREFUSED; ++tries) {
    const int fd = gs_socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    rc = gs_connect(fd, reinterpret_cast<const sockaddr *>(&a), sizeof a);
    const std::string why = gs_last_error();
    gs_close(fd);
    if (why.find("another user") != std::string::npos) break;  // the listener is up, and refused us
    usleep(10000);
  }
  EXPECT_EQ(rc, -ECONNREFUSED);
  EXPECT_NE(std::string(gs_last_error()).find("runs as another user"), std::string::npos) << gs_last_error();
  kill(server, SIGTERM);
  int status = 0;
  ASSERT_EQ(waitpid(server, &status, 0), server);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "server status " << status;
}

TEST(SocketErrors, CallsOnWrongObjects) {
  EXPECT_EQ(gs_send(12345, "x", 1, 0), -EBADF);
  EXPECT_EQ(gs_recv(0, nullptr, 0, 0), -ENOTSOCK);  // stdin is a kernel fd
  EXPECT_EQ(gs_socket(AF_UNIX, SOCK_STREAM, 0), -EAFNOSUPPORT);
  EXPECT_EQ(gs_socket(AF_INET, SOCK_DGRAM, 0), -ESOCKTNOSUPPORT);
  int fd = gs_socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  char c;
  EXPECT_EQ(gs_recv(fd, &c, 1, 0), -ENOTCONN);
  EXPECT_EQ(gs_send(fd, &c, 1, 0), -ENOTCONN);
  EXPECT_EQ(gs_shutdown(fd, SHUT_WR), -ENOTCONN);
  sockaddr_storage peer;
  socklen_t len = sizeof peer;
  EXPECT_EQ(gs_getpeername(fd, reinterpret_cast<sockaddr *>(&peer), &len), -ENOTCONN);
  EXPECT_EQ(gs_close(fd), 0);
  EXPECT_EQ(gs_close(fd), -EBADF);
}

TEST_F(SocketE2E, ListenOnAPortInUseSaysWhoHoldsIt) {
  // The echo peer (another process) listens on port_.
  ASSERT_GE(connect_to(port_), 0);  // it is up
  const int fd = gs_socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a = test_address(port_);
  ASSERT_EQ(gs_bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 ? gs_listen(fd, 8) : -EADDRINUSE, -EADDRINUSE);
  const std::string why = gs_last_error();
  EXPECT_NE(why.find("EADDRINUSE"), std::string::npos) << why;
  const char *transport = std::getenv("GPUSOCK_TRANSPORT");
  if (transport != nullptr && std::string(transport) == "fabric:shm") {  // shm knows the owner
    EXPECT_NE(why.find("in use by process " + std::to_string(echo_->pid())), std::string::npos) << why;
  }
  gs_close(fd);
}

TEST_F(SocketE2E, OptionsAndNames) {
  int fd = gs_socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  int v = 65536;
  ASSERT_EQ(gs_setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof v), 0);
  socklen_t len = sizeof v;
  ASSERT_EQ(gs_getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, &len), 0);
  EXPECT_EQ(v, 131072);  // rsocket doubles, as the kernel does
  v = 128;
  EXPECT_EQ(gs_setsockopt(fd, SOL_RDMA, RDMA_SQSIZE, &v, sizeof v), 0);
  v = 1;
  EXPECT_EQ(gs_setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, sizeof v), 0);
  EXPECT_EQ(gs_setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &v, sizeof v), 0);
  EXPECT_EQ(gs_setsockopt(fd, SOL_SOCKET, 0x7777, &v, sizeof v), -ENOPROTOOPT);
  EXPECT_EQ(gs_getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &len), 0);
  EXPECT_EQ(v, SOCK_STREAM);
  EXPECT_EQ(gs_fcntl(fd, F_SETFD, FD_CLOEXEC), 0);
  EXPECT_EQ(gs_fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);

  sockaddr_in a = test_address(port_);
  const auto end = Clock::now() + std::chrono::seconds(10);
  int rc;
  while ((rc = gs_connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a)) == -ECONNREFUSED && Clock::now() < end)
    usleep(10000);
  ASSERT_EQ(rc, 0);
  v = 64;
  EXPECT_EQ(gs_setsockopt(fd, SOL_RDMA, RDMA_SQSIZE, &v, sizeof v), -EINVAL);  // only before connect
  sockaddr_in peer{};
  len = sizeof peer;
  ASSERT_EQ(gs_getpeername(fd, reinterpret_cast<sockaddr *>(&peer), &len), 0);
  EXPECT_EQ(peer.sin_family, AF_INET);
  EXPECT_EQ(ntohs(peer.sin_port), port_);
  sockaddr_in self{};
  len = sizeof self;
  ASSERT_EQ(gs_getsockname(fd, reinterpret_cast<sockaddr *>(&self), &len), 0);
  EXPECT_EQ(self.sin_family, AF_INET);
  // The connection still works after all that.
  ASSERT_EQ(gs_send(fd, "ok", 2, 0), 2);
  char back[2];
  ASSERT_TRUE(recv_all(fd, reinterpret_cast<uint8_t *>(back), 2));
  gs_close(fd);
}

TEST(SocketServer, AcceptsAndDetectsKilledSender) {
  const int port = free_port();
  int lfd = gs_socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(lfd, 0);
  sockaddr_in a = test_address(port);
  ASSERT_EQ(gs_bind(lfd, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
  ASSERT_EQ(gs_listen(lfd, 8), 0);
  sockaddr_in name{};
  socklen_t len = sizeof name;
  ASSERT_EQ(gs_getsockname(lfd, reinterpret_cast<sockaddr *>(&name), &len), 0);
  EXPECT_EQ(ntohs(name.sin_port), port);

  Peer blaster({"blast", std::to_string(port)});
  sockaddr_in from{};
  len = sizeof from;
  int c = gs_accept(lfd, reinterpret_cast<sockaddr *>(&from), &len);
  ASSERT_GE(c, 0) << gs_status_name(c);
  EXPECT_EQ(from.sin_family, AF_INET);
  std::vector<uint8_t> buf(1 << 16);
  size_t got = 0;
  while (got < (size_t(4) << 20)) {
    ssize_t k = gs_recv(c, buf.data(), buf.size(), 0);
    ASSERT_GT(k, 0);
    got += static_cast<size_t>(k);
  }
  blaster.kill9();
  const auto start = Clock::now();
  ssize_t k;
  while ((k = gs_recv(c, buf.data(), buf.size(), 0)) > 0) {
    ASSERT_LT(Clock::now() - start, std::chrono::seconds(20)) << "no error after the peer died";
  }
  EXPECT_LT(k, 0) << "a killed peer must surface as an error, not a clean EOF";
  EXPECT_TRUE(k == -ECONNRESET || k == -EPIPE || k == -EIO) << gs_status_name(static_cast<int>(k));
  gs_close(c);
  gs_close(lfd);
}

TEST(SocketClient, DetectsKilledReceiver) {
  const int port = free_port();
  Peer sink({"sink", std::to_string(port)});
  int fd = connect_to(port);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> buf(1 << 16, 1);
  for (int i = 0; i < 16; ++i) ASSERT_TRUE(send_all(fd, buf.data(), buf.size()));
  sink.kill9();
  const auto start = Clock::now();
  ssize_t k;
  while ((k = gs_send(fd, buf.data(), buf.size(), 0)) > 0) {
    ASSERT_LT(Clock::now() - start, std::chrono::seconds(20)) << "sends kept succeeding into a dead peer";
  }
  EXPECT_LT(k, 0);
  gs_close(fd);
}

}  // namespace
