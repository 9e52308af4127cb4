// What the two processes of a bench_sockets run do, written once over a
// socket API (test-support: GsSockets for gpusock, KernelSockets for the
// kernel's TCP) so that gpusock and its baseline run the same code.
//
// Measures (RoleOptions::measure):
//   rtt        one connection, blocking 64 B round trips; the client times each
//   wake       the server's thread blocks in recv; the client sends 64 B after a
//              random 1-5 ms, stamped with CLOCK_MONOTONIC just before send;
//              the server times the return from recv against that stamp
//   conns      N connections; one thread with poll over all of them on each
//              side; closed-loop 64 B round trips, one in flight per connection,
//              reported per window (`windows` of `seconds` each after a
//              warm-up: set-up is paid once, the windows are the repetitions)
//   idle-poll  N idle connections; the server's one thread blocks in poll over
//              the listener, the connections and its stdin
//   idle-recv  the same, but a thread blocks in recv on one connection
//
// Protocol with the parent (bench_sockets.cc), one line each on stdout:
// "listening" (server), "ready" (idle: all N connections accepted/connected),
// "result KEY VALUE ..." (figures; microseconds unless the key says), or
// "error TEXT". Closing a role's stdin stops it.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "test-support/sockets.h"
#include "test-support/timing.h"

namespace gpusock::bench {

using namespace gpusock::test;  // loopback, listen_on, connect_retry, send_all, recv_all, Stopwatch

constexpr size_t kMessageBytes = 64;
constexpr int kWakeWarmup = 5;  // wake samples dropped at the start

struct RoleOptions {
  std::string measure;
  int port = 0;
  int conns = 1;
  double seconds = 1;  // rtt, conns: measured time (conns: per window)
  int windows = 1;     // conns
  int samples = 200;   // wake
};

struct Summary {
  double p50 = 0, p99 = 0, mean = 0, max = 0;
  size_t count = 0;
};

inline Summary summarize(std::vector<double> v) {  // a copy: sorted here
  Summary s;
  s.count = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))]; };
  s.p50 = at(0.5);
  s.p99 = at(0.99);
  s.max = v.back();
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  return s;
}

inline void print_summary(const Summary &s, const char *extra = "") {
  std::printf("result p50_us %.3f p99_us %.3f mean_us %.3f max_us %.3f samples %zu%s\n", s.p50, s.p99, s.mean, s.max,
              s.count, extra);
  std::fflush(stdout);
}

inline uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

inline void say(const char *line) {
  std::printf("%s\n", line);
  std::fflush(stdout);
}

template <class Api>
[[noreturn]] void fail(const char *what, long rc) {
  std::printf("error %s: %s %s\n", what, std::strerror(static_cast<int>(-rc)), Api::last_error());
  std::fflush(stdout);
  std::exit(1);
}

// Blocks until the parent closes our stdin.
inline void wait_for_stdin_eof() {
  char c;
  for (;;) {
    const ssize_t n = ::read(STDIN_FILENO, &c, 1);
    if (n == 0 || (n < 0 && errno != EINTR)) return;
  }
}

template <class Api>
void set_nodelay(int fd) {
  int one = 1;
  (void)Api::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // ignored where there is no Nagle
}

template <class Api>
std::vector<int> connect_all(const RoleOptions &o) {
  std::vector<int> fds;
  for (int i = 0; i < o.conns; ++i) {
    const char *call = "connect";
    const int fd = connect_retry<Api>(loopback(o.port), RetryPolicy{.seconds = 30}, &call);
    if (fd < 0) fail<Api>(call, fd);
    set_nodelay<Api>(fd);
    fds.push_back(fd);
  }
  return fds;
}

template <class Api>
int accept_one(int lfd) {
  const int fd = Api::accept(lfd);
  if (fd < 0) fail<Api>("accept", fd);
  set_nodelay<Api>(fd);
  return fd;
}

// ---------------------------------------------------------------------------
// Servers

// rtt: echoes one connection with blocking calls until it closes.
template <class Api>
int serve_echo(int lfd) {
  const int c = accept_one<Api>(lfd);
  std::vector<char> buf(1 << 16);
  ssize_t n;
  while ((n = Api::recv(c, buf.data(), buf.size())) > 0)
    if (!send_all<Api>(c, buf.data(), static_cast<size_t>(n))) break;
  Api::close(c);
  return 0;
}

// wake: times each message from the sender's stamp to the return from recv,
// acknowledges it with one byte, and reports when the sender closes.
template <class Api>
int serve_wake(int lfd) {
  const int c = accept_one<Api>(lfd);
  std::vector<double> us;
  char msg[kMessageBytes];
  for (;;) {
    const ssize_t n = Api::recv(c, msg, sizeof msg);
    const uint64_t arrived = monotonic_ns();
    if (n <= 0) break;
    if (static_cast<size_t>(n) < sizeof msg && !recv_all<Api>(c, msg + n, sizeof msg - static_cast<size_t>(n))) break;
    uint64_t sent;
    std::memcpy(&sent, msg, sizeof sent);
    us.push_back(static_cast<double>(arrived - sent) / 1e3);
    if (!send_all<Api>(c, "a", 1)) break;
  }
  Api::close(c);
  if (us.size() > kWakeWarmup) us.erase(us.begin(), us.begin() + kWakeWarmup);
  print_summary(summarize(us));
  return 0;
}

// conns and idle-poll: one thread, poll over stdin, the listener and every
// connection, echoing; says "ready" once `conns` connections are accepted and
// stops when stdin closes.
template <class Api>
int serve_poll(int lfd, const RoleOptions &o) {
  std::vector<pollfd> fds{{STDIN_FILENO, POLLIN, 0}, {lfd, POLLIN, 0}};
  std::vector<std::string> out(2);  // bytes not yet echoed, parallel to fds
  std::vector<char> buf(1 << 16);
  int accepted = 0;
  for (;;) {
    const int ready = Api::poll(fds.data(), fds.size(), -1);
    if (ready == -EINTR) continue;
    if (ready < 0) fail<Api>("poll", ready);
    if (fds[0].revents) break;
    if (fds[1].revents) {
      int c;
      while ((c = Api::accept(lfd)) >= 0) {
        Api::set_nonblock(c);
        set_nodelay<Api>(c);
        fds.push_back({c, POLLIN, 0});
        out.emplace_back();
        if (++accepted == o.conns) say("ready");
      }
      if (c != -EAGAIN && c != -EWOULDBLOCK) fail<Api>("accept", c);
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      bool closed = false;
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        const ssize_t n = Api::recv(fds[i].fd, buf.data(), buf.size());
        if (n > 0) out[i].append(buf.data(), static_cast<size_t>(n));
        else closed = n == 0 || n != -EAGAIN;
      }
      while (!closed && !out[i].empty()) {
        const ssize_t n = Api::send(fds[i].fd, out[i].data(), out[i].size());
        if (n == -EAGAIN) break;
        if (n <= 0) closed = true;
        else out[i].erase(0, static_cast<size_t>(n));
      }
      if (closed) {
        Api::close(fds[i].fd);
        fds[i] = fds.back();
        out[i] = std::move(out.back());
        fds.pop_back();
        out.pop_back();
        --i;
        continue;
      }
      fds[i].events = static_cast<short>(POLLIN | (out[i].empty() ? 0 : POLLOUT));
    }
  }
  for (size_t i = 2; i < fds.size(); ++i) Api::close(fds[i].fd);
  return 0;
}

// idle-recv: accepts `conns` connections, then one thread blocks in recv on
// the first while the main thread waits for stdin to close.
template <class Api>
int serve_idle_recv(int lfd, const RoleOptions &o) {
  std::vector<int> conns;
  for (int i = 0; i < o.conns; ++i) conns.push_back(accept_one<Api>(lfd));
  std::atomic<bool> done{false};
  std::thread reader([&] {
    char b[kMessageBytes];
    (void)Api::recv(conns[0], b, sizeof b);
    done = true;
  });
  say("ready");
  wait_for_stdin_eof();
  Api::shutdown(conns[0], SHUT_RDWR);  // wakes the reader
  const Deadline deadline(5);
  while (!done && !deadline.passed()) usleep(1000);
  if (!done) std::_Exit(3);  // a reader that shutdown did not wake: the process must still end
  reader.join();
  for (int c : conns) Api::close(c);
  return 0;
}

template <class Api>
int serve(const RoleOptions &o) {
  const bool polled = o.measure == "conns" || o.measure == "idle-poll";
  const char *call = "listen";
  const int lfd = listen_on<Api>(loopback(o.port), 4096, polled ? SOCK_NONBLOCK : 0, &call);
  if (lfd < 0) fail<Api>(call, lfd);
  say("listening");
  int rc;
  if (o.measure == "rtt") rc = serve_echo<Api>(lfd);
  else if (o.measure == "wake") rc = serve_wake<Api>(lfd);
  else if (o.measure == "idle-recv") rc = serve_idle_recv<Api>(lfd, o);
  else rc = serve_poll<Api>(lfd, o);
  Api::close(lfd);
  return rc;
}

// ---------------------------------------------------------------------------
// Clients

template <class Api>
int client_rtt(const RoleOptions &o) {
  const int fd = connect_all<Api>(o)[0];
  char out[kMessageBytes], in[kMessageBytes];
  std::memset(out, 'x', sizeof out);
  std::vector<double> us;
  us.reserve(1 << 20);
  int err = 0;
  const Deadline warmup(std::min(0.2, o.seconds / 2));
  for (Stopwatch total; total.seconds() < o.seconds;) {
    const Stopwatch one;
    if (!send_all<Api>(fd, out, sizeof out, &err) || !recv_all<Api>(fd, in, sizeof in, &err))
      fail<Api>("round trip", err);
    if (warmup.passed()) us.push_back(one.ns() / 1e3);
  }
  Api::close(fd);
  print_summary(summarize(us));
  return 0;
}

template <class Api>
int client_wake(const RoleOptions &o) {
  const int fd = connect_all<Api>(o)[0];
  std::mt19937 rng(12345);
  std::uniform_int_distribution<long> delay_ns(1000000, 5000000);
  char msg[kMessageBytes], ack;
  std::memset(msg, 'w', sizeof msg);
  int err = 0;
  for (int i = 0; i < o.samples + kWakeWarmup; ++i) {
    const timespec pause{0, delay_ns(rng)};
    clock_nanosleep(CLOCK_MONOTONIC, 0, &pause, nullptr);
    const uint64_t now = monotonic_ns();
    std::memcpy(msg, &now, sizeof now);
    if (!send_all<Api>(fd, msg, sizeof msg, &err) || !recv_all<Api>(fd, &ack, 1, &err)) fail<Api>("wake", err);
  }
  Api::close(fd);
  say("result sent 1");
  return 0;
}

// Closed-loop 64 B round trips on every connection, one thread polling all.
template <class Api>
int client_conns(const RoleOptions &o) {
  std::vector<int> socks = connect_all<Api>(o);
  struct Flow {
    size_t sent = 0, got = 0;
    uint64_t start_ns = 0;
  };
  std::vector<pollfd> fds;
  for (int fd : socks) {
    Api::set_nonblock(fd);
    fds.push_back({fd, POLLIN, 0});
  }
  std::vector<Flow> flows(fds.size());
  char out[kMessageBytes], in[kMessageBytes];
  std::memset(out, 'c', sizeof out);
  auto push = [&](size_t i) {
    while (flows[i].sent < sizeof out) {
      const ssize_t n = Api::send(fds[i].fd, out + flows[i].sent, sizeof out - flows[i].sent);
      if (n == -EAGAIN) break;
      if (n <= 0) fail<Api>("send", n);
      flows[i].sent += static_cast<size_t>(n);
    }
    fds[i].events = static_cast<short>(POLLIN | (flows[i].sent < sizeof out ? POLLOUT : 0));
  };
  auto start = [&](size_t i) {
    flows[i] = Flow{0, 0, monotonic_ns()};
    push(i);
  };
  for (size_t i = 0; i < fds.size(); ++i) start(i);
  std::vector<double> us;
  const double warmup_s = std::min(0.5, o.seconds / 2);
  const Stopwatch clock;
  int window = -1;  // -1: warming up
  double window_start = 0;
  for (;;) {
    const double t = clock.seconds();
    if (window < 0 ? t >= warmup_s : t - window_start >= o.seconds) {
      if (window >= 0) {
        char extra[96];
        std::snprintf(extra, sizeof extra, " round_trips_per_s %.1f",
                      static_cast<double>(us.size()) / (t - window_start));
        print_summary(summarize(us), extra);
      }
      if (++window == o.windows) break;
      us.clear();
      window_start = t;
    }
    const int ready = Api::poll(fds.data(), fds.size(), 100);
    if (ready == -EINTR) continue;
    if (ready < 0) fail<Api>("poll", ready);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      if (fds[i].revents & POLLOUT) push(i);
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t n = Api::recv(fds[i].fd, in, sizeof in - flows[i].got);
      if (n == -EAGAIN) continue;
      if (n <= 0) fail<Api>("recv", n == 0 ? -ECONNRESET : n);
      flows[i].got += static_cast<size_t>(n);
      if (flows[i].got < sizeof in) continue;
      if (window >= 0) us.push_back(static_cast<double>(monotonic_ns() - flows[i].start_ns) / 1e3);
      start(i);
    }
  }
  for (int fd : socks) Api::close(fd);
  return 0;
}

// idle-*: holds `conns` connections without a word until stdin closes.
template <class Api>
int client_idle(const RoleOptions &o) {
  const std::vector<int> socks = connect_all<Api>(o);
  say("ready");
  wait_for_stdin_eof();
  for (int fd : socks) Api::close(fd);
  return 0;
}

template <class Api>
int client(const RoleOptions &o) {
  if (o.measure == "rtt") return client_rtt<Api>(o);
  if (o.measure == "wake") return client_wake<Api>(o);
  if (o.measure == "conns") return client_conns<Api>(o);
  return client_idle<Api>(o);
}

}  // namespace gpusock::bench
