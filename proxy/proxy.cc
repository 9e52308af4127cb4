// The proxy: CPU threads per GPU (one by default) that take the GPU's requests
// off the request ring, own the transport side of every GPU socket (listeners
// and connections, each driving a wire::ConnectionDriver), and publish what
// the GPU polls. This file: start, stop, the facade.
#include "proxy/proxy_impl.h"
#include "wire/log.h"
#include "wire/config.h"
#include "wire/socket_rules.h"
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
  settle_options();
  cpu_set_t cpus;
  if (!options_.cpus.empty() && !parse_cpu_list(options_.cpus, &cpus)) {
    log::write(log::kWarn, "proxy", "bad CPU list \"%s\" (expected e.g. 0-15,32)", options_.cpus.c_str());
    return -EINVAL;
  }
  std::string error;
  if (const int rc = wire::open_domain(options_.transport, &domain_, &error); rc < 0) {
    log::write(log::kWarn, "proxy", "%s", error.empty() ? gs_status_name(rc) : error.c_str());
    return rc;
  }
  if (const int rc = allocate_channel(); rc < 0) {
    log::write(log::kWarn, "proxy", "cannot allocate the channel from %s: %s", memory_->name(), gs_status_name(rc));
    stop();
    return rc;
  }
  describe_placement(probe_device_memory());
  started_ = true;
  start_threads(options_.cpus.empty() ? nullptr : &cpus);
  if (!options_.quiet) log::write(log::kWarn, "proxy", "%s", placement_.c_str());
  return 0;
}

// Every option that has a default decided at start, and sizes the channel can hold.
void Proxy::Impl::settle_options() {
  options_.max_sockets = std::max<uint32_t>(options_.max_sockets, 1);
  if (options_.listener_poll_us < 0)
    options_.listener_poll_us = static_cast<int>(config::get(config::Id::kProxyListenerPollUs));
  listener_every_ = std::chrono::microseconds(options_.listener_poll_us);
  // 64-byte aligned rings: each set starts on a line of its own.
  options_.rbuf_size = wire::rules::receive_ring_size(options_.rbuf_size) & ~63u;
  options_.sbuf_size = wire::rules::send_ring_size(options_.sbuf_size) & ~63u;
  if (options_.inline_messages == ProxyOptions::kInlineDefault) options_.inline_messages = default_inline_messages();
}

// The channel's memory, as plan_channel lays it out, and both sides' views of
// it. The rings stay in pinned host memory the GPU reads and writes (bounce
// buffers): wire::Domain::register_memory takes host pointers only.
gs_status_t Proxy::Impl::allocate_channel() {
  shape_.threads = choose_threads();
  shape_.ring_entries = round_up_pow2(std::max<uint32_t>(options_.request_entries, 2));
  shape_.sockets = options_.max_sockets;
  shape_.buffer_sets = options_.max_sockets + options_.spare_buffer_sets;
  shape_.rbuf_size = options_.rbuf_size;
  shape_.sbuf_size = options_.sbuf_size;
  const proxy::ChannelLayout layout = proxy::plan_channel(shape_);
  struct Allocation {
    MemoryBlock *block;
    MemoryKind kind;
    size_t bytes;
  };
  const Allocation plan[] = {
      {&blocks_.requests, MemoryKind::kHostMapped, layout.requests_bytes},
      {&blocks_.status, MemoryKind::kHostMapped, layout.status_bytes},
      {&blocks_.priv, MemoryKind::kDevice, layout.private_bytes},
      {&blocks_.rbufs, MemoryKind::kHostMapped, layout.rbuf_bytes},
      {&blocks_.sbufs, MemoryKind::kHostMapped, layout.sbuf_bytes},
  };
  for (const Allocation &a : plan)
    if (const int rc = memory_->allocate(a.kind, a.bytes, a.block); rc < 0) return rc;
  proxy::point_device_context(shape_, layout, blocks_, &ctx_);
  ctx_.flags = options_.inline_messages & kCtxInline;
  host_ = proxy::point_host_channel(layout, blocks_);
  status_.attach(host_.status, host_.inline_recv, shape_.sockets);
  buffers_.reset(host_.rbufs, host_.sbufs, shape_.buffer_sets, shape_.rbuf_size, shape_.sbuf_size);
  slots_.resize(shape_.sockets);
  return 0;
}

void Proxy::Impl::describe_placement(const std::string &device_memory) {
  char line[512];
  std::snprintf(line, sizeof line,
                "transport %s, memory %s: socket rings in pinned host memory the GPU reads and writes (bounce "
                "buffers; %s); %u sockets, %u buffer sets of %u+%u B, %u request entries per proxy thread",
                domain_->caps().name, memory_->name(), device_memory.c_str(), shape_.sockets, shape_.buffer_sets,
                shape_.rbuf_size, shape_.sbuf_size, shape_.ring_entries);
  placement_ = line;
}

void Proxy::Impl::start_threads(const cpu_set_t *cpus) {
  for (uint32_t i = 0; i < shape_.threads; ++i) workers_.push_back(std::make_unique<Worker>(i));
  int pin = 0;
  for (auto &w : workers_) {
    Worker *worker = w.get();
    w->thread = std::thread([this, worker] {
      wire::spin_lock_keep_core();  // the threads waiting on it are the ones it feeds
      loop(*worker);
    });
    // Named so that top -H and gdb tell the proxy's threads apart (15 characters at most).
    char name[16];
    std::snprintf(name, sizeof name, "gs-proxy-%u", worker->id);
    (void)pthread_setname_np(w->thread.native_handle(), name);
    // Near its GPU: the proxy threads poll memory the GPU writes across PCIe.
    if (cpus)
      if (const int rc = pthread_setaffinity_np(w->thread.native_handle(), sizeof *cpus, cpus); rc != 0) pin = rc;
  }
  const uint32_t threads = shape_.threads;
  const std::string threads_word = threads == 1 ? "proxy thread" : std::to_string(threads) + " proxy threads";
  if (cpus)
    placement_ += pin == 0
                      ? "; " + threads_word + " on CPUs " + options_.cpus
                      : "; " + threads_word + " not pinned to CPUs " + options_.cpus + " (" + std::strerror(pin) + ")";
  else if (threads > 1) placement_ += "; " + threads_word + " (socket i on thread i % " + std::to_string(threads) + ")";
}

int host_backend_gpus() { return static_cast<int>(config::get(config::Id::kHostGpus)); }

uint32_t default_inline_messages() {
  return static_cast<uint32_t>(config::get_or(config::Id::kGpuInline, channel::kCtxInlineRecv));
}

// ProxyOptions::threads, else GPUSOCK_PROXY_THREADS, else one; never more
// threads than sockets.
uint32_t Proxy::Impl::choose_threads() const {
  long n = options_.threads;
  if (n == 0) {
    n = config::get(config::Id::kProxyThreads);
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
    if (host_.shared) publish(&host_.shared->stop, 1u);
    stopping_.store(true);
    for (auto &w : workers_)
      if (w->thread.joinable()) w->thread.join();
  }
  if (started_) close_everything();
  started_ = false;
  slots_.clear();
  // workers_ stays (joined): stats() and kernel_exited() may still read it.
  for (MemoryBlock *b : {&blocks_.requests, &blocks_.status, &blocks_.priv, &blocks_.rbufs, &blocks_.sbufs})
    if (b->size && memory_) memory_->release(b);
  host_ = proxy::HostChannel{};
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
std::string Proxy::transport() const { return impl_->transport_name(); }
uint32_t Proxy::threads() const { return static_cast<uint32_t>(impl_->workers()); }

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
