// Streaming at scale: B GPU blocks, a socket each, stream to CPU drain
// servers through a proxy with T threads, against B CPU client connections
// (a thread each) streaming to the same servers over the same transport in
// the same run. Every cell is the median of --rounds runs; the proxy
// threads' CPU (user and system, in cores busy) says whether they were the
// limit. Prints "RESULT stream_<B>blocks_<T>threads_{gpu,ratio}" lines
// (scripts/gpu-check tabulates them) and, with --json, one JSON object per
// cell (scripts/gpu_stream_report.py draws them).
//
//   gpu_stream [--transport T] [--blocks 1,8,32,132] [--proxy-threads 1,2,4,8,16]
//              [--mib M] [--rounds R] [--rings BYTES] [--busy-poll US]
//              [--json FILE] [--host-backend]
// --mib: the bytes of one run, shared by its blocks (default 2048 on a GPU);
// --proxy-threads 0: the proxy's default (ProxyOptions::threads).
// The CPU peers are gpu_test_peer processes beside this binary.
#include "gpu/bench/bench_kernels.cuh"
#include "test-support/resources.h"

#include <gpusock/gpu.cuh>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace gpusock;
using namespace gpusock::bench;

// Each block connects to a drain server, sends `per_block` bytes in
// `chunk`-byte gsends, shuts down writing and reads the 8-byte count back.
struct StreamKernel {
  DeviceContext ctx;
  int port;
  uint8_t *data;
  uint64_t chunk;
  uint64_t per_block;
  BenchResult *out;  // one per block
  GS_HD void operator()() const {
    for (uint64_t i = thread_rank(); i < chunk; i += block_dim()) data[i] = static_cast<uint8_t>(i * 13);
    sync_block();
    const int s = connect_retry(ctx, port);
    int rc = s < 0 ? s : 0;
    const unsigned long long t0 = now_ns();
    uint64_t sent = 0;
    while (rc == 0 && sent < per_block) {
      const uint64_t n = per_block - sent < chunk ? per_block - sent : chunk;
      const ssize_t k = gsend(ctx, s, data, n, 0, 20000);
      if (k != static_cast<ssize_t>(n)) rc = k < 0 ? static_cast<int>(k) : -EIO;
      sent += n;
    }
    if (rc == 0) rc = gshutdown(ctx, s, SHUT_WR);
    char *count = out[block_index()].reply;  // the drain server's 8-byte count
    if (rc == 0 && grecv(ctx, s, count, 8, MSG_WAITALL, 20000) != 8) rc = -EIO;
    uint64_t got = 0;
    memcpy(&got, count, 8);
    if (rc == 0 && got != per_block) rc = -EIO;
    const unsigned long long ns = now_ns() - t0;
    if (s >= 0) gclose(ctx, s);
    report(out + block_index(), {.error = rc, .ns = ns, .bytes = sent, .count = t0});  // count: the start
  }
};

std::vector<int> parse_list(const char *text) {
  std::vector<int> v;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (const int n = std::atoi(item.c_str()); n >= 0) v.push_back(n);
  return v;
}

// CPU seconds (user, system) of this process's threads named gs-proxy-*.
struct CpuTimes {
  double user = 0, sys = 0;
};
CpuTimes proxy_cpu() {
  CpuTimes t;
  const double tick = double(sysconf(_SC_CLK_TCK));
  for (const auto &thread : test::thread_ticks())
    if (thread.comm.rfind("gs-proxy-", 0) == 0) {
      t.user += double(thread.utime) / tick;
      t.sys += double(thread.stime) / tick;
    }
  return t;
}

// Busy CPU seconds of the whole machine (/proc/stat: all but idle and iowait).
double machine_busy() {
  FILE *f = std::fopen("/proc/stat", "r");
  if (!f) return 0;
  unsigned long long v[10] = {};
  const int n = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", v, v + 1, v + 2, v + 3, v + 4,
                            v + 5, v + 6, v + 7, v + 8, v + 9);
  std::fclose(f);
  if (n < 5) return 0;
  unsigned long long busy = 0;
  for (int i = 0; i < 8; ++i)
    if (i != 3 && i != 4) busy += v[i];
  return double(busy) / double(sysconf(_SC_CLK_TCK));
}

struct Setup {
  Backend backend;
  MemoryResource *memory;
  uint32_t rings;
  unsigned threads_per_block;
  uint8_t *data;  // device, `chunk` bytes
  uint64_t chunk;
  BenchResult *res_host, *res_dev;
  std::string tmp;
};

// One run of `blocks` GPU streams through `proxy`: MB/s from the first
// block's start (after its connect) to the last one's end, or -1.
double gpu_run(const Setup &s, Proxy &proxy, unsigned blocks, uint64_t per) {
  const int port = test::free_port();
  Peer drains({"drains", std::to_string(port), std::to_string(blocks), std::to_string(s.chunk)});
  std::memset(s.res_host, 0, sizeof(BenchResult) * blocks);
  DeviceContext ctx = proxy.device_context();
  Grid grid;
  int rc = grid.start(s.backend, LaunchShape{blocks, s.threads_per_block, 0},
                      StreamKernel{ctx, port, s.data, s.chunk, per, s.res_dev});
  if (rc == 0) rc = grid.wait();
  proxy.kernel_exited(rc);  // what the kernel left open: flushed, or reset if it failed
  if (rc != 0) return -1;
  unsigned long long first = ~0ull, last = 0;
  for (unsigned b = 0; b < blocks; ++b) {
    const BenchResult &r = s.res_host[b];
    if (r.error) {
      std::printf("  (GPU stream %u ended with %s)\n", b, gs_status_name(static_cast<int>(r.error)));
      return -1;
    }
    first = std::min(first, r.count);
    last = std::max(last, r.count + r.ns);
  }
  return last > first ? double(per) * blocks * 1000.0 / double(last - first) : -1;
}

// One run of `conns` CPU client connections to the same kind of drains.
double cpu_run(const Setup &s, unsigned conns, uint64_t per) {
  const int port = test::free_port();
  Peer drains({"drains", std::to_string(port), std::to_string(conns), std::to_string(s.chunk)});
  return run_client(
      {"streams", std::to_string(port), std::to_string(conns), std::to_string(per), std::to_string(s.chunk), s.tmp},
      s.tmp, 120000);
}

}  // namespace

int main(int argc, char **argv) {
  bool force_host = false;
  int mib = 0, rounds = 3;
  std::vector<int> blocks_list, threads_list = {1, 2, 4, 8};
  const char *json_path = nullptr;
  ProxyOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--host-backend") force_host = true;
    else if (a == "--transport") options.transport = next();
    else if (a == "--blocks") blocks_list = parse_list(next());
    else if (a == "--proxy-threads") threads_list = parse_list(next());
    else if (a == "--mib") mib = std::atoi(next());
    else if (a == "--rounds") rounds = std::max(1, std::atoi(next()));
    else if (a == "--rings") options.rbuf_size = options.sbuf_size = static_cast<uint32_t>(std::atol(next()));
    else if (a == "--json") json_path = next();
    else if (a == "--busy-poll") options.busy_poll_us = std::atoi(next());
    else {
      std::fprintf(stderr,
                   "usage: %s [--transport T] [--blocks LIST] [--proxy-threads LIST] [--mib M] [--rounds R] "
                   "[--rings BYTES] [--busy-poll US] [--json FILE] [--host-backend]\n",
                   argv[0]);
      return 2;
    }
  }
  test::raise_fd_limit();  // fabric:tcp takes several descriptors a connection
  const Backend backend = choose_backend(force_host);
  const bool gpu = backend == Backend::kCuda;
  if (mib <= 0) mib = gpu ? 2048 : 64;
  int sms = 4;
#if defined(__CUDACC__)
  cudaDeviceProp prop{};
  if (gpu && cudaGetDeviceProperties(&prop, 0) == cudaSuccess) sms = prop.multiProcessorCount;
#endif
  if (blocks_list.empty()) blocks_list = gpu ? std::vector<int>{1, 8, 32, sms} : std::vector<int>{1, 4};
  if (!options.transport.empty()) setenv("GPUSOCK_TRANSPORT", options.transport.c_str(), 1);  // for the peers
  setenv("GPUSOCK_RING_LARGE", "0", 0);  // the CPU peers keep rsocket's 128 KiB rings (ring_budget.h)
  const char *transport = std::getenv("GPUSOCK_TRANSPORT");
  options.quiet = true;
  int max_blocks = 1;
  for (int b : blocks_list) max_blocks = std::max(max_blocks, b);
  // Blocks whose connect is refused (the drains not listening yet) retry with
  // a fresh socket while the last one closes: room for a few each.
  options.max_sockets = std::max<uint32_t>(64, 4 * uint32_t(max_blocks) + 16);
  options.spare_buffer_sets = 8;

  auto memory = memory_resource_for(backend);
  const uint64_t chunk = 1u << 20;
  MemoryBlock results{}, big{};
  if (memory->allocate(MemoryKind::kHostMapped, size_t(max_blocks) * sizeof(BenchResult), &results) < 0 ||
      memory->allocate(MemoryKind::kDevice, chunk, &big) < 0)
    return 1;
  const Setup setup{backend,
                    memory.get(),
                    options.rbuf_size,
                    gpu ? 256u : 4u,
                    static_cast<uint8_t *>(big.device),
                    chunk,
                    static_cast<BenchResult *>(results.host),
                    static_cast<BenchResult *>(results.device),
                    "/tmp/gpu_stream." + std::to_string(getpid())};
  std::printf("gpu_stream: %s backend, transport %s, %u B rings, %d MiB a run, median of %d\n", backend_name(backend),
              transport ? transport : "(default)", options.rbuf_size, mib, rounds);
  FILE *json = json_path ? std::fopen(json_path, "w") : nullptr;
  int status = 0;
  for (const int b : blocks_list) {
    const unsigned blocks = static_cast<unsigned>(b);
    const uint64_t per = ((uint64_t(mib) << 20) / blocks) & ~uint64_t(4095);
    std::vector<double> cpu_runs;
    const double m0 = machine_busy();
    const test::Stopwatch cpu_watch;
    for (int r = 0; r < rounds; ++r) cpu_runs.push_back(cpu_run(setup, blocks, per));
    const double cpu_cores = (machine_busy() - m0) / cpu_watch.seconds();
    const double cpu = median_of(cpu_runs);
    std::printf(
        "RESULT stream_%ublocks_cpu %.0f MB/s %u CPU client connections, a thread each; machine %.1f cores busy\n",
        blocks, cpu, blocks, cpu_cores);
    for (const int t : threads_list) {
      ProxyOptions o = options;
      o.threads = static_cast<uint32_t>(t);
      std::unique_ptr<Proxy> proxy;
      if (Proxy::start(o, memory.get(), &proxy) != 0) return 1;
      const unsigned used = proxy->threads();
      std::vector<double> runs;
      const CpuTimes c0 = proxy_cpu();
      const double b0 = machine_busy();
      const test::Stopwatch watch;
      for (int r = 0; r < rounds; ++r) runs.push_back(gpu_run(setup, *proxy, blocks, per));
      const double wall = watch.seconds();
      const CpuTimes c1 = proxy_cpu();
      const double cores = (machine_busy() - b0) / wall;
      proxy->stop();
      // A failed run fails the cell: a median would hide it.
      const auto ran = [](const std::vector<double> &v) {
        return std::all_of(v.begin(), v.end(), [](double x) { return x > 0; });
      };
      const double mbps = ran(runs) && ran(cpu_runs) ? median_of(runs) : -1;
      const double user = (c1.user - c0.user) / wall, sys = (c1.sys - c0.sys) / wall;
      char name[64];
      std::snprintf(name, sizeof name, "stream_%ublocks_%uthreads", blocks, used);
      if (mbps <= 0 || cpu <= 0) {
        std::printf("RESULT %s FAILED\n", name);
        status = 1;
        continue;
      }
      std::printf("RESULT %s_gpu %.0f MB/s proxy threads busy %.1f user + %.1f system cores; machine %.1f\n", name,
                  mbps, user, sys, cores);
      std::printf("RESULT %s_ratio %.2f x of %u CPU connections%s\n", name, mbps / cpu, blocks,
                  t == 0 ? " (the proxy's default threads)" : "");
      if (json) {
        std::fprintf(json,
                     "{\"transport\": \"%s\", \"blocks\": %u, \"proxy_threads\": %u, \"default_threads\": %s, "
                     "\"gpu_mbps\": %.0f, "
                     "\"cpu_mbps\": %.0f, \"ratio\": %.3f, \"proxy_user_cores\": %.2f, \"proxy_sys_cores\": %.2f, "
                     "\"machine_cores_gpu\": %.2f, \"machine_cores_cpu\": %.2f, \"gpu_runs\": [",
                     transport ? transport : "", blocks, used, t == 0 ? "true" : "false", mbps, cpu, mbps / cpu, user,
                     sys, cores, cpu_cores);
        for (size_t i = 0; i < runs.size(); ++i) std::fprintf(json, "%s%.0f", i ? ", " : "", runs[i]);
        std::fprintf(json, "], \"cpu_runs\": [");
        for (size_t i = 0; i < cpu_runs.size(); ++i) std::fprintf(json, "%s%.0f", i ? ", " : "", cpu_runs[i]);
        std::fprintf(json, "]}\n");
      }
      std::fflush(stdout);
    }
  }
  if (json) std::fclose(json);
  memory->release(&big);
  memory->release(&results);
  return status;
}
