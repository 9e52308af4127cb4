// Adaptive ring sizes: how large a connection's rings are when nobody chose.
//
// A connection's receive ring is fixed when it connects (the peer learns its
// address and size in the connection record, and gpusock's own senders keep
// every advert inside it), so rings cannot grow under a live connection the
// way kernel TCP's buffers autotune. What can adapt is the size a new
// connection gets: large rings stream faster than rsocket's 128 KiB
// (docs/performance.md), but a server with a thousand connections cannot give
// each of them megabytes. So a process holds a budget of "grown" ring bytes:
// a connection whose sizes nobody set (no SO_RCVBUF/SO_SNDBUF, no
// GPUSOCK_MEM_DEFAULT/GPUSOCK_WMEM_DEFAULT, no rsocket mem_default/
// wmem_default file) takes large rings while the budget holds both, and the
// defaults once it is spent. Closing a connection returns its share.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace gpusock::socket {

class RingBudget {
 public:
  // large: the size of a grown ring (0: never grow); budget: the bytes of
  // grown rings the process may hold at once.
  void configure(uint32_t large, size_t budget) {
    large_ = large;
    budget_ = budget;
  }
  uint32_t large() const { return large_; }
  size_t budget() const { return budget_; }
  size_t held() const { return held_.load(std::memory_order_relaxed); }

  // For a connection about to allocate its rings: if its receive and/or send
  // ring is unchosen (`*_auto`) and smaller than the large size, grow those
  // to it when the budget allows them all, and return the bytes taken (hand
  // them to release() when the rings are freed); else change nothing, 0.
  size_t reserve(bool rbuf_auto, uint32_t *rbuf_size, bool sbuf_auto, uint32_t *sbuf_size) {
    const bool grow_r = rbuf_auto && *rbuf_size < large_;
    const bool grow_s = sbuf_auto && *sbuf_size < large_;
    const size_t want = (grow_r ? large_ : 0) + (grow_s ? large_ : 0);
    if (want == 0) return 0;
    size_t held = held_.load(std::memory_order_relaxed);
    do {
      if (held + want > budget_) {
        refused_.store(true, std::memory_order_relaxed);
        return 0;
      }
    } while (!held_.compare_exchange_weak(held, held + want, std::memory_order_relaxed));
    if (grow_r) *rbuf_size = large_;
    if (grow_s) *sbuf_size = large_;
    return want;
  }
  // True once, after the first reservation the budget refused: worth one
  // line in the log (memory users may wonder about, or rings they expected).
  bool first_refusal() {
    return refused_.load(std::memory_order_relaxed) && !refusal_told_.exchange(true, std::memory_order_relaxed);
  }
  void release(size_t bytes) {
    if (bytes != 0) held_.fetch_sub(bytes, std::memory_order_relaxed);
  }
  // A forked child: its parent's connections are not its own.
  void forget_all() { held_.store(0, std::memory_order_relaxed); }

 private:
  uint32_t large_ = 0;
  size_t budget_ = 0;
  std::atomic<size_t> held_{0};
  std::atomic<bool> refused_{false}, refusal_told_{false};
};

}  // namespace gpusock::socket
