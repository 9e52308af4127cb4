// A real peer process for the socket end-to-end tests: the tests spawn it with
// posix_spawn, so each side of a connection is a separate process with its own
// transport state. Modes:
//   echo  PORT          poll-driven, non-blocking echo server for many clients
//   sink  PORT          accept one connection, read to EOF, reply "<bytes> <fnv64>"
//   blast HOST PORT     connect and send a pattern until killed
#include <gpusock/socket.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

volatile sig_atomic_t g_stop = 0;

sockaddr_in loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  // verbs cannot use loopback (rdma_cm has no device there): tests in the
  // Soft-RoCE guest set GPUSOCK_TEST_ADDR to the guest NIC's address.
  const char *addr = std::getenv("GPUSOCK_TEST_ADDR");
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (addr && *addr) inet_pton(AF_INET, addr, &a.sin_addr);
  return a;
}

int listen_on(int port, int flags) {
  int fd = gs_socket(AF_INET, SOCK_STREAM | flags, 0);
  if (fd < 0) {
    std::fprintf(stderr, "socket: %s (%s)\n", gs_status_name(fd), gs_last_error());
    std::exit(2);
  }
  int one = 1;
  gs_setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a = loopback(port);
  if (gs_bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) < 0 || gs_listen(fd, 256) < 0) {
    std::fprintf(stderr, "bind/listen %d: %s (%s)\n", port, gs_status_name(-errno), gs_last_error());
    std::exit(2);
  }
  return fd;
}

int echo_server(int port) {
  const int lfd = listen_on(port, SOCK_NONBLOCK);
  std::map<int, std::string> pending;  // fd → bytes not yet echoed
  std::vector<char> buf(1 << 16);
  while (!g_stop) {
    std::vector<pollfd> fds{{lfd, POLLIN, 0}};
    for (auto &[fd, out] : pending)
      fds.push_back({fd, static_cast<short>((out.size() < (4u << 20) ? POLLIN : 0) | (out.empty() ? 0 : POLLOUT)), 0});
    if (gs_poll(fds.data(), fds.size(), 100) < 0) continue;
    for (const pollfd &p : fds) {
      if (!p.revents) continue;
      if (p.fd == lfd) {
        int c;
        while ((c = gs_accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK)) >= 0) pending[c];
        continue;
      }
      std::string &out = pending[p.fd];
      bool closed = false;
      if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
        ssize_t n = gs_recv(p.fd, buf.data(), buf.size(), 0);
        if (n > 0) out.append(buf.data(), static_cast<size_t>(n));
        else if (n == 0 || n != -EAGAIN) closed = true;
      }
      while (!out.empty()) {
        ssize_t n = gs_send(p.fd, out.data(), out.size(), 0);
        if (n <= 0) break;
        out.erase(0, static_cast<size_t>(n));
      }
      if (closed) {
        // Peer half-closed: finish echoing, then half-close our side too.
        while (!out.empty()) {
          ssize_t n = gs_send(p.fd, out.data(), out.size(), 0);
          if (n == -EAGAIN) {
            pollfd w{p.fd, POLLOUT, 0};
            gs_poll(&w, 1, 100);
            continue;
          }
          if (n <= 0) break;
          out.erase(0, static_cast<size_t>(n));
        }
        gs_shutdown(p.fd, SHUT_WR);
        gs_close(p.fd);
        pending.erase(p.fd);
      }
    }
  }
  for (auto &[fd, out] : pending) gs_close(fd);
  gs_close(lfd);
  return 0;
}

int sink_server(int port) {
  const int lfd = listen_on(port, 0);
  const int c = gs_accept(lfd, nullptr, nullptr);
  if (c < 0) return 3;
  std::vector<uint8_t> buf(1 << 20);
  uint64_t bytes = 0, hash = 1469598103934665603ull;
  for (;;) {
    ssize_t n = gs_recv(c, buf.data(), buf.size(), 0);
    if (n < 0) {
      std::fprintf(stderr, "sink recv: %s\n", gs_status_name(static_cast<int>(n)));
      return 4;
    }
    if (n == 0) break;
    for (ssize_t i = 0; i < n; ++i) hash = (hash ^ buf[static_cast<size_t>(i)]) * 1099511628211ull;
    bytes += static_cast<uint64_t>(n);
  }
  char reply[64];
  const int len = std::snprintf(reply, sizeof reply, "%" PRIu64 " %016" PRIx64, bytes, hash);
  gs_send(c, reply, static_cast<size_t>(len), 0);
  gs_shutdown(c, SHUT_WR);
  char tmp[16];
  while (gs_recv(c, tmp, sizeof tmp, 0) > 0) {
  }
  gs_close(c);
  gs_close(lfd);
  return 0;
}

int blast_client(int port) {
  sockaddr_in a = loopback(port);
  int fd = -1;
  for (int tries = 0; tries < 500; ++tries) {
    fd = gs_socket(AF_INET, SOCK_STREAM, 0);
    if (gs_connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0) break;
    gs_close(fd);
    fd = -1;
    usleep(10000);
  }
  if (fd < 0) return 5;
  std::vector<uint8_t> buf(1 << 16, 0x5A);
  while (gs_send(fd, buf.data(), buf.size(), 0) > 0) {
  }
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  signal(SIGTERM, [](int) { g_stop = 1; });
  signal(SIGPIPE, SIG_IGN);
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s echo|sink|blast PORT\n", argv[0]);
    return 1;
  }
  const std::string mode = argv[1];
  const int port = std::atoi(argv[2]);
  if (mode == "echo") return echo_server(port);
  if (mode == "sink") return sink_server(port);
  if (mode == "blast") return blast_client(port);
  return 1;
}
