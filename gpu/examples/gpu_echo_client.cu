// GPU echo client: N blocks, each with one connection to an echo server,
// sending --msgs messages of --size bytes and checking every echo. Prints the
// mean round trip (GPU clock) and the echoed bandwidth.
//
//   gpu_echo_client [--addr 127.0.0.1] [--port 17480] [--blocks 1] [--threads 128]
//                   [--msgs 1000] [--size 64] [--transport fabric:tcp] [--host-backend]
#include <gpusock/gpu.cuh>

#include <arpa/inet.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

using namespace gpusock;

struct ClientResult {
  long long error;
  unsigned long long bytes;
  unsigned long long ns;
  unsigned long long bad;  // messages whose echo differed
};

struct EchoClientKernel {
  DeviceContext ctx;
  sockaddr_in server;
  int msgs;
  uint32_t size;
  uint8_t *buffers;  // 2 x size per block
  ClientResult *out;
  GS_HD void operator()() const {
    uint8_t *tx = buffers + size_t(block_index()) * 2 * size;
    uint8_t *rx = tx + size;
    ClientResult *r = out + block_index();
    int s = -1, rc = -ECONNREFUSED;
    for (int attempt = 0; attempt < 200 && rc < 0; ++attempt) {  // the server may still be starting
      s = gsocket(ctx, AF_INET, SOCK_STREAM);
      rc = s < 0 ? s : gconnect(ctx, s, reinterpret_cast<const sockaddr *>(&server), sizeof server, 5000);
      if (rc < 0 && s >= 0) gclose(ctx, s);
      if (rc < 0) pause_ns(1000000);
    }
    unsigned long long bad = 0, bytes = 0;
    const unsigned long long t0 = now_ns();
    for (int m = 0; m < msgs && rc >= 0; ++m) {
      for (uint32_t i = thread_rank(); i < size; i += block_dim()) tx[i] = static_cast<uint8_t>(m * 31 + i);
      sync_block();
      const ssize_t sent = gsend(ctx, s, tx, size, 0, 10000);
      const ssize_t got = sent == static_cast<ssize_t>(size) ? grecv(ctx, s, rx, size, MSG_WAITALL, 10000) : sent;
      if (got != static_cast<ssize_t>(size)) {
        rc = got < 0 ? static_cast<int>(got) : -EIO;
        break;
      }
      for (uint32_t i = thread_rank(); i < size; i += block_dim())
        if (rx[i] != static_cast<uint8_t>(m * 31 + i)) bad = 1;
      bytes += size;
    }
    const unsigned long long ns = now_ns() - t0;
    const unsigned wrong = BlockScope::count(bad != 0);
    if (s >= 0 && rc >= 0) gclose(ctx, s);
    if (thread_rank() == 0) {
      r->error = rc < 0 ? rc : 0;
      r->bytes = bytes;
      r->ns = ns;
      r->bad = wrong;
    }
  }
};

}  // namespace

int main(int argc, char **argv) {
  std::string addr = "127.0.0.1";
  int port = 17480, msgs = 1000;
  unsigned blocks = 1, threads = 128;
  uint32_t size = 64;
  bool force_host = false;
  ProxyOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--addr") addr = next();
    else if (a == "--port") port = std::atoi(next());
    else if (a == "--blocks") blocks = static_cast<unsigned>(std::atoi(next()));
    else if (a == "--threads") threads = static_cast<unsigned>(std::atoi(next()));
    else if (a == "--msgs") msgs = std::atoi(next());
    else if (a == "--size") size = static_cast<uint32_t>(std::atoi(next()));
    else if (a == "--transport") options.transport = next();
    else if (a == "--host-backend") force_host = true;
    else {
      std::fprintf(stderr,
                   "usage: %s [--addr A] [--port P] [--blocks N] [--threads T] [--msgs M] [--size S] "
                   "[--transport T] [--host-backend]\n",
                   argv[0]);
      return 2;
    }
  }
  sockaddr_in server{};
  server.sin_family = AF_INET;
  server.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, addr.c_str(), &server.sin_addr) != 1) {
    std::fprintf(stderr, "gpu_echo_client: bad address %s\n", addr.c_str());
    return 2;
  }
  const Backend backend = choose_backend(force_host);
  if (backend == Backend::kHost && threads > 8) threads = 8;
  if (backend == Backend::kCuda) options.busy_poll_us = -1;
  options.max_sockets = blocks + 8;
  auto memory = memory_resource_for(backend);
  std::unique_ptr<Proxy> proxy;
  if (int rc = Proxy::start(options, memory.get(), &proxy); rc < 0) return 1;

  MemoryBlock buffers{}, results{};
  if (memory->allocate(MemoryKind::kHostMapped, size_t(blocks) * 2 * size, &buffers) < 0 ||
      memory->allocate(MemoryKind::kHostMapped, sizeof(ClientResult) * blocks, &results) < 0)
    return 1;
  Grid grid;
  LaunchShape shape{blocks, threads, 0};
  const auto *res = static_cast<const ClientResult *>(results.host);
  int rc =
      grid.start(backend, shape,
                 EchoClientKernel{proxy->device_context(), server, msgs, size, static_cast<uint8_t *>(buffers.device),
                                  static_cast<ClientResult *>(results.device)});
  if (rc == 0) rc = grid.wait();
  int status = rc < 0 ? 1 : 0;
  unsigned long long bytes = 0, ns = 0;
  for (unsigned b = 0; b < blocks && rc == 0; ++b) {
    if (res[b].error < 0 || res[b].bad) {
      std::fprintf(stderr, "gpu_echo_client: block %u: %s, %llu wrong echoes\n", b,
                   gs_status_name(static_cast<int>(res[b].error)), res[b].bad);
      status = 1;
    }
    bytes += res[b].bytes;
    ns = res[b].ns > ns ? res[b].ns : ns;
  }
  if (status == 0 && msgs > 0)
    std::printf("gpu_echo_client: %s backend, %u blocks, %d x %u B: rtt %.2f us, echoed %.1f MB/s\n",
                backend_name(backend), blocks, msgs, size, double(ns) / 1000.0 / msgs,
                ns ? double(bytes) * 1000.0 / double(ns) : 0.0);
  memory->release(&buffers);
  memory->release(&results);
  proxy->stop();
  return status;
}
