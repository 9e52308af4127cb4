#include "wire/fabric/shm_region.h"
#include "wire/spin_lock.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

namespace gpusock::wire::fabric::shm {

bool read_region_head(int fd, const std::string &name, ShmRegionHead *head, size_t *file_size) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(ShmRegionHead))) return false;
  if (pread(fd, head, sizeof(*head), 0) != static_cast<ssize_t>(sizeof(*head))) return false;
  const size_t size = static_cast<size_t>(st.st_size);
  if (head->version != kShmRegionVersion || head->total_size < sizeof(ShmRegionHead) || head->total_size > size ||
      head->name_offset >= head->total_size || head->name_offset + name.size() + 1 > head->total_size) {
    return false;
  }
  char stored[256];
  if (name.size() + 1 > sizeof(stored)) return false;
  const ssize_t want = static_cast<ssize_t>(name.size() + 1);
  if (pread(fd, stored, name.size() + 1, static_cast<off_t>(head->name_offset)) != want) return false;
  if (std::memcmp(stored, name.c_str(), name.size() + 1) != 0) return false;
  *file_size = size;
  return true;
}

bool release_region_tail(const std::string &name) {
  constexpr size_t kSockNameMax = 108;  // shm's SMR_SOCK_NAME_MAX: sizeof(sockaddr_un::sun_path)
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return false;
  ShmRegionHead head{};
  size_t file_size = 0;
  bool released = false;
  if (read_region_head(fd, name, &head, &file_size) && head.sock_name_offset > head.name_offset) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t from = (head.sock_name_offset + kSockNameMax + page - 1) / page * page;
    released =
        from < head.total_size && fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(from),
                                            static_cast<off_t>(head.total_size - from)) == 0;
  }
  close(fd);
  return released;
}

RegionLock::~RegionLock() {
  if (base_ != nullptr) munmap(base_, size_);
}

void *map_region(const std::string &name, ShmRegionHead *head) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return nullptr;
  size_t file_size = 0;
  void *base = MAP_FAILED;
  if (read_region_head(fd, name, head, &file_size)) {
    base = mmap(nullptr, head->total_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  close(fd);
  return base == MAP_FAILED ? nullptr : base;
}

bool RegionLock::open(const std::string &name) {
  ShmRegionHead head{};
  void *base = map_region(name, &head);
  if (base == nullptr) return false;
  base_ = base;
  size_ = head.total_size;
  lock_ = &static_cast<ShmRegionHead *>(base)->lock;
  if (head.cmd_queue_offset + sizeof(ShmCirqueHead) <= size_) {
    auto *queue = reinterpret_cast<ShmCirqueHead *>(static_cast<char *>(base) + head.cmd_queue_offset);
    if (queue->size != 0 && (queue->size & (queue->size - 1)) == 0 && queue->size_mask == queue->size - 1)
      queue_ = queue;
  }
  return true;
}

bool RegionLock::held() const { return __atomic_load_n(lock_, __ATOMIC_ACQUIRE) != spin_lock_free_value(); }

uint64_t RegionLock::activity() const {
  if (queue_ == nullptr) return 0;
  return __atomic_load_n(&queue_->rcnt, __ATOMIC_RELAXED) * 0x9E3779B97F4A7C15ull +
         __atomic_load_n(&queue_->wcnt, __ATOMIC_RELAXED);
}

void RegionLock::release() { __atomic_store_n(lock_, spin_lock_free_value(), __ATOMIC_RELEASE); }

void RegionLock::drop_pending_commands() {
  if (queue_ != nullptr) {
    __atomic_store_n(&queue_->wcnt, __atomic_load_n(&queue_->rcnt, __ATOMIC_RELAXED), __ATOMIC_RELEASE);
  }
}

}  // namespace gpusock::wire::fabric::shm
