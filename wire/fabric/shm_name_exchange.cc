#include "wire/fabric/shm_name_exchange.h"
#include "wire/status_kinds.h"

#include "wire/fabric/shm_region.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace gpusock::wire::fabric::shm {
namespace {

// shm 1.17 (region version 4): a command (struct smr_cmd) is 256 bytes and
// starts with its message header (struct smr_msg_hdr).
constexpr size_t kCmdSize = 256;
constexpr uint32_t kOpNameExchange = 256;  // SMR_OP_MAX + ofi_ctrl_connreq
// ofi_op_write_async: shm bumps a counter we never bind and discards it.
constexpr uint32_t kOpDiscarded = 5;
constexpr uint64_t kNameMax = 256;  // SMR_NAME_MAX

struct CmdHeader {
  uint64_t msg_id;
  int64_t id;
  uint32_t op;
  uint16_t op_src;
  uint16_t op_flags;
  uint64_t size;      // the name's length with its NUL
  uint64_t src_data;  // its inject buffer, as an offset in our region
  uint64_t data;
  uint64_t tag;
};
static_assert(offsetof(CmdHeader, op) == 16 && offsetof(CmdHeader, src_data) == 32, "shm 1.17 command header");

// struct smr_freestack: the inject buffers' pool; entry_next[] follows `top`.
struct Freestack {
  uint64_t entry_base_offset;
  uint64_t object_size;
  uint64_t size;
  int16_t free;
  int16_t top;
};
constexpr size_t kFreestackNextOffset = 28;
static_assert(offsetof(Freestack, top) == 26, "shm 1.17 freestack");

enum class Openable { kYes, kNever, kNotNow };

// kNotNow sets *why to -EMFILE or -ENFILE.
Openable try_open(const char *name, int *why) {
  const int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
  if (fd >= 0) {
    close(fd);
    return Openable::kYes;
  }
  if (!out_of_descriptors(-errno)) return Openable::kNever;  // gone or another user's
  *why = -errno;
  return Openable::kNotNow;
}

}  // namespace

NameExchangeGuard::~NameExchangeGuard() { close(); }

void NameExchangeGuard::close() {
  if (base_ != nullptr) munmap(base_, size_);
  base_ = nullptr;
}

bool NameExchangeGuard::open(const std::string &name) {
  close();
  ShmRegionHead head{};
  errno = 0;
  void *base = map_region(name, &head);
  if (base == nullptr) return false;
  if (head.cmd_queue_offset + sizeof(ShmCirqueHead) > head.total_size ||
      head.inject_pool_offset + sizeof(Freestack) > head.total_size) {
    munmap(base, head.total_size);
    errno = 0;
    return false;
  }
  base_ = base;
  size_ = head.total_size;
  lock_ = &static_cast<ShmRegionHead *>(base)->lock;
  cmd_queue_offset_ = head.cmd_queue_offset;
  inject_pool_offset_ = head.inject_pool_offset;
  return true;
}

NameExchangeGuard::Screened NameExchangeGuard::screen(Short when_short) {
  Screened out;
  if (base_ == nullptr) return out;
  char *base = static_cast<char *>(base_);
  auto *queue = reinterpret_cast<ShmCirqueHead *>(base + cmd_queue_offset_);
  if (__atomic_load_n(&queue->wcnt, __ATOMIC_ACQUIRE) == __atomic_load_n(&queue->rcnt, __ATOMIC_RELAXED)) return out;
  auto *pool = reinterpret_cast<Freestack *>(base + inject_pool_offset_);
  if (cmd_queue_offset_ + sizeof(ShmCirqueHead) + queue->size * kCmdSize > size_ || pool->object_size == 0 ||
      inject_pool_offset_ + pool->entry_base_offset + pool->size * pool->object_size > size_) {
    return out;
  }
  const uint64_t buffers = inject_pool_offset_ + pool->entry_base_offset;
  auto *next = reinterpret_cast<int16_t *>(base + inject_pool_offset_ + kFreestackNextOffset);
  pthread_spin_lock(reinterpret_cast<pthread_spinlock_t *>(lock_));  // as shm's progress and its senders
  for (size_t i = queue->rcnt; i != queue->wcnt; ++i) {
    auto *cmd = reinterpret_cast<CmdHeader *>(base + cmd_queue_offset_ + sizeof(ShmCirqueHead) +
                                              (i & queue->size_mask) * kCmdSize);
    if (cmd->op != kOpNameExchange || cmd->src_data < buffers) continue;
    const uint64_t at = cmd->src_data - buffers;
    if (at % pool->object_size != 0 || at / pool->object_size >= pool->size) continue;
    const char *name = base + cmd->src_data;
    if (cmd->size == 0 || cmd->size > kNameMax || name[cmd->size - 1] != '\0') continue;
    const Openable open = try_open(name, &out.why);
    if (open == Openable::kNotNow) out.out_of_descriptors = true;
    if (open == Openable::kYes || (open == Openable::kNotNow && when_short == Short::kHold)) continue;
    cmd->op = kOpDiscarded;
    const auto index = static_cast<int16_t>(at / pool->object_size);  // smr_freestack_push
    next[index] = pool->top;
    pool->top = index;
    ++pool->free;
    ++out.dropped;
  }
  pthread_spin_unlock(reinterpret_cast<pthread_spinlock_t *>(lock_));
  return out;
}

}  // namespace gpusock::wire::fabric::shm
