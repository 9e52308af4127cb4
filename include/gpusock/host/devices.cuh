// gpusock device API: several GPUs in one process (GpuSet). Each GPU gets its
// own proxy: its own thread (pinned to the CPUs next to the GPU), request
// ring, status lines, socket table and buffer sets, and a kernel uses the
// sockets of the GPU whose DeviceContext it was given. GPUs are CUDA's device
// ordinals (cudaSetDevice's numbers, after CUDA_VISIBLE_DEVICES). On the host
// backend a GpuSet holds N emulated GPUs: N independent proxies over host
// memory, which is how CI runs GPU-to-GPU code without a GPU.
#ifndef GPUSOCK_HOST_DEVICES_CUH
#define GPUSOCK_HOST_DEVICES_CUH

#include <gpusock/host/launch.cuh>
#include <gpusock/proxy.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include <cctype>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace gpusock {

// How many GPUs a backend offers: CUDA devices, or the emulated GPUs of the
// host backend (host_backend_gpus()).
inline int gpu_count(Backend backend) {
  if (backend == Backend::kHost) return host_backend_gpus();
#if defined(__CUDACC__)
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
#else
  return 0;
#endif
}

// The CPUs on the GPU's side of the machine (its PCI device's local_cpulist in
// sysfs, e.g. "0-15,32-47"); "" where that is unknown or on the host backend.
inline std::string gpu_local_cpus(Backend backend, int device) {
#if defined(__CUDACC__)
  char bus[32] = {};
  if (backend != Backend::kCuda || cudaDeviceGetPCIBusId(bus, sizeof bus, device) != cudaSuccess) return "";
  for (char *c = bus; *c; ++c) *c = static_cast<char>(std::tolower(static_cast<unsigned char>(*c)));
  const std::string path = std::string("/sys/bus/pci/devices/") + bus + "/local_cpulist";
  FILE *f = std::fopen(path.c_str(), "r");
  if (!f) return "";
  char line[256] = {};
  const bool got = std::fgets(line, sizeof line, f) != nullptr;
  std::fclose(f);
  std::string list = got ? line : "";
  while (!list.empty() && (list.back() == '\n' || list.back() == ' ')) list.pop_back();
  return list;
#else
  (void)backend, (void)device;
  return "";
#endif
}

// Host memory named as one emulated GPU ("host-gpu:1"), so each proxy's
// placement line says which GPU it serves.
class EmulatedGpuMemory final : public MemoryResource {
 public:
  explicit EmulatedGpuMemory(int index) : host_(host_memory_resource()) {
    std::snprintf(name_, sizeof name_, "host-gpu:%d", index);
  }
  const char *name() const override { return name_; }
  bool has_device_memory() const override { return false; }
  gs_status_t allocate(MemoryKind kind, size_t size, MemoryBlock *out) override {
    return host_->allocate(kind, size, out);
  }
  void release(MemoryBlock *block) override { host_->release(block); }

 private:
  std::unique_ptr<MemoryResource> host_;
  char name_[32];
};

struct GpuSetOptions {
  Backend backend = Backend::kHost;
  int count = 0;       // GPUs to serve; 0: every one the backend offers (gpu_count)
  int first = 0;       // GPU i runs on device first + i (a process that serves one GPU of several)
  bool share = false;  // count may exceed the devices: GPU i runs on device (first + i) % devices
                       // (several proxies on one GPU, as several processes would be)
  ProxyOptions proxy;  // for every proxy; proxy.cpus "" = the CPUs next to each GPU,
                       // "none" = not pinned
};

// One proxy per GPU. Index i in [0, size()) is the set's GPU i; device(i) is
// the CUDA ordinal it runs on.
class GpuSet {
 public:
  static gs_status_t start(const GpuSetOptions &options, std::unique_ptr<GpuSet> *out) {
    if (!out) return -EINVAL;
    const int devices = gpu_count(options.backend);
    const int count = options.count > 0 ? options.count : devices - options.first;
    if (devices <= 0 || count <= 0 || options.first < 0) return -ENODEV;
    if (options.first + count > devices && !options.share && options.backend == Backend::kCuda) {
      std::fprintf(stderr, "gpusock: GPUs %d..%d asked, %d present (share them: GpuSetOptions::share)\n", options.first,
                   options.first + count - 1, devices);
      return -ENODEV;
    }
    std::unique_ptr<GpuSet> set(new GpuSet(options.backend));
    for (int i = 0; i < count; ++i) {
      Gpu gpu;
      gpu.device = options.backend == Backend::kCuda ? (options.first + i) % devices : options.first + i;
      gpu.memory = options.backend == Backend::kCuda ? memory_resource_for(Backend::kCuda, gpu.device)
                                                     : std::make_unique<EmulatedGpuMemory>(gpu.device);
      ProxyOptions po = options.proxy;
      if (po.cpus == "none") po.cpus.clear();
      else if (po.cpus.empty()) po.cpus = gpu_local_cpus(options.backend, gpu.device);
      const gs_status_t rc = Proxy::start(po, gpu.memory.get(), &gpu.proxy);
      if (rc < 0) return rc;  // set's destructor stops the proxies started so far
      set->gpus_.push_back(std::move(gpu));
    }
    *out = std::move(set);
    return 0;
  }
  ~GpuSet() { stop(); }
  GpuSet(const GpuSet &) = delete;
  GpuSet &operator=(const GpuSet &) = delete;

  int size() const { return static_cast<int>(gpus_.size()); }
  Backend backend() const { return backend_; }
  int device(int i) const { return gpus_[i].device; }
  Proxy &proxy(int i) { return *gpus_[i].proxy; }
  MemoryResource &memory(int i) { return *gpus_[i].memory; }
  // What GPU i's kernels take: its own proxy's channel.
  const channel::DeviceContext &context(int i) const { return gpus_[i].proxy->device_context(); }

  // Runs `kernel` on GPU i (on its device, for CUDA). The kernel should use
  // context(i): GPU i's sockets live in GPU i's proxy.
  template <class F>
  int launch(int i, Grid &grid, LaunchShape shape, const F &kernel) const {
    if (i < 0 || i >= size()) return -EINVAL;
    shape.device = backend_ == Backend::kCuda ? gpus_[i].device : -1;
    return grid.start(backend_, shape, kernel);
  }

  void request_kernel_stop() {
    for (auto &g : gpus_) g.proxy->request_kernel_stop();
  }
  // Stops every proxy (their connections flushed and closed), GPU by GPU.
  void stop() {
    for (auto &g : gpus_)
      if (g.proxy) g.proxy->stop();
  }

 private:
  struct Gpu {
    int device = 0;
    std::unique_ptr<MemoryResource> memory;  // declared first: outlives its proxy
    std::unique_ptr<Proxy> proxy;
  };
  explicit GpuSet(Backend backend) : backend_(backend) {}

  Backend backend_;
  std::vector<Gpu> gpus_;
};

}  // namespace gpusock

#endif
