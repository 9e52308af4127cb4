// gpusock GPU sockets: the channel, the memory layout the GPU and the proxy
// share, and what each side writes into it.
//
//   GPU (gpusock/gpu.cuh)                     proxy (CPU threads per GPU, 1 by default)
//   ---------------------                     ------------------------------
//   Request rings   host-mapped, GPU writes   polled by the proxy (its own DRAM; a ring per thread)
//   SocketStatus[]  proxy writes              polled by the GPU (one thread per
//   InlineRecv[]    proxy writes               block or warp, with back-off)
//   ProxyShared     proxy writes
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
  kOpNop = 0,         // completes at once (measures the doorbell round trip)
  kOpData = 1,        // new send_tail / recv_read; no completion
  kOpBind = 2,        // addr
  kOpListen = 3,      // arg0 = backlog
  kOpConnect = 4,     // addr; completes when the connect is under way
  kOpAccept = 5,      // slot = the new socket, arg0/arg1 = listener slot/gen
  kOpShutdown = 6,    // arg0 = SHUT_RD/SHUT_WR/SHUT_RDWR
  kOpClose = 7,       // no completion: the slot is released once the proxy is done with it
  kOpDataInline = 8,  // kOpData whose newest arg0 send bytes ride in the second line (payload):
                      // the proxy writes them into the send ring (no ring write, no fence on the GPU)
};

inline constexpr uint32_t kMaxAddrLen = 28;        // sizeof(sockaddr_in6)
inline constexpr uint32_t kInlineSendBytes = 64;   // a kOpDataInline payload: the second line
inline constexpr uint32_t kInlineRecvBytes = 104;  // InlineRecv::data

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
  uint32_t gen;        // which socket on that slot (slots are reused)
  uint32_t ctrl_seq;   // answered in SocketStatus::ctrl_done
  uint64_t send_tail;  // bytes the GPU has written into the send ring (absolute)
  uint64_t recv_read;  // bytes the GPU has consumed from the receive ring (absolute)
  int32_t arg0;
  int32_t arg1;
  uint32_t addr_len;
  uint32_t reserved;
  uint64_t check;                       // request_check() of the words before it (and of the second line's used words)
  union {                               // second line, when used
    uint8_t addr[kMaxAddrLen];          // addr_len > 0 (bind, connect)
    uint8_t payload[kInlineSendBytes];  // kOpDataInline: arg0 bytes
  };
};
static_assert(sizeof(Request) == 128, "two cache lines");
static_assert(offsetof(Request, check) == 56 && offsetof(Request, addr) == 64, "line 0: all but the second line");

// One step of the hash the channel's self-validating records use.
GS_HD uint64_t channel_mix(uint64_t h, uint64_t word) {
  h ^= word;
  h *= 0x9E3779B97F4A7C15ull;
  return h ^ (h >> 29);
}

// How many words of a request's second line are in use (and hashed): the
// address (4), an inline payload (up to 8), or none. From a line that may be
// torn: never more than the line holds.
GS_HD int request_line1_words(const Request &r) {
  if (r.op == kOpDataInline)
    return r.arg0 > 0 && r.arg0 <= static_cast<int32_t>(kInlineSendBytes) ? (r.arg0 + 7) / 8 : 0;
  return r.addr_len > 0 ? 4 : 0;
}

// The hash of a request: words 0..6 of the first line, and the used words of
// the second line.
// The same value both ways: on a GPU every loop runs a fixed number of times
// and indexes with constants, so the words stay in registers (a loop to
// line1_words would put them in local memory, on the path of every request;
// words 8-15 are read even when unused); the proxy, which checks every request
// of every GPU thread, mixes only the words in use.
GS_HD uint64_t request_check(const uint64_t *words, int line1_words) {
  uint64_t h = 0x6A09E667F3BCC909ull;
  for (int i = 0; i < 7; ++i) h = channel_mix(h, words[i]);
#if defined(__CUDA_ARCH__)
  for (int i = 0; i < 8; ++i) {
    const uint64_t mixed = channel_mix(h, words[8 + i]);
    h = i < line1_words ? mixed : h;
  }
#else
  for (int i = 0; i < line1_words; ++i) h = channel_mix(h, words[8 + i]);
#endif
  return h;
}

// SocketStatus::state bits.
enum StateBits : uint32_t {
  kStConnected = 1u << 0,   // established: data may flow
  kStFailed = 1u << 1,      // connect failed / refused: `error`
  kStRecvClosed = 1u << 2,  // no more bytes will arrive (EOF once recv_write is consumed)
  kStHangup = 1u << 3,      // the connection is gone (both directions)
  kStError = 1u << 4,       // reset, peer death or protocol violation: `error`
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
static_assert(offsetof(SocketStatus, ctrl_done) % 8 == 0 &&
                  offsetof(SocketStatus, ctrl_result) == offsetof(SocketStatus, ctrl_done) + 4,
              "ctrl_done and ctrl_result form one aligned 8-byte word");

// Written by the proxy, polled by the GPU. `stop` has a line of its own that
// the proxy writes once: every waiting GPU thread reads it on every poll, and
// reads of a line the CPU keeps writing (as it does `consumed`, once per
// drained batch) queue behind each other at the host bridge.
struct alignas(64) ProxyShared {
  uint64_t consumed;  // requests taken off the ring (producers wait for room on it)
  uint8_t pad0[56];
  uint32_t stop;  // the host asked the kernel to finish
  uint8_t pad1[60];
};
static_assert(sizeof(ProxyShared) == 128 && offsetof(ProxyShared, stop) == 64, "consumed and stop: a line each");

// The newest bytes of a socket's receive ring, copied by the proxy beside the
// status line when all the GPU has not consumed fits (a request, a reply):
// the GPU reads it with the status line, in the same PCIe round trip, and
// needs no second read of the ring. Written by the proxy, read by the GPU
// without ordering: `check` says whether what it read is whole (a record
// caught half-written, or a stale one, fails it and the GPU reads the ring).
struct alignas(64) InlineRecv {
  uint64_t start;   // absolute receive-ring position of data[0]
  uint32_t length;  // bytes in data (0: nothing)
  uint32_t reserved;
  uint8_t data[kInlineRecvBytes];
  uint64_t check;  // inline_check() of the 15 words before it
};
static_assert(sizeof(InlineRecv) == 128 && offsetof(InlineRecv, check) == 120, "two lines, check last");

GS_HD uint64_t inline_check(const uint64_t *words) {
  uint64_t h = 0xBB67AE8584CAA73Bull;
  for (int i = 0; i < 15; ++i) h = channel_mix(h, words[i]);
  return h;
}

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

enum ContextFlags : uint32_t {
  kCtxInlineRecv = 1u << 0,  // small received messages ride in InlineRecv beside the status (off: the ring)
  kCtxInlineSend = 1u << 1,  // small sent messages ride in their request (off: through the send ring)
  kCtxInline = kCtxInlineRecv | kCtxInlineSend,
};

// Everything a kernel needs, passed by value. Pointers are as the GPU sees
// them (device pointers of host-mapped memory on CUDA; plain pointers on the
// host backend).
// Request rings: one per proxy thread (ProxyOptions::threads); socket slot s
// posts on ring proxy_thread_of(s, request_rings), so each thread reads only
// its own. Ring q
// is requests[q * (request_mask + 1) ...], its ticket and consumed_seen are
// ticket[q * kCounterStride] and consumed_seen[q * kCounterStride] (a line
// each), its `consumed` is shared[q].consumed; `stop` is shared[0].stop.
inline constexpr uint32_t kCounterStride = 8;

// The proxy thread (and request ring) of socket slot s: the one mapping the
// GPU's posts and the proxy's threads share.
GS_HD uint32_t proxy_thread_of(uint32_t slot, uint32_t threads) { return threads > 1 ? slot % threads : 0; }

struct DeviceContext {
  Request *requests = nullptr;
  uint32_t request_mask = 0;   // entries - 1 per ring (a power of two)
  uint32_t request_rings = 1;  // one per proxy thread
  const ProxyShared *shared = nullptr;
  const SocketStatus *status = nullptr;
  const InlineRecv *inline_recv = nullptr;  // per slot, beside status
  DeviceSocket *sockets = nullptr;
  uint32_t *claims = nullptr;                   // per slot: times claimed (GPU atomics)
  unsigned long long *ticket = nullptr;         // request tickets handed out, per ring (GPU atomics)
  uint32_t *claim_cursor = nullptr;             // where the next slot search starts
  unsigned long long *consumed_seen = nullptr;  // per ring, the highest ProxyShared::consumed a producer saw
  uint8_t *rbufs = nullptr;                     // buffer set i: rbufs + i * rbuf_size
  uint8_t *sbufs = nullptr;                     // buffer set i: sbufs + i * sbuf_size
  uint32_t rbuf_size = 0;
  uint32_t sbuf_size = 0;
  uint32_t max_sockets = 0;
  uint32_t buffer_sets = 0;
  uint32_t flags = kCtxInline;  // ContextFlags: the proxy's defaults; a kernel may get a copy with fewer
};

}  // namespace channel

}  // namespace gpusock

#endif
