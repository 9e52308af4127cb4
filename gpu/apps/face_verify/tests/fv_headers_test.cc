// Unit tests of the face verification headers: the LBP features, the wire
// format, the stored records, the memcached text protocol, the data set, and
// the block-cooperative GPU code (on the host backend) against the serial one.
#include "fv_dataset.h"
#include "fv_kernels.cuh"
#include "fv_lbp.h"
#include "fv_memcached.h"
#include "fv_record.h"
#include "fv_wire.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace fv {
namespace {

std::vector<uint8_t> table() {
  std::vector<uint8_t> t(256);
  build_uniform_table(t.data());
  return t;
}

std::vector<uint32_t> histogram(const std::vector<uint8_t> &img, const Features &f) {
  std::vector<uint32_t> h(f.bins());
  lbp_histogram(img.data(), f, table().data(), h.data());
  return h;
}

std::vector<uint8_t> record_of(const std::vector<uint32_t> &hist, const Features &f) {
  std::vector<uint8_t> r(record_bytes(f.grid));
  encode_record(f, hist.data(), r.data());
  return r;
}

TEST(Lbp, UniformTableHas59Bins) {
  const auto t = table();
  std::set<uint8_t> bins(t.begin(), t.end());
  EXPECT_EQ(bins.size(), 59u);
  EXPECT_EQ(*bins.rbegin(), 58);
  int uniform = 0;
  for (int c = 0; c < 256; ++c) uniform += t[c] != 58;
  EXPECT_EQ(uniform, 58);  // each uniform code has a bin of its own
  EXPECT_EQ(t[0x00], 0);
  EXPECT_EQ(t[0xFF], 57);
  EXPECT_EQ(t[0x01], 1);              // one 1 at bit 0
  EXPECT_EQ(t[0x80], 8);              // one 1 at bit 7
  EXPECT_EQ(t[0x83], 1 + 8 * 2 + 7);  // three ones starting at bit 7 (7, 0, 1)
  EXPECT_EQ(t[0x05], 58);             // 00000101: four transitions
}

TEST(Lbp, CodeOfKnownNeighbourhood) {
  // Neighbours clockwise from the top-left; bit i set when neighbour i >= centre.
  const uint8_t above[3] = {9, 1, 9}, mid[3] = {1, 5, 5}, below[3] = {1, 1, 6};
  // tl 9>=5 b0, t 1 no, tr 9 b2, r 5 b3, br 6 b4, b 1 no, bl 1 no, l 1 no
  EXPECT_EQ(lbp_code(above, mid, below, 0), 0x1Du);
}

TEST(Lbp, HistogramOfFlatImageIsAllOnes) {
  const Features f{10, 10, 2};  // 8 x 8 codes, 4 x 4 per cell
  const auto h = histogram(std::vector<uint8_t>(100, 77), f);
  for (uint32_t cell = 0; cell < 4; ++cell)
    for (uint32_t b = 0; b < kBins; ++b) EXPECT_EQ(h[cell * kBins + b], b == 57 ? 16u : 0u);
}

TEST(Lbp, HistogramOfVerticalEdge) {
  // Left half 10, right half 200, 12 x 12, one cell. Every centre sees only
  // >= neighbours (0xFF) except column 6 (200, beside the edge), whose left
  // neighbours (bits 0, 6, 7) are darker: 0x3E, five ones from bit 1.
  const Features f{12, 12, 1};
  std::vector<uint8_t> img(144);
  for (int y = 0; y < 12; ++y)
    for (int x = 0; x < 12; ++x) img[y * 12 + x] = x < 6 ? 10 : 200;
  const auto h = histogram(img, f);
  EXPECT_EQ(h[57], 10u * 9);         // 9 columns of 10 rows see all >=
  EXPECT_EQ(h[1 + 8 * 4 + 1], 10u);  // 0x3E: five ones starting at bit 1
  uint32_t total = 0;
  for (uint32_t v : h) total += v;
  EXPECT_EQ(total, f.codes());
}

TEST(Lbp, ChiSquareZeroAndSymmetric) {
  const Features f{64, 64, 8};
  std::vector<uint8_t> a(64 * 64), b(64 * 64);
  base_image(1, 3, 64, 64, a.data());
  base_image(1, 4, 64, 64, b.data());
  const auto ha = histogram(a, f), hb = histogram(b, f);
  EXPECT_EQ(chi2_q16(ha.data(), record_of(ha, f).data(), f.bins()), 0u);
  const uint64_t ab = chi2_q16(ha.data(), record_of(hb, f).data(), f.bins());
  EXPECT_GT(ab, 0u);
  EXPECT_EQ(ab, chi2_q16(hb.data(), record_of(ha, f).data(), f.bins()));
  EXPECT_EQ(chi2_term_q16(3, 1), (4ull << 16) / 4);
  EXPECT_EQ(chi2_term_q16(0, 0), 0u);
}

TEST(Wire, RequestRoundTripAndValidation) {
  RequestHeader h{kRequestMagic, kVersion, 0, 0x1122334455667788ull, 4711, 128, 96};
  uint8_t bytes[kRequestHeaderBytes];
  encode_request_header(h, bytes);
  EXPECT_EQ(bytes[0], 'F');
  EXPECT_EQ(bytes[3], 'Q');
  const RequestHeader d = decode_request_header(bytes);
  EXPECT_EQ(d.request_id, h.request_id);
  EXPECT_EQ(d.identity, 4711u);
  EXPECT_EQ(request_bytes(d), kRequestHeaderBytes + 128 * 96);
  EXPECT_EQ(validate_request(d, 8), kReasonNone);

  auto with = [&](auto change) {
    RequestHeader x = h;
    change(x);
    return validate_request(x, 8);
  };
  EXPECT_EQ(with([](RequestHeader &x) { x.magic ^= 1; }), kBadMagic);
  EXPECT_EQ(with([](RequestHeader &x) { x.version = 2; }), kBadVersion);
  EXPECT_EQ(with([](RequestHeader &x) { x.flags = 1; }), kBadFlags);
  EXPECT_EQ(with([](RequestHeader &x) { x.width = 7; }), kBadSize);
  EXPECT_EQ(with([](RequestHeader &x) { x.height = 1025; }), kBadSize);
  EXPECT_EQ(with([](RequestHeader &x) { x.width = 0; }), kBadSize);
  EXPECT_EQ(with([](RequestHeader &x) { x.width = x.height = 1024; }), kReasonNone);
  EXPECT_EQ(with([](RequestHeader &x) { x.width = x.height = 8; }), kReasonNone);
  RequestHeader big = h;
  big.width = big.height = 1024;
  EXPECT_EQ(validate_request(big, 2), kBadSize);  // 511 x 511 codes per cell > 65535
}

TEST(Wire, ReplyRoundTripAndRejects) {
  Reply r{kNoMatch, kReasonNone, 99, 123456789, 3776};
  uint8_t bytes[kReplyBytes];
  encode_reply(r, bytes);
  Reply d{};
  ASSERT_TRUE(decode_reply(bytes, &d));
  EXPECT_EQ(d.verdict, kNoMatch);
  EXPECT_EQ(d.request_id, 99u);
  EXPECT_EQ(d.chi2_q16, 123456789u);
  EXPECT_EQ(d.bins, 3776u);
  bytes[0] ^= 1;
  EXPECT_FALSE(decode_reply(bytes, &d));
  encode_reply(r, bytes);
  bytes[6] = 9;  // no such verdict
  EXPECT_FALSE(decode_reply(bytes, &d));
}

TEST(Record, KeyAndHeader) {
  char key[kMaxKeyBytes];
  EXPECT_EQ(std::string(key, format_key(key, 128, 64, 4711)), "face:128x64:4711");
  EXPECT_EQ(std::string(key, format_key(key, 1024, 1024, 4294967295u)), "face:1024x1024:4294967295");
  const Features f{64, 64, 8};
  std::vector<uint8_t> img(64 * 64);
  base_image(5, 1, 64, 64, img.data());
  const auto rec = record_of(histogram(img, f), f);
  EXPECT_EQ(rec.size(), 16u + 64 * 59 * 2);
  EXPECT_TRUE(record_matches(rec.data(), rec.size(), f));
  EXPECT_FALSE(record_matches(rec.data(), rec.size(), Features{64, 64, 4}));
  EXPECT_FALSE(record_matches(rec.data(), rec.size(), Features{128, 64, 8}));
  EXPECT_FALSE(record_matches(rec.data(), rec.size() - 1, f));
}

// ---- memcached

McReply parse(const std::string &s, const std::string &key = "face:8x8:1", size_t max = 1000) {
  return mc_parse_get(reinterpret_cast<const uint8_t *>(s.data()), s.size(), key.data(), key.size(), max);
}

TEST(Memcached, FormatsCommands) {
  char out[kMcMaxLine];
  EXPECT_EQ(std::string(out, mc_format_get(out, "face:8x8:1", 10)), "get face:8x8:1\r\n");
  EXPECT_EQ(std::string(out, mc_format_set_line(out, "k", 1, 7568)), "set k 0 0 7568\r\n");
}

TEST(Memcached, ParsesHitAndMiss) {
  const std::string hit = "VALUE face:8x8:1 0 5\r\nabcde\r\nEND\r\n";
  McReply r = parse(hit + "END\r\n");  // the next reply's bytes may follow
  EXPECT_EQ(r.status, kMcHit);
  EXPECT_EQ(r.total, hit.size());
  EXPECT_EQ(hit.substr(r.data_offset, r.data_len), "abcde");
  r = parse("VALUE face:8x8:1 42 5 987654\r\nab\r\nd\r\nEND\r\n");  // with a cas field; data may hold CRLF
  EXPECT_EQ(r.status, kMcHit);
  EXPECT_EQ(r.data_len, 5u);
  r = parse("END\r\n");
  EXPECT_EQ(r.status, kMcMiss);
  EXPECT_EQ(r.total, 5u);
  EXPECT_EQ(parse("VALUE face:8x8:1 0 0\r\n\r\nEND\r\n").status, kMcHit);
}

TEST(Memcached, EveryPrefixNeedsMore) {
  for (const std::string s : {"VALUE face:8x8:1 0 5\r\nabcde\r\nEND\r\n", "END\r\n"}) {
    for (size_t n = 0; n < s.size(); ++n) EXPECT_EQ(parse(s.substr(0, n)).status, kMcNeedMore) << n;
    EXPECT_GT(parse(s).status, 0);
  }
  EXPECT_EQ(parse("VALUE face:8x8:1 0 5\r\nab").total, 34u);  // known once the line is in
}

TEST(Memcached, RejectsGarbage) {
  for (const std::string s :
       {"ERROR\r\n", "SERVER_ERROR out of memory\r\n", "CLIENT_ERROR bad\r\n", "STORED\r\n", "EN\n",
        "VALUE face:8x8:2 0 5\r\nabcde\r\nEND\r\n",   // another key
        "VALUE face:8x8:10 0 5\r\nabcde\r\nEND\r\n",  // a longer key
        "VALUE face:8x8:1 0 -5\r\nabcde\r\nEND\r\n", "VALUE face:8x8:1 x 5\r\nabcde\r\nEND\r\n",
        "VALUE face:8x8:1 0\r\nabcde\r\nEND\r\n", "VALUE face:8x8:1 0 5 \r\nabcde\r\nEND\r\n",
        "VALUE face:8x8:1 0 5\r\nabcdeXYEND\r\n",    // no CRLF after the data
        "VALUE face:8x8:1 0 5\r\nabcde\r\nEND\r\r",  // bad trailer
        "VALUE face:8x8:1 0 5\rXabcde\r\nEND\r\n",   // bad line end
        "VALUE face:8x8:1 0 1001\r\n",               // over the limit
        "VALUE face:8x8:1 0 99999999999999999999\r\n"}) {
    EXPECT_EQ(parse(s).status, kMcError) << s;
  }
  EXPECT_EQ(parse("VALUE " + std::string(200, 'k')).status, kMcError);  // a header line without end
}

TEST(Memcached, ParsesStored) {
  auto stored = [](const std::string &s) {
    return mc_parse_stored(reinterpret_cast<const uint8_t *>(s.data()), s.size()).status;
  };
  EXPECT_EQ(stored("STORED\r\n"), kMcStored);
  EXPECT_EQ(stored("STOR"), kMcNeedMore);
  EXPECT_EQ(stored("NOT_STORED\r\n"), kMcError);
  EXPECT_EQ(stored("SERVER_ERROR object too large for cache\r\n"), kMcError);
}

// ---- the data set

TEST(Dataset, DeterministicAndSeparable) {
  DatasetParams p;
  p.identities = 50;
  std::vector<uint8_t> a(64 * 64), b(64 * 64);
  probe_image(p.seed, 7, 3, 64, 64, a.data());
  probe_image(p.seed, 7, 3, 64, 64, b.data());
  EXPECT_EQ(a, b);
  int kinds[3] = {};
  for (uint64_t i = 0; i < 200; ++i) ++kinds[static_cast<int>(request_plan(p, i).kind)];
  EXPECT_GT(kinds[0], 0);
  EXPECT_GT(kinds[1], 0);
  EXPECT_GT(kinds[2], 0);
  for (uint32_t size : {64u, 128u}) {
    const Features f{size, size, kDefaultGrid};
    std::vector<uint8_t> img(size * size);
    for (uint64_t i = 0; i < 40; ++i) {
      const RequestPlan r = request_plan(p, i);
      if (r.kind == RequestKind::kUnknown) {
        EXPECT_GE(r.claimed, p.identities);
        continue;
      }
      probe_image(p.seed, r.source, r.variant, size, size, img.data());
      const auto probe = histogram(img, f);
      base_image(p.seed, r.claimed, size, size, img.data());
      const uint64_t chi2 = chi2_q16(probe.data(), record_of(histogram(img, f), f).data(), f.bins());
      EXPECT_EQ(decide(chi2, f.bins(), kDefaultThresholdQ16), r.kind == RequestKind::kGenuine ? kMatch : kNoMatch)
          << "size " << size << " request " << i << " distance " << chi2 / 65536.0 / f.bins();
    }
  }
}

// ---- the block-cooperative code on the host backend equals the serial code

struct HistogramKernel {
  const uint8_t *img;
  Features f;
  const uint8_t *record;
  uint8_t *host_scratch;
  uint32_t *hist_out;
  unsigned long long *chi2_out;
  GS_HD void operator()() const {
    const BlockScratch s = block_scratch(host_scratch);
    block_init_table(s);
    block_histogram(img, f, s);
    const uint64_t chi2 = block_chi2(record, f, s);
    for (uint32_t i = gpusock::thread_rank(); i < f.bins(); i += gpusock::block_dim()) hist_out[i] = s.hist[i];
    if (gpusock::thread_rank() == 0) *chi2_out = chi2;
  }
};

TEST(Kernels, BlockHistogramAndChi2EqualSerial) {
  for (const Features f : {Features{64, 64, 8}, Features{37, 91, 5}, Features{130, 66, 12}}) {
    std::vector<uint8_t> img(f.width * f.height), ref(f.width * f.height);
    probe_image(9, 2, 1, f.width, f.height, img.data());
    base_image(9, 3, f.width, f.height, ref.data());
    const auto expect = histogram(img, f);
    const auto record = record_of(histogram(ref, f), f);
    std::vector<uint8_t> scratch(kHostScratchBytes);
    std::vector<uint32_t> got(f.bins());
    unsigned long long chi2 = 0;
    gpusock::Grid grid;
    ASSERT_EQ(grid.start(gpusock::Backend::kHost, {1, 8},
                         HistogramKernel{img.data(), f, record.data(), scratch.data(), got.data(), &chi2}),
              0);
    ASSERT_EQ(grid.wait(), 0);
    EXPECT_EQ(got, expect);
    EXPECT_EQ(chi2, chi2_q16(expect.data(), record.data(), f.bins()));
  }
}

}  // namespace
}  // namespace fv
