// The proxy's progress: every live connection and listener of one thread
// driven one pass, and what changed published to the status lines the GPU
// polls.
#include "proxy/proxy_impl.h"

#include <cstdio>

namespace gpusock {

bool Proxy::Impl::progress_active(Worker &w) {
  bool did = false;
  for (size_t i = 0; i < w.active.size();) {
    const uint32_t index = w.active[i];
    Slot &s = slots_[index];
    if (!s.listener && !s.conn) {  // released: drop from the list
      s.in_active = false;
      w.active[i] = w.active.back();
      w.active.pop_back();
      continue;
    }
    if (s.listener) {
      if (w.poll_listeners) did |= progress_listener(w, index, s);
      else publish_slot(index);  // a gaccept on another thread shortened the queue
    }
    if (s.conn) {
      const DriverState before = s.conn->state();
      did |= s.conn->progress();
      if (before != DriverState::kConnected && s.conn->state() == DriverState::kConnected)
        bump(w.stats.connections);
      publish_slot(index);
    }
    ++i;
  }
  return did;
}

bool Proxy::Impl::progress_listener(Worker &w, uint32_t index, Slot &slot) {
  ListenerState &ls = *slot.listener;
  bool did = false;
  std::lock_guard<std::mutex> lock(listeners_mu_);  // gaccept may take from the queue on another thread
  for (size_t i = 0; i < ls.accepting.size();) {
    Connection &child = *ls.accepting[i];
    did |= child.progress();
    if (child.state() == DriverState::kAccepting) {
      ++i;
      continue;
    }
    did = true;
    if (child.state() == DriverState::kConnected) {
      bump(w.stats.connections);
      ls.queue.push_back(std::move(ls.accepting[i]));
      ls.queued.store(static_cast<uint32_t>(ls.queue.size()), std::memory_order_relaxed);
    } else {
      retire(w, std::move(ls.accepting[i]));
    }
    ls.accepting.erase(ls.accepting.begin() + static_cast<long>(i));
  }
  // Established connections not yet taken by gaccept keep moving: credits are
  // granted and the peer's first bytes land in their rings.
  for (auto &c : ls.queue) did |= c->progress();
  while (ls.accepting.size() + ls.queue.size() < static_cast<size_t>(ls.backlog)) {
    // A buffer set first (the pool is shared by the threads): without one,
    // requests wait in the listener (back-pressure).
    BufferSet set;
    if (take_buffer_set(&set) < 0) {
      bump(w.stats.no_buffer);
      break;
    }
    std::unique_ptr<wire::ConnectionRequest> request;
    wire::ConnRecord peer;
    const auto rejected = [](void *, int, const char *why) {
      std::fprintf(stderr, "gpusock proxy: rejecting connection: %s\n", why);
    };
    if (wire::next_valid_request(*ls.listener, &request, &peer, rejected, nullptr) <= 0) {
      return_buffer_set(set);
      break;
    }
    did = true;
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

// Writes what changed since the last publication: counters first, state last.
void Proxy::Impl::publish_slot(uint32_t index) {
  Slot &s = slots_[index];
  Shadow &sh = shadows_[index];
  SocketStatus &st = status_[index];
  Shadow now = sh;
  if (s.listener) {
    now.state = kStListening;
    now.accept_queued = s.listener->queued.load(std::memory_order_relaxed);
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
      bump(owner(index).stats.inline_recvs);
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
