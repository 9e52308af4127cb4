// What the GPU socket tests share (gpu_socket_test.cu, reliability/): the
// backend this binary was compiled for, the result block a kernel's leader
// publishes, a connect that retries, a kernel that listens, and the fixture
// that starts a proxy and runs kernels with deadlines.
#pragma once

#include "gpu/tests/agent_kernels.cuh"
#include "gpu/tests/harness.h"

#include <gpusock/gpu.cuh>
#include <gtest/gtest.h>

#include <memory>

// In the anonymous namespace, as the tests' own helpers are (each binary is one
// source): loopback() here is the device one, not test-support's.
namespace gpusock::test {
namespace {

#if defined(__CUDACC__)
constexpr Backend kBackend = Backend::kCuda;
constexpr unsigned kBlockThreads = 128;  // 4 warps
constexpr unsigned kHostWarp = 0;
#else
constexpr Backend kBackend = Backend::kHost;
constexpr unsigned kBlockThreads = 4;  // emulated threads are host threads: keep few
constexpr unsigned kHostWarp = 2;      // so a block still holds 2 warps
#endif

GS_HD sockaddr_in loopback(int port) { return ipv4_address(127, 0, 0, 1, static_cast<uint16_t>(port)); }

// Block-cooperative connect that retries while the peer is not listening yet.
GS_HD int connect_retry(const DeviceContext &ctx, int port) {
  const uint64_t end = now_ns() + 20ull * 1000000000ull;
  int rc = -ETIMEDOUT;
  while (now_ns() < end) {
    const int s = gsocket(ctx, AF_INET, SOCK_STREAM);
    if (s < 0) return s;
    const sockaddr_in a = loopback(port);
    rc = gconnect(ctx, s, reinterpret_cast<const sockaddr *>(&a), sizeof a, 5000);
    if (rc == 0) return s;
    gclose(ctx, s);
    if (rc == -ESHUTDOWN) return rc;
    pause_ns(500000);
    pause_ns(500000);
  }
  return rc;
}

struct ListenKernel {
  DeviceContext ctx;
  int port;
  int backlog;
  int type_flags;
  AgentResult *out;
  GS_HD void operator()() const {
    const int s = gsocket(ctx, AF_INET, SOCK_STREAM | type_flags);
    const sockaddr_in a = loopback(port);
    int rc = s < 0 ? s : gbind(ctx, s, reinterpret_cast<const sockaddr *>(&a), sizeof a);
    if (rc == 0) rc = glisten(ctx, s, backlog);
    if (thread_rank() == 0) {
      out->value = s;
      out->error = rc;
      publish_i32(&out->done, 1);
    }
  }
};

// ---------------------------------------------------------------- fixture

class GpuSockets : public ::testing::Test {
 protected:
  void start_proxy(ProxyOptions options = {}) {
    options.quiet = true;
    memory_ = memory_resource_for(kBackend);
    ASSERT_EQ(Proxy::start(options, memory_.get(), &proxy_), 0) << "proxy did not start";
    ctx_ = proxy_->device_context();
  }
  void TearDown() override { finish(); }
  // Stops the kernel (if still running) and the proxy.
  void finish() {
    if (proxy_) proxy_->request_kernel_stop();
    EXPECT_EQ(grid_.wait(), 0) << grid_.last_error();
    if (proxy_) proxy_->stop();
    proxy_.reset();
  }

  template <class K>
  void launch(unsigned blocks, unsigned threads, const K &kernel) {
    LaunchShape shape;
    shape.blocks = blocks;
    shape.threads = threads;
    shape.host_warp_size = kHostWarp;
    ASSERT_EQ(grid_.start(kBackend, shape, kernel), 0);
  }
  // Runs a kernel to completion within ms (else stops it: blocking calls end).
  template <class K>
  void run(unsigned blocks, unsigned threads, const K &kernel, const AgentResult *res, int expected, int ms) {
    launch(blocks, threads, kernel);
    const bool finished = wait_until(
        [&] {
          int n = 0;
          for (int i = 0; i < expected; ++i) n += load_shared(&res[i].done);
          return n == expected;
        },
        ms);
    if (!finished) proxy_->request_kernel_stop();
    EXPECT_EQ(grid_.wait(), 0) << grid_.last_error();
    ASSERT_TRUE(finished) << "the kernel did not finish in " << ms << " ms";
  }

  // A listening GPU socket on a fresh port: its fd.
  int gpu_listen(int port, int backlog, int type_flags = 0) {
    AgentResult *r = mem_.alloc<AgentResult>(1);
    run(1, kBlockThreads, ListenKernel{ctx_, port, backlog, type_flags, r}, r, 1, 10000);
    EXPECT_EQ(r->error, 0) << gs_status_name(r->error);
    return static_cast<int>(r->value);
  }

  std::unique_ptr<MemoryResource> memory_;
  std::unique_ptr<Proxy> proxy_;
  DeviceContext ctx_{};
  SharedMemory mem_;
  Grid grid_;
};

}  // namespace
}  // namespace gpusock::test
