// The smallest GPU echo server (docs/gpu.md quotes it): every block accepts a
// connection and echoes it until EOF. Runs on the GPU if there is one, else on
// the host backend. Usage: gpu_echo_minimal [PORT]; stop with Ctrl-C.
#include <gpusock/gpu.cuh>
#include <csignal>
#include <cstdlib>
#include <unistd.h>
using namespace gpusock;

struct Listen {  // one block: socket, bind, listen; the fd goes to *out
  DeviceContext ctx;
  uint16_t port;
  int *out;
  GS_HD void operator()() const {
    const sockaddr_in any = ipv4_address(0, 0, 0, 0, port);
    int s = gsocket(ctx, AF_INET, SOCK_STREAM);
    int rc = gbind(ctx, s, reinterpret_cast<const sockaddr *>(&any), sizeof any);
    if (rc == 0) rc = glisten(ctx, s, 128);
    if (thread_rank() == 0) *out = rc < 0 ? rc : s;
  }
};

struct Echo {  // persistent: each block serves one connection at a time
  DeviceContext ctx;
  int listener;
  uint8_t *bufs;
  GS_HD void operator()() const {
    uint8_t *buf = bufs + block_index() * 65536;
    while (!gshould_stop(ctx)) {
      const int c = gaccept(ctx, listener, 0, 100);  // -ETIMEDOUT: look at the stop flag again
      if (c < 0) continue;
      ssize_t n;
      while ((n = grecv(ctx, c, buf, 65536)) > 0 && gsend(ctx, c, buf, n) == n) {}
      gclose(ctx, c);
    }
  }
};

int main(int argc, char **argv) {
  const Backend backend = choose_backend(/*force_host=*/false);
  auto memory = memory_resource_for(backend);
  std::unique_ptr<Proxy> proxy;
  if (Proxy::start(ProxyOptions{}, memory.get(), &proxy) < 0) return 1;
  MemoryBlock fd{}, bufs{};  // GPU-visible memory from the same resource
  memory->allocate(MemoryKind::kHostMapped, sizeof(int), &fd);
  memory->allocate(MemoryKind::kDevice, 8 * 65536, &bufs);
  const uint16_t port = static_cast<uint16_t>(argc > 1 ? std::atoi(argv[1]) : 17480);
  Grid grid;
  grid.start(backend, {1, 32}, Listen{proxy->device_context(), port, static_cast<int *>(fd.device)});
  if (grid.wait() < 0 || *static_cast<int *>(fd.host) < 0) return 1;
  grid.start(backend, {8, backend == Backend::kCuda ? 256u : 4u},
             Echo{proxy->device_context(), *static_cast<int *>(fd.host), static_cast<uint8_t *>(bufs.device)});
  static volatile std::sig_atomic_t stop = 0;
  std::signal(SIGINT, [](int) { stop = 1; });
  while (!stop) pause();
  proxy->request_kernel_stop();       // blocking calls return -ESHUTDOWN, gshould_stop() turns true
  proxy->kernel_exited(grid.wait());  // closes what the kernels left open (the listener)
  memory->release(&fd);
  memory->release(&bufs);
  proxy->stop();
}
