// gs_memcache: memcached's text protocol on gpusock's CPU socket API, for the
// interop matrix's memcached rows.
//
//   client  against an unmodified memcached (Debian's, run under rdma-core 44's
//           librspreload.so): for every --sizes value N (1 B .. 1 MiB) it does
//           set / get / delete / get-miss of a value generated from seed N and
//           checks every byte (FNV-1a printed), then --small K small values
//           stored one by one and fetched back with ONE multi-key get.
//   server  a minimal memcached (set/add/replace/get/gets/delete/touch/version/
//           flush_all/stats/verbosity/quit) so that libmemcached's tools, run
//           under librspreload, can be the rdma-core side in the client role.
//           Stops on SIGTERM.
// Exit status 0 only if everything the client checked passed.
#include "interop-tests/common.h"
#include "test-support/gs_sockets.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cstdarg>
#include <map>
#include <sstream>

using namespace interop;

namespace {

int g_failures = 0;

// Buffered reads over a blocking gpusock socket.
class Conn {
 public:
  explicit Conn(int fd) : fd_(fd) {}
  bool send_all(const void *p, size_t n) { return gpusock::test::send_all(fd_, p, n, &err_); }
  bool send_str(const std::string &s) { return send_all(s.data(), s.size()); }
  bool fill() {
    if (pos_ > 0 && pos_ == buf_.size()) buf_.clear(), pos_ = 0;
    uint8_t tmp[1 << 16];
    const ssize_t r = gs_recv(fd_, tmp, sizeof tmp, 0);
    if (r <= 0) {
      err_ = r < 0 ? static_cast<int>(r) : -ECONNRESET;
      return false;
    }
    buf_.append(reinterpret_cast<char *>(tmp), static_cast<size_t>(r));
    return true;
  }
  bool line(std::string *out) {
    for (;;) {
      const size_t e = buf_.find("\r\n", pos_);
      if (e != std::string::npos) {
        *out = buf_.substr(pos_, e - pos_);
        pos_ = e + 2;
        return true;
      }
      if (!fill()) return false;
    }
  }
  bool bytes(size_t n, std::string *out) {
    while (buf_.size() - pos_ < n)
      if (!fill()) return false;
    *out = buf_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  int err() const { return err_; }

 private:
  int fd_;
  std::string buf_;
  size_t pos_ = 0;
  int err_ = 0;
};

void failf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void failf(const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  std::printf("FAIL gs_memcache client: %s [last_error: %s]\n", msg, gs_last_error());
  std::fflush(stdout);
  ++g_failures;
}

std::string value_of(size_t n, uint64_t seed) {
  std::string v(n, '\0');
  PatternStream(seed).fill(reinterpret_cast<uint8_t *>(v.data()), n);
  return v;
}

uint64_t fnv(const std::string &s) {
  Fnv1a f;
  f.add(reinterpret_cast<const uint8_t *>(s.data()), s.size());
  return f.h;
}

bool expect_line(Conn &c, const std::string &want, const char *what) {
  std::string l;
  if (!c.line(&l)) return failf("%s: connection failed: %s", what, errname(c.err())), false;
  if (l != want) return failf("%s: expected \"%s\", got \"%s\"", what, want.c_str(), l.substr(0, 80).c_str()), false;
  return true;
}

// get of one key: fills *value and returns true on a hit; *miss on END.
bool get_one(Conn &c, const std::string &key, std::string *value, bool *miss) {
  if (!c.send_str("get " + key + "\r\n")) return failf("get %s: send: %s", key.c_str(), errname(c.err())), false;
  std::string l;
  if (!c.line(&l)) return failf("get %s: %s", key.c_str(), errname(c.err())), false;
  if (l == "END") {
    *miss = true;
    return true;
  }
  *miss = false;
  std::istringstream is(l);
  std::string tag, k;
  unsigned flags = 0;
  size_t n = 0;
  is >> tag >> k >> flags >> n;
  if (tag != "VALUE" || k != key) return failf("get %s: unexpected reply \"%s\"", key.c_str(), l.c_str()), false;
  if (!c.bytes(n, value)) return failf("get %s: value: %s", key.c_str(), errname(c.err())), false;
  return expect_line(c, "", "get data terminator") && expect_line(c, "END", "get END");
}

int client(const Args &a) {
  const std::string addr = a.str("addr", std::getenv("RDMA_VM_ADDR") ? std::getenv("RDMA_VM_ADDR") : "127.0.0.1");
  const int port = static_cast<int>(a.num("port", 11211));
  const char *call = "";  // the server may still be starting: retry a refused connect for 20 s
  const int fd = gpusock::test::connect_retry(make_addr(addr.c_str(), port), {.seconds = 20, .pause_ms = 100}, &call);
  if (fd < 0) return failf("%s %s:%d: %s", call, addr.c_str(), port, errname(fd)), 1;
  Conn c(fd);
  const double t0 = now_s();
  std::string l;
  if (!c.send_str("version\r\n") || !c.line(&l) || l.rfind("VERSION ", 0) != 0)
    return failf("version: got \"%s\" (%s)", l.c_str(), errname(c.err())), 1;
  std::printf("gs_memcache: server says %s\n", l.c_str());

  std::vector<size_t> sizes;
  {
    std::stringstream ss(a.str("sizes", "1,2047,2048,65535,65536,65537,1048576"));
    std::string item;
    while (std::getline(ss, item, ',')) sizes.push_back(std::stoul(item));
  }
  for (size_t n : sizes) {
    const double ts = now_s();
    const std::string key = "gs-interop-" + std::to_string(n);
    const std::string v = value_of(n, n);
    if (!c.send_str("set " + key + " 7 0 " + std::to_string(n) + "\r\n") || !c.send_all(v.data(), v.size()) ||
        !c.send_str("\r\n"))
      return failf("set %zu: send: %s", n, errname(c.err())), 1;
    if (!expect_line(c, "STORED", "set")) return 1;
    std::string got;
    bool miss = false;
    if (!get_one(c, key, &got, &miss)) return 1;
    if (miss) return failf("get %s: miss right after set", key.c_str()), 1;
    if (got != v)
      return failf("get %s: value differs (fnv %016" PRIx64 " != %016" PRIx64 ")", key.c_str(), fnv(got), fnv(v)), 1;
    if (!c.send_str("delete " + key + "\r\n") || !expect_line(c, "DELETED", "delete")) return 1;
    if (!get_one(c, key, &got, &miss)) return 1;
    if (!miss) return failf("get %s after delete: still there", key.c_str()), 1;
    std::printf("OK set/get/delete %7zu B  fnv %016" PRIx64 "  %.3fs\n", n, fnv(v), now_s() - ts);
  }

  const long small = a.num("small", 50);
  if (small > 0) {
    std::string multi = "get";
    for (long i = 0; i < small; ++i) {
      const std::string key = "gs-small-" + std::to_string(i);
      const std::string v = value_of(static_cast<size_t>(1 + i * 7), 5000 + static_cast<uint64_t>(i));
      if (!c.send_str("set " + key + " 0 0 " + std::to_string(v.size()) + "\r\n" + v + "\r\n") ||
          !expect_line(c, "STORED", "small set"))
        return 1;
      multi += " " + key;
    }
    if (!c.send_str(multi + "\r\n")) return failf("multi-get: send: %s", errname(c.err())), 1;
    for (long i = 0; i < small; ++i) {
      const std::string key = "gs-small-" + std::to_string(i);
      const std::string v = value_of(static_cast<size_t>(1 + i * 7), 5000 + static_cast<uint64_t>(i));
      std::string got;
      if (!c.line(&l)) return failf("multi-get: %s", errname(c.err())), 1;
      if (l != "VALUE " + key + " 0 " + std::to_string(v.size()))
        return failf("multi-get: expected VALUE %s, got \"%s\"", key.c_str(), l.c_str()), 1;
      if (!c.bytes(v.size(), &got) || got != v) return failf("multi-get %s: value differs", key.c_str()), 1;
      if (!expect_line(c, "", "multi-get terminator")) return 1;
    }
    if (!expect_line(c, "END", "multi-get END")) return 1;
    for (long i = 0; i < small; ++i)
      if (!c.send_str("delete gs-small-" + std::to_string(i) + "\r\n") || !expect_line(c, "DELETED", "small delete"))
        return 1;
    std::printf("OK %ld small values set one by one, fetched with one multi-get, deleted\n", small);
  }
  c.send_str("quit\r\n");
  gs_close(fd);
  std::printf("OK gs_memcache client: all checks passed in %.2fs\n", now_s() - t0);
  return g_failures ? 1 : 0;
}

// ------------------------------------------------------------------ server

volatile sig_atomic_t g_stop = 0;

struct Item {
  unsigned flags = 0;
  std::string data;
};

struct Session {
  std::string in, out;
  // A storage command waiting for its data block.
  bool want_data = false;
  std::string cmd, key;
  unsigned flags = 0;
  size_t bytes = 0;
  bool noreply = false;
  bool quit = false;
};

void handle(Session &s, std::map<std::string, Item> &store) {
  for (;;) {
    if (s.want_data) {
      if (s.in.size() < s.bytes + 2) return;
      std::string data = s.in.substr(0, s.bytes);
      const bool term_ok = s.in.compare(s.bytes, 2, "\r\n") == 0;
      s.in.erase(0, s.bytes + 2);
      s.want_data = false;
      std::string reply;
      if (!term_ok) {
        reply = "CLIENT_ERROR bad data chunk\r\n";
      } else {
        const bool exists = store.count(s.key) > 0;
        if ((s.cmd == "add" && exists) || (s.cmd == "replace" && !exists)) {
          reply = "NOT_STORED\r\n";
        } else {
          store[s.key] = Item{s.flags, std::move(data)};
          reply = "STORED\r\n";
        }
      }
      if (!s.noreply) s.out += reply;
      continue;
    }
    const size_t e = s.in.find("\r\n");
    if (e == std::string::npos) return;
    const std::string line = s.in.substr(0, e);
    s.in.erase(0, e + 2);
    std::istringstream is(line);
    std::vector<std::string> w;
    for (std::string t; is >> t;) w.push_back(t);
    if (w.empty()) {
      s.out += "ERROR\r\n";
      continue;
    }
    const std::string &cmd = w[0];
    if ((cmd == "set" || cmd == "add" || cmd == "replace") && w.size() >= 5) {
      s.want_data = true;
      s.cmd = cmd;
      s.key = w[1];
      s.flags = static_cast<unsigned>(std::stoul(w[2]));
      s.bytes = std::stoul(w[4]);
      s.noreply = w.size() > 5 && w[5] == "noreply";
    } else if ((cmd == "get" || cmd == "gets") && w.size() >= 2) {
      for (size_t i = 1; i < w.size(); ++i) {
        auto it = store.find(w[i]);
        if (it == store.end()) continue;
        s.out += "VALUE " + w[i] + " " + std::to_string(it->second.flags) + " " +
                 std::to_string(it->second.data.size()) + (cmd == "gets" ? " 1" : "") + "\r\n";
        s.out += it->second.data + "\r\n";
      }
      s.out += "END\r\n";
    } else if (cmd == "delete" && w.size() >= 2) {
      const bool found = store.erase(w[1]) > 0;
      if (!(w.size() > 2 && w.back() == "noreply")) s.out += found ? "DELETED\r\n" : "NOT_FOUND\r\n";
    } else if (cmd == "touch" && w.size() >= 3) {
      s.out += store.count(w[1]) ? "TOUCHED\r\n" : "NOT_FOUND\r\n";
    } else if (cmd == "version") {
      s.out += "VERSION 1.6.18-gs-memcache\r\n";
    } else if (cmd == "flush_all") {
      store.clear();
      s.out += "OK\r\n";
    } else if (cmd == "verbosity") {
      s.out += "OK\r\n";
    } else if (cmd == "stats") {
      s.out += "STAT pid " + std::to_string(getpid()) + "\r\nSTAT version 1.6.18-gs-memcache\r\nSTAT curr_items " +
               std::to_string(store.size()) + "\r\nEND\r\n";
    } else if (cmd == "quit") {
      s.quit = true;
      return;
    } else {
      s.out += "ERROR\r\n";
    }
  }
}

int server(const Args &a) {
  const std::string addr = a.str("addr", std::getenv("RDMA_VM_ADDR") ? std::getenv("RDMA_VM_ADDR") : "127.0.0.1");
  const int port = static_cast<int>(a.num("port", 11211));
  signal(SIGTERM, [](int) { g_stop = 1; });
  const char *call = "";
  const int lfd = gpusock::test::listen_on(make_addr(addr.c_str(), port), 64, SOCK_NONBLOCK, &call);
  if (lfd < 0) return std::printf("FAIL %s: %s (%s)\n", call, errname(lfd), gs_last_error()), 1;
  std::printf("gs_memcache server: listening on %s:%d\n", addr.c_str(), port);
  std::fflush(stdout);
  std::map<std::string, Item> store;
  std::map<int, Session> sessions;
  std::vector<uint8_t> buf(1 << 16);
  long accepted = 0;
  while (!g_stop) {
    std::vector<pollfd> fds{{lfd, POLLIN, 0}};
    for (auto &[fd, s] : sessions) fds.push_back({fd, static_cast<short>(POLLIN | (s.out.empty() ? 0 : POLLOUT)), 0});
    if (gs_poll(fds.data(), fds.size(), 200) <= 0) continue;
    for (const pollfd &p : fds) {
      if (!p.revents) continue;
      if (p.fd == lfd) {
        int c;
        while ((c = gs_accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK)) >= 0) sessions[c], ++accepted;
        continue;
      }
      Session &s = sessions[p.fd];
      bool closed = false;
      for (;;) {
        const ssize_t n = gs_recv(p.fd, buf.data(), buf.size(), 0);
        if (n > 0) {
          s.in.append(reinterpret_cast<char *>(buf.data()), static_cast<size_t>(n));
          continue;
        }
        if (n != -EAGAIN) closed = true;
        break;
      }
      handle(s, store);
      while (!s.out.empty()) {
        const ssize_t n = gs_send(p.fd, s.out.data(), s.out.size(), 0);
        if (n == -EAGAIN) {
          pollfd w{p.fd, POLLOUT, 0};
          gs_poll(&w, 1, 100);
          continue;
        }
        if (n <= 0) break;
        s.out.erase(0, static_cast<size_t>(n));
      }
      if (closed || s.quit) {
        gs_close(p.fd);
        sessions.erase(p.fd);
      }
    }
  }
  std::printf("gs_memcache server: stopped after %ld connections, %zu items\n", accepted, store.size());
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s client|server --addr A --port P [--sizes N,N,...] [--small K]\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  Args a(argc, argv, 2);
  if (mode == "client") return client(a);
  if (mode == "server") return server(a);
  return 2;
}
