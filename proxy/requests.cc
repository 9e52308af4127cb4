// The proxy's requests: the GPU's request ring drained in order, each
// request applied to its slot (bind, listen, connect, accept, shutdown, close,
// data positions), control requests answered in the same pass.
#include "proxy/proxy_impl.h"

#include <netinet/in.h>

#include <algorithm>
#include <cstring>

namespace gpusock {

// This thread's request ring (the GPU posts a socket's requests on ring
// slot % threads), drained in order and applied. True if it took any.
bool Proxy::Impl::drain_requests(Worker &w) {
  const uint32_t mask = ctx_.request_mask;
  Request *const ring = requests_ + size_t(w.id) * (mask + 1);
  // The ring is full when even the last entry of this lap is published:
  // producers are waiting for room (back-pressure on the GPU).
  const Request *last = ring + ((w.head + mask) & mask);
  if (__atomic_load_n(&last->seq, __ATOMIC_ACQUIRE) == w.head + mask + 1)
    bump(w.stats.full_laps);
  const uint32_t threads = static_cast<uint32_t>(workers_.size());
  uint64_t taken = 0;
  for (;;) {
    Request *e = ring + (w.head & mask);
    if (__atomic_load_n(&e->seq, __ATOMIC_ACQUIRE) != w.head + 1) break;
    Request r;
    std::memcpy(static_cast<void *>(&r), e, 64);
    const int line1 = request_line1_words(r);  // the address or an inline payload, as hashed
    if (line1 > 0)
      std::memcpy(reinterpret_cast<uint64_t *>(&r) + 8, reinterpret_cast<const uint64_t *>(e) + 8, 8 * size_t(line1));
    // The request may still be arriving piece by piece: take it only whole.
    if (r.seq != w.head + 1 || request_check(reinterpret_cast<const uint64_t *>(&r), line1) != r.check) break;
    std::atomic_thread_fence(std::memory_order_acquire);
    ++w.head;
    ++taken;
    // Another thread's socket on this ring is not ours to touch: dropped, as
    // a request for no socket is.
    if (r.slot % threads == w.id) handle(w, r);
    if (taken == mask + 1) break;  // one lap at a time: the network moves in between
  }
  if (taken == 0) return false;
  bump(w.stats.requests, taken);
  publish(&shared_[w.id].consumed, w.head);
  return true;
}

// ctrl_done and ctrl_result share one aligned 8-byte word: one store, so the GPU
// reads both with one load and needs no fence between them.
void Proxy::Impl::complete(uint32_t slot, const Request &r, int result) {
  const uint64_t word = uint64_t(r.ctrl_seq) | (uint64_t(static_cast<uint32_t>(result)) << 32);
  publish(reinterpret_cast<uint64_t *>(&status_[slot].ctrl_done), word);
}

void Proxy::Impl::activate(Worker &w, uint32_t index) {
  Slot &s = slots_[index];
  if (!s.in_active) {
    s.in_active = true;
    w.active.push_back(index);
  }
}

// Runs on the thread that owns r.slot.
void Proxy::Impl::handle(Worker &w, const Request &r) {
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
  // An inline payload goes into the send ring first: it is what send_tail adds.
  if (s.conn && r.op == kOpDataInline) {
    s.conn->write_inline_send(r.send_tail, r.payload, static_cast<uint32_t>(r.arg0));
    bump(w.stats.inline_sends);
  }
  if (s.conn && r.op != kOpAccept) {
    if ((r.op == kOpData || r.op == kOpDataInline) && r.send_tail > 0) {
      if (const uint64_t ns = s.conn->turnaround_ns(Clock::now())) {
        bump(w.stats.turnaround_ns, ns);
        bump(w.stats.turnarounds);
      }
    }
    s.conn->apply_gpu_positions(r.send_tail, r.recv_read);
    activate(w, index);
  }
  switch (r.op) {
    case kOpNop:
      complete(index, r, 0);
      return;
    case kOpData:
    case kOpDataInline:
      return;  // positions (and payload) applied above
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
        ls->gen = s.gen;
        rc = domain_->listen(reinterpret_cast<sockaddr *>(&s.addr), s.addr_len, ls->backlog, &ls->listener);
        if (rc == 0) {
          std::lock_guard<std::mutex> lock(listeners_mu_);
          s.listener = std::move(ls);
          activate(w, index);
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
          activate(w, index);
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
    case kOpAccept:
      complete(index, r, accept_into(w, index, static_cast<uint32_t>(r.arg0), static_cast<uint32_t>(r.arg1)));
      return;
    case kOpShutdown: {
      const int rc = s.conn ? s.conn->shutdown(r.arg0) : -ENOTCONN;
      if (s.conn) publish_slot(index);
      complete(index, r, rc);
      return;
    }
    case kOpClose:
      release_slot(w, index);
      return;
    default:
      complete(index, r, -EINVAL);
      return;
  }
}

// gaccept into slot `index` (this thread's) from the listener of another
// slot, perhaps another thread's: the connection changes threads under
// listeners_mu_, and the listener's owner publishes its shorter queue on its
// next listener pass. -EAGAIN: nothing queued (another block took it first).
int Proxy::Impl::accept_into(Worker &w, uint32_t index, uint32_t listener_slot, uint32_t listener_gen) {
  Slot &s = slots_[index];
  if (listener_slot >= slots_.size() || s.conn || s.listener) return -EINVAL;
  {
    std::lock_guard<std::mutex> lock(listeners_mu_);
    ListenerState *ls = slots_[listener_slot].listener.get();
    if (!ls || ls->gen != listener_gen) return -EINVAL;
    if (ls->queue.empty()) return -EAGAIN;
    s.conn = std::move(ls->queue.front());
    ls->queue.pop_front();
    ls->queued.store(static_cast<uint32_t>(ls->queue.size()), std::memory_order_relaxed);
  }
  activate(w, index);
  shadows_[index].buffer = ~0u;  // force the buffer index out
  publish_slot(index);
  if (&owner(listener_slot) == &w) publish_slot(listener_slot);
  return 0;
}

// The socket is closed: its connection finishes in the background, and the
// slot goes back to the GPU at once (its buffer set stays with the connection).
void Proxy::Impl::release_slot(Worker &w, uint32_t index, bool abort) {
  Slot &s = slots_[index];
  if (s.listener) {
    std::unique_ptr<ListenerState> ls;
    {
      std::lock_guard<std::mutex> lock(listeners_mu_);
      ls = std::move(s.listener);
    }
    for (auto &c : ls->accepting) retire(w, std::move(c));
    for (auto &c : ls->queue) retire(w, std::move(c));
  }
  if (s.conn) {
    if (abort) s.conn->abort();
    else s.conn->begin_close(Clock::now() + std::chrono::milliseconds(options_.close_flush_ms));
    w.closing.push_back(std::move(s.conn));
  }
  s.addr_len = 0;
  s.addr = sockaddr_storage{};
  s.in_use = false;
  SocketStatus &st = status_[index];
  // The next socket on this slot starts at ring position 0 again: an inline
  // record left from this one would pass its check (zeros never do).
  uint64_t *inline_words = reinterpret_cast<uint64_t *>(&inline_recv_[index]);
  for (size_t i = 0; i < sizeof(InlineRecv) / 8; ++i) __atomic_store_n(inline_words + i, uint64_t(0), __ATOMIC_RELAXED);
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

}  // namespace gpusock
