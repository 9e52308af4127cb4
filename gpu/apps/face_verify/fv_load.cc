// Face verification loader: computes the reference histogram of every
// identity's base image (fv_dataset.h) and stores it in memcached with `set`
// (text protocol), pipelined in batches over one connection per thread.
// Plain sockets: run it under gpusock's LD_PRELOAD shim to reach a memcached
// that serves over gpusock.
//
//   fv_load [--memcached 127.0.0.1:11211] [--identities 10000] [--size 128 |
//           --width W --height H] [--grid 8] [--seed 1] [--threads 4] [--batch 64]
#include "fv_dataset.h"
#include "fv_mc_client.h"
#include "fv_record.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>
#include <vector>

int main(int argc, char **argv) {
  using namespace fv;
  std::string memcached = "127.0.0.1:11211";
  DatasetParams data;
  uint32_t width = 128, height = 128, grid = kDefaultGrid;
  int threads = 4, batch = 64, timeout_ms = 10000;
  Flags flags{argc, argv};
  while (!flags.done()) {
    const std::string name = flags.name();
    if (name == "--memcached") memcached = flags.next();
    else if (name == "--identities") data.identities = static_cast<uint32_t>(flags.number());
    else if (name == "--size") width = height = static_cast<uint32_t>(flags.number());
    else if (name == "--width") width = static_cast<uint32_t>(flags.number());
    else if (name == "--height") height = static_cast<uint32_t>(flags.number());
    else if (name == "--grid") grid = static_cast<uint32_t>(flags.number());
    else if (name == "--seed") data.seed = static_cast<uint64_t>(flags.number());
    else if (name == "--threads") threads = static_cast<int>(flags.number());
    else if (name == "--batch") batch = static_cast<int>(flags.number());
    else {
      std::fprintf(stderr,
                   "usage: %s [--memcached A.B.C.D:PORT] [--identities N] [--size S | --width W --height H] "
                   "[--grid G] [--seed S] [--threads T] [--batch B]\n",
                   argv[0]);
      return 2;
    }
  }
  sockaddr_in addr{};
  const RequestHeader probe{
      kRequestMagic, kVersion, 0, 0, 0, static_cast<uint16_t>(width), static_cast<uint16_t>(height)};
  if (!parse_endpoint(memcached, &addr) || grid < 1 || grid > kMaxGrid || width > kMaxDim || height > kMaxDim ||
      validate_request(probe, grid) != kReasonNone || threads < 1 || batch < 1) {
    std::fprintf(stderr, "fv_load: bad arguments (memcached A.B.C.D:PORT, size in [%u, %u], grid in [1, %u])\n",
                 kMinDim, kMaxDim, kMaxGrid);
    return 2;
  }
  const Features f{width, height, grid};
  const uint64_t start = now_ns();
  std::atomic<uint32_t> next{0}, stored{0};
  std::atomic<int> failure{0};
  auto work = [&] {
    McClient<LibcIo> mc(addr, timeout_ms);
    std::vector<uint8_t> table(256), img(size_t(width) * height);
    build_uniform_table(table.data());
    std::vector<uint32_t> hist(f.bins());
    std::vector<McKey> keys(batch);
    std::vector<std::vector<uint8_t>> records(batch, std::vector<uint8_t>(record_bytes(grid)));
    while (!failure) {
      const uint32_t first = next.fetch_add(static_cast<uint32_t>(batch));
      if (first >= data.identities) break;
      const uint32_t n = std::min<uint32_t>(static_cast<uint32_t>(batch), data.identities - first);
      for (uint32_t i = 0; i < n; ++i) {
        base_image(data.seed, first + i, width, height, img.data());
        lbp_histogram(img.data(), f, table.data(), hist.data());
        encode_record(f, hist.data(), records[i].data());
        keys[i] = make_key(width, height, first + i);
      }
      const int rc = mc.set_many(keys.data(), n, [&](size_t i) {
        return std::pair<const uint8_t *, size_t>(records[i].data(), records[i].size());
      });
      if (rc < 0) {
        failure = rc;
        break;
      }
      stored += n;
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(work);
  for (auto &t : pool) t.join();
  const double secs = double(now_ns() - start) / 1e9;
  if (failure) {
    std::fprintf(stderr, "fv_load: memcached %s: %s after %u references\n", memcached.c_str(),
                 strerror(-failure.load()), stored.load());
    return 1;
  }
  std::printf("fv_load: stored %u references (face:%ux%u:<id>, grid %u, %zu bytes each) in %.2f s\n", stored.load(),
              width, height, grid, record_bytes(grid), secs);
  return 0;
}
