// The sans-I/O rsocket stream protocol core: one connection endpoint.
//
// It turns events (the peer's connection record, received immediates, write
// completions, application sends/receives/shutdown) into actions (post an RDMA
// write with immediate to an address/key, post receives) that a transport
// executes. It never performs I/O, never allocates, and compiles for host and
// device. The byte buffers (send ring, receive ring, target table) belong to the
// caller; the core only computes offsets into them, except that it reads the
// 2-slot target table the peer writes adverts into.
//
// References (§N.N) are to sections of docs/wire-protocol.md.
#pragma once

#include "wire/core/conn_record.h"
#include "wire/core/immediate.h"

namespace gpusock::wire {

struct StreamConfig {
  uint32_t rbuf_size = kDefaultBufSize;  // receive ring; even; advertised in halves
  uint32_t sbuf_size = kDefaultBufSize;  // send ring
  uint16_t sq_size = kDefaultSqSize;     // clamped to [kQpMinSize, kMaxSendQueue]
  uint16_t rq_size = kDefaultRqSize;     // clamped to [kQpMinSize, kQpMaxSize]; = credits granted
  uint32_t inline_size = kDefaultInline;
  // iWARP (§2.11, RS_OPT_MSG_SEND): the transport has no write-with-immediate and
  // sends each message as a write plus a 4-byte send, so every message takes two
  // send-queue slots and two control credits.
  bool msg_send = false;
  // The transport takes immediates without posted receives (libfabric shm:
  // TransportCaps::needs_recv_posts false): no kPostRecv action is produced.
  bool posts_receives = true;
};

// Where the peer must write: our receive ring and target table, as registered.
struct LocalLayout {
  uint64_t rbuf_remote_addr = 0;
  uint32_t rbuf_rkey = 0;
  uint64_t table_remote_addr = 0;
  uint32_t table_rkey = 0;
  // Our target table in local memory (kSglSize entries, host order). The peer
  // RDMA-writes adverts into it; the core reads it and clears consumed slots.
  volatile TargetTableEntry *table = nullptr;
};

enum class ActionKind : uint8_t {
  kNone,
  kPostRecv,  // make room for `count` more incoming immediates
  kWrite,     // RDMA write (with immediate unless !has_imm)
};

enum class WriteKind : uint8_t {
  kData,       // payload from the send ring at sbuf_offset
  kCredits,    // SGL advert (16-byte record) or 0-byte credit update
  kControl,    // DISCONNECT / SHUTDOWN, 0 bytes
  kKeepalive,  // plain 0-byte write, no immediate (§3.2)
};

struct Action {
  ActionKind kind = ActionKind::kNone;
  WriteKind write_kind = WriteKind::kData;
  bool has_imm = true;
  bool inline_ok = false;               // length <= inline_size: the transport may post inline
  bool closes = false;                  // the DISCONNECT: the transport is torn down after its completion
  uint32_t count = 0;                   // kPostRecv
  uint32_t imm = 0;                     // host order
  uint32_t length = 0;                  // bytes to write
  uint32_t sbuf_offset = 0;             // kData: offset of the bytes in the send ring
  uint8_t record[kSglRecordSize] = {};  // kCredits with length 16: the advert bytes
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint64_t token = 0;      // hand back in on_write_done
  uint32_t next_olap = 0;  // core bookkeeping for commit_action; leave as is
};

enum class StreamState : uint8_t {
  kIdle,  // record not exchanged yet
  kConnected,
  kDisconnected,  // in-band DISCONNECT sent/received or transport gone
  kError,         // protocol violation or transport error: error() says which
};

enum ShutdownHow : uint8_t { kShutRd = 1, kShutWr = 2, kShutRdWr = 3 };

class Stream {
 public:
  // Prepares the local side and fills the record to send (connect/accept data).
  GS_HD void init(const StreamConfig &config, const LocalLayout &layout, ConnRecord *our_record);

  // ---- events ----
  // The peer's record arrived (already validated by decode_conn_record).
  GS_HD gs_status_t on_established(const ConnRecord &peer);
  // A write-with-immediate from the peer completed into our memory. Returns 0 or
  // a negated errno if the peer violated the protocol (the stream is then in
  // kError and must be torn down; nothing was or will be written out of bounds).
  GS_HD gs_status_t on_recv_imm(uint32_t imm, uint32_t length);
  // One of our writes completed (status 0 or a negated errno).
  GS_HD void on_write_done(uint64_t token, gs_status_t status);
  // The transport reports the connection gone (CM disconnect, peer death).
  GS_HD void on_transport_closed(gs_status_t status);
  // Ask for a keepalive write at the next opportunity (§3.2).
  GS_HD void request_keepalive() { keepalive_pending_ = true; }

  // ---- actions ----
  // Computes the next action; false if none is due. Posts nothing and records
  // nothing: peeking twice gives the same action. (It may adopt an advert the
  // peer wrote into the target table, and fail the stream if that advert is
  // hostile — reading the table is an event, not an action.)
  GS_HD bool peek_action(Action *out) { return produce(out); }
  // Records that the transport posted `a` (as returned by peek_action).
  GS_HD void commit_action(const Action &a);
  // peek + commit in one step, for drivers whose posts cannot fail.
  GS_HD bool next_action(Action *out) {
    if (!produce(out)) return false;
    commit_action(*out);
    return true;
  }

  // ---- application: sending ----
  // 0 if the app may send, else -EPIPE (we shut down writing), -ECONNRESET (peer
  // gone), -ENOTCONN, or the stream's error.
  GS_HD gs_status_t send_status() const;
  // Contiguous free space at the tail of the send ring: offset and length.
  GS_HD uint32_t send_space(uint32_t *offset) const;
  GS_HD uint32_t send_free() const { return sbuf_size_ - static_cast<uint32_t>(send_tail_ - send_done_); }
  // The app wrote n bytes at the offset send_space returned.
  GS_HD void send_commit(uint32_t n) { send_tail_ += n; }
  // Bytes committed but not yet acknowledged by write completions.
  GS_HD uint64_t send_unacked() const { return send_tail_ - send_done_; }
  GS_HD uint64_t send_unposted() const { return send_tail_ - send_posted_; }
  // Stream positions (bytes since the connection began) of the send side:
  // committed by the app, posted to the transport, acknowledged by completions.
  GS_HD uint64_t send_committed() const { return send_tail_; }
  GS_HD uint64_t send_posted() const { return send_posted_; }
  GS_HD uint64_t send_acked() const { return send_done_; }

  // ---- application: receiving ----
  // Contiguous readable bytes at the head of the receive ring.
  GS_HD uint32_t recv_span(uint32_t *offset) const;
  GS_HD uint64_t recv_available() const { return recv_write_ - recv_read_; }
  GS_HD void recv_consume(uint32_t n) { recv_read_ += n; }
  // True when no more data will ever arrive (peer half-closed, disconnected,
  // local SHUT_RD or error) — an empty ring then means EOF.
  GS_HD bool recv_closed() const { return !readable_ || state_ >= StreamState::kDisconnected; }

  // ---- teardown ----
  GS_HD void shutdown(uint8_t how);
  // Everything is sent and the in-band DISCONNECT completed (or cannot be sent):
  // the transport may now tear the connection down.
  GS_HD bool ready_for_teardown() const;
  // The peer's DISCONNECT arrived before ours was sent: the peer closed first
  // and is waiting, in its close, for its DISCONNECT to complete, which needs
  // our transport's acknowledgement. Keep the transport until the peer tears
  // its side down (transport_closed) or a bound passes.
  GS_HD bool peer_closed_first() const { return peer_closed_first_; }
  GS_HD bool transport_closed() const { return transport_closed_; }

  // ---- inspection ----
  GS_HD StreamState state() const { return state_; }
  GS_HD gs_status_t error() const { return error_; }
  GS_HD const char *error_reason() const { return error_reason_; }
  GS_HD bool writable_dir() const { return writable_; }
  GS_HD bool readable_dir() const { return readable_; }
  GS_HD uint16_t credits_available() const { return static_cast<uint16_t>(sseq_comp_ - sseq_no_); }
  GS_HD uint32_t rbuf_size() const { return rbuf_size_; }
  GS_HD uint32_t sbuf_size() const { return sbuf_size_; }
  GS_HD uint16_t rq_size() const { return rq_size_; }
  GS_HD uint16_t sq_size() const { return sq_size_; }
  // Receive posts the transport needs before the peer may send (rq_size plus
  // room for the peer's control messages).
  GS_HD uint32_t recv_posts_needed() const { return rq_size_ + kQpCtrlSize; }

 private:
  struct Outstanding {
    uint32_t bytes;  // send-ring bytes freed on completion
    WriteKind kind;
    uint8_t ctrl_code;
    bool done;
  };

  GS_HD bool produce(Action *a);
  GS_HD bool produce_credits(Action *a);
  GS_HD bool produce_data(Action *a);
  GS_HD bool produce_control(Action *a);
  GS_HD bool produce_keepalive(Action *a);
  GS_HD bool sq_has_room(bool control) const;
  GS_HD bool ctrl_credit_free() const { return (ctrl_outstanding_ + 1) * slots_per_msg_ <= kQpCtrlSize; }
  GS_HD const SglEntry *current_slot();
  GS_HD gs_status_t fail(gs_status_t err, const char *why);
  GS_HD void set_disconnected();

  // configuration
  uint32_t rbuf_size_ = 0, half_ = 0, sbuf_size_ = 0, inline_size_ = 0;
  uint16_t sq_size_ = 0, rq_size_ = 0;
  uint32_t slots_per_msg_ = 1;  // 2 with msg_send (iWARP)
  bool posts_receives_ = true;
  LocalLayout layout_{};

  // peer
  SglEntry peer_table_{};      // where our adverts go (peer's target SGL table)
  SglEntry peer_ring_{};       // the peer's whole receive ring (2 × data_buf)
  uint16_t peer_credits_ = 0;  // peer's rq_size
  bool peer_big_endian_ = false;
  uint32_t peer_next_slot_ = 1;  // §1.3.1: slot 0 is filled by data_buf

  // state
  StreamState state_ = StreamState::kIdle;
  bool readable_ = true, writable_ = true;
  gs_status_t error_ = 0;
  const char *error_reason_ = nullptr;
  bool ctrl_pending_ = false;  // a SHUTDOWN/DISCONNECT must follow the queued data
  bool disconnect_sent_ = false;
  bool disconnect_done_ = false;
  bool shutdown_sent_ = false;
  bool peer_disconnected_ = false;  // the peer's in-band DISCONNECT arrived
  bool peer_closed_first_ = false;  // ... before ours was sent
  bool local_shut_rd_ = false;
  bool transport_closed_ = false;
  bool keepalive_pending_ = false;

  // receiver side (we own the ring)
  uint64_t recv_write_ = 0;  // bytes received (ring write position)
  uint64_t recv_read_ = 0;   // bytes consumed by the app
  uint64_t advertised_ = 0;  // bytes of ring ever advertised (whole halves)
  uint16_t rseq_no_ = 0;     // data messages received
  uint16_t rseq_comp_ = 0;   // send a credit update when rseq_no_ reaches this
  uint16_t granted_ = 0;     // credit limit last sent: peer may send rseq < granted_
  uint32_t recv_posts_owed_ = 0;

  // sender side (we write into the peer's ring)
  uint64_t send_tail_ = 0, send_posted_ = 0, send_done_ = 0;
  uint16_t sseq_no_ = 0, sseq_comp_ = 0;
  SglEntry slot_[kSglSize]{};  // private copies of the target table slots
  uint32_t target_sge_ = 0;
  uint32_t olap_ = kOlapStartSize;
  uint32_t ctrl_outstanding_ = 0;
  uint64_t wr_head_ = 0, wr_tail_ = 0;  // outstanding writes [head, tail)
  Outstanding wr_[kMaxSendQueue]{};
};

}  // namespace gpusock::wire

#include "wire/core/stream.inl"
