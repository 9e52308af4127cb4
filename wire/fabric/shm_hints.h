// Hints: which of a process's fabric:shm endpoints may have news, in one
// place, so that a thread watching hundreds of connections looks at those
// with news instead of at every endpoint's region (an event loop's wait then
// costs O(news), as the kernel's epoll does).
//
// A process's board is a file of its own in /dev/shm, <endpoint name>.hints
// (a name drawn like an endpoint's, so the sweep of dead owners' files
// removes it), one bit per endpoint slot. Each endpoint takes a slot and
// names the board and the slot in its bell page (shm_bell.h); a peer maps the
// page of the board that holds that bit. Wherever a peer may have stored our
// region's `signal` (after a post, after a progress pass: the points where it
// would wake us if we slept) and whenever it rings us or asks for a ring-back,
// it sets our bit (a load first: no locked instruction while the bit is set).
//
// The owner's event loops each take the bits of their own endpoints (a
// fetch-and of the word with their mask), so that one loop never takes
// another's news. Order: the peer stores, fences, then sets the bit; the
// taker clears the bit, then polls the endpoint, so a poll after a take sees
// every store whose bit the take consumed. A bit set after the take is found
// by the next. A slot given back is reused only after kSlotQuarantineMs, by
// when every loop has looked at its members again and dropped it.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace gpusock::wire::fabric::shm {

constexpr uint32_t kHintSlots = 65536;  // bits: 8 KiB of board
constexpr int kSlotQuarantineMs = 1000;
constexpr char kHintsSuffix[] = ".hints";

// Our board.
class HintBoard {
 public:
  HintBoard() = default;
  HintBoard(const HintBoard &) = delete;
  HintBoard &operator=(const HintBoard &) = delete;
  ~HintBoard();

  // Creates the board's file (named from a fresh endpoint name). False: no
  // board (endpoints then get no slot and are looked at every time).
  bool open();
  bool valid() const { return words_ != nullptr; }
  // The board's shm name, for peers (fits kNameMax).
  const std::string &name() const { return name_; }

  // A free slot, or -1 (no board, or all taken).
  int32_t take_slot();
  void give_slot(int32_t slot);
  // Sets our own endpoint's bit (a change made here that no peer announces).
  void mark(int32_t slot);
  // Of the slots in mask[0..words), appends those marked since their last
  // take, and clears them.
  void take(const uint64_t *mask, size_t words, std::vector<int32_t> *slots);

 private:
  std::atomic<uint64_t> *words_ = nullptr;
  std::string name_;
  std::mutex slots_mu_;
  std::deque<std::pair<int32_t, std::chrono::steady_clock::time_point>> free_slots_;  // oldest first
  int32_t next_slot_ = 0;
  pid_t creator_ = 0;  // a forked child's copy removes nothing of its parent's
};

// A peer endpoint's bit on its owner's board. Move-only.
class PeerHint {
 public:
  PeerHint() = default;
  PeerHint(const PeerHint &) = delete;
  PeerHint &operator=(const PeerHint &) = delete;
  PeerHint(PeerHint &&other) noexcept { *this = std::move(other); }
  PeerHint &operator=(PeerHint &&other) noexcept;
  ~PeerHint() { reset(); }

  // Maps the page of board `board_name` that holds `slot`'s bit. False: none.
  bool open(const char *board_name, uint32_t slot);
  void reset();

  // Sets the bit. Call after a seq_cst fence that follows the stores it
  // announces (PeerBell::wake_if_armed has one).
  void mark() const {
    if (word_ == nullptr) return;
    if ((word_->load(std::memory_order_relaxed) & bit_) == 0) word_->fetch_or(bit_, std::memory_order_seq_cst);
  }

 private:
  void *page_ = nullptr;
  std::atomic<uint64_t> *word_ = nullptr;
  uint64_t bit_ = 0;
};

}  // namespace gpusock::wire::fabric::shm
