// What the GPU benchmarks share (gpu_bench, gpu_trace): the result a kernel
// reports to the host, a GPU client's connect with retries, the floor's
// ping-pong, the listener and the one-connection echo server of P4, and
// running a CPU client peer.
#pragma once

#include "gpu/tests/harness.h"
#include "test-support/timing.h"

#include <gpusock/gpu.cuh>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <thread>
#include <string>
#include <vector>

namespace gpusock::bench {

using test::Peer;

// The median of a few measurements (-1 for none): the figure a noisy machine reports.
inline double median_of(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct BenchResult {
  long long error;
  unsigned long long ns;
  unsigned long long bytes;
  unsigned long long count;
  int done;
  char reply[60];
};

GS_HD void publish_done(BenchResult *r) {
#if defined(__CUDA_ARCH__)
  __threadfence_system();
  *reinterpret_cast<volatile int *>(&r->done) = 1;
  __threadfence_system();
#else
  __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
#endif
}

// What a kernel's leader thread tells the host (`done` last, for the host to
// poll); the other threads of the block tell nothing.
struct Report {
  long long error;
  unsigned long long ns = 0;
  unsigned long long bytes = 0;
  unsigned long long count = 0;
};

GS_HD void report(BenchResult *r, const Report &what) {
  if (thread_rank() != 0) return;
  r->error = what.error;
  r->ns = what.ns;
  r->bytes = what.bytes;
  r->count = what.count;
  publish_done(r);
}

GS_HD int connect_retry(const DeviceContext &ctx, int port) {
  const sockaddr_in a = ipv4_address(127, 0, 0, 1, static_cast<uint16_t>(port));
  int rc = -ECONNREFUSED;
  for (int attempt = 0; attempt < 5000; ++attempt) {  // up to ~5 s for the peer to listen
    const int s = gsocket(ctx, AF_INET, SOCK_STREAM);
    if (s < 0) return s;
    rc = gconnect(ctx, s, reinterpret_cast<const sockaddr *>(&a), sizeof a, 5000);
    if (rc == 0) return s;
    gclose(ctx, s);
    pause_ns(500000);
    pause_ns(500000);
  }
  return rc;
}

// The floor: thread 0 writes i into a host word the CPU polls, the CPU answers
// in another host word the GPU polls.
struct FloorKernel {
  uint64_t *to_cpu;
  uint64_t *to_gpu;
  int iters;
  BenchResult *out;
  GS_HD void operator()() const {
    if (thread_rank() != 0) return;
    unsigned long long t0 = now_ns();
    for (int i = 1; i <= iters + 100; ++i) {
      if (i == 101) t0 = now_ns();
      prim::store_release(to_cpu, static_cast<uint64_t>(i));
      while (prim::load_acquire(to_gpu) != static_cast<uint64_t>(i)) {}
    }
    report(out, {.error = 0, .ns = now_ns() - t0});
  }
};

// The floor's round trip in ns (FloorKernel against a CPU thread through two
// words of `words`, host-mapped memory), or -1.
inline double floor_rtt_ns(Grid &grid, Backend backend, const MemoryBlock &words, int n, BenchResult *r_host,
                           BenchResult *r_dev) {
  auto *to_cpu = static_cast<uint64_t *>(words.host);
  auto *to_gpu = to_cpu + 8;  // another cache line
  auto *to_cpu_dev = static_cast<uint64_t *>(words.device);
  std::atomic<bool> quit{false};
  std::thread cpu([&] {
    for (uint64_t i = 1; i <= uint64_t(n) + 100 && !quit.load(std::memory_order_relaxed);) {
      if (__atomic_load_n(to_cpu, __ATOMIC_ACQUIRE) == i) {
        __atomic_store_n(to_gpu, i, __ATOMIC_RELEASE);
        ++i;
      }
    }
  });
  double ns = -1;
  if (grid.start(backend, LaunchShape{1, 32, 0}, FloorKernel{to_cpu_dev, to_cpu_dev + 8, n, r_dev}) == 0 &&
      grid.wait() == 0 && r_host->done)
    ns = double(r_host->ns) / n;
  quit = true;
  cpu.join();
  return ns;
}

struct ListenKernel {
  DeviceContext ctx;
  int port;
  BenchResult *out;  // count = the listener's fd
  GS_HD void operator()() const {
    const int s = gsocket(ctx, AF_INET, SOCK_STREAM);
    const sockaddr_in a = ipv4_address(127, 0, 0, 1, static_cast<uint16_t>(port));
    int rc = s < 0 ? s : gbind(ctx, s, reinterpret_cast<const sockaddr *>(&a), sizeof a);
    if (rc == 0) rc = glisten(ctx, s, 16);
    report(out, {.error = rc, .count = static_cast<unsigned long long>(s)});
  }
};

// P4: the GPU echo server: accept one connection, echo what arrives until EOF.
struct EchoServerKernel {
  DeviceContext ctx;
  int listener;
  uint8_t *buf;
  uint32_t buf_size;
  BenchResult *out;
  GS_HD void operator()() const {
    const int c = gaccept(ctx, listener, 0, 20000);
    int rc = c < 0 ? c : 0;
    unsigned long long bytes = 0;
    while (rc == 0) {
      const ssize_t n = grecv(ctx, c, buf, buf_size, 0, 20000);
      if (n <= 0) {
        rc = static_cast<int>(n);
        break;
      }
      const ssize_t k = gsend(ctx, c, buf, static_cast<size_t>(n), 0, 20000);
      if (k != n) rc = k < 0 ? static_cast<int>(k) : -EIO;
      bytes += static_cast<unsigned long long>(n);
    }
    if (c >= 0) gclose(ctx, c);
    report(out, {.error = rc, .bytes = bytes});
  }
};

double read_number(const std::string &path) {
  FILE *f = std::fopen(path.c_str(), "r");
  if (!f) return -1;
  double v = -1;
  if (std::fscanf(f, "%lf", &v) != 1) v = -1;
  std::fclose(f);
  std::remove(path.c_str());
  return v;
}

// Runs a CPU client peer to completion: its result number, or -1.
double run_client(std::vector<std::string> args, const std::string &out, int ms) {
  Peer client(std::move(args));
  int code = -1;
  if (!client.wait_exit(ms, &code) || code != 0) return -1;
  return read_number(out);
}

}  // namespace gpusock::bench
