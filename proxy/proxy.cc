// The proxy: CPU threads per GPU (one by default) that take the GPU's requests
// off the request ring, own the transport side of every GPU socket (listeners
// and connections, each driving a wire::ConnectionDriver), and publish what
// the GPU polls. This file: start, stop, the facade.
#include "proxy/proxy_impl.h"
#include "wire/spin_lock.h"

#include <pthread.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace gpusock {

namespace {

uint32_t round_up_pow2(uint32_t v) {
  uint32_t p = 1;
  while (p < v && p < (1u << 30)) p <<= 1;
  return p;
}

class HostMemoryResource final : public MemoryResource {
 public:
  const char *name() const override { return "host"; }
  bool has_device_memory() const override { return false; }
  gs_status_t allocate(MemoryKind kind, size_t size, MemoryBlock *out) override {
    const size_t rounded = (size + 4095) & ~size_t(4095);
    void *p = std::aligned_alloc(4096, rounded);
    if (!p) return -ENOMEM;
    std::memset(p, 0, rounded);
    *out = MemoryBlock{p, p, size, kind};
    return 0;
  }
  void release(MemoryBlock *block) override {
    std::free(block->host);
    *block = MemoryBlock{};
  }
};

// "0-3,8" -> a CPU set; false when the list is malformed or empty.
bool parse_cpu_list(const std::string &list, cpu_set_t *set) {
  CPU_ZERO(set);
  const char *p = list.c_str();
  while (*p) {
    char *end = nullptr;
    const long first = std::strtol(p, &end, 10);
    long last = first;
    if (end == p || first < 0) return false;
    p = end;
    if (*p == '-') {
      last = std::strtol(p + 1, &end, 10);
      if (end == p + 1 || last < first) return false;
      p = end;
    }
    for (long c = first; c <= last && c < CPU_SETSIZE; ++c) CPU_SET(static_cast<int>(c), set);
    if (*p == ',') ++p;
    else if (*p && *p != '\n') return false;
    else break;
  }
  return CPU_COUNT(set) > 0;
}

}  // namespace

std::unique_ptr<MemoryResource> host_memory_resource() { return std::make_unique<HostMemoryResource>(); }

gs_status_t Proxy::Impl::start(const ProxyOptions &options_in, MemoryResource *memory) {
  options_ = options_in;
  memory_ = memory;
  if (!memory_) return -EINVAL;
  options_.max_sockets = std::max<uint32_t>(options_.max_sockets, 1);
  if (options_.listener_poll_us < 0) {
    const char *env = std::getenv("GPUSOCK_PROXY_LISTENER_POLL_US");
    options_.listener_poll_us = env && *env ? std::max(0, std::atoi(env)) : 20;
  }
  listener_every_ = std::chrono::microseconds(options_.listener_poll_us);
  options_.rbuf_size = std::max<uint32_t>(options_.rbuf_size, 4096) & ~63u;  // even, 64-byte aligned rings
  options_.sbuf_size = std::max<uint32_t>(options_.sbuf_size, 4096) & ~63u;
  const uint32_t entries = round_up_pow2(std::max<uint32_t>(options_.request_entries, 2));
  const uint32_t sets = options_.max_sockets + options_.spare_buffer_sets;
  cpu_set_t cpus;
  if (!options_.cpus.empty() && !parse_cpu_list(options_.cpus, &cpus)) {
    std::fprintf(stderr, "gpusock proxy: bad CPU list \"%s\" (expected e.g. 0-15,32)\n", options_.cpus.c_str());
    return -EINVAL;
  }

  std::string error;
  int rc = wire::open_domain(options_.transport, &domain_, &error);
  if (rc < 0) {
    std::fprintf(stderr, "gpusock proxy: %s\n", error.empty() ? gs_status_name(rc) : error.c_str());
    return rc;
  }

  // Where the rings live. GPU memory needs a transport that registers it and a
  // way to hand it the device pointer; until then the GPU reads and writes
  // pinned host memory directly (bounce buffers).
  // The probe asks the transport's library itself (a real registration of a
  // GPU buffer); even where that works, wire::Domain::register_memory takes
  // host pointers only today, so the rings stay in pinned host memory.
  const bool device_rings = false;
  std::string why = probe_device_memory();
  const MemoryKind ring_kind = device_rings ? MemoryKind::kDevice : MemoryKind::kHostMapped;

  // A request ring, a ProxyShared and GPU-side counters per proxy thread.
  const uint32_t threads = choose_threads();
  const size_t counters_bytes = size_t(threads) * kCounterStride * sizeof(unsigned long long);
  rc = memory_->allocate(MemoryKind::kHostMapped, size_t(threads) * entries * sizeof(Request), &requests_mem_);
  if (rc == 0)
    rc = memory_->allocate(MemoryKind::kHostMapped,
                           threads * sizeof(ProxyShared) +
                               size_t(options_.max_sockets) * (sizeof(SocketStatus) + sizeof(InlineRecv)),
                           &status_mem_);
  const size_t sockets_bytes = size_t(options_.max_sockets) * sizeof(DeviceSocket);
  const size_t claims_bytes = (size_t(options_.max_sockets) * sizeof(uint32_t) + 63) & ~size_t(63);
  if (rc == 0)
    rc = memory_->allocate(MemoryKind::kDevice, sockets_bytes + claims_bytes + 2 * counters_bytes + 64, &private_mem_);
  if (rc == 0) rc = memory_->allocate(ring_kind, size_t(sets) * options_.rbuf_size, &rbuf_mem_);
  if (rc == 0) rc = memory_->allocate(ring_kind, size_t(sets) * options_.sbuf_size, &sbuf_mem_);
  if (rc < 0) {
    std::fprintf(stderr, "gpusock proxy: cannot allocate the channel from %s: %s\n", memory_->name(),
                 gs_status_name(rc));
    stop();
    return rc;
  }
  requests_ = static_cast<Request *>(requests_mem_.host);
  shared_ = static_cast<ProxyShared *>(status_mem_.host);
  status_ = reinterpret_cast<SocketStatus *>(shared_ + threads);
  inline_recv_ = reinterpret_cast<InlineRecv *>(status_ + options_.max_sockets);
  rbuf_reg_ = static_cast<uint8_t *>(device_rings ? rbuf_mem_.device : rbuf_mem_.host);
  sbuf_reg_ = static_cast<uint8_t *>(device_rings ? sbuf_mem_.device : sbuf_mem_.host);

  uint8_t *priv = static_cast<uint8_t *>(private_mem_.device);
  ctx_.requests = static_cast<Request *>(requests_mem_.device);
  ctx_.request_mask = entries - 1;
  ctx_.request_rings = threads;
  ctx_.shared = static_cast<const ProxyShared *>(status_mem_.device);
  ctx_.status = reinterpret_cast<const SocketStatus *>(ctx_.shared + threads);
  ctx_.inline_recv = reinterpret_cast<const InlineRecv *>(ctx_.status + options_.max_sockets);
  ctx_.sockets = reinterpret_cast<DeviceSocket *>(priv);
  ctx_.claims = reinterpret_cast<uint32_t *>(priv + sockets_bytes);
  ctx_.ticket = reinterpret_cast<unsigned long long *>(priv + sockets_bytes + claims_bytes);
  ctx_.consumed_seen = reinterpret_cast<unsigned long long *>(priv + sockets_bytes + claims_bytes + counters_bytes);
  ctx_.claim_cursor = reinterpret_cast<uint32_t *>(priv + sockets_bytes + claims_bytes + 2 * counters_bytes);
  ctx_.rbufs = static_cast<uint8_t *>(rbuf_mem_.device);
  ctx_.sbufs = static_cast<uint8_t *>(sbuf_mem_.device);
  ctx_.rbuf_size = options_.rbuf_size;
  ctx_.sbuf_size = options_.sbuf_size;
  ctx_.max_sockets = options_.max_sockets;
  ctx_.buffer_sets = sets;
  const char *inline_env = std::getenv("GPUSOCK_GPU_INLINE");
  if (inline_env && *inline_env) options_.inline_messages = static_cast<uint32_t>(std::atoi(inline_env));
  ctx_.flags = options_.inline_messages & kCtxInline;

  slots_.resize(options_.max_sockets);
  shadows_.resize(options_.max_sockets);
  free_buffers_.reserve(sets);
  for (uint32_t i = sets; i-- > 0;) free_buffers_.push_back(i);

  char line[512];
  std::snprintf(line, sizeof line,
                "gpusock proxy: transport %s, memory %s: socket rings in %s (%s); %u sockets, %u buffer sets of "
                "%u+%u B, %u request entries per proxy thread",
                domain_->caps().name, memory_->name(),
                device_rings ? "GPU memory" : "pinned host memory the GPU reads and writes (bounce buffers)",
                why.c_str(), options_.max_sockets, sets, options_.rbuf_size, options_.sbuf_size, entries);
  placement_ = line;

  started_ = true;
  for (uint32_t i = 0; i < threads; ++i) workers_.push_back(std::make_unique<Worker>(i));
  int pin = 0;
  for (auto &w : workers_) {
    Worker *worker = w.get();
    w->thread = std::thread([this, worker] {
      wire::spin_lock_keep_core();  // the threads waiting on it are the ones it feeds
      loop(*worker);
    });
    // Named so that top -H, perf and gdb tell the proxy's threads apart (15 characters at most).
    char name[16];
    std::snprintf(name, sizeof name, "gs-proxy-%u", worker->id);
    (void)pthread_setname_np(w->thread.native_handle(), name);
    // Near its GPU: the proxy threads poll memory the GPU writes across PCIe.
    if (!options_.cpus.empty())
      if (const int rc = pthread_setaffinity_np(w->thread.native_handle(), sizeof cpus, &cpus); rc != 0) pin = rc;
  }
  const std::string threads_word = threads == 1 ? "proxy thread" : std::to_string(threads) + " proxy threads";
  if (!options_.cpus.empty())
    placement_ += pin == 0 ? "; " + threads_word + " on CPUs " + options_.cpus
                           : "; " + threads_word + " not pinned to CPUs " + options_.cpus + " (" + std::strerror(pin) + ")";
  else if (threads > 1)
    placement_ += "; " + threads_word + " (socket i on thread i % " + std::to_string(threads) + ")";
  if (!options_.quiet) std::fprintf(stderr, "%s\n", placement_.c_str());
  return 0;
}

// ProxyOptions::threads, else GPUSOCK_PROXY_THREADS, else one; never more
// threads than sockets.
uint32_t Proxy::Impl::choose_threads() const {
  long n = options_.threads;
  if (n == 0) {
    const char *env = std::getenv("GPUSOCK_PROXY_THREADS");
    n = env && *env ? std::strtol(env, nullptr, 10) : 1;
  }
  return static_cast<uint32_t>(std::clamp<long>(n, 1, std::min<long>(options_.max_sockets, 64)));
}

// Where the rings could live: can the transport register GPU memory? A real
// registration of a GPU buffer answers (wire::Domain::device_memory_support).
std::string Proxy::Impl::probe_device_memory() {
  if (!memory_->has_device_memory()) return "host backend, no GPU memory";
  MemoryBlock block{};
  const bool have = memory_->allocate(MemoryKind::kDevice, 1u << 16, &block) == 0;
  wire::DeviceMemorySupport answer = domain_->device_memory_support(
      have ? block.device : nullptr, have ? block.size : 0, std::max(memory_->device(), 0));
  if (have) memory_->release(&block);
  // Even where it can, Domain::register_memory takes host pointers only today.
  if (answer.registers) answer.why += "; wire::Domain::register_memory takes host pointers only";
  return answer.why;
}

void Proxy::Impl::stop() {
  if (!workers_.empty() && workers_[0]->thread.joinable()) {
    if (shared_) publish(&shared_->stop, 1u);
    stopping_.store(true);
    for (auto &w : workers_)
      if (w->thread.joinable()) w->thread.join();
  }
  if (started_) close_everything();
  started_ = false;
  slots_.clear();
  // workers_ stays (joined): stats() and kernel_exited() may still read it.
  for (MemoryBlock *b : {&requests_mem_, &status_mem_, &private_mem_, &rbuf_mem_, &sbuf_mem_})
    if (b->size && memory_) memory_->release(b);
  domain_.reset();
}

// ---------------------------------------------------------------- Proxy

Proxy::Proxy(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Proxy::~Proxy() { stop(); }

gs_status_t Proxy::start(const ProxyOptions &options, MemoryResource *memory, std::unique_ptr<Proxy> *out) {
  if (!out) return -EINVAL;
  auto impl = std::make_unique<Impl>();
  const int rc = impl->start(options, memory);
  if (rc < 0) return rc;
  out->reset(new Proxy(std::move(impl)));
  return 0;
}

const DeviceContext &Proxy::device_context() const { return impl_->ctx_; }
void Proxy::request_kernel_stop() { impl_->request_kernel_stop(); }
int Proxy::kernel_exited(int grid_status) { return impl_ ? impl_->kernel_exited(grid_status) : 0; }
void Proxy::stop() {
  if (impl_) impl_->stop();
}
const std::string &Proxy::placement() const { return impl_->placement_; }

ProxyStats Proxy::Impl::totals() const {
  ProxyStats s;
  for (const auto &w : workers_) {
    const Counters &c = w->stats;
    s.requests += c.requests.load(std::memory_order_relaxed);
    s.connections += c.connections.load(std::memory_order_relaxed);
    s.full_ring_drains += c.full_laps.load(std::memory_order_relaxed);
    s.rejected_no_buffer += c.no_buffer.load(std::memory_order_relaxed);
    s.inline_sends += c.inline_sends.load(std::memory_order_relaxed);
    s.inline_recvs += c.inline_recvs.load(std::memory_order_relaxed);
    s.turnaround_ns += c.turnaround_ns.load(std::memory_order_relaxed);
    s.turnarounds += c.turnarounds.load(std::memory_order_relaxed);
  }
  s.orphans_closed = stat_orphans_.load();
  s.passes = stat_passes_.load();
  return s;
}

ProxyStats Proxy::stats() const { return impl_->totals(); }

}  // namespace gpusock
