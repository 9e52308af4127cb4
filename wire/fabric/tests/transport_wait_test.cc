// Waiting on a transport: wait_fd, arm_wait and maybe_ready of endpoints and
// listeners, over fabric:tcp, fabric:shm and, in the Soft-RoCE guest with
// GPUSOCK_TEST_ADDR set (scripts/rdma-vm), verbs. A lost wake-up shows as a
// sleep that runs into kSleepMs; nothing here asserts how long anything took.
#include "test-support/sockets.h"
#include "wire/config.h"
#include "wire/fabric/tests/wait_test_helpers.h"
#include "wire/transport.h"

#include <gtest/gtest.h>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <set>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace gpusock::wire;
using namespace gpusock::wire::wait_test;

namespace {

class WaitTest : public ::testing::TestWithParam<const char *> {
 protected:
  void SetUp() override {
    if (is_verbs() && std::getenv("GPUSOCK_TEST_ADDR") == nullptr) {
      GTEST_SKIP() << "verbs: run in the Soft-RoCE guest (scripts/rdma-vm) with GPUSOCK_TEST_ADDR";
    }
    std::string error;
    const int rc = open_domain(GetParam(), &domain_, &error);
    if (is_verbs() && rc == -ENODEV) GTEST_SKIP() << error;
    ASSERT_EQ(rc, 0) << error;
    addr_ = gpusock::test::test_address(0);
    ASSERT_EQ(domain_->listen(reinterpret_cast<sockaddr *>(&addr_), sizeof(addr_), 128, &listener_), 0);
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    ASSERT_EQ(listener_->local_address(&bound, &len), 0);
    addr_.sin_port = reinterpret_cast<sockaddr_in &>(bound).sin_port;
    tx_.assign(kBufferSize, 0x5a);
    rx_.assign(kBufferSize, 0);
    ASSERT_EQ(domain_->register_memory(tx_.data(), tx_.size(), kAccessLocal, &tx_mr_), 0);
    ASSERT_EQ(domain_->register_memory(rx_.data(), rx_.size(), kAccessRemoteWrite, &rx_mr_), 0);
  }

  void TearDown() override {
    if (domain_) {
      domain_->deregister_memory(&tx_mr_);
      domain_->deregister_memory(&rx_mr_);
    }
    listener_.reset();
    domain_.reset();
  }

  bool is_verbs() const { return std::strcmp(GetParam(), "verbs") == 0; }
  bool is_shm() const { return std::strcmp(GetParam(), "fabric:shm") == 0; }

  std::unique_ptr<Endpoint> new_endpoint() {
    std::unique_ptr<Endpoint> ep;
    EXPECT_EQ(domain_->create_endpoint(nullptr, &ep), 0);
    if (ep) {
      EXPECT_EQ(ep->post_recv(kRecvPosts), 0);
    }
    return ep;
  }

  gs_status_t connect(Endpoint *ep) {
    static const uint8_t record[40] = {1, 2, 3};
    return ep->connect(reinterpret_cast<const sockaddr *>(&addr_), sizeof(addr_), record, sizeof(record));
  }

  // The server's end of `request`, accepted.
  std::unique_ptr<Endpoint> accept(ConnectionRequest *request) {
    static const uint8_t record[40] = {4, 5, 6};
    std::unique_ptr<Endpoint> ep;
    EXPECT_EQ(domain_->create_endpoint(request, &ep), 0);
    if (!ep) return ep;
    EXPECT_EQ(ep->post_recv(kRecvPosts), 0);
    EXPECT_EQ(domain_->accept(ep.get(), request, record, sizeof(record)), 0);
    return ep;
  }

  struct Pair {
    std::unique_ptr<Endpoint> client, server;
    Seen client_seen, server_seen;
  };

  // Both ends established, driven from this thread.
  void connect_pair(Pair *pair) {
    pair->client = new_endpoint();
    ASSERT_TRUE(pair->client);
    ASSERT_EQ(connect(pair->client.get()), 0);
    std::unique_ptr<ConnectionRequest> request;
    Deadline deadline(20);
    while (listener_->get_request(&request) != 1) {
      ASSERT_FALSE(deadline.passed()) << "no connection request";
      progress(pair->client.get(), &pair->client_seen);
    }
    pair->server = accept(request.get());
    ASSERT_TRUE(pair->server);
    while (!pair->client_seen.has_event(CmEventKind::kEstablished) ||
           !pair->server_seen.has_event(CmEventKind::kEstablished)) {
      ASSERT_FALSE(deadline.passed()) << "not established";
      ASSERT_FALSE(pair->client_seen.closed() || pair->server_seen.closed()) << "connection refused";
      progress(pair->client.get(), &pair->client_seen);
      progress(pair->server.get(), &pair->server_seen);
    }
  }

  // A write with immediate `imm` of `length` bytes into rx_ at `offset`.
  WriteRequest write(uint32_t imm, uint32_t length, uint64_t token, size_t offset = 0) const {
    WriteRequest w;
    w.local = tx_.data() + offset;
    w.region = &tx_mr_;
    w.length = length;
    w.remote_addr = rx_mr_.remote_addr + offset;
    w.rkey = rx_mr_.rkey;
    w.imm = imm;
    w.inline_data = length <= 64;
    w.token = token;
    return w;
  }

  std::unique_ptr<Domain> domain_;
  std::unique_ptr<Listener> listener_;
  sockaddr_in addr_{};
  std::vector<uint8_t> tx_, rx_;
  MemoryRegion tx_mr_, rx_mr_;
};

TEST_P(WaitTest, WaitFdsAreStable) {
  EXPECT_GE(listener_->wait_fd(), 0);
  Pair pair;
  pair.client = new_endpoint();
  ASSERT_TRUE(pair.client);
  const int before = pair.client->wait_fd();
  EXPECT_GE(before, 0);
  pair.client.reset();
  ASSERT_NO_FATAL_FAILURE(connect_pair(&pair));
  const int client_fd = pair.client->wait_fd();
  EXPECT_GE(client_fd, 0);
  EXPECT_GE(pair.server->wait_fd(), 0);
  // fabric:tcp endpoints a thread opens share a CQ, and its wait fd.
  if (std::strcmp(GetParam(), "fabric:tcp") != 0) {
    EXPECT_NE(client_fd, pair.server->wait_fd());
  }
  pair.client->disconnect();
  EXPECT_TRUE(sleep_until(pair.server.get(), &pair.server_seen, [&] { return pair.server_seen.closed(); }));
  EXPECT_EQ(pair.client->wait_fd(), client_fd);
}

// (e) Nothing to do: the fds stay unreadable after arm_wait, so a caller
// sleeps instead of spinning; before, during and after a connection.
TEST_P(WaitTest, IdleFdsStayQuiet) {
  ASSERT_TRUE(settle(listener_.get()));
  EXPECT_FALSE(readable(listener_->wait_fd(), kQuietMs));
  // verbs has no look without a system call, nor has a fabric:tcp listener
  // (its requests wait in the kernel's queue until asked for).
  if (!is_verbs() && std::strcmp(GetParam(), "fabric:tcp") != 0) {
    EXPECT_FALSE(listener_->maybe_ready());
  }

  auto idle = new_endpoint();
  ASSERT_TRUE(idle);
  Seen idle_seen;
  ASSERT_TRUE(settle(idle.get(), &idle_seen));
  EXPECT_FALSE(readable(idle->wait_fd(), kQuietMs));

  Pair pair;
  ASSERT_NO_FATAL_FAILURE(connect_pair(&pair));
  ASSERT_TRUE(settle(pair.client.get(), &pair.client_seen));
  ASSERT_TRUE(settle(pair.server.get(), &pair.server_seen));
  EXPECT_FALSE(readable(pair.client->wait_fd(), kQuietMs));
  EXPECT_FALSE(readable(pair.server->wait_fd(), kQuietMs));

  pair.client->disconnect();
  ASSERT_TRUE(sleep_until(pair.server.get(), &pair.server_seen, [&] { return pair.server_seen.closed(); }));
  ASSERT_TRUE(sleep_until(pair.client.get(), &pair.client_seen, [&] { return pair.client_seen.closed(); }));
  ASSERT_TRUE(settle(pair.client.get(), &pair.client_seen));
  ASSERT_TRUE(settle(pair.server.get(), &pair.server_seen));
  EXPECT_FALSE(readable(pair.client->wait_fd(), kQuietMs)) << "a closed endpoint stays readable";
  EXPECT_FALSE(readable(pair.server->wait_fd(), kQuietMs)) << "a closed endpoint stays readable";
  ASSERT_TRUE(settle(listener_.get()));
  EXPECT_FALSE(readable(listener_->wait_fd(), kQuietMs));
}

// (a) + (b): after arm_wait()==0, a request, an established connection, a
// write and a disconnect each make the wait fd readable, and until they are
// taken arm_wait says -EAGAIN.
TEST_P(WaitTest, EventsWakeAndKeepArmFromSleeping) {
  ASSERT_TRUE(settle(listener_.get()));
  auto client = new_endpoint();
  ASSERT_TRUE(client);
  Seen client_seen, server_seen;
  ASSERT_EQ(connect(client.get()), 0);
  // The client sleeps through its side of the handshake (verbs resolves the
  // address and the route in poll_cm before its request leaves).
  std::thread client_side([&] {
    EXPECT_TRUE(
        sleep_until(client.get(), &client_seen, [&] { return client_seen.has_event(CmEventKind::kEstablished); }));
  });
  ASSERT_NO_FATAL_FAILURE(expect_pending(listener_.get(), "connection request"));
  std::unique_ptr<ConnectionRequest> request;
  const bool requested = sleep_for_request(listener_.get(), &request);
  std::unique_ptr<Endpoint> server = requested ? accept(request.get()) : nullptr;
  if (server) {
    EXPECT_TRUE(
        sleep_until(server.get(), &server_seen, [&] { return server_seen.has_event(CmEventKind::kEstablished); }));
  } else {
    client->disconnect();  // ends the client's wait
  }
  client_side.join();
  ASSERT_TRUE(requested && server);

  // A write: pending at the receiver, and (its local completion) at the sender.
  ASSERT_TRUE(settle(server.get(), &server_seen));
  ASSERT_TRUE(settle(client.get(), &client_seen));
  ASSERT_EQ(client->post_write(write(7, 100, 70)), 0);
  if (!is_verbs()) {
    EXPECT_EQ(client->arm_wait(), -EAGAIN) << "an inline write's completion is waiting";
  }
  ASSERT_NO_FATAL_FAILURE(expect_pending(client.get(), "write completion"));
  ASSERT_NO_FATAL_FAILURE(expect_pending(server.get(), "write received"));
  EXPECT_TRUE(
      sleep_until(server.get(), &server_seen, [&] { return server_seen.count(CompletionKind::kRecvImm, 7) == 1; }));
  EXPECT_TRUE(
      sleep_until(client.get(), &client_seen, [&] { return client_seen.count(CompletionKind::kWriteDone, 70) == 1; }));

  // A disconnect.
  ASSERT_TRUE(settle(server.get(), &server_seen));
  client->disconnect();
  ASSERT_NO_FATAL_FAILURE(expect_pending(server.get(), "peer disconnected"));
  EXPECT_TRUE(
      sleep_until(server.get(), &server_seen, [&] { return server_seen.has_event(CmEventKind::kDisconnected); }));
}

// (b) Both ends only ever sleep on their wait fds, each in its own thread:
// handshake, ping-pong of every size, a burst that outruns the receiver
// (back-pressure), disconnect. A lost wake-up stalls one side for kSleepMs.
TEST_P(WaitTest, SleepingPeersNeverStall) {
  constexpr uint32_t kPings = 60;
  constexpr uint32_t kBurst = 3000;
  const uint32_t sizes[] = {0, 1, 64, 100, 4096, 5000, 65536};
  std::atomic<bool> server_ok{true};

  std::thread server_side([&] {
    auto fail = [&](const char *what) {
      ADD_FAILURE() << "server: " << what;
      server_ok = false;
    };
    std::unique_ptr<ConnectionRequest> request;
    if (!sleep_for_request(listener_.get(), &request)) return fail("no request");
    auto server = accept(request.get());
    if (!server) return fail("accept");
    Seen seen;
    if (!sleep_until(server.get(), &seen, [&] { return seen.has_event(CmEventKind::kEstablished); }))
      return fail("not established");
    for (uint32_t i = 0; i < kPings; ++i) {
      if (!sleep_until(server.get(), &seen, [&] { return seen.count(CompletionKind::kRecvImm, i) == 1; }))
        return fail("ping lost");
      gs_status_t rc;
      while ((rc = server->post_write(write(1000 + i, sizes[i % 7], 1000 + i, kBufferSize / 2))) == -EAGAIN) {
        if (!nap(server.get(), &seen)) return fail("stalled on a full queue");
      }
      if (rc != 0) return fail("pong");
    }
    if (!sleep_until(server.get(), &seen, [&] { return seen.imms() >= kPings + kBurst; })) return fail("burst lost");
    if (!sleep_until(server.get(), &seen, [&] { return seen.closed(); })) return fail("no disconnect");
  });

  auto client = new_endpoint();
  ASSERT_TRUE(client);
  Seen seen;
  ASSERT_EQ(connect(client.get()), 0);
  ASSERT_TRUE(
      sleep_until(client.get(), &seen, [&] { return seen.has_event(CmEventKind::kEstablished) || seen.closed(); }));
  ASSERT_TRUE(seen.has_event(CmEventKind::kEstablished));
  for (uint32_t i = 0; i < kPings && server_ok; ++i) {
    ASSERT_EQ(client->post_write(write(i, sizes[i % 7], i)), 0);
    ASSERT_TRUE(sleep_until(client.get(), &seen, [&] { return seen.count(CompletionKind::kRecvImm, 1000 + i) == 1; }))
        << "pong " << i << " lost";
  }
  // The burst: 4 KiB writes back to back; -EAGAIN means sleep until the
  // receiver made room (it rings back).
  uint32_t sent = 0;
  uint32_t blocked = 0;
  while (sent < kBurst && server_ok) {
    const gs_status_t rc = client->post_write(write(50000 + sent, 4096, 50000 + sent, (sent % 64) * 4096));
    if (rc == 0) {
      ++sent;
      continue;
    }
    ASSERT_EQ(rc, -EAGAIN);
    ++blocked;
    ASSERT_TRUE(nap(client.get(), &seen)) << "stalled after -EAGAIN";
  }
  std::printf("[ info ] %s: burst of %u writes met -EAGAIN %u times\n", GetParam(), kBurst, blocked);
  ASSERT_TRUE(sleep_until(client.get(), &seen, [&] {
    size_t done = 0;
    for (const Completion &c : seen.completions) done += c.kind == CompletionKind::kWriteDone;
    return done >= kPings + kBurst;
  }));
  EXPECT_FALSE(seen.failed_completion());
  client->disconnect();
  EXPECT_TRUE(sleep_until(client.get(), &seen, [&] { return seen.closed(); }));
  server_side.join();
}

// (c) maybe_ready never says false while poll or poll_cm would return
// something. Both ends driven from this thread, so nothing arrives between
// the look and the poll (tcp and verbs say true whenever bytes may be in
// flight, which no cheap look can see).
TEST_P(WaitTest, MaybeReadyNeverHidesWork) {
  auto check = [](Endpoint *ep, Seen *seen, const char *who) {
    const bool maybe = ep->maybe_ready();
    const int n = progress(ep, seen);
    if (!maybe) {
      EXPECT_EQ(n, 0) << who << ": maybe_ready said false, poll found " << n;
    }
  };
  Pair pair;
  pair.client = new_endpoint();
  ASSERT_TRUE(pair.client);
  check(pair.client.get(), &pair.client_seen, "idle");
  ASSERT_EQ(connect(pair.client.get()), 0);
  std::unique_ptr<ConnectionRequest> request;
  Deadline deadline(20);
  for (;;) {
    ASSERT_FALSE(deadline.passed());
    const bool maybe = listener_->maybe_ready();
    const int got = listener_->get_request(&request);
    if (is_shm() && !maybe) {  // tcp: routed by another thread, in its own time
      EXPECT_EQ(got, 0) << "listener: maybe_ready said false";
    }
    if (got == 1) break;
    check(pair.client.get(), &pair.client_seen, "connecting client");
  }
  pair.server = accept(request.get());
  ASSERT_TRUE(pair.server);
  while (!pair.client_seen.has_event(CmEventKind::kEstablished) ||
         !pair.server_seen.has_event(CmEventKind::kEstablished)) {
    ASSERT_FALSE(deadline.passed());
    check(pair.client.get(), &pair.client_seen, "client handshake");
    check(pair.server.get(), &pair.server_seen, "server handshake");
  }
  const uint32_t sizes[] = {0, 1, 64, 100, 4096, 5000, 65536};
  for (uint32_t i = 0; i < 70; ++i) {
    Endpoint *from = i % 2 ? pair.server.get() : pair.client.get();
    ASSERT_EQ(from->post_write(write(i, sizes[i % 7], i, (i % 8) * 65536)), 0);
    Seen &to_seen = i % 2 ? pair.client_seen : pair.server_seen;
    Seen &from_seen = i % 2 ? pair.server_seen : pair.client_seen;
    while (to_seen.count(CompletionKind::kRecvImm, i) == 0 || from_seen.count(CompletionKind::kWriteDone, i) == 0) {
      ASSERT_FALSE(deadline.passed()) << "write " << i;
      check(pair.client.get(), &pair.client_seen, "client transfer");
      check(pair.server.get(), &pair.server_seen, "server transfer");
    }
  }
  pair.client->disconnect();
  while (!pair.client_seen.closed() || !pair.server_seen.closed()) {
    ASSERT_FALSE(deadline.passed());
    check(pair.client.get(), &pair.client_seen, "client disconnect");
    check(pair.server.get(), &pair.server_seen, "server disconnect");
  }
  for (int i = 0; i < 100; ++i) {
    check(pair.client.get(), &pair.client_seen, "client closed");
    check(pair.server.get(), &pair.server_seen, "server closed");
  }
}

// Endpoints one thread opened (on fabric:tcp they share a CQ and its wait
// fd), each then driven by a thread of its own that sleeps whenever it has
// nothing to do: a ping-pong on every pair, every immediate in order, while
// some pairs close half-way. Whoever reads a shared CQ routes what it finds
// to its owner and wakes that owner's sleep: none stalls, none sees another's.
TEST_P(WaitTest, EndpointsOfOneThreadDrivenBySleepingThreads) {
  constexpr int kPairs = 12;
  constexpr uint32_t kRounds = 200;
  // fabric:tcp: every endpoint beyond the fourth shares a CQ with three more.
  setenv("GPUSOCK_TCP_CQ_SHARE", "4", 1);
  gpusock::config::reload();
  std::vector<Pair> pairs(kPairs);
  for (Pair &pair : pairs) ASSERT_NO_FATAL_FAILURE(connect_pair(&pair));
  if (std::strcmp(GetParam(), "fabric:tcp") == 0) {
    std::set<int> fds;
    for (Pair &pair : pairs) fds.insert({pair.client->wait_fd(), pair.server->wait_fd()});
    EXPECT_LE(fds.size(), 4u + (2 * kPairs - 4 + 3) / 4) << "CQs of their own for the first 4, then shared by 4";
  }
  std::atomic<int> failures{0};
  auto drive = [&](Pair *pair, int index, bool client) {
    Endpoint *ep = client ? pair->client.get() : pair->server.get();
    Seen &seen = client ? pair->client_seen : pair->server_seen;
    const uint32_t base = static_cast<uint32_t>(index) * 100000u + (client ? 0u : 50000u);
    const uint32_t peer_base = static_cast<uint32_t>(index) * 100000u + (client ? 50000u : 0u);
    const size_t offset = static_cast<size_t>(index) * 2 * 4096 + (client ? 4096 : 0);
    const uint32_t rounds = index % 3 == 0 ? kRounds / 2 : kRounds;  // a third close half-way
    auto send = [&](uint32_t i) {
      gs_status_t rc;
      while ((rc = ep->post_write(write(base + i, 64 + i % 200, base + i, offset))) == -EAGAIN) {
        if (!nap(ep, &seen)) break;
      }
      return rc == 0;
    };
    auto receive = [&](uint32_t i) {
      const uint32_t want = peer_base + i;
      if (sleep_until(ep, &seen, [&] { return seen.count(CompletionKind::kRecvImm, want) == 1; })) return true;
      ADD_FAILURE() << "pair " << index << (client ? " client" : " server") << ": immediate " << want << " lost";
      return false;
    };
    for (uint32_t i = 0; i < rounds; ++i) {
      const bool ok = client ? send(i) && receive(i) : receive(i) && send(i);
      if (!ok) {
        ++failures;
        return;
      }
    }
    // Nothing but our peer's immediates, in order.
    uint32_t expect = peer_base;
    for (const Completion &c : seen.completions) {
      if (c.kind != CompletionKind::kRecvImm) continue;
      if (c.imm != expect++ || c.status != 0) ++failures;
    }
    if (client && index % 3 == 0) ep->disconnect();
  };
  std::vector<std::thread> threads;
  for (int p = 0; p < kPairs; ++p) {
    threads.emplace_back(drive, &pairs[static_cast<size_t>(p)], p, true);
    threads.emplace_back(drive, &pairs[static_cast<size_t>(p)], p, false);
  }
  for (auto &t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  // The pairs that closed go first; the others' ends still work after it.
  for (int p = 0; p < kPairs; p += 3) pairs[static_cast<size_t>(p)] = Pair{};
  for (int p = 1; p < kPairs; p += 3) {
    Pair &pair = pairs[static_cast<size_t>(p)];
    ASSERT_EQ(pair.client->post_write(write(7, 8, 7)), 0);
    EXPECT_TRUE(sleep_until(pair.server.get(), &pair.server_seen,
                            [&] { return pair.server_seen.count(CompletionKind::kRecvImm, 7) == 1; }));
  }
  unsetenv("GPUSOCK_TCP_CQ_SHARE");
  gpusock::config::reload();
}

// (d) Two threads asleep on one wait fd both wake.
TEST_P(WaitTest, TwoSleepersOnOneFdBothWake) {
  ASSERT_TRUE(settle(listener_.get()));
  {
    std::atomic<int> woke{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) threads.emplace_back([&] { woke += readable(listener_->wait_fd(), kSleepMs); });
    auto client = new_endpoint();
    ASSERT_TRUE(client);
    ASSERT_EQ(connect(client.get()), 0);
    Seen seen;
    std::thread client_side([&] { EXPECT_TRUE(sleep_until(client.get(), &seen, [&] { return seen.closed(); })); });
    for (auto &t : threads) t.join();
    EXPECT_EQ(woke.load(), 2) << "listener";
    // Take that request and refuse it: the client gives up.
    std::unique_ptr<ConnectionRequest> request;
    if (sleep_for_request(listener_.get(), &request)) {
      request->reject();
    } else {
      ADD_FAILURE() << "no request";
      client->disconnect();
    }
    client_side.join();
  }
  Pair pair;
  ASSERT_NO_FATAL_FAILURE(connect_pair(&pair));
  ASSERT_TRUE(settle(pair.server.get(), &pair.server_seen));
  std::atomic<int> woke{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) threads.emplace_back([&] { woke += readable(pair.server->wait_fd(), kSleepMs); });
  ASSERT_EQ(pair.client->post_write(write(9, 10, 9)), 0);
  for (auto &t : threads) t.join();
  EXPECT_EQ(woke.load(), 2) << "endpoint";
}

// --- a peer in another process, SIGKILLed while we sleep ---------------------

constexpr const char *kChildEnv = "GPUSOCK_WAIT_TEST_CHILD";

// Child mode: "<spec>|<port>|<fd>" in kChildEnv. Connect, say so on fd once
// established, then sleep on the endpoint until killed.
[[noreturn]] void child_main(const char *arg) {
  std::string spec(arg);
  const size_t a = spec.find('|'), b = spec.find('|', a + 1);
  const int port = std::atoi(spec.c_str() + a + 1);
  const int fd = std::atoi(spec.c_str() + b + 1);
  spec.resize(a);
  std::unique_ptr<Domain> domain;
  std::string error;
  if (open_domain(spec, &domain, &error) != 0) _exit(2);
  std::unique_ptr<Endpoint> ep;
  if (domain->create_endpoint(nullptr, &ep) != 0 || ep->post_recv(kRecvPosts) != 0) _exit(3);
  sockaddr_in addr = gpusock::test::test_address(port);
  static const uint8_t record[40] = {7};
  if (ep->connect(reinterpret_cast<sockaddr *>(&addr), sizeof(addr), record, sizeof(record)) != 0) _exit(4);
  Seen seen;
  if (!sleep_until(ep.get(), &seen, [&] { return seen.has_event(CmEventKind::kEstablished) || seen.closed(); }) ||
      !seen.has_event(CmEventKind::kEstablished)) {
    _exit(5);
  }
  const char up = 1;
  if (write(fd, &up, 1) != 1) _exit(6);
  sleep_until(ep.get(), &seen, [] { return false; });
  _exit(0);
}

struct ChildModeHook {
  ChildModeHook() {
    if (const char *arg = std::getenv(kChildEnv)) child_main(arg);
  }
} child_mode_hook;

TEST_P(WaitTest, KilledPeerWakesSleeper) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const std::string arg =
      std::string(GetParam()) + "|" + std::to_string(ntohs(addr_.sin_port)) + "|" + std::to_string(fds[1]);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(fds[0]);
    setenv(kChildEnv, arg.c_str(), 1);
    execl("/proc/self/exe", "wait_child", static_cast<char *>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  auto reap = [&] {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
  };
  std::unique_ptr<ConnectionRequest> request;
  if (!sleep_for_request(listener_.get(), &request)) {
    reap();
    FAIL() << "no request from the child";
  }
  auto server = accept(request.get());
  ASSERT_TRUE(server);
  Seen seen;
  const bool up = sleep_until(server.get(), &seen, [&] { return seen.has_event(CmEventKind::kEstablished); });
  char byte = 0;
  if (!up || !readable(fds[0], kSleepMs) || read(fds[0], &byte, 1) != 1) {
    reap();
    FAIL() << "the child did not get connected";
  }
  close(fds[0]);
  ASSERT_TRUE(settle(server.get(), &seen));
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_TRUE(readable(server->wait_fd(), kSleepMs)) << "the peer's death did not wake the sleeper";
  EXPECT_TRUE(sleep_until(server.get(), &seen, [&] { return seen.closed() || seen.failed_completion(); }));
}

INSTANTIATE_TEST_SUITE_P(Transports, WaitTest, ::testing::Values("fabric:tcp", "fabric:shm", "verbs"),
                         [](const ::testing::TestParamInfo<const char *> &info) {
                           const std::string name = info.param;
                           return name.substr(name.find(':') + 1);
                         });

}  // namespace
