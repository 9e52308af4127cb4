#include "proxy/channel_layout.h"

namespace gpusock::proxy {

using namespace gpusock::channel;

namespace {

constexpr size_t kLine = 64;

size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

}  // namespace

ChannelLayout plan_channel(const ChannelShape &shape) {
  ChannelLayout l;
  l.requests_bytes = size_t(shape.threads) * shape.ring_entries * sizeof(Request);

  l.status_offset = size_t(shape.threads) * sizeof(ProxyShared);
  l.inline_offset = l.status_offset + size_t(shape.sockets) * sizeof(SocketStatus);
  l.status_bytes = l.inline_offset + size_t(shape.sockets) * sizeof(InlineRecv);

  // A line of its own for each ring's counters (kCounterStride words): GPU
  // threads of different rings never contend for one.
  const size_t counters_bytes = size_t(shape.threads) * kCounterStride * sizeof(unsigned long long);
  l.claims_offset = round_up(size_t(shape.sockets) * sizeof(DeviceSocket), kLine);
  l.ticket_offset = round_up(l.claims_offset + size_t(shape.sockets) * sizeof(uint32_t), kLine);
  l.consumed_offset = l.ticket_offset + counters_bytes;
  l.cursor_offset = l.consumed_offset + counters_bytes;
  l.private_bytes = l.cursor_offset + kLine;

  l.rbuf_bytes = size_t(shape.buffer_sets) * shape.rbuf_size;
  l.sbuf_bytes = size_t(shape.buffer_sets) * shape.sbuf_size;
  return l;
}

void point_device_context(const ChannelShape &shape, const ChannelLayout &layout, const ChannelBlocks &blocks,
                          DeviceContext *ctx) {
  uint8_t *status = static_cast<uint8_t *>(blocks.status.device);
  uint8_t *priv = static_cast<uint8_t *>(blocks.priv.device);
  ctx->requests = static_cast<Request *>(blocks.requests.device);
  ctx->request_mask = shape.ring_entries - 1;
  ctx->request_rings = shape.threads;
  ctx->shared = reinterpret_cast<const ProxyShared *>(status);
  ctx->status = reinterpret_cast<const SocketStatus *>(status + layout.status_offset);
  ctx->inline_recv = reinterpret_cast<const InlineRecv *>(status + layout.inline_offset);
  ctx->sockets = reinterpret_cast<DeviceSocket *>(priv);
  ctx->claims = reinterpret_cast<uint32_t *>(priv + layout.claims_offset);
  ctx->ticket = reinterpret_cast<unsigned long long *>(priv + layout.ticket_offset);
  ctx->consumed_seen = reinterpret_cast<unsigned long long *>(priv + layout.consumed_offset);
  ctx->claim_cursor = reinterpret_cast<uint32_t *>(priv + layout.cursor_offset);
  ctx->rbufs = static_cast<uint8_t *>(blocks.rbufs.device);
  ctx->sbufs = static_cast<uint8_t *>(blocks.sbufs.device);
  ctx->rbuf_size = shape.rbuf_size;
  ctx->sbuf_size = shape.sbuf_size;
  ctx->max_sockets = shape.sockets;
  ctx->buffer_sets = shape.buffer_sets;
}

HostChannel point_host_channel(const ChannelLayout &layout, const ChannelBlocks &blocks) {
  uint8_t *status = static_cast<uint8_t *>(blocks.status.host);
  HostChannel h;
  h.requests = static_cast<Request *>(blocks.requests.host);
  h.shared = reinterpret_cast<ProxyShared *>(status);
  h.status = reinterpret_cast<SocketStatus *>(status + layout.status_offset);
  h.inline_recv = reinterpret_cast<InlineRecv *>(status + layout.inline_offset);
  h.rbufs = static_cast<uint8_t *>(blocks.rbufs.host);
  h.sbufs = static_cast<uint8_t *>(blocks.sbufs.host);
  return h;
}

}  // namespace gpusock::proxy
