// The ring budget's arithmetic (wire/socket/ring_budget.h); the sockets that
// use it are tested end to end in socket_e2e_test (AdaptiveRingsWhileTheBudgetLasts).
#include "wire/socket/ring_budget.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace {

using gpusock::socket::RingBudget;

constexpr uint32_t kDefault = 128 << 10, kLarge = 4 << 20;

TEST(RingBudget, GrowsUnchosenRingsUntilSpentThenKeepsTheDefaults) {
  RingBudget b;
  b.configure(kLarge, 3 * size_t(kLarge));  // room for three rings
  uint32_t r = kDefault, s = kDefault;
  EXPECT_EQ(b.reserve(true, &r, true, &s), 2 * size_t(kLarge));
  EXPECT_EQ(r, kLarge);
  EXPECT_EQ(s, kLarge);
  r = s = kDefault;
  EXPECT_FALSE(b.first_refusal());
  EXPECT_EQ(b.reserve(true, &r, true, &s), 0u);  // both do not fit: neither grows
  EXPECT_TRUE(b.first_refusal());                // said once
  EXPECT_FALSE(b.first_refusal());
  EXPECT_EQ(r, kDefault);
  EXPECT_EQ(s, kDefault);
  EXPECT_EQ(b.reserve(true, &r, false, &s), size_t(kLarge));  // one does
  EXPECT_EQ(r, kLarge);
  EXPECT_EQ(s, kDefault);
  EXPECT_EQ(b.held(), 3 * size_t(kLarge));
  b.release(2 * size_t(kLarge));
  EXPECT_EQ(b.held(), size_t(kLarge));
}

TEST(RingBudget, ChosenOrLargeEnoughSizesAreLeftAlone) {
  RingBudget b;
  b.configure(kLarge, 64 << 20);
  uint32_t r = 64 << 10, s = 8 << 20;
  EXPECT_EQ(b.reserve(false, &r, true, &s), 0u);  // r chosen; s already larger
  EXPECT_EQ(r, 64u << 10);
  EXPECT_EQ(s, 8u << 20);
  b.configure(0, 64 << 20);  // GPUSOCK_RING_LARGE=0: never grow
  r = s = kDefault;
  EXPECT_EQ(b.reserve(true, &r, true, &s), 0u);
  EXPECT_EQ(r, kDefault);
}

TEST(RingBudget, ConcurrentReservationsNeverOverspend) {
  RingBudget b;
  b.configure(kLarge, 10 * size_t(kLarge));
  std::vector<std::thread> threads;
  std::vector<size_t> got(8, 0);
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 1000; ++i) {
        uint32_t r = kDefault, s = kDefault;
        const size_t taken = b.reserve(true, &r, false, &s);
        if (taken != 0 && (i & 1)) b.release(taken);
        else got[static_cast<size_t>(t)] += taken;
      }
    });
  for (auto &th : threads) th.join();
  size_t kept = 0;
  for (size_t g : got) kept += g;
  EXPECT_EQ(kept, b.held());
  EXPECT_LE(b.held(), b.budget());
}

}  // namespace
