// GPU socket tests: kernels written against gpusock/gpu.cuh, a proxy, and CPU
// peers (gpu_test_peer, separate processes using the gs_* API).
//
// One source, two binaries: compiled by g++ it runs every kernel on the host
// backend (ctest label gpu_host, run in CI); compiled by nvcc it runs them on
// the GPU (label gpu_device; exits 77 = skipped where there is no GPU). The
// transport comes from GPUSOCK_TRANSPORT, which ctest sets per run.
#include "gpu/tests/fixture.h"
#include "gpu/tests/harness.h"
#include "test-support/checksum.h"

#include <gpusock/gpu.cuh>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace gpusock::test {
namespace {

// ---------------------------------------------------------------- kernels

// Every scope S of the grid (a block, a warp or a thread: scope.cuh) accepts
// `conns` connections and echoes them with gpoll; one source for all three.
template <class S>
struct EchoKernel {
  DeviceContext ctx;
  int listener;
  int conns;
  uint8_t *bufs;
  uint32_t buf_size;
  gpollfd *polls;
  AgentResult *out;
  GS_HD void operator()() const {
    const unsigned agent = S::index();
    uint8_t *buf = bufs + size_t(agent) * buf_size;
    gpollfd *pf = polls + size_t(agent) * conns;
    int live = 0, err = 0;
    int64_t bytes = 0;
    for (int k = 0; k < conns; ++k) {
      const int s = gaccept<S>(ctx, listener, 0, 30000);
      if (s < 0) {
        err = s;
        break;
      }
      if (S::leader()) pf[k] = gpollfd{s, POLLIN, 0};
      ++live;
    }
    if (S::leader())
      for (int k = live; k < conns; ++k) pf[k] = gpollfd{-1, 0, 0};
    S::sync();
    while (live > 0 && err == 0) {
      const int n = gpoll<S>(ctx, pf, conns, 30000);
      if (n <= 0) {
        err = n == 0 ? -ETIMEDOUT : n;
        break;
      }
      for (int k = 0; k < conns; ++k) {
        const int fd = pf[k].fd;
        if (fd < 0 || pf[k].revents == 0) continue;
        const ssize_t got = grecv<S>(ctx, fd, buf, buf_size, MSG_DONTWAIT);
        if (got == -EAGAIN) continue;
        if (got > 0) {
          const ssize_t put = gsend<S>(ctx, fd, buf, static_cast<size_t>(got), 0, 30000);
          if (put != got) err = put < 0 ? static_cast<int>(put) : -EIO;
          else bytes += got;
          continue;
        }
        if (got < 0) err = static_cast<int>(got);
        gshutdown<S>(ctx, fd, SHUT_WR);  // the peer half-closed: so do we
        gclose<S>(ctx, fd);
        S::sync();  // every thread has read pf[k] before it changes
        if (S::leader()) pf[k].fd = -1;
        S::sync();
        --live;
      }
    }
    if (S::leader()) {
      AgentResult *r = out + agent;
      r->bytes = bytes;
      r->error = err;
      publish_i32(&r->done, 1);
    }
  }
};

// GPU client: for each size, connect to a sink, send the pattern, half-close,
// check that sending now fails with EPIPE, read the sink's "<bytes> <fnv>".
struct BulkSendKernel {
  DeviceContext ctx;
  int port;
  const uint64_t *sizes;
  int count;
  uint8_t *data;
  uint64_t max_size;
  uint32_t seed;
  int flags;  // MSG_DONTWAIT: count -EAGAIN and retry (back-pressure test)
  AgentResult *out;
  GS_HD void operator()() const {
    const unsigned b = block_index();
    uint8_t *mine = data + size_t(b) * max_size;
    for (uint64_t i = thread_rank(); i < max_size; i += block_dim()) mine[i] = pattern_byte(i, seed + b);
    sync_block();
    for (int i = 0; i < count; ++i) {
      AgentResult *r = out + size_t(b) * count + i;
      int err = 0, eagain = 0;
      const int s = connect_retry(ctx, port);
      if (s < 0) {
        if (thread_rank() == 0) {
          r->error = s;
          publish_i32(&r->done, 1);
        }
        continue;
      }
      uint64_t sent = 0;
      while (sent < sizes[i]) {
        const ssize_t n = gsend(ctx, s, mine + sent, sizes[i] - sent, flags, 30000);
        if (n == -EAGAIN) {
          ++eagain;
          if (thread_rank() == 0) publish_i32(&r->eagain, eagain);
          pause_ns(20000);
          continue;
        }
        if (n <= 0) {
          err = static_cast<int>(n);
          break;
        }
        sent += static_cast<uint64_t>(n);
        if (thread_rank() == 0) publish_i64(&r->bytes, static_cast<int64_t>(sent));
      }
      int rc = gshutdown(ctx, s, SHUT_WR);
      if (rc < 0 && err == 0) err = rc;
      const ssize_t after = gsend(ctx, s, mine, 1);
      size_t got = 0;
      for (;;) {
        const ssize_t n = grecv(ctx, s, r->reply + got, sizeof r->reply - 1 - got, 0, 30000);
        if (n == 0) break;
        if (n < 0) {
          if (err == 0) err = static_cast<int>(n);
          break;
        }
        got += static_cast<size_t>(n);
      }
      gclose(ctx, s);
      if (thread_rank() == 0) {
        r->bytes = static_cast<int64_t>(sent);
        r->value = after;
        r->error = err;
        r->eagain = eagain;
        publish_i32(&r->done, 1);
      }
    }
  }
};

// Many small sends: one byte per gsend, so one request per byte.
struct OneByteSendKernel {
  DeviceContext ctx;
  int port;
  uint64_t n;
  uint8_t *data;
  uint32_t seed;
  AgentResult *out;
  GS_HD void operator()() const {
    const unsigned b = block_index();
    uint8_t *mine = data + size_t(b) * n;
    for (uint64_t i = thread_rank(); i < n; i += block_dim()) mine[i] = pattern_byte(i, seed + b);
    sync_block();
    AgentResult *r = out + b;
    const int s = connect_retry(ctx, port);
    int err = s < 0 ? s : 0;
    uint64_t sent = 0;
    for (; err == 0 && sent < n; ++sent) {
      const ssize_t k = gsend(ctx, s, mine + sent, 1, 0, 30000);
      if (k != 1) err = k < 0 ? static_cast<int>(k) : -EIO;
    }
    if (s >= 0) {
      gshutdown(ctx, s, SHUT_WR);
      size_t got = 0;
      for (;;) {
        const ssize_t k = grecv(ctx, s, r->reply + got, sizeof r->reply - 1 - got, 0, 30000);
        if (k <= 0) {
          if (k < 0 && err == 0) err = static_cast<int>(k);
          break;
        }
        got += static_cast<size_t>(k);
      }
      gclose(ctx, s);
    }
    if (thread_rank() == 0) {
      r->bytes = static_cast<int64_t>(sent);
      r->error = err;
      publish_i32(&r->done, 1);
    }
  }
};

// GPU server for one CPU source: accept, read to EOF (chunk bytes per call,
// pausing pause_ns between calls), reply with the 8-byte count, close.
struct BulkRecvKernel {
  DeviceContext ctx;
  int listener;
  uint8_t *dst;
  uint64_t capacity;
  uint32_t chunk;
  uint32_t pause;
  AgentResult *out;
  GS_HD void operator()() const {
    const int s = gaccept(ctx, listener, 0, 30000);
    int err = s < 0 ? s : 0;
    uint64_t total = 0;
    while (err == 0 && total < capacity) {
      const uint64_t want = capacity - total < chunk ? capacity - total : chunk;
      const ssize_t n = grecv(ctx, s, dst + total, want, 0, 30000);
      if (n == 0) break;
      if (n < 0) {
        err = static_cast<int>(n);
        break;
      }
      total += static_cast<uint64_t>(n);
      if (pause) pause_ns(pause);
    }
    if (thread_rank() == 0) out->bytes = static_cast<int64_t>(total);
    sync_block();
    if (s >= 0) {
      const ssize_t n = gsend(ctx, s, &out->bytes, sizeof out->bytes, 0, 30000);
      if (n != sizeof out->bytes && err == 0) err = n < 0 ? static_cast<int>(n) : -EIO;
      gclose(ctx, s);
    }
    if (thread_rank() == 0) {
      out->error = err;
      publish_i32(&out->done, 1);
    }
  }
};

// Receives (server side) or sends (client side) until the connection fails.
struct UntilErrorKernel {
  DeviceContext ctx;
  int listener;  // >= 0: accept and receive; else connect to port and send
  int port;
  uint8_t *buf;
  uint32_t buf_size;
  AgentResult *out;
  GS_HD void operator()() const {
    const int s = listener >= 0 ? gaccept(ctx, listener, 0, 30000) : connect_retry(ctx, port);
    int64_t total = 0;
    ssize_t n = s;
    if (s >= 0) {
      for (;;) {
        n = listener >= 0 ? grecv(ctx, s, buf, buf_size, 0, 20000) : gsend(ctx, s, buf, buf_size, 0, 20000);
        if (n <= 0) break;
        total += n;
        if (thread_rank() == 0) publish_i64(&out->bytes, total);
      }
      gclose(ctx, s);
    }
    if (thread_rank() == 0) {
      out->error = static_cast<int32_t>(n);
      publish_i32(&out->done, 1);
    }
  }
};

// 32 connections to a CPU echo server, driven with one gpoll.
struct Poll32Kernel {
  static constexpr int kSockets = 32;
  DeviceContext ctx;
  int port;
  gpollfd *pf;
  uint8_t *payload;  // kSockets x 16 bytes
  uint8_t *echo;     // kSockets x 16 bytes
  int64_t *results;  // see PollOver32Sockets
  GS_HD void operator()() const {
    int err = 0;
    for (int i = 0; i < kSockets && err == 0; ++i) {
      const int s = connect_retry(ctx, port);
      if (s < 0) err = s;
      if (thread_rank() == 0) pf[i] = gpollfd{s, POLLIN, 0};
    }
    for (int i = thread_rank(); i < kSockets * 16; i += block_dim()) payload[i] = static_cast<uint8_t>(i * 7 + 3);
    sync_block();
    const int idle = gpoll(ctx, pf, kSockets, 0);  // nothing sent yet: nothing readable
    for (int i = 0; i < kSockets && err == 0; i += 2) {
      const ssize_t n = gsend(ctx, pf[i].fd, payload + i * 16, 16, 0, 10000);
      if (n != 16) err = n < 0 ? static_cast<int>(n) : -EIO;
    }
    int64_t seen_mask = 0;
    int received = 0;
    const uint64_t end = now_ns() + 20ull * 1000000000ull;
    while (err == 0 && received < kSockets / 2 && now_ns() < end) {
      const int n = gpoll(ctx, pf, kSockets, 5000);
      if (n < 0) err = n;
      for (int i = 0; i < kSockets && n > 0; ++i) {
        if (!(pf[i].revents & POLLIN)) continue;
        seen_mask |= int64_t(1) << i;
        const ssize_t got = grecv(ctx, pf[i].fd, echo + i * 16, 16, MSG_WAITALL, 5000);
        if (got != 16) err = got < 0 ? static_cast<int>(got) : -EIO;
        ++received;
        sync_block();
        if (thread_rank() == 0) pf[i].events = 0;  // counted: stop asking
        sync_block();
      }
    }
    if (thread_rank() == 0)
      for (int i = 0; i < kSockets; ++i) pf[i].events = POLLOUT;
    sync_block();
    const int writable = gpoll(ctx, pf, kSockets, 0);
    if (thread_rank() == 0)
      for (int i = 0; i < kSockets; ++i) pf[i].events = (i % 2) ? POLLIN : 0;
    sync_block();
    const uint64_t t0 = now_ns();
    const int quiet = gpoll(ctx, pf, kSockets, 100);
    const uint64_t waited = now_ns() - t0;
    for (int i = 0; i < kSockets; ++i)
      if (pf[i].fd >= 0) gclose(ctx, pf[i].fd);
    if (thread_rank() == 0) {
      results[0] = err;
      results[1] = idle;
      results[2] = received;
      results[3] = seen_mask;
      results[4] = writable;
      results[5] = quiet;
      results[6] = static_cast<int64_t>(waited);
      publish_i64(&results[7], 1);
    }
  }
};

// Error paths, one block; results[i] holds the i-th call's result.
struct ErrorsKernel {
  DeviceContext ctx;
  int closed_port;
  int listen_port;
  int second_listen_port;  // free too: listen_port + 1 may be another test's
  int64_t *results;
  GS_HD void operator()() const {
    int64_t r[16] = {};
    char byte = 0;
    r[0] = gsocket(ctx, AF_UNIX, SOCK_STREAM);
    r[1] = grecv(ctx, 1 << 30, &byte, 1);
    r[2] = gsend(ctx, -1, &byte, 1);
    const int s = gsocket(ctx, AF_INET, SOCK_STREAM);
    r[3] = s >= 0 ? 0 : s;
    r[4] = grecv(ctx, s, &byte, 1);  // not connected
    const sockaddr_in closed = loopback(closed_port);
    r[5] = gconnect(ctx, s, reinterpret_cast<const sockaddr *>(&closed), sizeof closed, 10000);
    r[6] = gclose(ctx, s);
    r[7] = gclose(ctx, s);  // twice
    const int l = gsocket(ctx, AF_INET, SOCK_STREAM | SOCK_NONBLOCK);
    const sockaddr_in any = loopback(listen_port);
    r[8] = gbind(ctx, l, reinterpret_cast<const sockaddr *>(&any), sizeof any);
    r[9] = glisten(ctx, l, 4);
    r[10] = gaccept(ctx, l);  // non-blocking listener, nobody connecting
    const int l2 = gsocket(ctx, AF_INET, SOCK_STREAM);
    const sockaddr_in any2 = loopback(second_listen_port);
    gbind(ctx, l2, reinterpret_cast<const sockaddr *>(&any2), sizeof any2);
    glisten(ctx, l2, 4);
    r[11] = gaccept(ctx, l2, 0, 50);  // blocking, with a timeout
    r[12] = gshutdown(ctx, l, 99);
    r[13] = gbind(ctx, l, nullptr, 0);
    gclose(ctx, l);
    gclose(ctx, l2);
    if (thread_rank() == 0) {
      for (int i = 0; i < 14; ++i) results[i] = r[i];
      publish_i64(&results[15], 1);
    }
  }
};

// Opens three sockets and leaves them open: a connection to connect_port with
// 1000 bytes sent, a listener on listen_port, and the connection it accepted
// with 100 bytes read. Then it returns, or traps (CUDA only), without gclose.
struct OrphanKernel {
  DeviceContext ctx;
  int connect_port;
  int listen_port;
  uint8_t *buf;
  int trap;
  AgentResult *out;
  GS_HD void operator()() const {
    for (uint32_t i = thread_rank(); i < 1000; i += block_dim()) buf[i] = static_cast<uint8_t>(i);
    sync_block();
    int err = 0;
    const int s1 = connect_retry(ctx, connect_port);
    const ssize_t sent = s1 < 0 ? s1 : gsend(ctx, s1, buf, 1000, 0, 20000);
    if (sent != 1000) err = sent < 0 ? static_cast<int>(sent) : -EIO;
    const int l = gsocket(ctx, AF_INET, SOCK_STREAM);
    const sockaddr_in a = loopback(listen_port);
    int rc = l < 0 ? l : gbind(ctx, l, reinterpret_cast<const sockaddr *>(&a), sizeof a);
    if (rc == 0) rc = glisten(ctx, l, 4);
    if (rc < 0 && err == 0) err = rc;
    const int s2 = rc < 0 ? rc : gaccept(ctx, l, 0, 20000);
    const ssize_t got = s2 < 0 ? s2 : grecv(ctx, s2, buf + 1024, 100, MSG_WAITALL, 20000);
    if (got != 100 && err == 0) err = got < 0 ? static_cast<int>(got) : -EIO;
    if (thread_rank() == 0) {
      out->value = sent;
      out->bytes = got;
      out->error = err;
      publish_i32(&out->done, 1);
    }
    sync_block();
#if defined(__CUDA_ARCH__)
    if (trap) __trap();
#endif
  }
};

// ---------------------------------------------------------------- tests

TEST_F(GpuSockets, ErrorsAreNegativeErrno) {
  start_proxy();
  std::vector<int> held;  // three different ports
  const int closed_port = free_port(&held), port = free_port(&held), second_port = free_port(&held);
  for (int fd : held) ::close(fd);
  int64_t *r = mem_.alloc<int64_t>(16);
  launch(1, kBlockThreads, ErrorsKernel{ctx_, closed_port, port, second_port, r});
  ASSERT_TRUE(wait_until([&] { return load_shared(&r[15]) == 1; }, 20000));
  EXPECT_EQ(r[0], -EAFNOSUPPORT);
  EXPECT_EQ(r[1], -EBADF);
  EXPECT_EQ(r[2], -EBADF);
  EXPECT_EQ(r[3], 0);
  EXPECT_EQ(r[4], -ENOTCONN);
  EXPECT_LT(r[5], 0) << "connect to a port nobody listens on";
  EXPECT_EQ(r[6], 0);
  EXPECT_EQ(r[7], -EBADF);
  EXPECT_EQ(r[8], 0);
  EXPECT_EQ(r[9], 0);
  EXPECT_EQ(r[10], -EAGAIN);
  EXPECT_EQ(r[11], -ETIMEDOUT);
  EXPECT_EQ(r[12], -EINVAL);
  EXPECT_EQ(r[13], -EINVAL);
}

struct EchoCase {
  unsigned blocks;
  int conns_per_block;
  int msgs;
  int max_size;
};

void PrintTo(const EchoCase &c, std::ostream *os) {
  *os << c.blocks << " blocks x " << c.conns_per_block << " connections";
}

class GpuEcho : public GpuSockets, public ::testing::WithParamInterface<EchoCase> {};

TEST_P(GpuEcho, BlocksEchoCpuClients) {
  const EchoCase c = GetParam();
  const bool small = c.max_size <= static_cast<int>(channel::kInlineSendBytes);
  ProxyOptions options;
  if (small) options.inline_messages = channel::kCtxInline;  // both inline paths, not only the default one
  start_proxy(options);
  // The sharded runs (GPUSOCK_PROXY_THREADS, ctest's *_3threads): gaccept on
  // one thread's listener into other threads' slots, each its own ring.
  if (const char *t = std::getenv("GPUSOCK_PROXY_THREADS"); t && std::atoi(t) > 1) {
    EXPECT_NE(proxy_->placement().find(std::to_string(std::atoi(t)) + " proxy threads"), std::string::npos)
        << proxy_->placement();
  }
  const int port = free_port();
  const int total = static_cast<int>(c.blocks) * c.conns_per_block;
  const int listener = gpu_listen(port, total);
  ASSERT_GE(listener, 0);
  constexpr uint32_t kBuf = 1 << 16;
  uint8_t *bufs = mem_.alloc<uint8_t>(size_t(c.blocks) * kBuf);
  gpollfd *polls = mem_.alloc<gpollfd>(size_t(total));
  AgentResult *res = mem_.alloc<AgentResult>(c.blocks);
  launch(c.blocks, kBlockThreads, EchoKernel<BlockScope>{ctx_, listener, c.conns_per_block, bufs, kBuf, polls, res});
  Peer clients({"clients", std::to_string(port), std::to_string(total), std::to_string(c.msgs),
                std::to_string(c.max_size), "7"});
  int code = -1;
  // A guard against a hang, under ctest's 120 s: on the host backend 64 blocks
  // poll on as few as two cores.
  ASSERT_TRUE(clients.wait_exit(100000, &code)) << "clients did not finish";
  EXPECT_EQ(code, 0) << "the CPU clients saw a wrong echo";
  ASSERT_TRUE(wait_until(
      [&] {
        int n = 0;
        for (unsigned b = 0; b < c.blocks; ++b) n += load_shared(&res[b].done);
        return n == static_cast<int>(c.blocks);
      },
      20000));
  int64_t bytes = 0;
  for (unsigned b = 0; b < c.blocks; ++b) {
    EXPECT_EQ(res[b].error, 0) << "block " << b << ": " << gs_status_name(res[b].error);
    bytes += res[b].bytes;
  }
  EXPECT_GT(bytes, 0);
  if (small) {
    // Small messages take the inline paths: in the request, beside the status.
    EXPECT_GT(proxy_->stats().inline_sends, 0u);
    EXPECT_GT(proxy_->stats().inline_recvs, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Blocks, GpuEcho,
                         ::testing::Values(EchoCase{1, 4, 20, 16384}, EchoCase{8, 2, 10, 16384},
                                           EchoCase{64, 1, 4, 4096}, EchoCase{2, 2, 100, 64}),
                         [](const auto &info) {
                           return std::to_string(info.param.blocks) + "_blocks" +
                                  (info.param.max_size <= 64 ? "_small" : "");
                         });

// The echo above with each warp, or each thread, its own server: the same
// kernel, another scope.
class GpuScopes : public GpuSockets {
 protected:
  template <class S>
  void echo_by_scope(unsigned blocks, unsigned per_block, int conns, const char *what) {
    start_proxy();
    const int port = free_port();
    const unsigned agents = blocks * per_block;
    const int total = static_cast<int>(agents) * conns;
    const int listener = gpu_listen(port, total);
    ASSERT_GE(listener, 0);
    constexpr uint32_t kBuf = 1 << 15;
    uint8_t *bufs = mem_.alloc<uint8_t>(size_t(agents) * kBuf);
    gpollfd *polls = mem_.alloc<gpollfd>(size_t(total));
    AgentResult *res = mem_.alloc<AgentResult>(agents);
    launch(blocks, kBlockThreads, EchoKernel<S>{ctx_, listener, conns, bufs, kBuf, polls, res});
    Peer clients({"clients", std::to_string(port), std::to_string(total), "10", "8192", "11"});
    int code = -1;
    ASSERT_TRUE(clients.wait_exit(60000, &code));
    EXPECT_EQ(code, 0);
    ASSERT_TRUE(wait_until(
        [&] {
          int n = 0;
          for (unsigned a = 0; a < agents; ++a) n += load_shared(&res[a].done);
          return n == static_cast<int>(agents);
        },
        20000));
    for (unsigned a = 0; a < agents; ++a) {
      EXPECT_EQ(res[a].error, 0) << what << " " << a << ": " << gs_status_name(res[a].error);
      EXPECT_GT(res[a].bytes, 0) << what << " " << a;
    }
  }
};

TEST_F(GpuScopes, WarpsEachOwnConnections) {
  const unsigned warps = kBlockThreads / (kBackend == Backend::kCuda ? 32 : kHostWarp);
  echo_by_scope<WarpScope>(2, warps, 2, "warp");
}

TEST_F(GpuScopes, ThreadsEachOwnConnections) { echo_by_scope<ThreadScope>(1, kBlockThreads, 1, "thread"); }

std::string expected_sink_reply(uint64_t n, uint32_t seed) {
  Fnv1a sum;
  for (uint64_t i = 0; i < n; ++i) sum.add(pattern_byte(i, seed));
  char buf[64];
  std::snprintf(buf, sizeof buf, "%" PRIu64 " %016" PRIx64, n, sum.h);
  return buf;
}

TEST_F(GpuSockets, BulkGpuToCpuWithHalfClose) {
  start_proxy();
  const int port = free_port();
  const uint64_t sizes[] = {1, 4095, 65537, (1u << 20) + 3, 16u << 20};
  const int count = 5;
  uint64_t *dev_sizes = mem_.alloc<uint64_t>(count);
  std::memcpy(dev_sizes, sizes, sizeof sizes);
  uint8_t *data = mem_.alloc<uint8_t>(16u << 20);
  AgentResult *res = mem_.alloc<AgentResult>(count);
  Peer sink({"sink", std::to_string(port), std::to_string(count)});
  run(1, kBlockThreads, BulkSendKernel{ctx_, port, dev_sizes, count, data, 16u << 20, 100, 0, res}, res, count, 90000);
  for (int i = 0; i < count; ++i) {
    EXPECT_EQ(res[i].error, 0) << sizes[i] << " B: " << gs_status_name(res[i].error);
    EXPECT_EQ(static_cast<uint64_t>(res[i].bytes), sizes[i]);
    EXPECT_EQ(res[i].value, -EPIPE) << "send after SHUT_WR";
    EXPECT_EQ(std::string(res[i].reply), expected_sink_reply(sizes[i], 100)) << sizes[i] << " B";
  }
  int code = -1;
  EXPECT_TRUE(sink.wait_exit(10000, &code));
  EXPECT_EQ(code, 0);
}

TEST_F(GpuSockets, BulkCpuToGpuWithPeerHalfClose) {
  start_proxy();
  const int port = free_port();
  const int listener = gpu_listen(port, 4);
  ASSERT_GE(listener, 0);
  const uint64_t sizes[] = {1, 65537, 16u << 20};
  uint8_t *dst = mem_.alloc<uint8_t>((16u << 20) + 1);
  for (uint64_t size : sizes) {
    AgentResult *r = mem_.alloc<AgentResult>(1);
    Peer source({"source", std::to_string(port), std::to_string(size), "5"});
    run(1, kBlockThreads, BulkRecvKernel{ctx_, listener, dst, (16u << 20) + 1, 1u << 20, 0, r}, r, 1, 60000);
    EXPECT_EQ(r->error, 0) << gs_status_name(r->error);
    ASSERT_EQ(static_cast<uint64_t>(r->bytes), size);
    uint64_t bad = size;
    for (uint64_t i = 0; i < size && bad == size; ++i)
      if (dst[i] != pattern_byte(i, 5)) bad = i;
    EXPECT_EQ(bad, size) << "first wrong byte of " << size;
    int code = -1;
    EXPECT_TRUE(source.wait_exit(10000, &code));
    EXPECT_EQ(code, 0) << "the source did not get the GPU's count back, or no EOF after it";
  }
}

TEST_F(GpuSockets, PollOver32Sockets) {
  start_proxy();
  const int port = free_port();
  Peer echo({"echo", std::to_string(port)});
  gpollfd *pf = mem_.alloc<gpollfd>(Poll32Kernel::kSockets);
  uint8_t *payload = mem_.alloc<uint8_t>(Poll32Kernel::kSockets * 16);
  uint8_t *echoed = mem_.alloc<uint8_t>(Poll32Kernel::kSockets * 16);
  int64_t *r = mem_.alloc<int64_t>(8);
  launch(1, kBlockThreads, Poll32Kernel{ctx_, port, pf, payload, echoed, r});
  ASSERT_TRUE(wait_until([&] { return load_shared(&r[7]) == 1; }, 60000));
  EXPECT_EQ(r[0], 0) << gs_status_name(static_cast<int>(r[0]));
  EXPECT_EQ(r[1], 0) << "readable before anything was sent";
  EXPECT_EQ(r[2], 16);
  EXPECT_EQ(static_cast<uint64_t>(r[3]), 0x55555555ull) << "exactly the even sockets became readable";
  EXPECT_EQ(r[4], 32) << "all sockets writable";
  EXPECT_EQ(r[5], 0) << "odd sockets got nothing";
  EXPECT_GE(r[6], 90 * 1000000) << "gpoll timed out early";
  for (int i = 0; i < Poll32Kernel::kSockets; i += 2)
    EXPECT_EQ(std::memcmp(echoed + i * 16, payload + i * 16, 16), 0) << "socket " << i;
}

TEST_F(GpuSockets, PeerKilledWhileGpuReceives) {
  start_proxy();
  const int port = free_port();
  const int listener = gpu_listen(port, 2);
  ASSERT_GE(listener, 0);
  uint8_t *buf = mem_.alloc<uint8_t>(1 << 16);
  AgentResult *r = mem_.alloc<AgentResult>(1);
  Peer blaster({"blast", std::to_string(port)});
  launch(1, kBlockThreads, UntilErrorKernel{ctx_, listener, 0, buf, 1 << 16, r});
  ASSERT_TRUE(wait_until([&] { return load_shared(&r->bytes) >= (1 << 20); }, 30000)) << "no data arrived";
  blaster.kill9();
  ASSERT_TRUE(wait_until([&] { return load_shared(&r->done) == 1; }, 25000)) << "no error after the peer died";
  EXPECT_TRUE(r->error == -ECONNRESET || r->error == -EPIPE || r->error == -EIO)
      << "a killed peer must surface as an error, not EOF: " << r->error;
}

TEST_F(GpuSockets, PeerKilledWhileGpuSends) {
  start_proxy();
  const int port = free_port();
  uint8_t *buf = mem_.alloc<uint8_t>(1 << 16);
  AgentResult *r = mem_.alloc<AgentResult>(1);
  Peer sink({"sink", std::to_string(port), "1"});
  launch(1, kBlockThreads, UntilErrorKernel{ctx_, -1, port, buf, 1 << 16, r});
  ASSERT_TRUE(wait_until([&] { return load_shared(&r->bytes) >= (1 << 20); }, 30000)) << "no data left";
  sink.kill9();
  ASSERT_TRUE(wait_until([&] { return load_shared(&r->done) == 1; }, 25000)) << "sends kept succeeding";
  EXPECT_LT(r->error, 0);
}

TEST_F(GpuSockets, RequestRingFullBackPressureLosesNothing) {
  ProxyOptions options;
  options.request_entries = 2;  // every block's doorbells contend for two entries
  start_proxy(options);
  const int port = free_port();
  const unsigned blocks = 8;
  const uint64_t n = 3000;
  uint8_t *data = mem_.alloc<uint8_t>(blocks * n);
  AgentResult *res = mem_.alloc<AgentResult>(blocks);
  Peer sink({"sink", std::to_string(port), std::to_string(blocks)});
  run(blocks, kBlockThreads, OneByteSendKernel{ctx_, port, n, data, 300, res}, res, blocks, 90000);
  for (unsigned b = 0; b < blocks; ++b) {
    EXPECT_EQ(res[b].error, 0) << "block " << b << ": " << gs_status_name(res[b].error);
    EXPECT_EQ(std::string(res[b].reply), expected_sink_reply(n, 300 + b)) << "block " << b;
  }
  EXPECT_GT(proxy_->stats().full_ring_drains, 0u) << "the request ring never filled: no back-pressure tested";
}

TEST_F(GpuSockets, SendRingFullNonBlockingLosesNothing) {
  ProxyOptions options;
  options.sbuf_size = 8192;
  options.rbuf_size = 8192;
  start_proxy(options);
  const int port = free_port();
  const uint64_t n = 1u << 21;
  uint64_t *sizes = mem_.alloc<uint64_t>(1);
  sizes[0] = n;
  uint8_t *data = mem_.alloc<uint8_t>(n);
  AgentResult *res = mem_.alloc<AgentResult>(1);
  // The sink reads nothing until told, so the rings fill whatever the speed
  // of the sender (a sanitizer, a busy machine).
  Peer sink({"sink-gated", std::to_string(port)}, "", PeerPipes{.in = true});
  launch(1, kBlockThreads, BulkSendKernel{ctx_, port, sizes, 1, data, n, 400, MSG_DONTWAIT, res});
  const bool filled = wait_until([&] { return load_shared(&res[0].eagain) > 0 || load_shared(&res[0].done); }, 60000);
  ASSERT_EQ(write(sink.stdin_fd(), "\n", 1), 1);
  const bool finished = wait_until([&] { return load_shared(&res[0].done) == 1; }, 90000);
  if (!finished) proxy_->request_kernel_stop();
  EXPECT_EQ(grid_.wait(), 0) << grid_.last_error();
  ASSERT_TRUE(finished) << "the kernel did not finish";
  EXPECT_TRUE(filled) << "no EAGAIN while nothing was read";
  EXPECT_EQ(res[0].error, 0) << gs_status_name(res[0].error);
  EXPECT_GT(res[0].eagain, 0) << "the send ring never filled";
  EXPECT_EQ(std::string(res[0].reply), expected_sink_reply(n, 400));
}

TEST_F(GpuSockets, ReceiveRingFullSlowGpuLosesNothing) {
  ProxyOptions options;
  options.rbuf_size = 8192;
  options.sbuf_size = 8192;
  start_proxy(options);
  const int port = free_port();
  const int listener = gpu_listen(port, 2);
  ASSERT_GE(listener, 0);
  const uint64_t size = 1u << 21;
  uint8_t *dst = mem_.alloc<uint8_t>(size + 1);
  AgentResult *r = mem_.alloc<AgentResult>(1);
  Peer source({"source", std::to_string(port), std::to_string(size), "9"});
  run(1, kBlockThreads, BulkRecvKernel{ctx_, listener, dst, size + 1, 1000, 20000, r}, r, 1, 90000);
  EXPECT_EQ(r->error, 0) << gs_status_name(r->error);
  ASSERT_EQ(static_cast<uint64_t>(r->bytes), size);
  uint64_t bad = size;
  for (uint64_t i = 0; i < size && bad == size; ++i)
    if (dst[i] != pattern_byte(i, 9)) bad = i;
  EXPECT_EQ(bad, size);
  int code = -1;
  EXPECT_TRUE(source.wait_exit(10000, &code));
  EXPECT_EQ(code, 0);
}

// A kernel returns with three sockets open: kernel_exited(0) closes them, the
// peers read every byte, then EOF, and the slots are free for the next kernel.
TEST_F(GpuSockets, KernelReturnsWithoutClosingPeersSeeEof) {
  ProxyOptions options;
  options.max_sockets = 8;
  start_proxy(options);
  const int port1 = free_port(), port2 = free_port();
  Peer reader({"eofwait-accept", std::to_string(port1), "1000"});
  Peer writer({"eofwait-connect", std::to_string(port2), "100"});
  uint8_t *buf = mem_.alloc<uint8_t>(4096);
  AgentResult *r = mem_.alloc<AgentResult>(1);
  run(1, kBlockThreads, OrphanKernel{ctx_, port1, port2, buf, 0, r}, r, 1, 60000);
  ASSERT_EQ(r->error, 0) << gs_status_name(r->error);
  EXPECT_EQ(proxy_->kernel_exited(0), 3) << "a connection each way and a listener were left open";
  int code1 = -1, code2 = -1;
  ASSERT_TRUE(reader.wait_exit(15000, &code1)) << "the peer of the GPU's connect hangs";
  ASSERT_TRUE(writer.wait_exit(15000, &code2)) << "the peer the GPU accepted hangs";
  EXPECT_EQ(code1, 0) << "expected all 1000 bytes, then EOF";
  EXPECT_EQ(code2, 0) << "expected EOF";
  EXPECT_EQ(proxy_->stats().orphans_closed, 3u);
  int *fds = mem_.alloc<int>(16);
  AgentResult *r2 = mem_.alloc<AgentResult>(1);
  run(1, kBlockThreads, ClaimAllKernel{ctx_, fds, 16, r2}, r2, 1, 20000);
  EXPECT_EQ(r2->value, 8) << "every slot is free again";
}

// The abort path on every backend: told that the kernel failed, the proxy
// resets what it left open; the peers see ECONNRESET (or EOF), never a hang.
TEST_F(GpuSockets, KernelFailedProxyResetsSockets) {
  start_proxy();
  const int port1 = free_port(), port2 = free_port();
  Peer reader({"eofwait-accept", std::to_string(port1)});
  Peer writer({"eofwait-connect", std::to_string(port2), "100"});
  uint8_t *buf = mem_.alloc<uint8_t>(4096);
  AgentResult *r = mem_.alloc<AgentResult>(1);
  run(1, kBlockThreads, OrphanKernel{ctx_, port1, port2, buf, 0, r}, r, 1, 60000);
  ASSERT_EQ(r->error, 0) << gs_status_name(r->error);
  EXPECT_EQ(proxy_->kernel_exited(-EIO), 3);
  int code1 = -1, code2 = -1;
  ASSERT_TRUE(reader.wait_exit(15000, &code1)) << "the peer of the GPU's connect hangs";
  ASSERT_TRUE(writer.wait_exit(15000, &code2)) << "the peer the GPU accepted hangs";
  EXPECT_TRUE(code1 == 0 || code1 == 10) << "EOF or ECONNRESET expected, exit " << code1;
  EXPECT_TRUE(code2 == 0 || code2 == 10) << "EOF or ECONNRESET expected, exit " << code2;
}

#if defined(__CUDACC__)
// The same kernel traps in a child process (a trap ends the CUDA context):
// Grid::wait() fails, kernel_exited(-EIO) resets the connections, and the
// peers see EOF or ECONNRESET, never a hang.
TEST_F(GpuSockets, KernelTrapsPeersSeeEofOrReset) {
  const int port1 = free_port(), port2 = free_port();
  Peer reader({"eofwait-accept", std::to_string(port1)});
  Peer writer({"eofwait-connect", std::to_string(port2), "100"});
  Peer child({"--orphan-child", std::to_string(port1), std::to_string(port2)}, self_binary());
  int child_code = -1, code1 = -1, code2 = -1;
  ASSERT_TRUE(child.wait_exit(60000, &child_code)) << "the trapping process hangs";
  EXPECT_EQ(child_code, 0) << "the child expected Grid::wait() to fail and 3 sockets to be closed";
  ASSERT_TRUE(reader.wait_exit(15000, &code1)) << "the peer of the GPU's connect hangs";
  ASSERT_TRUE(writer.wait_exit(15000, &code2)) << "the peer the GPU accepted hangs";
  EXPECT_TRUE(code1 == 0 || code1 == 10) << "EOF or ECONNRESET expected, exit " << code1;
  EXPECT_TRUE(code2 == 0 || code2 == 10) << "EOF or ECONNRESET expected, exit " << code2;
}

// The child of KernelTrapsPeersSeeEofOrReset: exit 0 when the kernel failed and
// the proxy closed the three sockets it left.
int orphan_child(int port1, int port2) {
  auto memory = memory_resource_for(kBackend);
  std::unique_ptr<Proxy> proxy;
  ProxyOptions options;
  options.quiet = true;
  if (Proxy::start(options, memory.get(), &proxy) < 0) return 2;
  int status = 0;
  {
    SharedMemory mem;
    uint8_t *buf = mem.alloc<uint8_t>(4096);
    AgentResult *r = mem.alloc<AgentResult>(1);
    Grid grid;
    if (grid.start(kBackend, LaunchShape{1, kBlockThreads, 0},
                   OrphanKernel{proxy->device_context(), port1, port2, buf, 1, r}) < 0)
      return 3;
    if (!wait_until([&] { return load_shared(&r->done) == 1; }, 40000)) {
      std::printf("orphan child: the kernel did not get its sockets up\n");
      status = 4;
    } else if (r->error != 0) {
      std::printf("orphan child: kernel error %s\n", gs_status_name(r->error));
      status = 5;
    }
    const int rc = grid.wait();
    std::printf("orphan child: Grid::wait() = %d (%s)\n", rc, grid.last_error());
    if (rc == 0 && status == 0) status = 6;
    const int closed = proxy->kernel_exited(rc);
    std::printf("orphan child: kernel_exited closed %d sockets\n", closed);
    if (closed != 3 && status == 0) status = 7;
  }
  proxy->stop();
  return status;
}
#endif

}  // namespace
}  // namespace gpusock::test

int main(int argc, char **argv) {
#if defined(__CUDACC__)
  if (argc == 4 && std::strcmp(argv[1], "--orphan-child") == 0)
    return gpusock::test::orphan_child(std::atoi(argv[2]), std::atoi(argv[3]));
#endif
  ::testing::InitGoogleTest(&argc, argv);
#if defined(__CUDACC__)
  if (!gpusock::cuda_available()) {
    std::printf("no CUDA device: GPU tests skipped\n");
    return 77;  // ctest SKIP_RETURN_CODE
  }
#endif
  return RUN_ALL_TESTS();
}
