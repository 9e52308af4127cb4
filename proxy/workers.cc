// The proxy's threads: each one's loop, closing connections, a kernel's exit and the flush at stop.
#include "proxy/proxy_impl.h"
#include "wire/log.h"

#include <time.h>

#include <cstdio>

namespace gpusock {

void Proxy::Impl::loop(Worker &w) {
  auto last_work = Clock::now();
  long sleep_us = 5;
  while (!stopping_.load(std::memory_order_relaxed)) {
    if (w.id == 0) {
      if (orphan_asked_.load(std::memory_order_acquire) != orphan_answered_.load(std::memory_order_relaxed))
        close_orphans();
      stat_passes_.store(stat_passes_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    } else if (const uint64_t epoch = orphan_epoch_.load(std::memory_order_acquire);
               epoch != w.orphans_answered.load(std::memory_order_relaxed)) {
      w.orphans_closed = close_own_orphans(w, orphan_abort_.load(std::memory_order_relaxed));
      w.orphans_answered.store(epoch, std::memory_order_release);
    }
    bool did = drain_requests(w);
    // New connections on listeners need no microsecond answer: looking for
    // them (a CM / handshake poll per listener) only every listener_poll_us
    // keeps the pass short for the connections that carry data.
    if (listener_every_.count() == 0) {
      w.poll_listeners = true;
    } else {
      const auto now = Clock::now();
      w.poll_listeners = now >= w.next_listener_poll;
      if (w.poll_listeners) w.next_listener_poll = now + listener_every_;
    }
    did |= progress_active(w);
    did |= progress_closing(w);
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

bool Proxy::Impl::progress_closing(Worker &w) {
  bool did = false;
  for (size_t i = 0; i < w.closing.size();) {
    if (w.closing[i]->close_finished()) {
      const BufferSet set = w.closing[i]->buffers();
      w.closing[i].reset();  // disconnects and deregisters before the rings are reused
      buffers_.give_back(set);
      w.closing[i] = std::move(w.closing.back());
      w.closing.pop_back();
      did = true;
    } else {
      ++i;
    }
  }
  return did;
}

void Proxy::Impl::retire(Worker &w, std::unique_ptr<Connection> conn) {
  if (!conn) return;
  conn->begin_close(Clock::now() + std::chrono::milliseconds(options_.close_flush_ms));
  w.closing.push_back(std::move(conn));
}

// The kernel is gone: whatever it published is taken first (its last data and
// gclose requests), then every slot still in use is closed as by gclose, or
// reset when the kernel failed, each by the thread that owns it.
void Proxy::Impl::close_orphans() {
  const uint64_t asked = orphan_asked_.load(std::memory_order_acquire);
  const bool abort = orphan_abort_.load(std::memory_order_relaxed);
  orphan_epoch_.store(asked, std::memory_order_release);
  int closed = close_own_orphans(*workers_[0], abort);
  for (size_t i = 1; i < workers_.size(); ++i) {
    while (workers_[i]->orphans_answered.load(std::memory_order_acquire) != asked) {
      if (stopping_.load(std::memory_order_relaxed)) return;
      std::this_thread::yield();
    }
    closed += workers_[i]->orphans_closed;
  }
  if (closed > 0) {
    stat_orphans_.fetch_add(static_cast<uint64_t>(closed), std::memory_order_relaxed);
    log::write(log::kWarn, "proxy", "the kernel %s with %d socket%s open: %s", abort ? "failed" : "returned", closed,
               closed == 1 ? "" : "s", abort ? "reset them" : "flushing and closing them");
  }
  orphan_result_.store(closed, std::memory_order_relaxed);
  orphan_answered_.store(asked, std::memory_order_release);
}

// This thread's part: the rest of the ring, then its open slots.
int Proxy::Impl::close_own_orphans(Worker &w, bool abort) {
  while (drain_requests(w)) {}
  int closed = 0;
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    if (&owner(i) != &w || !slots_[i].in_use) continue;
    release_slot(w, i, abort);
    ++closed;
  }
  return closed;
}

int Proxy::Impl::kernel_exited(int grid_status) {
  if (workers_.empty() || !workers_[0]->thread.joinable()) return 0;
  std::lock_guard<std::mutex> lock(orphan_call_);
  orphan_abort_.store(grid_status < 0, std::memory_order_relaxed);
  const uint64_t ticket = orphan_asked_.fetch_add(1, std::memory_order_acq_rel) + 1;
  while (orphan_answered_.load(std::memory_order_acquire) != ticket) {
    if (stopping_.load(std::memory_order_relaxed)) return -ESHUTDOWN;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return orphan_result_.load(std::memory_order_relaxed);
}

// After the threads stopped: flushes every connection within close_flush_ms,
// as the CPU engine does at exit.
void Proxy::Impl::close_everything() {
  Worker &w = *workers_[0];
  for (auto &other : workers_)
    if (other.get() != &w)
      for (auto &c : other->closing) w.closing.push_back(std::move(c));
  const auto deadline = Clock::now() + std::chrono::milliseconds(options_.close_flush_ms);
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    Slot &s = slots_[i];
    if (s.listener) {
      for (auto &c : s.listener->accepting) retire(w, std::move(c));
      for (auto &c : s.listener->queue) retire(w, std::move(c));
      s.listener.reset();
    }
    if (s.conn) {
      s.conn->begin_close(deadline);
      w.closing.push_back(std::move(s.conn));
    }
  }
  while (!w.closing.empty()) {
    progress_closing(w);
    if (!w.closing.empty()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace gpusock
