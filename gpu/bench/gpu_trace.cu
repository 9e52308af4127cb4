// gpu_trace: where the GPU's part of P4's round trip goes. P4's GPU echo
// server (one block, a CPU client's 64-byte ping-pong) runs with the device
// API's trace points (gpusock/gpu/trace.cuh) timestamped by the leader of
// block 0, for each way of moving small messages and for block sizes of one
// warp and of gpu_bench's 256 threads; the floor and a CPU echo server in the
// same run. For each it prints the medians of one round's steps:
//   polls      empty reads of the status line before the one that found bytes
//   poll       one read of the status line (PCIe round trip)
//   copy       bytes seen -> copied by the block (the payload's read, or none
//              when it came inline with the status)
//   to_plan    copied -> the send's plan, in three: recv's bookkeeping (rdone),
//              between the calls (gap), send's start to its plan (plan)
//   ticket     plan -> ticket taken, in two: the request made (make, incl. the
//              ring copy and barrier of a send through the ring) and the ticket
//              itself (tick: GPU-memory atomic, room on the ring)
//   store      ticket -> the request's line issued
//   gpu        bytes seen -> request issued: the GPU's work per message
//   away       request issued -> next bytes seen: the request's trip, the
//              proxy, the transport, the client, the proxy's publish, noticing
// with the client's round trip and the proxy's "GPU turnaround" (publish ->
// request taken). Times are the SM clock scaled by %globaltimer over the run.
//
//   gpu_trace [--transport T] [--iters N]
#include <gpusock/hd.h>

#include <stdint.h>

namespace gpusock::bench::tracelog {
GS_HD void mark(int point);
}
#define GPUSOCK_TRACE(point) ::gpusock::bench::tracelog::mark(point)

#include "gpu/bench/bench_kernels.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace gpusock::bench::tracelog {

// Block 0's log: (point << 56 | globaltimer) and clock64 per mark, in GPU memory.
struct Log {
  unsigned long long *words;
  unsigned cap, n;
};

#if defined(__CUDA_ARCH__)
__device__ inline Log &block_log() {
  __shared__ Log log;
  return log;
}
#endif

GS_HD void begin(unsigned long long *words, unsigned cap) {
#if defined(__CUDA_ARCH__)
  if (threadIdx.x == 0) block_log() = Log{blockIdx.x == 0 ? words : nullptr, cap, 0};
  __syncthreads();
#else
  (void)words;
  (void)cap;
#endif
}

GS_HD unsigned end() {
#if defined(__CUDA_ARCH__)
  return block_log().n;
#else
  return 0;
#endif
}

GS_HD void mark(int point) {
#if defined(__CUDA_ARCH__)
  if (threadIdx.x != 0) return;
  Log &log = block_log();
  if (log.words == nullptr || log.n >= log.cap) return;
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  const long long c = clock64();
  log.words[2 * log.n] = (uint64_t(point) << 56) | (t & ((1ull << 56) - 1));
  log.words[2 * log.n + 1] = static_cast<unsigned long long>(c);
  ++log.n;
#else
  (void)point;
#endif
}

}  // namespace gpusock::bench::tracelog

namespace {

using namespace gpusock;
using namespace gpusock::bench;

struct TracedEchoKernel {
  EchoServerKernel echo;
  unsigned long long *words;
  unsigned cap;
  unsigned *marks;  // host-mapped: how many marks the log holds
  GS_HD void operator()() const {
    tracelog::begin(words, cap);
    echo();
    if (thread_rank() == 0 && block_index() == 0) *reinterpret_cast<volatile unsigned *>(marks) = tracelog::end();
  }
};

struct Mark {
  int point;
  uint64_t gt, clk;
};

// The medians of one round's steps, from the marks (see the top).
void analyze(const char *name, const std::vector<Mark> &m, double rtt_ns, double turnaround_ns) {
  if (m.size() < 2) {
    std::printf("TRACE %s: no marks\n", name);
    return;
  }
  const double ns_per_clk = double(m.back().gt - m.front().gt) / double(m.back().clk - m.front().clk);
  auto ns = [&](const Mark &a, const Mark &b) { return double(b.clk - a.clk) * ns_per_clk; };
  std::vector<double> polls, poll, copy, to_plan, ticket, store, gpu, away, rdone, gap, plan, make, tick;
  const Mark *issued = nullptr, *seen = nullptr, *copied = nullptr, *planned = nullptr, *ticketed = nullptr,
             *stored = nullptr, *recv_done = nullptr, *called = nullptr, *begun = nullptr;
  int empty = 0;
  uint64_t min_gt_step = ~0ull;
  for (size_t i = 0; i < m.size(); ++i) {
    const Mark &k = m[i];
    if (i > 0 && k.gt > m[i - 1].gt) min_gt_step = std::min<uint64_t>(min_gt_step, k.gt - m[i - 1].gt);
    switch (k.point) {
      case trace::kRecvPollIssued:
        issued = &k;
        break;
      case trace::kRecvPolled:
        if (issued) poll.push_back(ns(*issued, k));
        ++empty;
        break;
      case trace::kRecvSeen:
        if (issued) poll.push_back(ns(*issued, k));
        if (stored) away.push_back(ns(*stored, k));
        polls.push_back(empty);
        empty = 0;
        seen = &k;
        copied = planned = ticketed = nullptr;
        break;
      case trace::kRecvCopied:
        if (seen) copy.push_back(ns(*seen, k));
        copied = &k;
        recv_done = called = nullptr;
        break;
      case trace::kRecvDone:
        if (copied) rdone.push_back(ns(*copied, k));
        recv_done = &k;
        break;
      case trace::kSendCalled:
        if (recv_done) gap.push_back(ns(*recv_done, k));
        called = &k;
        break;
      case trace::kSendPlanned:
        if (copied) to_plan.push_back(ns(*copied, k));
        if (called) plan.push_back(ns(*called, k));
        planned = &k;
        begun = nullptr;
        break;
      case trace::kRequestBegin:
        if (planned) make.push_back(ns(*planned, k));
        begun = &k;
        break;
      case trace::kRequestTicket:
        if (planned) ticket.push_back(ns(*planned, k));
        if (begun) tick.push_back(ns(*begun, k));
        ticketed = &k;
        break;
      case trace::kRequestStored:
        if (ticketed) store.push_back(ns(*ticketed, k));
        if (seen && planned) gpu.push_back(ns(*seen, k));  // a reply's request, not recv's consumption
        stored = &k;
        break;
    }
  }
  std::printf(
      "TRACE %-24s rtt %6.0f ns  turnaround %6.0f  polls %.0f  poll %4.0f  copy %4.0f  to_plan %4.0f "
      "(rdone %4.0f gap %4.0f plan %4.0f)  ticket %4.0f (make %4.0f tick %4.0f)  store %4.0f  gpu %5.0f  "
      "away %5.0f  (%zu marks, %.3f ns/clk, globaltimer step >= %llu ns)\n",
      name, rtt_ns, turnaround_ns, median_of(polls), median_of(poll), median_of(copy), median_of(to_plan),
      median_of(rdone), median_of(gap), median_of(plan), median_of(ticket), median_of(make), median_of(tick),
      median_of(store), median_of(gpu), median_of(away), m.size(), ns_per_clk,
      static_cast<unsigned long long>(min_gt_step));
}

}  // namespace

int main(int argc, char **argv) {
  int iters = 5000;
  ProxyOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--transport") options.transport = next();
    else if (a == "--iters") iters = std::atoi(next());
    else {
      std::fprintf(stderr, "usage: %s [--transport T] [--iters N]\n", argv[0]);
      return 2;
    }
  }
  const Backend backend = choose_backend(false);
  if (backend != Backend::kCuda) {
    std::printf("gpu_trace: needs a GPU (the marks are the SM's clock)\n");
    return 0;
  }
  options.busy_poll_us = -1;
  options.quiet = true;
  options.inline_messages = channel::kCtxInline;  // the proxy serves every mode; each kernel's copy picks one
  if (!options.transport.empty()) setenv("GPUSOCK_TRANSPORT", options.transport.c_str(), 1);
  auto memory = memory_resource_for(backend);
  std::unique_ptr<Proxy> proxy;
  if (Proxy::start(options, memory.get(), &proxy) < 0) return 1;
  const DeviceContext all_modes = proxy->device_context();

  constexpr unsigned kCap = 1u << 20;  // marks
  MemoryBlock results{}, words{}, log{}, buf{};
  if (memory->allocate(MemoryKind::kHostMapped, 64 * sizeof(BenchResult), &results) < 0 ||
      memory->allocate(MemoryKind::kHostMapped, 4096, &words) < 0 ||
      memory->allocate(MemoryKind::kDevice, size_t(kCap) * 16, &log) < 0 ||
      memory->allocate(MemoryKind::kDevice, 1u << 16, &buf) < 0)
    return 1;
  auto *res_host = static_cast<BenchResult *>(results.host);
  auto *res_dev = static_cast<BenchResult *>(results.device);
  auto *marks_host = reinterpret_cast<unsigned *>(res_host + 63);
  auto *marks_dev = reinterpret_cast<unsigned *>(res_dev + 63);
  const std::string tmp = "/tmp/gpu_trace." + std::to_string(getpid());
  Grid grid;
  int slot = 0;

  const double floor_ns = floor_rtt_ns(grid, backend, words, iters, res_host + slot, res_dev + slot);
  ++slot;
  std::printf("gpu_trace: transport %s; floor %.0f ns\n  %s\n", std::getenv("GPUSOCK_TRANSPORT") ?: "(default)",
              floor_ns, proxy->placement().c_str());

  int listener = -1;
  const int port = test::free_port();
  if (grid.start(backend, LaunchShape{1, 32, 0}, ListenKernel{all_modes, port, res_dev + slot}) == 0 &&
      grid.wait() == 0 && res_host[slot].error == 0)
    listener = static_cast<int>(res_host[slot].count);
  ++slot;
  if (listener < 0) {
    std::printf("gpu_trace: no GPU listener\n");
    return 1;
  }

  struct Mode {
    const char *name;
    uint32_t flags;
  };
  const Mode modes[] = {{"inline-send", channel::kCtxInlineSend},
                        {"rings", 0u},
                        {"inline-recv", channel::kCtxInlineRecv},
                        {"inline", channel::kCtxInline}};
  int status = 0;
  for (unsigned threads : {256u, 32u}) {
    for (const Mode &mode : modes) {
      if (slot >= 60) break;
      DeviceContext c = all_modes;
      c.flags &= mode.flags;
      *marks_host = 0;
      const TracedEchoKernel k{
          EchoServerKernel{c, listener, static_cast<uint8_t *>(buf.device), 1u << 16, res_dev + slot},
          static_cast<unsigned long long *>(log.device), kCap, marks_dev};
      if (grid.start(backend, LaunchShape{1, threads, 0}, k) != 0) {
        status = 1;
        break;
      }
      const ProxyStats s0 = proxy->stats();
      const double rtt = run_client({"pingpong", std::to_string(port), "64", std::to_string(iters), tmp}, tmp, 60000);
      const ProxyStats s1 = proxy->stats();
      if (rtt < 0) proxy->request_kernel_stop();
      grid.wait();
      const double turns = double(s1.turnarounds - s0.turnarounds);
      const double turnaround = turns > 0 ? double(s1.turnaround_ns - s0.turnaround_ns) / turns : -1;
      const unsigned n = std::min(*marks_host, kCap);
      std::vector<unsigned long long> raw(size_t(n) * 2);
      std::vector<Mark> m;
#if defined(__CUDACC__)
      if (n > 0) cudaMemcpy(raw.data(), log.device, raw.size() * 8, cudaMemcpyDeviceToHost);
#endif
      for (unsigned i = 0; i < n; ++i)
        m.push_back({int(raw[2 * i] >> 56), raw[2 * i] & ((1ull << 56) - 1), raw[2 * i + 1]});
      // The last rounds only: the first ones include the accept and the warm-up.
      if (m.size() > 12 * size_t(iters)) m.erase(m.begin(), m.end() - 12 * size_t(iters));
      const std::string name = std::string(mode.name) + "/" + std::to_string(threads) + "t";
      analyze(name.c_str(), m, rtt, turnaround);
      if (res_host[slot].error != 0 || rtt < 0) status = 1;
      ++slot;
      std::fflush(stdout);
    }
  }
  {
    const int cpu_port = test::free_port();
    Peer server({"echo1", std::to_string(cpu_port)});
    const double cpu = run_client({"pingpong", std::to_string(cpu_port), "64", std::to_string(iters), tmp}, tmp, 60000);
    std::printf("TRACE cpu-echo-server            rtt %6.0f ns\n", cpu);
  }
  proxy->stop();
  return status;
}
