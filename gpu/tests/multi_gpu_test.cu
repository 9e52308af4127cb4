// Several GPUs: one proxy per GPU (GpuSet), and GPU-to-GPU sockets, a kernel
// on one GPU talking to a kernel on another, in this process and across
// processes (gpu_link, the other end as a program). Part of gpu_host_tests
// (emulated GPUs: independent proxies over host memory) and gpu_device_tests
// (real GPUs; one GPU serves as several when there is only one: GpuSet's
// `share`). The transport is GPUSOCK_TRANSPORT's, set by ctest per run.
#include "gpu/bench/gpu_link_kernels.cuh"
#include "gpu/tests/agent_kernels.cuh"
#include "gpu/tests/harness.h"

#include <gpusock/gpu.cuh>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace gpusock::test {
namespace {

using link::LinkResult;

#if defined(__CUDACC__)
constexpr Backend kBackend = Backend::kCuda;
constexpr unsigned kThreads = 128;
#else
constexpr Backend kBackend = Backend::kHost;
constexpr unsigned kThreads = 4;  // emulated threads are host threads: keep few
#endif

class MultiGpu : public ::testing::Test {
 protected:
  void start(int count, ProxyOptions proxy = {}) {
    GpuSetOptions options;
    options.backend = kBackend;
    options.count = count;
    options.share = true;  // one real GPU serves as several
    options.proxy = proxy;
    options.proxy.quiet = true;
    ASSERT_EQ(GpuSet::start(options, &gpus_), 0) << "the GPU set did not start";
    ASSERT_EQ(gpus_->size(), count);
  }
  void TearDown() override {
    if (gpus_) gpus_->request_kernel_stop();
    for (Grid &g : grids_) EXPECT_EQ(g.wait(), 0) << g.last_error();
    for (auto &[gpu, block] : blocks_) gpus_->memory(gpu).release(&block);
    if (gpus_) gpus_->stop();
  }
  uint8_t *gpu_buffer(int gpu, size_t n) {
    MemoryBlock b{};
    EXPECT_EQ(gpus_->memory(gpu).allocate(MemoryKind::kDevice, n, &b), 0);
    blocks_.push_back({gpu, b});
    return static_cast<uint8_t *>(b.device);
  }
  template <class K>
  void launch(int gpu, Grid &grid, const K &kernel) {
    ASSERT_EQ(gpus_->launch(gpu, grid, LaunchShape{1, kThreads, 0}, kernel), 0);
  }
  // Waits for a kernel's result (its `done` flag), then for its grid.
  void finish(Grid &grid, const int32_t *done_flag, int ms) {
    const bool done = wait_until([&] { return load_shared(done_flag) == 1; }, ms);
    if (!done) gpus_->request_kernel_stop();
    EXPECT_EQ(grid.wait(), 0) << grid.last_error();
    ASSERT_TRUE(done) << "the kernel did not finish in " << ms << " ms";
  }
  int listen(int gpu, int port) {
    LinkResult *r = mem_.alloc<LinkResult>(1);
    launch(gpu, grids_[gpu], link::ListenKernel{gpus_->context(gpu), loopback(port), 8, r});
    finish(grids_[gpu], &r->done, 20000);
    EXPECT_EQ(r->error, 0) << gs_status_name(r->error);
    return r->fd;
  }
  // A stream of `bytes` from GPU `from` to a listener on GPU `to`.
  void stream(int from, int to, uint64_t bytes, uint64_t window, uint64_t seed) {
    const int port = free_port();
    const int l = listen(to, port);
    ASSERT_GE(l, 0);
    LinkResult *r = mem_.alloc<LinkResult>(2);
    launch(to, grids_[to],
           link::StreamRecvKernel{gpus_->context(to), l, loopback(port), gpu_buffer(to, window), window, seed, r});
    launch(from, grids_[from],
           link::StreamSendKernel{gpus_->context(from), -1, loopback(port), bytes, gpu_buffer(from, window), window,
                                  seed, r + 1});
    finish(grids_[from], &r[1].done, 120000);
    finish(grids_[to], &r->done, 20000);
    EXPECT_EQ(r[0].error, 0) << gs_status_name(r[0].error);
    EXPECT_EQ(r[1].error, 0) << gs_status_name(r[1].error);
    EXPECT_EQ(static_cast<uint64_t>(r[0].bytes), bytes) << "received";
    EXPECT_EQ(static_cast<uint64_t>(r[1].bytes), bytes) << "the receiver's count, seen by the sender";
    EXPECT_EQ(r[0].bad, 0) << "pieces with a wrong byte";
  }
  void ping_pong(int pinger, int ponger, uint32_t size, int64_t rounds) {
    const int port = free_port();
    const int l = listen(ponger, port);
    ASSERT_GE(l, 0);
    LinkResult *r = mem_.alloc<LinkResult>(2);
    launch(ponger, grids_[ponger],
           link::PingPongKernel{gpus_->context(ponger), l, loopback(port), false, size, rounds,
                                gpu_buffer(ponger, 2 * size), r});
    launch(pinger, grids_[pinger],
           link::PingPongKernel{gpus_->context(pinger), -1, loopback(port), true, size, rounds,
                                gpu_buffer(pinger, 2 * size), r + 1});
    finish(grids_[pinger], &r[1].done, 120000);
    finish(grids_[ponger], &r->done, 20000);
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(r[i].error, 0) << gs_status_name(r[i].error);
      EXPECT_EQ(r[i].rounds, rounds);
    }
    EXPECT_EQ(r[1].bad, 0) << "round trips that came back different";
  }
  // gpu_link in another process, on the same backend (GPU 0 of its own).
  static std::string link_binary() { return sibling_binary("gpu_link"); }
  static std::vector<std::string> link_args(std::vector<std::string> args) {
    if (kBackend == Backend::kHost) args.push_back("--host-backend");
    return args;
  }

  std::unique_ptr<GpuSet> gpus_;
  Grid grids_[3];
  SharedMemory mem_;
  std::vector<std::pair<int, MemoryBlock>> blocks_;
};

TEST_F(MultiGpu, EachGpuHasItsOwnProxyAndSockets) {
  ProxyOptions proxy;
  proxy.max_sockets = 8;
  start(3, proxy);
  std::set<const void *> rings;
  std::set<std::string> memories;
  for (int i = 0; i < 3; ++i) {
    rings.insert(gpus_->context(i).requests);
    memories.insert(gpus_->memory(i).name());
    EXPECT_NE(gpus_->proxy(i).placement().find(gpus_->memory(i).name()), std::string::npos);
  }
  EXPECT_EQ(rings.size(), 3u) << "one request ring per GPU";
  if (kBackend == Backend::kHost) {
    EXPECT_EQ(memories.size(), 3u) << "one emulated GPU each";
  }
  // Every GPU claims all of its 8 slots at once: no GPU sees another's table.
  AgentResult *r = mem_.alloc<AgentResult>(3);
  for (int i = 0; i < 3; ++i) launch(i, grids_[i], ClaimAllKernel{gpus_->context(i), mem_.alloc<int>(16), 16, r + i});
  for (int i = 0; i < 3; ++i) {
    finish(grids_[i], &r[i].done, 20000);
    EXPECT_EQ(r[i].value, 8) << "GPU " << i;
  }
}

TEST_F(MultiGpu, GpuToGpuStreamSameProcess) {
  start(2);
  for (uint64_t bytes : {uint64_t(1), uint64_t(65537), uint64_t(4u << 20) + 3}) {
    SCOPED_TRACE(bytes);
    stream(1, 0, bytes, 1u << 16, bytes);
    stream(0, 1, bytes, 1u << 16, bytes + 1);
  }
}

TEST_F(MultiGpu, GpuToGpuPingPongSameProcess) {
  start(2);
  ping_pong(1, 0, 64, 200);
  ping_pong(0, 1, 4096, 50);
}

TEST_F(MultiGpu, ThreeGpusEachStreamToTheNext) {
  start(3);
  for (int i = 0; i < 3; ++i) stream(i, (i + 1) % 3, (1u << 20) + 7, 1u << 15, 40 + i);
}

TEST_F(MultiGpu, GpuToGpuStreamOtherProcess) {
  start(1);
  const uint64_t bytes = (4u << 20) + 5;
  {  // this process sends, the other receives
    const int port = free_port();
    Peer receiver(link_args({"recv", std::to_string(port), "--window", "65536", "--seed", "21"}), link_binary());
    LinkResult *r = mem_.alloc<LinkResult>(1);
    launch(
        0, grids_[0],
        link::StreamSendKernel{gpus_->context(0), -1, loopback(port), bytes, gpu_buffer(0, 1u << 16), 1u << 16, 21, r});
    finish(grids_[0], &r->done, 120000);
    EXPECT_EQ(r->error, 0) << gs_status_name(r->error);
    EXPECT_EQ(static_cast<uint64_t>(r->bytes), bytes);
    EXPECT_EQ(r->bad, 0);
    int code = -1;
    EXPECT_TRUE(receiver.wait_exit(20000, &code));
    EXPECT_EQ(code, 0) << "gpu_link recv";
  }
  {  // the other process sends, this one receives
    const int port = free_port();
    const int l = listen(0, port);
    ASSERT_GE(l, 0);
    Peer sender(link_args({"send", std::to_string(port), "--bytes", std::to_string(bytes), "--window", "32768",
                           "--seed", "22"}),
                link_binary());
    LinkResult *r = mem_.alloc<LinkResult>(1);
    launch(0, grids_[0],
           link::StreamRecvKernel{gpus_->context(0), l, loopback(port), gpu_buffer(0, 1u << 15), 1u << 15, 22, r});
    finish(grids_[0], &r->done, 120000);
    EXPECT_EQ(r->error, 0) << gs_status_name(r->error);
    EXPECT_EQ(static_cast<uint64_t>(r->bytes), bytes);
    EXPECT_EQ(r->bad, 0);
    int code = -1;
    EXPECT_TRUE(sender.wait_exit(20000, &code));
    EXPECT_EQ(code, 0) << "gpu_link send";
  }
}

TEST_F(MultiGpu, GpuToGpuPingPongOtherProcess) {
  start(1);
  const int port = free_port();
  Peer ponger(link_args({"pong", std::to_string(port), "--size", "256", "--rounds", "200"}), link_binary());
  LinkResult *r = mem_.alloc<LinkResult>(1);
  launch(0, grids_[0],
         link::PingPongKernel{gpus_->context(0), -1, loopback(port), true, 256, 200, gpu_buffer(0, 512), r});
  finish(grids_[0], &r->done, 120000);
  EXPECT_EQ(r->error, 0) << gs_status_name(r->error);
  EXPECT_EQ(r->rounds, 200);
  EXPECT_EQ(r->bad, 0);
  int code = -1;
  EXPECT_TRUE(ponger.wait_exit(20000, &code));
  EXPECT_EQ(code, 0) << "gpu_link pong";
}

}  // namespace
}  // namespace gpusock::test
