// wire/post_action.h: turns one Action of the protocol core into a call on a
// transport Endpoint. The CPU socket (wire/socket) and the GPU proxy (proxy/)
// hold the same memory per connection and both post through here.
#pragma once

#include "wire/core/stream.h"
#include "wire/transport.h"

#include <cstdint>
#include <cstring>

namespace gpusock::wire {

// The meta block of a connection: the target table the peer writes its
// adverts into, then kQpCtrlSize staging slots for outgoing control records.
inline constexpr uint32_t kMetaTableBytes = kSglSize * kSglRecordSize;

struct ConnectionMemory {
  uint8_t *sbuf = nullptr;  // send ring, registered as sbuf_mr
  MemoryRegion *sbuf_mr = nullptr;
  uint8_t *meta = nullptr;  // meta block, registered as meta_mr
  MemoryRegion *meta_mr = nullptr;
};

// Posts `a` (receives, a data write from the send ring, or a control record
// copied into the next staging slot). `ctrl_stage_next` picks that slot: at
// most kQpCtrlSize control writes are outstanding, so slots used round-robin
// are never overwritten while in flight. Returns the transport's status
// (-EAGAIN: its queue is full, post again later).
inline gs_status_t post_action(Endpoint &endpoint, const Action &a, const ConnectionMemory &memory,
                               uint32_t &ctrl_stage_next) {
  if (a.kind == ActionKind::kPostRecv) return endpoint.post_recv(a.count);
  WriteRequest w;
  w.length = a.length;
  w.remote_addr = a.remote_addr;
  w.rkey = a.rkey;
  w.imm = a.imm;
  w.has_imm = a.has_imm;
  w.token = a.token;
  w.inline_data = a.inline_ok;
  const bool data = a.write_kind == WriteKind::kData;
  if (data) {
    w.local = memory.sbuf + a.sbuf_offset;
    w.region = memory.sbuf_mr;
  } else {
    uint8_t *stage = memory.meta + kMetaTableBytes + (ctrl_stage_next % kQpCtrlSize) * kSglRecordSize;
    std::memcpy(stage, a.record, sizeof a.record);
    w.local = stage;
    w.region = memory.meta_mr;
  }
  const gs_status_t rc = endpoint.post_write(w);
  if (rc == 0 && !data) ++ctrl_stage_next;
  return rc;
}

}  // namespace gpusock::wire
