// What the servers that handle requests on CPU threads share: reading a
// request off a non-blocking connection, sending a reply, counting, stopping.
// (The GPU-native server does the same on the GPU with grecv/gsend.)
#ifndef FV_SERVER_COMMON_H
#define FV_SERVER_COMMON_H

#include "fv_lbp.h"
#include "fv_net.h"
#include "fv_wire.h"

#include <signal.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

namespace fv {

// The flags every server takes.
struct ServerConfig {
  int port = 7000;
  std::string memcached_text = "127.0.0.1:11211";
  sockaddr_in memcached{};
  uint32_t grid = kDefaultGrid;
  uint32_t threshold_q16 = kDefaultThresholdQ16;
  int mc_timeout_ms = 1000;  // a memcached exchange (and connect) taking longer is a database error

  static constexpr const char *kUsage =
      "[--port P] [--memcached A.B.C.D:PORT] [--grid G] [--threshold-q16 T] [--mc-timeout-ms MS]";

  // Takes flag `name` (and its value) when it is one of these.
  bool parse(const std::string &name, Flags &f) {
    if (name == "--port") port = static_cast<int>(f.number());
    else if (name == "--memcached") memcached_text = f.next();
    else if (name == "--grid") grid = static_cast<uint32_t>(f.number());
    else if (name == "--threshold-q16") threshold_q16 = static_cast<uint32_t>(f.number());
    else if (name == "--mc-timeout-ms") mc_timeout_ms = static_cast<int>(f.number());
    else return false;
    return true;
  }
  // After parsing: false (with a message) when a value is unusable.
  bool check(const char *who) {
    if (!parse_endpoint(memcached_text, &memcached)) {
      std::fprintf(stderr, "%s: --memcached wants A.B.C.D:PORT, got '%s'\n", who, memcached_text.c_str());
      return false;
    }
    if (grid < 1 || grid > kMaxGrid || port <= 0 || port > 65535) {
      std::fprintf(stderr, "%s: --grid must be in [1, %u], --port in [1, 65535]\n", who, kMaxGrid);
      return false;
    }
    return true;
  }
};

enum class ReadStatus { kPartial, kComplete, kBad, kClosed };

// One connection's request in progress: the header first (validated before
// the image is read or any memory sized from it), then exactly the image.
struct RequestReader {
  std::vector<uint8_t> bytes;
  size_t have = 0;
  RequestHeader header{};
  Reason bad = kReasonNone;

  size_t need() const { return have < kRequestHeaderBytes ? kRequestHeaderBytes : request_bytes(header); }
  const uint8_t *image() const { return bytes.data() + kRequestHeaderBytes; }
  void reset() { have = 0; }

  // Reads what is there without blocking.
  template <class Io>
  ReadStatus read(int fd, uint32_t grid) {
    if (bytes.size() < kRequestHeaderBytes) bytes.resize(kRequestHeaderBytes);
    for (;;) {
      const size_t want = need();
      if (have == want) return ReadStatus::kComplete;
      const long k = status_of(Io::recv(fd, bytes.data() + have, want - have));
      if (k == -EAGAIN || k == -EWOULDBLOCK) return ReadStatus::kPartial;
      if (k == -EINTR) continue;
      if (k <= 0) return ReadStatus::kClosed;  // EOF (maybe mid-request) or an error
      have += static_cast<size_t>(k);
      if (have == kRequestHeaderBytes) {
        header = decode_request_header(bytes.data());
        bad = validate_request(header, grid);
        if (bad != kReasonNone) return ReadStatus::kBad;
        if (bytes.size() < request_bytes(header)) bytes.resize(request_bytes(header));
      }
    }
  }
};

// A reply without blocking: false when it did not go out whole (a peer that
// stopped reading its replies, or is gone): the caller closes the connection.
template <class Io>
bool send_reply(int fd, const Reply &r) {
  uint8_t bytes[kReplyBytes];
  encode_reply(r, bytes);
  return status_of(Io::send(fd, bytes, sizeof bytes)) == static_cast<long>(sizeof bytes);
}

struct ServerStats {
  std::atomic<uint64_t> verdicts[4] = {};  // by Verdict
  std::atomic<uint64_t> bad_requests{0}, database_errors{0}, connections{0}, closed_mid_request{0};

  void count(const Reply &r) {
    verdicts[r.verdict & 3].fetch_add(1, std::memory_order_relaxed);
    if (r.verdict == kError && r.reason == kDatabase) database_errors.fetch_add(1, std::memory_order_relaxed);
    if (r.verdict == kError && r.reason != kDatabase && r.reason != kBadRecord)
      bad_requests.fetch_add(1, std::memory_order_relaxed);
  }
  void print(const char *who) const {
    std::printf(
        "%s: replies: match %llu, no-match %llu, unknown-identity %llu, error %llu "
        "(bad requests %llu, database %llu); connections %llu, closed mid-request %llu\n",
        who, (unsigned long long)verdicts[0].load(), (unsigned long long)verdicts[1].load(),
        (unsigned long long)verdicts[2].load(), (unsigned long long)verdicts[3].load(),
        (unsigned long long)bad_requests.load(), (unsigned long long)database_errors.load(),
        (unsigned long long)connections.load(), (unsigned long long)closed_mid_request.load());
    std::fflush(stdout);
  }
};

// SIGINT/SIGTERM set the flag; SIGPIPE is ignored (a vanished peer is an error return).
inline volatile sig_atomic_t g_stop = 0;
inline void install_stop_handlers() {
  signal(SIGINT, [](int) { g_stop = 1; });
  signal(SIGTERM, [](int) { g_stop = 1; });
  signal(SIGPIPE, SIG_IGN);
}

// New connections for a worker thread: the acceptor pushes, the worker takes
// when its wake-up fd (a pipe it polls with its sockets) turns readable.
class Inbox {
 public:
  int open() {
    if (pipe(wake_) < 0) return -errno;
    return LibcIo::set_nonblocking(wake_[0]) < 0 ? -errno : 0;
  }
  int wake_fd() const { return wake_[0]; }
  void push(int fd) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      fds_.push_back(fd);
    }
    const char byte = 1;
    if (write(wake_[1], &byte, 1) < 0) {}  // a full pipe wakes the worker anyway
  }
  std::vector<int> take() {
    char drain[64];
    while (read(wake_[0], drain, sizeof drain) == sizeof drain) {}
    std::vector<int> fds;
    std::lock_guard<std::mutex> lock(mutex_);
    fds.swap(fds_);
    return fds;
  }

 private:
  int wake_[2] = {-1, -1};
  std::mutex mutex_;
  std::vector<int> fds_;
};

// A listening socket on port (any address), or a negated errno.
template <class Io>
int listen_on(int port) {
  const int fd = static_cast<int>(status_of(Io::socket()));
  if (fd < 0) return fd;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  Io::reuse_address(fd);
  long rc = status_of(Io::bind(fd, a));
  if (rc == 0) rc = status_of(Io::listen(fd, 1024));
  if (rc < 0) Io::close(fd);
  return rc < 0 ? static_cast<int>(rc) : fd;
}

// Accepts until the stop flag and hands the connections round robin to the
// workers' inboxes.
template <class Io, class Workers>
void accept_loop(int listener, Workers &workers, ServerStats *stats) {
  for (size_t next = 0; !g_stop;) {
    pollfd p{listener, POLLIN, 0};
    if (status_of(Io::poll(&p, 1, 100)) <= 0) continue;
    const int fd = static_cast<int>(status_of(Io::accept(listener)));
    if (fd < 0) continue;
    stats->connections.fetch_add(1);
    workers[next++ % workers.size()]->inbox().push(fd);
  }
}

}  // namespace fv

#endif
