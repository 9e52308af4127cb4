// GPU echo server: a persistent kernel of N blocks. Every block polls the
// shared listener and its own connections (up to --conns per block) with
// gpoll, accepts while it has room, and echoes what arrives.
//
//   gpu_echo_server [--port 17480] [--blocks 4] [--threads 128] [--conns 8]
//                   [--seconds 0 (until SIGINT/SIGTERM)] [--transport fabric:tcp]
//                   [--host-backend]
// Runs on the GPU when the binary has CUDA and a GPU is present, else (or with
// --host-backend) on the host backend. Prints one "listening" line when ready.
#include <gpusock/gpu.cuh>

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

using namespace gpusock;

struct ListenKernel {
  DeviceContext ctx;
  int port;
  int *out;
  GS_HD void operator()() const {
    const int s = gsocket(ctx, AF_INET, SOCK_STREAM | SOCK_NONBLOCK);  // accepting never blocks a block
    const sockaddr_in any = ipv4_address(0, 0, 0, 0, static_cast<uint16_t>(port));
    int rc = s < 0 ? s : gbind(ctx, s, reinterpret_cast<const sockaddr *>(&any), sizeof any);
    if (rc == 0) rc = glisten(ctx, s, 1024);
    if (thread_rank() == 0) *out = rc < 0 ? rc : s;
  }
};

struct EchoServerKernel {
  DeviceContext ctx;
  int listener;
  int conns;         // per block
  gpollfd *polls;    // (conns + 1) per block: [0] is the listener
  uint8_t *buffers;  // buf_size per block
  uint32_t buf_size;
  unsigned long long *echoed;  // bytes, per block
  // The accepted sockets are non-blocking: a send stops where the ring is
  // full. Waits (POLLOUT on the connection's own poll entry) for the peer
  // to drain it, up to 10 s of no progress.
  GS_HD bool send_all(int fd, gpollfd *entry, ssize_t n) const {
    ssize_t sent = 0;
    while (sent < n) {
      const ssize_t k = gsend(ctx, fd, buf_of_block() + sent, static_cast<size_t>(n - sent));
      if (k > 0) {
        sent += k;
        continue;
      }
      if (k != -EAGAIN) return false;
      if (thread_rank() == 0) entry->events = POLLOUT;
      sync_block();
      const int ready = gpoll(ctx, entry, 1, 10000);
      if (thread_rank() == 0) entry->events = POLLIN;
      sync_block();
      if (ready <= 0) return false;
    }
    return true;
  }
  GS_HD uint8_t *buf_of_block() const { return buffers + size_t(block_index()) * buf_size; }
  GS_HD void operator()() const {
    gpollfd *pf = polls + size_t(block_index()) * (conns + 1);
    uint8_t *buf = buf_of_block();
    if (thread_rank() == 0) {
      pf[0] = gpollfd{listener, POLLIN, 0};
      for (int i = 1; i <= conns; ++i) pf[i] = gpollfd{-1, POLLIN, 0};
    }
    sync_block();
    unsigned long long bytes = 0;
    while (!gshould_stop(ctx)) {
      // A full block stops watching the listener (else it would spin on it).
      int used = 0;
      for (int i = 1; i <= conns; ++i) used += pf[i].fd >= 0;
      sync_block();
      if (thread_rank() == 0) pf[0].events = used < conns ? POLLIN : 0;
      if (gpoll(ctx, pf, conns + 1, 100) <= 0) continue;
      if (pf[0].revents & POLLIN) {
        for (int i = 1; i <= conns; ++i) {
          if (pf[i].fd >= 0) continue;
          const int c = gaccept(ctx, listener, SOCK_NONBLOCK);  // -EAGAIN: another block took it
          if (thread_rank() == 0 && c >= 0) pf[i].fd = c;
          sync_block();
          break;
        }
      }
      for (int i = 1; i <= conns; ++i) {
        const int fd = pf[i].fd;
        if (fd < 0 || !pf[i].revents) continue;
        const ssize_t n = grecv(ctx, fd, buf, buf_size);
        if (n == -EAGAIN) continue;
        if (n > 0 && send_all(fd, pf + i, n)) {
          bytes += static_cast<unsigned long long>(n);
          continue;
        }
        gshutdown(ctx, fd, SHUT_WR);  // EOF, error, or a peer that stopped reading
        gclose(ctx, fd);
        sync_block();
        if (thread_rank() == 0) pf[i].fd = -1;
        sync_block();
      }
    }
    for (int i = 1; i <= conns; ++i)
      if (pf[i].fd >= 0) gclose(ctx, pf[i].fd);
    if (thread_rank() == 0) echoed[block_index()] = bytes;
  }
};

volatile sig_atomic_t g_stop = 0;

}  // namespace

int main(int argc, char **argv) {
  int port = 17480, seconds = 0;
  unsigned blocks = 4, threads = 128;
  int conns = 8;
  bool force_host = false;
  ProxyOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--port") port = std::atoi(next());
    else if (a == "--blocks") blocks = static_cast<unsigned>(std::atoi(next()));
    else if (a == "--threads") threads = static_cast<unsigned>(std::atoi(next()));
    else if (a == "--conns") conns = std::atoi(next());
    else if (a == "--seconds") seconds = std::atoi(next());
    else if (a == "--transport") options.transport = next();
    else if (a == "--host-backend") force_host = true;
    else {
      std::fprintf(stderr,
                   "usage: %s [--port P] [--blocks N] [--threads T] [--conns C] [--seconds S] "
                   "[--transport T] [--host-backend]\n",
                   argv[0]);
      return 2;
    }
  }
  signal(SIGINT, [](int) { g_stop = 1; });
  signal(SIGTERM, [](int) { g_stop = 1; });
  signal(SIGPIPE, SIG_IGN);

  const Backend backend = choose_backend(force_host);
  if (backend == Backend::kHost && threads > 8) threads = 8;  // emulated threads are host threads
  options.max_sockets = blocks * static_cast<unsigned>(conns) + 8;
  if (backend == Backend::kCuda) options.busy_poll_us = -1;  // the proxy owns a core: spin
  auto memory = memory_resource_for(backend);
  std::unique_ptr<Proxy> proxy;
  if (int rc = Proxy::start(options, memory.get(), &proxy); rc < 0) {
    std::fprintf(stderr, "gpu_echo_server: proxy: %s\n", gs_status_name(rc));
    return 1;
  }
  const DeviceContext ctx = proxy->device_context();

  // GPU-visible memory from the proxy's resource: the listener fd and the
  // echo counts in host-mapped memory (read here), the rest in GPU memory.
  const uint32_t buf_size = 1 << 16;
  MemoryBlock shared_mem{}, polls_mem{}, buffers_mem{};
  if (memory->allocate(MemoryKind::kHostMapped, 64 + sizeof(unsigned long long) * blocks, &shared_mem) < 0 ||
      memory->allocate(MemoryKind::kDevice, sizeof(gpollfd) * blocks * (conns + 1), &polls_mem) < 0 ||
      memory->allocate(MemoryKind::kDevice, size_t(blocks) * buf_size, &buffers_mem) < 0) {
    std::fprintf(stderr, "gpu_echo_server: out of memory\n");
    return 1;
  }
  int *listener = static_cast<int *>(shared_mem.host);
  auto *echoed = reinterpret_cast<unsigned long long *>(static_cast<uint8_t *>(shared_mem.host) + 64);
  int *listener_dev = static_cast<int *>(shared_mem.device);
  auto *echoed_dev = reinterpret_cast<unsigned long long *>(static_cast<uint8_t *>(shared_mem.device) + 64);
  auto *polls = static_cast<gpollfd *>(polls_mem.device);
  auto *buffers = static_cast<uint8_t *>(buffers_mem.device);
  Grid grid;
  LaunchShape one{1, threads, 0};
  if (grid.start(backend, one, ListenKernel{ctx, port, listener_dev}) < 0 || grid.wait() < 0 || *listener < 0) {
    std::fprintf(stderr, "gpu_echo_server: listen on port %d: %s\n", port, gs_status_name(*listener));
    return 1;
  }
  LaunchShape shape{blocks, threads, 0};
  if (int rc =
          grid.start(backend, shape, EchoServerKernel{ctx, *listener, conns, polls, buffers, buf_size, echoed_dev});
      rc < 0) {
    std::fprintf(stderr, "gpu_echo_server: launch: %s\n", gs_status_name(rc));
    return 1;
  }
  std::printf("gpu_echo_server: listening on port %d (%s backend, %u blocks x %u threads, %d connections per block)\n",
              port, backend_name(backend), blocks, threads, conns);
  std::fflush(stdout);
  for (int t = 0; !g_stop && (seconds <= 0 || t < seconds * 10); ++t) usleep(100000);
  proxy->request_kernel_stop();
  const int rc = grid.wait();
  unsigned long long total = 0;
  for (unsigned b = 0; b < blocks; ++b) total += echoed[b];
  for (MemoryBlock *m : {&shared_mem, &polls_mem, &buffers_mem}) memory->release(m);
  proxy->stop();
  std::printf("gpu_echo_server: echoed %llu bytes\n", total);
  return rc < 0 ? 1 : 0;
}
