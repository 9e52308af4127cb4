// gpusock GPU sockets: the channel, the memory layout the GPU and the proxy
// share, and what each side writes into it.
//
//   GPU (gpusock/gpu.cuh)                     proxy (one CPU thread per GPU)
//   ---------------------                     ------------------------------
//   Request ring    host-mapped, GPU writes   polled by the proxy (its own DRAM)
//   SocketStatus[]  proxy writes              polled by the GPU (one thread per
//   ProxyShared     proxy writes               block or warp, with back-off)
//   DeviceSocket[], claims, ticket            GPU memory, never touched by the CPU
//   receive rings / send rings                GPU memory when the transport can
//                                             register it, else pinned host memory
//
// The proxy never reads GPU memory and the GPU never reads anything the proxy
// has to read back: each side polls memory the other side writes into, and the
// request ring is a bounded multi-producer queue (a ticket counter in GPU
// memory, a sequence word per entry) so the proxy touches only entries with
// work. The proxy (gpusock/proxy.h) allocates it; the device API
// (gpusock/gpu/channel_ops.cuh) is the GPU's side.
#ifndef GPUSOCK_CHANNEL_H
#define GPUSOCK_CHANNEL_H

#include <gpusock/hd.h>

#include <stddef.h>
#include <cstddef>
#include <stdint.h>

namespace gpusock {
namespace channel {

enum Op : uint32_t {
  kOpNop = 0,       // completes at once (measures the doorbell round trip)
  kOpData = 1,      // new send_tail / recv_read; no completion
  kOpBind = 2,      // addr
  kOpListen = 3,    // arg0 = backlog
  kOpConnect = 4,   // addr; completes when the connect is under way
  kOpAccept = 5,    // slot = the new socket, arg0/arg1 = listener slot/gen
  kOpShutdown = 6,  // arg0 = SHUT_RD/SHUT_WR/SHUT_RDWR
  kOpClose = 7,     // no completion: the slot is released once the proxy is done with it
};

inline constexpr uint32_t kMaxAddrLen = 28;  // sizeof(sockaddr_in6)


// One request, written by one GPU thread (a block's or a warp's leader). The
// first cache line holds everything but the address, with seq = ticket + 1 and
// `check`, a hash of the request; the GPU writes that line with back-to-back
// 16-byte stores (after a release fence when ring bytes it wrote must be
// visible first; the address line, when there is one, before it). Every partial-line write from PCIe costs the host a
// read-modify-write of the line the proxy is polling, so the fewer the better;
// in exchange the line may become visible piece by piece, and the proxy takes
// an entry only once seq is the ticket it expects AND check matches, so neither
// a stale lap nor a half-written line ever looks new.
struct alignas(64) Request {
  uint64_t seq;
  uint32_t op;
  uint32_t slot;
  uint32_t gen;       // which socket on that slot (slots are reused)
  uint32_t ctrl_seq;  // answered in SocketStatus::ctrl_done
  uint64_t send_tail; // bytes the GPU has written into the send ring (absolute)
  uint64_t recv_read; // bytes the GPU has consumed from the receive ring (absolute)
  int32_t arg0;
  int32_t arg1;
  uint32_t addr_len;
  uint32_t reserved;
  uint64_t check;     // request_check() of the words before it
  uint8_t addr[kMaxAddrLen];  // second line: only when addr_len > 0
};
static_assert(sizeof(Request) == 128, "two cache lines");
static_assert(offsetof(Request, check) == 56 && offsetof(Request, addr) == 64, "line 0: all but the address");

// The hash of a request: words 0..6 of the first line, and with an address
// the first 4 words of the second line (the address) as well.
GS_HD uint64_t request_check(const uint64_t *words, bool with_addr) {
  uint64_t h = 0x6A09E667F3BCC909ull;
  const int n = with_addr ? 12 : 7;
  for (int i = 0; i < n; ++i) {
    if (i == 7) continue;  // check itself
    h ^= words[i];
    h *= 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
  }
  return h;
}

// SocketStatus::state bits.
enum StateBits : uint32_t {
  kStConnected = 1u << 0,    // established: data may flow
  kStFailed = 1u << 1,       // connect failed / refused: `error`
  kStRecvClosed = 1u << 2,   // no more bytes will arrive (EOF once recv_write is consumed)
  kStHangup = 1u << 3,       // the connection is gone (both directions)
  kStError = 1u << 4,        // reset, peer death or protocol violation: `error`
  kStListening = 1u << 5,
};

// Written by the proxy, polled by the GPU; one per socket slot. Counters are
// published before the state bits that depend on them, so a GPU that reads
// `state` first and the counters second never sees EOF before the last bytes.
struct alignas(64) SocketStatus {
  uint64_t recv_write;     // bytes delivered into the receive ring (absolute)
  uint64_t send_done;      // send-ring bytes the transport is finished with (absolute)
  uint32_t state;          // StateBits
  uint32_t releases;       // the slot is free when the GPU's claim count equals this
  uint32_t ctrl_done;      // ctrl_seq of the last completed request
  int32_t ctrl_result;     // its result (ctrl_done and ctrl_result: one 8-byte store)
  uint32_t buffer;         // buffer set (receive + send ring) of the connection
  uint32_t accept_queued;  // listeners: established connections waiting for gaccept
  int32_t error;           // negated errno behind kStFailed / kStError
  int32_t send_error;      // negated errno once sending is impossible (EPIPE, ECONNRESET, ...)
};
static_assert(sizeof(SocketStatus) == 64, "one cache line per socket");
static_assert(offsetof(SocketStatus, ctrl_done) % 8 == 0 && offsetof(SocketStatus, ctrl_result) == offsetof(SocketStatus, ctrl_done) + 4,
              "ctrl_done and ctrl_result form one aligned 8-byte word");

// Written by the proxy, polled by the GPU. `stop` has a line of its own that
// the proxy writes once: every waiting GPU thread reads it on every poll, and
// reads of a line the CPU keeps writing (as it does `consumed`, once per
// drained batch) queue behind each other at the host bridge.
struct alignas(64) ProxyShared {
  uint64_t consumed;  // requests taken off the ring (producers wait for room on it)
  uint8_t pad0[56];
  uint32_t stop;      // the host asked the kernel to finish
  uint8_t pad1[60];
};
static_assert(sizeof(ProxyShared) == 128 && offsetof(ProxyShared, stop) == 64, "consumed and stop: a line each");

// GPU-private state of a socket (GPU memory; only its owner block/warp uses it).
struct DeviceSocket {
  uint64_t send_tail;
  uint64_t recv_read;
  uint64_t send_done_seen;  // the last SocketStatus::send_done read (a fence followed it)
  uint32_t gen;
  uint32_t ctrl_seq;
  uint32_t flags;  // DeviceSocketFlags
  uint32_t buffer;
};

enum DeviceSocketFlags : uint32_t {
  kDevOpen = 1u << 0,
  kDevNonblocking = 1u << 1,
  kDevShutRd = 1u << 2,
  kDevShutWr = 1u << 3,
  kDevConnecting = 1u << 4,
  kDevConnectedSeen = 1u << 5,  // kStConnected was seen: gsend may trust send_done_seen
};

// Everything a kernel needs, passed by value. Pointers are as the GPU sees
// them (device pointers of host-mapped memory on CUDA; plain pointers on the
// host backend).
struct DeviceContext {
  Request *requests = nullptr;
  uint32_t request_mask = 0;  // entries - 1 (a power of two)
  const ProxyShared *shared = nullptr;
  const SocketStatus *status = nullptr;
  DeviceSocket *sockets = nullptr;
  uint32_t *claims = nullptr;        // per slot: times claimed (GPU atomics)
  unsigned long long *ticket = nullptr;  // request tickets handed out (GPU atomics)
  uint32_t *claim_cursor = nullptr;  // where the next slot search starts
  unsigned long long *consumed_seen = nullptr;  // the highest ProxyShared::consumed a producer saw
  uint8_t *rbufs = nullptr;          // buffer set i: rbufs + i * rbuf_size
  uint8_t *sbufs = nullptr;          // buffer set i: sbufs + i * sbuf_size
  uint32_t rbuf_size = 0;
  uint32_t sbuf_size = 0;
  uint32_t max_sockets = 0;
  uint32_t buffer_sets = 0;
};

}  // namespace channel

}  // namespace gpusock

#endif
