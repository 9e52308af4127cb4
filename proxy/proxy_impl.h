// Inside the proxy (proxy.cc, requests.cc, progress.cc): the state of one
// proxy thread and what its passes do. Not a public header.
//
// A pass: drain the GPU's request ring (requests.cc), progress every live
// connection and listener and publish what changed (progress.cc), finish
// closing connections; proxy.cc holds start, stop, the loop and the facade.
#pragma once

#include "proxy/connection.h"

#include <gpusock/proxy.h>

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

// A store the GPU polls: release, so what it publishes is visible first.
template <class T>
void publish(T *field, T value) {
  __atomic_store_n(field, value, __ATOMIC_RELEASE);
}

// A listening GPU socket: handshakes in flight and established connections
// waiting for gaccept. Both hold buffer sets, so the peer can send at once.
struct ListenerState {
  std::unique_ptr<wire::Listener> listener;
  int backlog = 1;
  std::vector<std::unique_ptr<Connection>> accepting;
  std::deque<std::unique_ptr<Connection>> queue;
};

struct Slot {
  uint32_t gen = 0;  // the socket generation adopted (== releases when free)
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
  gs_status_t start(const ProxyOptions &options, MemoryResource *memory);
  void stop();
  void request_kernel_stop() { publish(&shared_->stop, 1u); }

  DeviceContext ctx_{};
  std::string placement_;
  std::atomic<uint64_t> stat_requests_{0}, stat_connections_{0}, stat_full_laps_{0}, stat_no_buffer_{0};
  std::atomic<uint64_t> stat_orphans_{0}, stat_passes_{0}, stat_inline_sends_{0}, stat_inline_recvs_{0};
  std::atomic<uint64_t> stat_turnaround_ns_{0}, stat_turnarounds_{0};
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
  std::string probe_device_memory();

  ProxyOptions options_;
  MemoryResource *memory_ = nullptr;
  std::unique_ptr<wire::Domain> domain_;
  MemoryBlock requests_mem_{}, status_mem_{}, private_mem_{}, rbuf_mem_{}, sbuf_mem_{};
  Request *requests_ = nullptr;  // host view
  ProxyShared *shared_ = nullptr;
  SocketStatus *status_ = nullptr;
  InlineRecv *inline_recv_ = nullptr;  // per slot, after status_
  uint8_t *rbuf_reg_ = nullptr;        // what the transport registers
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

}  // namespace gpusock
