// The proxy's requests: the GPU's request ring drained in order, each
// request applied to its slot (bind, listen, connect, accept, shutdown, close,
// data positions), control requests answered in the same pass.
#include "proxy/proxy_impl.h"
#include "wire/socket_rules.h"

#include <netinet/in.h>

#include <algorithm>
#include <cstring>

namespace gpusock {

namespace {

// The address of a bind or connect request, as the socket rules accept it:
// never more than the second line's bytes, whatever addr_len a faulty kernel
// wrote.
int request_address(const Request &r, const sockaddr **addr, socklen_t *len) {
  if (r.addr_len > kMaxAddrLen) return -EINVAL;
  *addr = reinterpret_cast<const sockaddr *>(r.addr);
  *len = r.addr_len;
  return wire::rules::check_address(*addr, *len, AF_UNSPEC);
}

}  // namespace

// This thread's request ring (the GPU posts a socket's requests on ring
// slot % threads), drained in order and applied. True if it took any.
bool Proxy::Impl::drain_requests(Worker &w) {
  const uint32_t mask = ctx_.request_mask;
  Request *const ring = host_.requests + size_t(w.id) * (mask + 1);
  // The ring is full when even the last entry of this lap is published:
  // producers are waiting for room (back-pressure on the GPU).
  const Request *last = ring + ((w.head + mask) & mask);
  if (__atomic_load_n(&last->seq, __ATOMIC_ACQUIRE) == w.head + mask + 1) bump(w.stats.full_laps);
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
    if (proxy_thread_of(r.slot, threads) == w.id) handle(w, r);
    if (taken == mask + 1) break;  // one lap at a time: the network moves in between
  }
  if (taken == 0) return false;
  bump(w.stats.requests, taken);
  publish(&host_.shared[w.id].consumed, w.head);
  return true;
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
  apply_positions(w, index, r);
  switch (r.op) {
    case kOpNop:
      return status_.complete(index, r.ctrl_seq, 0);
    case kOpData:
    case kOpDataInline:
      return;  // positions (and payload) applied above
    case kOpBind:
      return status_.complete(index, r.ctrl_seq, bind(s, r));
    case kOpListen:
      return status_.complete(index, r.ctrl_seq, listen(w, index, r));
    case kOpConnect:
      return status_.complete(index, r.ctrl_seq, connect(w, index, r));
    case kOpAccept:
      return status_.complete(index, r.ctrl_seq,
                              accept_into(w, index, static_cast<uint32_t>(r.arg0), static_cast<uint32_t>(r.arg1)));
    case kOpShutdown: {
      const int rc = s.conn ? s.conn->shutdown(r.arg0) : -ENOTCONN;
      if (s.conn) publish_slot(index);
      return status_.complete(index, r.ctrl_seq, rc);
    }
    case kOpClose:
      return release_slot(w, index);
    default:
      return status_.complete(index, r.ctrl_seq, -EINVAL);
  }
}

// Every request carries the GPU's ring positions: applied first, so a shutdown
// or close never overtakes bytes the GPU has already handed over. An inline
// payload goes into the send ring before: it is what send_tail adds.
void Proxy::Impl::apply_positions(Worker &w, uint32_t index, const Request &r) {
  Connection *conn = slots_[index].conn.get();
  if (!conn || r.op == kOpAccept) return;
  if (r.op == kOpDataInline) {
    conn->write_inline_send(r.send_tail, r.payload, static_cast<uint32_t>(r.arg0));
    bump(w.stats.inline_sends);
  }
  if ((r.op == kOpData || r.op == kOpDataInline) && r.send_tail > 0) {
    if (const uint64_t ns = conn->turnaround_ns(Clock::now())) {
      bump(w.stats.turnaround_ns, ns);
      bump(w.stats.turnarounds);
    }
  }
  conn->apply_gpu_positions(r.send_tail, r.recv_read);
  activate(w, index);
}

int Proxy::Impl::bind(Slot &s, const Request &r) {
  if (s.listener || s.conn || s.addr_len) return -EINVAL;
  const sockaddr *addr;
  socklen_t len;
  if (const int rc = request_address(r, &addr, &len); rc < 0) return rc;
  std::memcpy(&s.addr, addr, len);
  s.addr_len = len;
  return 0;
}

int Proxy::Impl::listen(Worker &w, uint32_t index, const Request &r) {
  Slot &s = slots_[index];
  if (s.conn) return -EINVAL;
  if (s.listener) return 0;
  if (s.addr_len == 0) s.addr_len = wire::rules::any_address(AF_INET, &s.addr);
  auto ls = std::make_unique<ListenerState>();
  ls->backlog = wire::rules::clamp_backlog(r.arg0);
  ls->gen = s.gen;
  const int rc = domain_->listen(reinterpret_cast<sockaddr *>(&s.addr), s.addr_len, ls->backlog, &ls->listener);
  if (rc < 0) return rc;
  {
    std::lock_guard<std::mutex> lock(listeners_mu_);
    s.listener = std::move(ls);
  }
  activate(w, index);
  publish_slot(index);
  return 0;
}

int Proxy::Impl::connect(Worker &w, uint32_t index, const Request &r) {
  Slot &s = slots_[index];
  if (s.conn) return -EISCONN;
  if (s.listener) return -EINVAL;
  const sockaddr *addr;
  socklen_t len;
  if (const int rc = request_address(r, &addr, &len); rc < 0) return rc;
  BufferSet set;
  if (const int rc = buffers_.take(&set); rc < 0) return rc;
  auto conn = std::make_unique<Connection>(domain_.get(), set);
  if (const int rc = conn->connect(addr, len); rc < 0) {
    conn.reset();  // deregisters before the rings go back
    buffers_.give_back(set);
    return rc;
  }
  s.conn = std::move(conn);
  activate(w, index);
  status_.forget_buffer(index);
  publish_slot(index);
  return 0;
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
  status_.forget_buffer(index);
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
  status_.release(index, s.gen);
}

}  // namespace gpusock
