// Hints: which of a process's fabric:shm endpoints may have news, in one
// place, so that a thread watching hundreds of connections looks at those
// with news instead of at every endpoint's region (an event loop's wait then
// costs O(news), as the kernel's epoll does), and sleeps on one word.
//
// A process's board is a file of its own in /dev/shm, <endpoint name>.hints
// (a name drawn like an endpoint's, so the sweep of dead owners' files
// removes it), laid out as BoardLayout: one bit per endpoint slot, the
// sleep group watching each slot, and the groups. Each endpoint takes a slot
// and names the board and the slot in its bell page (shm_bell.h); a peer
// maps the board once per process (MappedBoard). Wherever a peer may have
// stored our region's `signal` (after a post, after a progress pass: the
// points where it would wake us if we slept) and whenever it rings us or asks
// for a ring-back, it sets our bit (a load first: no locked instruction while
// the bit is set), and then wakes the slot's sleep group if it is armed.
//
// The owner's event loops each take the bits of their own endpoints (a
// fetch-and of the word with their mask), so that one loop never takes
// another's news. Order: the peer stores, fences, then sets the bit; the
// taker clears the bit, fences, then polls the endpoint, so a poll after a
// take sees every store whose bit the take consumed. A bit set after the take
// is found by the next. A slot given back is reused only after
// kSlotQuarantineMs, by when every loop has looked at its members again and
// dropped it.
//
// Sleeping (shm_sleep_group.h): a loop arms its group's word, fences, and
// takes its bits; a peer sets a bit, fences, and reads the slot's group and
// that group's word. In the total order of the two fences one side sees the
// other: the loop finds the bit and does not sleep, or the peer finds the
// group armed, takes the word and rings the group's bell.
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

constexpr uint32_t kHintSlots = 65536;
constexpr uint32_t kBoardGroups = 1024;   // group 0 is none
constexpr uint16_t kSharedSlot = 0xffff;  // watched by two groups: wakes neither
constexpr int kSlotQuarantineMs = 1000;
constexpr char kHintsSuffix[] = ".hints";

struct BoardGroup {
  std::atomic<uint32_t> armed;
  std::atomic<uint32_t> generation;  // moves when the entry goes to another group
  char bell[56];                     // the endpoint name its bell is named after
};
static_assert(sizeof(BoardGroup) == 64, "a cache line");

struct BoardLayout {
  std::atomic<uint64_t> bits[kHintSlots / 64];
  std::atomic<uint16_t> watcher[kHintSlots];  // group index, 0 or kSharedSlot
  BoardGroup groups[kBoardGroups];
};

// Connected sockets to a board's group bells, made at the first ring of
// each; a ring takes no lock (a server's threads ring the same client's
// groups all the time).
class GroupRingers {
 public:
  GroupRingers() = default;
  GroupRingers(const GroupRingers &) = delete;
  GroupRingers &operator=(const GroupRingers &) = delete;
  ~GroupRingers();
  void ring(const BoardLayout &board, uint32_t group);

 private:
  // (generation << 32) | fd, or 0: none yet.
  static uint64_t pack(uint32_t generation, int fd) { return uint64_t{generation} << 32 | static_cast<uint32_t>(fd); }
  int connect_locked(const BoardLayout &board, uint32_t group, uint32_t generation);

  std::atomic<uint64_t> ringers_[kBoardGroups] = {};
  std::mutex mu_;
  std::vector<int> retired_;  // replaced sockets, closed with us: a ring may still be using one
};

// A board mapped whole: a peer's, shared by every connection to its process,
// or our own.
class MappedBoard {
 public:
  // Board `name`, mapped once per process while anyone holds it; nullptr when
  // it cannot be (gone, or an older layout).
  static std::shared_ptr<MappedBoard> open(const std::string &name);
  MappedBoard(BoardLayout *layout, bool unmap) : layout_(layout), unmap_(unmap) {}
  MappedBoard(const MappedBoard &) = delete;
  MappedBoard &operator=(const MappedBoard &) = delete;
  ~MappedBoard();

  // Sets `slot`'s bit (call after a seq_cst fence that follows the stores it
  // announces), then wakes the group that watches it if that group sleeps.
  void mark(uint32_t slot) {
    const uint16_t group = set_bit(slot);
    if (group != 0 && group < kBoardGroups) wake(group);
  }
  // Rings `group`'s bell if it is armed (one ring per arming).
  void wake(uint32_t group) {
    std::atomic<uint32_t> &armed = layout_->groups[group].armed;
    if (armed.load(std::memory_order_relaxed) != 0 && armed.exchange(0) != 0) ringers_.ring(*layout_, group);
  }
  // As mark(), but rings the slot's group whether or not it is armed: for a
  // peer process that died, which may have taken the armed word and died
  // before it rang. A ring with nobody asleep ends the next sleep early, once.
  void mark_and_ring(uint32_t slot) {
    const uint16_t group = set_bit(slot);
    if (group != 0 && group < kBoardGroups) {
      layout_->groups[group].armed.store(0, std::memory_order_relaxed);
      ringers_.ring(*layout_, group);
    }
  }
  BoardLayout &layout() { return *layout_; }

 private:
  // Sets `slot`'s bit, then fences; the group that watches the slot.
  uint16_t set_bit(uint32_t slot) {
    std::atomic<uint64_t> &word = layout_->bits[slot / 64];
    const uint64_t bit = uint64_t{1} << (slot % 64);
    if ((word.load(std::memory_order_relaxed) & bit) == 0) word.fetch_or(bit, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return layout_->watcher[slot].load(std::memory_order_relaxed);
  }

  BoardLayout *layout_;
  bool unmap_;
  GroupRingers ringers_;
};

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
  bool valid() const { return view_ != nullptr; }
  // The board's shm name, for peers (fits kNameMax).
  const std::string &name() const { return name_; }

  // A free slot, or -1 (no board, or all taken).
  int32_t take_slot();
  void give_slot(int32_t slot);
  // Sets our own endpoint's bit (a change made here that no peer announces).
  void mark(int32_t slot) {
    if (view_ == nullptr || slot < 0) return;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    view_->mark(static_cast<uint32_t>(slot));
  }
  // The same for an endpoint whose peer process died (MappedBoard::mark_and_ring).
  void mark_and_ring(int32_t slot) {
    if (view_ == nullptr || slot < 0) return;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    view_->mark_and_ring(static_cast<uint32_t>(slot));
  }
  // Of the slots in mask[0..words), appends those marked since their last
  // take, and clears them.
  void take(const uint64_t *mask, size_t words, std::vector<int32_t> *slots);

  // Sleep groups: an entry for a group whose bell is `bell` (an endpoint
  // name), or 0 when all are taken.
  uint32_t take_group(const std::string &bell);
  void give_group(uint32_t group);
  // Group `group` starts or stops watching `slot`.
  void watch(uint32_t group, int32_t slot, bool on);
  bool wakes(uint32_t group, int32_t slot) const {
    return slot >= 0 && view_->layout().watcher[slot].load(std::memory_order_relaxed) == group;
  }
  uint64_t sharing_epoch() const { return sharing_epoch_.load(std::memory_order_seq_cst); }
  MappedBoard &view() { return *view_; }

 private:
  std::unique_ptr<MappedBoard> view_;
  std::string name_;
  std::mutex slots_mu_;
  std::deque<std::pair<int32_t, std::chrono::steady_clock::time_point>> free_slots_;  // oldest first
  int32_t next_slot_ = 0;
  std::mutex groups_mu_;
  std::vector<uint32_t> free_groups_;
  uint32_t next_group_ = 1;
  std::vector<uint8_t> watchers_;  // how many groups watch each slot
  std::atomic<uint64_t> sharing_epoch_{0};
  pid_t creator_ = 0;  // a forked child's copy removes nothing of its parent's
};

// A file of ours in /dev/shm (its shm name) to remove at exit, or no longer.
void remove_at_exit(const std::string &shm_name, bool add);

// A peer endpoint's bit on its owner's board. Move-only.
class PeerHint {
 public:
  PeerHint() = default;
  PeerHint(const PeerHint &) = delete;
  PeerHint &operator=(const PeerHint &) = delete;
  PeerHint(PeerHint &&other) noexcept = default;
  PeerHint &operator=(PeerHint &&other) noexcept = default;

  // Board `board_name`'s `slot`. False: none.
  bool open(const char *board_name, uint32_t slot);
  void reset() { board_.reset(); }

  // Sets the bit and wakes its group. Call after a seq_cst fence that follows
  // the stores it announces (PeerBell::wake_if_armed has one).
  void mark() const {
    if (board_) board_->mark(slot_);
  }

 private:
  std::shared_ptr<MappedBoard> board_;
  uint32_t slot_ = 0;
};

}  // namespace gpusock::wire::fabric::shm
