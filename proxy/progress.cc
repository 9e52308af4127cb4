// The proxy's progress: every live connection and listener of one thread
// driven one pass, and what changed published to the status lines the GPU
// polls.
#include "proxy/proxy_impl.h"
#include "wire/log.h"

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
      if (before != DriverState::kConnected && s.conn->state() == DriverState::kConnected) bump(w.stats.connections);
      publish_slot(index);
    }
    ++i;
  }
  return did;
}

bool Proxy::Impl::progress_listener(Worker &w, uint32_t index, Slot &slot) {
  ListenerState &ls = *slot.listener;
  bool did = false;
  {
    std::lock_guard<std::mutex> lock(listeners_mu_);  // gaccept may take from the queue on another thread
    did |= progress_handshakes(w, ls);
    // Established connections not yet taken by gaccept keep moving: credits
    // are granted and the peer's first bytes land in their rings.
    for (auto &c : ls.queue) did |= c->progress();
    did |= take_new_requests(w, ls);
    if (ls.accepting.size() + ls.queue.size() >= static_cast<size_t>(ls.backlog))
      did |= wire::refuse_pending_requests(*ls.listener) > 0;
  }
  publish_slot(index);
  return did;
}

// Handshakes under way, one pass each; the established ones join the queue
// gaccept takes from, the failed ones close.
bool Proxy::Impl::progress_handshakes(Worker &w, ListenerState &ls) {
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
      bump(w.stats.connections);
      ls.queue.push_back(std::move(ls.accepting[i]));
      ls.queued.store(static_cast<uint32_t>(ls.queue.size()), std::memory_order_relaxed);
    } else {
      retire(w, std::move(ls.accepting[i]));
    }
    ls.accepting.erase(ls.accepting.begin() + static_cast<long>(i));
  }
  return did;
}

// New connection requests, while the backlog has room. A buffer set first (the
// pool is shared by the threads): without one, requests wait in the listener
// (back-pressure).
bool Proxy::Impl::take_new_requests(Worker &w, ListenerState &ls) {
  bool did = false;
  while (ls.accepting.size() + ls.queue.size() < static_cast<size_t>(ls.backlog)) {
    BufferSet set;
    if (buffers_.take(&set) < 0) {
      bump(w.stats.no_buffer);
      break;
    }
    std::unique_ptr<wire::ConnectionRequest> request;
    wire::ConnRecord peer;
    const auto rejected = [](void *, int, const char *why) {
      log::write(log::kWarn, "proxy", "rejecting connection: %s", why);
    };
    if (wire::next_valid_request(*ls.listener, &request, &peer, rejected, nullptr) <= 0) {
      buffers_.give_back(set);
      break;
    }
    did = true;
    auto child = std::make_unique<Connection>(domain_.get(), set);
    if (int rc = child->accept(request.get(), peer); rc < 0) {
      log::write(log::kWarn, "proxy", "accept failed: %s", gs_status_name(rc));
      request->reject();
      child.reset();
      buffers_.give_back(set);
      continue;
    }
    ls.accepting.push_back(std::move(child));
  }
  return did;
}

// What slot `index` shows the GPU now, published where it changed. A small
// request or reply rides beside the status line (InlineRecv): the record is
// written before the recv_write that covers it.
void Proxy::Impl::publish_slot(uint32_t index) {
  Slot &s = slots_[index];
  proxy::SlotReport now = status_.last(index);
  if (s.listener) {
    now.state = kStListening;
    now.accept_queued = s.listener->queued.load(std::memory_order_relaxed);
    status_.publish(index, now);
    return;
  }
  if (!s.conn) return;
  const proxy::ConnSnapshot snap = s.conn->snapshot();
  now.recv_write = snap.recv_write;
  now.send_done = snap.send_done;
  now.state = snap.state;
  now.error = snap.error;
  now.send_error = snap.send_error;
  now.buffer = s.conn->buffers().index;
  const uint64_t published = status_.last(index).recv_write;
  if (now.recv_write != published && (ctx_.flags & kCtxInlineRecv) &&
      s.conn->fill_inline_recv(status_.inline_record(index)))
    bump(owner(index).stats.inline_recvs);
  status_.publish(index, now);
  if (now.recv_write > published) s.conn->note_data_published(Clock::now());
}

}  // namespace gpusock
