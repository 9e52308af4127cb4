// Shared helpers of the interop test programs: clocks, errno names, addresses
// and tiny argument parsing; the byte patterns, FNV-1a sums and socket helpers
// come from test-support. Header-only, no dependency on gpusock's libraries or
// librdmacm (the xfer peer is built against both).
#pragma once

#include "test-support/checksum.h"
#include "test-support/sockets.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>

#include <cerrno>
#include <cstdarg>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace interop {

// The sender fills with a seeded PatternStream, the receiver checks against its
// own copy, chunk by chunk (any split works); both print FNV-1a sums.
using gpusock::test::Fnv1a;
using gpusock::test::PatternStream;

inline double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

inline void sleep_ms(long ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, nullptr);
}

inline const char *errname(int e) {
  if (e < 0) e = -e;
  const char *n = strerrorname_np(e);
  return n ? n : "E?";
}

inline sockaddr_in make_addr(const char *host, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host, &a.sin_addr) != 1) {
    std::fprintf(stderr, "bad IPv4 address: %s\n", host);
    std::exit(2);
  }
  return a;
}

// --name value / --name=value options after the positional ones.
class Args {
 public:
  Args(int argc, char **argv, int first) {
    for (int i = first; i < argc; ++i) {
      std::string a = argv[i];
      if (a.rfind("--", 0) != 0) {
        positional_.push_back(a);
        continue;
      }
      const size_t eq = a.find('=');
      if (eq != std::string::npos) {
        opts_.emplace_back(a.substr(2, eq - 2), a.substr(eq + 1));
      } else if (i + 1 < argc) {
        opts_.emplace_back(a.substr(2), argv[++i]);
      } else {
        opts_.emplace_back(a.substr(2), "");
      }
    }
  }
  std::string str(const char *name, const std::string &fallback = "") const {
    for (auto &[k, v] : opts_)
      if (k == name) return v;
    return fallback;
  }
  long num(const char *name, long fallback) const {
    const std::string v = str(name);
    return v.empty() ? fallback : std::strtol(v.c_str(), nullptr, 0);
  }
  bool has(const char *name) const {
    for (auto &[k, v] : opts_)
      if (k == name) return true;
    return false;
  }
  const std::vector<std::string> &positional() const { return positional_; }

 private:
  std::vector<std::pair<std::string, std::string>> opts_;
  std::vector<std::string> positional_;
};

}  // namespace interop
