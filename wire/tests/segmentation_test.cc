// Segmentation of committed bytes into data writes (docs/wire-protocol.md
// §2.3 sender rules, §2.6, §9.5).
//
// The core's rule (stream.inl produce_data): per burst, `olap` starts at
// RS_OLAP_START_SIZE = 2048. With `left` bytes pending: if olap < left the chunk
// is olap and olap doubles up to RS_MAX_TRANSFER = 65536, else the chunk is
// left; then the chunk is cut at the end of the current target slot and at the
// send ring's wrap. A burst ends when everything committed has been posted.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "wire/core/stream.h"
#include "wire/tests/harness.h"

namespace gpusock::wire {
namespace {

using wiretest::Pair;
using Sizes = std::vector<uint32_t>;

// Reference model of §2.6 for one burst of n bytes committed at once.
Sizes model(uint64_t n, uint32_t slot_left, uint32_t half, uint32_t sbuf_off, uint32_t sbuf_size) {
  Sizes out;
  uint32_t olap = kOlapStartSize;
  uint64_t left = n;
  while (left) {
    uint64_t chunk = left;
    uint32_t next = olap;
    if (olap < left) {
      chunk = olap;
      next = olap * 2 < kMaxWrite ? olap * 2 : kMaxWrite;
    }
    if (chunk > slot_left) chunk = slot_left;
    if (chunk > sbuf_size - sbuf_off) chunk = sbuf_size - sbuf_off;
    out.push_back(static_cast<uint32_t>(chunk));
    left -= chunk;
    slot_left -= static_cast<uint32_t>(chunk);
    if (slot_left == 0) slot_left = half;
    sbuf_off = static_cast<uint32_t>((sbuf_off + chunk) % sbuf_size);
    olap = left == 0 ? kOlapStartSize : next;
  }
  return out;
}

struct Seg {
  explicit Seg(uint32_t peer_rbuf, uint32_t sbuf) : p(cfg(sbuf, kDefaultBufSize), cfg(kDefaultBufSize, peer_rbuf)) {
    p.log_writes = true;
    EXPECT_TRUE(p.run()) << p.violation;  // adverts exchanged, nothing else
  }
  static StreamConfig cfg(uint32_t sbuf, uint32_t rbuf) {
    StreamConfig c;
    c.sbuf_size = sbuf;
    c.rbuf_size = rbuf;
    return c;
  }
  // Commits n bytes at once (one burst) and returns the data write sizes that
  // carried them, with B consuming everything as it arrives.
  Sizes send(uint64_t n) {
    const size_t first = p.a().log.size();
    EXPECT_EQ(p.a().send_pattern(n), n) << "send ring too small for one burst";
    std::string err;
    const uint64_t want = p.b().app_recv + n;
    for (int guard = 0; p.b().app_recv < want && guard < 100000; ++guard) {
      EXPECT_TRUE(p.run()) << p.violation;
      p.b().recv_check(UINT64_MAX, &err);
    }
    EXPECT_TRUE(p.run()) << p.violation;
    EXPECT_TRUE(err.empty()) << err;
    EXPECT_TRUE(p.ok()) << p.violation;
    EXPECT_EQ(p.b().app_recv, want);
    return collect(first);
  }
  Sizes collect(size_t first) {
    Sizes out;
    for (size_t i = first; i < p.a().log.size(); ++i)
      if (p.a().log[i].write_kind == WriteKind::kData) out.push_back(p.a().log[i].length);
    return out;
  }
  Pair p;
};

struct Golden {
  uint64_t n;
  Sizes want;
};

TEST(Segmentation, BigPeerRingSlotsDoNotCut) {
  // §2.6: 2048, 4096, 8192, 16384, 32768, 65536, 131072, ... (doubling up to
  // kMaxWrite) until the rest fits. Peer ring 1 MiB (halves of 512 KiB) so no
  // slot cuts a burst below 512 KiB.
  const Golden cases[] = {
      {1, {1}},
      {2047, {2047}},
      {2048, {2048}},
      {2049, {2048, 1}},
      {6144, {2048, 4096}},
      {6145, {2048, 4096, 1}},
      {65536, {2048, 4096, 8192, 16384, 32768, 2048}},
      {65537, {2048, 4096, 8192, 16384, 32768, 2049}},
      {200000, {2048, 4096, 8192, 16384, 32768, 65536, 70976}},
      {600000, {2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 2048, 75712}},  // the half ends
  };
  for (const Golden &g : cases) {
    Seg s(1u << 20, 2u << 20);
    EXPECT_EQ(s.send(g.n), g.want) << "n = " << g.n;
    EXPECT_EQ(model(g.n, 1u << 19, 1u << 19, 0, 2u << 20), g.want) << "model, n = " << g.n;
  }
}

TEST(Segmentation, DefaultPeerRingSlotsCut) {
  // §2.3 sender rule 3, §2.6: a message never spans two slots; with the default
  // 128 KiB ring each slot is 64 KiB.
  const Golden cases[] = {
      {65536, {2048, 4096, 8192, 16384, 32768, 2048}},  // fills H0 exactly
      {65537, {2048, 4096, 8192, 16384, 32768, 2048, 1}},
      {200000, {2048, 4096, 8192, 16384, 32768, 2048, 65536, 65536, 3392}},
  };
  for (const Golden &g : cases) {
    Seg s(kDefaultBufSize, 256u << 10);
    EXPECT_EQ(s.send(g.n), g.want) << "n = " << g.n;
    EXPECT_EQ(model(g.n, 1u << 16, 1u << 16, 0, 256u << 10), g.want) << "model, n = " << g.n;
  }
}

TEST(Segmentation, SlotCutInTheMiddleOfABurst) {
  // After 1000 bytes, slot 0 has 64 KiB - 1000 left: the sixth chunk is cut there.
  Seg s(kDefaultBufSize, 256u << 10);
  EXPECT_EQ(s.send(1000), (Sizes{1000}));
  EXPECT_EQ(s.send(100000), (Sizes{2048, 4096, 8192, 16384, 32768, 1048, 35464}));
  EXPECT_EQ(model(100000, 65536 - 1000, 65536, 1000, 256u << 10), (Sizes{2048, 4096, 8192, 16384, 32768, 1048, 35464}));
}

TEST(Segmentation, CutAtSendRingWrap) {
  // §2.6 step 2: a chunk never wraps the local send ring.
  Seg s(kDefaultBufSize, 4096);
  EXPECT_EQ(s.send(3000), (Sizes{2048, 952}));
  // 4096 more: 1096 at offset 3000 up to the wrap, then 3000 from offset 0.
  EXPECT_EQ(s.send(4096), (Sizes{1096, 3000}));
  for (const Action &a : s.p.a().log) {
    if (a.write_kind == WriteKind::kData) {
      EXPECT_LE(a.sbuf_offset + a.length, 4096u);
    }
  }
}

TEST(Segmentation, NewBurstStartsAgainAt2048) {
  Seg s(1u << 20, 2u << 20);
  EXPECT_EQ(s.send(100000), (Sizes{2048, 4096, 8192, 16384, 32768, 36512}));
  EXPECT_EQ(s.send(10000), (Sizes{2048, 4096, 3856}));
  EXPECT_EQ(s.send(2048), (Sizes{2048}));
}

TEST(Segmentation, BurstContinuesWhileDataIsPending) {
  // The doubling is kept while committed bytes are still unposted: bytes
  // committed before the queue drains join the current burst.
  Seg s(1u << 20, 2u << 20);
  const size_t first = s.p.a().log.size();
  ASSERT_EQ(s.p.a().send_pattern(3000), 3000u);
  ASSERT_EQ(s.p.poll(0, 1), 1u);  // 2048 posted, olap now 4096
  ASSERT_EQ(s.p.a().send_pattern(3000), 3000u);
  ASSERT_TRUE(s.p.run()) << s.p.violation;
  EXPECT_EQ(s.collect(first), (Sizes{2048, 3952}));
}

TEST(Segmentation, ZeroByteCommitPutsNothingOnTheWire) {
  // §2.8: rsend(len = 0) puts nothing on the wire.
  Seg s(1u << 20, 2u << 20);
  const size_t first = s.p.a().log.size();
  s.p.a().s.send_commit(0);
  ASSERT_TRUE(s.p.run());
  EXPECT_EQ(s.p.a().log.size(), first);
}

TEST(Segmentation, RandomBurstsMatchTheRule) {
  // Property: any burst size, ring size and send-ring offset gives exactly the
  // model's sizes; the harness checks that no write exceeds 64 KiB, crosses a
  // slot or leaves either ring.
  std::mt19937 rng(1234);
  const uint32_t rings[] = {4096, 1u << 16, kDefaultBufSize, 1u << 20};
  const uint32_t sbufs[] = {4096, 65536, 1u << 20, 2u << 20};
  for (int iter = 0; iter < 40; ++iter) {
    const uint32_t ring = rings[rng() % 4], sbuf = sbufs[rng() % 4];
    Seg s(ring, sbuf);
    const uint32_t pre = rng() % (sbuf / 2 + 1);  // moves slot and send-ring offsets
    if (pre) s.send(pre);
    const uint64_t n = 1 + rng() % sbuf;
    const uint32_t half = ring / 2;
    const Sizes want = model(n, half - pre % half, half, pre % sbuf, sbuf);
    const Sizes got = s.send(n);
    ASSERT_EQ(got, want) << "ring " << ring << " sbuf " << sbuf << " pre " << pre << " n " << n;
    for (uint32_t c : got) {
      EXPECT_GT(c, 0u);
      EXPECT_LE(c, kMaxWrite);
    }
    ASSERT_TRUE(s.p.ok()) << s.p.violation;
  }
}

}  // namespace
}  // namespace gpusock::wire
