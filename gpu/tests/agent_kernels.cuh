// What a test kernel reports back (AgentResult, published for a host that
// polls it while the kernel runs) and the kernels both GPU test suites use
// (gpu_socket_test.cu, multi_gpu_test.cu).
#pragma once

#include <gpusock/gpu.cuh>

#include <stdint.h>

namespace gpusock::test {

// What one block or warp reports back. The leader writes it; the test may read
// `bytes` while the kernel runs.
struct AgentResult {
  int64_t bytes;
  int64_t value;
  int32_t error;
  int32_t done;
  int32_t eagain;
  int32_t count;
  char reply[64];
};

// A store the host may be polling: visible at once, after what came before.
template <class T>
GS_HD void publish_value(T *p, T v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<volatile T *>(p) = v;
  __threadfence_system();
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}
GS_HD void publish_i64(int64_t *p, int64_t v) { publish_value(p, v); }
GS_HD void publish_i32(int32_t *p, int32_t v) { publish_value(p, v); }

// Claims sockets until none is left, then closes them: how many slots are free.
struct ClaimAllKernel {
  DeviceContext ctx;
  int *fds;
  int max;
  AgentResult *out;
  GS_HD void operator()() const {
    int n = 0;
    for (; n < max; ++n) {
      const int s = gsocket(ctx, AF_INET, SOCK_STREAM);
      if (s < 0) break;
      if (thread_rank() == 0) fds[n] = s;
    }
    sync_block();
    for (int i = 0; i < n; ++i) gclose(ctx, fds[i]);
    if (thread_rank() == 0) {
      out->value = n;
      publish_i32(&out->done, 1);
    }
  }
};

}  // namespace gpusock::test
