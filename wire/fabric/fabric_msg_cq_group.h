// A completion queue that fabric:tcp endpoints share (fabric_msg.cc, "Shared
// completion queues"): whoever reads it routes each completion to the member
// it belongs to, and wakes members that sleep on it when it routed to them.
#pragma once

#include "wire/fabric/creator.h"
#include "wire/fabric/fabric_common.h"

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>

namespace gpusock::wire::fabric::msg {

struct CmMailbox;

// One completion, as its member takes it.
struct CqItem {
  CqEntry entry;
  bool unmatched = false;  // an error no member owns, shown to every member
};

class CqGroup {
 public:
  static constexpr uint32_t kMaxMembers = 1u << kCqTagBits;
  // How long the others make way (yield in arm) for a member asleep with
  // completions routed to it; the queue stays signalled for it until it takes.
  static constexpr uint64_t kOwedWakeMs = 100;
  // Reads of a leaving member's queue before it gives up on a queue others
  // keep filling.
  static constexpr int kLeaveReadsMax = 4096;

  CqGroup(const CqGroup &) = delete;
  CqGroup &operator=(const CqGroup &) = delete;
  ~CqGroup();
  // A queue with an FI_WAIT_FD wait object and room for `capacity` members'
  // completions (capacity <= kMaxMembers).
  static gs_status_t open(const FabricDomainBase &domain, uint32_t capacity, std::shared_ptr<CqGroup> *out);

  fid_cq *cq() const { return cq_; }
  // The queue's wait object: an epoll fd over its members' sockets and its signal.
  int wait_fd() const { return wait_fd_; }
  bool here() const { return creator_.here(); }

  // A new member's tag (the high bits of the CQ data its peer writes), or
  // -ENOSPC when every place is taken (a member that left frees its place:
  // nothing of it is left in the queue, and its socket is closed). `ring`:
  // its writes' contexts; `mailbox`: its CM events (a sleeper is woken for
  // them too).
  int join(const TxRing *ring, const CmMailbox *mailbox);
  // After the member's fid_ep is closed: reads what the queue still holds
  // (nothing more comes for it) and drops the member's part of it.
  void leave(uint32_t tag);

  // Reads the queue once (tcp progresses the members' sockets inside) and
  // routes what it read; then moves up to `max` of tag's completions, in
  // order, into out. Returns how many, or < 0 when the read failed.
  // *more: the read was full or tag has more waiting.
  int take(uint32_t tag, CqItem *out, int max, bool *more);
  // Right before tag's thread sleeps on wait_fd(): reads the queue once more
  // and returns -EAGAIN when completions wait for tag (take them first);
  // else marks tag asleep, so that whoever routes to it later signals the
  // queue, and returns 0. -EAGAIN too, after yielding the CPU, while another
  // member has slept with completions it has not yet taken for less than
  // kOwedWakeMs: the queue's fd is readable for it, and our sleep would end
  // at once.
  int arm(uint32_t tag);
  // A look without a lock: completions wait for tag.
  bool has_items(uint32_t tag) const { return members_[tag].count.load(std::memory_order_acquire) != 0; }

 private:
  struct Member {
    bool used = false;
    bool asleep = false;         // armed; cleared by its next take
    uint64_t owed_since_ms = 0;  // asleep with something routed to it, since
    const TxRing *ring = nullptr;
    const CmMailbox *mailbox = nullptr;
    std::deque<CqItem> items;
    std::atomic<uint32_t> count{0};  // items.size()
  };

  // A member taking its completions into out[n, max).
  struct Taker {
    Member *member;
    CqItem *out;
    int max;
    int n;
  };

  CqGroup() = default;
  // One fi_cq_read (and its error entry), routed (the taker's own straight
  // into its out, when given); entries read, or < 0.
  int read_locked(Taker *taker);
  void route_locked(const CqItem &item, Taker *taker);
  Member *owner_locked(const CqItem &item);
  void push_locked(Member &member, const CqItem &item);
  // A read may have reset the queue's signal that woke a sleeper: signal
  // again while a sleeping member has completions or CM events waiting.
  // True while others should make way for such a member (kOwedWakeMs).
  bool wake_sleepers_locked();

  std::mutex mu_;
  fid_cq *cq_ = nullptr;
  int wait_fd_ = -1;
  uint32_t capacity_ = 0;
  std::unique_ptr<Member[]> members_;
  Creator creator_;
};

}  // namespace gpusock::wire::fabric::msg
