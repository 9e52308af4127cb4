// bench_wire: gpusock against its baselines, side by side in one run.
//
//   rtt/gpusock_tcp/64, rtt/gpusock_shm/64    64 B echo round trip over gpusock
//   bw/gpusock_{tcp,shm}/{64K,256K,1M}        one-way streaming, acked per 16 MiB
//   bw/gpusock_{tcp,shm}_copy/...             the same with zero-copy sends off
//                                             (GPUSOCK_ZCOPY=0): the copy path
//   rtt/kernel_tcp/64, bw/kernel_tcp/...      the same over kernel TCP loopback
//   rtt/raw_{tcp,shm}/64                      64 B write-with-immediate ping-pong
//   bw/raw_{tcp,shm}/...                      streaming writes with immediate
//
// Socket benchmarks: a `gs_echo server` process and a `gs_echo drive` process
// (its client, commanded over a pipe) are posix_spawn'ed per transport; the
// client reports how long each batch took (manual time). gpusock reads its
// transport once per process, so each transport needs its own client process
// anyway, and keeping gs_ calls out of this process means no libfabric state
// exists here when it spawns.
//
// Raw benchmarks use the transport interface (wire/transport.h) directly: this
// process is the client, `bench_wire --raw-server SPEC PORT` the responder. The
// raw bandwidth is the baseline for gpusock's bandwidth target.
//
// Only one transport's peers run at a time, so idle servers never compete for
// the CPUs with the benchmark being measured. Numbers are reported, never judged.
#include "test-support/peer_process.h"
#include "test-support/sockets.h"
#include "test-support/timing.h"
#include "wire/transport.h"

#include <benchmark/benchmark.h>

#include <netinet/in.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace gpusock::test;  // Clock, Deadline, free_port, loopback, PeerProcess, sibling_binary
using gpusock::wire::CmEvent;
using gpusock::wire::CmEventKind;
using gpusock::wire::Completion;
using gpusock::wire::CompletionKind;
using gpusock::wire::ConnectionRequest;
using gpusock::wire::Domain;
using gpusock::wire::Endpoint;
using gpusock::wire::Listener;
using gpusock::wire::MemoryRegion;
using gpusock::wire::WriteRequest;

constexpr uint64_t kBurstBytes = 16ull << 20;   // bandwidth: bytes per acknowledged batch
constexpr uint64_t kRoundTripsPerBatch = 1000;  // socket rtt: round trips per drive command
constexpr double kStartTimeoutS = 20;

uint64_t writes_per_burst(size_t size) { return std::max<uint64_t>(1, kBurstBytes / size); }

// ---------------------------------------------------------------------------
// Child processes

std::string gs_echo_path() {
  const char *env = std::getenv("GS_ECHO");
  return env != nullptr && *env != '\0' ? env : sibling_binary("gs_echo");
}

// Children get this long to leave by themselves (a drive does on EOF of its
// stdin) before SIGTERM.
constexpr int kChildGraceMs = 200;

void release_ports(std::vector<int> *holders) {
  for (int fd : *holders) close(fd);
  holders->clear();
}

// ---------------------------------------------------------------------------
// Peers: whatever the current benchmark talks to. At most one lives at a time.

class Peer {
 public:
  virtual ~Peer() = default;
};

std::string g_peer_key;
std::unique_ptr<Peer> g_peer;
std::map<std::string, std::string> g_peer_failures;  // key -> why it could not start

void release_peer() {
  g_peer.reset();
  g_peer_key.clear();
}

// gs_echo server + gs_echo drive for one transport ("kernel" included).
class SocketPeer : public Peer {
 public:
  ~SocketPeer() override {
    drive_.stop(kChildGraceMs);
    server_.stop(kChildGraceMs);
  }

  // "T+copy": transport T with zero-copy sends off in both processes.
  bool start(const std::string &spec, std::string *error) {
    const bool copy = spec.size() > 5 && spec.compare(spec.size() - 5, 5, "+copy") == 0;
    const std::string transport = copy ? spec.substr(0, spec.size() - 5) : spec;
    if (copy) setenv("GPUSOCK_ZCOPY", "0", 1);  // posix_spawn passes environ on
    const bool ok = start_processes(transport, error);
    if (copy) unsetenv("GPUSOCK_ZCOPY");
    return ok;
  }

 private:
  bool start_processes(const std::string &transport, std::string *error) {
    std::vector<int> holders;
    int echo_port = free_port(&holders);
    int sink_port = free_port(&holders);
    release_ports(&holders);
    std::string exe = gs_echo_path();
    std::vector<std::string> common = {"--transport", transport,
                                       "--addr",      "127.0.0.1",
                                       "--port",      std::to_string(echo_port),
                                       "--sink-port", std::to_string(sink_port)};
    std::vector<std::string> server_args = {"server"};
    server_args.insert(server_args.end(), common.begin(), common.end());
    if (!server_.spawn(exe, server_args, {.out = true}, error)) return false;
    std::string line;
    while (line.find("listening") == std::string::npos) {
      if (!server_.read_line(&line, kStartTimeoutS)) {
        *error = "gs_echo server (" + transport + ") did not start; see its stderr";
        return false;
      }
    }
    // Its later chatter goes to a closed pipe, which it ignores.
    server_.close_stdout();

    std::vector<std::string> drive_args = {"drive"};
    drive_args.insert(drive_args.end(), common.begin(), common.end());
    if (!drive_.spawn(exe, drive_args, {.in = true, .out = true}, error)) return false;
    if (!drive_.read_line(&line, kStartTimeoutS) || line.rfind("ready", 0) != 0) {
      *error = "gs_echo drive (" + transport + "): " + (line.empty() ? "no answer" : line);
      return false;
    }
    return true;
  }

 public:
  // Runs one command; *ns is how long the drive measured it.
  bool command(const std::string &text, long long *ns, std::string *error) {
    std::string line = text + "\n";
    if (write(drive_.stdin_fd(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      *error = "gs_echo drive went away";
      return false;
    }
    if (!drive_.read_line(&line, 300)) {
      *error = "gs_echo drive did not answer \"" + text + "\"";
      return false;
    }
    if (line.rfind("ok ", 0) != 0) {
      *error = "gs_echo drive: " + line;
      return false;
    }
    *ns = std::atoll(line.c_str() + 3);
    return true;
  }

 private:
  PeerProcess server_;
  PeerProcess drive_;
};

template <typename PeerType>
PeerType *acquire_peer(const std::string &key, const std::string &arg, std::string *error) {
  if (g_peer_key == key) return static_cast<PeerType *>(g_peer.get());
  release_peer();
  auto failed = g_peer_failures.find(key);
  if (failed != g_peer_failures.end()) {
    *error = failed->second;
    return nullptr;
  }
  auto peer = std::make_unique<PeerType>();
  if (!peer->start(arg, error)) {
    g_peer_failures[key] = *error;
    return nullptr;
  }
  g_peer_key = key;
  g_peer = std::move(peer);
  return static_cast<PeerType *>(g_peer.get());
}

// ---------------------------------------------------------------------------
// Raw transport: write-with-immediate ping-pong and streaming.

// Exchanged as connection private data: where the peer may write.
struct RawRecord {
  uint64_t addr;
  uint32_t rkey;
  uint32_t length;
};

// imm bit 31: "reply with a write of (imm & 0xffff) bytes". Every data write
// carries an immediate, as rsocket's do.
constexpr uint32_t kReplyFlag = 1u << 31;
constexpr uint32_t kReplyLengthMask = 0xffff;
constexpr size_t kRawSinkBytes = 1 << 20;
constexpr size_t kRawReplyBytes = 4096;
constexpr uint32_t kServerRecvDepth = 512;  // > writes_per_burst(64 KiB) = 256
constexpr uint32_t kClientRecvDepth = 64;
constexpr int kMaxOutstanding = 64;

std::string status_text(int status) { return std::strerror(-status); }

volatile sig_atomic_t g_raw_server_stop = 0;

// `bench_wire --raw-server SPEC PORT`: accepts connections and answers writes
// whose immediate asks for a reply. Runs until SIGTERM.
int run_raw_server(const std::string &spec, int port) {
  signal(SIGTERM, [](int) { g_raw_server_stop = 1; });
  signal(SIGINT, [](int) { g_raw_server_stop = 1; });
  signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<Domain> domain;
  std::string error;
  int rc = gpusock::wire::open_domain(spec, &domain, &error);
  if (rc < 0) {
    std::printf("error open_domain(%s): %s %s\n", spec.c_str(), status_text(rc).c_str(), error.c_str());
    return 1;
  }
  std::unique_ptr<Listener> listener;
  sockaddr_in sin = loopback(port);
  rc = domain->listen(reinterpret_cast<sockaddr *>(&sin), sizeof sin, 16, &listener);
  if (rc < 0) {
    std::printf("error listen(%s, port %d): %s\n", spec.c_str(), port, status_text(rc).c_str());
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);

  struct Conn {
    std::unique_ptr<ConnectionRequest> request;  // kept until established
    std::unique_ptr<Endpoint> ep;
    std::vector<char> sink_mem = std::vector<char>(kRawSinkBytes);
    std::vector<char> reply_mem = std::vector<char>(kRawReplyBytes, 'r');
    MemoryRegion sink{}, reply{};
    RawRecord peer{};
    bool established = false;
    bool recvs_posted = false;
    bool dead = false;
    std::vector<uint32_t> replies;  // reply lengths not yet posted
  };
  std::vector<std::unique_ptr<Conn>> conns;
  auto last_activity = Clock::now();
  Completion completions[64];

  // Connection management is checked every 64th pass once connections exist:
  // those calls cost syscalls (liveness checks) the data path should not pay.
  for (uint64_t pass = 0; !g_raw_server_stop; ++pass) {
    bool active = false;
    const bool check_cm = conns.empty() || (pass & 63) == 0;
    std::unique_ptr<ConnectionRequest> request;
    int got = check_cm ? listener->get_request(&request) : 0;
    if (got < 0) {
      std::fprintf(stderr, "bench_wire raw server: get_request: %s\n", status_text(got).c_str());
      return 1;
    }
    if (got == 1) {
      active = true;
      auto c = std::make_unique<Conn>();
      if (request->private_len() < sizeof(RawRecord)) {
        request->reject();
        continue;
      }
      std::memcpy(&c->peer, request->private_data(), sizeof c->peer);
      rc = domain->create_endpoint(request.get(), &c->ep);
      if (rc == 0)
        rc = domain->register_memory(c->sink_mem.data(), c->sink_mem.size(), gpusock::wire::kAccessRemoteWrite,
                                     &c->sink);
      if (rc == 0)
        rc = domain->register_memory(c->reply_mem.data(), c->reply_mem.size(), gpusock::wire::kAccessLocal, &c->reply);
      // Receives go up before accepting so the first write finds one.
      if (rc == 0) c->recvs_posted = c->ep->post_recv(kServerRecvDepth) == 0;
      RawRecord mine{c->sink.remote_addr, c->sink.rkey, static_cast<uint32_t>(kRawSinkBytes)};
      if (rc == 0) rc = domain->accept(c->ep.get(), request.get(), &mine, sizeof mine);
      if (rc < 0) {
        std::fprintf(stderr, "bench_wire raw server: accept: %s\n", status_text(rc).c_str());
        request->reject();
        continue;
      }
      c->request = std::move(request);
      conns.push_back(std::move(c));
    }
    for (auto &c : conns) {
      CmEvent event;
      while ((check_cm || !c->established) && c->ep->poll_cm(&event) == 1) {
        active = true;
        if (event.kind == CmEventKind::kEstablished) {
          c->established = true;
          c->request.reset();
          if (!c->recvs_posted) c->recvs_posted = c->ep->post_recv(kServerRecvDepth) == 0;
        } else if (event.kind != CmEventKind::kNone) {
          c->dead = true;
        }
      }
      if (c->dead) continue;
      int n = c->ep->poll(completions, 64);
      if (n < 0) {
        c->dead = true;
        continue;
      }
      uint32_t consumed = 0;
      for (int i = 0; i < n; ++i) {
        if (completions[i].status < 0) c->dead = true;
        if (completions[i].kind == CompletionKind::kRecvImm) {
          ++consumed;
          if (completions[i].imm & kReplyFlag) c->replies.push_back(completions[i].imm & kReplyLengthMask);
        }
      }
      if (n > 0) active = true;
      if (consumed > 0 && c->ep->post_recv(consumed) < 0) c->dead = true;
      while (!c->dead && !c->replies.empty()) {
        WriteRequest w;
        w.local = c->reply.base;
        w.region = &c->reply;
        w.length = std::min<uint32_t>(c->replies.front(), kRawReplyBytes);
        w.remote_addr = c->peer.addr;
        w.rkey = c->peer.rkey;
        w.imm = 1;
        w.inline_data = w.length <= c->ep->max_inline();
        rc = c->ep->post_write(w);
        if (rc == -EAGAIN) break;  // completions first, then retry
        if (rc < 0) c->dead = true;
        c->replies.erase(c->replies.begin());
      }
    }
    for (auto &c : conns) {
      if (!c->dead) continue;
      c->ep->disconnect();
      if (c->sink.handle != nullptr) domain->deregister_memory(&c->sink);
      if (c->reply.handle != nullptr) domain->deregister_memory(&c->reply);
      c->ep.reset();
    }
    conns.erase(std::remove_if(conns.begin(), conns.end(), [](const auto &c) { return c->ep == nullptr; }),
                conns.end());
    // Spin while busy; back off when idle so the machine is free for others.
    if (active) {
      last_activity = Clock::now();
    } else if (Clock::now() - last_activity > std::chrono::milliseconds(2)) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  for (auto &c : conns) {
    c->ep->disconnect();
    if (c->sink.handle != nullptr) domain->deregister_memory(&c->sink);
    if (c->reply.handle != nullptr) domain->deregister_memory(&c->reply);
  }
  return 0;
}

// The client half, in this process, against a spawned raw server.
class RawPeer : public Peer {
 public:
  ~RawPeer() override {
    if (ep_) ep_->disconnect();
    ep_.reset();
    if (domain_) {
      if (src_.handle != nullptr) domain_->deregister_memory(&src_);
      if (dst_.handle != nullptr) domain_->deregister_memory(&dst_);
    }
    domain_.reset();
    server_.stop(kChildGraceMs);
  }

  bool start(const std::string &spec, std::string *error) {
    std::vector<int> holders;
    int port = free_port(&holders);
    release_ports(&holders);
    // Spawn first: nothing of libfabric is touched here before the child exists.
    if (!server_.spawn(sibling_binary("bench_wire"), {"--raw-server", spec, std::to_string(port)}, {.out = true},
                       error))
      return false;
    std::string line;
    if (!server_.read_line(&line, kStartTimeoutS) || line != "ready") {
      *error = "raw server (" + spec + "): " + (line.empty() ? "no answer" : line);
      return false;
    }
    int rc = gpusock::wire::open_domain(spec, &domain_, error);
    if (rc < 0) {
      *error = "open_domain(" + spec + "): " + status_text(rc) + " " + *error;
      return false;
    }
    if (domain_->caps().max_private_data < sizeof(RawRecord)) {
      *error = spec + " carries too little private data for the raw benchmark";
      return false;
    }
    src_mem_.assign(kRawSinkBytes, 's');
    dst_mem_.assign(kRawReplyBytes, 0);
    rc = domain_->create_endpoint(nullptr, &ep_);
    if (rc == 0) rc = domain_->register_memory(src_mem_.data(), src_mem_.size(), gpusock::wire::kAccessLocal, &src_);
    if (rc == 0)
      rc = domain_->register_memory(dst_mem_.data(), dst_mem_.size(), gpusock::wire::kAccessRemoteWrite, &dst_);
    if (rc == 0) rc = ep_->post_recv(kClientRecvDepth);
    RawRecord mine{dst_.remote_addr, dst_.rkey, static_cast<uint32_t>(kRawReplyBytes)};
    sockaddr_in sin = loopback(port);
    if (rc == 0) rc = ep_->connect(reinterpret_cast<sockaddr *>(&sin), sizeof sin, &mine, sizeof mine);
    if (rc < 0) {
      *error = "raw client (" + spec + "): " + status_text(rc);
      return false;
    }
    const Deadline deadline(kStartTimeoutS);
    for (;;) {
      CmEvent event;
      if (ep_->poll_cm(&event) == 1) {
        if (event.kind == CmEventKind::kEstablished && event.peer_private_len >= sizeof(RawRecord)) {
          std::memcpy(&server_record_, event.peer_private_data, sizeof server_record_);
          break;
        }
        if (event.kind != CmEventKind::kNone) {
          *error = "raw client (" + spec + "): connection failed: " + status_text(event.status);
          return false;
        }
      }
      if (deadline.passed()) {
        *error = "raw client (" + spec + "): connect timed out";
        return false;
      }
    }
    return true;
  }

  // Posts one write of `length` bytes; *error set and false on failure.
  bool write(uint32_t length, uint32_t imm, std::string *error) {
    WriteRequest w;
    w.local = src_.base;
    w.region = &src_;
    w.length = length;
    w.remote_addr = server_record_.addr;
    w.rkey = server_record_.rkey;
    w.imm = imm;
    w.inline_data = length <= ep_->max_inline();
    while (outstanding_ >= kMaxOutstanding) {
      if (!progress(error)) return false;
    }
    for (;;) {
      int rc = ep_->post_write(w);
      if (rc == 0) break;
      if (rc != -EAGAIN) {
        *error = "post_write: " + status_text(rc);
        return false;
      }
      if (!progress(error)) return false;
    }
    ++outstanding_;
    return true;
  }

  // Waits until one more reply than `seen` has arrived.
  bool wait_reply(uint64_t seen, std::string *error) {
    const Deadline deadline(30);
    for (uint64_t spins = 0; replies_ <= seen; ++spins) {
      if (!progress(error)) return false;
      if ((spins & 1023) == 1023 && deadline.passed()) {
        *error = "no reply from the raw server in 30 s";
        return false;
      }
    }
    return true;
  }

  uint64_t replies() const { return replies_; }

 private:
  bool progress(std::string *error) {
    int n = ep_->poll(completions_, 64);
    if (n < 0) {
      *error = "poll: " + status_text(n);
      return false;
    }
    uint32_t consumed = 0;
    for (int i = 0; i < n; ++i) {
      if (completions_[i].status < 0) {
        *error = "completion: " + status_text(completions_[i].status);
        return false;
      }
      if (completions_[i].kind == CompletionKind::kWriteDone) --outstanding_;
      else {
        ++consumed;
        ++replies_;
      }
    }
    if (consumed > 0) {
      int rc = ep_->post_recv(consumed);
      if (rc < 0) {
        *error = "post_recv: " + status_text(rc);
        return false;
      }
    }
    return true;
  }

  PeerProcess server_;
  std::unique_ptr<Domain> domain_;
  std::unique_ptr<Endpoint> ep_;
  std::vector<char> src_mem_, dst_mem_;
  MemoryRegion src_{}, dst_{};
  RawRecord server_record_{};
  Completion completions_[64];
  int outstanding_ = 0;
  uint64_t replies_ = 0;
};

// ---------------------------------------------------------------------------
// Benchmarks

void set_rtt_counters(benchmark::State &state, uint64_t round_trips) {
  state.SetItemsProcessed(static_cast<int64_t>(round_trips));
  // Seconds per round trip (the inverse of round trips per second).
  state.counters["rtt"] =
      benchmark::Counter(static_cast<double>(round_trips), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// Every iteration moved `count` messages of `size` bytes.
void set_bandwidth_counters(benchmark::State &state, uint64_t count, size_t size) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * count * size));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * count));
}

// The benchmark's peer, or nullptr with the benchmark skipped.
template <typename PeerType>
PeerType *peer_or_skip(benchmark::State &state, const std::string &key, const std::string &arg) {
  std::string error;
  auto *peer = acquire_peer<PeerType>(key, arg, &error);
  if (peer == nullptr) state.SkipWithError(error.c_str());
  return peer;
}

// One drive command per iteration, timed by the drive (manual time).
void time_drive_command(benchmark::State &state, SocketPeer *peer, const std::string &command) {
  std::string error;
  for (auto _ : state) {
    long long ns = 0;
    if (!peer->command(command, &ns, &error)) {
      state.SkipWithError(error.c_str());
      break;
    }
    state.SetIterationTime(static_cast<double>(ns) * 1e-9);
  }
}

void BM_SocketRtt(benchmark::State &state, const std::string &transport) {
  const size_t size = static_cast<size_t>(state.range(0));
  auto *peer = peer_or_skip<SocketPeer>(state, "socket " + transport, transport);
  if (peer == nullptr) return;
  time_drive_command(state, peer, "rtt " + std::to_string(size) + " " + std::to_string(kRoundTripsPerBatch));
  set_rtt_counters(state, static_cast<uint64_t>(state.iterations()) * kRoundTripsPerBatch);
  state.SetLabel(transport);
}

void BM_SocketBandwidth(benchmark::State &state, const std::string &transport) {
  const size_t size = static_cast<size_t>(state.range(0));
  auto *peer = peer_or_skip<SocketPeer>(state, "socket " + transport, transport);
  if (peer == nullptr) return;
  const uint64_t count = writes_per_burst(size);
  time_drive_command(state, peer, "bw " + std::to_string(size) + " " + std::to_string(count));
  set_bandwidth_counters(state, count, size);
  state.SetLabel(transport);
}

void BM_RawRtt(benchmark::State &state, const std::string &spec) {
  const auto size = static_cast<uint32_t>(state.range(0));
  auto *peer = peer_or_skip<RawPeer>(state, "raw " + spec, spec);
  if (peer == nullptr) return;
  std::string error;
  for (auto _ : state) {
    uint64_t seen = peer->replies();
    if (!peer->write(size, kReplyFlag | size, &error) || !peer->wait_reply(seen, &error)) {
      state.SkipWithError(error.c_str());
      break;
    }
  }
  set_rtt_counters(state, static_cast<uint64_t>(state.iterations()));
  state.SetLabel(spec);
}

void BM_RawBandwidth(benchmark::State &state, const std::string &spec) {
  const auto size = static_cast<uint32_t>(state.range(0));
  auto *peer = peer_or_skip<RawPeer>(state, "raw " + spec, spec);
  if (peer == nullptr) return;
  std::string error;
  const uint64_t count = writes_per_burst(size);
  for (auto _ : state) {
    uint64_t seen = peer->replies();
    bool ok = true;
    // Same shape as the socket sink: a burst, then one acknowledgement.
    for (uint64_t i = 0; ok && i < count; ++i) ok = peer->write(size, i + 1 == count ? kReplyFlag : 0, &error);
    if (!ok || !peer->wait_reply(seen, &error)) {
      state.SkipWithError(error.c_str());
      break;
    }
  }
  set_bandwidth_counters(state, count, size);
  state.SetLabel(spec);
}

// Grouped per transport: peers are started once per group and stopped after it.
void register_benchmarks() {
  const std::vector<int64_t> sizes = {64 << 10, 256 << 10, 1 << 20};
  struct Group {
    const char *name;
    const char *transport;
  };
  const Group socket_groups[] = {{"gpusock_tcp", "fabric:tcp"}, {"gpusock_shm", "fabric:shm"}};
  const Group raw_groups[] = {{"raw_tcp", "fabric:tcp"}, {"raw_shm", "fabric:shm"}};
  const Group copy_groups[] = {{"gpusock_tcp_copy", "fabric:tcp+copy"}, {"gpusock_shm_copy", "fabric:shm+copy"}};
  auto socket_group = [&](const Group &g, bool rtt = true) {
    std::string t = g.transport;
    if (rtt)
      benchmark::RegisterBenchmark((std::string("rtt/") + g.name).c_str(),
                                   [t](benchmark::State &s) { BM_SocketRtt(s, t); })
          ->Arg(64)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
    for (int64_t size : sizes)
      benchmark::RegisterBenchmark((std::string("bw/") + g.name).c_str(),
                                   [t](benchmark::State &s) { BM_SocketBandwidth(s, t); })
          ->Arg(size)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
  };
  auto raw_group = [&](const Group &g) {
    std::string t = g.transport;
    benchmark::RegisterBenchmark((std::string("rtt/") + g.name).c_str(), [t](benchmark::State &s) { BM_RawRtt(s, t); })
        ->Arg(64)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    for (int64_t size : sizes)
      benchmark::RegisterBenchmark((std::string("bw/") + g.name).c_str(),
                                   [t](benchmark::State &s) { BM_RawBandwidth(s, t); })
          ->Arg(size)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
  };
  for (int i = 0; i < 2; ++i) {
    socket_group(socket_groups[i]);
    socket_group(copy_groups[i], false);  // zero-copy off, right after it on
    raw_group(raw_groups[i]);
  }
  socket_group({"kernel_tcp", "kernel"});
}

}  // namespace

int main(int argc, char **argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--raw-server") == 0) {
    if (argc != 4) {
      std::fprintf(stderr, "usage: bench_wire --raw-server SPEC PORT\n");
      return 2;
    }
    return run_raw_server(argv[2], std::atoi(argv[3]));
  }
  signal(SIGPIPE, SIG_IGN);  // a dead drive is an error return, not a crash
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  release_peer();
  benchmark::Shutdown();
  return 0;
}
