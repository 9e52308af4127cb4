// The proxy's parts on their own: the channel's layout, the buffer sets and
// the status lines the GPU polls.
#include "proxy/buffer_pool.h"
#include "proxy/channel_layout.h"
#include "proxy/status_publisher.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

namespace {

using namespace gpusock;
using namespace gpusock::channel;
using namespace gpusock::proxy;

// [offset, offset + bytes) ranges of one block: inside it and apart.
void expect_apart_and_inside(std::vector<std::pair<size_t, size_t>> ranges, size_t block, const char *what) {
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 0; i < ranges.size(); ++i) {
    EXPECT_LE(ranges[i].first + ranges[i].second, block) << what << " range " << i;
    if (i > 0) {
      EXPECT_LE(ranges[i - 1].first + ranges[i - 1].second, ranges[i].first) << what << " range " << i;
    }
  }
}

class Layout : public ::testing::TestWithParam<ChannelShape> {};

TEST_P(Layout, EveryPartFitsItsBlockApartFromTheOthers) {
  const ChannelShape shape = GetParam();
  const ChannelLayout l = plan_channel(shape);
  EXPECT_EQ(l.requests_bytes, size_t(shape.threads) * shape.ring_entries * sizeof(Request));
  expect_apart_and_inside({{0, shape.threads * sizeof(ProxyShared)},
                           {l.status_offset, shape.sockets * sizeof(SocketStatus)},
                           {l.inline_offset, shape.sockets * sizeof(InlineRecv)}},
                          l.status_bytes, "status block");
  const size_t counters = size_t(shape.threads) * kCounterStride * sizeof(unsigned long long);
  expect_apart_and_inside({{0, shape.sockets * sizeof(DeviceSocket)},
                           {l.claims_offset, shape.sockets * sizeof(uint32_t)},
                           {l.ticket_offset, counters},
                           {l.consumed_offset, counters},
                           {l.cursor_offset, sizeof(uint32_t)}},
                          l.private_bytes, "private block");
  EXPECT_EQ(l.rbuf_bytes, size_t(shape.buffer_sets) * shape.rbuf_size);
  EXPECT_EQ(l.sbuf_bytes, size_t(shape.buffer_sets) * shape.sbuf_size);
}

TEST_P(Layout, WhatTheGpuPollsStartsOnALineOfItsOwn) {
  const ChannelLayout l = plan_channel(GetParam());
  for (size_t offset : {l.status_offset, l.inline_offset, l.claims_offset, l.ticket_offset, l.consumed_offset})
    EXPECT_EQ(offset % 64, 0u) << offset;
}

TEST_P(Layout, BothSidesPointIntoTheSameBlocks) {
  const ChannelShape shape = GetParam();
  const ChannelLayout l = plan_channel(shape);
  std::vector<std::vector<uint8_t>> memory;
  auto block = [&](size_t bytes, bool device_only) {
    memory.emplace_back(bytes + 64);
    uint8_t *p = memory.back().data();
    p += (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64;
    return MemoryBlock{device_only ? nullptr : p, p, bytes};
  };
  const ChannelBlocks blocks{block(l.requests_bytes, false), block(l.status_bytes, false), block(l.private_bytes, true),
                             block(l.rbuf_bytes, false), block(l.sbuf_bytes, false)};
  DeviceContext ctx{};
  point_device_context(shape, l, blocks, &ctx);
  const HostChannel host = point_host_channel(l, blocks);
  EXPECT_EQ(static_cast<void *>(ctx.requests), static_cast<void *>(host.requests));
  EXPECT_EQ(static_cast<const void *>(ctx.shared), static_cast<void *>(host.shared));
  EXPECT_EQ(static_cast<const void *>(ctx.status), static_cast<void *>(host.status));
  EXPECT_EQ(static_cast<const void *>(ctx.inline_recv), static_cast<void *>(host.inline_recv));
  EXPECT_EQ(ctx.rbufs, host.rbufs);
  EXPECT_EQ(ctx.sbufs, host.sbufs);
  EXPECT_EQ(ctx.request_mask + 1, shape.ring_entries);
  EXPECT_EQ(ctx.request_rings, shape.threads);
  EXPECT_EQ(ctx.max_sockets, shape.sockets);
  EXPECT_EQ(ctx.buffer_sets, shape.buffer_sets);
  EXPECT_EQ(reinterpret_cast<uint8_t *>(ctx.claim_cursor),
            static_cast<uint8_t *>(blocks.priv.device) + l.cursor_offset);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Layout,
                         ::testing::Values(ChannelShape{1, 2, 1, 1, 4096, 4096},
                                           ChannelShape{1, 1024, 256, 320, 1 << 18, 1 << 18},
                                           ChannelShape{3, 64, 7, 9, 4096, 8192},
                                           ChannelShape{64, 16, 1000, 1064, 4096, 4096}));

TEST(BufferPool, SetsAreHandedOutOnceAndTheirRingsDoNotOverlap) {
  std::vector<uint8_t> r(4 * 4096), s(4 * 8192);
  BufferPool pool;
  pool.reset(r.data(), s.data(), 4, 4096, 8192);
  std::set<uint32_t> seen;
  for (int i = 0; i < 4; ++i) {
    BufferSet set;
    ASSERT_EQ(pool.take(&set), 0);
    EXPECT_TRUE(seen.insert(set.index).second);
    EXPECT_EQ(set.rbuf, r.data() + size_t(set.index) * 4096);
    EXPECT_EQ(set.sbuf, s.data() + size_t(set.index) * 8192);
    EXPECT_EQ(set.rbuf_size, 4096u);
    EXPECT_EQ(set.sbuf_size, 8192u);
  }
  BufferSet none;
  EXPECT_EQ(pool.take(&none), -ENOBUFS);
  EXPECT_EQ(pool.free_sets(), 0u);
  BufferSet back;
  back.index = 2;
  pool.give_back(back);
  BufferSet again;
  ASSERT_EQ(pool.take(&again), 0);
  EXPECT_EQ(again.index, 2u);
}

class Publisher : public ::testing::Test {
 protected:
  void SetUp() override {
    std::memset(status_, 0xAB, sizeof status_);
    std::memset(inline_, 0xCD, sizeof inline_);
    pub_.attach(status_, inline_, 2);
  }
  SocketStatus status_[2];
  InlineRecv inline_[2];
  StatusPublisher pub_;
};

TEST_F(Publisher, WritesOnlyWhatChanged) {
  SlotReport now;
  now.recv_write = 100;
  now.state = kStConnected;
  pub_.publish(1, now);
  EXPECT_EQ(status_[1].recv_write, 100u);
  EXPECT_EQ(status_[1].state, kStConnected);
  uint64_t untouched;
  std::memset(&untouched, 0xAB, sizeof untouched);
  EXPECT_EQ(status_[1].send_done, untouched);   // unchanged from the last report (0): not written
  EXPECT_EQ(status_[0].recv_write, untouched);  // another slot
  status_[1].recv_write = 7;                    // were it written again, this would change
  pub_.publish(1, now);
  EXPECT_EQ(status_[1].recv_write, 7u);
  EXPECT_EQ(pub_.last(1).recv_write, 100u);
}

TEST_F(Publisher, ForgottenBufferIsWrittenAgain) {
  SlotReport now;
  now.buffer = 0;
  pub_.forget_buffer(0);
  pub_.publish(0, now);
  EXPECT_EQ(status_[0].buffer, 0u);
}

TEST_F(Publisher, ControlAnswerIsOneWord) {
  pub_.complete(0, 41, -ECONNREFUSED);
  EXPECT_EQ(status_[0].ctrl_done, 41u);
  EXPECT_EQ(status_[0].ctrl_result, -ECONNREFUSED);
}

TEST_F(Publisher, ReleaseClearsTheLineAndTheRecordThenHandsTheSlotBack) {
  SlotReport now;
  now.recv_write = 5;
  now.state = kStConnected | kStRecvClosed;
  pub_.publish(1, now);
  pub_.release(1, 3);
  EXPECT_EQ(status_[1].state, 0u);
  EXPECT_EQ(status_[1].recv_write, 0u);
  EXPECT_EQ(status_[1].send_done, 0u);
  EXPECT_EQ(status_[1].error, 0);
  EXPECT_EQ(status_[1].releases, 3u);
  const InlineRecv zero{};
  EXPECT_EQ(std::memcmp(&inline_[1], &zero, sizeof zero), 0);
  EXPECT_EQ(pub_.last(1).state, 0u);
}

}  // namespace
