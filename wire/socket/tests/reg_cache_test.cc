// Unit tests of the registration cache (reg_cache.h) and the userfaultfd
// monitor behind it, over a real transport domain (GPUSOCK_TRANSPORT): hits,
// misses, eviction, and above all invalidation when the memory behind a
// cached range is unmapped, remapped, discarded or mapped anew.
#include "wire/socket/reg_cache.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace {

using gpusock::socket::RegCache;
using gpusock::socket::UnmapMonitor;
using gpusock::wire::Domain;

constexpr size_t kBuf = 256 << 10;

class RegCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    monitor_ = UnmapMonitor::get();
    if (monitor_ == nullptr) GTEST_SKIP() << "no userfaultfd here: the cache is off";
    const char *spec = std::getenv("GPUSOCK_TRANSPORT");
    std::string error;
    ASSERT_EQ(gpusock::wire::open_domain(spec ? spec : "fabric:tcp", &domain_, &error), 0) << error;
  }
  void make_cache(size_t max_bytes) { cache_ = std::make_unique<RegCache>(domain_.get(), monitor_, max_bytes); }
  static void *map(size_t n, void *hint = nullptr) {
    void *p = mmap(hint, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    std::memset(p, 0x5a, n);
    return p;
  }
  // Acquires and releases at once; true if it was served from the cache.
  bool touch(void *p, size_t n) {
    const auto hits = cache_->stats().hits;
    RegCache::Entry *e = cache_->acquire(p, n);
    EXPECT_NE(e, nullptr);
    if (e == nullptr) return false;
    const auto &mr = RegCache::region(e);
    EXPECT_LE(reinterpret_cast<uintptr_t>(mr.base), reinterpret_cast<uintptr_t>(p));
    EXPECT_GE(reinterpret_cast<uintptr_t>(mr.base) + mr.length, reinterpret_cast<uintptr_t>(p) + n);
    cache_->release(e);
    return cache_->stats().hits > hits;
  }

  UnmapMonitor *monitor_ = nullptr;
  std::unique_ptr<Domain> domain_;
  std::unique_ptr<RegCache> cache_;
};

TEST_F(RegCacheTest, HitAfterMissAndInsideARange) {
  make_cache(64 << 20);
  constexpr size_t kMapped = kBuf + 4096 * 3;
  void *p = map(kMapped);
  EXPECT_FALSE(touch(p, kBuf));
  EXPECT_TRUE(touch(p, kBuf));
  EXPECT_TRUE(touch(static_cast<char *>(p) + 100, 5000));  // inside the cached pages
  EXPECT_FALSE(touch(p, kMapped - 1000));                  // grew past them: a new, larger entry
  EXPECT_TRUE(touch(p, kBuf));
  EXPECT_EQ(cache_->stats().misses, 2u);
  munmap(p, kMapped);
}

TEST_F(RegCacheTest, EvictsLeastRecentlyUsedPastTheCap) {
  make_cache(3 * kBuf);
  void *b[4];
  for (auto &p : b) p = map(kBuf);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(touch(b[i], kBuf));
  EXPECT_TRUE(touch(b[0], kBuf));  // b[1] is now the oldest
  EXPECT_FALSE(touch(b[3], kBuf));
  EXPECT_EQ(cache_->stats().evictions, 1u);
  EXPECT_LE(cache_->registered_bytes(), 3 * kBuf);
  EXPECT_TRUE(touch(b[0], kBuf));
  EXPECT_FALSE(touch(b[1], kBuf));
  for (auto &p : b) munmap(p, kBuf);
}

TEST_F(RegCacheTest, EntryInUseIsNotEvicted) {
  make_cache(kBuf);
  void *a = map(kBuf), *b = map(kBuf);
  RegCache::Entry *held = cache_->acquire(a, kBuf);
  ASSERT_NE(held, nullptr);
  EXPECT_FALSE(touch(b, kBuf));  // over the cap, but `a` is in use
  EXPECT_NE(RegCache::region(held).handle, nullptr);
  cache_->release(held);
  munmap(a, kBuf);
  munmap(b, kBuf);
}

TEST_F(RegCacheTest, MunmapInvalidates) {
  make_cache(64 << 20);
  void *p = map(kBuf);
  EXPECT_FALSE(touch(p, kBuf));
  munmap(p, kBuf);
  void *q = map(kBuf, p);  // the same addresses, new memory (when the kernel agrees)
  EXPECT_FALSE(touch(q, kBuf));
  EXPECT_GE(cache_->stats().invalidations, 1u);
  munmap(q, kBuf);
}

TEST_F(RegCacheTest, PartialMunmapInvalidates) {
  make_cache(64 << 20);
  char *p = static_cast<char *>(map(kBuf));
  EXPECT_FALSE(touch(p, kBuf));
  munmap(p + kBuf - 4096, 4096);
  EXPECT_FALSE(touch(p, kBuf - 4096));
  munmap(p, kBuf - 4096);
}

TEST_F(RegCacheTest, MremapInvalidates) {
  make_cache(64 << 20);
  void *p = map(kBuf);
  EXPECT_FALSE(touch(p, kBuf));
  void *target = map(kBuf);
  void *r = mremap(p, kBuf, kBuf, MREMAP_MAYMOVE | MREMAP_FIXED, target);  // p's pages move to r
  ASSERT_EQ(r, target);
  void *q = map(kBuf, p);  // new memory where p was
  EXPECT_FALSE(touch(q, kBuf));
  EXPECT_GE(cache_->stats().invalidations, 1u);
  EXPECT_FALSE(touch(r, kBuf));
  munmap(q, kBuf);
  munmap(r, kBuf);
}

TEST_F(RegCacheTest, MadviseDontneedInvalidates) {
  make_cache(64 << 20);
  void *p = map(kBuf);
  EXPECT_FALSE(touch(p, kBuf));
  ASSERT_EQ(madvise(p, kBuf, MADV_DONTNEED), 0);
  EXPECT_FALSE(touch(p, kBuf));
  EXPECT_GE(cache_->stats().invalidations, 1u);
  munmap(p, kBuf);
}

TEST_F(RegCacheTest, MallocFreeReuseInvalidates) {
  make_cache(64 << 20);
  // Above a fixed mmap threshold, free() unmaps and the next malloc maps anew
  // (often at the same address). Below it, or with glibc's dynamic threshold,
  // free() keeps the pages mapped and a hit is right.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  for (int round = 0; round < 20; ++round) {
    void *p = std::malloc(4 << 20);
    ASSERT_NE(p, nullptr);
    std::memset(p, round, 4 << 20);
    EXPECT_FALSE(touch(p, 4 << 20)) << "round " << round << ": a stale registration was served";
    std::free(p);
  }
}

TEST_F(RegCacheTest, InvalidatedWhileInUseIsFreedAtRelease) {
  make_cache(64 << 20);
  void *p = map(kBuf);
  RegCache::Entry *held = cache_->acquire(p, kBuf);
  ASSERT_NE(held, nullptr);
  munmap(p, kBuf);
  void *q = map(kBuf, p);
  EXPECT_FALSE(touch(q, kBuf));
  cache_->release(held);  // deregistered now (ASan/LSan see a leak or a double free otherwise)
  munmap(q, kBuf);
}

TEST_F(RegCacheTest, FileBackedMemoryIsNotCached) {
  make_cache(64 << 20);
  FILE *f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(ftruncate(fileno(f), kBuf), 0);
  void *p = mmap(nullptr, kBuf, PROT_READ | PROT_WRITE, MAP_SHARED, fileno(f), 0);
  ASSERT_NE(p, MAP_FAILED);
  RegCache::Entry *e = cache_->acquire(p, kBuf);
  // tmpfs files are shmem, which the monitor can watch; a disk file it cannot.
  if (e) cache_->release(e);
  munmap(p, kBuf);
  std::fclose(f);
}

TEST_F(RegCacheTest, ForkedChildHasNoCache) {
  make_cache(64 << 20);
  void *p = map(kBuf);
  EXPECT_FALSE(touch(p, kBuf));
  const pid_t pid = fork();
  if (pid == 0) _exit(cache_->acquire(p, kBuf) == nullptr && UnmapMonitor::get() == nullptr ? 0 : 1);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  munmap(p, kBuf);
}

}  // namespace
