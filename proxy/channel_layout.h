// Where every part of the channel the GPU and the proxy share lives
// (gpusock/channel.h): which memory block, at which offset. A plan made from
// the sizes alone, so it can be checked without a GPU or a transport; the
// proxy allocates the blocks it names and points both sides into them.
#pragma once

#include <gpusock/channel.h>
#include <gpusock/proxy.h>

#include <cstddef>
#include <cstdint>

namespace gpusock::proxy {

// What the channel is sized by.
struct ChannelShape {
  uint32_t threads = 1;       // proxy threads: a request ring and a ProxyShared each
  uint32_t ring_entries = 2;  // per request ring, a power of two
  uint32_t sockets = 1;       // socket slots: a SocketStatus and an InlineRecv each
  uint32_t buffer_sets = 1;   // receive + send rings
  uint32_t rbuf_size = 4096;  // bytes of each receive ring
  uint32_t sbuf_size = 4096;  // bytes of each send ring
};

// The five blocks and what sits where inside them.
struct ChannelLayout {
  // Host-mapped: the request rings (threads * ring_entries Requests).
  size_t requests_bytes = 0;
  // Host-mapped: ProxyShared[threads], then SocketStatus[sockets], then InlineRecv[sockets].
  size_t status_bytes = 0;
  size_t status_offset = 0;
  size_t inline_offset = 0;
  // GPU memory: DeviceSocket[sockets], claims[sockets], tickets, consumed_seen, the claim cursor.
  size_t private_bytes = 0;
  size_t claims_offset = 0;
  size_t ticket_offset = 0;
  size_t consumed_offset = 0;
  size_t cursor_offset = 0;
  // The rings: buffer_sets of each size.
  size_t rbuf_bytes = 0;
  size_t sbuf_bytes = 0;
};

ChannelLayout plan_channel(const ChannelShape &shape);

// The blocks as allocated, in the plan's order.
struct ChannelBlocks {
  MemoryBlock requests, status, priv, rbufs, sbufs;
};

// The GPU's view: every DeviceContext pointer and size but `flags`.
void point_device_context(const ChannelShape &shape, const ChannelLayout &layout, const ChannelBlocks &blocks,
                          channel::DeviceContext *ctx);

// The proxy's view of the same memory.
struct HostChannel {
  channel::Request *requests = nullptr;
  channel::ProxyShared *shared = nullptr;
  channel::SocketStatus *status = nullptr;
  channel::InlineRecv *inline_recv = nullptr;
  uint8_t *rbufs = nullptr;  // what the transport registers
  uint8_t *sbufs = nullptr;
};
HostChannel point_host_channel(const ChannelLayout &layout, const ChannelBlocks &blocks);

}  // namespace gpusock::proxy
