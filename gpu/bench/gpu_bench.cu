// GPU socket benchmarks, printed as "RESULT <name> <value> <unit>" lines:
//   doorbell_rtt  one request answered by the proxy (gnop): the GPU->CPU->GPU floor
//   echo_rtt_64B  64-byte ping-pong with a CPU echo peer (gpu_test_peer echo)
//   stream_MBps   one block streaming to a CPU sink (gpu_test_peer sink), end to end
//
//   gpu_bench [--host-backend] [--transport fabric:shm] [--iters N] [--stream-mib M]
// The peers are spawned from gpu_test_peer beside this binary.
#include "gpu/tests/harness.h"

#include <gpusock/gpu.cuh>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

using namespace gpusock;
using gpusock::test::Peer;

struct BenchResult {
  long long error;
  unsigned long long ns;
  unsigned long long bytes;
  char reply[64];
};

GS_DEV int connect_retry(const DeviceContext &ctx, int port) {
  const sockaddr_in a = ipv4_address(127, 0, 0, 1, static_cast<uint16_t>(port));
  int rc = -ECONNREFUSED;
  for (int attempt = 0; attempt < 400; ++attempt) {
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

struct DoorbellKernel {
  DeviceContext ctx;
  int iters;
  BenchResult *out;
  GS_DEV void operator()() const {
    const int s = gsocket(ctx, AF_INET, SOCK_STREAM);
    int rc = s < 0 ? s : gnop(ctx, s);  // warm up
    const unsigned long long t0 = now_ns();
    for (int i = 0; i < iters && rc == 0; ++i) rc = gnop(ctx, s);
    const unsigned long long ns = now_ns() - t0;
    if (s >= 0) gclose(ctx, s);
    if (thread_rank() == 0) {
      out->error = rc;
      out->ns = ns;
    }
  }
};

struct PingPongKernel {
  DeviceContext ctx;
  int port;
  int iters;
  uint8_t *buf;  // 2 x 64
  BenchResult *out;
  GS_DEV void operator()() const {
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
    if (thread_rank() == 0) {
      out->error = rc;
      out->ns = ns;
    }
  }
};

struct StreamKernel {
  DeviceContext ctx;
  int port;
  uint8_t *data;
  uint64_t chunk;
  uint64_t total;
  BenchResult *out;
  GS_DEV void operator()() const {
    for (uint64_t i = thread_rank(); i < chunk; i += block_dim()) data[i] = static_cast<uint8_t>(i * 13);
    sync_block();
    const int s = connect_retry(ctx, port);
    int rc = s < 0 ? s : 0;
    const unsigned long long t0 = now_ns();
    uint64_t sent = 0;
    while (rc == 0 && sent < total) {
      const uint64_t n = total - sent < chunk ? total - sent : chunk;
      const ssize_t k = gsend(ctx, s, data, n, 0, 20000);
      if (k != static_cast<ssize_t>(n)) rc = k < 0 ? static_cast<int>(k) : -EIO;
      sent += n;
    }
    if (rc == 0) rc = gshutdown(ctx, s, SHUT_WR);
    size_t got = 0;
    while (rc == 0) {  // the sink answers once it has read everything
      const ssize_t k = grecv(ctx, s, out->reply + got, sizeof out->reply - 1 - got, 0, 20000);
      if (k <= 0) {
        if (k < 0) rc = static_cast<int>(k);
        break;
      }
      got += static_cast<size_t>(k);
    }
    const unsigned long long ns = now_ns() - t0;
    if (s >= 0) gclose(ctx, s);
    if (thread_rank() == 0) {
      out->error = rc;
      out->ns = ns;
      out->bytes = sent;
    }
  }
};

}  // namespace

int main(int argc, char **argv) {
  bool force_host = false;
  int iters = 0, stream_mib = 0;
  ProxyOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--host-backend") force_host = true;
    else if (a == "--transport") options.transport = next();
    else if (a == "--iters") iters = std::atoi(next());
    else if (a == "--stream-mib") stream_mib = std::atoi(next());
    else {
      std::fprintf(stderr, "usage: %s [--host-backend] [--transport T] [--iters N] [--stream-mib M]\n", argv[0]);
      return 2;
    }
  }
  const Backend backend = choose_backend(force_host);
  const bool gpu = backend == Backend::kCuda;
  if (iters <= 0) iters = gpu ? 20000 : 2000;
  if (stream_mib <= 0) stream_mib = gpu ? 512 : 64;
  const unsigned threads = gpu ? 256 : (std::getenv("GS_BENCH_HOST_THREADS") ? std::atoi(std::getenv("GS_BENCH_HOST_THREADS")) : 4);
  if (gpu) options.busy_poll_us = -1;  // the proxy spins on its own core
  options.quiet = true;
  if (!options.transport.empty()) setenv("GPUSOCK_TRANSPORT", options.transport.c_str(), 1);  // for the peers
  auto memory = memory_resource_for(backend);
  std::unique_ptr<Proxy> proxy;
  if (int rc = Proxy::start(options, memory.get(), &proxy); rc < 0) return 1;
  const DeviceContext ctx = proxy->device_context();
  const char *transport = std::getenv("GPUSOCK_TRANSPORT");
  std::printf("gpu_bench: %s backend, transport %s\n  %s\n", backend_name(backend),
              transport ? transport : "(default)", proxy->placement().c_str());

  MemoryBlock results{}, small{}, big{};
  const uint64_t chunk = 1u << 20;
  if (memory->allocate(MemoryKind::kHostMapped, 3 * sizeof(BenchResult), &results) < 0 ||
      memory->allocate(MemoryKind::kHostMapped, 4096, &small) < 0 ||
      memory->allocate(MemoryKind::kDevice, chunk, &big) < 0)
    return 1;
  auto *res_host = static_cast<BenchResult *>(results.host);
  auto *res_dev = static_cast<BenchResult *>(results.device);
  int status = 0;
  Grid grid;
  const LaunchShape shape{1, threads, 0};

  if (grid.start(backend, shape, DoorbellKernel{ctx, iters, res_dev}) == 0 && grid.wait() == 0 &&
      res_host[0].error == 0) {
    std::printf("RESULT doorbell_rtt %.2f us\n", double(res_host[0].ns) / 1000.0 / iters);
  } else {
    std::printf("RESULT doorbell_rtt FAILED %s\n", gs_status_name(static_cast<int>(res_host[0].error)));
    status = 1;
  }

  const int echo_port = gpusock::test::free_port();
  {
    Peer echo({"echo", std::to_string(echo_port)});
    if (grid.start(backend, shape,
                   PingPongKernel{ctx, echo_port, iters, static_cast<uint8_t *>(small.device), res_dev + 1}) == 0 &&
        grid.wait() == 0 && res_host[1].error == 0) {
      std::printf("RESULT echo_rtt_64B %.2f us\n", double(res_host[1].ns) / 1000.0 / iters);
    } else {
      std::printf("RESULT echo_rtt_64B FAILED %s\n", gs_status_name(static_cast<int>(res_host[1].error)));
      status = 1;
    }
  }

  const int sink_port = gpusock::test::free_port();
  {
    Peer sink({"sink", std::to_string(sink_port), "1"});
    const uint64_t total = uint64_t(stream_mib) << 20;
    if (grid.start(backend, shape,
                   StreamKernel{ctx, sink_port, static_cast<uint8_t *>(big.device), chunk, total, res_dev + 2}) == 0 &&
        grid.wait() == 0 && res_host[2].error == 0 && std::strtoull(res_host[2].reply, nullptr, 10) == total) {
      std::printf("RESULT stream_MBps %.0f MB/s\n", double(total) * 1000.0 / double(res_host[2].ns));
    } else {
      std::printf("RESULT stream_MBps FAILED %s (sink: '%s')\n", gs_status_name(static_cast<int>(res_host[2].error)),
                  res_host[2].reply);
      status = 1;
    }
  }
  memory->release(&results);
  memory->release(&small);
  memory->release(&big);
  proxy->stop();
  return status;
}
