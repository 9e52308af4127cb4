// fabric:shm's sleep groups (wire::SleepGroup): an entry of the process's
// hint board (shm_hints.h) with an `armed` word, and a bell socket of its own
// at /dev/shm/<endpoint name>.bell (a fresh endpoint name, so the sweep of
// dead owners' files removes it). A peer that sets the bit of a slot the
// group watches takes the armed word and rings that bell: one sleeping thread
// is woken for any of its thousands of endpoints, and the others sleep on.
#pragma once

#include "wire/fabric/creator.h"
#include "wire/fabric/shm_hints.h"
#include "wire/transport.h"

#include <memory>
#include <string>

namespace gpusock::wire::fabric::shm {

class ShmSleepGroup final : public wire::SleepGroup {
 public:
  // A group on `board`, or nullptr (no board, no entry left, no socket).
  static std::unique_ptr<ShmSleepGroup> open(std::shared_ptr<HintBoard> board);
  ~ShmSleepGroup() override;

  int fd() const override { return sock_; }
  void watch(int32_t slot, bool on) override { board_->watch(group_, slot, on); }
  bool wakes_for(int32_t slot) const override { return board_->wakes(group_, slot); }
  uint64_t sharing_epoch() const override { return board_->sharing_epoch(); }
  void arm() override {
    armed().store(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  void disarm(bool rung) override;

 private:
  ShmSleepGroup(std::shared_ptr<HintBoard> board, uint32_t group, int sock, std::string bell)
      : board_(std::move(board)), group_(group), sock_(sock), bell_(std::move(bell)) {}
  std::atomic<uint32_t> &armed() { return board_->view().layout().groups[group_].armed; }

  std::shared_ptr<HintBoard> board_;
  uint32_t group_;
  int sock_;
  std::string bell_;  // the endpoint name the bell's file is named after
  Creator creator_;
};

}  // namespace gpusock::wire::fabric::shm
