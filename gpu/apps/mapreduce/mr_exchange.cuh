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

// The part a block of a mesh or exchange kernel (2 * (ranks - 1) blocks)
// plays: blocks [0, ranks - 1) send to the following workers in turn, the
// next ranks - 1 blocks receive from them.
struct BlockPeer {
  bool sends;
  int index;  // among the senders or among the receivers
  int peer;   // (rank + 1 + index) % ranks
};
GS_HD BlockPeer block_peer(int rank, int ranks) {
  const int b = static_cast<int>(gpusock::block_index());
  const bool sends = b < ranks - 1;
  const int index = sends ? b : b - (ranks - 1);
  return BlockPeer{sends, index, (rank + 1 + index) % ranks};
}

// A block's part of kernel k (k.send_part or k.recv_part); its leader writes
// the result into status[block] (host-mapped, read once the kernel ended).
template <class K>
GS_HD void run_peer_block(const K &k, int rank, int ranks, int32_t *status) {
  const BlockPeer me = block_peer(rank, ranks);
  const int rc = me.sends ? k.send_part(me) : k.recv_part(me);
  if (gpusock::thread_rank() == 0) status[gpusock::block_index()] = rc;
}

// fds: 2 * ranks ints (host-mapped, -1 at first): [d] the connection to
// worker d, [ranks + s] the one from worker s. status: one int per block.
struct MeshKernel {
  DeviceContext ctx;
  int listener, rank, ranks;
  Peers peers;
  int *fds;
  int32_t *status;
  int32_t *hello;  // ranks ints of GPU memory: where a hello lands
  GS_HD void operator()() const { run_peer_block(*this, rank, ranks, status); }
  GS_HD int send_part(const BlockPeer &me) const {  // connect, say who we are
    using namespace gpusock;
    const int s = link::connect_retry(ctx, peers.at[me.peer], 60);
    if (s < 0) return s;
    if (thread_rank() == 0) fds[me.peer] = s;
    const int32_t who = rank;
    const ssize_t n = gsend(ctx, s, &who, sizeof who, 0, 30000);
    return n == sizeof who ? 0 : n < 0 ? static_cast<int>(n) : -EIO;
  }
  GS_HD int recv_part(const BlockPeer &me) const {  // accept, learn who it is
    using namespace gpusock;
    const int s = gaccept(ctx, listener, 0, 60000);
    if (s < 0) return s;
    int32_t *slot = hello + me.index;
    const ssize_t n = grecv(ctx, s, slot, sizeof *slot, MSG_WAITALL, 30000);
    if (n != sizeof *slot) return n < 0 ? static_cast<int>(n) : -EPROTO;
    const int from = *slot;
    if (from < 0 || from >= ranks || from == rank) return -EPROTO;
    if (thread_rank() == 0) fds[ranks + from] = s;
    return 0;
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
  GS_HD void operator()() const { run_peer_block(*this, rank, ranks, status); }
  GS_HD int send_part(const BlockPeer &me) const {  // the length, then the region
    const int d = me.peer, s = fds[d];
    ssize_t n = gpusock::gsend(ctx, s, send_len + d, 8, 0, 60000);
    if (n == 8 && send_len[d] > 0) n = gpusock::gsend(ctx, s, send + d * region, send_len[d], 0, 60000);
    return n < 0 ? static_cast<int>(n) : 0;
  }
  GS_HD int recv_part(const BlockPeer &me) const {
    const int from = me.peer, s = fds[ranks + from];
    ssize_t n = gpusock::grecv(ctx, s, recv_len + from, 8, MSG_WAITALL, 60000);
    if (n != 8) return n < 0 ? static_cast<int>(n) : -EPROTO;
    const uint64_t len = recv_len[from];
    if (len > region) return -EMSGSIZE;
    if (len > 0) n = gpusock::grecv(ctx, s, recv + from * region, len, MSG_WAITALL, 60000);
    return len == 0 || n == static_cast<ssize_t>(len) ? 0 : n < 0 ? static_cast<int>(n) : -EPROTO;
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
