// The CPU sockets' fd table (wire/socket/fd_table.h): slots across chunks, the
// range it covers, and lookups from many threads while a writer adds and
// removes (run under ThreadSanitizer by scripts/test).
#include "wire/socket/fd_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace gpusock::socket {
namespace {

using Table = FdTable<int>;

TEST(FdTable, PutGetTakeAcrossChunks) {
  Table t;
  const int chunk = 1 << Table::kChunkBits;
  const std::vector<int> fds = {0, 3, chunk - 1, chunk, 5 * chunk + 7, Table::kMaxFds - 1};
  int status = 1;
  for (int fd : fds) {
    EXPECT_EQ(t.put(fd, std::make_shared<int>(fd), &status), nullptr);
    EXPECT_EQ(status, 0);
  }
  for (int fd : fds) {
    ASSERT_NE(t.get(fd), nullptr) << fd;
    EXPECT_EQ(*t.get(fd), fd);
  }
  EXPECT_EQ(t.get(1), nullptr);
  EXPECT_EQ(t.get(2 * chunk), nullptr);  // a chunk never made
  int seen = 0;
  t.for_each([&](std::shared_ptr<int> p) { seen += p != nullptr; });
  EXPECT_EQ(seen, static_cast<int>(fds.size()));
  // put over an occupied slot hands back what was there (dup2 over a socket).
  auto old = t.put(3, std::make_shared<int>(33), &status);
  ASSERT_NE(old, nullptr);
  EXPECT_EQ(*old, 3);
  EXPECT_EQ(*t.get(3), 33);
  auto taken = t.take(3);
  ASSERT_NE(taken, nullptr);
  EXPECT_EQ(*taken, 33);
  EXPECT_EQ(t.get(3), nullptr);
  EXPECT_EQ(t.take(3), nullptr);
  std::vector<int> all;
  t.take_each([&](std::shared_ptr<int> p) { all.push_back(*p); });
  EXPECT_EQ(all.size(), fds.size() - 1);
  for (int fd : fds) EXPECT_EQ(t.get(fd), nullptr);
}

TEST(FdTable, OutOfRangeIsRefused) {
  Table t;
  int status = 0;
  EXPECT_EQ(t.put(Table::kMaxFds, std::make_shared<int>(1), &status), nullptr);
  EXPECT_EQ(status, -EMFILE);
  EXPECT_EQ(t.put(-1, std::make_shared<int>(1), &status), nullptr);
  EXPECT_EQ(status, -EMFILE);
  EXPECT_EQ(t.get(Table::kMaxFds), nullptr);
  EXPECT_EQ(t.get(-5), nullptr);
  EXPECT_EQ(t.take(Table::kMaxFds), nullptr);
}

TEST(FdTable, AbandonForgetsEverything) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "abandon() leaks its chunks on purpose (LeakSanitizer would say so)";
#endif
  Table t;
  int status;
  auto kept = std::make_shared<int>(9);
  t.put(10, kept, &status);
  t.abandon();  // the child of fork(): the chunk is leaked, not freed
  EXPECT_EQ(t.get(10), nullptr);
  EXPECT_EQ(kept.use_count(), 2);                 // the leaked slot still holds it
  t.put(10, std::make_shared<int>(11), &status);  // a fresh chunk
  EXPECT_EQ(*t.get(10), 11);
}

// Readers on every thread while one writer churns the same fds: a reader gets
// either nothing or a live socket whose value is the fd (never a freed one).
TEST(FdTable, LookupsRaceAWriter) {
  Table t;
  constexpr int kFds = 64;
  std::atomic<bool> stop{false};
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r)
    readers.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed))
        for (int fd = 0; fd < kFds; ++fd)
          if (auto p = t.get(fd)) {
            EXPECT_EQ(*p, fd);
          }
    });
  int status;
  for (int round = 0; round < 2000; ++round)
    for (int fd = round % 2; fd < kFds; fd += 2) {
      if (round % 4 < 2) t.put(fd, std::make_shared<int>(fd), &status);
      else t.take(fd);
    }
  stop = true;
  for (auto &r : readers) r.join();
}

}  // namespace
}  // namespace gpusock::socket
