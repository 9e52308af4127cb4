#include "wire/fabric/shm_hints.h"

#include "wire/fabric/shm_names.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

namespace gpusock::wire::fabric::shm {
namespace {

constexpr size_t kBoardBytes = kHintSlots / 8;
constexpr size_t kPageBytes = 4096;
constexpr uint32_t kSlotsPerPage = kPageBytes * 8;

// The process's domain is not destroyed at exit: its board's file goes then.
std::mutex g_exit_mu;
std::vector<std::pair<std::string, pid_t>> *g_exit_names = nullptr;

void unlink_boards_at_exit() {
  std::lock_guard lock(g_exit_mu);
  for (const auto &[name, creator] : *g_exit_names)
    if (creator == getpid()) shm_unlink(name.c_str());
  g_exit_names->clear();
}

void unlink_at_exit(const std::string &name, bool add) {
  std::lock_guard lock(g_exit_mu);
  if (g_exit_names == nullptr) {
    g_exit_names = new std::vector<std::pair<std::string, pid_t>>();
    std::atexit(&unlink_boards_at_exit);
  }
  auto &v = *g_exit_names;
  if (add) v.emplace_back(name, getpid());
  else v.erase(std::remove_if(v.begin(), v.end(), [&](const auto &e) { return e.first == name; }), v.end());
}

}  // namespace

HintBoard::~HintBoard() {
  if (words_ == nullptr) return;
  munmap(words_, kBoardBytes);
  if (getpid() != creator_) return;
  shm_unlink(name_.c_str());
  unlink_at_exit(name_, false);
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
  words_ = static_cast<std::atomic<uint64_t> *>(map);
  name_ = std::move(name);
  creator_ = getpid();
  unlink_at_exit(name_, true);
  return true;
}

int32_t HintBoard::take_slot() {
  if (words_ == nullptr) return -1;
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
  if (words_ == nullptr || slot < 0) return;
  std::lock_guard lock(slots_mu_);
  free_slots_.emplace_back(slot, std::chrono::steady_clock::now());
}

void HintBoard::mark(int32_t slot) {
  if (words_ == nullptr || slot < 0) return;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  words_[slot / 64].fetch_or(uint64_t{1} << (slot % 64), std::memory_order_seq_cst);
}

void HintBoard::take(const uint64_t *mask, size_t words, std::vector<int32_t> *slots) {
  if (words_ == nullptr) return;
  words = std::min<size_t>(words, kHintSlots / 64);
  for (size_t w = 0; w < words; ++w) {
    if (mask[w] == 0 || (words_[w].load(std::memory_order_relaxed) & mask[w]) == 0) continue;
    uint64_t bits = words_[w].fetch_and(~mask[w], std::memory_order_seq_cst) & mask[w];
    while (bits != 0) {
      slots->push_back(static_cast<int32_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(bits))));
      bits &= bits - 1;
    }
  }
}

PeerHint &PeerHint::operator=(PeerHint &&other) noexcept {
  if (this != &other) {
    reset();
    page_ = other.page_;
    word_ = other.word_;
    bit_ = other.bit_;
    other.page_ = nullptr;
    other.word_ = nullptr;
  }
  return *this;
}

bool PeerHint::open(const char *board_name, uint32_t slot) {
  reset();
  if (slot >= kHintSlots) return false;
  const int fd = shm_open(board_name, O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return false;
  const off_t offset = static_cast<off_t>(slot / kSlotsPerPage) * kPageBytes;
  void *page = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, offset);
  close(fd);
  if (page == MAP_FAILED) return false;
  page_ = page;
  word_ = static_cast<std::atomic<uint64_t> *>(page) + (slot % kSlotsPerPage) / 64;
  bit_ = uint64_t{1} << (slot % 64);
  return true;
}

void PeerHint::reset() {
  if (page_ != nullptr) munmap(page_, kPageBytes);
  page_ = nullptr;
  word_ = nullptr;
}

}  // namespace gpusock::wire::fabric::shm
