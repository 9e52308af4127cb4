// How MapReduce workers (one per GPU) reach each other: kernels only. Every
// worker listens; MeshKernel opens one connection to every other worker and
// accepts one from each (a 4-byte hello names the sender), keeping the
// sockets in GPU memory for later kernels. ExchangeKernel is the shuffle: all
// to all, one block per peer and direction, each region sent as an 8-byte
// length and the bytes.
#pragma once

#include <gpusock/gpu.cuh>

#include "gpu/bench/gpu_link_kernels.cuh"

#include <stdint.h>

namespace mr {

using gpusock::channel::DeviceContext;

inline constexpr int kMaxRanks = 16;

// Grid-stride loops in kernels.
GS_HD uint64_t global_thread() {
  return uint64_t(gpusock::block_index()) * gpusock::block_dim() + gpusock::thread_rank();
}
GS_HD uint64_t grid_threads() { return uint64_t(gpusock::grid_dim()) * gpusock::block_dim(); }

// Copies n bytes (GPU memory to or from host-mapped memory): how the host
// hands inputs to a GPU and takes results back, on either backend.
struct CopyKernel {
  uint8_t *dst;
  const uint8_t *src;
  uint64_t n;
  GS_HD void operator()() const {
    for (uint64_t i = global_thread(); i < n; i += grid_threads()) dst[i] = src[i];
  }
};

struct Peers {
  sockaddr_in at[kMaxRanks];  // where worker d listens
};

// fds: 2 * ranks ints of GPU memory: [d] the connection to worker d, [ranks + s]
// the one from worker s. status: one int per block (host-mapped, read once the
// kernel ended), 0 or an error.
struct MeshKernel {
  DeviceContext ctx;
  int listener, rank, ranks;
  Peers peers;
  int *fds;
  int32_t *status;
  int32_t *hello;  // ranks ints of GPU memory: where a hello lands
  GS_HD void operator()() const {
    using namespace gpusock;
    const int b = static_cast<int>(block_index());
    int rc = 0;
    if (b < ranks - 1) {
      const int d = (rank + 1 + b) % ranks;
      const int s = link::connect_retry(ctx, peers.at[d], 60);
      rc = s < 0 ? s : 0;
      if (s >= 0) {
        const int32_t me = rank;
        const ssize_t n = gsend(ctx, s, &me, sizeof me, 0, 30000);
        if (n != sizeof me) rc = n < 0 ? static_cast<int>(n) : -EIO;
        if (thread_rank() == 0) fds[d] = s;
      }
    } else {
      const int s = gaccept(ctx, listener, 0, 60000);
      rc = s < 0 ? s : 0;
      int32_t *slot = hello + (b - (ranks - 1));
      const ssize_t n = s < 0 ? 0 : grecv(ctx, s, slot, sizeof *slot, MSG_WAITALL, 30000);
      if (s >= 0 && n != sizeof *slot) rc = n < 0 ? static_cast<int>(n) : -EPROTO;
      const int from = rc == 0 ? *slot : -1;
      if (rc == 0 && (from < 0 || from >= ranks || from == rank)) rc = -EPROTO;
      if (rc == 0 && thread_rank() == 0) fds[ranks + from] = s;
    }
    if (thread_rank() == 0) status[b] = rc;
  }
};

// Closes the mesh's sockets and the listener (one block), once the job ended.
struct MeshDownKernel {
  DeviceContext ctx;
  const int *fds;
  int count, listener;
  GS_HD void operator()() const {
    for (int i = 0; i < count; ++i)
      if (fds[i] >= 0) gpusock::gclose(ctx, fds[i]);
    gpusock::gclose(ctx, listener);
  }
};

// Regions: region bytes per peer, region d of `send` goes to worker d and
// what worker s sends lands in region s of `recv`; lengths in GPU memory.
struct ExchangeKernel {
  DeviceContext ctx;
  int rank, ranks;
  const int *fds;
  const uint8_t *send;
  const unsigned long long *send_len;
  uint8_t *recv;
  unsigned long long *recv_len;
  uint64_t region;
  int32_t *status;  // as MeshKernel's
  GS_HD void operator()() const {
    using namespace gpusock;
    const int b = static_cast<int>(block_index());
    int rc = 0;
    if (b < ranks - 1) {
      const int d = (rank + 1 + b) % ranks;
      const int s = fds[d];
      ssize_t n = gsend(ctx, s, send_len + d, 8, 0, 60000);
      if (n == 8 && send_len[d] > 0) n = gsend(ctx, s, send + d * region, send_len[d], 0, 60000);
      if (n < 0) rc = static_cast<int>(n);
    } else {
      const int from = (rank + 1 + (b - (ranks - 1))) % ranks;
      const int s = fds[ranks + from];
      ssize_t n = grecv(ctx, s, recv_len + from, 8, MSG_WAITALL, 60000);
      const uint64_t len = n == 8 ? recv_len[from] : 0;
      if (n != 8) rc = n < 0 ? static_cast<int>(n) : -EPROTO;
      else if (len > region) rc = -EMSGSIZE;
      else if (len > 0) n = grecv(ctx, s, recv + from * region, len, MSG_WAITALL, 60000);
      if (rc == 0 && len > 0 && n != static_cast<ssize_t>(len)) rc = n < 0 ? static_cast<int>(n) : -EPROTO;
    }
    if (thread_rank() == 0) status[b] = rc;
  }
};

// After an exchange, where source s's records are: this GPU's own region of `send`, or what s sent.
struct Regions {
  const uint8_t *send;
  const unsigned long long *send_len;
  const uint8_t *recv;
  const unsigned long long *recv_len;
  uint64_t region;
  int rank, ranks;
  GS_HD const uint8_t *from(int s) const { return (s == rank ? send : recv) + s * region; }
  GS_HD uint64_t bytes(int s) const { return s == rank ? send_len[s] : recv_len[s]; }
};

}  // namespace mr
