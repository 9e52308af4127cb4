// The proxy: one CPU thread per GPU that takes the GPU's requests off the
// request ring, owns the transport side of every GPU socket (listeners and
// connections, each driving a wire::Stream), and publishes what the GPU polls.
#include "proxy/connection.h"
#include "proxy/hmem_probe.h"

#include <gpusock/proxy.h>

#include <netinet/in.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace gpusock {

using namespace gpusock::channel;
using proxy::BufferSet;
using proxy::Clock;
using proxy::ConnRole;
using proxy::Connection;

namespace {

template <class T>
void publish(T *field, T value) {
  __atomic_store_n(field, value, __ATOMIC_RELEASE);
}

uint32_t round_up_pow2(uint32_t v) {
  uint32_t p = 1;
  while (p < v && p < (1u << 30)) p <<= 1;
  return p;
}

class HostMemoryResource final : public MemoryResource {
 public:
  const char *name() const override { return "host"; }
  bool has_device_memory() const override { return false; }
  int allocate(MemoryKind kind, size_t size, MemoryBlock *out) override {
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

}  // namespace

std::unique_ptr<MemoryResource> host_memory_resource() { return std::make_unique<HostMemoryResource>(); }

// A listening GPU socket: handshakes in flight and established connections
// waiting for gaccept. Both hold buffer sets, so the peer can send at once.
struct ListenerState {
  std::unique_ptr<wire::Listener> listener;
  int backlog = 1;
  std::vector<std::unique_ptr<Connection>> accepting;
  std::deque<std::unique_ptr<Connection>> queue;
};

struct Slot {
  uint32_t gen = 0;        // the socket generation adopted (== releases when free)
  bool in_use = false;
  bool in_active = false;  // listed in Impl::active_
  sockaddr_storage addr{};
  socklen_t addr_len = 0;
  std::unique_ptr<ListenerState> listener;
  std::unique_ptr<Connection> conn;
};

class Proxy::Impl {
 public:
  ~Impl() { stop(); }
  int start(const ProxyOptions &options, MemoryResource *memory);
  void stop();
  void request_kernel_stop() { publish(&shared_->stop, 1u); }

  DeviceContext ctx_{};
  std::string placement_;
  std::atomic<uint64_t> stat_requests_{0}, stat_connections_{0}, stat_full_laps_{0}, stat_no_buffer_{0};
  std::atomic<uint64_t> stat_orphans_{0}, stat_passes_{0};
  int kernel_exited(int grid_status);

 private:
  struct Shadow {
    uint64_t recv_write = 0, send_done = 0;
    uint32_t state = 0, buffer = 0, accept_queued = 0;
    int32_t error = 0, send_error = 0;
  };

  void loop();
  bool drain_requests();
  void handle(const Request &r);
  void complete(uint32_t slot, const Request &r, int result);
  bool progress_active();
  bool progress_listener(uint32_t index, Slot &slot);
  bool progress_closing();
  void publish_slot(uint32_t index);
  void release_slot(uint32_t index, bool abort = false);
  void close_orphans();
  void activate(uint32_t index);
  int take_buffer_set(BufferSet *out);
  void return_buffer_set(const BufferSet &set);
  void retire(std::unique_ptr<Connection> conn);
  void close_everything();

  ProxyOptions options_;
  MemoryResource *memory_ = nullptr;
  std::unique_ptr<wire::Domain> domain_;
  MemoryBlock requests_mem_{}, status_mem_{}, private_mem_{}, rbuf_mem_{}, sbuf_mem_{};
  Request *requests_ = nullptr;  // host view
  ProxyShared *shared_ = nullptr;
  SocketStatus *status_ = nullptr;
  uint8_t *rbuf_reg_ = nullptr;  // what the transport registers
  uint8_t *sbuf_reg_ = nullptr;
  uint64_t head_ = 0;  // next ticket expected
  std::vector<Slot> slots_;
  std::vector<Shadow> shadows_;
  std::vector<uint32_t> active_;  // slots with a listener or a connection
  std::vector<uint32_t> free_buffers_;
  std::vector<std::unique_ptr<Connection>> closing_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  bool started_ = false;
  Clock::duration listener_every_{};
  Clock::time_point next_listener_poll_{};
  bool poll_listeners_ = true;  // this pass
  // kernel_exited(): the caller posts a request, the proxy thread answers it.
  std::mutex orphan_call_;
  std::atomic<uint64_t> orphan_asked_{0}, orphan_answered_{0};
  std::atomic<bool> orphan_abort_{false};
  std::atomic<int> orphan_result_{0};
};

int Proxy::Impl::start(const ProxyOptions &options_in, MemoryResource *memory) {
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
  const proxy::HmemProbe probe = proxy::probe_device_memory(domain_->caps().name, memory_);
  std::string why = probe.reason;
  if (probe.transport_can) why += "; wire::Domain::register_memory takes host pointers only";
  const MemoryKind ring_kind = device_rings ? MemoryKind::kDevice : MemoryKind::kHostMapped;

  rc = memory_->allocate(MemoryKind::kHostMapped, size_t(entries) * sizeof(Request), &requests_mem_);
  if (rc == 0)
    rc = memory_->allocate(MemoryKind::kHostMapped,
                           sizeof(ProxyShared) + size_t(options_.max_sockets) * sizeof(SocketStatus), &status_mem_);
  const size_t sockets_bytes = size_t(options_.max_sockets) * sizeof(DeviceSocket);
  const size_t claims_bytes = (size_t(options_.max_sockets) * sizeof(uint32_t) + 63) & ~size_t(63);
  if (rc == 0) rc = memory_->allocate(MemoryKind::kDevice, sockets_bytes + claims_bytes + 128, &private_mem_);
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
  status_ = reinterpret_cast<SocketStatus *>(shared_ + 1);
  rbuf_reg_ = static_cast<uint8_t *>(device_rings ? rbuf_mem_.device : rbuf_mem_.host);
  sbuf_reg_ = static_cast<uint8_t *>(device_rings ? sbuf_mem_.device : sbuf_mem_.host);

  uint8_t *priv = static_cast<uint8_t *>(private_mem_.device);
  ctx_.requests = static_cast<Request *>(requests_mem_.device);
  ctx_.request_mask = entries - 1;
  ctx_.shared = static_cast<const ProxyShared *>(status_mem_.device);
  ctx_.status = reinterpret_cast<const SocketStatus *>(ctx_.shared + 1);
  ctx_.sockets = reinterpret_cast<DeviceSocket *>(priv);
  ctx_.claims = reinterpret_cast<uint32_t *>(priv + sockets_bytes);
  ctx_.ticket = reinterpret_cast<unsigned long long *>(priv + sockets_bytes + claims_bytes);
  ctx_.claim_cursor = reinterpret_cast<uint32_t *>(priv + sockets_bytes + claims_bytes + 64);
  ctx_.consumed_seen = reinterpret_cast<unsigned long long *>(priv + sockets_bytes + claims_bytes + 96);
  ctx_.rbufs = static_cast<uint8_t *>(rbuf_mem_.device);
  ctx_.sbufs = static_cast<uint8_t *>(sbuf_mem_.device);
  ctx_.rbuf_size = options_.rbuf_size;
  ctx_.sbuf_size = options_.sbuf_size;
  ctx_.max_sockets = options_.max_sockets;
  ctx_.buffer_sets = sets;

  slots_.resize(options_.max_sockets);
  shadows_.resize(options_.max_sockets);
  free_buffers_.reserve(sets);
  for (uint32_t i = sets; i-- > 0;) free_buffers_.push_back(i);

  char line[512];
  std::snprintf(line, sizeof line,
                "gpusock proxy: transport %s, memory %s: socket rings in %s (%s); %u sockets, %u buffer sets of "
                "%u+%u B, %u request entries",
                domain_->caps().name, memory_->name(),
                device_rings ? "GPU memory" : "pinned host memory the GPU reads and writes (bounce buffers)",
                why.c_str(), options_.max_sockets, sets, options_.rbuf_size, options_.sbuf_size, entries);
  placement_ = line;
  if (!options_.quiet) std::fprintf(stderr, "%s\n", line);

  started_ = true;
  thread_ = std::thread([this] { loop(); });
  return 0;
}

void Proxy::Impl::stop() {
  if (thread_.joinable()) {
    if (shared_) publish(&shared_->stop, 1u);
    stopping_.store(true);
    thread_.join();
  }
  if (started_) close_everything();
  started_ = false;
  slots_.clear();
  active_.clear();
  closing_.clear();
  for (MemoryBlock *b : {&requests_mem_, &status_mem_, &private_mem_, &rbuf_mem_, &sbuf_mem_})
    if (b->size && memory_) memory_->release(b);
  domain_.reset();
}

// Flushes every connection within close_flush_ms, as the CPU engine does at exit.
void Proxy::Impl::close_everything() {
  const auto deadline = Clock::now() + std::chrono::milliseconds(options_.close_flush_ms);
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    Slot &s = slots_[i];
    if (s.listener) {
      for (auto &c : s.listener->accepting) retire(std::move(c));
      for (auto &c : s.listener->queue) retire(std::move(c));
      s.listener.reset();
    }
    if (s.conn) {
      s.conn->begin_close(deadline);
      closing_.push_back(std::move(s.conn));
    }
  }
  while (!closing_.empty()) {
    progress_closing();
    if (!closing_.empty()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void Proxy::Impl::loop() {
  auto last_work = Clock::now();
  long sleep_us = 5;
  while (!stopping_.load(std::memory_order_relaxed)) {
    if (orphan_asked_.load(std::memory_order_acquire) != orphan_answered_.load(std::memory_order_relaxed))
      close_orphans();
    stat_passes_.store(stat_passes_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    bool did = drain_requests();
    // New connections on listeners need no microsecond answer: looking for
    // them (a CM / handshake poll per listener) only every listener_poll_us
    // keeps the pass short for the connections that carry data.
    if (listener_every_.count() == 0) {
      poll_listeners_ = true;
    } else {
      const auto now = Clock::now();
      poll_listeners_ = now >= next_listener_poll_;
      if (poll_listeners_) next_listener_poll_ = now + listener_every_;
    }
    did |= progress_active();
    did |= progress_closing();
    if (did) {
      last_work = Clock::now();
      sleep_us = 5;
      continue;
    }
    if (options_.busy_poll_us < 0 || Clock::now() - last_work < std::chrono::microseconds(options_.busy_poll_us))
      continue;
    timespec ts{0, sleep_us * 1000};
    nanosleep(&ts, nullptr);
    sleep_us = std::min<long>(sleep_us * 2, 50);
  }
}

// The kernel is gone: whatever it published is taken first (its last data and
// gclose requests), then every slot still in use is closed as by gclose, or
// reset when the kernel failed.
void Proxy::Impl::close_orphans() {
  const uint64_t asked = orphan_asked_.load(std::memory_order_acquire);
  const bool abort = orphan_abort_.load(std::memory_order_relaxed);
  while (drain_requests()) {
  }
  int closed = 0;
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i].in_use) continue;
    release_slot(i, abort);
    ++closed;
  }
  if (closed > 0) {
    stat_orphans_.fetch_add(static_cast<uint64_t>(closed), std::memory_order_relaxed);
    std::fprintf(stderr, "gpusock proxy: the kernel %s with %d socket%s open: %s\n",
                 abort ? "failed" : "returned", closed, closed == 1 ? "" : "s",
                 abort ? "reset them" : "flushing and closing them");
  }
  orphan_result_.store(closed, std::memory_order_relaxed);
  orphan_answered_.store(asked, std::memory_order_release);
}

int Proxy::Impl::kernel_exited(int grid_status) {
  if (!thread_.joinable()) return 0;
  std::lock_guard<std::mutex> lock(orphan_call_);
  orphan_abort_.store(grid_status < 0, std::memory_order_relaxed);
  const uint64_t ticket = orphan_asked_.fetch_add(1, std::memory_order_acq_rel) + 1;
  while (orphan_answered_.load(std::memory_order_acquire) != ticket) {
    if (stopping_.load(std::memory_order_relaxed)) return -ESHUTDOWN;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return orphan_result_.load(std::memory_order_relaxed);
}

// ---------------------------------------------------------------- requests

bool Proxy::Impl::drain_requests() {
  const uint32_t mask = ctx_.request_mask;
  // The ring is full when even the last entry of this lap is published:
  // producers are waiting for room (back-pressure on the GPU).
  const Request *last = requests_ + ((head_ + mask) & mask);
  if (__atomic_load_n(&last->seq, __ATOMIC_ACQUIRE) == head_ + mask + 1)
    stat_full_laps_.fetch_add(1, std::memory_order_relaxed);
  uint64_t taken = 0;
  for (;;) {
    Request *e = requests_ + (head_ & mask);
    if (__atomic_load_n(&e->seq, __ATOMIC_ACQUIRE) != head_ + 1) break;
    Request r;
    std::memcpy(static_cast<void *>(&r), e, 64);
    if (r.addr_len > 0)  // words 8..11, as hashed (the address and the padding after it)
      std::memcpy(reinterpret_cast<uint64_t *>(&r) + 8, reinterpret_cast<const uint64_t *>(e) + 8, 32);
    // The request may still be arriving piece by piece: take it only whole.
    if (r.seq != head_ + 1 || request_check(reinterpret_cast<const uint64_t *>(&r), r.addr_len > 0) != r.check)
      break;
    std::atomic_thread_fence(std::memory_order_acquire);
    ++head_;
    ++taken;
    handle(r);
    if (taken == mask + 1) break;  // one lap at a time: the network moves in between
  }
  if (taken == 0) return false;
  stat_requests_.fetch_add(taken, std::memory_order_relaxed);
  publish(&shared_->consumed, head_);
  return true;
}

// ctrl_done and ctrl_result share one aligned 8-byte word: one store, so the GPU
// reads both with one load and needs no fence between them.
void Proxy::Impl::complete(uint32_t slot, const Request &r, int result) {
  const uint64_t word = uint64_t(r.ctrl_seq) | (uint64_t(static_cast<uint32_t>(result)) << 32);
  publish(reinterpret_cast<uint64_t *>(&status_[slot].ctrl_done), word);
}

void Proxy::Impl::activate(uint32_t index) {
  Slot &s = slots_[index];
  if (!s.in_active) {
    s.in_active = true;
    active_.push_back(index);
  }
}

void Proxy::Impl::handle(const Request &r) {
  if (r.slot >= slots_.size()) return;
  Slot &s = slots_[r.slot];
  if (r.gen != s.gen) {
    // The GPU claims a slot only after we released it, so a new socket is
    // always the next generation; anything else is a stale call on a closed fd.
    if (r.gen != s.gen + 1 || s.in_use) return;
    s.gen = r.gen;
    s.in_use = true;
  }
  if (!s.in_use) return;  // a late call on a socket that was closed meanwhile
  const uint32_t index = r.slot;
  // Every request carries the GPU's ring positions: apply them first, so a
  // shutdown or close never overtakes bytes the GPU has already handed over.
  if (s.conn && r.op != kOpAccept) {
    s.conn->apply_gpu_positions(r.send_tail, r.recv_read);
    activate(index);
  }
  switch (r.op) {
    case kOpNop:
      complete(index, r, 0);
      return;
    case kOpData:
      return;  // positions applied above
    case kOpBind: {
      int rc = 0;
      if (s.listener || s.conn || s.addr_len) rc = -EINVAL;
      else if (r.addr_len < sizeof(sa_family_t)) rc = -EINVAL;
      else {
        sa_family_t family;
        std::memcpy(&family, r.addr, sizeof family);
        if (family == AF_INET && r.addr_len < sizeof(sockaddr_in)) rc = -EINVAL;
        else if (family == AF_INET6 && r.addr_len < sizeof(sockaddr_in6)) rc = -EINVAL;
        else if (family != AF_INET && family != AF_INET6) rc = -EAFNOSUPPORT;
      }
      if (rc == 0) {
        std::memcpy(&s.addr, r.addr, r.addr_len);
        s.addr_len = r.addr_len;
      }
      complete(index, r, rc);
      return;
    }
    case kOpListen: {
      int rc = 0;
      if (s.conn) rc = -EINVAL;
      else if (!s.listener) {
        if (s.addr_len == 0) {  // like TCP: listen on an unbound socket picks any port
          s.addr = sockaddr_storage{};
          s.addr.ss_family = AF_INET;
          s.addr_len = sizeof(sockaddr_in);
        }
        auto ls = std::make_unique<ListenerState>();
        ls->backlog = std::clamp(r.arg0 <= 0 ? 1 : r.arg0, 1, 4096);
        rc = domain_->listen(reinterpret_cast<sockaddr *>(&s.addr), s.addr_len, ls->backlog, &ls->listener);
        if (rc == 0) {
          s.listener = std::move(ls);
          activate(index);
          publish_slot(index);
        }
      }
      complete(index, r, rc);
      return;
    }
    case kOpConnect: {
      int rc = 0;
      BufferSet set;
      if (s.conn || s.listener) rc = s.conn ? -EISCONN : -EINVAL;
      else rc = take_buffer_set(&set);
      if (rc == 0) {
        auto conn = std::make_unique<Connection>(domain_.get(), set);
        rc = conn->connect(reinterpret_cast<const sockaddr *>(r.addr), r.addr_len);
        if (rc == 0) {
          s.conn = std::move(conn);
          activate(index);
          publish(&status_[index].buffer, set.index);
          shadows_[index].buffer = set.index;
        } else {
          conn.reset();
          return_buffer_set(set);
        }
      }
      complete(index, r, rc);
      return;
    }
    case kOpAccept: {
      int rc = -EINVAL;
      const uint32_t li = static_cast<uint32_t>(r.arg0);
      if (li < slots_.size() && slots_[li].gen == static_cast<uint32_t>(r.arg1) && slots_[li].listener &&
          !s.conn && !s.listener) {
        ListenerState &ls = *slots_[li].listener;
        if (ls.queue.empty()) {
          rc = -EAGAIN;  // another block took it first
        } else {
          s.conn = std::move(ls.queue.front());
          ls.queue.pop_front();
          activate(index);
          shadows_[index].buffer = ~0u;  // force the buffer index out
          publish_slot(index);
          publish_slot(li);
          rc = 0;
        }
      }
      complete(index, r, rc);
      return;
    }
    case kOpShutdown: {
      const int rc = s.conn ? s.conn->shutdown(r.arg0) : -ENOTCONN;
      if (s.conn) publish_slot(index);
      complete(index, r, rc);
      return;
    }
    case kOpClose:
      release_slot(index);
      return;
    default:
      complete(index, r, -EINVAL);
      return;
  }
}

// The socket is closed: its connection finishes in the background, and the
// slot goes back to the GPU at once (its buffer set stays with the connection).
void Proxy::Impl::release_slot(uint32_t index, bool abort) {
  Slot &s = slots_[index];
  if (s.listener) {
    for (auto &c : s.listener->accepting) retire(std::move(c));
    for (auto &c : s.listener->queue) retire(std::move(c));
    s.listener.reset();
  }
  if (s.conn) {
    if (abort) s.conn->abort();
    else s.conn->begin_close(Clock::now() + std::chrono::milliseconds(options_.close_flush_ms));
    closing_.push_back(std::move(s.conn));
  }
  s.addr_len = 0;
  s.addr = sockaddr_storage{};
  s.in_use = false;
  SocketStatus &st = status_[index];
  publish(&st.state, 0u);
  publish(&st.recv_write, uint64_t(0));
  publish(&st.send_done, uint64_t(0));
  publish(&st.ctrl_done, 0u);
  publish(&st.ctrl_result, 0);
  publish(&st.buffer, 0u);
  publish(&st.accept_queued, 0u);
  publish(&st.error, 0);
  publish(&st.send_error, 0);
  shadows_[index] = Shadow{};
  publish(&st.releases, s.gen);  // last: the GPU may claim the slot now
}

void Proxy::Impl::retire(std::unique_ptr<Connection> conn) {
  if (!conn) return;
  conn->begin_close(Clock::now() + std::chrono::milliseconds(options_.close_flush_ms));
  closing_.push_back(std::move(conn));
}

int Proxy::Impl::take_buffer_set(BufferSet *out) {
  if (free_buffers_.empty()) return -ENOBUFS;
  const uint32_t i = free_buffers_.back();
  free_buffers_.pop_back();
  out->index = i;
  out->rbuf = rbuf_reg_ + size_t(i) * options_.rbuf_size;
  out->sbuf = sbuf_reg_ + size_t(i) * options_.sbuf_size;
  out->rbuf_size = options_.rbuf_size;
  out->sbuf_size = options_.sbuf_size;
  return 0;
}

void Proxy::Impl::return_buffer_set(const BufferSet &set) { free_buffers_.push_back(set.index); }

// ---------------------------------------------------------------- progress

bool Proxy::Impl::progress_active() {
  bool did = false;
  for (size_t i = 0; i < active_.size();) {
    const uint32_t index = active_[i];
    Slot &s = slots_[index];
    if (!s.listener && !s.conn) {  // released: drop from the list
      s.in_active = false;
      active_[i] = active_.back();
      active_.pop_back();
      continue;
    }
    if (s.listener && poll_listeners_) did |= progress_listener(index, s);
    if (s.conn) {
      const ConnRole before = s.conn->role();
      did |= s.conn->progress();
      if (before != ConnRole::kConnected && s.conn->role() == ConnRole::kConnected)
        stat_connections_.fetch_add(1, std::memory_order_relaxed);
      publish_slot(index);
    }
    ++i;
  }
  return did;
}

bool Proxy::Impl::progress_listener(uint32_t index, Slot &slot) {
  ListenerState &ls = *slot.listener;
  bool did = false;
  for (size_t i = 0; i < ls.accepting.size();) {
    Connection &child = *ls.accepting[i];
    did |= child.progress();
    if (child.role() == ConnRole::kAccepting) {
      ++i;
      continue;
    }
    did = true;
    if (child.role() == ConnRole::kConnected) {
      stat_connections_.fetch_add(1, std::memory_order_relaxed);
      ls.queue.push_back(std::move(ls.accepting[i]));
    } else {
      retire(std::move(ls.accepting[i]));
    }
    ls.accepting.erase(ls.accepting.begin() + static_cast<long>(i));
  }
  // Established connections not yet taken by gaccept keep moving: credits are
  // granted and the peer's first bytes land in their rings.
  for (auto &c : ls.queue) did |= c->progress();
  while (ls.accepting.size() + ls.queue.size() < static_cast<size_t>(ls.backlog)) {
    if (free_buffers_.empty()) {  // back-pressure: requests wait in the listener
      stat_no_buffer_.fetch_add(1, std::memory_order_relaxed);
      break;
    }
    std::unique_ptr<wire::ConnectionRequest> request;
    if (ls.listener->get_request(&request) <= 0) break;
    did = true;
    wire::ConnRecord peer;
    wire::RecordError why;
    if (wire::decode_conn_record(request->private_data(), request->private_len(), &peer, &why) < 0) {
      std::fprintf(stderr, "gpusock proxy: rejecting connection: %s\n", wire::record_error_text(why));
      request->reject();
      continue;
    }
    BufferSet set;
    take_buffer_set(&set);
    auto child = std::make_unique<Connection>(domain_.get(), set);
    if (int rc = child->accept(request.get(), peer); rc < 0) {
      std::fprintf(stderr, "gpusock proxy: accept failed: %s\n", gs_status_name(rc));
      request->reject();
      child.reset();
      return_buffer_set(set);
      continue;
    }
    ls.accepting.push_back(std::move(child));
  }
  publish_slot(index);
  return did;
}

bool Proxy::Impl::progress_closing() {
  bool did = false;
  for (size_t i = 0; i < closing_.size();) {
    if (closing_[i]->close_finished()) {
      const BufferSet set = closing_[i]->buffers();
      closing_[i].reset();  // disconnects and deregisters before the rings are reused
      return_buffer_set(set);
      closing_[i] = std::move(closing_.back());
      closing_.pop_back();
      did = true;
    } else {
      ++i;
    }
  }
  return did;
}

// Writes what changed since the last publication: counters first, state last.
void Proxy::Impl::publish_slot(uint32_t index) {
  Slot &s = slots_[index];
  Shadow &sh = shadows_[index];
  SocketStatus &st = status_[index];
  Shadow now = sh;
  if (s.listener) {
    now.state = kStListening;
    now.accept_queued = static_cast<uint32_t>(s.listener->queue.size());
  } else if (s.conn) {
    const proxy::ConnSnapshot snap = s.conn->snapshot();
    now.recv_write = snap.recv_write;
    now.send_done = snap.send_done;
    now.state = snap.state;
    now.error = snap.error;
    now.send_error = snap.send_error;
    now.buffer = s.conn->buffers().index;
  } else {
    return;
  }
  if (now.buffer != sh.buffer) publish(&st.buffer, now.buffer);
  if (now.recv_write != sh.recv_write) publish(&st.recv_write, now.recv_write);
  if (now.send_done != sh.send_done) publish(&st.send_done, now.send_done);
  if (now.accept_queued != sh.accept_queued) publish(&st.accept_queued, now.accept_queued);
  if (now.error != sh.error) publish(&st.error, now.error);
  if (now.send_error != sh.send_error) publish(&st.send_error, now.send_error);
  if (now.state != sh.state) publish(&st.state, now.state);
  sh = now;
}

// ---------------------------------------------------------------- Proxy

Proxy::Proxy(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Proxy::~Proxy() { stop(); }

int Proxy::start(const ProxyOptions &options, MemoryResource *memory, std::unique_ptr<Proxy> *out) {
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

ProxyStats Proxy::stats() const {
  ProxyStats s;
  s.requests = impl_->stat_requests_.load();
  s.connections = impl_->stat_connections_.load();
  s.full_ring_drains = impl_->stat_full_laps_.load();
  s.rejected_no_buffer = impl_->stat_no_buffer_.load();
  s.orphans_closed = impl_->stat_orphans_.load();
  s.passes = impl_->stat_passes_.load();
  return s;
}

}  // namespace gpusock
