// The interop matrix's transfer peer. One source, built twice:
//   gs_xfer_peer  on gpusock's CPU socket API (include/gpusock/socket.h)
//   rs_xfer_peer  on rdma-core's own rsocket API (librdmacm, unmodified, from
//                 Debian), with XFER_RSOCKET defined
// so every case runs with gpusock on one side and rdma-core's rsocket on the
// other, in both roles. Each case is a small, fully checked conversation:
//
//   size         client sends N bytes in one send(); server checks them, sends
//                N bytes of its own back; client checks them; client closes.
//   halfclose-c2s  client sends N, shutdown(SHUT_WR); server reads to EOF,
//                then still sends M; client reads M and EOF.
//   halfclose-s2c  the same with the roles swapped.
//   close-client client sends N and close()s at once; server gets all N, then
//                EOF, and its next sends fail (EPIPE/ECONNRESET), no hang.
//   close-server the same with the roles swapped.
//   blast / sink one side streams until the other ends; the runner SIGKILLs a
//                side and the survivor must see EOF or an error promptly.
//   pollhup      server sends N and closes; the client polls only after it all
//                arrived (reports revents), then must still read all N bytes.
//   seq          K connections one after another, each with a different size
//                that wraps the receive ring several times.
//   hold         (client) a long-lived echo conversation against a victim, kept
//                open while a hostile peer attacks the same process.
//   victim       (server) a poll-driven echo server that logs, per connection,
//                how it ended (errno, SO_ERROR, gs_last_error).
//
// Every byte is generated from a seed (common.h) and checked on receipt; FNV-1a
// sums of what was sent and received are printed so both logs can be compared.
// Output: one "OK ..." or "FAIL ..." line per conversation; exit status 0 only
// if all passed.
#include "interop-tests/common.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <map>

#ifdef XFER_RSOCKET
#include <rdma/rsocket.h>
#else
#include "test-support/gs_sockets.h"
#endif

using namespace interop;

// The socket API underneath (test-support/sockets.h): every call returns >= 0
// or a negated errno, whichever library it is.
#ifdef XFER_RSOCKET
struct RsSockets {
  static constexpr const char *kName = "rsocket";
  template <class T>
  static T st(T rc) {
    return rc < 0 ? static_cast<T>(-errno) : rc;
  }
  static int socket(int type_flags = 0) { return st(rsocket(AF_INET, SOCK_STREAM | type_flags, 0)); }
  static int bind(int fd, const sockaddr_in &a) { return st(rbind(fd, (const sockaddr *)&a, sizeof a)); }
  static int listen(int fd, int n) { return st(rlisten(fd, n)); }
  static int accept(int fd) { return st(raccept(fd, nullptr, nullptr)); }
  static int connect(int fd, const sockaddr_in &a) { return st(rconnect(fd, (const sockaddr *)&a, sizeof a)); }
  static ssize_t send(int fd, const void *b, size_t n) { return st(rsend(fd, b, n, 0)); }
  static ssize_t recv(int fd, void *b, size_t n) { return st(rrecv(fd, b, n, 0)); }
  static int shutdown(int fd, int how) { return st(rshutdown(fd, how)); }
  static int close(int fd) { return st(rclose(fd)); }
  static int poll(pollfd *p, nfds_t n, int t) { return st(rpoll(p, n, t)); }
  static int setsockopt(int fd, int l, int o, const void *v, socklen_t n) { return st(rsetsockopt(fd, l, o, v, n)); }
  static int getsockopt(int fd, int l, int o, void *v, socklen_t *n) { return st(rgetsockopt(fd, l, o, v, n)); }
  static int set_nonblock(int fd) { return st(rfcntl(fd, F_SETFL, O_NONBLOCK)); }
  static const char *last_error() { return ""; }
};
using api = RsSockets;
#else
using api = gpusock::test::GsSockets;
#endif

namespace {

struct Ctx {
  std::string role;  // server | client
  std::string kase;
  std::string addr;
  int port = 0;
  double t0 = now_s();
};

Ctx g;
int g_failures = 0;

// Where the conversation is, for the watchdog: if --deadline passes, SIGALRM
// prints this (async-signal-safe) and exits 3, so a hang says where it hung.
char g_stage[160] = "start";
volatile sig_atomic_t g_stage_len = 5;
void stage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void stage(const char *fmt, ...) {
  char tmp[sizeof g_stage];
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  g_stage_len = 0;
  std::memcpy(g_stage, tmp, sizeof g_stage);
  g_stage_len = std::min<int>(n, sizeof g_stage - 1);
}
void on_deadline(int) {
  char msg[320];
  int n = 0;
  auto put = [&](const char *t, int len) {
    for (int i = 0; i < len && n < static_cast<int>(sizeof msg) - 1; ++i) msg[n++] = t[i];
  };
  put("FAIL watchdog: deadline passed while: ", 38);
  put(g_stage, g_stage_len);
  put("\n", 1);
  (void)!write(1, msg, static_cast<size_t>(n));
  // Diagnosis for the log (not async-signal-safe, but we exit right after):
  // the RDMA queue pairs and connection ids of the guest, with their states.
  (void)!std::system(
      "echo '  diag: rdma -d res show qp / cm_id:'; rdma -d res show qp | sed 's/^/    /'; "
      "rdma res show cm_id | sed 's/^/    /'; printf '    rxe0 '; "
      "grep -H . /sys/class/infiniband/rxe0/ports/1/hw_counters/*retry* | sed 's|.*/||' | tr '\\n' ' '; echo");
  _exit(3);
}

void ok(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void ok(const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  std::printf("OK %s %s %s: %s (%.2fs)\n", api::kName, g.role.c_str(), g.kase.c_str(), msg, now_s() - g.t0);
  std::fflush(stdout);
}

void failf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void failf(const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *le = api::last_error();
  std::printf("FAIL %s %s %s: %s%s%s%s (%.2fs)\n", api::kName, g.role.c_str(), g.kase.c_str(), msg,
              *le ? " [last_error: " : "", le, *le ? "]" : "", now_s() - g.t0);
  std::fflush(stdout);
  ++g_failures;
}

int listen_on() {
  const char *call = "";
  const int fd = gpusock::test::listen_on<api>(make_addr(g.addr.c_str(), g.port), 16, 0, &call);
  if (fd < 0) {
    failf("%s %s:%d: %s", call, g.addr.c_str(), g.port, errname(fd));
    std::exit(1);
  }
  return fd;
}

// Connects, retrying while the server is not listening yet (ECONNREFUSED).
double g_connect_retry_s = 20;  // --retry SECONDS (0: a refused connect fails at once)

int connect_retry() {
  return gpusock::test::connect_retry<api>(make_addr(g.addr.c_str(), g.port),
                                           {.seconds = g_connect_retry_s, .pause_ms = 50});
}

// The connection of this case: accepted (server) or made (client).
int connected_socket(int *lfd) {
  if (g.role == "server") {
    *lfd = listen_on();
    const int fd = api::accept(*lfd);
    if (fd < 0) failf("accept: %s", errname(fd));
    return fd;
  }
  const int fd = connect_retry();
  if (fd < 0) failf("connect: %s", errname(fd));
  return fd;
}

// Sends n pattern bytes, handing the whole run to send() at once.
bool send_pattern(int fd, uint64_t seed, size_t n, Fnv1a *sum) {
  stage("%s: sending %zu bytes (seed %" PRIu64 ")", g.kase.c_str(), n, seed);
  std::vector<uint8_t> buf(n);
  PatternStream(seed).fill(buf.data(), n);
  if (sum) sum->add(buf.data(), n);
  size_t off = 0;
  while (off < n) {
    const ssize_t r = api::send(fd, buf.data() + off, n - off);
    if (r < 0) {
      failf("send at byte %zu of %zu: %s", off, n, errname(static_cast<int>(r)));
      return false;
    }
    off += static_cast<size_t>(r);
    stage("%s: sent %zu of %zu bytes (seed %" PRIu64 ")", g.kase.c_str(), off, n, seed);
  }
  return true;
}

// Receives exactly n bytes and checks them against the pattern.
bool recv_pattern(int fd, uint64_t seed, size_t n, Fnv1a *sum) {
  stage("%s: waiting for %zu bytes (seed %" PRIu64 ")", g.kase.c_str(), n, seed);
  std::vector<uint8_t> buf(std::min<size_t>(std::max<size_t>(n, 1), 16u << 20));
  PatternStream p(seed);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = api::recv(fd, buf.data(), std::min(buf.size(), n - got));
    if (r == 0) {
      failf("EOF after %zu of %zu bytes", got, n);
      return false;
    }
    if (r < 0) {
      failf("recv after %zu of %zu bytes: %s", got, n, errname(static_cast<int>(r)));
      return false;
    }
    const size_t bad = p.check(buf.data(), static_cast<size_t>(r));
    if (bad != static_cast<size_t>(r)) {
      failf("data mismatch at byte %zu of %zu", got + bad, n);
      return false;
    }
    if (sum) sum->add(buf.data(), static_cast<size_t>(r));
    got += static_cast<size_t>(r);
    stage("%s: received %zu of %zu bytes (seed %" PRIu64 ")", g.kase.c_str(), got, n, seed);
  }
  return true;
}

// Expects the stream to end (recv == 0) within timeout; twice, EOF is sticky.
bool expect_eof(int fd, const char *what) {
  stage("%s: waiting for EOF %s", g.kase.c_str(), what);
  uint8_t b[64];
  for (int i = 0; i < 2; ++i) {
    const ssize_t r = api::recv(fd, b, sizeof b);
    if (r != 0) {
      failf("%s: expected EOF, recv returned %zd (%s)", what, r, r < 0 ? errname(static_cast<int>(r)) : "data");
      return false;
    }
  }
  return true;
}

// After the peer closed: sends must fail (not hang, not succeed forever).
[[maybe_unused]] bool expect_send_fails(int fd, int *err) {
  const double end = now_s() + 5;
  uint8_t b = 0x42;
  while (now_s() < end) {
    const ssize_t r = api::send(fd, &b, 1);
    if (r < 0) {
      *err = static_cast<int>(-r);
      return true;
    }
    sleep_ms(20);
  }
  failf("send after the peer closed kept succeeding for 5 s");
  return false;
}

std::string hex(uint64_t v) {
  char s[24];
  std::snprintf(s, sizeof s, "%016" PRIx64, v);
  return s;
}

// ------------------------------------------------------------------ cases

// Sizes and seeds: client→server stream uses seed 2N+1, server→client 2N+2.
int case_size(size_t n) {
  Fnv1a sent, recvd;
  if (g.role == "server") {
    const int lfd = listen_on();
    const int fd = api::accept(lfd);
    if (fd < 0) return failf("accept: %s", errname(fd)), 1;
    if (!recv_pattern(fd, 2 * n + 1, n, &recvd) || !send_pattern(fd, 2 * n + 2, n, &sent)) return 1;
    if (!expect_eof(fd, "after the exchange")) return 1;
    api::close(fd);
    api::close(lfd);
  } else {
    const int fd = connect_retry();
    if (fd < 0) return failf("connect: %s", errname(fd)), 1;
    if (!send_pattern(fd, 2 * n + 1, n, &sent) || !recv_pattern(fd, 2 * n + 2, n, &recvd)) return 1;
    api::close(fd);
  }
  ok("%zu bytes each way verified; sent fnv %s, received fnv %s", n, hex(sent.h).c_str(), hex(recvd.h).c_str());
  return 0;
}

// who_shuts: "client" or "server" shuts down writing first.
int case_halfclose(const std::string &who_shuts, size_t n, size_t m) {
  const bool me_first = g.role == who_shuts;
  int lfd = -1;
  const int fd = connected_socket(&lfd);
  if (fd < 0) return 1;
  if (me_first) {
    if (!send_pattern(fd, 11, n, nullptr)) return 1;
    const int rc = api::shutdown(fd, SHUT_WR);
    if (rc < 0) return failf("shutdown(SHUT_WR): %s", errname(rc)), 1;
    // Our write side is closed; the read side must still deliver M bytes.
    if (!recv_pattern(fd, 12, m, nullptr)) return 1;
    if (!expect_eof(fd, "after the peer's reply")) return 1;
    ok("sent %zu, shut down writing, still received %zu then EOF", n, m);
  } else {
    if (!recv_pattern(fd, 11, n, nullptr)) return 1;
    if (!expect_eof(fd, "after the peer's SHUT_WR")) return 1;
    // The peer only half-closed: our direction still works.
    if (!send_pattern(fd, 12, m, nullptr)) return 1;
    ok("received %zu then EOF (peer half-closed), then sent %zu", n, m);
  }
  api::close(fd);
  if (lfd >= 0) api::close(lfd);
  return 0;
}

int case_close(const std::string &who_closes, size_t n) {
  int lfd = -1;
  const int fd = connected_socket(&lfd);
  if (fd < 0) return 1;
  if (g.role == who_closes) {
    if (!send_pattern(fd, 21, n, nullptr)) return 1;
    const int rc = api::close(fd);  // no shutdown first: close must flush
    if (rc < 0) return failf("close: %s", errname(rc)), 1;
    ok("sent %zu and closed at once", n);
  } else {
    if (!recv_pattern(fd, 21, n, nullptr)) return 1;
    if (!expect_eof(fd, "after the peer's close")) return 1;
    int err = 0;
#ifdef XFER_RSOCKET
    // rdma-core 44's rsend() checks for a disconnected peer only when it must
    // wait for credits or space, so sends after the peer's DISCONNECT may go on
    // "succeeding": observed and reported, not required.
    uint8_t b = 0x42;
    long accepted = 0;
    for (const double end = now_s() + 1; now_s() < end; sleep_ms(20)) {
      const ssize_t r = api::send(fd, &b, 1);
      if (r < 0) {
        err = static_cast<int>(-r);
        break;
      }
      ++accepted;
    }
    ok("received all %zu bytes, then EOF; sends afterwards: %s", n,
       err ? errname(err) : ("still accepted (" + std::to_string(accepted) + " in 1 s: rsocket 44 behaviour)").c_str());
#else
    if (!expect_send_fails(fd, &err)) return 1;
    ok("received all %zu bytes, then EOF; next send failed with %s", n, errname(err));
#endif
    api::close(fd);
  }
  if (lfd >= 0) api::close(lfd);
  return 0;
}

// Streams until the connection breaks (the runner kills the other side).
int case_blast() {
  int lfd = -1;
  const int fd = connected_socket(&lfd);
  if (fd < 0) return 1;
  std::vector<uint8_t> buf(1 << 16);
  PatternStream p(31);
  uint64_t sent = 0;
  for (;;) {
    p.fill(buf.data(), buf.size());
    const ssize_t r = api::send(fd, buf.data(), buf.size());
    if (r <= 0) {
      ok("peer went away after %" PRIu64 " bytes sent: send -> %s", sent, errname(static_cast<int>(r)));
      return 0;
    }
    sent += static_cast<uint64_t>(r);
  }
}

int case_sink(const std::string &ready_file) {
  int lfd = -1;
  const int fd = connected_socket(&lfd);
  if (fd < 0) return 1;
  std::vector<uint8_t> buf(1 << 16);
  PatternStream p(31);
  uint64_t got = 0;
  bool announced = false;
  long probes = 0;
  for (;;) {
    // A receiver alone cannot tell a dead peer from a quiet one (rdma-core 44's
    // rrecv does not watch rdma_cm events): when idle for 500 ms, send a 1-byte
    // probe, whose RDMA write fails once the peer's QP is gone.
    pollfd pf{fd, POLLIN, 0};
    const int pr = api::poll(&pf, 1, 500);
    if (pr == 0) {
      uint8_t probe = 0;
      const ssize_t w = api::send(fd, &probe, 1);
      ++probes;
      if (w < 0) {
        ok("stream ended after %" PRIu64 " verified bytes: idle-probe send #%ld -> %s", got, probes,
           errname(static_cast<int>(w)));
        api::close(fd);
        return 0;
      }
      continue;
    }
    const ssize_t r = api::recv(fd, buf.data(), buf.size());
    if (r == -EAGAIN) continue;
    if (r <= 0) {
      ok("stream ended after %" PRIu64 " verified bytes: recv -> %s%s", got,
         r == 0 ? "EOF" : errname(static_cast<int>(r)),
         probes ? (" (after " + std::to_string(probes) + " idle probe(s))").c_str() : "");
      api::close(fd);
      return 0;
    }
    const size_t bad = p.check(buf.data(), static_cast<size_t>(r));
    if (bad != static_cast<size_t>(r)) return failf("data mismatch at byte %" PRIu64, got + bad), 1;
    got += static_cast<uint64_t>(r);
    if (!announced && got >= (1u << 20) && !ready_file.empty()) {
      // Tell the runner that data flows: it may now kill the other side.
      if (FILE *f = std::fopen(ready_file.c_str(), "w")) std::fclose(f);
      announced = true;
    }
  }
}

// The server sends N bytes and closes at once; the client polls only after
// everything (data and the DISCONNECT) has arrived, reports what poll says,
// then must still read all N bytes and EOF.
int case_pollhup(size_t n) {
  int lfd = -1;
  const int fd = connected_socket(&lfd);
  if (fd < 0) return 1;
  if (g.role == "server") {
    if (!send_pattern(fd, 41, n, nullptr)) return 1;
    api::shutdown(fd, SHUT_RDWR);
    api::close(fd);
    ok("sent %zu, shut down and closed at once", n);
  } else {
    sleep_ms(1500);
    pollfd p{fd, POLLIN, 0};
    const int pr = api::poll(&p, 1, 0);
    std::string ev;
    for (auto [bit, name] :
         {std::pair{POLLIN, "POLLIN"}, {POLLHUP, "POLLHUP"}, {POLLERR, "POLLERR"}, {POLLRDHUP, "POLLRDHUP"}})
      if (p.revents & bit) ev += ev.empty() ? name : std::string("|") + name;
    if (!recv_pattern(fd, 41, n, nullptr) || !expect_eof(fd, "after the data")) return 1;
    ok("poll() with %zu unread bytes after the peer's close: %d, revents %s; then all %zu bytes read and EOF", n, pr,
       ev.empty() ? "0" : ev.c_str(), n);
  }
  if (lfd >= 0) api::close(lfd);
  return 0;
}

size_t seq_size(int i) { return 1 + (static_cast<size_t>(i) * 104729u) % 400000u; }

int case_seq(int conns) {
  Fnv1a all;
  int lfd = g.role == "server" ? listen_on() : -1;
  for (int i = 0; i < conns; ++i) {
    const size_t n = seq_size(i);
    int fd;
    std::printf("  connection %d: %zu bytes each way\n", i, n);
    std::fflush(stdout);
    if (g.role == "server") {
      stage("seq: accepting connection %d", i);
      fd = api::accept(lfd);
      if (fd < 0) return failf("connection %d: accept: %s", i, errname(fd)), 1;
      if (!recv_pattern(fd, 1000 + 2 * i, n, &all) || !send_pattern(fd, 1001 + 2 * i, n, &all)) {
        std::printf("  (in connection %d of %d, %zu bytes)\n", i, conns, n);
        return 1;
      }
      if (!expect_eof(fd, "end of connection")) return 1;
    } else {
      stage("seq: connecting connection %d", i);
      fd = connect_retry();
      if (fd < 0) return failf("connection %d: connect: %s", i, errname(fd)), 1;
      if (!send_pattern(fd, 1000 + 2 * i, n, &all) || !recv_pattern(fd, 1001 + 2 * i, n, &all)) {
        std::printf("  (in connection %d of %d, %zu bytes)\n", i, conns, n);
        return 1;
      }
    }
    stage("seq: closing connection %d", i);
    api::close(fd);
  }
  if (lfd >= 0) api::close(lfd);
  ok("%d sequential connections, 1..400000 bytes each way, all verified; fnv %s", conns, hex(all.h).c_str());
  return 0;
}

bool file_exists(const std::string &path) {
  struct stat st;
  return !path.empty() && ::stat(path.c_str(), &st) == 0;
}

// A well-behaved long-lived echo conversation: rounds of 4 KiB until `until`
// exists, then one 300 000-byte round that wraps the rings several times.
int case_hold(const std::string &ready_file, const std::string &until, double max_s) {
  const int fd = connect_retry();
  if (fd < 0) return failf("connect: %s", errname(fd)), 1;
  long rounds = 0;
  const double end = now_s() + max_s;
  auto round = [&](size_t n, uint64_t seed) {
    if (!send_pattern(fd, seed, n, nullptr) || !recv_pattern(fd, seed, n, nullptr)) {
      std::printf("  (in echo round %ld)\n", rounds);
      return false;
    }
    ++rounds;
    return true;
  };
  if (!round(4096, 1)) return 1;
  if (FILE *f = std::fopen(ready_file.c_str(), "w")) std::fclose(f);
  while (!file_exists(until)) {
    if (now_s() > end) return failf("gave up waiting for %s", until.c_str()), 1;
    if (!round(4096, 100 + static_cast<uint64_t>(rounds))) return 1;
    sleep_ms(20);
  }
  if (!round(300000, 7)) return 1;
  api::close(fd);
  ok("echo connection stayed healthy through the attacks: %ld verified rounds", rounds);
  return 0;
}

// Poll-driven echo server that says how each connection ended.
int case_victim(const std::string &log_path) {
  FILE *log = log_path.empty() ? stdout : std::fopen(log_path.c_str(), "a");
  if (!log) return failf("cannot open %s", log_path.c_str()), 1;
  setvbuf(log, nullptr, _IOLBF, 0);
  const int lfd = listen_on();
  api::set_nonblock(lfd);
  std::fprintf(log, "victim: listening on %s:%d\n", g.addr.c_str(), g.port);
  struct Conn {
    std::string out;
    long id;
    uint64_t bytes = 0;
  };
  std::map<int, Conn> conns;
  long next_id = 1;
  std::vector<uint8_t> buf(1 << 16);
  static volatile sig_atomic_t stop = 0;
  signal(SIGTERM, [](int) { stop = 1; });
  auto finish = [&](int fd, const char *how, int rc) {
    int so = 0;
    socklen_t len = sizeof so;
    api::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &len);
    const char *le = api::last_error();
    std::fprintf(log, "victim: conn %ld closed after %" PRIu64 " bytes: %s -> %s; SO_ERROR=%s; last_error=\"%s\"\n",
                 conns[fd].id, conns[fd].bytes, how, rc == 0 ? "EOF" : errname(rc), so ? errname(so) : "0", le);
    api::close(fd);
    conns.erase(fd);
  };
  while (!stop) {
    std::vector<pollfd> fds{{lfd, POLLIN, 0}};
    for (auto &[fd, c] : conns) fds.push_back({fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
    if (api::poll(fds.data(), fds.size(), 100) <= 0) continue;
    for (const pollfd &p : fds) {
      if (!p.revents) continue;
      if (p.fd == lfd) {
        int c;
        while ((c = api::accept(lfd)) >= 0) {
          api::set_nonblock(c);
          conns[c].id = next_id++;
          std::fprintf(log, "victim: conn %ld accepted\n", conns[c].id);
        }
        continue;
      }
      if (!conns.count(p.fd)) continue;
      Conn &c = conns[p.fd];
      bool gone = false;
      for (;;) {  // read what is there
        if (c.out.size() > (4u << 20)) break;
        const ssize_t n = api::recv(p.fd, buf.data(), buf.size());
        if (n > 0) {
          c.out.append(reinterpret_cast<char *>(buf.data()), static_cast<size_t>(n));
          c.bytes += static_cast<uint64_t>(n);
          continue;
        }
        if (n == -EAGAIN) break;
        finish(p.fd, "recv", static_cast<int>(n));
        gone = true;
        break;
      }
      if (gone) continue;
      while (!c.out.empty()) {
        const ssize_t n = api::send(p.fd, c.out.data(), c.out.size());
        if (n == -EAGAIN) break;
        if (n < 0) {
          finish(p.fd, "send", static_cast<int>(n));
          gone = true;
          break;
        }
        c.out.erase(0, static_cast<size_t>(n));
      }
    }
  }
  for (auto it = conns.begin(); it != conns.end(); it = conns.begin()) finish(it->first, "shutdown", 0);
  api::close(lfd);
  std::fprintf(log, "victim: stopped\n");
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  if (argc < 3) {
    std::fprintf(
        stderr,
        "usage: %s server|client CASE --addr A --port P [--size N] [--reply M] [--conns K]\n"
        "       [--ready FILE] [--until FILE] [--log FILE] [--retry S] [--deadline S]\n"
        "CASE: size halfclose-c2s halfclose-s2c close-client close-server blast sink pollhup seq hold victim\n",
        argv[0]);
    return 2;
  }
  g.role = argv[1];
  g.kase = argv[2];
  Args a(argc, argv, 3);
  g.addr = a.str("addr", std::getenv("RDMA_VM_ADDR") ? std::getenv("RDMA_VM_ADDR") : "127.0.0.1");
  g.port = static_cast<int>(a.num("port", 7471));
  if (g.role != "server" && g.role != "client") return 2;
  g_connect_retry_s = static_cast<double>(a.num("retry", 20));
  if (const long d = a.num("deadline", 0); d > 0) {
    signal(SIGALRM, on_deadline);
    alarm(static_cast<unsigned>(d));
  }
  const size_t n = static_cast<size_t>(a.num("size", 300000));
  const size_t m = static_cast<size_t>(a.num("reply", 200000));
  int rc = 2;
  if (g.kase == "size") rc = case_size(n);
  else if (g.kase == "halfclose-c2s") rc = case_halfclose("client", n, m);
  else if (g.kase == "halfclose-s2c") rc = case_halfclose("server", n, m);
  else if (g.kase == "close-client") rc = case_close("client", n);
  else if (g.kase == "close-server") rc = case_close("server", n);
  else if (g.kase == "blast") rc = case_blast();
  else if (g.kase == "sink") rc = case_sink(a.str("ready"));
  else if (g.kase == "pollhup") rc = case_pollhup(n);
  else if (g.kase == "seq") rc = case_seq(static_cast<int>(a.num("conns", 20)));
  else if (g.kase == "hold") rc = case_hold(a.str("ready"), a.str("until"), static_cast<double>(a.num("max", 300)));
  else if (g.kase == "victim") rc = case_victim(a.str("log"));
  else std::fprintf(stderr, "unknown case %s\n", g.kase.c_str());
  std::fflush(stdout);
  return rc != 0 || g_failures ? (rc ? rc : 1) : 0;
}
