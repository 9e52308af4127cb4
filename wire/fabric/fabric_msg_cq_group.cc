// fabric:tcp's shared completion queues (fabric_msg_cq_group.h; the design is
// in fabric_msg.cc, "Shared completion queues").
#include "wire/fabric/fabric_msg_cq_group.h"

#include "wire/fabric/fabric_msg.h"

#include <sched.h>

namespace gpusock::wire::fabric::msg {

gs_status_t CqGroup::open(const FabricDomainBase &domain, uint32_t capacity, std::shared_ptr<CqGroup> *out) {
  if (capacity == 0 || capacity > kMaxMembers) return -EINVAL;
  std::shared_ptr<CqGroup> group(new CqGroup());
  group->capacity_ = capacity;
  group->members_ = std::make_unique<Member[]>(capacity);
  // Room for every member's queues; beyond a few members tcp keeps what does
  // not fit on its overflow list.
  gs_status_t ret = domain.open_endpoint_cq(&group->cq_, FI_WAIT_FD, nullptr, std::min<uint32_t>(capacity, 8));
  if (ret == 0) ret = fi_status(fi_control(&group->cq_->fid, FI_GETWAIT, &group->wait_fd_));
  if (ret < 0) return ret;
  *out = std::move(group);
  return 0;
}

CqGroup::~CqGroup() {
  if (creator_.here()) close_fid(cq_);
}

int CqGroup::join(const TxRing *ring, const CmMailbox *mailbox) {
  std::lock_guard lock(mu_);
  for (uint32_t tag = 0; tag < capacity_; ++tag) {
    Member &member = members_[tag];
    if (member.used) continue;
    member.used = true;
    member.asleep = false;
    member.ring = ring;
    member.mailbox = mailbox;
    return static_cast<int>(tag);
  }
  return -ENOSPC;
}

void CqGroup::leave(uint32_t tag) {
  std::lock_guard lock(mu_);
  // What the queue holds for the member goes with it (closing its fid_ep put
  // an error entry there for each of its writes still queued); others' is
  // routed. Read to the end: an entry left behind would name a ring slot or a
  // tag that a later member may take.
  for (int i = 0; i < kLeaveReadsMax && read_locked(nullptr) > 0; ++i) {}
  Member &member = members_[tag];
  member.used = false;
  member.asleep = false;
  member.ring = nullptr;
  member.mailbox = nullptr;
  member.items.clear();
  member.count.store(0, std::memory_order_release);
  wake_sleepers_locked();
}

int CqGroup::take(uint32_t tag, CqItem *out, int max, bool *more) {
  std::lock_guard lock(mu_);
  Member &self = members_[tag];
  self.asleep = false;
  self.owed_since_ms = 0;
  Taker taker{&self, out, max, 0};
  while (taker.n < max && !self.items.empty()) {
    out[taker.n++] = self.items.front();
    self.items.pop_front();
  }
  const int got = read_locked(&taker);
  self.count.store(static_cast<uint32_t>(self.items.size()), std::memory_order_release);
  wake_sleepers_locked();
  *more = got != 0 || !self.items.empty();  // only an empty read says the queue is empty
  return got < 0 && taker.n == 0 ? got : taker.n;
}

int CqGroup::arm(uint32_t tag) {
  std::unique_lock lock(mu_);
  Member &self = members_[tag];
  const int got = read_locked(nullptr);
  if (got != 0 || !self.items.empty()) {
    wake_sleepers_locked();
    return -EAGAIN;
  }
  self.asleep = true;
  self.owed_since_ms = 0;
  if (wake_sleepers_locked()) {
    // The queue's fd is readable for another member that has not yet taken
    // what was routed to it: our sleep would end at once. Let it run first.
    self.asleep = false;
    lock.unlock();
    sched_yield();
    return -EAGAIN;
  }
  return 0;
}

int CqGroup::read_locked(Taker *taker) {
  return read_cq_entries(cq_, kCqBatch, [&](const CqEntry &entry) { route_locked(CqItem{entry, false}, taker); });
}

CqGroup::Member *CqGroup::owner_locked(const CqItem &item) {
  if ((item.entry.flags & FI_REMOTE_CQ_DATA) != 0) {
    const uint32_t tag = cq_data_tag(item.entry.data);
    if (tag < capacity_ && members_[tag].used) return &members_[tag];
  }
  if (item.entry.context != nullptr) {
    for (uint32_t tag = 0; tag < capacity_; ++tag) {
      Member &member = members_[tag];
      if (member.used && member.ring->owns(item.entry.context)) return &member;
    }
  }
  // A queue of one member: everything is its (zero-length receives too).
  if (capacity_ == 1 && members_[0].used) return &members_[0];
  return nullptr;
}

void CqGroup::route_locked(const CqItem &item, Taker *taker) {
  if (Member *member = owner_locked(item)) {
    // Straight to the taker when nothing of its waits before it.
    if (taker != nullptr && member == taker->member && member->items.empty() && taker->n < taker->max) {
      taker->out[taker->n++] = item;
    } else {
      push_locked(*member, item);
    }
    return;
  }
  if (item.entry.status == 0) return;  // a member's that left
  // An error nobody owns: every member looks at its connection.
  CqItem shown = item;
  shown.unmatched = true;
  for (uint32_t tag = 0; tag < capacity_; ++tag) {
    if (members_[tag].used) push_locked(members_[tag], shown);
  }
}

void CqGroup::push_locked(Member &member, const CqItem &item) {
  member.items.push_back(item);
  member.count.store(static_cast<uint32_t>(member.items.size()), std::memory_order_release);
}

bool CqGroup::wake_sleepers_locked() {
  bool owed = false;
  bool make_way = false;
  for (uint32_t tag = 0; tag < capacity_; ++tag) {
    Member &member = members_[tag];
    if (!member.asleep) continue;
    const bool cm_waiting = member.mailbox != nullptr && member.mailbox->pending.load(std::memory_order_seq_cst) != 0;
    if (member.items.empty() && !cm_waiting) continue;
    owed = true;
    // Others make way for it for a while; past that its thread looks at
    // other things first, and only the signal stays.
    const uint64_t now = coarse_ms();
    if (member.owed_since_ms == 0) member.owed_since_ms = now;
    if (now - member.owed_since_ms <= kOwedWakeMs) make_way = true;
  }
  if (owed) fi_cq_signal(cq_);
  return make_way;
}

}  // namespace gpusock::wire::fabric::msg
