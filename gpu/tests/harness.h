// Host-side helpers of the GPU socket tests: their peer program, memory both
// the kernel and the test read, waiting with deadlines. Peer processes, ports
// and clocks come from test-support.
#pragma once

#include <gpusock/gpu.cuh>

#include "test-support/peer_process.h"
#include "test-support/sockets.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace gpusock::test {

// The peer program: $GPUSOCK_TEST_PEER, else gpu_test_peer beside this binary.
inline std::string peer_binary() {
  if (const char *env = std::getenv("GPUSOCK_TEST_PEER"); env && *env) return env;
  return sibling_binary("gpu_test_peer");
}

// A spawned peer process (gpu_test_peer with args, or `program` with args),
// terminated, then killed, when it goes out of scope.
struct Peer : PeerProcess {
  explicit Peer(const std::vector<std::string> &args, const std::string &program = "", PeerPipes pipes = {})
      : PeerProcess(program.empty() ? peer_binary() : program, args, pipes) {}
};

// Memory a kernel and the test both use, on either backend: host-mapped pinned
// memory under CUDA (the test may read it while the kernel runs), plain memory
// on the host backend.
class SharedMemory {
 public:
  SharedMemory() = default;
  SharedMemory(const SharedMemory &) = delete;
  SharedMemory &operator=(const SharedMemory &) = delete;
  ~SharedMemory() {
    for (void *p : blocks_) {
#if defined(__CUDACC__)
      cudaFreeHost(p);
#else
      std::free(p);
#endif
    }
  }
  template <class T>
  T *alloc(size_t count) {
    const size_t bytes = ((count * sizeof(T)) + 4095) & ~size_t(4095);
    void *p = nullptr;
#if defined(__CUDACC__)
    if (cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) return nullptr;
#else
    p = std::aligned_alloc(4096, bytes);
    if (!p) return nullptr;
#endif
    std::memset(p, 0, bytes);
    blocks_.push_back(p);
    return static_cast<T *>(p);
  }

 private:
  std::vector<void *> blocks_;
};

template <class T>
T load_shared(const T *p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

}  // namespace gpusock::test
