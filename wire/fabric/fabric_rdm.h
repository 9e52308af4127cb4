// What the files of the FI_EP_RDM flavour ("fabric:shm") share: the control
// messages of gpusock's handshake, the libfabric objects of one endpoint and
// the in-process registry (fabric_rdm_peers.cc), the domain (fabric_rdm.cc,
// whose header comment describes the whole flavour), and the listener side
// that accepted endpoints talk back to (fabric_rdm_listener.cc).
#pragma once

#include "wire/fabric/creator.h"
#include "wire/fabric/fabric_common.h"
#include "wire/fabric/shm_bell.h"
#include "wire/fabric/shm_name_exchange.h"
#include "wire/fabric/shm_names.h"
#include "wire/fabric/shm_sleep_group.h"
#include "wire/fabric/shm_spares.h"
#include "wire/fabric/shm_watchdog.h"

#include <netinet/in.h>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace gpusock::wire::fabric::rdm {

using shm::kNameMax;

constexpr int kConnCtrlBufs = 4;
constexpr int kListenerCtrlBufs = 32;
// Clients a listener admits at once (shm_bell.h, "Admission"): shm 1.17's
// table of 256 peers per endpoint, less room for clients that went away
// between their name exchange and their REQ (their entries stay).
constexpr uint32_t kListenerAdmissions = 192;
// A listener endpoint's queues: shm 1.17's largest (and default), room for
// the name exchange and the REQ of every client admitted at once, and more.
constexpr size_t kListenerQueueEntries = 1024;
constexpr uint64_t kLivenessIntervalMs = 10;
// Reads of a dead peer's last commands (RdmEndpoint::drain_dead_peer): more
// than any queue setting holds.
constexpr int kDrainPassesMax = 4096;

// kProbe is ignored by every receiver (fabric_rdm_parking.cc sends it).
enum CtrlType : uint16_t { kReq = 1, kAccept = 2, kReject = 3, kBye = 4, kAck = 5, kProbe = 6 };

struct CtrlMsg {
  uint32_t magic;
  uint16_t version;
  uint16_t type;
  uint64_t nonce;
  int32_t pid;
  uint32_t private_len;
  char name[kNameMax];
  sockaddr_storage src;  // REQ: the client's address; ACCEPT: the server's
  sockaddr_storage dst;  // REQ: the address the client connected to
  uint8_t private_data[64];
};

bool valid_ctrl(const CtrlMsg &msg, size_t len);
CtrlMsg make_ctrl(CtrlType type, uint64_t nonce, const std::string &name);
uint64_t random_u64();

uint16_t sockaddr_port(const sockaddr_storage &addr);
void set_sockaddr_port(sockaddr_storage *addr, uint16_t port);
std::string sockaddr_ip(const sockaddr_storage &addr);
bool is_wildcard(const sockaddr_storage &addr);
// An IPv4 client: an IPv4 address or an IPv4-mapped IPv6 one.
bool ipv4_client(const sockaddr_storage &addr);
// `addr` as a listener of `family` sees it, as the kernel has it: an IPv4
// address on an IPv6 listener is IPv4-mapped, an IPv4-mapped one on an IPv4
// listener is plain IPv4.
sockaddr_storage as_family(const sockaddr_storage &addr, sa_family_t family);
// Rendezvous names a client tries for `addr`, most specific first.
std::vector<std::string> rendezvous_candidates(const sockaddr_storage &addr);

// The libfabric objects of one RDM endpoint, shared with in-process peers
// (see "Peers in the same process"), and its bell.
struct RdmShared {
  fid_ep *ep = nullptr;
  fid_cq *cq = nullptr;
  fid_av *av = nullptr;
  std::string name;
  shm::Bell bell;
  std::shared_ptr<shm::HintBoard> board;  // our slot on it, given back with us
  int32_t hint_slot = -1;
  std::mutex mu;
  // Each peer name's inserts into `av`. shm 1.17 gives a name inserted twice
  // one region-map entry and unmaps its region at the first fi_av_remove, so
  // only a name's first insert and its last remove reach the AV.
  std::mutex av_mu;
  std::unordered_map<std::string, std::pair<fi_addr_t, uint32_t>> av_names;  // name: address, inserts
  std::atomic<bool> alive{true};                                             // owner not yet destroyed
  std::vector<std::shared_ptr<RdmShared>> inbound;                           // in-process senders to us
  Creator creator;  // only it closes the endpoint (which unlinks its region)

  ~RdmShared();
};

// In-process endpoints by name.
void registry_add(const std::shared_ptr<RdmShared> &shared);
// The owner is going away: no new in-process peer may find it, it lets go of
// the senders it was keeping mapped and rings them (they look at `alive`),
// and its bell closes (ring-back requests are served, later ones fail).
void retire_shared(const std::shared_ptr<RdmShared> &shared, int ringer);
// `self` no longer needs `peer_name` kept mapped (its last message to us has
// been consumed).
void unpin_inbound(const std::shared_ptr<RdmShared> &self, const char *peer_name);

// A peer in an endpoint's AV, and its bell.
struct PeerRef {
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  std::shared_ptr<RdmShared> pin;  // in-process peers only
  shm::PeerBell bell;

  PeerRef() = default;
  PeerRef(const PeerRef &) = delete;
  PeerRef &operator=(const PeerRef &) = delete;
  // A moved-from PeerRef no longer names the AV entry (it must be removed once).
  PeerRef(PeerRef &&other) noexcept { *this = std::move(other); }
  PeerRef &operator=(PeerRef &&other) noexcept {
    addr = other.addr;
    pin = std::move(other.pin);
    bell = std::move(other.bell);
    other.addr = FI_ADDR_NOTAVAIL;
    return *this;
  }
  bool valid() const { return addr != FI_ADDR_NOTAVAIL; }
};

// Put endpoint `name` of process `pid` in self's AV and open its bell (rings
// go from `ringer`). An in-process peer is pinned first: -ECONNREFUSED if it
// is gone.
gs_status_t insert_peer(const std::shared_ptr<RdmShared> &self, const char *name, pid_t pid, int ringer, PeerRef *out);
// Drop a peer from the AV: at its name's last insert, for shm this also frees
// its slot in the region map (256 slots) and unmaps a cross-process peer's
// region.
void remove_peer(RdmShared &self, PeerRef *ref);

// An endpoint gone from its owner whose name exchange a live peer may not have
// read yet (fabric_rdm_parking.cc): its fids stay open until it has.
struct ParkedEndpoint {
  std::shared_ptr<RdmShared> shared;
  PeerRef peer;           // in shared's AV
  std::string peer_name;  // the peer's endpoint
  // Has the peer read our name exchange, or can it never (its endpoint or
  // process gone)? Then closing unlinks nothing it will read.
  bool settled() const;
};

class RdmDomain final : public FabricDomainBase {
 public:
  explicit RdmDomain(const ProviderAttr &attr) : FabricDomainBase(attr) {}
  ~RdmDomain() override;

  gs_status_t open(std::string *error);

  gs_status_t create_endpoint(ConnectionRequest *request, std::unique_ptr<Endpoint> *out) override;
  gs_status_t accept(Endpoint *endpoint, ConnectionRequest *request, const void *private_data,
                     uint32_t private_len) override;
  gs_status_t listen(const sockaddr *addr, socklen_t len, int backlog, std::unique_ptr<Listener> *out) override {
    return listen(addr, len, backlog, ListenOptions{}, out);
  }
  gs_status_t listen(const sockaddr *addr, socklen_t len, int backlog, const ListenOptions &options,
                     std::unique_ptr<Listener> *out) override;

  // A named, enabled RDM endpoint with its own CQ and AV, and its bell.
  // A connection's endpoint, or a listener's (for_listener: shm's full
  // queues, whatever GPUSOCK_SHM_QUEUE says: a storm of clients' name
  // exchanges and requests waits in them).
  // A connection's comes from the spares when one is ready (shm_spares.h).
  gs_status_t open_shared(std::shared_ptr<RdmShared> *out, bool for_listener = false);

  shm::ShmWatchdog &watchdog() { return watchdog_; }
  SpareEndpoints &spares() { return *spares_; }
  // The socket every endpoint of the domain rings peers' bells from.
  int ringer() const { return ringer_; }
  void take_hints(const uint64_t *mask, size_t words, std::vector<int32_t> *slots) override {
    hints_->take(mask, words, slots);
  }
  shm::HintBoard &hints() { return *hints_; }
  std::unique_ptr<wire::SleepGroup> open_sleep_group() override { return shm::ShmSleepGroup::open(hints_); }

  // Keeps a retired endpoint's fids until its peer has read its name exchange
  // (at most kMaxParked; the oldest is closed first); closes them at once when
  // there is nothing to wait for (no peer, or one in this process). Those
  // settled are closed here and whenever the domain opens an endpoint.
  void park(ParkedEndpoint &&endpoint);
  void close_settled_parked();
  void close_parked_for_good();  // the domain is going

 private:
  void close_settled_locked();
  gs_status_t open_shared_now(std::shared_ptr<RdmShared> *out, bool for_listener);
  int ringer_ = -1;
  std::shared_ptr<shm::HintBoard> hints_ = std::make_shared<shm::HintBoard>();
  std::mutex parked_mu_;
  std::deque<ParkedEndpoint> parked_;
  shm::ShmWatchdog watchdog_;               // destroyed (joined) before the fabric objects
  std::unique_ptr<SpareEndpoints> spares_;  // stopped first in the destructor
};

// --- listener side -------------------------------------------------------------

struct RdmListenerCore {
  // A control message the client has not made room for yet. A REJECT owns its
  // AV entry (removed once sent); an ACK borrows its request's, and its bell.
  struct PendingCtrl {
    PeerRef owned;
    std::string owned_name;  // its endpoint: parked for if still unread at the end
    fi_addr_t addr = FI_ADDR_NOTAVAIL;
    const shm::PeerBell *borrowed_bell = nullptr;
    CtrlMsg msg;
    const shm::PeerBell &bell() const { return owned.valid() ? owned.bell : *borrowed_bell; }
  };

  RdmDomain *domain = nullptr;
  std::shared_ptr<RdmShared> shared;
  std::mutex mu;  // everything below, and the fids
  std::vector<CtrlMsg> bufs;
  std::deque<PendingCtrl> pending;
  std::atomic<size_t> pending_count{0};  // pending.size(), for maybe_ready
  bool send_blocked = false;             // the front of `pending` met -FI_EAGAIN: ask its client to ring back
  int rendezvous_fd = -1;
  std::string rendezvous;
  bool closed = false;  // the Listener object is gone; requests may live on
  sockaddr_storage bound{};
  std::shared_ptr<shm::PeerWatch> stuck_watch;  // releases a lock a dead client left held
  shm::NameExchangeGuard name_exchanges;        // before every progress pass (shm_name_exchange.h)
  // -EMFILE/-ENFILE while a client's name exchange waits for a descriptor of
  // ours (get_request says so; the listener reads as ready), else 0.
  std::atomic<int> short_of{0};
  Creator creator;  // only it removes the rendezvous and closes the listener

  ~RdmListenerCore();
  gs_status_t post_buf(size_t index) {
    return fi_status(fi_recv(shared->ep, &bufs[index], sizeof(CtrlMsg), nullptr, FI_ADDR_UNSPEC, &bufs[index]));
  }
  // All with mu held.
  void send_locked(PendingCtrl &&entry);
  void send_reject_locked(PeerRef &&peer, const char *peer_name, uint64_t nonce);
  void send_ack_locked(fi_addr_t addr, const shm::PeerBell *bell, uint64_t nonce);
  void drop_pending_ack_locked(uint64_t nonce);
  void flush_pending_locked();
  // A client out of our AV (and shm's table of peers): its admission is free.
  void forget_client_locked(PeerRef *client);
  void forget_parked_client_locked(const CtrlMsg &probe);
  bool screen_name_exchanges_locked();  // before every read of the CQ: false, no read now
  // Read REQs off the CQ; each valid one goes to `on_request`.
  template <class F>
  void drain_locked(F &&on_request);
  // Refuse what arrived but was not handed out, giving clients a moment to
  // make room.
  void refuse_unhandled_locked();
  // Sends what is pending for a moment (reading the CQ meanwhile when
  // read_cq); the rest stays pending, for the destructor to park.
  void flush_for_a_moment_locked(bool read_cq);
  // The Listener object is going: what waits is refused, then no new
  // connections (the rendezvous goes), but requests already handed out keep
  // the endpoint for their answers.
  void shutdown();
};

class RdmConnectionRequest final : public ConnectionRequest {
 public:
  RdmConnectionRequest(std::shared_ptr<RdmListenerCore> core, const CtrlMsg &msg, PeerRef &&client)
      : core_(std::move(core)), msg_(msg), client_(std::move(client)) {}
  ~RdmConnectionRequest() override;

  const uint8_t *private_data() const override { return msg_.private_data; }
  uint32_t private_len() const override { return msg_.private_len; }
  void reject() override;

  const CtrlMsg &msg() const { return msg_; }
  const PeerRef &client() const { return client_; }
  bool answered() const { return answered_; }
  void mark_accepted() { answered_ = true; }
  const std::shared_ptr<RdmListenerCore> &core() const { return core_; }

 private:
  std::shared_ptr<RdmListenerCore> core_;
  CtrlMsg msg_;
  PeerRef client_;  // in the listener's AV
  bool answered_ = false;
};

}  // namespace gpusock::wire::fabric::rdm
