// Where the host-centric server's batches run: on the GPU with pinned host
// buffers, CUDA streams and events, or (no GPU, CI) on the host backend,
// where copies are memcpy and a launch runs the same kernel functor on
// emulated blocks before it returns.
#ifndef FV_BATCH_DEVICE_CUH
#define FV_BATCH_DEVICE_CUH

#include <gpusock/gpu.cuh>

#include <cstdlib>
#include <cstring>

namespace fv {

class BatchDevice {
 public:
  explicit BatchDevice(gpusock::Backend backend) : gpu_(backend == gpusock::Backend::kCuda) {}
  bool gpu() const { return gpu_; }

  // One stream (and its completion event) per buffer set.
  struct Queue {
    void *stream = nullptr;
    void *done = nullptr;
  };

  int make_queue(Queue *q) {
#if defined(__CUDACC__)
    if (gpu_) {
      cudaSetDevice(0);
      cudaStream_t s;
      cudaEvent_t e;
      if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
          cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess)
        return -ENODEV;
      q->stream = s;
      q->done = e;
    }
#endif
    (void)q;
    return 0;
  }

  // Pinned host memory (the GPU copies it by DMA) / GPU memory.
  void *host_alloc(size_t n) {
#if defined(__CUDACC__)
    if (gpu_) {
      void *p = nullptr;
      return cudaHostAlloc(&p, n, cudaHostAllocDefault) == cudaSuccess ? p : nullptr;
    }
#endif
    return std::calloc(1, n);
  }
  void *device_alloc(size_t n) {
#if defined(__CUDACC__)
    if (gpu_) {
      void *p = nullptr;
      return cudaMalloc(&p, n) == cudaSuccess ? p : nullptr;
    }
#endif
    return std::calloc(1, n);
  }

  void to_device(void *dst, const void *src, size_t n, const Queue &q) { copy(dst, src, n, q, true); }
  void to_host(void *dst, const void *src, size_t n, const Queue &q) { copy(dst, src, n, q, false); }

  // Queues kernel on blocks x threads (on the host backend: runs it now).
  template <class K>
  int launch(unsigned blocks, unsigned threads, const K &kernel, const Queue &q) {
#if defined(__CUDACC__)
    if (gpu_) {
      gpusock::gpusock_kernel_entry<K><<<blocks, threads, 0, static_cast<cudaStream_t>(q.stream)>>>(kernel);
      return cudaGetLastError() == cudaSuccess ? 0 : -EIO;
    }
#endif
    (void)q;
    gpusock::Grid grid;
    if (int rc = grid.start(gpusock::Backend::kHost, {blocks, threads}, kernel); rc < 0) return rc;
    return grid.wait();
  }

  // Marks the end of what was queued; done() tells whether it has run.
  int record(const Queue &q) {
#if defined(__CUDACC__)
    if (gpu_)
      return cudaEventRecord(static_cast<cudaEvent_t>(q.done), static_cast<cudaStream_t>(q.stream)) == cudaSuccess
                 ? 0
                 : -EIO;
#endif
    (void)q;
    return 0;
  }
  // 1 done, 0 not yet, < 0 the GPU failed.
  int done(const Queue &q, bool wait) {
#if defined(__CUDACC__)
    if (gpu_) {
      const cudaError_t e = wait ? cudaEventSynchronize(static_cast<cudaEvent_t>(q.done))
                                 : cudaEventQuery(static_cast<cudaEvent_t>(q.done));
      return e == cudaSuccess ? 1 : (e == cudaErrorNotReady ? 0 : -EIO);
    }
#endif
    (void)q;
    (void)wait;
    return 1;
  }

 private:
  void copy(void *dst, const void *src, size_t n, const Queue &q, bool to_device) {
#if defined(__CUDACC__)
    if (gpu_) {
      cudaMemcpyAsync(dst, src, n, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                      static_cast<cudaStream_t>(q.stream));
      return;
    }
#endif
    (void)q;
    (void)to_device;
    std::memcpy(dst, src, n);
  }

  bool gpu_;
};

}  // namespace fv

#endif
