#include "wire/fabric/shm_sleep_group.h"

#include "wire/fabric/shm_bell.h"
#include "wire/fabric/shm_names.h"

#include <unistd.h>

namespace gpusock::wire::fabric::shm {

std::unique_ptr<ShmSleepGroup> ShmSleepGroup::open(std::shared_ptr<HintBoard> board) {
  if (!board || !board->valid()) return nullptr;
  std::string bell = new_endpoint_name(nullptr);
  const int sock = bind_bell(bell_path(bell));
  if (sock < 0) return nullptr;
  const uint32_t group = board->take_group(bell);
  if (group == 0) {
    close(sock);
    unlink(bell_path(bell).c_str());
    return nullptr;
  }
  remove_at_exit(bell + kBellSuffix, true);
  return std::unique_ptr<ShmSleepGroup>(new ShmSleepGroup(std::move(board), group, sock, std::move(bell)));
}

ShmSleepGroup::~ShmSleepGroup() {
  close(sock_);
  if (!creator_.here()) return;  // a clone's copy: the entry and the file are its parent's
  board_->give_group(group_);
  unlink(bell_path(bell_).c_str());
  remove_at_exit(bell_ + kBellSuffix, false);
}

void ShmSleepGroup::disarm(bool rung) {
  // A peer rings only after taking the word (exchanging it to 0): still 1,
  // nobody rang since the last arm(). A ring for an earlier arming that is
  // still unread (another sleeper re-armed meanwhile) ends the next sleep
  // early, once, and is read then.
  const bool taken = armed().exchange(0, std::memory_order_relaxed) == 0;
  if (rung || taken) drain_bell_socket(sock_);
}

}  // namespace gpusock::wire::fabric::shm
