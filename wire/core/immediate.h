// The 32-bit immediate (docs/wire-protocol.md §2.2): opcode in bits 31..29, an
// opcode-specific value in bits 28..0. Host-order values here; transports carry
// them in network order (verbs) or as CQ data (libfabric).
#pragma once

#include "wire/core/defs.h"

namespace gpusock::wire {

enum class ImmOp : uint8_t {
  kData = 0,          // RS_OP_DATA: value = byte length
  kRsvdDataMore = 1,  // never sent; a receiver treats it as data
  kWrite = 2,         // local tag for riowrite; never sent; ignored
  kRsvdDraMore = 3,   // never sent; treated as data
  kSgl = 4,           // RS_OP_SGL: value = absolute credit sequence (low 16 bits)
  kRsvd = 5,          // never sent; treated as data
  kIomapSgl = 6,      // value bits 15..0 = iomap slot index
  kCtrl = 7,          // value = control code
};

enum CtrlCode : uint32_t {
  kCtrlDisconnect = 0,  // RS_CTRL_DISCONNECT
  kCtrlKeepalive = 1,   // RS_CTRL_KEEPALIVE: local wr_id tag only, never an immediate
  kCtrlShutdown = 2,    // RS_CTRL_SHUTDOWN: half-close
};

inline constexpr uint32_t kImmValueMask = 0x1FFFFFFFu;

GS_HD constexpr uint32_t make_imm(ImmOp op, uint32_t value) {
  return (static_cast<uint32_t>(op) << 29) | (value & kImmValueMask);
}
GS_HD constexpr ImmOp imm_op(uint32_t imm) { return static_cast<ImmOp>(imm >> 29); }
GS_HD constexpr uint32_t imm_value(uint32_t imm) { return imm & kImmValueMask; }

// Opcodes a receiver queues as data bytes (§2.2: 1, 3 and 5 are treated as data).
GS_HD constexpr bool imm_is_data(ImmOp op) {
  return op == ImmOp::kData || op == ImmOp::kRsvdDataMore || op == ImmOp::kRsvdDraMore || op == ImmOp::kRsvd;
}

GS_HD constexpr uint32_t imm_data(uint32_t length) { return make_imm(ImmOp::kData, length); }
GS_HD constexpr uint32_t imm_credits(uint16_t credit_seq) { return make_imm(ImmOp::kSgl, credit_seq); }
GS_HD constexpr uint32_t imm_ctrl(uint32_t code) { return make_imm(ImmOp::kCtrl, code); }

}  // namespace gpusock::wire
