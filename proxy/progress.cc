// The proxy's progress: every live connection and listener driven one pass,
// connections that finished closing freed, and what changed published to the
// status lines the GPU polls.
#include "proxy/proxy_impl.h"

#include <cstdio>

namespace gpusock {

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
      const DriverState before = s.conn->state();
      did |= s.conn->progress();
      if (before != DriverState::kConnected && s.conn->state() == DriverState::kConnected)
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
    if (child.state() == DriverState::kAccepting) {
      ++i;
      continue;
    }
    did = true;
    if (child.state() == DriverState::kConnected) {
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
    wire::ConnRecord peer;
    const auto rejected = [](void *, int, const char *why) {
      std::fprintf(stderr, "gpusock proxy: rejecting connection: %s\n", why);
    };
    if (wire::next_valid_request(*ls.listener, &request, &peer, rejected, nullptr) <= 0) break;
    did = true;
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
  if (ls.accepting.size() + ls.queue.size() >= static_cast<size_t>(ls.backlog))
    did |= wire::refuse_pending_requests(*ls.listener) > 0;
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
  if (now.recv_write != sh.recv_write) {
    // A small request or reply rides beside the status line (InlineRecv).
    if (s.conn && (ctx_.flags & kCtxInlineRecv) && s.conn->fill_inline_recv(&inline_recv_[index]))
      stat_inline_recvs_.fetch_add(1, std::memory_order_relaxed);
    publish(&st.recv_write, now.recv_write);
    if (s.conn && now.recv_write > sh.recv_write) s.conn->note_data_published(Clock::now());
  }
  if (now.send_done != sh.send_done) publish(&st.send_done, now.send_done);
  if (now.accept_queued != sh.accept_queued) publish(&st.accept_queued, now.accept_queued);
  if (now.error != sh.error) publish(&st.error, now.error);
  if (now.send_error != sh.send_error) publish(&st.send_error, now.send_error);
  if (now.state != sh.state) publish(&st.state, now.state);
  sh = now;
}

}  // namespace gpusock
