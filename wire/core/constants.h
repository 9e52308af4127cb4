// rsocket protocol constants (docs/wire-protocol.md §2.10). Names follow
// rdma-core's so a reader can match them against rsocket.c.
#pragma once

#include "wire/core/defs.h"

namespace gpusock::wire {

inline constexpr uint8_t kRsVersion = 1;          // §1.3: the only version ever defined
inline constexpr uint8_t kConnFlagNet = 0x01;     // sender host is big-endian
inline constexpr uint8_t kConnFlagIomap = 0x02;   // iomap table present (x86 sends 0x02)
inline constexpr uint32_t kConnRecordSize = 40;   // §1.3
inline constexpr uint32_t kSglSize = 2;           // RS_SGL_SIZE: target SGL slots
inline constexpr uint32_t kSglRecordSize = 16;    // RS_MAX_CTRL_MSG: {addr, key, length}
inline constexpr uint32_t kIomapRecordSize = 24;  // {offset, addr, key, length}
inline constexpr uint32_t kOlapStartSize = 2048;  // RS_OLAP_START_SIZE
inline constexpr uint32_t kMaxTransfer = 65536;   // RS_MAX_TRANSFER (rsocket's largest write; TCP_MAXSEG)
// The largest data write gpusock posts. rsocket's own sender stops at
// RS_MAX_TRANSFER, but a receiver (rsocket's and ours) takes any length within
// the slot it advertised (§2.6), so larger rings carry larger writes: fewer
// posts and completions per byte (docs/performance.md, "Streaming").
inline constexpr uint32_t kMaxWrite = 1u << 19;
inline constexpr uint32_t kSndLowat = 2048;     // RS_SNDLOWAT
inline constexpr uint16_t kQpMinSize = 16;      // RS_QP_MIN_SIZE
inline constexpr uint16_t kQpMaxSize = 0xFFFE;  // RS_QP_MAX_SIZE
inline constexpr uint32_t kQpCtrlSize = 4;      // RS_QP_CTRL_SIZE: outstanding control msgs
inline constexpr uint32_t kMsgSize = 4;         // RS_MSG_SIZE: iWARP message word
inline constexpr uint16_t kDefaultSqSize = 384;
inline constexpr uint16_t kDefaultRqSize = 384;
inline constexpr uint32_t kDefaultInline = 64;
inline constexpr uint32_t kDefaultBufSize = 1u << 17;  // mem_default / wmem_default
inline constexpr uint32_t kMaxDataLength = (1u << 29) - 1;

// Our own bound on outstanding writes per connection: the core keeps one small
// entry per outstanding write in a fixed array, so sq_size is clamped to this.
inline constexpr uint32_t kMaxSendQueue = 1024;

}  // namespace gpusock::wire
