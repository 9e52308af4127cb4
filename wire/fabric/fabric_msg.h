// What the files of the FI_EP_MSG flavour ("fabric:tcp") share: the domain
// with its event queue, the mailboxes CM events are routed to, and the
// listener side (fabric_msg.cc, whose header comment describes the flavour);
// endpoints are in fabric_msg_endpoint.cc.
#pragma once

#include "wire/fabric/creator.h"
#include "wire/fabric/fabric_common.h"
#include "wire/fabric/fabric_msg_cq_group.h"

#include <atomic>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace gpusock::wire::fabric::msg {

constexpr size_t kMaxCmData = 256;  // tcp's TCPX_MAX_CM_DATA_SIZE
// After the private data of a connection request and of its accept: the
// sender's CQ tag (little-endian), which the peer's writes carry.
constexpr uint32_t kCqTagWireBytes = 2;
constexpr uint32_t kMaxPrivateData = sizeof(CmEvent{}.peer_private_data);  // what caps_.max_private_data is capped at

// private_data + our tag into out (kMaxPrivateData + kCqTagWireBytes bytes).
inline uint32_t append_cq_tag(const void *private_data, uint32_t private_len, uint32_t tag, uint8_t *out) {
  if (private_len != 0) std::memcpy(out, private_data, private_len);
  out[private_len] = static_cast<uint8_t>(tag);
  out[private_len + 1] = static_cast<uint8_t>(tag >> 8);
  return private_len + kCqTagWireBytes;
}
// Splits the peer's tag off data[0, *len); false when it is not there.
inline bool split_cq_tag(const uint8_t *data, uint32_t *len, uint32_t *tag) {
  if (*len < kCqTagWireBytes) return false;
  *len -= kCqTagWireBytes;
  *tag = static_cast<uint32_t>(data[*len]) | (static_cast<uint32_t>(data[*len + 1]) << 8);
  return *tag < CqGroup::kMaxMembers;
}

// A CM event as read from the EQ, before the endpoint interprets it.
struct RawCmEvent {
  enum Type : uint8_t { kConnReq, kConnected, kShutdown, kError } type = kError;
  int err = 0;              // kError / error shutdown: positive errno
  fi_info *info = nullptr;  // kConnReq: owned
  uint8_t data[kMaxPrivateData + kCqTagWireBytes] = {};
  uint32_t data_len = 0;
};

// Reads one event off an EQ: 1 (the event, and the fid it is for), 0 when
// the EQ is empty, -1 for an event of no interest (skipped).
int read_cm_event(fid_eq *eq, RawCmEvent *out, fid_t *fid);
// An EQ with an FI_WAIT_FD wait object, and that fd.
gs_status_t open_cm_eq(fid_fabric *fabric, fid_eq **eq, int *wait_fd, std::string *error);

// An endpoint's events, routed off the domain's EQ; guarded by
// MsgDomain::cm_mutex(). Whoever routes an event here wakes the endpoint
// through its CQ's wait object (fi_cq_signal).
struct CmMailbox {
  std::deque<RawCmEvent> events;
  std::atomic<uint32_t> pending{0};
  fid_cq *wake_cq = nullptr;
};

class MsgDomain;

// A listener's pep has an EQ of its own, not the domain's: tcp accepts on the
// listening socket (and reads the client's request) only inside fi_eq_read of
// the pep's EQ, so connection requests stay in the kernel's queue until the
// socket layer asks for them (get_request). With a kernel listening socket
// shared by the processes of a forked server, a process that does not accept
// then leaves them to one that does (GS_ACCEPT_ON_DEMAND).
struct MsgListenerCore {
  MsgDomain *domain = nullptr;
  fid_pep *pep = nullptr;
  fid_eq *eq = nullptr;
  int eq_fd = -1;       // the listener's wait fd: the EQ's (the listening socket, requests being read)
  int listen_fd = -1;   // the pep's listening socket, as tcp put it in the EQ's epoll set
  std::mutex mu;        // the EQ: the listener's thread, and the core's last owner
  bool closed = false;  // the Listener is gone: requests are refused as they are read
  Creator creator;      // only it takes the socket out of the set and closes the fids
  ~MsgListenerCore();
  // The Listener object is going: refuse what waits. The pep stays open while
  // requests handed out still need it for fi_reject.
  void shutdown();
  // One connection request off the EQ (1), or none (0). mu held.
  int next_request_locked(RawCmEvent *out);
  // Takes the listening socket out of the EQ's set, then reads the EQ and
  // refuses every connection request on it; mu held. Reading the EQ with the
  // socket still in its set would accept more connections off a kernel queue
  // other processes may be serving, only to refuse them.
  void refuse_queued_locked();
};

class MsgConnectionRequest final : public ConnectionRequest {
 public:
  MsgConnectionRequest(std::shared_ptr<MsgListenerCore> core, RawCmEvent &&event)
      : core_(std::move(core)), info_(event.info), len_(event.data_len) {
    event.info = nullptr;
    std::memcpy(data_, event.data, len_);
    // Without a tag the request reads as empty: the client's record is missing.
    if (!split_cq_tag(data_, &len_, &peer_tag_)) len_ = 0;
  }
  ~MsgConnectionRequest() override;

  const uint8_t *private_data() const override { return data_; }
  uint32_t private_len() const override { return len_; }
  void reject() override;

  fi_info *info() const { return info_; }
  uint32_t peer_tag() const { return peer_tag_; }
  bool answered() const { return accepted_ || rejected_; }
  void mark_accepted() { accepted_ = true; }

 private:
  std::shared_ptr<MsgListenerCore> core_;
  fi_info *info_;
  uint8_t data_[kMaxPrivateData + kCqTagWireBytes];
  uint32_t len_;
  uint32_t peer_tag_ = 0;
  bool accepted_ = false;
  bool rejected_ = false;
};

class MsgDomain final : public FabricDomainBase {
 public:
  explicit MsgDomain(const ProviderAttr &attr) : FabricDomainBase(attr) {}
  ~MsgDomain() override;

  gs_status_t open(std::string *error);

  gs_status_t create_endpoint(ConnectionRequest *request, std::unique_ptr<Endpoint> *out) override;
  gs_status_t accept(Endpoint *endpoint, ConnectionRequest *request, const void *private_data,
                     uint32_t private_len) override;
  gs_status_t listen(const sockaddr *addr, socklen_t len, int backlog, std::unique_ptr<Listener> *out) override;

  fid_eq *eq() const { return eq_; }
  std::mutex &cm_mutex() { return cm_mutex_; }
  // Both with cm_mutex() held.
  void add_mailbox(fid_t fid, CmMailbox *mailbox) { mailboxes_[fid] = mailbox; }
  void remove_mailbox(fid_t fid) { mailboxes_.erase(fid); }
  // Read every EQ event and route it; cm_mutex() held.
  void pump_locked();
  // Pop one event for `mailbox` (pumping first if it has none).
  bool next_event(CmMailbox *mailbox, bool pump, RawCmEvent *out);
  // Put `event` in `mailbox` and wake its owner; cm_mutex() held.
  static void deliver_locked(CmMailbox *mailbox, RawCmEvent &&event);

  // An fi_info for an endpoint of `family` (src/dest addresses cleared).
  InfoPtr endpoint_info(int family) const;
  // A CQ for a new endpoint: a queue of its own while the domain holds fewer
  // than GPUSOCK_TCP_CQ_SHARE endpoints, else a place in the calling thread's
  // shared queue (a new one when it has none with room). The queue and the
  // endpoint's tag in it.
  gs_status_t join_cq_group(const TxRing *ring, const CmMailbox *mailbox, std::shared_ptr<CqGroup> *group,
                            uint32_t *tag);
  // The endpoint's fid_ep is closed.
  void leave_cq_group(CqGroup *group, uint32_t tag) {
    group->leave(tag);
    cq_members_.fetch_sub(1, std::memory_order_relaxed);
  }

 private:
  void route(fid_t fid, RawCmEvent &&event);
  // The CM thread: pumps the EQ whenever it has something, so that CM events
  // reach their endpoints while nobody polls.
  void run_cm();

  fid_eq *eq_ = nullptr;
  std::mutex cm_mutex_;
  std::unordered_map<fid_t, CmMailbox *> mailboxes_;
  int eq_fd_ = -1;    // the EQ's wait object
  int stop_fd_ = -1;  // tells the CM thread to end
  std::thread cm_thread_;
  std::mutex groups_mu_;
  // Each thread's newest shared CQ (GPUSOCK_TCP_CQ_SHARE): a thread's
  // connections share queues, so a sleep on one wakes only its own thread
  // where each thread opens its own connections.
  std::unordered_map<std::thread::id, std::weak_ptr<CqGroup>> thread_groups_;
  std::atomic<uint32_t> cq_members_{0};  // endpoints in CQs, of their own or shared
};

}  // namespace gpusock::wire::fabric::msg
