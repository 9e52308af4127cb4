#include "wire/socket/reg_cache.h"

#include <unistd.h>

namespace gpusock::socket {

struct RegCache::Entry {
  wire::MemoryRegion mr{};
  AddressRange range;
  int users = 0;
  bool cached = true;  // false: invalidated while in use, freed at release
  std::list<Entry *>::iterator lru;
};

namespace {

constexpr uintptr_t kPage = 4096;

AddressRange page_range(const void *addr, size_t len) {
  const auto start = reinterpret_cast<uintptr_t>(addr);
  return {start & ~(kPage - 1), (start + len + kPage - 1) & ~(kPage - 1)};
}

bool overlaps(const AddressRange &a, const AddressRange &b) { return a.start < b.end && b.start < a.end; }

}  // namespace

RegCache::RegCache(wire::Domain *domain, UnmapMonitor *monitor, size_t max_bytes)
    : domain_(domain), monitor_(monitor), max_bytes_(max_bytes) {
  if (monitor_) cursor_ = monitor_->sequence();
}

RegCache::~RegCache() {
  std::lock_guard lock(mu_);
  while (!by_start_.empty()) drop_locked(by_start_.begin()->second);
}

const wire::MemoryRegion &RegCache::region(const Entry *entry) { return entry->mr; }

RegCache::Stats RegCache::stats() {
  std::lock_guard lock(mu_);
  return stats_;
}

size_t RegCache::registered_bytes() {
  std::lock_guard lock(mu_);
  return bytes_;
}

void RegCache::free_locked(Entry *entry) {
  if (entry->mr.handle) domain_->deregister_memory(&entry->mr);
  delete entry;
}

void RegCache::drop_locked(Entry *entry) {
  by_start_.erase(entry->range.start);
  lru_.erase(entry->lru);
  bytes_ -= entry->range.end - entry->range.start;
  entry->cached = false;
  if (entry->users == 0) free_locked(entry);
}

void RegCache::invalidate_locked(AddressRange range) {
  auto it = by_start_.upper_bound(range.start);
  if (it != by_start_.begin()) --it;
  while (it != by_start_.end() && it->second->range.start < range.end) {
    Entry *entry = (it++)->second;
    if (!overlaps(entry->range, range)) continue;
    ++stats_.invalidations;
    drop_locked(entry);
  }
}

// Takes the monitor's news before any lookup: a buffer freed and mapped again
// since the last call must not find its old registration.
void RegCache::apply_changes_locked() {
  AddressRange changed[64];
  for (;;) {
    const int n = monitor_->changes_since(&cursor_, changed, 64);
    if (n < 0) {  // events were lost: nothing cached can be trusted
      while (!by_start_.empty()) {
        ++stats_.invalidations;
        drop_locked(by_start_.begin()->second);
      }
      continue;
    }
    for (int i = 0; i < n; ++i) invalidate_locked(changed[i]);
    if (n < 64) return;
  }
}

void RegCache::evict_locked() {
  for (auto it = lru_.rbegin(); bytes_ > max_bytes_ && it != lru_.rend();) {
    Entry *entry = *it++;
    if (entry->users > 0) continue;
    ++stats_.evictions;
    monitor_->unwatch(entry->range);
    drop_locked(entry);
  }
}

RegCache::Entry *RegCache::acquire(const void *addr, size_t len) {
  if (monitor_ == nullptr || len == 0 || UnmapMonitor::get() != monitor_) return nullptr;
  AddressRange range = page_range(addr, len);
  std::lock_guard lock(mu_);
  apply_changes_locked();
  auto it = by_start_.upper_bound(range.start);
  if (it != by_start_.begin()) {
    Entry *entry = std::prev(it)->second;
    if (entry->range.end >= range.end) {
      ++stats_.hits;
      ++entry->users;
      lru_.splice(lru_.begin(), lru_, entry->lru);
      return entry;
    }
  }
  ++stats_.misses;
  // A miss: the new entry takes over the ranges it overlaps (a buffer that grew).
  it = by_start_.upper_bound(range.start);
  if (it != by_start_.begin()) --it;
  while (it != by_start_.end() && it->second->range.start < range.end) {
    Entry *entry = (it++)->second;
    if (!overlaps(entry->range, range)) continue;
    if (entry->users > 0) return nullptr;  // another thread sends from it
    range = {std::min(range.start, entry->range.start), std::max(range.end, entry->range.end)};
    drop_locked(entry);
  }
  if (!monitor_->watch(range)) return nullptr;
  auto *entry = new Entry;
  entry->range = range;
  const gs_status_t rc = domain_->register_memory(reinterpret_cast<void *>(range.start), range.end - range.start,
                                                  wire::kAccessLocal, &entry->mr);
  if (rc < 0) {
    delete entry;
    monitor_->unwatch(range);
    return nullptr;
  }
  entry->users = 1;
  by_start_[range.start] = entry;
  lru_.push_front(entry);
  entry->lru = lru_.begin();
  bytes_ += range.end - range.start;
  evict_locked();
  return entry;
}

void RegCache::release(Entry *entry) {
  if (entry == nullptr) return;
  std::lock_guard lock(mu_);
  if (--entry->users == 0 && !entry->cached) free_locked(entry);
}

}  // namespace gpusock::socket
