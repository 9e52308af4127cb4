// End-to-end tests of zero-copy sends (stream_socket_zcopy.cc) over a real
// provider, against the echo test_peer in another process: large blocking
// sends go out from buffers that are then freed, unmapped, remapped, discarded
// or rewritten and sent again, and every byte that comes back is checked.
// ctest runs it per transport and once more with GPUSOCK_ZCOPY=0, where the
// same bytes must come back through the copy path.
#include "test-support/gs_sockets.h"
#include "test-support/peer_process.h"
#include "wire/socket/engine.h"

#include <gpusock/socket.h>

#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace gpusock::test;
using gpusock::socket::Engine;
using gpusock::socket::RegCache;

constexpr size_t kMaxRound = (4 << 20) + 4096;

uint8_t pattern(uint32_t round, size_t i) {
  const uint64_t x = (uint64_t(round) << 32 | i) * 0x9E3779B97F4A7C15ull;
  return static_cast<uint8_t>(x >> 56);
}
void fill(uint8_t *p, size_t n, uint32_t round) {
  for (size_t i = 0; i < n; ++i) p[i] = pattern(round, i);
}

// How a round gets its buffer and lets go of it afterwards.
struct Round {
  size_t size;
  std::function<uint8_t *(size_t)> get;
  std::function<void(uint8_t *, size_t)> put;
};

uint8_t *last_map = nullptr;
uint8_t *map_at(size_t n, void *hint) {
  void *p = mmap(hint, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<uint8_t *>(p);
}

std::vector<Round> rounds() {
  static std::vector<uint8_t> kept(kMaxRound);
  const auto malloc_get = [](size_t n) { return static_cast<uint8_t *>(std::malloc(n)); };
  const auto malloc_put = [](uint8_t *p, size_t) { std::free(p); };
  // The same addresses again and again, new pages each time.
  const auto remap_get = [](size_t n) { return last_map = map_at(n, last_map); };
  const auto remap_put = [](uint8_t *p, size_t n) { munmap(p, n); };
  // Pages moved away by mremap, new ones mapped where they were.
  const auto move_put = [](uint8_t *p, size_t n) {
    uint8_t *elsewhere = map_at(n, nullptr);
    mremap(p, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, elsewhere);
    munmap(elsewhere, n);
  };
  // Discarded pages: the next fill faults in fresh ones at the same address.
  const auto kept_get = [](size_t) { return kept.data() + 17; };
  const auto discard_put = [](uint8_t *p, size_t n) {
    const auto page = reinterpret_cast<uintptr_t>(p + 4095) & ~uintptr_t(4095);
    madvise(reinterpret_cast<void *>(page), (reinterpret_cast<uintptr_t>(p) + n - page) & ~uintptr_t(4095),
            MADV_DONTNEED);
  };
  const auto keep_put = [](uint8_t *, size_t) {};
  std::vector<Round> r;
  for (size_t size : {size_t(64) << 10, (size_t(1) << 20) + 3, size_t(4) << 20}) {
    r.push_back({size, malloc_get, malloc_put});
    r.push_back({size, remap_get, remap_put});
    r.push_back({size, remap_get, move_put});
    r.push_back({size, kept_get, discard_put});
    r.push_back({size, kept_get, keep_put});  // same pages, new contents
  }
  return r;
}

TEST(ZeroCopySend, ReusedBuffersArriveWithTheirNewContents) {
  mallopt(M_MMAP_THRESHOLD, 1 << 20);  // free() of a large block unmaps it
  const int port = free_port();
  PeerProcess echo(GS_TEST_PEER, {"echo", std::to_string(port)});
  ASSERT_GT(echo.pid(), 0);
  const int fd = connect_retry(test_address(port), {.seconds = 10, .pause_ms = 10});
  ASSERT_GE(fd, 0) << gs_last_error();

  const auto plan = rounds();
  constexpr int kPasses = 3;
  std::thread writer([&] {
    uint32_t round = 0;
    for (int pass = 0; pass < kPasses; ++pass) {
      for (const Round &r : plan) {
        // A small send (the copy path) before each large one: order must hold.
        const uint32_t header = round;
        if (gs_send(fd, &header, sizeof header, 0) != sizeof header) return;
        uint8_t *buf = r.get(r.size);
        if (buf == nullptr) return;
        fill(buf, r.size, round);
        if (gs_send(fd, buf, r.size, 0) != static_cast<ssize_t>(r.size)) return;
        std::memset(buf, 0xee, r.size);  // the send returned: the buffer is ours again
        r.put(buf, r.size);
        ++round;
      }
    }
    gs_shutdown(fd, SHUT_WR);
  });
  std::vector<uint8_t> got(kMaxRound);
  uint32_t round = 0;
  for (int pass = 0; pass < kPasses; ++pass) {
    for (const Round &r : plan) {
      uint32_t header = ~0u;
      ASSERT_TRUE(recv_all(fd, &header, sizeof header));
      ASSERT_EQ(header, round);
      ASSERT_TRUE(recv_all(fd, got.data(), r.size)) << "round " << round;
      for (size_t i = 0; i < r.size; ++i)
        ASSERT_EQ(got[i], pattern(round, i)) << "round " << round << " byte " << i << " of " << r.size;
      ++round;
    }
  }
  writer.join();
  char extra;
  EXPECT_EQ(gs_recv(fd, &extra, 1, 0), 0);
  gs_close(fd);

  const char *zcopy = std::getenv("GPUSOCK_ZCOPY");
  RegCache *cache = Engine::get().reg_cache();
  if (zcopy && std::strcmp(zcopy, "0") == 0) {
    EXPECT_EQ(cache, nullptr);
  } else if (cache != nullptr) {  // absent only where userfaultfd is refused
    const auto stats = cache->stats();
    std::printf("registration cache: %llu hits, %llu misses, %llu invalidations, %llu evictions\n",
                static_cast<unsigned long long>(stats.hits), static_cast<unsigned long long>(stats.misses),
                static_cast<unsigned long long>(stats.invalidations), static_cast<unsigned long long>(stats.evictions));
    EXPECT_GT(stats.misses, 0u);
    EXPECT_GT(stats.hits, 0u);           // the kept buffer
    EXPECT_GT(stats.invalidations, 0u);  // everything else
  }
}

// A zero-copy sender and a copy-path sender on one socket: neither waits
// forever for the other, and every byte of both comes back once.
TEST(ZeroCopySend, ConcurrentCopySenderLosesNothing) {
  const int port = free_port();
  PeerProcess echo(GS_TEST_PEER, {"echo", std::to_string(port)});
  ASSERT_GT(echo.pid(), 0);
  const int fd = connect_retry(test_address(port), {.seconds = 10, .pause_ms = 10});
  ASSERT_GE(fd, 0) << gs_last_error();
  constexpr size_t kLarge = 1 << 20, kSmall = 1000;
  constexpr int kLargeCount = 16, kSmallCount = 4000;
  std::thread large([&] {
    std::vector<uint8_t> buf(kLarge, 'A');
    for (int i = 0; i < kLargeCount; ++i)
      if (!send_all(fd, buf.data(), buf.size())) return;
  });
  std::thread small([&] {
    std::vector<uint8_t> buf(kSmall, 'B');
    for (int i = 0; i < kSmallCount; ++i)
      if (!send_all(fd, buf.data(), buf.size())) return;
  });
  std::vector<uint8_t> got(1 << 16);
  size_t a = 0, b = 0, other = 0;
  while (a + b + other < kLarge * kLargeCount + kSmall * kSmallCount) {
    const ssize_t n = gs_recv(fd, got.data(), got.size(), 0);
    ASSERT_GT(n, 0) << gs_last_error();
    for (ssize_t i = 0; i < n; ++i) (got[i] == 'A' ? a : got[i] == 'B' ? b : other) += 1;
  }
  large.join();
  small.join();
  EXPECT_EQ(a, kLarge * kLargeCount);
  EXPECT_EQ(b, kSmall * kSmallCount);
  EXPECT_EQ(other, 0u);
  gs_close(fd);
}

// The peer dies while a zero-copy send waits for room: the send comes back
// (with what went out, or the error) instead of waiting for writes that will
// never complete, and the buffer may be freed.
TEST(ZeroCopySend, PeerDeathEndsTheSend) {
  const int port = free_port();
  PeerProcess stall(GS_TEST_PEER, {"stall", std::to_string(port), "60000"});
  ASSERT_GT(stall.pid(), 0);
  const int fd = connect_retry(test_address(port), {.seconds = 10, .pause_ms = 10});
  ASSERT_GE(fd, 0) << gs_last_error();
  constexpr size_t kSize = 16 << 20;
  ssize_t sent = 0;
  std::thread writer([&] {
    std::vector<uint8_t> buf(kSize, 7);
    sent = gs_send(fd, buf.data(), buf.size(), 0);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  stall.kill9();
  writer.join();
  EXPECT_LT(sent, static_cast<ssize_t>(kSize));
  gs_close(fd);
}

}  // namespace
