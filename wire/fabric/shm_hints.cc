#include "wire/fabric/shm_hints.h"

#include "wire/fabric/shm_bell.h"
#include "wire/fabric/shm_names.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

namespace gpusock::wire::fabric::shm {
namespace {

constexpr size_t kBoardBytes = sizeof(BoardLayout);

// The process's domain is not destroyed at exit: its files go then.
std::mutex g_exit_mu;
std::vector<std::pair<std::string, pid_t>> *g_exit_names = nullptr;

void remove_files_at_exit() {
  std::lock_guard lock(g_exit_mu);
  for (const auto &[name, creator] : *g_exit_names)
    if (creator == getpid()) shm_unlink(name.c_str());
  g_exit_names->clear();
}

}  // namespace

void remove_at_exit(const std::string &name, bool add) {
  std::lock_guard lock(g_exit_mu);
  if (g_exit_names == nullptr) {
    g_exit_names = new std::vector<std::pair<std::string, pid_t>>();
    std::atexit(&remove_files_at_exit);
  }
  auto &v = *g_exit_names;
  if (add) v.emplace_back(name, getpid());
  else v.erase(std::remove_if(v.begin(), v.end(), [&](const auto &e) { return e.first == name; }), v.end());
}

GroupRingers::~GroupRingers() {
  for (const std::atomic<uint64_t> &r : ringers_)
    if (const uint64_t v = r.load(std::memory_order_relaxed); v != 0) close(static_cast<int>(v & 0xffffffffu));
  for (int fd : retired_) close(fd);
}

int GroupRingers::connect_locked(const BoardLayout &board, uint32_t group, uint32_t generation) {
  const uint64_t now = ringers_[group].load(std::memory_order_acquire);
  if (now != 0 && now >> 32 == generation) return static_cast<int>(now & 0xffffffffu);  // another thread made it
  char name[sizeof(BoardGroup::bell)];
  std::memcpy(name, board.groups[group].bell, sizeof(name));
  name[sizeof(name) - 1] = '\0';
  const int fd = connect_to_bell(bell_path(name));
  if (fd < 0) return -1;
  if (now != 0) retired_.push_back(static_cast<int>(now & 0xffffffffu));  // the entry went to another group
  ringers_[group].store(pack(generation, fd), std::memory_order_release);
  return fd;
}

void GroupRingers::ring(const BoardLayout &board, uint32_t group) {
  const uint32_t generation = board.groups[group].generation.load(std::memory_order_acquire);
  const uint64_t v = ringers_[group].load(std::memory_order_acquire);
  int fd = v != 0 && v >> 32 == generation ? static_cast<int>(v & 0xffffffffu) : -1;
  if (fd < 0) {
    std::lock_guard lock(mu_);
    fd = connect_locked(board, group, generation);
  }
  // -ECONNREFUSED: a group gone, nobody sleeps there; the next owner of the
  // entry moves its generation.
  if (fd >= 0) (void)ring_connected(fd);
}

namespace {

std::mutex g_mapped_mu;
std::unordered_map<std::string, std::weak_ptr<MappedBoard>> *g_mapped = nullptr;

}  // namespace

std::shared_ptr<MappedBoard> MappedBoard::open(const std::string &name) {
  std::lock_guard lock(g_mapped_mu);
  if (g_mapped == nullptr) g_mapped = new std::unordered_map<std::string, std::weak_ptr<MappedBoard>>();
  if (auto it = g_mapped->find(name); it != g_mapped->end())
    if (auto board = it->second.lock()) return board;
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return nullptr;
  struct stat st {};
  void *map = MAP_FAILED;
  if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= kBoardBytes)
    map = mmap(nullptr, kBoardBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return nullptr;
  auto board = std::make_shared<MappedBoard>(static_cast<BoardLayout *>(map), true);
  for (auto it = g_mapped->begin(); it != g_mapped->end();)  // boards of processes no longer peers
    it = it->second.expired() ? g_mapped->erase(it) : std::next(it);
  (*g_mapped)[name] = board;
  return board;
}

MappedBoard::~MappedBoard() {
  if (unmap_) munmap(layout_, kBoardBytes);
}

HintBoard::~HintBoard() {
  if (view_ == nullptr) return;
  view_.reset();
  if (getpid() != creator_) return;
  shm_unlink(name_.c_str());
  remove_at_exit(name_, false);
}

bool HintBoard::open() {
  std::string name = new_endpoint_name(nullptr) + kHintsSuffix;
  if (name.size() + 1 > kNameMax) return false;
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, S_IRUSR | S_IWUSR);
  if (fd < 0) return false;
  void *map = MAP_FAILED;
  if (ftruncate(fd, kBoardBytes) == 0) map = mmap(nullptr, kBoardBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) {
    shm_unlink(name.c_str());
    return false;
  }
  view_ = std::make_unique<MappedBoard>(static_cast<BoardLayout *>(map), true);
  name_ = std::move(name);
  creator_ = getpid();
  watchers_.assign(kHintSlots, 0);
  remove_at_exit(name_, true);
  return true;
}

int32_t HintBoard::take_slot() {
  if (view_ == nullptr) return -1;
  std::lock_guard lock(slots_mu_);
  if (!free_slots_.empty() &&
      std::chrono::steady_clock::now() - free_slots_.front().second >= std::chrono::milliseconds(kSlotQuarantineMs)) {
    const int32_t slot = free_slots_.front().first;
    free_slots_.pop_front();
    return slot;
  }
  if (next_slot_ < static_cast<int32_t>(kHintSlots)) return next_slot_++;
  if (free_slots_.empty()) return -1;
  const int32_t slot = free_slots_.front().first;  // all taken: the oldest free one, in quarantine or not
  free_slots_.pop_front();
  return slot;
}

void HintBoard::give_slot(int32_t slot) {
  if (view_ == nullptr || slot < 0) return;
  std::lock_guard lock(slots_mu_);
  free_slots_.emplace_back(slot, std::chrono::steady_clock::now());
}

void HintBoard::take(const uint64_t *mask, size_t words, std::vector<int32_t> *slots) {
  if (view_ == nullptr) return;
  std::atomic<uint64_t> *bits = view_->layout().bits;
  words = std::min<size_t>(words, kHintSlots / 64);
  for (size_t w = 0; w < words; ++w) {
    if (mask[w] == 0 || (bits[w].load(std::memory_order_relaxed) & mask[w]) == 0) continue;
    uint64_t taken = bits[w].fetch_and(~mask[w], std::memory_order_seq_cst) & mask[w];
    while (taken != 0) {
      slots->push_back(static_cast<int32_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(taken))));
      taken &= taken - 1;
    }
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);  // the takes before the looks that follow
}

uint32_t HintBoard::take_group(const std::string &bell) {
  if (view_ == nullptr || bell.size() + 1 > sizeof(BoardGroup::bell)) return 0;
  std::lock_guard lock(groups_mu_);
  uint32_t group = 0;
  if (!free_groups_.empty()) {
    group = free_groups_.back();
    free_groups_.pop_back();
  } else if (next_group_ < kBoardGroups) {
    group = next_group_++;
  } else {
    return 0;
  }
  BoardGroup &entry = view_->layout().groups[group];
  entry.armed.store(0, std::memory_order_relaxed);
  std::memcpy(entry.bell, bell.c_str(), bell.size() + 1);
  entry.generation.fetch_add(1, std::memory_order_release);
  return group;
}

void HintBoard::give_group(uint32_t group) {
  if (view_ == nullptr || group == 0 || group >= kBoardGroups) return;
  std::lock_guard lock(groups_mu_);
  view_->layout().groups[group].armed.store(0, std::memory_order_relaxed);
  free_groups_.push_back(group);
}

void HintBoard::watch(uint32_t group, int32_t slot, bool on) {
  if (view_ == nullptr || slot < 0 || static_cast<uint32_t>(slot) >= kHintSlots) return;
  std::lock_guard lock(groups_mu_);
  std::atomic<uint16_t> &watcher = view_->layout().watcher[slot];
  uint8_t &count = watchers_[static_cast<size_t>(slot)];
  if (on) {
    if (count < UINT8_MAX) ++count;
    if (count == 1) {
      watcher.store(static_cast<uint16_t>(group), std::memory_order_seq_cst);
    } else if (const uint16_t alone = watcher.load(std::memory_order_relaxed); alone != kSharedSlot) {
      // The group that watched it alone may sleep counting on it: the epoch
      // first, then wake it; it arms, then reads the epoch.
      watcher.store(kSharedSlot, std::memory_order_seq_cst);
      sharing_epoch_.fetch_add(1, std::memory_order_seq_cst);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (alone != 0) view_->wake(alone);
    }
    return;
  }
  if (count > 0) --count;
  // A slot once shared stays so while watched: the group left on it goes on
  // arming that member itself.
  if (count == 0 || watcher.load(std::memory_order_relaxed) == group) watcher.store(0, std::memory_order_seq_cst);
}

bool PeerHint::open(const char *board_name, uint32_t slot) {
  reset();
  if (slot >= kHintSlots) return false;
  board_ = MappedBoard::open(board_name);
  slot_ = slot;
  return board_ != nullptr;
}

}  // namespace gpusock::wire::fabric::shm
