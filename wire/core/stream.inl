// Inline definitions of wire/core/stream.h: the hot path of every transport,
// kept in a header so host and device code inline it.
#pragma once

namespace gpusock::wire {

GS_HD void Stream::init(const StreamConfig &config, const LocalLayout &layout, ConnRecord *our_record) {
  *this = Stream();
  rbuf_size_ = gs_max<uint32_t>(config.rbuf_size & ~1u, 2);
  half_ = rbuf_size_ / 2;
  sbuf_size_ = config.sbuf_size < kSndLowat ? 4096 : config.sbuf_size;  // §2.10 wmem rule
  sq_size_ = static_cast<uint16_t>(gs_min<uint32_t>(gs_max<uint32_t>(config.sq_size, kQpMinSize), kMaxSendQueue));
  rq_size_ = static_cast<uint16_t>(gs_min<uint32_t>(gs_max<uint32_t>(config.rq_size, kQpMinSize), kQpMaxSize));
  inline_size_ = config.msg_send ? gs_max<uint32_t>(config.inline_size, kMsgSize) : config.inline_size;
  slots_per_msg_ = config.msg_send ? 2 : 1;
  posts_receives_ = config.posts_receives;
  layout_ = layout;
  for (uint32_t i = 0; i < kSglSize; ++i) layout_.table[i].length = 0;

  advertised_ = half_;  // H0 goes out in the record's data_buf (§2.3)
  granted_ = rq_size_;
  rseq_comp_ = static_cast<uint16_t>(rq_size_ / 2);
  recv_posts_owed_ = posts_receives_ ? recv_posts_needed() : 0;

  our_record->version = kRsVersion;
  our_record->flags = local_conn_flags();
  our_record->credits = rq_size_;
  our_record->target_iomap_size = 0;  // we expose no iomap table
  our_record->target_sgl = {layout.table_remote_addr, layout.table_rkey, kSglSize};
  our_record->data_buf = {layout.rbuf_remote_addr, layout.rbuf_rkey, half_};
}

GS_HD gs_status_t Stream::on_established(const ConnRecord &peer) {
  peer_table_ = peer.target_sgl;
  peer_ring_ = {peer.data_buf.addr, peer.data_buf.key, peer.data_buf.length * 2};
  peer_credits_ = peer.credits;
  peer_big_endian_ = (peer.flags & kConnFlagNet) != 0;
  sseq_no_ = 0;
  sseq_comp_ = peer.credits;  // §1.3.1
  slot_[0] = peer.data_buf;
  slot_[1] = SglEntry{};
  target_sge_ = 0;
  peer_next_slot_ = 1;
  if (state_ == StreamState::kIdle) state_ = StreamState::kConnected;
  return 0;
}

GS_HD gs_status_t Stream::fail(gs_status_t err, const char *why) {
  if (state_ != StreamState::kError) {
    state_ = StreamState::kError;
    error_ = err;
    error_reason_ = why;
  }
  return error_;
}

GS_HD void Stream::set_disconnected() {
  if (state_ != StreamState::kError) state_ = StreamState::kDisconnected;
}

GS_HD gs_status_t Stream::on_recv_imm(uint32_t imm, uint32_t /*length*/) {
  if (state_ == StreamState::kError) return error_;
  if (posts_receives_ && state_ == StreamState::kConnected) ++recv_posts_owed_;  // that immediate used a receive
  const ImmOp op = imm_op(imm);
  const uint32_t value = imm_value(imm);

  if (imm_is_data(op)) {
    if (peer_disconnected_) return fail(-EPROTO, "peer sent data after its DISCONNECT");
    if (state_ == StreamState::kIdle) return fail(-EPROTO, "peer sent data before the connection was established");
    if (static_cast<uint16_t>(granted_ - rseq_no_) == 0)
      return fail(-EPROTO, "peer sent more data messages than it was granted credits");
    if (value > advertised_ - recv_write_)
      return fail(-EPROTO, "peer wrote past the receive space it was advertised");
    if ((recv_write_ % half_) + value > half_)
      return fail(-EPROTO, "peer write crosses an advertised region boundary");
    ++rseq_no_;
    recv_write_ += value;
    if (value == 0) readable_ = false;  // §2.8: zero-length data reads as EOF
    if (local_shut_rd_ || disconnect_sent_) recv_read_ = recv_write_;  // nobody will read it
    // Data after the peer's SHUTDOWN is tolerated and stays readable (§3.1).
    return 0;
  }

  switch (op) {
    case ImmOp::kSgl: {
      // §2.4: absolute sequence; must not move backwards nor beyond the peer's
      // receive queue depth ahead of what we have sent.
      const uint16_t limit = static_cast<uint16_t>(value);
      const uint16_t ahead = static_cast<uint16_t>(limit - sseq_no_);
      const uint16_t current = static_cast<uint16_t>(sseq_comp_ - sseq_no_);
      if (ahead < current) return fail(-EPROTO, "peer's credit sequence went backwards");
      if (ahead > peer_credits_) return fail(-EPROTO, "peer granted more credits than its receive queue holds");
      sseq_comp_ = limit;
      return 0;
    }
    case ImmOp::kIomapSgl:
      return fail(-EPROTO, "peer sent an iomap update but we offered no iomap table");
    case ImmOp::kCtrl:
      if (value == kCtrlDisconnect) {
        peer_disconnected_ = true;
        peer_closed_first_ = !disconnect_sent_;
        readable_ = false;
        set_disconnected();
      } else if (value == kCtrlShutdown) {
        // Half-close: we may keep sending. If our own SHUT_WR is still queued
        // behind unsent data, it goes out later as DISCONNECT.
        if (writable_ || !(shutdown_sent_ || disconnect_sent_)) readable_ = false;
        else set_disconnected();
      }
      return 0;  // other codes are ignored (§2.2)
    default:
      return 0;  // kWrite: a local tag, ignored
  }
}

GS_HD void Stream::on_write_done(uint64_t token, gs_status_t status) {
  if (token < wr_head_ || token >= wr_tail_) return;  // not ours, or already retired
  wr_[token % kMaxSendQueue].done = true;
  if (status != 0 && state_ == StreamState::kConnected)
    fail(status, "RDMA write failed (peer gone or remote access error)");
  while (wr_head_ != wr_tail_ && wr_[wr_head_ % kMaxSendQueue].done) {
    const Outstanding &o = wr_[wr_head_ % kMaxSendQueue];
    send_done_ += o.bytes;
    if (o.kind != WriteKind::kData) --ctrl_outstanding_;
    if (o.kind == WriteKind::kControl && o.ctrl_code == kCtrlDisconnect) {
      disconnect_done_ = true;
      set_disconnected();
    }
    ++wr_head_;
  }
}

GS_HD void Stream::on_transport_closed(gs_status_t status) {
  if (state_ == StreamState::kConnected || state_ == StreamState::kIdle) {
    if (disconnect_sent_) set_disconnected();
    else fail(status < 0 ? status : -ECONNRESET, "connection lost without an in-band disconnect");
  }
  transport_closed_ = true;
}

GS_HD bool Stream::sq_has_room(bool control) const {
  const uint64_t used = (wr_tail_ - wr_head_) * slots_per_msg_;
  return used + slots_per_msg_ <= (control ? sq_size_ : sq_size_ - kQpCtrlSize);
}

GS_HD const SglEntry *Stream::current_slot() {
  SglEntry *s = &slot_[target_sge_];
  if (s->length != 0) return s;
  // The peer RDMA-writes adverts into our table (§2.3); adopt one into a private
  // copy and clear the table slot so the next advert is recognisable.
  volatile TargetTableEntry &t = layout_.table[target_sge_];
  const uint32_t length = t.length;
  if (length == 0) return nullptr;
  SglEntry e{t.addr, t.key, length};
  t.length = 0;
  const uint64_t offset = e.addr - peer_ring_.addr;
  if (e.key != peer_ring_.key || e.addr < peer_ring_.addr || offset > peer_ring_.length ||
      e.length > peer_ring_.length - offset) {
    fail(-EPROTO, "peer advertised a buffer outside its receive ring");
    return nullptr;
  }
  *s = e;
  return s;
}

GS_HD bool Stream::produce(Action *a) {
  *a = Action();
  if (recv_posts_owed_ > 0 && state_ <= StreamState::kConnected) {
    a->kind = ActionKind::kPostRecv;
    a->count = recv_posts_owed_;
    return true;
  }
  if (state_ != StreamState::kConnected || disconnect_sent_) return false;
  if (produce_credits(a) || produce_data(a)) return true;
  // Adopting an advert (in produce_data) may have found it hostile.
  if (state_ != StreamState::kConnected) return false;
  return produce_control(a) || produce_keepalive(a);
}

GS_HD bool Stream::produce_credits(Action *a) {
  if (!ctrl_credit_free() || !sq_has_room(true)) return false;
  const uint64_t free_bytes = rbuf_size_ - (advertised_ - recv_read_);
  const bool advert = free_bytes >= half_;
  if (!advert && static_cast<int16_t>(rseq_no_ - rseq_comp_) < 0) return false;

  const uint16_t credit = static_cast<uint16_t>(rseq_no_ + rq_size_);
  a->kind = ActionKind::kWrite;
  a->write_kind = WriteKind::kCredits;
  a->imm = imm_credits(credit);
  a->token = wr_tail_;
  if (advert) {
    const SglEntry half{layout_.rbuf_remote_addr + advertised_ % rbuf_size_, layout_.rbuf_rkey, half_};
    encode_sgl_record(half, peer_big_endian_, a->record);
    a->length = kSglRecordSize;
    a->remote_addr = peer_table_.addr + uint64_t(peer_next_slot_) * kSglRecordSize;
    a->inline_ok = kSglRecordSize <= inline_size_;
  } else {
    a->remote_addr = peer_table_.addr;  // 0 bytes: any valid target will do
  }
  a->rkey = peer_table_.key;
  return true;
}

GS_HD bool Stream::produce_data(Action *a) {
  const uint64_t pending = send_tail_ - send_posted_;
  if (pending == 0 || !sq_has_room(false) || sseq_no_ == sseq_comp_) return false;
  const SglEntry *slot = current_slot();
  if (slot == nullptr) return false;

  // §2.6: 2 KiB first, doubling to 64 KiB; cut at the target slot's end and at
  // the send ring's wrap.
  const uint32_t left = static_cast<uint32_t>(gs_min<uint64_t>(pending, kMaxDataLength));
  uint32_t chunk = left;
  a->next_olap = olap_;
  if (olap_ < left) {
    chunk = olap_;
    a->next_olap = gs_min<uint32_t>(olap_ * 2, kMaxWrite);
  }
  const uint32_t offset = static_cast<uint32_t>(send_posted_ % sbuf_size_);
  chunk = gs_min(gs_min(chunk, slot->length), sbuf_size_ - offset);

  a->kind = ActionKind::kWrite;
  a->write_kind = WriteKind::kData;
  a->imm = imm_data(chunk);
  a->length = chunk;
  a->sbuf_offset = offset;
  a->remote_addr = slot->addr;
  a->rkey = slot->key;
  a->inline_ok = chunk <= inline_size_;
  a->token = wr_tail_;
  return true;
}

GS_HD bool Stream::produce_control(Action *a) {
  if (!ctrl_pending_ || send_posted_ != send_tail_) return false;  // data goes first
  if (!ctrl_credit_free() || !sq_has_room(true)) return false;
  // §3.1: SHUT_WR sends SHUTDOWN while we still read, else DISCONNECT.
  const uint8_t code = readable_ ? kCtrlShutdown : kCtrlDisconnect;
  if (code == kCtrlShutdown && shutdown_sent_) return false;
  a->kind = ActionKind::kWrite;
  a->write_kind = WriteKind::kControl;
  a->imm = imm_ctrl(code);
  a->remote_addr = peer_table_.addr;
  a->rkey = peer_table_.key;
  a->inline_ok = true;
  a->closes = code == kCtrlDisconnect;
  a->token = wr_tail_;
  return true;
}

GS_HD bool Stream::produce_keepalive(Action *a) {
  if (!keepalive_pending_ || !ctrl_credit_free() || !sq_has_room(true)) return false;
  a->kind = ActionKind::kWrite;
  a->write_kind = WriteKind::kKeepalive;
  a->has_imm = false;
  a->remote_addr = peer_table_.addr;
  a->rkey = peer_table_.key;
  a->inline_ok = true;
  a->token = wr_tail_;
  return true;
}

// Applies exactly the action that was posted, even if events arrived between
// peek and commit (the values come from the action, not from a recomputation).
GS_HD void Stream::commit_action(const Action &a) {
  if (a.kind == ActionKind::kPostRecv) {
    recv_posts_owed_ -= gs_min(a.count, recv_posts_owed_);
    return;
  }
  if (a.kind != ActionKind::kWrite) return;
  uint32_t bytes = 0;
  uint8_t code = 0;
  switch (a.write_kind) {
    case WriteKind::kCredits: {
      if (a.length == kSglRecordSize) {
        advertised_ += half_;
        peer_next_slot_ = (peer_next_slot_ + 1) % kSglSize;
      }
      const uint16_t credit = static_cast<uint16_t>(imm_value(a.imm));
      granted_ = credit;
      // credit = rseq_no + rq_size at peek time; the next update is due rq_size/2 later.
      rseq_comp_ = static_cast<uint16_t>(credit - rq_size_ + rq_size_ / 2);
      break;
    }
    case WriteKind::kData: {
      SglEntry &s = slot_[target_sge_];
      s.addr += a.length;
      s.length -= a.length;
      if (s.length == 0) target_sge_ = (target_sge_ + 1) % kSglSize;
      ++sseq_no_;
      send_posted_ += a.length;
      olap_ = send_posted_ == send_tail_ ? kOlapStartSize : a.next_olap;  // a new burst starts small
      bytes = a.length;
      break;
    }
    case WriteKind::kControl:
      code = static_cast<uint8_t>(imm_value(a.imm));
      ctrl_pending_ = false;
      if (code == kCtrlDisconnect) disconnect_sent_ = true;
      else shutdown_sent_ = true;
      break;
    case WriteKind::kKeepalive:
      keepalive_pending_ = false;
      code = kCtrlKeepalive;
      break;
  }
  wr_[wr_tail_ % kMaxSendQueue] = Outstanding{bytes, a.write_kind, code, false};
  ++wr_tail_;
  if (a.write_kind != WriteKind::kData) ++ctrl_outstanding_;
}

GS_HD gs_status_t Stream::send_status() const {
  if (state_ == StreamState::kError) return error_;
  if (!writable_) return -EPIPE;
  if (state_ == StreamState::kDisconnected) return -ECONNRESET;
  if (state_ == StreamState::kIdle) return -ENOTCONN;
  return 0;
}

GS_HD uint32_t Stream::send_space(uint32_t *offset) const {
  const uint32_t off = static_cast<uint32_t>(send_tail_ % sbuf_size_);
  *offset = off;
  return gs_min(send_free(), sbuf_size_ - off);
}

GS_HD uint32_t Stream::recv_span(uint32_t *offset) const {
  const uint32_t off = static_cast<uint32_t>(recv_read_ % rbuf_size_);
  *offset = off;
  return static_cast<uint32_t>(gs_min<uint64_t>(recv_write_ - recv_read_, rbuf_size_ - off));
}

GS_HD void Stream::shutdown(uint8_t how) {
  if (how & kShutRd) {
    readable_ = false;
    local_shut_rd_ = true;
    recv_read_ = recv_write_;  // like TCP, unread data is dropped
  }
  if (how & kShutWr) writable_ = false;
  if (state_ != StreamState::kConnected || disconnect_sent_) return;
  if ((how & kShutWr) || !writable_) ctrl_pending_ = true;
}

GS_HD bool Stream::ready_for_teardown() const {
  if (state_ == StreamState::kIdle || state_ == StreamState::kError || transport_closed_) return true;
  if (disconnect_done_) return true;
  return state_ == StreamState::kDisconnected && wr_head_ == wr_tail_;
}

}  // namespace gpusock::wire
