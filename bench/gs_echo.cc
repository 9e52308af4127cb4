// gs_echo: echo server and measuring client over the gpusock socket API.
//
//   gs_echo server [--transport T] [--addr A] [--port P] [--sink-port Q]
//   gs_echo client [--transport T] [--addr A] [--port P] [--sink-port Q]
//                  [--seconds S] [--size B] [--sizes B,B,...]
//   gs_echo drive  [--transport T] [--addr A] [--port P] [--sink-port Q]
//
// T is a GPUSOCK_TRANSPORT value (fabric:tcp, fabric:shm, verbs), exported
// before the first gs_ call, or "kernel" for ordinary kernel sockets (the
// baseline). The server listens on two ports:
//   P (default 7471)   echo: every byte is sent back.
//   Q (default P + 1)  sink: one-way streaming. The client sends an 8-byte
//                      little-endian length L, then L bytes; the server
//                      discards them and answers with the same 8 bytes.
// Round-trip time is measured on the echo port with 64-byte messages;
// bandwidth is one-way on the sink port (bursts of 16 MiB, timed up to the
// server's acknowledgement), which is what a provider's RMA write bandwidth
// is compared against.
//
// `drive` is the client for bench_wire: it connects, prints "ready", then
// runs "rtt SIZE COUNT" / "bw SIZE COUNT" commands read from stdin and
// answers "ok NANOSECONDS" or "error TEXT". Keeping every gs_ call in this
// program means bench_wire never initialises libfabric before it spawns.
#include <gpusock/socket.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

// ---------------------------------------------------------------------------
// One function table for gpusock and for kernel sockets, both in the gpusock
// status convention (>= 0 success, negated errno on failure).

struct SockApi {
  const char *name;
  int (*socket)(int, int, int);
  int (*bind)(int, const sockaddr *, socklen_t);
  int (*listen)(int, int);
  int (*accept)(int, sockaddr *, socklen_t *);
  int (*connect)(int, const sockaddr *, socklen_t);
  ssize_t (*send)(int, const void *, size_t);
  ssize_t (*recv)(int, void *, size_t);
  int (*poll)(pollfd *, nfds_t, int);
  int (*close)(int);
  int (*shutdown)(int, int);
  int (*setsockopt)(int, int, int, const void *, socklen_t);
  int (*getsockname)(int, sockaddr *, socklen_t *);
  int (*set_nonblocking)(int);
  const char *(*last_error)();
};

template <typename T>
T errno_status(T rc) {
  return rc < 0 ? static_cast<T>(-errno) : rc;
}

const SockApi kKernelApi = {
    "kernel",
    [](int d, int t, int p) { return errno_status(::socket(d, t, p)); },
    [](int s, const sockaddr *a, socklen_t l) { return errno_status(::bind(s, a, l)); },
    [](int s, int b) { return errno_status(::listen(s, b)); },
    [](int s, sockaddr *a, socklen_t *l) { return errno_status(::accept(s, a, l)); },
    [](int s, const sockaddr *a, socklen_t l) { return errno_status(::connect(s, a, l)); },
    // MSG_NOSIGNAL: a vanished peer is an error return, not SIGPIPE.
    [](int s, const void *b, size_t n) { return errno_status(::send(s, b, n, MSG_NOSIGNAL)); },
    [](int s, void *b, size_t n) { return errno_status(::recv(s, b, n, 0)); },
    [](pollfd *f, nfds_t n, int t) { return errno_status(::poll(f, n, t)); },
    [](int s) { return errno_status(::close(s)); },
    [](int s, int how) { return errno_status(::shutdown(s, how)); },
    [](int s, int l, int o, const void *v, socklen_t n) { return errno_status(::setsockopt(s, l, o, v, n)); },
    [](int s, sockaddr *a, socklen_t *l) { return errno_status(::getsockname(s, a, l)); },
    [](int s) {
      int flags = ::fcntl(s, F_GETFL);
      return flags < 0 ? -errno : errno_status(::fcntl(s, F_SETFL, flags | O_NONBLOCK));
    },
    []() -> const char * { return ""; },
};

const SockApi kGpusockApi = {
    "gpusock",
    gs_socket,
    gs_bind,
    gs_listen,
    gs_accept,
    gs_connect,
    [](int s, const void *b, size_t n) { return gs_send(s, b, n, 0); },
    [](int s, void *b, size_t n) { return gs_recv(s, b, n, 0); },
    gs_poll,
    gs_close,
    gs_shutdown,
    gs_setsockopt,
    gs_getsockname,
    [](int s) {
      int flags = gs_fcntl(s, F_GETFL);
      return flags < 0 ? flags : gs_fcntl(s, F_SETFL, flags | O_NONBLOCK);
    },
    gs_last_error,
};

std::string describe(const SockApi &api, long status) {
  std::string text = std::strerror(static_cast<int>(-status));
  const char *detail = api.last_error();
  if (detail != nullptr && *detail != '\0') text += std::string(" (") + detail + ")";
  return text;
}

// ---------------------------------------------------------------------------
// Options

struct Options {
  std::string mode;
  std::string transport;  // empty: GPUSOCK_TRANSPORT as found, or the library default
  std::string addr = "127.0.0.1";
  int port = 7471;
  int sink_port = -1;  // -1: port + 1; 0: none
  double seconds = 6;
  size_t rtt_size = 64;
  std::vector<size_t> sizes = {64 * 1024, 1024 * 1024};
};

[[noreturn]] void usage(const char *error) {
  if (error != nullptr) std::fprintf(stderr, "gs_echo: %s\n", error);
  std::fprintf(stderr,
               "usage: gs_echo server|client|drive [--transport fabric:tcp|fabric:shm|verbs|kernel]\n"
               "               [--addr A] [--port P] [--sink-port Q]\n"
               "       client: [--seconds S] [--size B] [--sizes B,B,...]\n");
  std::exit(2);
}

size_t parse_size(const std::string &text) {
  char *end = nullptr;
  unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  std::string suffix = end;
  if (suffix == "k" || suffix == "K" || suffix == "KiB") value <<= 10;
  else if (suffix == "m" || suffix == "M" || suffix == "MiB") value <<= 20;
  else if (!suffix.empty() || value == 0) usage(("bad size: " + text).c_str());
  return static_cast<size_t>(value);
}

Options parse_options(int argc, char **argv) {
  if (argc < 2) usage(nullptr);
  Options options;
  options.mode = argv[1];
  if (options.mode != "server" && options.mode != "client" && options.mode != "drive") usage("unknown mode");
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + arg).c_str());
      return argv[++i];
    };
    if (arg == "--transport") options.transport = value();
    else if (arg == "--addr") options.addr = value();
    else if (arg == "--port") options.port = std::atoi(value().c_str());
    else if (arg == "--sink-port") options.sink_port = std::atoi(value().c_str());
    else if (arg == "--seconds") options.seconds = std::atof(value().c_str());
    else if (arg == "--size") options.rtt_size = parse_size(value());
    else if (arg == "--sizes") {
      options.sizes.clear();
      std::string list = value();
      for (size_t start = 0; start <= list.size();) {
        size_t comma = list.find(',', start);
        if (comma == std::string::npos) comma = list.size();
        options.sizes.push_back(parse_size(list.substr(start, comma - start)));
        start = comma + 1;
      }
    } else if (arg == "-h" || arg == "--help") usage(nullptr);
    else usage(("unknown option " + arg).c_str());
  }
  if (options.sink_port < 0) options.sink_port = options.port == 0 ? 0 : options.port + 1;
  if (options.seconds <= 0) usage("--seconds must be positive");
  return options;
}

// The transport is read once per process, so it is exported before any gs_ call.
const SockApi &select_api(const Options &options, std::string *label) {
  if (options.transport == "kernel") {
    *label = "kernel tcp";
    return kKernelApi;
  }
  if (!options.transport.empty()) setenv("GPUSOCK_TRANSPORT", options.transport.c_str(), 1);
  const char *env = std::getenv("GPUSOCK_TRANSPORT");
  *label = env != nullptr && *env != '\0' ? env : "gpusock default transport";
  return kGpusockApi;
}

bool resolve(const std::string &host, int port, sockaddr_in *out) {
  std::memset(out, 0, sizeof *out);
  out->sin_family = AF_INET;
  out->sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &out->sin_addr) == 1) return true;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo *result = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &result) != 0 || result == nullptr) return false;
  out->sin_addr = reinterpret_cast<sockaddr_in *>(result->ai_addr)->sin_addr;
  freeaddrinfo(result);
  return true;
}

void set_nodelay(const SockApi &api, int fd) {
  int one = 1;
  // Latency matters more than coalescing; transports without Nagle ignore it.
  (void)api.setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

volatile std::sig_atomic_t g_stop = 0;

void on_stop_signal(int) { g_stop = 1; }

void install_signal_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  // Output may go to a pipe nobody reads any more (bench_wire keeps only the
  // ready line); that must not kill the server.
  signal(SIGPIPE, SIG_IGN);
}

// ---------------------------------------------------------------------------
// Blocking I/O helpers (client, drive and the server's connection threads).

long send_all(const SockApi &api, int fd, const void *data, size_t len) {
  auto *p = static_cast<const char *>(data);
  size_t done = 0;
  while (done < len) {
    ssize_t n = api.send(fd, p + done, len - done);
    if (n == -EINTR) continue;
    if (n < 0) return n;
    done += static_cast<size_t>(n);
  }
  return static_cast<long>(done);
}

long recv_all(const SockApi &api, int fd, void *data, size_t len) {
  auto *p = static_cast<char *>(data);
  size_t done = 0;
  while (done < len) {
    ssize_t n = api.recv(fd, p + done, len - done);
    if (n == -EINTR) continue;
    if (n < 0) return n;
    if (n == 0) return -ECONNRESET;  // the server went away mid-message
    done += static_cast<size_t>(n);
  }
  return static_cast<long>(done);
}

// ---------------------------------------------------------------------------
// Server: gs_poll over the two listeners; each connection gets a thread making
// blocking calls, the library's fast path (it busy-polls inside a blocking
// call, so a round trip costs no hand-off between threads).

constexpr size_t kEchoBufferBytes = 1 << 20;
constexpr size_t kSinkScratchBytes = 1 << 20;

int open_listener(const SockApi &api, const std::string &addr, int port, int *bound_port) {
  sockaddr_in sin;
  if (!resolve(addr, port, &sin)) {
    std::fprintf(stderr, "gs_echo: cannot resolve %s\n", addr.c_str());
    return -EINVAL;
  }
  int fd = api.socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    std::fprintf(stderr, "gs_echo: socket: %s\n", describe(api, fd).c_str());
    return fd;
  }
  int one = 1;
  (void)api.setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc = api.bind(fd, reinterpret_cast<sockaddr *>(&sin), sizeof sin);
  if (rc == 0) rc = api.listen(fd, 128);
  if (rc == 0) rc = api.set_nonblocking(fd);
  if (rc < 0) {
    std::fprintf(stderr, "gs_echo: listen on %s:%d: %s\n", addr.c_str(), port, describe(api, rc).c_str());
    api.close(fd);
    return rc;
  }
  sockaddr_in local{};
  socklen_t len = sizeof local;
  *bound_port = api.getsockname(fd, reinterpret_cast<sockaddr *>(&local), &len) == 0 ? ntohs(local.sin_port) : port;
  return fd;
}

// Connections still open, so that a stopping server can wake their threads.
std::mutex g_connections_mu;
std::set<int> g_connections;
std::atomic<int> g_connection_threads{0};

void serve_echo(const SockApi &api, int fd, uint64_t *bytes) {
  std::vector<char> buffer(kEchoBufferBytes);
  for (;;) {
    ssize_t n = api.recv(fd, buffer.data(), buffer.size());
    if (n == -EINTR) continue;
    if (n <= 0 || send_all(api, fd, buffer.data(), static_cast<size_t>(n)) < 0) return;
    *bytes += static_cast<uint64_t>(n);
  }
}

// Sink protocol: 8-byte little-endian length L, L bytes, answered by the same 8 bytes.
void serve_sink(const SockApi &api, int fd, uint64_t *bytes) {
  std::vector<char> scratch(kSinkScratchBytes);
  unsigned char header[8];
  while (recv_all(api, fd, header, sizeof header) == sizeof header) {
    uint64_t left = 0;
    for (int i = 7; i >= 0; --i) left = (left << 8) | header[i];
    while (left > 0) {
      ssize_t n = api.recv(fd, scratch.data(), static_cast<size_t>(std::min<uint64_t>(left, scratch.size())));
      if (n == -EINTR) continue;
      if (n <= 0) return;
      left -= static_cast<uint64_t>(n);
      *bytes += static_cast<uint64_t>(n);
    }
    if (send_all(api, fd, header, sizeof header) < 0) return;
  }
}

void serve_connection(const SockApi &api, int fd, bool sink) {
  uint64_t bytes = 0;
  if (sink) serve_sink(api, fd, &bytes);
  else serve_echo(api, fd, &bytes);
  std::printf("gs_echo server: %s connection closed after %llu bytes\n", sink ? "sink" : "echo",
              static_cast<unsigned long long>(bytes));
  std::fflush(stdout);
  {
    std::lock_guard<std::mutex> lock(g_connections_mu);
    g_connections.erase(fd);
    api.close(fd);
  }
  --g_connection_threads;
}

int run_server(const Options &options) {
  std::string label;
  const SockApi &api = select_api(options, &label);
  install_signal_handlers();

  int echo_port = 0;
  int sink_port = 0;
  int echo_fd = open_listener(api, options.addr, options.port, &echo_port);
  if (echo_fd < 0) return 1;
  int sink_fd = -1;
  if (options.sink_port > 0) {
    sink_fd = open_listener(api, options.addr, options.sink_port, &sink_port);
    if (sink_fd < 0) return 1;
  }
  // bench_wire and scripts/demo wait for this line.
  std::printf("gs_echo server: %s, listening: echo on %s:%d, sink on %s:%d\n", label.c_str(), options.addr.c_str(),
              echo_port, options.addr.c_str(), sink_port);
  std::fflush(stdout);

  std::vector<pollfd> fds = {{echo_fd, POLLIN, 0}};
  if (sink_fd >= 0) fds.push_back({sink_fd, POLLIN, 0});
  while (!g_stop) {
    // A timeout so that SIGTERM is noticed even if gs_poll restarts on EINTR.
    int ready = api.poll(fds.data(), fds.size(), 200);
    if (ready == -EINTR || ready == 0) continue;
    if (ready < 0) {
      std::fprintf(stderr, "gs_echo: poll: %s\n", describe(api, ready).c_str());
      break;
    }
    for (const pollfd &listener : fds) {
      if (listener.revents == 0) continue;
      bool sink = listener.fd == sink_fd;
      for (;;) {
        int fd = api.accept(listener.fd, nullptr, nullptr);
        if (fd == -EAGAIN || fd == -EWOULDBLOCK || fd == -EINTR) break;
        if (fd < 0) {
          std::fprintf(stderr, "gs_echo: accept: %s\n", describe(api, fd).c_str());
          break;
        }
        set_nodelay(api, fd);
        std::printf("gs_echo server: %s connection accepted\n", sink ? "sink" : "echo");
        std::fflush(stdout);
        {
          std::lock_guard<std::mutex> lock(g_connections_mu);
          g_connections.insert(fd);
        }
        ++g_connection_threads;
        std::thread([&api, fd, sink] { serve_connection(api, fd, sink); }).detach();
      }
    }
  }
  if (sink_fd >= 0) api.close(sink_fd);
  api.close(echo_fd);
  // Wake the connection threads (their blocking calls return 0) and give them
  // a moment to finish; what still hangs goes with the process.
  {
    std::lock_guard<std::mutex> lock(g_connections_mu);
    for (int fd : g_connections) api.shutdown(fd, SHUT_RDWR);
  }
  for (int i = 0; i < 100 && g_connection_threads > 0; ++i) usleep(10 * 1000);
  if (g_connection_threads > 0) std::_Exit(0);
  return 0;
}

// ---------------------------------------------------------------------------
// Client side: blocking sockets.

int connect_to(const SockApi &api, const std::string &addr, int port, double timeout_s, std::string *error) {
  sockaddr_in sin;
  if (!resolve(addr, port, &sin)) {
    *error = "cannot resolve " + addr;
    return -EINVAL;
  }
  // The server may still be starting: retry refused connections for a while.
  auto start = Clock::now();
  for (;;) {
    int fd = api.socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
      *error = "socket: " + describe(api, fd);
      return fd;
    }
    int rc = api.connect(fd, reinterpret_cast<sockaddr *>(&sin), sizeof sin);
    if (rc == 0) {
      set_nodelay(api, fd);
      return fd;
    }
    *error = "connect to " + addr + ":" + std::to_string(port) + ": " + describe(api, rc);
    api.close(fd);
    bool retry = rc == -ECONNREFUSED || rc == -ETIMEDOUT || rc == -ECONNRESET || rc == -EAGAIN;
    if (!retry || seconds_since(start) > timeout_s) return rc;
    usleep(100 * 1000);
  }
}

// One echo round trip of `size` bytes; returns 0 or a negated errno.
long round_trip(const SockApi &api, int fd, char *out, char *in, size_t size) {
  long rc = send_all(api, fd, out, size);
  if (rc >= 0) rc = recv_all(api, fd, in, size);
  return rc < 0 ? rc : 0;
}

constexpr uint64_t kBurstBytes = 16ull << 20;

// One sink burst: header, `count` writes of `size` bytes, wait for the ack.
long sink_burst(const SockApi &api, int fd, const char *data, size_t size, uint64_t count) {
  uint64_t total = size * count;
  unsigned char header[8];
  for (int i = 0; i < 8; ++i) header[i] = static_cast<unsigned char>(total >> (8 * i));
  long rc = send_all(api, fd, header, sizeof header);
  for (uint64_t i = 0; rc >= 0 && i < count; ++i) rc = send_all(api, fd, data, size);
  unsigned char ack[8];
  if (rc >= 0) rc = recv_all(api, fd, ack, sizeof ack);
  if (rc >= 0 && std::memcmp(ack, header, 8) != 0) rc = -EPROTO;
  return rc < 0 ? rc : 0;
}

uint64_t burst_count(size_t size) { return std::max<uint64_t>(1, kBurstBytes / size); }

// Streams `total` bytes through an echo connection in writes of `size`,
// receiving the echo at the same time (poll), so that a server with small
// buffers (the GPU echo server) cannot deadlock it. Every echoed byte is
// compared with what was sent. `fd` must be non-blocking.
long echo_stream(const SockApi &api, int fd, const char *data, size_t size, uint64_t total, char *in) {
  uint64_t sent = 0, got = 0;
  size_t off = 0;  // into the current write of `size` bytes
  auto last_progress = Clock::now();
  while (got < total) {
    pollfd pfd{fd, static_cast<short>(POLLIN | (sent < total ? POLLOUT : 0)), 0};
    int n = api.poll(&pfd, 1, 1000);
    if (n < 0 && n != -EINTR) return n;
    if (seconds_since(last_progress) > 30) return -ETIMEDOUT;
    if (g_stop) return -EINTR;
    if ((pfd.revents & POLLOUT) && sent < total) {
      size_t want = static_cast<size_t>(std::min<uint64_t>(size - off, total - sent));
      ssize_t k = api.send(fd, data + off, want);
      if (k > 0) {
        sent += static_cast<uint64_t>(k);
        off = (off + static_cast<size_t>(k)) % size;
        last_progress = Clock::now();
      } else if (k < 0 && k != -EAGAIN && k != -EINTR) {
        return k;
      }
    }
    if (pfd.revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t k = api.recv(fd, in, size);
      if (k == 0) return -ECONNRESET;
      if (k < 0 && k != -EAGAIN && k != -EINTR) return k;
      if (k > 0) {
        // The stream is `data` repeated: byte i of the stream is data[i % size].
        for (ssize_t i = 0; i < k; ++i)
          if (in[i] != data[(got + static_cast<uint64_t>(i)) % size]) return -EPROTO;
        got += static_cast<uint64_t>(k);
        last_progress = Clock::now();
      }
    }
  }
  return 0;
}

double percentile(std::vector<double> &samples, double fraction) {
  if (samples.empty()) return 0;
  size_t index = std::min(samples.size() - 1, static_cast<size_t>(fraction * static_cast<double>(samples.size())));
  std::nth_element(samples.begin(), samples.begin() + static_cast<long>(index), samples.end());
  return samples[index];
}

std::string size_name(size_t size) {
  if (size >= (1u << 20) && size % (1u << 20) == 0) return std::to_string(size >> 20) + " MiB";
  if (size >= 1024 && size % 1024 == 0) return std::to_string(size >> 10) + " KiB";
  return std::to_string(size) + " B";
}

void print_rtt(const char *when, size_t size, std::vector<double> &samples_us) {
  size_t count = samples_us.size();
  double p99 = percentile(samples_us, 0.99);
  double median = percentile(samples_us, 0.5);
  std::printf("rtt %-8s %-5s median %8.2f us   p99 %8.2f us   %9zu round trips\n", size_name(size).c_str(), when,
              median, p99, count);
  std::fflush(stdout);
}

void print_bw(const char *when, size_t size, double bytes, double seconds) {
  double rate = seconds > 0 ? bytes / seconds : 0;
  std::printf("bw  %-8s %-5s %8.3f GB/s  (%6.2f Gbit/s)  %8.1f MiB in %.2f s\n", size_name(size).c_str(), when,
              rate / 1e9, rate * 8 / 1e9, bytes / (1 << 20), seconds);
  std::fflush(stdout);
}

int run_client(const Options &options) {
  std::string label;
  const SockApi &api = select_api(options, &label);
  install_signal_handlers();
  std::string error;
  int fd = connect_to(api, options.addr, options.port, 10, &error);
  if (fd < 0) {
    std::fprintf(stderr, "gs_echo client: %s\n", error.c_str());
    return 1;
  }
  int sink_fd = -1;
  if (options.sink_port > 0) {
    sink_fd = connect_to(api, options.addr, options.sink_port, 10, &error);
    if (sink_fd < 0) {
      std::fprintf(stderr, "gs_echo client: %s\n", error.c_str());
      return 1;
    }
  }
  // Half the time for round trips, the rest shared by the bandwidth sizes.
  // Without a sink port (a plain echo server, e.g. the GPU echo server),
  // bandwidth streams through the echo connection and counts both ways.
  bool echo_bw = sink_fd < 0;
  bool with_bw = !options.sizes.empty();
  double rtt_seconds = with_bw ? options.seconds / 2 : options.seconds;
  double bw_seconds = with_bw ? options.seconds / 2 / static_cast<double>(options.sizes.size()) : 0;
  std::printf("gs_echo client: %s, server %s echo port %d, sink port %d\n", label.c_str(), options.addr.c_str(),
              options.port, options.sink_port);

  std::vector<char> out(std::max<size_t>(options.rtt_size, 1), 'x');
  std::vector<char> in(out.size());
  std::vector<double> all_us;
  std::vector<double> interval_us;
  auto start = Clock::now();
  auto interval_start = start;
  int status = 0;
  while (!g_stop && seconds_since(start) < rtt_seconds) {
    auto t0 = Clock::now();
    long rc = round_trip(api, fd, out.data(), in.data(), options.rtt_size);
    auto t1 = Clock::now();
    if (rc < 0) {
      std::fprintf(stderr, "gs_echo client: round trip: %s\n", describe(api, rc).c_str());
      status = 1;
      break;
    }
    if (std::memcmp(out.data(), in.data(), options.rtt_size) != 0) {
      std::fprintf(stderr, "gs_echo client: echoed bytes differ\n");
      status = 1;
      break;
    }
    double us = std::chrono::duration<double, std::micro>(t1 - t0).count();
    all_us.push_back(us);
    interval_us.push_back(us);
    if (seconds_since(interval_start) >= 1.0) {
      char when[16];
      std::snprintf(when, sizeof when, "t=%.0fs", seconds_since(start));
      print_rtt(when, options.rtt_size, interval_us);
      interval_us.clear();
      interval_start = Clock::now();
    }
  }
  if (status == 0 && !all_us.empty()) print_rtt("total", options.rtt_size, all_us);

  std::vector<char> data(options.sizes.empty() ? 1 : *std::max_element(options.sizes.begin(), options.sizes.end()),
                         'y');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 131 + i / 251) & 0xff);
  std::vector<char> echo_in(echo_bw ? data.size() : 0);
  if (echo_bw && with_bw && status == 0) {
    int rc = api.set_nonblocking(fd);
    if (rc < 0) {
      std::fprintf(stderr, "gs_echo client: non-blocking: %s\n", describe(api, rc).c_str());
      status = 1;
    } else {
      std::printf(
          "bandwidth: through the echo connection (no sink port), bytes counted both ways, every byte checked\n");
    }
  }
  for (size_t size : with_bw &&status == 0 ? options.sizes : std::vector<size_t>{}) {
    uint64_t count = burst_count(size);
    // Echo bursts are shorter (the echo doubles the bytes on the wire) and
    // count both directions.
    const uint64_t echo_count = std::min<uint64_t>(count, 64);
    if (echo_bw) count = echo_count * 2;
    double total_bytes = 0;
    double interval_bytes = 0;
    auto bw_start = Clock::now();
    auto bw_interval = bw_start;
    while (!g_stop && seconds_since(bw_start) < bw_seconds) {
      long rc = echo_bw ? echo_stream(api, fd, data.data(), size, size * echo_count, echo_in.data())
                        : sink_burst(api, sink_fd, data.data(), size, count);
      if (rc < 0) {
        std::fprintf(stderr, "gs_echo client: streaming %s: %s\n", size_name(size).c_str(), describe(api, rc).c_str());
        status = 1;
        break;
      }
      total_bytes += static_cast<double>(size * count);
      interval_bytes += static_cast<double>(size * count);
      double interval_s = seconds_since(bw_interval);
      if (interval_s >= 1.0) {
        char when[16];
        std::snprintf(when, sizeof when, "t=%.0fs", seconds_since(bw_start));
        print_bw(when, size, interval_bytes, interval_s);
        interval_bytes = 0;
        bw_interval = Clock::now();
      }
    }
    if (status != 0) break;
    print_bw("total", size, total_bytes, seconds_since(bw_start));
  }
  if (sink_fd >= 0) api.close(sink_fd);
  api.close(fd);
  return status;
}

// bench_wire's remote hands: commands on stdin, answers on stdout.
int run_drive(const Options &options) {
  std::string label;
  const SockApi &api = select_api(options, &label);
  signal(SIGPIPE, SIG_IGN);
  std::string error;
  int fd = connect_to(api, options.addr, options.port, 10, &error);
  int sink_fd = -1;
  if (fd >= 0 && options.sink_port > 0) sink_fd = connect_to(api, options.addr, options.sink_port, 10, &error);
  if (fd < 0 || (options.sink_port > 0 && sink_fd < 0)) {
    std::printf("error %s\n", error.c_str());
    std::fflush(stdout);
    return 1;
  }
  std::printf("ready %s\n", label.c_str());
  std::fflush(stdout);

  std::vector<char> out;
  std::vector<char> in;
  char line[256];
  while (std::fgets(line, sizeof line, stdin) != nullptr) {
    char command[16] = {};
    unsigned long long size = 0;
    unsigned long long count = 0;
    if (std::sscanf(line, "%15s %llu %llu", command, &size, &count) != 3 || size == 0 || count == 0) {
      std::printf("error bad command\n");
      std::fflush(stdout);
      continue;
    }
    if (out.size() < size) {
      out.assign(size, 'x');
      in.resize(size);
    }
    long rc = 0;
    auto t0 = Clock::now();
    if (std::strcmp(command, "rtt") == 0) {
      for (unsigned long long i = 0; rc == 0 && i < count; ++i) rc = round_trip(api, fd, out.data(), in.data(), size);
    } else if (std::strcmp(command, "bw") == 0 && sink_fd >= 0) {
      rc = sink_burst(api, sink_fd, out.data(), size, count);
    } else {
      rc = -EINVAL;
    }
    auto t1 = Clock::now();
    if (rc < 0) std::printf("error %s\n", describe(api, rc).c_str());
    else
      std::printf("ok %lld\n",
                  static_cast<long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
    std::fflush(stdout);
  }
  if (sink_fd >= 0) api.close(sink_fd);
  api.close(fd);
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  Options options = parse_options(argc, argv);
  if (options.mode == "server") return run_server(options);
  if (options.mode == "client") return run_client(options);
  return run_drive(options);
}
