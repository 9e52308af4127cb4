// GPU socket benchmarks, side by side in one run, printed as
// "RESULT <name> <value> <unit> [note]" lines (scripts/gpu-check tabulates them):
//   floor_rtt            GPU thread <-> CPU thread ping-pong through host-mapped
//                        words, no gpusock at all: the floor of every round trip
//   doorbell_rtt         one request answered by the proxy (gnop)
//   echo_rtt_64B         GPU client, 64-byte ping-pong with a CPU echo peer
//   p4_*                 a CPU client's 64-byte ping-pong against a GPU echo server
//                        (one block) and against a CPU echo server (gpu_test_peer
//                        echo1, the same blocking loop): both round trips and the gap
//   p5_*_<chunk>         a CPU client streams to a GPU server (one block, grecv into
//                        GPU memory) and to a CPU server (gpu_test_peer drain), in
//                        chunk-byte sends/receives: both rates (medians of
//                        --p5-rounds rounds, default 3, alternating which goes
//                        first) and the ratio
//   p6_requests          gnop requests/s that the one proxy thread serves, with
//                        --p6-blocks blocks (default: one per multiprocessor) each
//                        driving its own socket
// Streaming from many blocks through several proxy threads: gpu_stream.
//
//   gpu_bench [--host-backend] [--transport T] [--iters N]
//             [--p5-mib M] [--p5-rounds R] [--p6-blocks B] [--p6-ms MS] [--threads T]
//             [--rings BYTES] [--proxy-cpus LIST] [--proxy-threads N]
// The CPU peers are gpu_test_peer processes beside this binary (they inherit
// its CPU affinity: run it under taskset to keep them off the proxy's core).
// GS_BENCH_ECHO_PEER picks the echo peer's mode for echo_rtt_64B.
#include "gpu/bench/bench_kernels.cuh"

#include <gpusock/gpu.cuh>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>
#include <cstring>

namespace {

using namespace gpusock;
using namespace gpusock::bench;

// --micro: what one memory operation on host-mapped memory costs when 1 or
// many blocks do it at once (`iters` times; the first warp, one lane where it
// says nothing else; a read's address depends on the read before it):
//   0 fence.acq_rel.sys   1 64-byte line write (4 x 16 B, no fence)
//   2 line write + fence  3 8-byte read of the block's own line (relaxed, dependent)
//   4 8-byte read of one line all blocks share   5 atomicAdd on a GPU-memory counter
//   6 ping-pong with one CPU thread that serves every block's line (the floor, many blocks)
//   7 a status poll as one thread makes it: 16 B x 3 of one line (two relaxed, one acquire)
//   8 the same 48 B as one warp-wide load, a lane per 16 B (relaxed)   9 ... acquire
//   10 status and an inline record (192 B, three lines) as one thread reads them
//   11 the same 192 B as one warp-wide load (12 lanes)
//   12 a 64-byte payload read: 4 lanes, __ldcv (as group_copy did until it
//      loaded with .cg, mode 23's load)
//   13 one 16-byte acquire load (one thread)   14 atomicAdd on GPU memory, dependent
//   15 mode 7 with the counters relaxed   16 mode 7 with the acquire first
//   17 mode 10 all relaxed
//   18 / 19 / 20 a warp's group copy from host memory: 16 B per lane, 1 / 4 / 8 loads
//      per lane 512 B apart, all in flight (bytes per op: 512 / 2048 / 4096)
//   21-25 mode 19 with ld.relaxed.gpu, ld.volatile, __ldcg, __ldcs, a plain (weak) load
//   26 mode 7 with ld.volatile for the state words   27 ... and for the counters
struct MicroKernel {
  int mode;
  int iters;
  uint64_t *lines;  // host-mapped: 4 KiB per block (request line, answer line, a record, copies)
  unsigned long long *counter;
  BenchResult *out;  // per block
  GS_HD void operator()() const {
    if (prim::warp_index() != 0) return;
    const unsigned lane = prim::lane();
    if (mode < 7 && lane != 0) return;
    uint64_t *mine = lines + size_t(block_index()) * 512;
    uint64_t sink = 0;
    const unsigned long long t0 = now_ns();
    for (int i = 1; i <= iters; ++i) {
      switch (mode) {
        case 0:
          prim::fence_release();
          break;
        case 1: {
          uint64_t v[8] = {uint64_t(i), 1, 2, 3, 4, 5, 6, 7};
          prim::store_line_relaxed(mine, v);
          break;
        }
        case 2: {
          uint64_t v[8] = {uint64_t(i), 1, 2, 3, 4, 5, 6, 7};
          prim::store_line_relaxed(mine, v);
          prim::fence_release();
          break;
        }
        case 3:
          sink += prim::load_relaxed(mine + 8 + (sink & 1));
          break;
        case 4:
          sink += prim::load_relaxed(lines + (sink & 1));
          break;
        case 5:
          sink += atomic_add_dev(counter);
          break;
        case 6:
          prim::store_release(mine, uint64_t(i));
          while (prim::load_acquire(mine + 8) != uint64_t(i)) {}
          break;
        case 8:
        case 9:
        case 11:
        case 12:
          if (lane < (mode == 11 ? 12u : mode == 12 ? 4u : 3u)) {
            const uint64_t *at = mine + 2 * lane + 2 * (sink & 1);
            uint64_t a = 0, b = 0;
#if defined(__CUDA_ARCH__)
            if (mode == 12) {
              const uint4 v = __ldcv(reinterpret_cast<const uint4 *>(mine + 2 * lane + 2 * (sink & 1)));
              a = v.x;
              b = v.w;
            } else
#endif
                if (mode == 9)
              prim::load_acquire_x2(at, &a, &b);
            else prim::load_relaxed_x2(at, &a, &b);
            sink += a + b;
          }
          break;
        case 13:
          if (lane == 0) {
            uint64_t a = 0, b = 0;
            prim::load_acquire_x2(mine + 4 + 2 * (sink & 1), &a, &b);
            sink += a + b;
          }
          break;
        case 14:
          if (lane == 0) sink += atomic_add_dev(counter + (sink & 1));
          break;
        case 18:
        case 19:
        case 20: {  // lanes load 16 B each, 1 / 4 / 8 loads per lane 512 B apart (a group copy's shape)
          const unsigned per = mode == 18 ? 1u : mode == 19 ? 4u : 8u;
          const uint64_t *at = mine + 2 * lane + 2 * (sink & 1);
          uint64_t a[8], b[8];
          for (unsigned j = 0; j < per; ++j) prim::load_relaxed_x2(at + 64 * j, &a[j], &b[j]);
          for (unsigned j = 0; j < per; ++j) sink += a[j] + b[j];
          break;
        }
        case 21:
        case 22:
        case 23:
        case 24:
        case 25: {  // mode 19's shape (4 loads per lane, 2 KiB) with other kinds of load
          const uint64_t *at = mine + 2 * lane + 2 * (sink & 1);
          uint64_t a[4] = {}, b[4] = {};
#if defined(__CUDA_ARCH__)
          for (unsigned j = 0; j < 4; ++j) {
            const uint64_t *q = at + 64 * j;
            if (mode == 21) {
              asm volatile("ld.relaxed.gpu.v2.u64 {%0,%1}, [%2];" : "=l"(a[j]), "=l"(b[j]) : "l"(q) : "memory");
            } else if (mode == 22) {
              asm volatile("ld.volatile.global.v2.u64 {%0,%1}, [%2];" : "=l"(a[j]), "=l"(b[j]) : "l"(q) : "memory");
            } else {
              const ulonglong2 v = mode == 23   ? __ldcg(reinterpret_cast<const ulonglong2 *>(q))
                                   : mode == 24 ? __ldcs(reinterpret_cast<const ulonglong2 *>(q))
                                                : *reinterpret_cast<const ulonglong2 *>(q);
              a[j] = v.x;
              b[j] = v.y;
            }
          }
#endif
          for (unsigned j = 0; j < 4; ++j) sink += a[j] + b[j];
          break;
        }
        case 26:
        case 27:
          if (lane == 0) {  // a status poll with ld.volatile for the state words (27: the counters too)
            const uint64_t *at = mine + 2 * (sink & 1);
            uint64_t a = 0, b = 0, c = 0, d = 0, e = 0, f = 0;
#if defined(__CUDA_ARCH__)
            asm volatile("ld.volatile.global.v2.u64 {%0,%1}, [%2];" : "=l"(c), "=l"(d) : "l"(at) : "memory");
            asm volatile("ld.volatile.global.v2.u64 {%0,%1}, [%2];" : "=l"(e), "=l"(f) : "l"(at + 2) : "memory");
            if (mode == 27)
              asm volatile("ld.volatile.global.v2.u64 {%0,%1}, [%2];" : "=l"(a), "=l"(b) : "l"(at + 4) : "memory");
            else
#endif
              prim::load_acquire_x2(at + 4, &a, &b);
            sink += a + b + c + d + e + f;
          }
          break;
        case 7:
        case 10:
        case 15:
        case 16:
        case 17:
          if (lane == 0) {  // one thread's status poll: which loads, in which order
            const uint64_t *at = mine + 2 * (sink & 1);
            const bool record = mode == 10 || mode == 17, acquire_last = mode == 7 || mode == 10;
            uint64_t w[16] = {}, a = 0, b = 0;
            uint32_t x[4], y[4];
            if (mode == 16) prim::load_acquire_x2(at + 4, &a, &b);
            if (record) prim::load_relaxed_x16(at + 8, w);
            prim::load_relaxed_x4(reinterpret_cast<const uint32_t *>(at), x);
            prim::load_relaxed_x4(reinterpret_cast<const uint32_t *>(at + 2), y);
            if (acquire_last) prim::load_acquire_x2(at + 4, &a, &b);
            else if (mode != 16) prim::load_relaxed_x2(at + 4, &a, &b);
            sink += a + b + x[0] + y[0] + w[0] + w[15];
          }
          break;
      }
    }
    report(out + block_index(),
           {.error = 0, .ns = now_ns() - t0, .bytes = sink, .count = static_cast<unsigned long long>(iters)});
  }
  GS_HD static unsigned long long atomic_add_dev(unsigned long long *p) { return prim::atomic_add(p, 1ull); }
};

struct DoorbellKernel {
  DeviceContext ctx;
  int iters;
  BenchResult *out;
  GS_HD void operator()() const {
    const int s = gsocket(ctx, AF_INET, SOCK_STREAM);
    int rc = s < 0 ? s : 0;
    for (int i = 0; i < 100 && rc == 0; ++i) rc = gnop(ctx, s);  // warm up
    const unsigned long long t0 = now_ns();
    for (int i = 0; i < iters && rc == 0; ++i) rc = gnop(ctx, s);
    const unsigned long long ns = now_ns() - t0;
    if (s >= 0) gclose(ctx, s);
    report(out, {.error = rc, .ns = ns});
  }
};

// P6: every block drives its own socket with gnop for `ns` nanoseconds.
struct RequestRateKernel {
  DeviceContext ctx;
  unsigned long long ns;
  BenchResult *out;  // one per block
  GS_HD void operator()() const {
    const int s = gsocket(ctx, AF_INET, SOCK_STREAM);
    int rc = s < 0 ? s : gnop(ctx, s);
    unsigned long long n = 0;
    const unsigned long long t0 = now_ns();
    unsigned long long t = t0;
    while (rc == 0 && t - t0 < ns) {
      rc = gnop(ctx, s);
      ++n;
      if ((n & 15) == 0) t = now_ns();
    }
    t = now_ns();
    if (s >= 0) gclose(ctx, s);
    report(out + block_index(), {.error = rc, .ns = t - t0, .count = n});
  }
};

struct PingPongKernel {
  DeviceContext ctx;
  int port;
  int iters;
  uint8_t *buf;  // 2 x 64
  BenchResult *out;
  GS_HD void operator()() const {
    const int s = connect_retry(ctx, port);
    int rc = s < 0 ? s : 0;
    for (uint32_t i = thread_rank(); i < 64; i += block_dim()) buf[i] = static_cast<uint8_t>(i);
    sync_block();
    unsigned long long t0 = now_ns();
    for (int i = -100; i < iters && rc == 0; ++i) {  // 100 warm-up rounds
      if (i == 0) t0 = now_ns();
      const ssize_t a = gsend(ctx, s, buf, 64, 0, 10000);
      const ssize_t b = a == 64 ? grecv(ctx, s, buf + 64, 64, MSG_WAITALL, 10000) : a;
      if (b != 64) rc = b < 0 ? static_cast<int>(b) : -EIO;
    }
    const unsigned long long ns = now_ns() - t0;
    if (s >= 0) gclose(ctx, s);
    report(out, {.error = rc, .ns = ns});
  }
};

// P5: the GPU server: accept, grecv chunk bytes at a time into GPU memory until
// EOF, answer with the 8-byte count, close.
struct DrainServerKernel {
  DeviceContext ctx;
  int listener;
  uint8_t *dst;
  uint32_t chunk;
  uint64_t *count;  // host-mapped
  BenchResult *out;
  GS_HD void operator()() const {
    const int c = gaccept(ctx, listener, 0, 20000);
    int rc = c < 0 ? c : 0;
    uint64_t total = 0;
    while (rc == 0) {
      const ssize_t n = grecv(ctx, c, dst, chunk, 0, 20000);
      if (n <= 0) {
        rc = static_cast<int>(n);
        break;
      }
      total += static_cast<uint64_t>(n);
    }
    if (thread_rank() == 0) *count = total;
    sync_block();
    if (c >= 0) {
      const ssize_t k = gsend(ctx, c, count, sizeof *count, 0, 20000);
      if (k != sizeof *count && rc == 0) rc = -EIO;
      gclose(ctx, c);
    }
    report(out, {.error = rc, .bytes = total});
  }
};

}  // namespace

int main(int argc, char **argv) {
  bool force_host = false, micro = false;
  int iters = 0, p5_mib = 0, p5_rounds = 3, p6_blocks = 0, p6_ms = 1000, threads_arg = 0;
  uint32_t rings = ProxyOptions{}.rbuf_size;  // what a GPU program gets; the CPU peers keep theirs (128 KiB)
  ProxyOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--host-backend") force_host = true;
    else if (a == "--transport") options.transport = next();
    else if (a == "--iters") iters = std::atoi(next());
    else if (a == "--p5-mib") p5_mib = std::atoi(next());
    else if (a == "--p5-rounds") p5_rounds = std::max(1, std::atoi(next()));
    else if (a == "--p6-blocks") p6_blocks = std::atoi(next());
    else if (a == "--p6-ms") p6_ms = std::atoi(next());
    else if (a == "--threads") threads_arg = std::atoi(next());
    else if (a == "--rings") rings = static_cast<uint32_t>(std::atol(next()));
    else if (a == "--micro") micro = true;
    else if (a == "--proxy-cpus") options.cpus = next();
    else if (a == "--proxy-threads") options.threads = static_cast<uint32_t>(std::atoi(next()));
    else {
      std::fprintf(
          stderr,
          "usage: %s [--host-backend] [--transport T] [--iters N] [--p5-mib M] [--p5-rounds R] "
          "[--p6-blocks B] [--p6-ms MS] [--threads T] [--rings BYTES] [--proxy-cpus LIST] [--proxy-threads N]\n",
          argv[0]);
      return 2;
    }
  }
  const Backend backend = choose_backend(force_host);
  const bool gpu = backend == Backend::kCuda;
  if (iters <= 0) iters = gpu ? 20000 : 2000;
  if (p5_mib <= 0) p5_mib = gpu ? 256 : 32;
  if (p6_blocks <= 0) {
    p6_blocks = 4;
#if defined(__CUDACC__)
    cudaDeviceProp prop{};
    if (gpu && cudaGetDeviceProperties(&prop, 0) == cudaSuccess) p6_blocks = prop.multiProcessorCount;
#endif
  }
  const char *host_threads = std::getenv("GS_BENCH_HOST_THREADS");
  const unsigned threads =
      threads_arg > 0 ? static_cast<unsigned>(threads_arg) : (gpu ? 256 : (host_threads ? std::atoi(host_threads) : 4));
  if (gpu) options.busy_poll_us = -1;  // the proxy spins on its own core
  options.quiet = true;
  options.rbuf_size = rings;
  options.sbuf_size = rings;
  options.max_sockets = std::max<uint32_t>(256, static_cast<uint32_t>(p6_blocks) + 16);
  options.spare_buffer_sets = 16;
  const uint32_t default_inline = default_inline_messages();
  options.inline_messages = channel::kCtxInline;  // the proxy serves every mode P4 compares
  if (!options.transport.empty()) setenv("GPUSOCK_TRANSPORT", options.transport.c_str(), 1);  // for the peers
  // The CPU peers and servers keep rsocket's 128 KiB rings, as the GPU program
  // keeps the proxy's: P5 compares the data paths, not
  // ring sizes (CPU sockets otherwise grow unchosen rings: ring_budget.h).
  setenv("GPUSOCK_RING_LARGE", "0", 0);
  auto memory = memory_resource_for(backend);
  std::unique_ptr<Proxy> proxy;
  if (int rc = Proxy::start(options, memory.get(), &proxy); rc < 0) return 1;
  // The proxy serves every inline mode (P4 compares them); every other row
  // runs with the default's, as a program would (a kernel's copy may have fewer).
  const DeviceContext all_modes = proxy->device_context();
  DeviceContext ctx = all_modes;
  ctx.flags &= default_inline;
  const char *transport = std::getenv("GPUSOCK_TRANSPORT");
  std::printf("gpu_bench: %s backend, transport %s, %u threads per block, %u B rings\n  %s\n", backend_name(backend),
              transport ? transport : "(default)", threads, rings, proxy->placement().c_str());
  std::fflush(stdout);

  constexpr int kResults = 128;
  MemoryBlock results{}, small{}, big{}, words{}, rate{};
  const uint64_t chunk = 1u << 20;
  if (memory->allocate(MemoryKind::kHostMapped, kResults * sizeof(BenchResult), &results) < 0 ||
      memory->allocate(MemoryKind::kHostMapped, 4096, &small) < 0 ||
      memory->allocate(MemoryKind::kHostMapped, 4096, &words) < 0 ||
      memory->allocate(MemoryKind::kHostMapped, size_t(p6_blocks) * sizeof(BenchResult), &rate) < 0 ||
      memory->allocate(MemoryKind::kDevice, chunk, &big) < 0)
    return 1;
  auto *res_host = static_cast<BenchResult *>(results.host);
  auto *res_dev = static_cast<BenchResult *>(results.device);
  int status = 0;
  Grid grid;
  const LaunchShape shape{1, threads, 0};
  int slot = 0;  // next BenchResult
  auto fail = [&](const char *name, long long err) {
    std::printf("RESULT %s FAILED %s\n", name, gs_status_name(static_cast<int>(err)));
    status = 1;
  };
  const std::string tmp = "/tmp/gpu_bench." + std::to_string(getpid());

  if (micro) {
    const char *names[] = {
        "fence",          "line_write",          "line_write_fence",   "read_own",     "read_shared",
        "atomic_dev",     "pingpong_cpu",        "status_1thread",     "status_warp",  "status_warp_acq",
        "record_1thread", "record_warp",         "payload_ldcv",       "acquire_16B",  "atomic_dev_dep",
        "status_relaxed", "status_acq_first",    "record_relaxed",     "copy_512B",    "copy_2KiB",
        "copy_4KiB",      "copy_2KiB_gpu",       "copy_2KiB_volatile", "copy_2KiB_cg", "copy_2KiB_cs",
        "copy_2KiB_weak", "status_volatile_acq", "status_volatile"};
    MemoryBlock lines{}, counter{}, outs{};
    memory->allocate(MemoryKind::kHostMapped, size_t(p6_blocks) * 4096 + 4096, &lines);
    memory->allocate(MemoryKind::kDevice, 64, &counter);
    memory->allocate(MemoryKind::kHostMapped, size_t(p6_blocks) * sizeof(BenchResult), &outs);
    auto *oh = static_cast<BenchResult *>(outs.host);
    for (int mode = 0; mode < 28; ++mode) {
      for (int blocks : {1, p6_blocks}) {
        const int n = mode == 6 ? 2000 : 5000;
        std::atomic<bool> quit{false};
        std::thread server;
        if (mode == 6) {
          auto *base = static_cast<uint64_t *>(lines.host);
          std::memset(base, 0, size_t(p6_blocks) * 4096);
          server = std::thread([&, base, blocks] {
            std::vector<uint64_t> seen(blocks, 0);
            while (!quit.load(std::memory_order_relaxed))
              for (int b = 0; b < blocks; ++b) {
                const uint64_t v = __atomic_load_n(base + size_t(b) * 512, __ATOMIC_ACQUIRE);
                if (v != seen[b]) {
                  seen[b] = v;
                  __atomic_store_n(base + size_t(b) * 512 + 8, v, __ATOMIC_RELEASE);
                }
              }
          });
        }
        const test::Stopwatch watch;
        const int rc = grid.start(
            backend, LaunchShape{static_cast<unsigned>(blocks), 32, 0},
            MicroKernel{mode, n, static_cast<uint64_t *>(lines.device),
                        static_cast<unsigned long long *>(counter.device), static_cast<BenchResult *>(outs.device)});
        const int wrc = rc == 0 ? grid.wait() : rc;
        const double wall = watch.ns();
        quit = true;
        if (server.joinable()) server.join();
        unsigned long long max_ns = 0;
        for (int b = 0; b < blocks; ++b) max_ns = std::max(max_ns, oh[b].ns);
        if (wrc == 0 && max_ns > 0)
          std::printf("MICRO %-17s %3d blocks: %8.1f ns per op per block, %7.2f M ops/s total (wall %.1f ms)\n",
                      names[mode], blocks, double(max_ns) / n, double(n) * blocks * 1000.0 / double(max_ns),
                      wall / 1e6);
        else std::printf("MICRO %s %d blocks FAILED\n", names[mode], blocks);
        std::fflush(stdout);
      }
    }
    memory->release(&lines);
    memory->release(&counter);
    memory->release(&outs);
  }

  // ---- floor
  {
    const double ns = floor_rtt_ns(grid, backend, words, iters, res_host + slot, res_dev + slot);
    if (ns > 0) std::printf("RESULT floor_rtt %.2f us\n", ns / 1000.0);
    else fail("floor_rtt", -EIO);
    ++slot;
  }
  std::fflush(stdout);

  // ---- doorbell
  {
    BenchResult *r = res_host + slot;
    if (grid.start(backend, shape, DoorbellKernel{ctx, iters, res_dev + slot}) == 0 && grid.wait() == 0 &&
        r->error == 0) {
      std::printf("RESULT doorbell_rtt %.2f us\n", double(r->ns) / 1000.0 / iters);
    } else {
      fail("doorbell_rtt", r->error);
    }
    ++slot;
  }

  // ---- GPU client echo
  {
    const int port = gpusock::test::free_port();
    // GS_BENCH_ECHO_PEER=echo1: the blocking one-connection loop P4's CPU
    // server runs, instead of the gs_poll loop over listener and connection.
    const char *peer_mode = std::getenv("GS_BENCH_ECHO_PEER");
    Peer echo({peer_mode && *peer_mode ? peer_mode : "echo", std::to_string(port)});
    BenchResult *r = res_host + slot;
    if (grid.start(backend, shape,
                   PingPongKernel{ctx, port, iters, static_cast<uint8_t *>(small.device), res_dev + slot}) == 0 &&
        grid.wait() == 0 && r->error == 0) {
      std::printf("RESULT echo_rtt_64B %.2f us GPU client, CPU echo peer\n", double(r->ns) / 1000.0 / iters);
    } else {
      fail("echo_rtt_64B", r->error);
    }
    ++slot;
  }
  std::fflush(stdout);

  // A GPU listener for the server benchmarks.
  int listener = -1;
  const int gpu_port = gpusock::test::free_port();
  {
    BenchResult *r = res_host + slot;
    if (grid.start(backend, LaunchShape{1, 32, 0}, ListenKernel{ctx, gpu_port, res_dev + slot}) == 0 &&
        grid.wait() == 0 && r->error == 0)
      listener = static_cast<int>(r->count);
    else fail("gpu_listener", r->error);
    ++slot;
  }

  // ---- P4: CPU client against a GPU echo server and a CPU echo server. The
  // GPU server runs with small messages inline both ways, one way only (sent:
  // the default) and through the rings both ways (copies of the context with
  // fewer ContextFlags), side by side: what each half is worth.
  if (listener >= 0) {
    struct Mode {
      const char *name;
      uint32_t flags;
      double ns = -1;
    };
    Mode modes[] = {{"inline", channel::kCtxInline},
                    {"inline-recv", channel::kCtxInlineRecv},
                    {"inline-send", channel::kCtxInlineSend},
                    {"rings", 0u}};
    double cpu_ns = -1;
    for (Mode &m : modes) {
      if (slot >= kResults) break;
      BenchResult *r = res_host + slot;
      DeviceContext c = all_modes;
      c.flags &= m.flags;
      if (grid.start(backend, shape,
                     EchoServerKernel{c, listener, static_cast<uint8_t *>(big.device), 1u << 16, res_dev + slot}) ==
          0) {
        const ProxyStats s0 = proxy->stats();
        const test::Stopwatch watch;
        const double ns =
            run_client({"pingpong", std::to_string(gpu_port), "64", std::to_string(iters), tmp}, tmp, 60000);
        const double wall = watch.ns();
        const ProxyStats s1 = proxy->stats();
        const double turns = double(s1.turnarounds - s0.turnarounds);
        std::printf("  (P4 %s: %.2f us; proxy %.0f ns/pass, %.2f requests per round trip, GPU turnaround %.2f us)\n",
                    m.name, ns / 1000.0, wall / std::max<double>(1, double(s1.passes - s0.passes)),
                    double(s1.requests - s0.requests) / std::max(1, iters + 100),
                    turns > 0 ? double(s1.turnaround_ns - s0.turnaround_ns) / turns / 1000.0 : -1.0);
        if (ns < 0) proxy->request_kernel_stop();
        grid.wait();
        if (r->error != 0)
          std::printf("  (GPU echo server ended with %s)\n", gs_status_name(static_cast<int>(r->error)));
        m.ns = ns;
      }
      ++slot;
    }
    double gpu_ns = -1;
    for (const Mode &m : modes)
      if (m.flags == default_inline) gpu_ns = m.ns;
    const double rings_ns = modes[3].ns;
    {
      const int port = gpusock::test::free_port();
      Peer server({"echo1", std::to_string(port)});
      cpu_ns = run_client({"pingpong", std::to_string(port), "64", std::to_string(iters), tmp}, tmp, 60000);
    }
    if (gpu_ns > 0) std::printf("RESULT p4_gpu_server_rtt_64B %.2f us CPU client\n", gpu_ns / 1000.0);
    else fail("p4_gpu_server_rtt_64B", -EIO);
    if (rings_ns > 0)
      std::printf("RESULT p4_gpu_server_rings_rtt_64B %.2f us CPU client, small messages through the rings\n",
                  rings_ns / 1000.0);
    if (cpu_ns > 0) std::printf("RESULT p4_cpu_server_rtt_64B %.2f us CPU client\n", cpu_ns / 1000.0);
    else fail("p4_cpu_server_rtt_64B", -EIO);
    if (gpu_ns > 0 && cpu_ns > 0)
      std::printf("RESULT p4_gap %.2f us target <= 1.0 x floor\n", (gpu_ns - cpu_ns) / 1000.0);
  }
  std::fflush(stdout);

  // ---- P5: CPU client streaming to a GPU server and to a CPU server, each
  // size in `p5_rounds` rounds that alternate which server goes first (a
  // machine whose CPU rate drifts within a run moves both alike); the rates
  // reported are each server's median.
  if (listener >= 0) {
    const uint64_t total = uint64_t(p5_mib) << 20;
    auto gpu_server = [&](uint32_t chunk) {
      double mbps = -1;
      if (slot >= kResults) return mbps;
      const int i = slot++;
      BenchResult *r = res_host + i;
      if (grid.start(backend, shape,
                     DrainServerKernel{ctx, listener, static_cast<uint8_t *>(big.device), chunk,
                                       static_cast<uint64_t *>(small.device) + 64, res_dev + i}) == 0) {
        mbps = run_client({"stream", std::to_string(gpu_port), std::to_string(total), std::to_string(chunk), tmp}, tmp,
                          120000);
        if (mbps < 0) proxy->request_kernel_stop();
        grid.wait();
        if (r->error != 0)
          std::printf("  (GPU drain server ended with %s)\n", gs_status_name(static_cast<int>(r->error)));
      }
      return mbps;
    };
    auto cpu_server = [&](uint32_t chunk) {
      const int port = gpusock::test::free_port();
      Peer server({"drain", std::to_string(port), "1", std::to_string(chunk)});
      return run_client({"stream", std::to_string(port), std::to_string(total), std::to_string(chunk), tmp}, tmp,
                        120000);
    };
    for (uint32_t c : {1u << 16, 1u << 18, 1u << 20}) {
      char label[16];
      std::snprintf(label, sizeof label, "%uK", c >> 10);
      std::vector<double> gpu_runs, cpu_runs;
      bool gpu_ok = true, cpu_ok = true;
      for (int round = 0; round < p5_rounds && gpu_ok && cpu_ok; ++round) {
        double g = -1, k = -1;
        if (round % 2 == 0) g = gpu_server(c), k = cpu_server(c);
        else k = cpu_server(c), g = gpu_server(c);
        std::printf("  p5 %s round %d: GPU server %.0f MB/s, CPU server %.0f MB/s\n", label, round + 1, g, k);
        gpu_ok = g > 0;
        cpu_ok = k > 0;
        gpu_runs.push_back(g);
        cpu_runs.push_back(k);
      }
      const std::string g = std::string("p5_gpu_server_") + label, k = std::string("p5_cpu_server_") + label;
      if (!gpu_ok || !cpu_ok) {  // each failed side by its name, as one round reported them
        if (!gpu_ok) fail(g.c_str(), -EIO);
        if (!cpu_ok) fail(k.c_str(), -EIO);
        continue;
      }
      const double gpu_mbps = median_of(gpu_runs), cpu_mbps = median_of(cpu_runs);
      std::printf("RESULT %s %.0f MB/s median of %d\n", g.c_str(), gpu_mbps, p5_rounds);
      std::printf("RESULT %s %.0f MB/s median of %d\n", k.c_str(), cpu_mbps, p5_rounds);
      std::printf("RESULT p5_ratio_%s %.2f x target >= 0.95\n", label, gpu_mbps / cpu_mbps);
      std::fflush(stdout);
    }
  }

  // ---- P6: requests/s of one proxy thread, B blocks each driving a socket
  {
    auto *rh = static_cast<BenchResult *>(rate.host);
    auto *rd = static_cast<BenchResult *>(rate.device);
    const unsigned p6_threads = gpu ? 128 : threads;
    std::vector<int> sweep;
    for (int b : {1, 8, 32, p6_blocks})
      if (b <= p6_blocks && (sweep.empty() || sweep.back() != b)) sweep.push_back(b);
    for (int blocks : sweep) {
      const bool main_case = blocks == p6_blocks;
      const int ms = main_case ? p6_ms : std::max(100, p6_ms / 4);
      const ProxyStats s0 = proxy->stats();
      const test::Stopwatch watch;
      std::memset(rh, 0, size_t(blocks) * sizeof(BenchResult));
      char name[48];
      std::snprintf(name, sizeof name, main_case ? "p6_requests" : "p6_requests_%dblocks", blocks);
      if (grid.start(backend, LaunchShape{static_cast<unsigned>(blocks), p6_threads, 0},
                     RequestRateKernel{ctx, uint64_t(ms) * 1000000ull, rd}) == 0 &&
          grid.wait() == 0) {
        const double wall_ns = watch.ns();
        const ProxyStats s1 = proxy->stats();
        unsigned long long total = 0, max_ns = 0;
        long long err = 0;
        for (int b = 0; b < blocks; ++b) {
          total += rh[b].count;
          max_ns = std::max(max_ns, rh[b].ns);
          if (rh[b].error) err = rh[b].error;
        }
        const double passes = double(s1.passes - s0.passes);
        if (err == 0 && max_ns > 0)
          std::printf(
              "RESULT %s %.2f M/s %d blocks x 1 socket, gnop; %.2f us per block; proxy %.0f ns/pass, %.1f req/pass%s\n",
              name, double(total) * 1000.0 / double(max_ns), blocks, double(max_ns) / 1000.0 / (double(total) / blocks),
              wall_ns / std::max(1.0, passes), double(s1.requests - s0.requests) / std::max(1.0, passes),
              main_case ? "; target >= 5" : "");
        else fail(name, err ? err : -EIO);
      } else {
        fail(name, -EIO);
      }
      std::fflush(stdout);
    }
  }

  proxy->kernel_exited(0);  // the listener
  memory->release(&results);
  memory->release(&small);
  memory->release(&big);
  memory->release(&words);
  memory->release(&rate);
  proxy->stop();
  return status;
}
