// gpusock GPU sockets, host side: the proxy that serves one GPU's sockets
// (one CPU thread per GPU), and the memory it shares with the GPU. The layout
// of that memory, the channel, is gpusock/channel.h. Status contract: >= 0
// success, a negated errno on failure.
#ifndef GPUSOCK_PROXY_H
#define GPUSOCK_PROXY_H

#include <gpusock/channel.h>
#include <gpusock/status.h>

#include <stddef.h>
#include <cstddef>
#include <stdint.h>

#include <memory>
#include <string>

namespace gpusock {

// ------------------------------------------------------------------ memory

enum class MemoryKind : uint8_t {
  kHostMapped,  // pinned host memory that the GPU reads and writes directly
  kDevice,      // GPU memory; the CPU never reads or writes it
};

struct MemoryBlock {
  void *host = nullptr;    // CPU address (nullptr for kDevice)
  void *device = nullptr;  // GPU address
  size_t size = 0;
  MemoryKind kind = MemoryKind::kHostMapped;
};

// Where the proxy gets the memory the GPU shares with it. The host backend uses
// host_memory_resource(); CUDA programs use gpusock::cuda_memory_resource()
// from gpusock/gpu.cuh.
class MemoryResource {
 public:
  virtual ~MemoryResource() = default;
  virtual const char *name() const = 0;
  // True when kDevice memory is real GPU memory (not host memory).
  virtual bool has_device_memory() const = 0;
  // The CUDA device ordinal of that memory; -1 for host memory.
  virtual int device() const { return -1; }
  // Zero-filled. Returns 0 or a negated errno.
  virtual gs_status_t allocate(MemoryKind kind, size_t size, MemoryBlock *out) = 0;
  virtual void release(MemoryBlock *block) = 0;
};

// Plain host memory for every kind: the host backend, where "GPU" threads are
// host threads.
std::unique_ptr<MemoryResource> host_memory_resource();

// ------------------------------------------------------------------ the proxy

struct ProxyOptions {
  std::string transport;            // "" = GPUSOCK_TRANSPORT, else the default transport
  uint32_t max_sockets = 256;       // socket slots (listeners + connections)
  uint32_t spare_buffer_sets = 64;  // connections accepted but not yet taken by gaccept
  // Rings per connection, in the memory the GPU reads and writes (pinned host
  // memory: (max_sockets + spare_buffer_sets) x both rings, 160 MiB by default).
  // Larger than a CPU socket's 128 KiB: each quarter ring a GPU sends costs a
  // request and a status read across PCIe (docs/gpu.md, streaming).
  uint32_t rbuf_size = 1u << 18;    // receive ring per connection (even, >= 4096)
  uint32_t sbuf_size = 1u << 18;    // send ring per connection (>= 4096)
  uint32_t request_entries = 1024;  // request ring entries (rounded up to a power of two)
  int busy_poll_us = 200;           // spin this long after the last work before backing off
  int listener_poll_us = -1;        // poll listeners for new connections at most this often
                                    // (-1: GPUSOCK_PROXY_LISTENER_POLL_US, else 20; 0: every pass)
  int close_flush_ms = 5000;        // how long a closed connection may take to flush
  std::string cpus;                 // pin the proxy threads to these CPUs ("0-15,32"; "" = not pinned):
                                    // gpusock::GpuSet passes the CPUs next to the GPU
  // Proxy threads sharing the sockets: socket slot i is driven by thread
  // i % threads, which alone reads request ring i % threads (where the GPU
  // posts that socket's requests). 0: GPUSOCK_PROXY_THREADS, else 1. Many
  // blocks streaming need several (one thread moves what one core's copies
  // and, on fabric:tcp, system calls move); but from two threads on, many
  // blocks' small requests are served at a lower rate (docs/gpu.md, P6 and
  // gpu_stream), so one stays the default.
  uint32_t threads = 0;
  bool quiet = false;  // do not print the memory placement line at start
  // Which small messages skip the rings (channel::ContextFlags: 0 none, 1
  // received, 2 sent, 3 both); kInlineDefault: GPUSOCK_GPU_INLINE, else
  // received only (default_inline_messages). Since a warp polls the status
  // line and the record in one load, a received message beside the status
  // saves the payload's PCIe read; a sent one in its request costs the GPU
  // more than the ring's copy and fence (P4 by mode, docs/gpu.md).
  static constexpr uint32_t kInlineDefault = ~0u;
  uint32_t inline_messages = kInlineDefault;
};

// The emulated GPUs of the host backend: GPUSOCK_HOST_GPUS, else 1.
int host_backend_gpus();

// What ProxyOptions::kInlineDefault stands for: GPUSOCK_GPU_INLINE, else
// channel::kCtxInlineRecv.
uint32_t default_inline_messages();

struct ProxyStats {
  uint64_t requests = 0;
  uint64_t connections = 0;         // established, both directions
  uint64_t full_ring_drains = 0;    // passes that found a whole ring of requests (GPU producers were waiting)
  uint64_t rejected_no_buffer = 0;  // incoming connections left waiting: no spare buffer set
  uint64_t orphans_closed = 0;      // sockets kernel_exited() closed for a kernel that did not
  uint64_t passes = 0;              // proxy loop passes (ns per pass = elapsed / passes)
  uint64_t inline_sends = 0;        // small sends that rode in their request (kOpDataInline)
  uint64_t inline_recvs = 0;        // small arrivals copied beside the status line (InlineRecv)
  // GPU turnaround: from publishing bytes that arrived for a socket to the
  // GPU's next request that hands bytes to send on it (an echo's reply):
  // what the GPU side adds to a request-reply exchange, seen from the proxy.
  uint64_t turnaround_ns = 0;  // summed
  uint64_t turnarounds = 0;
};

class Proxy {
 public:
  // Opens the transport, allocates the channel and every buffer set from
  // `memory` (which must outlive the proxy) and starts the proxy thread.
  static gs_status_t start(const ProxyOptions &options, MemoryResource *memory, std::unique_ptr<Proxy> *out);
  ~Proxy();  // stop()
  Proxy(const Proxy &) = delete;
  Proxy &operator=(const Proxy &) = delete;

  // What kernels take (by value).
  const channel::DeviceContext &device_context() const;
  // Asks kernels to finish: gshould_stop() turns true and blocking calls return
  // -ESHUTDOWN.
  void request_kernel_stop();
  // The kernels that used these sockets are gone: closes every socket they
  // left open (connections, listeners, connects under way), as gclose would
  // have, and frees the slots for the next kernel. grid_status is what
  // Grid::wait() returned: 0 (the kernel returned) flushes each connection and
  // closes it, so peers read every byte handed over, then EOF; < 0 (the kernel
  // trapped or failed) resets each connection at once, so peers see
  // ECONNRESET instead of an EOF that could pass for a complete stream.
  // Thread-safe; returns once the proxy thread has done it, with the number of
  // sockets closed. Call it only when no kernel still uses the sockets (a
  // listener one kernel opens for the next is closed too).
  int kernel_exited(int grid_status);
  // Flushes and closes every connection (bounded by close_flush_ms), stops the
  // thread and frees the memory. Call after the kernel finished.
  void stop();

  // One line: the transport, and where the rings live and why.
  const std::string &placement() const;
  // The transport it opened ("fabric:shm", "fabric:tcp", "verbs"); "" before start().
  std::string transport() const;
  // How many proxy threads serve the sockets (ProxyOptions::threads, resolved).
  uint32_t threads() const;
  ProxyStats stats() const;

  class Impl;

 private:
  explicit Proxy(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpusock

#endif
