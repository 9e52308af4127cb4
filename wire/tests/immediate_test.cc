// Immediate data encoding (docs/wire-protocol.md §2.1, §2.2).
#include <gtest/gtest.h>

#include "wire/core/immediate.h"
#include "wire/tests/harness.h"

namespace gpusock::wire {
namespace {

TEST(Immediate, GoldenValues) {
  // §2.1 / §2.2 host values.
  EXPECT_EQ(imm_data(0), 0x00000000u);
  EXPECT_EQ(imm_data(1), 0x00000001u);
  EXPECT_EQ(imm_data(65536), 0x00010000u);
  EXPECT_EQ(imm_data(kMaxDataLength), 0x1FFFFFFFu);
  EXPECT_EQ(imm_credits(0), 0x80000000u);
  EXPECT_EQ(imm_credits(384), 0x80000180u);
  EXPECT_EQ(imm_credits(0xFFFF), 0x8000FFFFu);
  EXPECT_EQ(imm_ctrl(kCtrlDisconnect), 0xE0000000u);
  EXPECT_EQ(imm_ctrl(kCtrlShutdown), 0xE0000002u);
  EXPECT_EQ(make_imm(ImmOp::kIomapSgl, 3), 0xC0000003u);
}

TEST(Immediate, OpcodeNumbers) {
  // §2.2: opcode in bits 31..29.
  EXPECT_EQ(static_cast<int>(ImmOp::kData), 0);
  EXPECT_EQ(static_cast<int>(ImmOp::kRsvdDataMore), 1);
  EXPECT_EQ(static_cast<int>(ImmOp::kWrite), 2);
  EXPECT_EQ(static_cast<int>(ImmOp::kRsvdDraMore), 3);
  EXPECT_EQ(static_cast<int>(ImmOp::kSgl), 4);
  EXPECT_EQ(static_cast<int>(ImmOp::kRsvd), 5);
  EXPECT_EQ(static_cast<int>(ImmOp::kIomapSgl), 6);
  EXPECT_EQ(static_cast<int>(ImmOp::kCtrl), 7);
  EXPECT_EQ(kCtrlDisconnect, 0u);
  EXPECT_EQ(kCtrlKeepalive, 1u);
  EXPECT_EQ(kCtrlShutdown, 2u);
}

TEST(Immediate, OpAndValueExtraction) {
  // §2.2: bits 31..29 opcode, 28..0 value.
  for (uint32_t op = 0; op < 8; ++op) {
    for (uint32_t v : {0u, 1u, 0x1234u, 0xFFFFu, 0x10000u, 0x1FFFFFFFu}) {
      const uint32_t imm = make_imm(static_cast<ImmOp>(op), v);
      EXPECT_EQ(imm, (op << 29) | v);
      EXPECT_EQ(static_cast<uint32_t>(imm_op(imm)), op);
      EXPECT_EQ(imm_value(imm), v);
    }
  }
  EXPECT_EQ(imm_op(0xE0000002u), ImmOp::kCtrl);
  EXPECT_EQ(imm_value(0xE0000002u), 2u);
  EXPECT_EQ(imm_op(0x8000ABCDu), ImmOp::kSgl);
  EXPECT_EQ(imm_value(0x8000ABCDu), 0xABCDu);
}

TEST(Immediate, ValueIsMaskedTo29Bits) {
  // A value never leaks into the opcode bits.
  EXPECT_EQ(make_imm(ImmOp::kData, 0xFFFFFFFFu), 0x1FFFFFFFu);
  EXPECT_EQ(imm_op(make_imm(ImmOp::kData, 0x20000000u)), ImmOp::kData);
}

TEST(Immediate, ReservedOpcodes135AreData) {
  // §2.2, §9.4: opcodes 1, 3, 5 are never sent but a receiver treats them as data.
  EXPECT_TRUE(imm_is_data(ImmOp::kData));
  EXPECT_TRUE(imm_is_data(ImmOp::kRsvdDataMore));
  EXPECT_TRUE(imm_is_data(ImmOp::kRsvdDraMore));
  EXPECT_TRUE(imm_is_data(ImmOp::kRsvd));
  EXPECT_FALSE(imm_is_data(ImmOp::kWrite));
  EXPECT_FALSE(imm_is_data(ImmOp::kSgl));
  EXPECT_FALSE(imm_is_data(ImmOp::kIomapSgl));
  EXPECT_FALSE(imm_is_data(ImmOp::kCtrl));
}

TEST(Immediate, StreamQueuesReservedOpcodesAsData) {
  // §2.2: a received opcode 1/3/5 is queued as data bytes.
  wiretest::Pair p;
  ASSERT_TRUE(p.run());
  Stream &b = p.b().s;
  EXPECT_EQ(p.inject(1, 0x20000010u), 0);  // op 1, 16 bytes
  EXPECT_EQ(p.inject(1, 0x60000020u), 0);  // op 3, 32 bytes
  EXPECT_EQ(p.inject(1, 0xA0000040u), 0);  // op 5, 64 bytes
  EXPECT_EQ(b.state(), StreamState::kConnected);
  EXPECT_EQ(b.recv_available(), 16u + 32u + 64u);
}

TEST(Immediate, StreamIgnoresWriteOpAndUnknownControlCodes) {
  // §2.2: opcode 2 is a local tag (ignored); CTRL 1 (keepalive) and unknown
  // control codes are ignored.
  wiretest::Pair p;
  ASSERT_TRUE(p.run());
  Stream &b = p.b().s;
  EXPECT_EQ(p.inject(1, 0x40000000u), 0);
  EXPECT_EQ(p.inject(1, 0x40001234u), 0);
  EXPECT_EQ(p.inject(1, imm_ctrl(kCtrlKeepalive)), 0);
  EXPECT_EQ(p.inject(1, imm_ctrl(3)), 0);
  EXPECT_EQ(p.inject(1, imm_ctrl(0x1FFFFFFF)), 0);
  EXPECT_EQ(b.state(), StreamState::kConnected);
  EXPECT_TRUE(b.readable_dir());
  EXPECT_FALSE(b.recv_closed());
  EXPECT_EQ(b.recv_available(), 0u);
  EXPECT_EQ(b.send_status(), 0);
}

}  // namespace
}  // namespace gpusock::wire
