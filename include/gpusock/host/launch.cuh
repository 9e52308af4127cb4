// gpusock device API: running kernels, the same functor on the GPU or on host
// threads (Backend, LaunchShape, choose_backend, Grid), and the memory a
// proxy serving either needs (CudaMemoryResource, memory_resource_for). A
// launch and a memory resource name their GPU by CUDA's device ordinal (as
// cudaSetDevice takes it, after CUDA_VISIBLE_DEVICES); gpu/devices.cuh starts
// one proxy per GPU.
#ifndef GPUSOCK_HOST_LAUNCH_CUH
#define GPUSOCK_HOST_LAUNCH_CUH

#include <gpusock/host/backend.h>
#include <gpusock/proxy.h>

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cstdio>
#include <memory>
#include <type_traits>
#if defined(__CUDACC__)
#include <cuda_runtime.h>
#endif

namespace gpusock {

#if defined(__CUDACC__)
namespace detail {
// Kernels that wait on each other (a GPU listener spinning while another
// kernel connects to it) need every kernel loaded before the first one runs:
// under CUDA's lazy loading (the default since CUDA 12.2) the second launch
// loads its kernel first, which waits for the running kernel, which waits for
// the second: a deadlock until a timeout. Set before the driver starts, at
// program start; a value the user exported wins.
__attribute__((constructor, used)) static void eager_module_loading() { setenv("CUDA_MODULE_LOADING", "EAGER", 0); }
}  // namespace detail
#endif

enum class Backend : uint8_t { kHost, kCuda };

inline const char *backend_name(Backend b) { return b == Backend::kCuda ? "cuda" : "host"; }

struct LaunchShape {
  unsigned blocks = 1;
  unsigned threads = 32;
  unsigned host_warp_size = 0;  // host backend: 0 = min(32, threads); CUDA warps are 32
  int device = -1;              // CUDA: the device ordinal to run on (-1: the thread's current one)
};

#if defined(__CUDACC__)
// Makes `device` current for a scope and restores the caller's device after,
// so choosing a GPU for one launch or allocation leaves the thread as it was.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (device < 0 || cudaGetDevice(&saved_) != cudaSuccess) return;
    if (saved_ == device) {
      ok_ = true;
      return;
    }
    ok_ = cudaSetDevice(device) == cudaSuccess;
    restore_ = ok_;
  }
  ~ScopedDevice() {
    if (restore_) cudaSetDevice(saved_);
  }
  ScopedDevice(const ScopedDevice &) = delete;
  ScopedDevice &operator=(const ScopedDevice &) = delete;
  // False when the device could not be made current (a bad ordinal).
  bool ok() const { return ok_; }

 private:
  int saved_ = 0;
  bool ok_ = false, restore_ = false;
};
#endif

// True when this binary has CUDA code and a GPU is present.
inline bool cuda_available() {
#if defined(__CUDACC__)
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
  return false;
#endif
}

// The GPU when there is one (and force_host is false), else the host backend.
inline Backend choose_backend(bool force_host) {
  return !force_host && cuda_available() ? Backend::kCuda : Backend::kHost;
}

#if defined(__CUDACC__)
template <class F>
__global__ void gpusock_kernel_entry(F kernel) {
  kernel();
}
#endif

// A running grid. The functor is copied by value (as a kernel parameter) and
// needs a GS_HD operator()() const. Neither copied nor moved: it owns the
// running host threads (its HostGrid is not copyable) or the CUDA stream.
class Grid {
 public:
  ~Grid() { wait(); }

  template <class F>
  int start(Backend backend, const LaunchShape &shape, const F &kernel) {
    backend_ = backend;
    if (backend == Backend::kHost) {
      unsigned warp = shape.host_warp_size ? shape.host_warp_size : (shape.threads < 32 ? shape.threads : 32);
      return host_.start(shape.blocks, shape.threads, warp, kernel);
    }
#if defined(__CUDACC__)
    if (shape.threads % 32 != 0) return -EINVAL;  // warp calls need whole warps
    const ScopedDevice on(shape.device);
    if (shape.device >= 0 && !on.ok()) return -ENODEV;
    if (cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess) return -ENODEV;
    gpusock_kernel_entry<F><<<shape.blocks, shape.threads, 0, stream_>>>(kernel);
    if (cudaGetLastError() != cudaSuccess) return -EINVAL;
    running_ = true;
    return 0;
#else
    return -ENODEV;
#endif
  }

  // Waits for the kernel to finish: 0, or -EIO if it failed on the GPU.
  int wait() {
    if (backend_ == Backend::kHost) {
      host_.join();
      return 0;
    }
#if defined(__CUDACC__)
    if (!running_) return 0;
    running_ = false;
    const cudaError_t err = cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
    stream_ = nullptr;
    if (err != cudaSuccess) {
      last_error_ = cudaGetErrorString(err);
      return -EIO;
    }
#endif
    return 0;
  }
  const char *last_error() const { return last_error_; }

 private:
  Backend backend_ = Backend::kHost;
  host::HostGrid host_;
  const char *last_error_ = "";
#if defined(__CUDACC__)
  cudaStream_t stream_ = nullptr;
  bool running_ = false;
#endif
};
static_assert(!std::is_copy_constructible_v<Grid> && !std::is_copy_assignable_v<Grid> &&
                  !std::is_move_constructible_v<Grid>,
              "a Grid owns what runs");

#if defined(__CUDACC__)
// Memory for a proxy serving a real GPU: host-mapped pinned memory (the GPU
// reads and writes it over PCIe, the CPU at DRAM speed) and GPU memory.
class CudaMemoryResource final : public MemoryResource {
 public:
  explicit CudaMemoryResource(int device) : device_(device) { snprintf(name_, sizeof name_, "cuda:%d", device); }
  const char *name() const override { return name_; }
  bool has_device_memory() const override { return true; }
  int device() const override { return device_; }
  gs_status_t allocate(MemoryKind kind, size_t size, MemoryBlock *out) override {
    const ScopedDevice on(device_);
    if (!on.ok()) return -ENODEV;
    *out = MemoryBlock{};
    out->size = size;
    out->kind = kind;
    if (kind == MemoryKind::kHostMapped) {
      void *p = nullptr;
      if (cudaHostAlloc(&p, size, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) return -ENOMEM;
      memset(p, 0, size);
      void *d = nullptr;
      if (cudaHostGetDevicePointer(&d, p, 0) != cudaSuccess) {
        cudaFreeHost(p);
        return -ENODEV;
      }
      out->host = p;
      out->device = d;
      return 0;
    }
    void *d = nullptr;
    if (cudaMalloc(&d, size) != cudaSuccess) return -ENOMEM;
    if (zero_device(d, size) != 0) {
      cudaFree(d);
      return -EIO;
    }
    out->device = d;
    return 0;
  }
  void release(MemoryBlock *block) override {
    const ScopedDevice on(device_);
    if (block->kind == MemoryKind::kHostMapped && block->host) cudaFreeHost(block->host);
    if (block->kind == MemoryKind::kDevice && block->device) cudaFree(block->device);
    *block = MemoryBlock{};
  }

 private:
  // Zeroes on a stream of its own and waits for that stream only: a kernel
  // already running (a GPU server, or a listener another kernel is about to
  // connect to) must not hold up an allocation, as cudaDeviceSynchronize or
  // the legacy stream's cudaMemset would until it returned.
  static int zero_device(void *d, size_t size) {
    cudaStream_t s = nullptr;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return -EIO;
    const bool ok = cudaMemsetAsync(d, 0, size, s) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess;
    cudaStreamDestroy(s);
    return ok ? 0 : -EIO;
  }

  int device_;
  char name_[32];
};

inline std::unique_ptr<MemoryResource> cuda_memory_resource(int device = 0) {
  return std::make_unique<CudaMemoryResource>(device);
}
#endif

// The memory a backend needs: CUDA memory of GPU `device` for the GPU, plain
// memory for host threads.
inline std::unique_ptr<MemoryResource> memory_resource_for(Backend backend, int device = 0) {
#if defined(__CUDACC__)
  if (backend == Backend::kCuda) return cuda_memory_resource(device);
#else
  (void)backend, (void)device;
#endif
  return host_memory_resource();
}

}  // namespace gpusock

#endif
