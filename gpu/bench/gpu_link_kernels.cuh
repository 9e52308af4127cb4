// Kernels that move bytes between two GPU sockets, one threadblock each: a
// checked stream (every byte compared with a seeded pattern) and a ping-pong.
// Either end may be a GPU kernel on any GPU of any process (or a CPU peer
// speaking the same bytes: gpu_link's --cpu side). Used by the GPU-to-GPU
// tests (gpu/tests), by gpu_link and by the MapReduce benchmark.
//
// The stream: the sender sends `bytes` of the pattern with period `window`
// (byte i is pattern_byte(i % window, seed)), then half-closes; the receiver
// checks every byte as it lands, and at EOF answers with two 8-byte words:
// the bytes it got and how many receive pieces held a wrong byte. A stream
// kernel of B blocks runs B such streams, one connection per block: block b
// uses window bytes at buf + b * window and reports in out[b].
#pragma once

#include <gpusock/gpu.cuh>

#include "test-support/checksum.h"
#include "test-support/timing.h"

#include <stdint.h>

namespace gpusock::link {

using test::pattern_byte;

// What one kernel reports; the leader writes it, the host polls `done`.
struct LinkResult {
  int64_t bytes;   // moved (sender: acknowledged by the receiver)
  int64_t bad;     // receive pieces with a wrong byte (0: all bytes right)
  int64_t ns;      // from connected to the last byte (stream) or all rounds (ping-pong)
  int64_t rounds;  // ping-pong round trips completed
  int32_t error;   // 0 or the first negated errno
  int32_t done;    // 1 once the rest is written
  int32_t fd;      // listen kernel: the listening socket
  int32_t pad;
};

GS_HD void publish_result(LinkResult *out, const LinkResult &r) {
  if (thread_rank() != 0) return;
  out->bytes = r.bytes;
  out->bad = r.bad;
  out->ns = r.ns;
  out->rounds = r.rounds;
  out->error = r.error;
  out->fd = r.fd;
#if defined(__CUDA_ARCH__)
  __threadfence_system();  // the fields before the flag
  *reinterpret_cast<volatile int32_t *>(&out->done) = 1;
  __threadfence_system();
#else
  __atomic_store_n(&out->done, 1, __ATOMIC_RELEASE);
#endif
}

// A host-side ping-pong: round(k) for k in [0, rounds) until one returns
// false; the rounds that succeeded into out->rounds and their time into
// out->ns, from the second round on (the first sets the path up), as the
// ping-pong kernel below times its own.
template <class Round>
void timed_rounds(int64_t rounds, LinkResult *out, const Round &round) {
  const test::Stopwatch watch;
  int64_t t0 = 0;
  for (int64_t k = 0; k < rounds; ++k) {
    if (k == 1) t0 = static_cast<int64_t>(watch.seconds() * 1e9);
    if (!round(k)) break;
    out->rounds = k + 1;
  }
  out->ns = static_cast<int64_t>(watch.seconds() * 1e9) - t0;
}

// Block-cooperative connect that retries (for `seconds`) while nobody listens yet.
GS_HD int connect_retry(const channel::DeviceContext &ctx, const sockaddr_in &to, int seconds) {
  const uint64_t end = now_ns() + uint64_t(seconds) * 1000000000ull;
  int rc = -ETIMEDOUT;
  while (now_ns() < end) {
    const int s = gsocket(ctx, AF_INET, SOCK_STREAM);
    if (s < 0) return s;
    rc = gconnect(ctx, s, reinterpret_cast<const sockaddr *>(&to), sizeof to, 5000);
    if (rc == 0) return s;
    gclose(ctx, s);
    if (rc == -ESHUTDOWN) return rc;
    for (int i = 0; i < 10; ++i) pause_ns(500000);
  }
  return rc;
}

// A listening socket on `at`.
struct ListenKernel {
  channel::DeviceContext ctx;
  sockaddr_in at;
  int backlog;
  LinkResult *out;
  GS_HD void operator()() const {
    const int s = gsocket(ctx, AF_INET, SOCK_STREAM);
    int rc = s < 0 ? s : gbind(ctx, s, reinterpret_cast<const sockaddr *>(&at), sizeof at);
    if (rc == 0) rc = glisten(ctx, s, backlog);
    LinkResult r{};
    r.fd = s;
    r.error = rc;
    publish_result(out, r);
  }
};

// The connection a stream or ping-pong kernel uses: accepted on `listener`
// when it is >= 0, else connected to `to`.
GS_HD int open_link(const channel::DeviceContext &ctx, int listener, const sockaddr_in &to) {
  return listener >= 0 ? gaccept(ctx, listener, 0, 60000) : connect_retry(ctx, to, 30);
}

// Fills `window` bytes of GPU memory with the pattern (every thread of the block).
GS_HD void fill_pattern(uint8_t *buf, uint64_t window, uint64_t seed) {
  for (uint64_t i = thread_rank(); i < window; i += block_dim()) buf[i] = pattern_byte(i, seed);
  sync_block();
}

struct StreamSendKernel {
  channel::DeviceContext ctx;
  int listener;
  sockaddr_in to;
  uint64_t bytes;
  uint8_t *blocks_buf;  // window bytes of GPU memory per block (window >= 16, a multiple of 8)
  uint64_t window;
  uint64_t seed;
  LinkResult *out;
  GS_HD void operator()() const {
    uint8_t *buf = blocks_buf + block_index() * window;
    fill_pattern(buf, window, seed);
    const int s = open_link(ctx, listener, to);
    LinkResult r{};
    r.error = s < 0 ? s : 0;
    const uint64_t t0 = now_ns();
    uint64_t sent = 0;
    while (r.error == 0 && sent < bytes) {
      const uint64_t off = sent % window;
      const uint64_t want = bytes - sent < window - off ? bytes - sent : window - off;
      const ssize_t n = gsend(ctx, s, buf + off, want, 0, 60000);
      if (n <= 0) r.error = n < 0 ? static_cast<int>(n) : -EIO;
      else sent += static_cast<uint64_t>(n);
    }
    // The answer lands in GPU memory (the window, >= 16 bytes, is free now):
    // a small message may be copied by the leader alone.
    int64_t *reply = reinterpret_cast<int64_t *>(buf);
    if (s >= 0) {
      if (r.error == 0) r.error = gshutdown(ctx, s, SHUT_WR);
      const ssize_t n = r.error == 0 ? grecv(ctx, s, reply, 2 * sizeof(int64_t), MSG_WAITALL, 60000) : 0;
      if (r.error == 0 && n != static_cast<ssize_t>(2 * sizeof(int64_t)))
        r.error = n < 0 ? static_cast<int>(n) : -EPROTO;
      gclose(ctx, s);
    }
    r.ns = static_cast<int64_t>(now_ns() - t0);
    r.bytes = r.error == 0 ? reply[0] : -1;
    r.bad = r.error == 0 ? reply[1] : -1;
    publish_result(out + block_index(), r);
  }
};

struct StreamRecvKernel {
  channel::DeviceContext ctx;
  int listener;
  sockaddr_in to;
  uint8_t *blocks_buf;  // window bytes of GPU memory per block
  uint64_t window;
  uint64_t seed;
  LinkResult *out;
  GS_HD void operator()() const {
    uint8_t *buf = blocks_buf + block_index() * window;
    const int s = open_link(ctx, listener, to);
    LinkResult r{};
    r.error = s < 0 ? s : 0;
    const uint64_t t0 = now_ns();
    uint64_t got = 0;
    int64_t bad = 0;
    while (r.error == 0) {
      const uint64_t off = got % window;
      const ssize_t n = grecv(ctx, s, buf + off, window - off, 0, 60000);
      if (n == 0) break;
      if (n < 0) {
        r.error = static_cast<int>(n);
        break;
      }
      bool wrong = false;
      for (uint64_t i = thread_rank(); i < static_cast<uint64_t>(n); i += block_dim())
        wrong |= buf[off + i] != pattern_byte(off + i, seed);
      bad += BlockScope::count(wrong) > 0 ? 1 : 0;
      got += static_cast<uint64_t>(n);
    }
    r.ns = static_cast<int64_t>(now_ns() - t0);
    if (s >= 0) {
      const int64_t reply[2] = {static_cast<int64_t>(got), bad};
      const ssize_t n = r.error == 0 ? gsend(ctx, s, reply, sizeof reply, 0, 60000) : 0;
      if (r.error == 0 && n != static_cast<ssize_t>(sizeof reply)) r.error = n < 0 ? static_cast<int>(n) : -EIO;
      gclose(ctx, s);
    }
    r.bytes = static_cast<int64_t>(got);
    r.bad = bad;
    publish_result(out + block_index(), r);
  }
};

// Ping-pong of `size`-byte messages, `rounds` times. The pinger sends message k
// (the pattern with seed k) and checks that the same bytes come back; the
// ponger sends back what it got.
struct PingPongKernel {
  channel::DeviceContext ctx;
  int listener;
  sockaddr_in to;
  bool pinger;
  uint32_t size;
  int64_t rounds;
  uint8_t *buf;  // 2 * size bytes of GPU memory
  LinkResult *out;
  GS_HD void operator()() const {
    const int s = open_link(ctx, listener, to);
    LinkResult r{};
    r.error = s < 0 ? s : 0;
    uint8_t *msg = buf, *back = buf + size;
    uint64_t t0 = now_ns();
    for (int64_t k = 0; r.error == 0 && k < rounds; ++k) {
      if (k == 1) t0 = now_ns();  // the first round sets the connection up: not timed
      if (pinger) {
        for (uint32_t i = thread_rank(); i < size; i += block_dim()) msg[i] = pattern_byte(i, uint64_t(k));
        sync_block();
      }
      ssize_t n = pinger ? gsend(ctx, s, msg, size, 0, 30000) : grecv(ctx, s, back, size, MSG_WAITALL, 30000);
      if (n == static_cast<ssize_t>(size))
        n = pinger ? grecv(ctx, s, back, size, MSG_WAITALL, 30000) : gsend(ctx, s, back, size, 0, 30000);
      if (n != static_cast<ssize_t>(size)) {
        r.error = n < 0 ? static_cast<int>(n) : -EPROTO;
        break;
      }
      if (pinger) {
        bool wrong = false;
        for (uint32_t i = thread_rank(); i < size; i += block_dim()) wrong |= back[i] != msg[i];
        r.bad += BlockScope::count(wrong) > 0 ? 1 : 0;
      }
      r.rounds = k + 1;
    }
    r.ns = static_cast<int64_t>(now_ns() - t0);
    if (s >= 0) gclose(ctx, s);
    r.bytes = r.rounds * size;
    publish_result(out, r);
  }
};

}  // namespace gpusock::link
