// What both CPU test peers (wire/socket/tests/test_peer.cc and
// gpu/tests/gpu_test_peer.cc, separate processes on gs_*) do alike: a
// poll-driven echo server, a sink that replies "<bytes> <fnv64>", a blaster,
// and how they stop and fail. Exit codes: 2 no listener, 3 accept failed,
// 4 receive failed.
#pragma once

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cinttypes>
#include <map>
#include <string>
#include <vector>

#include "test-support/checksum.h"
#include "test-support/gs_sockets.h"

namespace gpusock::test {

inline volatile sig_atomic_t g_peer_stop = 0;  // set by SIGTERM

// SIGTERM asks the peer to stop; a write to a closed connection is an error
// return, not a signal.
inline void peer_signals() {
  signal(SIGTERM, [](int) { g_peer_stop = 1; });
  signal(SIGPIPE, SIG_IGN);
}

[[noreturn]] inline void die(int code, const char *what, long rc) {
  std::fprintf(stderr, "%s: %s: %s (%s)\n", program_invocation_short_name, what, gs_status_name(static_cast<int>(rc)),
               gs_last_error());
  std::exit(code);
}

inline int listen_or_die(const sockaddr_in &at, int type_flags, int backlog = 256) {
  const char *call = "";
  const int fd = listen_on(at, backlog, type_flags, &call);
  if (fd < 0) die(2, call, fd);
  return fd;
}

// What the echo server does when a client half-closes with echo still queued.
enum class EchoOnClose {
  kFinishEcho,  // send the rest (waiting for room), then SHUT_WR and close
  kAtOnce,      // SHUT_WR and close now; the rest is dropped
};

// Waits for the parent's "go on": a byte (or EOF) on standard input.
inline void wait_for_go() {
  char go;
  while (read(STDIN_FILENO, &go, 1) < 0 && errno == EINTR) {}
}

// Echoes every client until SIGTERM. Gated: listens with a backlog of 1024,
// says "listening" on stdout and accepts nothing until a byte (or EOF) on
// stdin, so that clients pile up first.
inline int echo_server(const sockaddr_in &at, EchoOnClose on_close, bool gated = false) {
  const int lfd = listen_or_die(at, SOCK_NONBLOCK, gated ? 1024 : 256);
  if (gated) {
    std::printf("listening\n");
    std::fflush(stdout);
    wait_for_go();
  }
  std::map<int, std::string> pending;  // fd -> bytes not yet echoed
  std::vector<char> buf(1 << 16);
  while (!g_peer_stop) {
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
      if (!closed) continue;
      while (on_close == EchoOnClose::kFinishEcho && !out.empty()) {
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
  for (auto &[fd, out] : pending) gs_close(fd);
  gs_close(lfd);
  return 0;
}

// A sink's reply for `bytes` bytes whose FNV-1a 64 is `fnv`: "<bytes> <fnv64>".
inline std::string sink_reply(uint64_t bytes, uint64_t fnv) {
  char reply[64];
  std::snprintf(reply, sizeof reply, "%" PRIu64 " %016" PRIx64, bytes, fnv);
  return reply;
}

// What a sink replies, read to its EOF (at most 63 bytes): after SHUT_WR.
inline std::string read_sink_reply(int fd) {
  char reply[64] = {};
  size_t got = 0;
  for (ssize_t k; got < sizeof reply - 1 && (k = gs_recv(fd, reply + got, sizeof reply - 1 - got, 0)) > 0;)
    got += static_cast<size_t>(k);
  return reply;
}

// How a sink reads: sleeping delay_us after every read of at most 4 KiB (if
// delay_us > 0); reading nothing for stall_ms after the accept (if > 0), or
// until the parent says go on stdin (if gated).
struct SinkPace {
  int delay_us = 0;
  int stall_ms = 0;
  bool gated = false;
};

// Accepts `count` connections one after the other; reads each to EOF at
// `pace`, replies "<bytes> <fnv64>", half-closes and waits for the client's close.
inline int sink_server(const sockaddr_in &at, int count, SinkPace pace = {}) {
  const int lfd = listen_or_die(at, 0);
  std::vector<uint8_t> buf(pace.delay_us > 0 ? 4096 : (1 << 20));
  for (int i = 0; i < count; ++i) {
    const int c = gs_accept(lfd, nullptr, nullptr);
    if (c < 0) die(3, "accept", c);
    if (pace.stall_ms > 0) usleep(static_cast<useconds_t>(pace.stall_ms) * 1000);
    if (pace.gated) wait_for_go();
    uint64_t bytes = 0;
    Fnv1a sum;
    for (;;) {
      const ssize_t n = gs_recv(c, buf.data(), buf.size(), 0);
      if (n < 0) die(4, "sink recv", n);
      if (n == 0) break;
      sum.add(buf.data(), static_cast<size_t>(n));
      bytes += static_cast<uint64_t>(n);
      if (pace.delay_us > 0) usleep(static_cast<useconds_t>(pace.delay_us));
    }
    const std::string reply = sink_reply(bytes, sum.h);
    send_all(c, reply.data(), reply.size());
    gs_shutdown(c, SHUT_WR);
    char tmp[16];
    while (gs_recv(c, tmp, sizeof tmp, 0) > 0) {}
    gs_close(c);
  }
  gs_close(lfd);
  return 0;
}

// Listens with `backlog` and accepts nothing until SIGTERM.
inline int idle_listener(const sockaddr_in &at, int backlog) {
  const char *call = "";
  const int lfd = listen_on(at, backlog, 0, &call);
  if (lfd < 0) die(2, call, lfd);
  std::printf("listening\n");
  std::fflush(stdout);
  while (!g_peer_stop) usleep(10000);
  gs_close(lfd);
  return 0;
}

// Sends until the connection breaks (the test kills this process or the other end).
inline int blast(int fd) {
  std::vector<uint8_t> buf(1 << 16, 0x5A);
  while (gs_send(fd, buf.data(), buf.size(), 0) > 0) {}
  return 0;
}

}  // namespace gpusock::test
