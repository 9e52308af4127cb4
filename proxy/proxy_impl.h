// Inside the proxy (proxy.cc, requests.cc, progress.cc, workers.cc): its
// threads' state and what their passes do. Not a public header. The parts it
// is built from have their own files and tests: the channel's layout
// (channel_layout.h), the buffer sets (buffer_pool.h), the status lines
// (status_publisher.h), one connection (connection.h).
//
// The sockets are sharded: slot i belongs to thread i % threads, which alone
// touches its Slot, its connection and its status line, and which alone reads
// request ring i % threads, where the GPU posts that socket's requests. A
// pass of every thread: its ring drained and applied (requests.cc), its live
// connections and listeners progressed and what changed published
// (progress.cc), its closing connections finished (workers.cc holds the loop,
// the shared pools and a kernel's exit). proxy.cc: start, stop, the facade.
#pragma once

#include "proxy/buffer_pool.h"
#include "proxy/channel_layout.h"
#include "proxy/connection.h"
#include "proxy/status_publisher.h"

#include <gpusock/proxy.h>

#include <sched.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace gpusock {

using namespace gpusock::channel;
using proxy::BufferSet;
using proxy::Clock;
using proxy::Connection;
using proxy::DriverState;
using proxy::publish;

// A listening GPU socket: handshakes in flight and established connections
// waiting for gaccept. Both hold buffer sets, so the peer can send at once.
// The owner of its slot drives it; gaccept may run on another thread, so the
// queue (and the slot's listener pointer) change under Impl::listeners_mu_.
struct ListenerState {
  std::unique_ptr<wire::Listener> listener;
  uint32_t gen = 0;  // the socket generation that listens
  int backlog = 1;
  std::vector<std::unique_ptr<Connection>> accepting;  // owner only
  std::deque<std::unique_ptr<Connection>> queue;
  std::atomic<uint32_t> queued{0};  // queue.size(), for the owner's status line
};

// Cache-line aligned: neighbouring slots may belong to different threads.
struct alignas(64) Slot {
  uint32_t gen = 0;  // the socket generation adopted (== releases when free)
  bool in_use = false;
  bool in_active = false;  // listed in Impl::active_
  sockaddr_storage addr{};
  socklen_t addr_len = 0;
  std::unique_ptr<ListenerState> listener;
  std::unique_ptr<Connection> conn;
};

// What ProxyStats counts, per thread: each counter has one writer (bump), so
// the threads never share a line they write on every pass.
struct Counters {
  std::atomic<uint64_t> requests{0}, connections{0}, full_laps{0}, no_buffer{0};
  std::atomic<uint64_t> inline_sends{0}, inline_recvs{0}, turnaround_ns{0}, turnarounds{0};
};
inline void bump(std::atomic<uint64_t> &counter, uint64_t n = 1) {
  counter.store(counter.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

// One proxy thread: the slots it owns, the connections it drives and closes.
struct Worker {
  explicit Worker(uint32_t id_in) : id(id_in) {}
  const uint32_t id;
  std::thread thread;
  std::vector<uint32_t> active;  // owned slots with a listener or a connection
  std::vector<std::unique_ptr<Connection>> closing;
  Clock::time_point next_listener_poll{};
  bool poll_listeners = true;  // this pass
  uint64_t head = 0;           // the next ticket expected on this thread's request ring
  // kernel_exited(): the orphan call this thread answered last, and how many
  // of its slots it closed for it.
  alignas(64) std::atomic<uint64_t> orphans_answered{0};
  int orphans_closed = 0;
  alignas(64) Counters stats;
};

class Proxy::Impl {
 public:
  ~Impl() { stop(); }
  gs_status_t start(const ProxyOptions &options, MemoryResource *memory);
  void stop();
  void request_kernel_stop() {
    if (host_.shared) publish(&host_.shared->stop, 1u);  // nothing to tell once stopped
  }

  DeviceContext ctx_{};
  std::string placement_;
  std::atomic<uint64_t> stat_orphans_{0}, stat_passes_{0};  // thread 0's
  ProxyStats totals() const;
  size_t workers() const { return workers_.size(); }
  const char *transport_name() const { return domain_ ? domain_->caps().name : ""; }
  int kernel_exited(int grid_status);

 private:
  Worker &owner(uint32_t slot) { return *workers_[proxy_thread_of(slot, uint32_t(workers_.size()))]; }
  // start()
  void settle_options();
  gs_status_t allocate_channel();
  void start_threads(const cpu_set_t *cpus);
  void describe_placement(const std::string &device_memory);
  void loop(Worker &w);  // workers.cc
  // requests.cc
  bool drain_requests(Worker &w);
  void handle(Worker &w, const Request &r);
  void apply_positions(Worker &w, uint32_t index, const Request &r);
  int bind(Slot &s, const Request &r);
  int listen(Worker &w, uint32_t index, const Request &r);
  int connect(Worker &w, uint32_t index, const Request &r);
  int accept_into(Worker &w, uint32_t index, uint32_t listener_slot, uint32_t listener_gen);
  // progress.cc
  bool progress_active(Worker &w);
  bool progress_listener(Worker &w, uint32_t index, Slot &slot);
  bool progress_handshakes(Worker &w, ListenerState &ls);
  bool take_new_requests(Worker &w, ListenerState &ls);
  bool progress_closing(Worker &w);
  void publish_slot(uint32_t index);
  void release_slot(Worker &w, uint32_t index, bool abort = false);
  void close_orphans();
  int close_own_orphans(Worker &w, bool abort);
  void activate(Worker &w, uint32_t index);
  void retire(Worker &w, std::unique_ptr<Connection> conn);
  void close_everything();
  std::string probe_device_memory();
  uint32_t choose_threads() const;

  ProxyOptions options_;
  MemoryResource *memory_ = nullptr;
  std::unique_ptr<wire::Domain> domain_;
  proxy::ChannelShape shape_;
  proxy::ChannelBlocks blocks_;
  proxy::HostChannel host_;  // the proxy's view of the channel
  proxy::StatusPublisher status_;
  proxy::BufferPool buffers_;
  std::vector<Slot> slots_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::mutex listeners_mu_;  // every Slot::listener pointer and ListenerState::queue
  std::atomic<bool> stopping_{false};
  bool started_ = false;
  Clock::duration listener_every_{};
  // kernel_exited(): the caller posts a request, thread 0 answers it once
  // every thread has closed its own slots (orphan_epoch_ asks them).
  std::mutex orphan_call_;
  std::atomic<uint64_t> orphan_asked_{0}, orphan_answered_{0}, orphan_epoch_{0};
  std::atomic<bool> orphan_abort_{false};
  std::atomic<int> orphan_result_{0};
};

}  // namespace gpusock
