// gpu_link: one end of a GPU-to-GPU link (a stream whose every byte is
// checked, or a ping-pong), run as a kernel on one GPU of this process, or
// both ends in one process on two GPUs, or, with --cpu, the same bytes on
// gpusock's CPU sockets (gs_*): the CPU-to-CPU baseline on the same transport;
// or the same bytes copied by the CUDA runtime between two GPUs of this
// process, no socket at all: the link's ceiling (gpu_link_copy.cuh).
//
//   gpu_link [options] recv PORT     listen, take one stream, check it, answer
//   gpu_link [options] send PORT     connect, send --bytes, read the answer
//   gpu_link [options] pong PORT     listen, send back --rounds messages
//   gpu_link [options] ping PORT     connect, --rounds round trips of --size bytes
//   gpu_link [options] pair-stream PORT | pair-ping PORT
//                                    both ends in this process: GPU 0 listens, GPU 1 connects
//   gpu_link [options] copy-stream 0 | copy-ping 0
//                                    cudaMemcpyPeerAsync from --gpu to the next GPU
// options: --bytes N [64 MiB] --window N [1 MiB] --seed N [7] --size N [64]
//          --rounds N [1000] --addr A [127.0.0.1] --gpu I [0] (the CUDA device;
//          pair-*: the first of two, shared when only one exists) --threads N
//          --streams S [1] (streams: S connections at once, one block or CPU
//          thread each, --bytes split among them; both ends must agree)
//          --host-backend --cpu --label L --json FILE (appends one line)
// The transport is GPUSOCK_TRANSPORT's. Prints one "gpu_link ..." line; exit 0
// when nothing failed and every byte was right.
#include "gpu/bench/gpu_link_copy.cuh"
#include "gpu/bench/gpu_link_kernels.cuh"
#include "test-support/gs_sockets.h"
#include "test-support/timing.h"

#include <arpa/inet.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace gpusock::link {
namespace {

struct Args {
  std::string role;
  int port = 0;
  uint64_t bytes = 64ull << 20, window = 1u << 20, seed = 7;
  uint32_t size = 64;
  int64_t rounds = 1000;
  std::string addr = "127.0.0.1";
  int gpu = 0;
  unsigned threads = 0;
  int streams = 1;  // stream roles: this many connections at once, bytes split among them
  bool host_backend = false, cpu = false;
  std::string label, json;
};

bool is_stream(const std::string &role) {
  return role == "recv" || role == "send" || role == "pair-stream" || role == "copy-stream";
}
bool is_copy(const std::string &role) { return role.rfind("copy-", 0) == 0; }
bool listens(const std::string &role) { return role == "recv" || role == "pong"; }

sockaddr_in address(const Args &a) {
  sockaddr_in s = test::loopback(a.port);
  inet_pton(AF_INET, a.addr.c_str(), &s.sin_addr);
  return s;
}

// ---------------------------------------------------------------- the GPU side

// Waits for n results of a kernel (the host polls `done`), then for the grid.
int wait_results(Grid &grid, GpuSet &gpus, const LinkResult *r, int n, int seconds) {
  const test::Deadline deadline(seconds);
  auto all_done = [&] {
    for (int i = 0; i < n; ++i)
      if (!__atomic_load_n(&r[i].done, __ATOMIC_ACQUIRE)) return false;
    return true;
  };
  while (!all_done() && !deadline.passed()) usleep(1000);
  const bool done = all_done();
  if (!done) gpus.request_kernel_stop();
  const int rc = grid.wait();
  if (rc < 0) std::fprintf(stderr, "gpu_link: kernel failed: %s\n", grid.last_error());
  return done ? rc : -ETIMEDOUT;
}

// Several streams as one: their bytes and bad pieces added, the longest time.
LinkResult combine(const LinkResult *r, int n) {
  LinkResult all = r[0];
  for (int i = 1; i < n; ++i) {
    all.bytes += r[i].bytes;
    all.bad += r[i].bad;
    all.ns = std::max(all.ns, r[i].ns);
    if (all.error == 0) all.error = r[i].error;
  }
  return all;
}

struct GpuEnd {
  MemoryBlock buf{}, result{};
  LinkResult *host() const { return static_cast<LinkResult *>(result.host); }
  LinkResult *dev() const { return static_cast<LinkResult *>(result.device); }
};

// results: one per block, then the listen kernel's.
int allocate(GpuSet &gpus, int i, uint64_t buf_bytes, int results, GpuEnd *end) {
  int rc = gpus.memory(i).allocate(MemoryKind::kDevice, buf_bytes, &end->buf);
  if (rc == 0) rc = gpus.memory(i).allocate(MemoryKind::kHostMapped, (results + 1) * sizeof(LinkResult), &end->result);
  return rc;
}

// One end's kernel on GPU i, made by make(listener): after a kernel that
// listens on the address when `listen`, else with listener -1 (it connects).
template <class Make>
int launch_end(GpuSet &gpus, int i, Grid &grid, LaunchShape shape, GpuEnd &end, bool listen, const Args &a,
               const Make &make) {
  int listener = -1;
  if (listen) {
    LinkResult *r = end.host() + shape.blocks;
    int rc = gpus.launch(i, grid, LaunchShape{1, shape.threads, shape.host_warp_size},
                         ListenKernel{gpus.context(i), address(a), a.streams + 4, end.dev() + shape.blocks});
    if (rc == 0) rc = wait_results(grid, gpus, r, 1, 20);
    if (rc == 0) rc = r->error;
    if (rc < 0) return rc;
    listener = r->fd;
  }
  return gpus.launch(i, grid, shape, make(listener));
}

int run_gpu(const Args &a, LinkResult *out) {
  const bool pair = a.role.rfind("pair-", 0) == 0;
  GpuSetOptions options;
  options.backend = a.host_backend ? Backend::kHost : choose_backend(false);
  options.count = pair ? 2 : 1;
  options.first = a.gpu;
  options.share = true;
  options.proxy.quiet = true;
  if (options.backend == Backend::kCuda) options.proxy.busy_poll_us = -1;
  std::unique_ptr<GpuSet> gpus;
  if (int rc = GpuSet::start(options, &gpus); rc < 0) return rc;
  std::fprintf(stderr, "gpu_link: %s backend; %s\n", backend_name(gpus->backend()), gpus->proxy(0).placement().c_str());
  const bool gpu = gpus->backend() == Backend::kCuda;
  const bool stream = is_stream(a.role);
  const int blocks = stream ? a.streams : 1;
  LaunchShape shape{unsigned(blocks), a.threads ? a.threads : (gpu ? 256u : 4u), 0};
  const uint64_t buf_bytes = stream ? a.window * blocks : 2ull * a.size;
  const uint64_t per_stream = a.bytes / blocks;
  std::vector<GpuEnd> ends(gpus->size());
  for (int i = 0; i < gpus->size(); ++i)
    if (int rc = allocate(*gpus, i, buf_bytes, blocks, &ends[i]); rc < 0) return rc;

  Grid grids[2];
  const int ends_here = gpus->size();
  for (int i = 0; i < ends_here; ++i) {
    // The listener (GPU 0 of a pair) receives the stream or echoes the pings.
    const bool passive = pair ? i == 0 : listens(a.role);
    GpuEnd &e = ends[i];
    const channel::DeviceContext ctx = gpus->context(i);
    auto *buf = static_cast<uint8_t *>(e.buf.device);
    int rc;
    if (stream && passive)
      rc = launch_end(*gpus, i, grids[i], shape, e, true, a,
                      [&](int l) { return StreamRecvKernel{ctx, l, address(a), buf, a.window, a.seed, e.dev()}; });
    else if (stream)
      rc = launch_end(*gpus, i, grids[i], shape, e, false, a, [&](int l) {
        return StreamSendKernel{ctx, l, address(a), per_stream, buf, a.window, a.seed, e.dev()};
      });
    else
      rc = launch_end(*gpus, i, grids[i], shape, e, passive, a, [&](int l) {
        return PingPongKernel{ctx, l, address(a), !passive, a.size, a.rounds, buf, e.dev()};
      });
    if (rc < 0) return rc;
  }
  int status = 0;
  for (int i = 0; i < ends_here; ++i) {
    const int rc = wait_results(grids[i], *gpus, ends[i].host(), blocks, 600);
    if (rc < 0 && status == 0) status = rc;
  }
  // The end that measured: the sender / pinger (the last one in a pair); a
  // sender's `bad` is what the receiver counted.
  *out = combine(ends[ends_here - 1].host(), blocks);
  for (int i = 0; i < ends_here; ++i) gpus->proxy(i).kernel_exited(status);
  for (int i = 0; i < ends_here; ++i) {
    gpus->memory(i).release(&ends[i].buf);
    gpus->memory(i).release(&ends[i].result);
  }
  return status;
}

// ---------------------------------------------------------------- the CPU side

using test::GsSockets;

// One connection's part: `bytes` of the stream (or the ping-pong) on fd.
void run_cpu_link(const Args &a, int fd, bool listen, uint64_t bytes, LinkResult *out) {
  const bool stream = is_stream(a.role);
  std::vector<uint8_t> buf(stream ? a.window : 2ull * a.size);
  *out = LinkResult{};
  int err = 0;
  const test::Stopwatch watch;
  if (stream && !listen) {
    for (uint64_t i = 0; i < a.window; ++i) buf[i] = pattern_byte(i, a.seed);
    uint64_t sent = 0;
    while (err == 0 && sent < bytes) {
      const uint64_t off = sent % a.window, n = std::min(bytes - sent, a.window - off);
      if (test::send_all(fd, buf.data() + off, n, &err)) sent += n;
    }
    int64_t reply[2] = {-1, -1};
    if (err == 0) GsSockets::shutdown(fd, SHUT_WR);
    if (err == 0) test::recv_all(fd, reply, sizeof reply, &err);
    out->bytes = reply[0];
    out->bad = reply[1];
  } else if (stream) {
    uint64_t got = 0;
    for (;;) {
      const uint64_t off = got % a.window;
      const ssize_t n = GsSockets::recv(fd, buf.data() + off, a.window - off);
      if (n <= 0) {
        err = static_cast<int>(n);
        break;
      }
      bool wrong = false;
      for (ssize_t i = 0; i < n; ++i) wrong |= buf[off + i] != pattern_byte(off + i, a.seed);
      out->bad += wrong;
      got += static_cast<uint64_t>(n);
    }
    const int64_t reply[2] = {static_cast<int64_t>(got), out->bad};
    if (err == 0) test::send_all(fd, reply, sizeof reply, &err);
    out->bytes = static_cast<int64_t>(got);
  } else {
    uint8_t *msg = buf.data(), *back = buf.data() + a.size;
    timed_rounds(a.rounds, out, [&](int64_t k) {
      if (listen) {
        if (test::recv_all(fd, back, a.size, &err)) test::send_all(fd, back, a.size, &err);
      } else {
        for (uint32_t i = 0; i < a.size; ++i) msg[i] = pattern_byte(i, uint64_t(k));
        if (test::send_all(fd, msg, a.size, &err) && test::recv_all(fd, back, a.size, &err))
          out->bad += std::memcmp(msg, back, a.size) != 0;
      }
      return err == 0;
    });
    out->bytes = out->rounds * a.size;
  }
  if (stream) out->ns = static_cast<int64_t>(watch.seconds() * 1e9);
  GsSockets::close(fd);
  out->error = err;
}

// --streams connections, accepted or connected first, then one thread each.
int run_cpu(const Args &a, LinkResult *out) {
  const bool listen = listens(a.role);
  const int n = is_stream(a.role) ? a.streams : 1;
  std::vector<int> fds;
  const int l = listen ? test::listen_on(address(a), n + 4) : -1;
  if (listen && l < 0) return l;
  test::RetryPolicy retry;
  retry.seconds = 30;
  for (int i = 0; i < n; ++i) {
    const int fd = listen ? GsSockets::accept(l) : test::connect_retry(address(a), retry);
    if (fd < 0) return fd;
    fds.push_back(fd);
  }
  if (listen) GsSockets::close(l);
  std::vector<LinkResult> results(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] { run_cpu_link(a, fds[i], listen, a.bytes / n, &results[i]); });
  for (auto &t : threads) t.join();
  *out = combine(results.data(), n);
  return out->error;
}

// ---------------------------------------------------------------- main

CopyArgs copy_args(const Args &a) {
  return CopyArgs{.stream = is_stream(a.role),
                  .bytes = a.bytes,
                  .window = a.window,
                  .seed = a.seed,
                  .size = a.size,
                  .rounds = a.rounds,
                  .gpu = a.gpu,
                  .host_backend = a.host_backend};
}

void report(const Args &a, const LinkResult &r, int status) {
  const bool stream = is_stream(a.role);
  const double mbps = stream && r.ns > 0 ? double(r.bytes) / (double(r.ns) / 1e9) / 1e6 : 0;
  const double rtt_us = !stream && r.rounds > 1 ? double(r.ns) / double(r.rounds - 1) / 1e3 : 0;
  const char *transport = std::getenv("GPUSOCK_TRANSPORT");
  char line[512];
  std::snprintf(line, sizeof line,
                "\"label\": \"%s\", \"role\": \"%s\", \"side\": \"%s\", \"streams\": %d, \"transport\": \"%s\", "
                "\"bytes\": %" PRId64 ", \"bad\": %" PRId64 ", \"rounds\": %" PRId64 ", \"size\": %u, \"ns\": %" PRId64
                ", \"MBps\": %.1f, \"rtt_us\": %.3f, \"error\": \"%s\"",
                a.label.c_str(), a.role.c_str(), a.cpu ? "cpu" : (a.host_backend ? "host" : "gpu"),
                is_stream(a.role) ? a.streams : 1, transport ? transport : "", r.bytes, r.bad, r.rounds, a.size, r.ns,
                mbps, rtt_us, status < 0 ? gs_status_name(status) : "");
  std::printf("gpu_link {%s}\n", line);
  if (!a.json.empty())
    if (FILE *f = std::fopen(a.json.c_str(), "a")) {
      std::fprintf(f, "{%s}\n", line);
      std::fclose(f);
    }
}

int main_(int argc, char **argv) {
  Args a;
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> const char * { return i + 1 < argc ? argv[++i] : ""; };
    if (k == "--bytes") a.bytes = std::strtoull(next(), nullptr, 0);
    else if (k == "--window") a.window = std::strtoull(next(), nullptr, 0);
    else if (k == "--seed") a.seed = std::strtoull(next(), nullptr, 0);
    else if (k == "--size") a.size = static_cast<uint32_t>(std::strtoul(next(), nullptr, 0));
    else if (k == "--rounds") a.rounds = std::strtoll(next(), nullptr, 0);
    else if (k == "--addr") a.addr = next();
    else if (k == "--gpu") a.gpu = std::atoi(next());
    else if (k == "--threads") a.threads = static_cast<unsigned>(std::atoi(next()));
    else if (k == "--streams") a.streams = std::atoi(next());
    else if (k == "--host-backend") a.host_backend = true;
    else if (k == "--cpu") a.cpu = true;
    else if (k == "--label") a.label = next();
    else if (k == "--json") a.json = next();
    else pos.push_back(k);
  }
  const bool known = pos.size() == 2 && (is_stream(pos[0]) || pos[0] == "ping" || pos[0] == "pong" ||
                                         pos[0] == "pair-ping" || pos[0] == "copy-ping");
  if (!known || a.window < 16 || a.window % 8 || a.size == 0 || a.streams < 1 || a.streams > 64 ||
      (a.cpu && (pos[0].rfind("pair-", 0) == 0 || is_copy(pos[0])))) {
    std::fprintf(stderr,
                 "usage: gpu_link [options] recv|send|pong|ping|pair-stream|pair-ping|copy-stream|copy-ping PORT "
                 "(see the source)\n");
    return 2;
  }
  a.role = pos[0];
  a.port = std::atoi(pos[1].c_str());
  LinkResult r{};
  const int status = a.cpu ? run_cpu(a, &r) : is_copy(a.role) ? run_copy(copy_args(a), &r) : run_gpu(a, &r);
  const int rc = status < 0 ? status : r.error;
  report(a, r, rc);
  return rc == 0 && r.bad == 0 ? 0 : 1;
}

}  // namespace
}  // namespace gpusock::link

int main(int argc, char **argv) { return gpusock::link::main_(argc, argv); }
