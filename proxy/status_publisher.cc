#include "proxy/status_publisher.h"

namespace gpusock::proxy {

using channel::InlineRecv;
using channel::SocketStatus;

void StatusPublisher::attach(SocketStatus *status, InlineRecv *inline_recv, uint32_t sockets) {
  status_ = status;
  inline_recv_ = inline_recv;
  reports_.assign(sockets, SlotReport{});
}

void StatusPublisher::publish(uint32_t index, const SlotReport &now) {
  SlotReport &was = reports_[index];
  SocketStatus &st = status_[index];
  if (now.buffer != was.buffer) proxy::publish(&st.buffer, now.buffer);
  if (now.recv_write != was.recv_write) proxy::publish(&st.recv_write, now.recv_write);
  if (now.send_done != was.send_done) proxy::publish(&st.send_done, now.send_done);
  if (now.accept_queued != was.accept_queued) proxy::publish(&st.accept_queued, now.accept_queued);
  if (now.error != was.error) proxy::publish(&st.error, now.error);
  if (now.send_error != was.send_error) proxy::publish(&st.send_error, now.send_error);
  if (now.state != was.state) proxy::publish(&st.state, now.state);
  was = now;
}

void StatusPublisher::complete(uint32_t index, uint32_t ctrl_seq, int result) {
  const uint64_t word = uint64_t(ctrl_seq) | (uint64_t(static_cast<uint32_t>(result)) << 32);
  proxy::publish(reinterpret_cast<uint64_t *>(&status_[index].ctrl_done), word);
}

void StatusPublisher::release(uint32_t index, uint32_t gen) {
  SocketStatus &st = status_[index];
  // The next socket on this slot starts at ring position 0 again: an inline
  // record left from this one would pass its check (zeros never do).
  uint64_t *inline_words = reinterpret_cast<uint64_t *>(&inline_recv_[index]);
  for (size_t i = 0; i < sizeof(InlineRecv) / 8; ++i) __atomic_store_n(inline_words + i, uint64_t(0), __ATOMIC_RELAXED);
  proxy::publish(&st.state, 0u);
  proxy::publish(&st.recv_write, uint64_t(0));
  proxy::publish(&st.send_done, uint64_t(0));
  proxy::publish(&st.ctrl_done, 0u);
  proxy::publish(&st.ctrl_result, 0);
  proxy::publish(&st.buffer, 0u);
  proxy::publish(&st.accept_queued, 0u);
  proxy::publish(&st.error, 0);
  proxy::publish(&st.send_error, 0);
  reports_[index] = SlotReport{};
  proxy::publish(&st.releases, gen);
}

}  // namespace gpusock::proxy
