// Readiness sets (gs_ready_set_*): which members a look reports, over the
// transport the environment names. fabric:shm gives hints (a look costs what
// the members with news cost), fabric:tcp none (every member is looked at):
// the answers must be the same.
#include "test-support/gs_sockets.h"
#include "test-support/peer_process.h"

#include <gpusock/socket.h>

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>

#include <signal.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <set>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace gpusock::test;  // free_port, listen_on, test_address, send_all, recv_all

// `n` connected pairs in this process: client and server fds.
struct Pairs {
  std::vector<int> clients, servers;
  int listener = -1;
  explicit Pairs(int n) {
    const sockaddr_in a = test_address(free_port());
    listener = listen_on(a, n + 8);
    if (listener < 0) return;
    for (int i = 0; i < n; ++i) {
      const int c = gs_socket(AF_INET, SOCK_STREAM, 0);
      if (c < 0 || gs_connect(c, reinterpret_cast<const sockaddr *>(&a), sizeof a) != 0) return;
      const int s = gs_accept(listener, nullptr, nullptr);
      if (s < 0) return;
      clients.push_back(c);
      servers.push_back(s);
    }
  }
  ~Pairs() {
    for (int fd : clients) gs_close(fd);
    for (int fd : servers) gs_close(fd);
    if (listener >= 0) gs_close(listener);
  }
  bool ok(int n) const { return static_cast<int>(servers.size()) == n; }
};

// The fds a look reports with `bits`, looking again for up to a second
// until `want` of them have come (data on loopback is not instant on tcp).
std::set<int> ready_fds(gs_ready_set_t *set, short bits, size_t want, int max = 64,
                        std::chrono::milliseconds patience = std::chrono::seconds(1)) {
  std::set<int> got;
  std::vector<pollfd> out(static_cast<size_t>(max));
  const auto until = std::chrono::steady_clock::now() + patience;
  do {
    got.clear();
    const int n = gs_ready_set_poll(set, out.data(), max, nullptr);
    for (int i = 0; i < n; ++i)
      if (out[static_cast<size_t>(i)].revents & bits) got.insert(out[static_cast<size_t>(i)].fd);
    if (got.size() >= want) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  } while (std::chrono::steady_clock::now() < until);
  return got;
}

constexpr int kPairs = 40;

// No full passes within a test's time: only hints bring news, so a lost
// one fails the test (sets read this when made).
const bool g_no_full_passes = setenv("GPUSOCK_READY_SET_FULL_MS", "3600000", 1) == 0;

}  // namespace

// Data on a few of many members: exactly those are reported, on every look
// until they are read (level-triggered), and none once they are.
TEST(ReadySet, ReportsTheMembersWithDataUntilRead) {
  Pairs p(kPairs);
  ASSERT_TRUE(p.ok(kPairs)) << gs_last_error();
  gs_ready_set_t *set = gs_ready_set_create();
  ASSERT_NE(set, nullptr);
  for (int fd : p.servers) ASSERT_EQ(gs_ready_set_ctl(set, EPOLL_CTL_ADD, fd, POLLIN), 0);
  EXPECT_TRUE(ready_fds(set, POLLIN, 0).empty());
  std::set<int> sent;
  for (int i : {3, 17, 31}) {
    ASSERT_TRUE(send_all(p.clients[static_cast<size_t>(i)], "abc", 3));
    sent.insert(p.servers[static_cast<size_t>(i)]);
  }
  EXPECT_EQ(ready_fds(set, POLLIN, 3), sent);
  EXPECT_EQ(ready_fds(set, POLLIN, 3), sent) << "level-triggered: reported again while unread";
  for (int fd : sent) {
    char b[3];
    ASSERT_TRUE(recv_all(fd, b, 3));
  }
  EXPECT_TRUE(ready_fds(set, POLLIN, 0).empty());
  gs_ready_set_destroy(set);
}

// More ready members than a look may report: every one comes within a few
// looks (those not reported go first next time).
TEST(ReadySet, MoreReadyThanMaxAreAllReportedInTurn) {
  Pairs p(kPairs);
  ASSERT_TRUE(p.ok(kPairs)) << gs_last_error();
  gs_ready_set_t *set = gs_ready_set_create();
  for (int fd : p.servers) ASSERT_EQ(gs_ready_set_ctl(set, EPOLL_CTL_ADD, fd, POLLIN), 0);
  for (int fd : p.clients) ASSERT_TRUE(send_all(fd, "x", 1));
  ready_fds(set, POLLIN, kPairs, kPairs);  // wait until all have data
  std::set<int> seen;
  std::vector<pollfd> out(7);
  for (int look = 0; look < 6; ++look) {
    const int n = gs_ready_set_poll(set, out.data(), 7, nullptr);
    EXPECT_LE(n, 7);
    for (int i = 0; i < n; ++i) seen.insert(out[static_cast<size_t>(i)].fd);
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kPairs));
  gs_ready_set_destroy(set);
}

// Two sets in one process share the transport's board: each takes only its
// own members' hints.
TEST(ReadySet, TwoSetsEachGetTheirOwnNews) {
  Pairs p(8);
  ASSERT_TRUE(p.ok(8)) << gs_last_error();
  gs_ready_set_t *a = gs_ready_set_create();
  gs_ready_set_t *b = gs_ready_set_create();
  for (int i = 0; i < 8; ++i)
    ASSERT_EQ(gs_ready_set_ctl(i % 2 ? b : a, EPOLL_CTL_ADD, p.servers[static_cast<size_t>(i)], POLLIN), 0);
  EXPECT_TRUE(ready_fds(a, POLLIN, 0).empty());
  EXPECT_TRUE(ready_fds(b, POLLIN, 0).empty());
  ASSERT_TRUE(send_all(p.clients[5], "x", 1));
  ASSERT_TRUE(send_all(p.clients[2], "x", 1));
  EXPECT_EQ(ready_fds(a, POLLIN, 1), std::set<int>{p.servers[2]});
  EXPECT_EQ(ready_fds(b, POLLIN, 1), std::set<int>{p.servers[5]});
  gs_ready_set_destroy(a);
  gs_ready_set_destroy(b);
}

// Members deleted, changed, closed behind the set's back; a peer's close.
TEST(ReadySet, FollowsChangesOfItsMembers) {
  Pairs p(4);
  ASSERT_TRUE(p.ok(4)) << gs_last_error();
  gs_ready_set_t *set = gs_ready_set_create();
  for (int fd : p.servers) ASSERT_EQ(gs_ready_set_ctl(set, EPOLL_CTL_ADD, fd, POLLIN), 0);
  EXPECT_EQ(gs_ready_set_ctl(set, EPOLL_CTL_ADD, p.servers[0], POLLIN), -EEXIST);
  EXPECT_EQ(gs_ready_set_ctl(set, EPOLL_CTL_MOD, p.clients[0], POLLIN), -ENOENT);
  EXPECT_EQ(gs_ready_set_ctl(set, EPOLL_CTL_ADD, 0, POLLIN), -ENOTSOCK);

  ASSERT_TRUE(send_all(p.clients[0], "x", 1));
  ASSERT_EQ(gs_ready_set_ctl(set, EPOLL_CTL_DEL, p.servers[0], 0), 0);
  EXPECT_TRUE(ready_fds(set, POLLIN, 1).empty()) << "a deleted member is not reported";
  ASSERT_EQ(gs_ready_set_ctl(set, EPOLL_CTL_ADD, p.servers[0], POLLIN), 0);
  EXPECT_EQ(ready_fds(set, POLLIN, 1), std::set<int>{p.servers[0]}) << "added again: looked at again";

  // Writable members, once asked for.
  ASSERT_EQ(gs_ready_set_ctl(set, EPOLL_CTL_MOD, p.servers[1], POLLOUT), 0);
  EXPECT_EQ(ready_fds(set, POLLOUT, 1), std::set<int>{p.servers[1]});
  ASSERT_EQ(gs_ready_set_ctl(set, EPOLL_CTL_MOD, p.servers[1], POLLIN), 0);

  // The peer closes: readable (EOF) without data sent.
  gs_close(p.clients[2]);
  p.clients[2] = gs_socket(AF_INET, SOCK_STREAM, 0);  // for ~Pairs
  std::set<int> got = ready_fds(set, POLLIN, 2);
  EXPECT_EQ(got.count(p.servers[2]), 1u) << "a peer's close is news";

  // A member closed without leaving the set leaves it by itself.
  gs_close(p.servers[3]);
  p.servers[3] = gs_socket(AF_INET, SOCK_STREAM, 0);
  got = ready_fds(set, POLLIN | POLLHUP | POLLERR | POLLNVAL, 2);
  EXPECT_EQ(got.count(p.servers[3]), 0u) << "the fd is no member any more (a new socket has it)";
  gs_ready_set_destroy(set);
}

// A member with news, then many looks without: the news is never lost to
// a look that found nothing, whichever thread sends meanwhile.
TEST(ReadySet, NewsFromAnotherThreadIsNeverLost) {
  Pairs p(16);
  ASSERT_TRUE(p.ok(16)) << gs_last_error();
  gs_ready_set_t *set = gs_ready_set_create();
  for (int fd : p.servers) ASSERT_EQ(gs_ready_set_ctl(set, EPOLL_CTL_ADD, fd, POLLIN), 0);
  constexpr int kRounds = 2000;
  std::thread sender([&] {
    for (int r = 0; r < kRounds; ++r) send_all(p.clients[static_cast<size_t>(r % 16)], "y", 1);
  });
  int received = 0;
  std::vector<pollfd> out(16);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (received < kRounds && std::chrono::steady_clock::now() < until) {
    const int n = gs_ready_set_poll(set, out.data(), 16, nullptr);
    for (int i = 0; i < n; ++i) {
      char b[64];
      const ssize_t k = gs_recv(out[static_cast<size_t>(i)].fd, b, sizeof b, MSG_DONTWAIT);
      if (k > 0) received += static_cast<int>(k);
    }
  }
  sender.join();
  EXPECT_EQ(received, kRounds);
  gs_ready_set_destroy(set);
}

// Sleeping on a set of idle members: a send on one of them ends the sleep;
// a member with data already makes the sleep not begin.
TEST(ReadySet, SleepEndsWithNewsOnAnyMember) {
  Pairs p(24);
  ASSERT_TRUE(p.ok(24)) << gs_last_error();
  gs_ready_set_t *set = gs_ready_set_create();
  for (int fd : p.servers) ASSERT_EQ(gs_ready_set_ctl(set, EPOLL_CTL_ADD, fd, POLLIN), 0);
  EXPECT_TRUE(ready_fds(set, POLLIN, 0).empty());  // a look: every member is known quiet now
  for (int round = 0; round < 20; ++round) {
    const int who = (round * 7) % 24;
    std::vector<pollfd> wait(64);
    int n = -EAGAIN;
    for (int tries = 0; tries < 100 && n == -EAGAIN; ++tries) {  // -EAGAIN: look again, as a wait does
      n = gs_ready_set_wait_begin(set, wait.data(), wait.size());
      if (n == -EAGAIN) {
        EXPECT_TRUE(ready_fds(set, POLLIN, 0).empty());
      }
    }
    ASSERT_GE(n, 0) << "round " << round << ": " << n;
    std::thread sender([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      send_all(p.clients[static_cast<size_t>(who)], "z", 1);
    });
    int woke = 0;
    if (n > 0) woke = ::poll(wait.data(), static_cast<nfds_t>(n), 10000);
    // Odd rounds as the shim ends its sleeps: told what the poll found.
    if (round % 2 == 1) gs_ready_set_wait_end_polled(set, wait.data(), static_cast<nfds_t>(n));
    else gs_ready_set_wait_end(set);
    sender.join();
    EXPECT_GT(woke, 0) << "round " << round << ": the sleep ended only at its timeout";
    EXPECT_EQ(ready_fds(set, POLLIN, 1), std::set<int>{p.servers[static_cast<size_t>(who)]});
    // Data there already: no sleep.
    std::vector<pollfd> again(64);
    EXPECT_EQ(gs_ready_set_wait_begin(set, again.data(), again.size()), -EAGAIN);
    char b;
    ASSERT_TRUE(recv_all(p.servers[static_cast<size_t>(who)], &b, 1));
    EXPECT_TRUE(ready_fds(set, POLLIN, 0).empty());
  }
  gs_ready_set_destroy(set);
}

namespace {

// The wait fd of gs_wait_begin's that is this thread's waker (an eventfd).
int waker_among(const pollfd *wait, int n) {
  for (int i = 0; i < n; ++i) {
    char link[64] = {};
    const std::string path = "/proc/self/fd/" + std::to_string(wait[i].fd);
    if (readlink(path.c_str(), link, sizeof link - 1) > 0 && std::string(link) == "anon_inode:[eventfd]")
      return wait[i].fd;
  }
  return -1;
}

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

// gs_wait_begin over one socket, looking again while it refuses (a fresh
// connection's own traffic), as a wait does.
int begin_sleep_on(pollfd *socket, std::vector<pollfd> *wait) {
  int n = -EAGAIN;
  for (int tries = 0; tries < 1000 && n == -EAGAIN; ++tries) {
    n = gs_wait_begin(socket, 1, wait->data(), wait->size());
    if (n == -EAGAIN) {
      pollfd look = *socket;
      gs_poll(&look, 1, 1);
    }
  }
  return n;
}

}  // namespace

// gs_wait_end_polled reads only what the sleep's poll found readable: a
// wake-up that came after the poll (another thread's progress on a socket
// this thread sleeps on) stays, ends the next sleep at once, and is read
// then; gs_wait_end reads it whatever the poll found.
TEST(ReadySet, WakeUpAfterThePollEndsTheNextSleepAndIsReadThen) {
  Pairs p(1);
  ASSERT_TRUE(p.ok(1)) << gs_last_error();
  pollfd socket{p.servers[0], POLLIN, 0};
  std::vector<pollfd> wait(16);
  int n = begin_sleep_on(&socket, &wait);
  ASSERT_GT(n, 0) << n;
  const int waker = waker_among(wait.data(), n);
  ASSERT_GE(waker, 0) << "no eventfd among the wait fds";
  ASSERT_EQ(eventfd_write(waker, 1), 0);  // as a waking thread does, after our poll
  for (int i = 0; i < n; ++i) wait[static_cast<size_t>(i)].revents = 0;
  gs_wait_end_polled(&socket, 1, wait.data(), static_cast<nfds_t>(n));
  EXPECT_TRUE(readable(waker)) << "read though the poll had not found it";

  n = begin_sleep_on(&socket, &wait);
  ASSERT_GT(n, 0) << n;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_GT(::poll(wait.data(), static_cast<nfds_t>(n), 10000), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << "the next sleep did not end at once";
  gs_wait_end_polled(&socket, 1, wait.data(), static_cast<nfds_t>(n));
  EXPECT_FALSE(readable(waker)) << "the sleep that found it did not read it";

  n = begin_sleep_on(&socket, &wait);
  ASSERT_GT(n, 0) << n;
  ASSERT_EQ(eventfd_write(waker, 1), 0);
  gs_wait_end(&socket, 1);
  EXPECT_FALSE(readable(waker)) << "gs_wait_end left a wake-up";
}

namespace {

// Begins a sleep, looking again while news makes it refuse (as a wait does):
// the count of fds to sleep on, or a negative status.
int begin_sleep(gs_ready_set_t *set, std::vector<pollfd> *wait) {
  int n = -EAGAIN;
  for (int tries = 0; tries < 100 && n == -EAGAIN; ++tries) {
    n = gs_ready_set_wait_begin(set, wait->data(), wait->size());
    if (n == -EAGAIN) ready_fds(set, POLLIN, 0);
  }
  return n;
}

bool on_shm() {
  const char *t = getenv("GPUSOCK_TRANSPORT");
  return t != nullptr && std::string(t) == "fabric:shm";
}

bool tcp_cqs_shared() {
  const char *t = getenv("GPUSOCK_TRANSPORT");
  const char *share = getenv("GPUSOCK_TCP_CQ_SHARE");
  return t != nullptr && std::string(t) == "fabric:tcp" && share != nullptr && std::atoi(share) > 1;
}

}  // namespace

// A sleep over idle members: where the transport gives sleep groups
// (fabric:shm) one fd stands for them all; fabric:tcp members that share a
// completion queue (GPUSOCK_TCP_CQ_SHARE) share its fd; elsewhere each
// member's is armed.
TEST(ReadySet, SleepOverIdleMembersArmsOneFdForAllWithGroups) {
  Pairs p(kPairs);
  ASSERT_TRUE(p.ok(kPairs)) << gs_last_error();
  gs_ready_set_t *set = gs_ready_set_create();
  for (int fd : p.servers) ASSERT_EQ(gs_ready_set_ctl(set, EPOLL_CTL_ADD, fd, POLLIN), 0);
  EXPECT_TRUE(ready_fds(set, POLLIN, 0).empty());
  std::vector<pollfd> wait(kPairs + 8);
  const int n = begin_sleep(set, &wait);
  ASSERT_GE(n, 0) << n;
  if (on_shm()) EXPECT_LE(n, 2) << "the thread's waker and the group's bell";
  else if (tcp_cqs_shared()) EXPECT_LT(n, kPairs) << "members that share a completion queue share its fd";
  else EXPECT_GE(n, kPairs);
  gs_ready_set_wait_end(set);
  gs_ready_set_destroy(set);
}

// A member added by another thread while the set sleeps ends the sleep, as
// epoll_ctl does for a thread in epoll_wait.
TEST(ReadySet, SleepEndsWhenAnotherThreadAddsAReadyMember) {
  Pairs p(8);
  ASSERT_TRUE(p.ok(8)) << gs_last_error();
  gs_ready_set_t *set = gs_ready_set_create();
  for (int i = 0; i < 7; ++i)
    ASSERT_EQ(gs_ready_set_ctl(set, EPOLL_CTL_ADD, p.servers[static_cast<size_t>(i)], POLLIN), 0);
  EXPECT_TRUE(ready_fds(set, POLLIN, 0).empty());
  ASSERT_TRUE(send_all(p.clients[7], "q", 1));
  std::vector<pollfd> wait(32);
  const int n = begin_sleep(set, &wait);
  ASSERT_GT(n, 0) << n;
  std::thread adder([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gs_ready_set_ctl(set, EPOLL_CTL_ADD, p.servers[7], POLLIN);
  });
  const int woke = ::poll(wait.data(), static_cast<nfds_t>(n), 10000);
  gs_ready_set_wait_end(set);
  adder.join();
  EXPECT_GT(woke, 0) << "the sleep ended only at its timeout";
  EXPECT_EQ(ready_fds(set, POLLIN, 1), std::set<int>{p.servers[7]});
  gs_ready_set_destroy(set);
}

// One member in two sets (an fd in two epoll sets), each slept on by its own
// thread: news for it wakes both.
TEST(ReadySet, TwoSetsSleepingOnOneMemberBothWake) {
  Pairs p(4);
  ASSERT_TRUE(p.ok(4)) << gs_last_error();
  gs_ready_set_t *sets[2] = {gs_ready_set_create(), gs_ready_set_create()};
  for (int fd : p.servers) ASSERT_EQ(gs_ready_set_ctl(sets[0], EPOLL_CTL_ADD, fd, POLLIN), 0);
  ASSERT_EQ(gs_ready_set_ctl(sets[1], EPOLL_CTL_ADD, p.servers[0], POLLIN), 0);
  ASSERT_EQ(gs_ready_set_ctl(sets[1], EPOLL_CTL_ADD, p.servers[1], POLLIN), 0);
  std::atomic<int> asleep{0};
  int woke[2] = {-1, -1};
  std::vector<std::thread> sleepers;
  for (int k = 0; k < 2; ++k)
    sleepers.emplace_back([&, k] {
      EXPECT_TRUE(ready_fds(sets[k], POLLIN, 0).empty());
      std::vector<pollfd> wait(16);
      const int n = begin_sleep(sets[k], &wait);
      ++asleep;
      if (n > 0) woke[k] = ::poll(wait.data(), static_cast<nfds_t>(n), 10000);
      gs_ready_set_wait_end(sets[k]);
    });
  while (asleep.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(send_all(p.clients[0], "w", 1));
  for (auto &t : sleepers) t.join();
  EXPECT_GT(woke[0], 0);
  EXPECT_GT(woke[1], 0);
  for (gs_ready_set_t *set : sets) {
    EXPECT_EQ(ready_fds(set, POLLIN, 1), std::set<int>{p.servers[0]});
    gs_ready_set_destroy(set);
  }
}

// The peer's process killed while the set sleeps: the sleep ends and the
// member reports it (fabric:shm's watchdog, the kernel's reset on tcp). A
// sleep that ends for other news (the accepted connection's own progress,
// done by a background thread) is slept again, so that the last sleep is
// one that only the death can end.
TEST(ReadySet, SleepEndsWhenThePeerProcessDies) {
  const sockaddr_in a = test_address(free_port());
  const int listener = listen_on(a, 4);
  ASSERT_GE(listener, 0) << gs_last_error();
  PeerProcess peer(GS_TEST_PEER, {"hold", std::to_string(ntohs(a.sin_port))});
  const int s = gs_accept(listener, nullptr, nullptr);
  ASSERT_GE(s, 0) << gs_last_error();
  gs_ready_set_t *set = gs_ready_set_create();
  ASSERT_EQ(gs_ready_set_ctl(set, EPOLL_CTL_ADD, s, POLLIN), 0);
  EXPECT_TRUE(ready_fds(set, POLLIN, 0).empty());
  std::vector<pollfd> wait(16);
  int n = begin_sleep(set, &wait);
  ASSERT_GT(n, 0) << n;
  kill(peer.pid(), SIGKILL);
  const short gone = POLLIN | POLLHUP | POLLERR;
  for (int round = 0; round < 20; ++round) {
    const int woke = ::poll(wait.data(), static_cast<nfds_t>(n), 10000);
    gs_ready_set_wait_end(set);
    ASSERT_GT(woke, 0) << "the sleep ended only at its timeout (round " << round << ")";
    if (ready_fds(set, gone, 1, 64, std::chrono::milliseconds(0)).count(s) != 0) break;
    n = begin_sleep(set, &wait);
    if (n <= 0) break;  // news at every try: the look below finds it
  }
  EXPECT_EQ(ready_fds(set, gone, 1), std::set<int>{s});
  gs_ready_set_destroy(set);
  gs_close(s);
  gs_close(listener);
}
