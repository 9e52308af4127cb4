// The per-fd table: a lock-free array of slots (kind and counters, read on
// every intercepted call) and, under one mutex, the gpusock sockets' shared
// state and the pending sockets' records (fd_table.h).
#include "preload/fd_table.h"

#include <fcntl.h>

#include <algorithm>
#include <unordered_map>

namespace gpusock::preload {

namespace {

constexpr int kChunkBits = 12;
constexpr int kChunk = 1 << kChunkBits;
constexpr int kMaxChunks = 256;  // fds below 1M
std::atomic<FdSlot *> g_chunks[kMaxChunks];

struct Tables {
  std::mutex mu;
  std::unordered_map<int, std::shared_ptr<SockInfo>> infos;
  std::unordered_map<int, Pending> pendings;
  std::unordered_map<int, std::shared_ptr<ListenSpec>> dormant;
};

// Never destroyed: the library's threads may run after static destructors.
Tables &tables() {
  static auto *t = new Tables();
  return *t;
}

uint64_t file_id(const struct stat &st) {
  return static_cast<uint64_t>(st.st_ino) ^ (static_cast<uint64_t>(st.st_dev) << 48);
}

}  // namespace

std::mutex &fd_table_mutex() { return tables().mu; }

FdSlot *slot(int fd, bool create) {
  if (fd < 0 || fd >= kMaxChunks * kChunk) return nullptr;
  auto &chunk = g_chunks[fd >> kChunkBits];
  FdSlot *c = chunk.load(std::memory_order_acquire);
  if (!c) {
    if (!create) return nullptr;
    auto *fresh = new FdSlot[kChunk];
    if (!chunk.compare_exchange_strong(c, fresh, std::memory_order_acq_rel)) delete[] fresh;
    else c = fresh;
  }
  return &c[fd & (kChunk - 1)];
}

void set_kind(int fd, uint8_t kind) {
  if (FdSlot *s = slot(fd, kind != kKernel)) s->kind.store(kind, std::memory_order_release);
}

void for_each_slot(unsigned first, unsigned last, const std::function<void(int fd, FdSlot &s)> &f) {
  const unsigned top = std::min<unsigned>(last, kMaxChunks * kChunk - 1);
  for (unsigned c = first >> kChunkBits; c <= (top >> kChunkBits) && first <= top; ++c) {
    FdSlot *chunk = g_chunks[c].load(std::memory_order_acquire);
    if (!chunk) continue;  // no chunk: no fd of it was ever ours
    const unsigned lo = std::max(first, c << kChunkBits);
    const unsigned hi = std::min(top, (c << kChunkBits) | (kChunk - 1));
    for (unsigned fd = lo; fd <= hi; ++fd) f(static_cast<int>(fd), chunk[fd & (kChunk - 1)]);
  }
}

// ------------------------------------------------------------------ gpusock sockets

std::shared_ptr<SockInfo> sock_info(int fd) {
  std::lock_guard lock(tables().mu);
  auto it = tables().infos.find(fd);
  return it == tables().infos.end() ? nullptr : it->second;
}

void attach_gs_fd(int fd, std::shared_ptr<SockInfo> info) {
  if (!info) info = std::make_shared<SockInfo>();
  info->user_fds.fetch_add(1);
  {
    std::lock_guard lock(tables().mu);
    tables().infos[fd] = std::move(info);
    tables().pendings.erase(fd);
  }
  set_kind(fd, kGs);
}

std::shared_ptr<SockInfo> detach_gs_fd(int fd) {
  set_kind(fd, kKernel);
  std::shared_ptr<SockInfo> info;
  {
    std::lock_guard lock(tables().mu);
    auto it = tables().infos.find(fd);
    if (it == tables().infos.end()) return nullptr;
    info = std::move(it->second);
    tables().infos.erase(it);
  }
  info->user_fds.fetch_sub(1);
  return info;
}

std::vector<std::pair<int, std::shared_ptr<SockInfo>>> all_gs_fds() {
  std::lock_guard lock(tables().mu);
  return {tables().infos.begin(), tables().infos.end()};
}

void forget_all_gs_fds_in_child() {
  for (auto &[fd, info] : tables().infos) set_kind(fd, kKernel);
  tables().infos.clear();
  for_each_slot(0, ~0u, [](int, FdSlot &s) {
    if (s.kind.load() == kInternal) s.kind.store(kKernel);
  });
}

// ------------------------------------------------------------------ pending sockets

void add_pending(int fd, int domain) {
  {
    std::lock_guard lock(tables().mu);
    Pending p;
    p.domain = domain;
    tables().pendings[fd] = std::move(p);
  }
  set_kind(fd, kPending);
}

bool take_pending(int fd, Pending *out) {
  std::lock_guard lock(tables().mu);
  auto it = tables().pendings.find(fd);
  if (it == tables().pendings.end()) return false;
  *out = it->second;
  return true;
}

void set_pending_bound(int fd, const sockaddr_storage &addr, socklen_t len) {
  std::lock_guard lock(tables().mu);
  auto it = tables().pendings.find(fd);
  if (it != tables().pendings.end()) {
    it->second.bound = addr;
    it->second.bound_len = len;
  }
}

void record_pending_option(int fd, int level, int name, const void *val, socklen_t len) {
  std::lock_guard lock(tables().mu);
  auto it = tables().pendings.find(fd);
  if (it != tables().pendings.end()) {
    Pending::Opt o{level, name,
                   std::vector<char>(static_cast<const char *>(val), static_cast<const char *>(val) + len)};
    it->second.opts.push_back(std::move(o));
  }
}

void drop_pending(int fd) {
  {
    std::lock_guard lock(tables().mu);
    tables().pendings.erase(fd);
  }
  set_kind(fd, kKernel);
}

// ------------------------------------------------------------------ listeners

void add_dormant(int fd, std::shared_ptr<ListenSpec> spec) {
  {
    std::lock_guard lock(tables().mu);
    tables().dormant[fd] = std::move(spec);
  }
  set_kind(fd, kDormant);
}

std::shared_ptr<ListenSpec> dormant_spec(int fd) {
  std::lock_guard lock(tables().mu);
  auto it = tables().dormant.find(fd);
  return it == tables().dormant.end() ? nullptr : it->second;
}

ListenSpec::~ListenSpec() {
  if (anchor >= 0) real().close(anchor);
}

std::shared_ptr<ListenSpec> drop_dormant(int fd, bool keep_kind) {
  if (!keep_kind) set_kind(fd, kKernel);
  std::lock_guard lock(tables().mu);
  auto it = tables().dormant.find(fd);
  if (it == tables().dormant.end()) return nullptr;
  auto spec = std::move(it->second);
  tables().dormant.erase(it);
  return spec;
}

std::vector<std::pair<int, std::shared_ptr<ListenSpec>>> all_dormant() {
  std::lock_guard lock(tables().mu);
  return {tables().dormant.begin(), tables().dormant.end()};
}

// ------------------------------------------------------------------ transport fds

void mark_transport_fd(int fd) {
  FdSlot *s = slot(fd, true);
  if (!s) return;
  struct stat st;
  if (real().fstat(fd, &st) < 0) return;
  s->ino.store(file_id(st));
  s->kind.store(kTransport, std::memory_order_release);
}

void transport_fds_cloexec_in_child() {
  const Real &R = real();
  for_each_slot(0, ~0u, [&](int fd, FdSlot &s) {
    if (s.kind.load() != kTransport) return;
    struct stat st;
    if (R.fstat(fd, &st) == 0 && file_id(st) == s.ino.load()) {
      const int fl = R.fcntl(fd, F_GETFD);
      if (fl >= 0) R.fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
    }
    s.kind.store(kKernel);
  });
}

}  // namespace gpusock::preload
