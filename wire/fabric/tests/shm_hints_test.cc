// Hint boards and sleep groups (wire/fabric/shm_hints.h, shm_sleep_group.h):
// a mark wakes the group that watches the slot once per arming, and the
// watchdog's mark for a dead peer process wakes it even when that process
// took the armed word and died before its ring.
#include "wire/fabric/shm_hints.h"
#include "wire/fabric/shm_sleep_group.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <memory>

namespace {

using gpusock::wire::fabric::shm::HintBoard;
using gpusock::wire::fabric::shm::kBoardGroups;
using gpusock::wire::fabric::shm::ShmSleepGroup;

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

// A board, one slot on it and a sleep group that watches the slot.
struct Watched {
  std::shared_ptr<HintBoard> board = std::make_shared<HintBoard>();
  std::unique_ptr<ShmSleepGroup> group;
  int32_t slot = -1;

  bool open() {
    if (!board->open()) return false;
    slot = board->take_slot();
    group = ShmSleepGroup::open(board);
    if (slot < 0 || !group) return false;
    group->watch(slot, true);
    return true;
  }
  std::atomic<uint32_t> &armed() {
    const uint16_t g = board->view().layout().watcher[slot].load();
    return board->view().layout().groups[g < kBoardGroups ? g : 0].armed;
  }
  ~Watched() {
    if (group) group->watch(slot, false);
    group.reset();
    board->give_slot(slot);
  }
};

TEST(ShmHints, AMarkRingsAnArmedGroupOnce) {
  Watched w;
  ASSERT_TRUE(w.open());
  w.board->mark(w.slot);
  EXPECT_FALSE(readable(w.group->fd())) << "rang a group that was not armed";
  w.group->arm();
  w.board->mark(w.slot);
  EXPECT_TRUE(readable(w.group->fd()));
  EXPECT_EQ(w.armed().load(), 0u) << "the ring did not take the armed word";
  w.group->disarm(true);
  EXPECT_FALSE(readable(w.group->fd())) << "disarm left the ring unread";
}

// A peer process killed between taking the armed word and ringing: its mark
// rings nobody, and the one that follows (a live peer's) finds the word taken
// too. The watchdog's mark for the dead process rings all the same.
TEST(ShmHints, MarkForADeadPeerRingsAGroupWhoseWordItTook) {
  Watched w;
  ASSERT_TRUE(w.open());
  w.group->arm();
  ASSERT_EQ(w.armed().exchange(0), 1u);  // as the killed peer did
  w.board->mark(w.slot);
  EXPECT_FALSE(readable(w.group->fd()));
  w.board->mark_and_ring(w.slot);
  EXPECT_TRUE(readable(w.group->fd())) << "the sleeper would sleep through the peer's death";
  w.group->disarm(true);
  EXPECT_FALSE(readable(w.group->fd()));
}

// Rung with nobody asleep: the next sleep ends at once, and reads it.
TEST(ShmHints, MarkForADeadPeerWithNobodyAsleepEndsTheNextSleepOnce) {
  Watched w;
  ASSERT_TRUE(w.open());
  w.board->mark_and_ring(w.slot);
  w.group->arm();
  EXPECT_TRUE(readable(w.group->fd()));
  w.group->disarm(true);
  EXPECT_FALSE(readable(w.group->fd()));
}

}  // namespace
