// Memory registrations of application buffers, kept for reuse by zero-copy
// sends (a registration costs a system call or more; on verbs it pins pages).
//
// Ranges are whole pages. An entry is served only while the memory behind it
// is the memory that was registered: every range the UnmapMonitor reports as
// unmapped, remapped or discarded is dropped before the next lookup. Without a
// monitor (userfaultfd refused, or a forked child) nothing is cached and
// acquire() says no: the caller copies. Least recently used entries go first
// once the registered bytes pass the cap; an entry in use is never dropped
// under its user (an invalidated one is deregistered at its release).
#pragma once

#include "wire/socket/unmap_monitor.h"
#include "wire/transport.h"

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>

namespace gpusock::socket {

class RegCache {
 public:
  struct Entry;
  struct Stats {
    uint64_t hits = 0, misses = 0, evictions = 0, invalidations = 0;
  };

  // monitor == nullptr: a cache that never caches.
  RegCache(wire::Domain *domain, UnmapMonitor *monitor, size_t max_bytes);
  ~RegCache();
  RegCache(const RegCache &) = delete;
  RegCache &operator=(const RegCache &) = delete;

  // A registration covering [addr, addr + len), held for the caller until
  // release(); nullptr when there is none to be had (no monitor, memory the
  // monitor cannot watch, a registration failure, a range overlapping one in
  // use by another thread): copy instead.
  Entry *acquire(const void *addr, size_t len);
  void release(Entry *entry);
  static const wire::MemoryRegion &region(const Entry *entry);

  Stats stats();
  size_t registered_bytes();

 private:
  void apply_changes_locked();
  void invalidate_locked(AddressRange range);
  void drop_locked(Entry *entry);  // out of the map and the LRU; deregistered unless in use
  void free_locked(Entry *entry);  // deregisters and deletes
  void evict_locked();

  wire::Domain *domain_;
  UnmapMonitor *monitor_;
  size_t max_bytes_;
  std::mutex mu_;
  uint64_t cursor_ = 0;                    // monitor events seen
  std::map<uintptr_t, Entry *> by_start_;  // disjoint ranges, by start address
  std::list<Entry *> lru_;                 // most recently used first
  size_t bytes_ = 0;
  Stats stats_;
};

}  // namespace gpusock::socket
