// What gpusock reads of shm's own region files (libfabric 1.17, SMR_VERSION 4):
// the head of struct smr_region and its command queue. The watchdog needs the
// region's spinlock (shm_watchdog.h), the bells need its `signal` word and the
// page gpusock appends after the region (shm_bell.h). A region whose head does
// not check out (version, size, name) is left alone.
#pragma once

#include <pthread.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace gpusock::wire::fabric::shm {

constexpr uint8_t kShmRegionVersion = 4;

struct ShmRegionHead {
  uint8_t version;
  uint8_t resv;
  uint16_t flags;
  int pid;
  uint8_t cma_cap_peer;
  uint8_t cma_cap_self;
  uint32_t max_sar_buf_per_peer;
  void *base_addr;
  int lock;        // pthread_spinlock_t
  int32_t signal;  // set (seq_cst) by every enqueue and response to this region
  void *map;
  size_t total_size;
  size_t cmd_cnt;
  size_t sar_cnt;
  size_t cmd_queue_offset;
  size_t resp_queue_offset;
  size_t inject_pool_offset;
  size_t sar_pool_offset;
  size_t peer_data_offset;
  size_t name_offset;
  size_t sock_name_offset;
};
static_assert(offsetof(ShmRegionHead, lock) == 24, "shm 1.17 region layout");
static_assert(offsetof(ShmRegionHead, signal) == 28, "shm 1.17 region layout");
static_assert(offsetof(ShmRegionHead, cmd_queue_offset) == 64, "shm 1.17 region layout");
static_assert(sizeof(pthread_spinlock_t) == sizeof(int), "glibc spinlock");

// The head of shm's command queue (OFI_DECLARE_CIRQUE), entries after it.
struct ShmCirqueHead {
  size_t size;
  size_t size_mask;
  size_t rcnt;
  size_t wcnt;
};

// The head of region `name` open as `fd`, checked: version, a total size that
// fits the file, and the name stored inside. *file_size: the file's size
// (shm's total_size, plus gpusock's bell page once appended).
bool read_region_head(int fd, const std::string &name, ShmRegionHead *head, size_t *file_size);
// Region `name` mapped whole (its total_size) when its head checks out, else
// nullptr; *head: that head. Unmapped by the caller.
void *map_region(const std::string &name, ShmRegionHead *head);

// Gives back the pages of our own region `name` past its names. shm 1.17
// copies the region's name with strncpy bounded by the rest of the region, so
// every byte from the name to the end of the power-of-two size is written
// with zeros: ~3.7 MiB of tmpfs an endpoint that nobody reads. False when the
// head does not check out or the file system cannot punch holes (nothing
// changed then).
bool release_region_tail(const std::string &name);

// Our own mapping of a region, for its lock word (see shm_watchdog.h).
class RegionLock {
 public:
  RegionLock() = default;
  RegionLock(const RegionLock &) = delete;
  RegionLock &operator=(const RegionLock &) = delete;
  ~RegionLock();

  bool open(const std::string &name);
  bool held() const;
  // Changes whenever a command is enqueued or consumed (0 without a queue):
  // a lock that stays held while this stays put is not changing hands.
  uint64_t activity() const;
  void release();
  // With the lock held by a dead sender: forget every command not yet
  // consumed, a torn last pair among them (see "Torn enqueues").
  void drop_pending_commands();

 private:
  void *base_ = nullptr;
  size_t size_ = 0;
  int *lock_ = nullptr;
  ShmCirqueHead *queue_ = nullptr;
};

}  // namespace gpusock::wire::fabric::shm
