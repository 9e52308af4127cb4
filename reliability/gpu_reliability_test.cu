// GPU sockets under soak and bad input, on the host backend (or the GPU when
// compiled by nvcc): kernels open, use and close connections in churn while
// others stream to sinks, every byte checked, and the proxy's process is back
// to its baseline afterwards; the device API given bad fds, stale fds and
// wrong-sized addresses answers with a clear errno. Peers: gpu_test_peer
// ($GPUSOCK_TEST_PEER). Sizes: GS_SOAK_CONNECTIONS (default 64, over all
// blocks), GS_SOAK_BYTES (default 64 MiB over kStreamBlocks streams).
#include "gpu/tests/fixture.h"
#include "test-support/checksum.h"
#include "test-support/resources.h"

#include <gpusock/gpu.cuh>
#include <gtest/gtest.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace gpusock::test {
namespace {

constexpr unsigned kChurnBlocks = 4;
constexpr unsigned kStreamBlocks = 2;
constexpr uint32_t kMaxMessage = 16384;
constexpr uint32_t kStreamChunk = 2 * kMaxMessage;  // a stream block's buffer

GS_HD int32_t read_i32(const int32_t *p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const volatile int32_t *>(p);
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

uint64_t env_u64(const char *name, uint64_t fallback) {
  const char *v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 0) : fallback;
}

// Blocks [0, churn_blocks): `per_block` connections each to the echo peer,
// one message of 1..kMaxMessage bytes on each, the echo compared. Blocks after
// them: one stream of `stream_bytes` of the pattern to their sink, whose
// "<bytes> <fnv64>" reply lands in out[b].reply.
struct SoakKernel {
  DeviceContext ctx;
  int echo_port;
  const int *sink_ports;
  unsigned churn_blocks;
  int per_block;
  uint64_t stream_bytes;
  uint8_t *bufs;      // 2 * kMaxMessage per block
  int32_t *mismatch;  // per block: a thread found an echoed byte that differs
  AgentResult *out;

  GS_HD void churn(unsigned b, AgentResult *r) const {
    uint8_t *sent = bufs + size_t(b) * 2 * kMaxMessage, *back = sent + kMaxMessage;
    int err = 0;
    int64_t bytes = 0;
    for (int i = 0; i < per_block && err == 0; ++i) {
      const uint32_t size = 1 + (uint32_t(i) * 7919u + b * 104729u) % kMaxMessage;
      const uint64_t seed = (uint64_t(b) << 32) | uint32_t(i);
      for (uint32_t k = thread_rank() * 8; k < size; k += block_dim() * 8)
        fill_pattern(sent + k, size - k < 8 ? size - k : 8, k, seed);
      sync_block();
      const int s = connect_retry(ctx, echo_port);
      if (s < 0) {
        err = s;
        break;
      }
      const ssize_t put = gsend(ctx, s, sent, size, 0, 30000);
      const ssize_t got = put == ssize_t(size) ? grecv(ctx, s, back, size, MSG_WAITALL, 30000) : put;
      if (got != ssize_t(size)) err = got < 0 ? static_cast<int>(got) : -EIO;
      for (uint32_t k = thread_rank(); err == 0 && k < size; k += block_dim())
        if (sent[k] != back[k]) publish_i32(&mismatch[b], 1);
      sync_block();
      if (err == 0 && read_i32(&mismatch[b])) err = -EILSEQ;  // every thread sees the same
      const int rc = gclose(ctx, s);
      if (rc < 0 && err == 0) err = rc;
      bytes += got > 0 ? got : 0;
      if (thread_rank() == 0) publish_i64(&r->value, i + 1);
      sync_block();  // the leader is done with sent[] before it is refilled
    }
    if (thread_rank() == 0) {
      r->bytes = bytes;
      r->error = err;
    }
  }

  GS_HD void stream(unsigned b, AgentResult *r) const {
    uint8_t *chunk = bufs + size_t(b) * 2 * kMaxMessage;
    const int s = connect_retry(ctx, sink_ports[b - churn_blocks]);
    int err = s < 0 ? s : 0;
    uint64_t sent = 0;
    while (err == 0 && sent < stream_bytes) {
      const uint32_t n = stream_bytes - sent < kStreamChunk ? uint32_t(stream_bytes - sent) : kStreamChunk;
      for (uint32_t k = thread_rank() * 8; k < n; k += block_dim() * 8)
        fill_pattern(chunk + k, n - k < 8 ? n - k : 8, sent + k, b);
      sync_block();
      const ssize_t put = gsend(ctx, s, chunk, n, 0, 30000);
      if (put != ssize_t(n)) err = put < 0 ? static_cast<int>(put) : -EIO;
      sent += put > 0 ? uint64_t(put) : 0;
      sync_block();  // every thread is past its send before the chunk is refilled
    }
    if (s >= 0) {
      gshutdown(ctx, s, SHUT_WR);
      size_t got = 0;
      for (ssize_t k;
           got < sizeof r->reply - 1 && (k = grecv(ctx, s, r->reply + got, sizeof r->reply - 1 - got, 0, 30000)) > 0;)
        got += size_t(k);
      gclose(ctx, s);
    }
    if (thread_rank() == 0) {
      r->bytes = int64_t(sent);
      r->error = err;
    }
  }

  GS_HD void operator()() const {
    const unsigned b = block_index();
    AgentResult *r = out + b;
    if (b < churn_blocks) churn(b, r);
    else stream(b, r);
    if (thread_rank() == 0) publish_i32(&r->done, 1);
  }
};

class GpuReliability : public GpuSockets {
 protected:
  // Runs the soak kernel; every block's result checked.
  void soak(int echo_port, const std::vector<int> &sink_ports, unsigned churn_blocks, int per_block,
            uint64_t stream_bytes) {
    const unsigned blocks = churn_blocks + static_cast<unsigned>(sink_ports.size());
    int *ports = mem_.alloc<int>(sink_ports.size() + 1);
    std::copy(sink_ports.begin(), sink_ports.end(), ports);
    uint8_t *bufs = mem_.alloc<uint8_t>(size_t(blocks) * 2 * kMaxMessage);
    int32_t *mismatch = mem_.alloc<int32_t>(blocks);
    AgentResult *res = mem_.alloc<AgentResult>(blocks);
    run(blocks, kBlockThreads,
        SoakKernel{ctx_, echo_port, ports, churn_blocks, per_block, stream_bytes, bufs, mismatch, res}, res,
        static_cast<int>(blocks), 1800 * 1000);
    for (unsigned b = 0; b < blocks; ++b) {
      EXPECT_EQ(res[b].error, 0) << "block " << b << ": " << gs_status_name(res[b].error);
      if (b < churn_blocks) {
        EXPECT_EQ(res[b].value, per_block) << "block " << b;
        echoed_ += static_cast<uint64_t>(res[b].bytes);
        continue;
      }
      Fnv1a sum;
      std::vector<uint8_t> chunk(kStreamChunk);
      for (uint64_t off = 0; off < stream_bytes; off += chunk.size()) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), stream_bytes - off));
        fill_pattern(chunk.data(), n, off, b);
        sum.add(chunk.data(), n);
      }
      char expect[64];
      std::snprintf(expect, sizeof expect, "%" PRIu64 " %016" PRIx64, stream_bytes, sum.h);
      EXPECT_STREQ(res[b].reply, expect) << "stream block " << b;
      streamed_ += static_cast<uint64_t>(res[b].bytes);
    }
  }
  uint64_t echoed_ = 0, streamed_ = 0;
};

TEST_F(GpuReliability, ChurnAndStreamsLoseNothingLeakNothing) {
  const uint64_t connections = env_u64("GS_SOAK_CONNECTIONS", 64);
  const uint64_t bytes = env_u64("GS_SOAK_BYTES", uint64_t(64) << 20);
  const int per_block = static_cast<int>(connections / kChurnBlocks);
  const uint64_t per_stream = bytes / kStreamBlocks;
  start_proxy();
  const int echo_port = free_port();
  Peer echo({"echo", std::to_string(echo_port)});
  std::vector<std::unique_ptr<Peer>> sinks;
  std::vector<int> sink_ports;
  for (unsigned i = 0; i < kStreamBlocks; ++i) {
    sink_ports.push_back(free_port());
    sinks.push_back(std::make_unique<Peer>(std::vector<std::string>{"sink", std::to_string(sink_ports.back()), "1"}));
  }
  soak(echo_port, {}, 1, 1, 0);  // warm-up: the transport is up in the baseline
  const Resources base = Resources::now();
  const Stopwatch clock;
  soak(echo_port, sink_ports, kChurnBlocks, per_block, per_stream);
  const double seconds = clock.seconds();
  for (auto &sink : sinks) {
    int code = -1;
    EXPECT_TRUE(sink->wait_exit(20000, &code));
    EXPECT_EQ(code, 0);
  }
  Resources after;
  EXPECT_TRUE(back_to_baseline(base, 30, &after)) << "before: " << base.describe() << "; after: " << after.describe();
  std::printf("gpu soak %s: %d connections (%" PRIu64 " bytes echoed and checked), %" PRIu64
              " bytes streamed and checked, %.1f s; before: %s; after: %s\n",
              std::getenv("GPUSOCK_TRANSPORT") ? std::getenv("GPUSOCK_TRANSPORT") : "default",
              per_block * int(kChurnBlocks) + 1, echoed_, streamed_, seconds, base.describe().c_str(),
              after.describe().c_str());
}

// The device API given bad fds, stale fds and wrong-sized addresses, one
// block; r[i] is the i-th call's result. Nothing reaches the proxy that it
// could choke on, and the socket used for the bad calls still works after.
struct BadInputKernel {
  DeviceContext ctx;
  int port;
  int64_t *r;
  GS_HD void operator()() const {
    int64_t v[24] = {};
    char byte = 0;
    v[0] = grecv(ctx, -5, &byte, 1);
    v[1] = gsend(ctx, 1 << 20, &byte, 1);
    v[2] = gclose(ctx, 12345);
    const int stale = gsocket(ctx, AF_INET, SOCK_STREAM);
    gclose(ctx, stale);
    v[3] = gsend(ctx, stale, &byte, 1);
    v[4] = grecv(ctx, stale, &byte, 1);
    v[5] = gshutdown(ctx, stale, SHUT_RDWR);
    const sockaddr_in a = loopback(port);
    v[6] = gconnect(ctx, stale, reinterpret_cast<const sockaddr *>(&a), sizeof a, 1000);
    v[7] = glisten(ctx, stale, 4);
    const int s = gsocket(ctx, AF_INET, SOCK_STREAM);
    v[8] = gbind(ctx, s, reinterpret_cast<const sockaddr *>(&a), 1);
    v[9] = gbind(ctx, s, reinterpret_cast<const sockaddr *>(&a), sizeof a - 1);
    sockaddr_in6 six{};
    six.sin6_family = AF_INET6;
    v[10] = gbind(ctx, s, reinterpret_cast<const sockaddr *>(&six), sizeof(sockaddr_in));
    v[11] = gbind(ctx, s, nullptr, sizeof a);
    v[12] = gconnect(ctx, s, reinterpret_cast<const sockaddr *>(&a), 0, 1000);
    v[13] = gconnect(ctx, s, reinterpret_cast<const sockaddr *>(&a), 4096, 1000);
    gpollfd pf{99999, POLLIN, 0};
    v[14] = gpoll(ctx, &pf, 1, 0);
    v[15] = pf.revents;
    v[16] = gbind(ctx, s, reinterpret_cast<const sockaddr *>(&a), sizeof a);  // still usable
    v[17] = glisten(ctx, s, 4);
    v[18] = gclose(ctx, s);
    if (thread_rank() == 0) {
      for (int i = 0; i < 19; ++i) r[i] = v[i];
      publish_i64(&r[23], 1);
    }
  }
};

TEST_F(GpuReliability, BadFdsStaleFdsWrongAddressesGetClearErrors) {
  start_proxy();
  int64_t *r = mem_.alloc<int64_t>(24);
  launch(1, kBlockThreads, BadInputKernel{ctx_, free_port(), r});
  ASSERT_TRUE(wait_until([&] { return load_shared(&r[23]) == 1; }, 30000)) << "the kernel hung";
  for (int i : {0, 1, 2, 3, 4, 5, 6, 7}) EXPECT_EQ(r[i], -EBADF) << "call " << i;
  for (int i : {8, 9, 10, 11, 12, 13}) EXPECT_EQ(r[i], -EINVAL) << "call " << i;
  EXPECT_EQ(r[14], 1);
  EXPECT_EQ(r[15], POLLNVAL);
  EXPECT_EQ(r[16], 0);
  EXPECT_EQ(r[17], 0);
  EXPECT_EQ(r[18], 0);
}

}  // namespace
}  // namespace gpusock::test
