// Hears of every change to the memory behind address ranges we watch: the
// kernel reports unmap (munmap, brk, mmap MAP_FIXED, mremap shrinking), remap
// (mremap moving) and discard (madvise DONTNEED/REMOVE) through a
// userfaultfd, whoever makes the call (libc's own free() included, which no
// symbol interposition sees). The registration cache (reg_cache.h) drops what
// such an event touches before it serves the range again.
//
// Ranges are watched in write-protect mode with no page ever protected, so
// the application's memory behaves as before: no fault is ever delivered, only
// the events. A process whose kernel refuses userfaultfd has no monitor (get()
// is nullptr), and so no cache.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

namespace gpusock::socket {

struct AddressRange {
  uintptr_t start = 0;
  uintptr_t end = 0;  // exclusive
};

class UnmapMonitor {
 public:
  // The process's monitor, started on first use; nullptr when userfaultfd is
  // unavailable (kernel, seccomp) or in the child of a fork (the watches and
  // the thread stayed with the parent).
  static UnmapMonitor *get();

  // Starts watching [start, end) (page-aligned). False when the kernel will
  // not (not anonymous or shmem memory, or another userfaultfd watches it).
  bool watch(AddressRange range);
  void unwatch(AddressRange range);

  // Every range changed since *cursor, oldest first, into out[0..max);
  // returns how many, and advances *cursor past them. Returns -1 when events
  // were overwritten before this reader saw them: drop everything. An event
  // whose munmap (or mremap, madvise) has returned is always seen here.
  int changes_since(uint64_t *cursor, AddressRange *out, int max);
  uint64_t sequence();

 private:
  explicit UnmapMonitor(int fd) : fd_(fd) {}
  static UnmapMonitor *create();
  void run();
  void record(AddressRange range);

  static constexpr uint64_t kLogSize = 4096;
  int fd_;
  int owner_pid_ = 0;
  // True while the thread reads events it has not logged yet: a reader waits
  // for it, so an event that let its munmap return is logged before anyone
  // looks (userfaultfd releases the caller as soon as the event is read).
  std::atomic<bool> reading_{false};
  std::mutex log_mu_;  // held only to copy entries: no allocation, no unmapping
  uint64_t seq_ = 0;
  AddressRange log_[kLogSize];
};

}  // namespace gpusock::socket
