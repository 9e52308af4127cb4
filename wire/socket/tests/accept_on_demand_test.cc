// GS_ACCEPT_ON_DEMAND: a listener that takes connection requests off the
// transport only while its process accepts or waits on it, and one at a time,
// so that a forked server's processes share the kernel's queue as with kernel
// TCP (the shim sets it on every listener; docs/preload.md).
#include "test-support/gs_sockets.h"

#include <gpusock/socket.h>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace {

using namespace gpusock::test;  // free_port, recv_all, test_address

// A listener on a free port with GS_ACCEPT_ON_DEMAND `on` (backlog 8); -1
// if a step fails.
int on_demand_listener(int on, sockaddr_in *a) {
  const int lfd = gs_socket(AF_INET, SOCK_STREAM, 0);
  if (lfd < 0) return lfd;
  *a = test_address(free_port());
  if (gs_setsockopt(lfd, SOL_GPUSOCK, GS_ACCEPT_ON_DEMAND, &on, sizeof on) != 0 ||
      gs_bind(lfd, reinterpret_cast<sockaddr *>(a), sizeof *a) != 0 || gs_listen(lfd, 8) != 0) {
    gs_close(lfd);
    return -1;
  }
  return lfd;
}

}  // namespace

// A listener with GS_ACCEPT_ON_DEMAND leaves connection requests in the
// transport until the application accepts (or polls the listener); by default
// the handshake completes in the background, as a kernel's TCP does. The
// client is another process: a connect under way in the listener's own
// process lets the listener take requests (it may be a connect to itself).
TEST(SocketServer, AcceptOnDemandLeavesRequestsUntilAsked) {
  for (const int on_demand : {0, 1}) {
    SCOPED_TRACE(on_demand ? "on demand" : "default");
    sockaddr_in a{};
    const int lfd = on_demand_listener(on_demand, &a);
    ASSERT_GE(lfd, 0) << gs_last_error();
    int v = -1;
    socklen_t len = sizeof v;
    ASSERT_EQ(gs_getsockopt(lfd, SOL_GPUSOCK, GS_ACCEPT_ON_DEMAND, &v, &len), 0);
    EXPECT_EQ(v, on_demand);

    int said[2], go[2];
    ASSERT_EQ(pipe(said), 0);
    ASSERT_EQ(pipe(go), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {  // the client: was it connected before the server accepted?
      const int c = gs_socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      const int rc = gs_connect(c, reinterpret_cast<sockaddr *>(&a), sizeof a);
      pollfd p{c, POLLOUT, 0};
      const char early =
          (rc == 0 || rc == -EINPROGRESS) ? static_cast<char>('0' + gs_poll(&p, 1, on_demand ? 300 : 10000)) : 'e';
      char x;
      if (write(said[1], &early, 1) != 1 || read(go[0], &x, 1) != 1) _exit(2);
      if (gs_poll(&p, 1, 10000) != 1 || gs_fcntl(c, F_SETFL, 0) != 0 || gs_send(c, "hi", 2, 0) != 2) _exit(3);
      char back = 0;
      _exit(recv_all(c, reinterpret_cast<uint8_t *>(&back), 1) && back == 'k' ? 0 : 4);  // the server's answer
    }
    char early = '?';
    ASSERT_EQ(read(said[0], &early, 1), 1);
    EXPECT_EQ(early, on_demand ? '0' : '1') << "connected before any accept";
    ASSERT_EQ(write(go[1], "g", 1), 1);
    const int s = gs_accept(lfd, nullptr, nullptr);
    ASSERT_GE(s, 0) << gs_status_name(s);
    uint8_t got[2];
    ASSERT_TRUE(recv_all(s, got, 2));
    EXPECT_EQ(std::memcmp(got, "hi", 2), 0);
    ASSERT_EQ(gs_send(s, "k", 1, 0), 1);
    int status = -1;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    gs_close(s);
    for (int fd : {said[0], said[1], go[0], go[1]}) close(fd);
    gs_close(lfd);
  }
}

// In the listener's own process a connect under way lets an accept-on-demand
// listener take requests: a program may connect to itself before it accepts.
TEST(SocketServer, AcceptOnDemandStillServesItsOwnProcess) {
  sockaddr_in a{};
  const int lfd = on_demand_listener(1, &a);
  ASSERT_GE(lfd, 0) << gs_last_error();
  const int c = gs_socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(c, 0);
  ASSERT_EQ(gs_connect(c, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);  // blocking, before any accept
  const int s = gs_accept(lfd, nullptr, nullptr);
  ASSERT_GE(s, 0) << gs_status_name(s);
  ASSERT_EQ(gs_send(c, "hi", 2, 0), 2);
  uint8_t got[2];
  ASSERT_TRUE(recv_all(s, got, 2));
  EXPECT_EQ(std::memcmp(got, "hi", 2), 0);
  gs_close(c);
  gs_close(s);
  gs_close(lfd);
}

// On demand, an accept takes one request, not every request waiting: one it
// took would be this process's alone, and reset if the process exited before
// accepting it (a prefork worker that serves one connection and exits), where
// kernel TCP leaves it in the shared queue. The clients are another process.
TEST(SocketServer, AcceptOnDemandTakesOneRequestPerAccept) {
  sockaddr_in a{};
  const int lfd = on_demand_listener(1, &a);
  ASSERT_GE(lfd, 0) << gs_last_error();
  constexpr int kClients = 3;
  int said[2], go[2];
  ASSERT_EQ(pipe(said), 0);
  ASSERT_EQ(pipe(go), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // kClients connects; after the server's first accept, how many are connected?
    int c[kClients];
    pollfd p[kClients];
    for (int i = 0; i < kClients; ++i) {
      c[i] = gs_socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      const int rc = gs_connect(c[i], reinterpret_cast<sockaddr *>(&a), sizeof a);
      if (rc != 0 && rc != -EINPROGRESS) _exit(2);
      p[i] = {c[i], POLLOUT, 0};
    }
    char x;
    if (write(said[1], "c", 1) != 1 || read(go[0], &x, 1) != 1) _exit(3);  // the server accepted one
    usleep(300000);
    char connected = static_cast<char>('0' + gs_poll(p, kClients, 0));
    if (write(said[1], &connected, 1) != 1 || read(go[0], &x, 1) != 1) _exit(4);  // it accepted the rest
    for (int i = 0; i < kClients; ++i) {
      pollfd one{c[i], POLLOUT, 0};
      if (gs_poll(&one, 1, 10000) != 1 || gs_fcntl(c[i], F_SETFL, 0) != 0 || gs_send(c[i], "hi", 2, 0) != 2) _exit(5);
      char back = 0;
      if (!recv_all(c[i], &back, 1) || back != 'k') _exit(6);
    }
    _exit(0);
  }
  char x;
  ASSERT_EQ(read(said[0], &x, 1), 1);
  usleep(300000);  // every request is in the transport's queue before the accept
  int s[kClients];
  s[0] = gs_accept(lfd, nullptr, nullptr);
  ASSERT_GE(s[0], 0) << gs_status_name(s[0]);
  ASSERT_EQ(write(go[1], "g", 1), 1);
  char connected = '?';
  ASSERT_EQ(read(said[0], &connected, 1), 1);
  EXPECT_EQ(connected, '1') << "clients connected after one accept";
  ASSERT_EQ(write(go[1], "g", 1), 1);
  for (int i = 1; i < kClients; ++i) {
    s[i] = gs_accept(lfd, nullptr, nullptr);
    ASSERT_GE(s[i], 0) << gs_status_name(s[i]);
  }
  for (int i = 0; i < kClients; ++i) {
    uint8_t got[2];
    ASSERT_TRUE(recv_all(s[i], got, 2));
    EXPECT_EQ(std::memcmp(got, "hi", 2), 0);
    ASSERT_EQ(gs_send(s[i], "k", 1, 0), 1);
  }
  int status = -1;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (int fd : s) gs_close(fd);
  for (int fd : {said[0], said[1], go[0], go[1]}) close(fd);
  gs_close(lfd);
}

// A client that gives up on a connect the listener has not read yet (it
// closes the socket and lives on) must not hurt the listener: over fabric:shm
// its endpoint stays open until the listener has read its introduction (shm
// 1.17 crashed the listener's process when it read that of an endpoint already
// closed). The listener then serves the next client.
TEST(SocketServer, AcceptOnDemandSurvivesClientsThatGaveUp) {
  sockaddr_in a{};
  const int lfd = on_demand_listener(1, &a);
  ASSERT_GE(lfd, 0) << gs_last_error();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (int i = 0; i < 3; ++i) {
      const int c = gs_socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      const int rc = gs_connect(c, reinterpret_cast<sockaddr *>(&a), sizeof a);
      if (rc != 0 && rc != -EINPROGRESS) _exit(2);
      usleep(20000);
      gs_close(c);  // unanswered: the listener's process does not accept yet
    }
    usleep(600000);  // alive while the listener reads what they left
    _exit(0);
  }
  usleep(300000);
  pollfd p{lfd, POLLIN, 0};
  EXPECT_GE(gs_poll(&p, 1, 200), 0);
  const int c = gs_socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(gs_connect(c, reinterpret_cast<sockaddr *>(&a), sizeof a), 0) << gs_last_error();
  ASSERT_EQ(gs_send(c, "hi", 2, 0), 2);
  bool served = false;
  for (int tries = 0; tries < 4 && !served; ++tries) {  // over tcp a given-up one may come first, dead
    const int s = gs_accept(lfd, nullptr, nullptr);
    ASSERT_GE(s, 0) << gs_status_name(s);
    uint8_t got[2] = {};
    served = recv_all(s, got, 2) && std::memcmp(got, "hi", 2) == 0;
    gs_close(s);
  }
  EXPECT_TRUE(served);
  int status = -1;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  gs_close(c);
  gs_close(lfd);
}
