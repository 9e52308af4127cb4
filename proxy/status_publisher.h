// What the GPU polls about each socket: its status line (channel::SocketStatus)
// and its inline record, written by the thread that owns the socket. Only the
// fields that changed are written (each write is a PCIe-visible store the GPU
// may be polling), counters before the state bits that depend on them.
#pragma once

#include <gpusock/channel.h>

#include <cstdint>
#include <vector>

namespace gpusock::proxy {

// One socket's status line as last published. Cache-line aligned: neighbouring
// slots may belong to different threads.
struct alignas(64) SlotReport {
  uint64_t recv_write = 0, send_done = 0;
  uint32_t state = 0, buffer = 0, accept_queued = 0;
  int32_t error = 0, send_error = 0;
};

class StatusPublisher {
 public:
  void attach(channel::SocketStatus *status, channel::InlineRecv *inline_recv, uint32_t sockets);

  // Writes the fields of `now` that differ from slot `index`'s last report:
  // the buffer and the counters first, the state last, so a GPU that reads the
  // state and then the counters never sees EOF before the last bytes.
  void publish(uint32_t index, const SlotReport &now);
  const SlotReport &last(uint32_t index) const { return reports_[index]; }
  // The next publish writes the buffer index whatever it is (a connection
  // moved into the slot).
  void forget_buffer(uint32_t index) { reports_[index].buffer = ~0u; }
  channel::InlineRecv *inline_record(uint32_t index) { return &inline_recv_[index]; }

  // A control request's answer: ctrl_seq and the result in one aligned 8-byte
  // store, so the GPU reads both with one load and needs no fence between them.
  void complete(uint32_t index, uint32_t ctrl_seq, int result);
  // The socket on slot `index` is closed: its line and inline record back to
  // zero, then releases = gen, last: from then on the GPU may claim the slot.
  void release(uint32_t index, uint32_t gen);

 private:
  channel::SocketStatus *status_ = nullptr;
  channel::InlineRecv *inline_recv_ = nullptr;
  std::vector<SlotReport> reports_;
};

// A store the GPU polls: release, so what came before it is visible first.
template <class T>
void publish(T *field, T value) {
  __atomic_store_n(field, value, __ATOMIC_RELEASE);
}

}  // namespace gpusock::proxy
