// FI_EP_RDM flavour ("fabric:shm"): connections made by gpusock itself.
//
// shm has no connection management, no listening ports, no failure detection
// and no cross-process wake-up, so gpusock supplies them. The files:
//   fabric_rdm.cc           this overview; the domain, naming and opening endpoints
//   fabric_rdm.h            what the files below share
//   fabric_rdm_peers.cc     control messages, addresses, the in-process registry, AV entries
//   fabric_rdm_listener.cc  listen(), the rendezvous, REQ in, ACK/REJECT out
//   fabric_rdm_endpoint.cc  connection endpoints: handshake, data, dead peers, waiting
//   fabric_rdm_parking.cc   closed endpoints kept until their peer read their introduction
//   shm_names.{h,cc}        names in /dev/shm, and sweeping what dead processes left
//   shm_region.{h,cc}       the head of shm's region, as far as gpusock reads it
//   shm_watchdog.{h,cc}     dead peers and the region locks they leave held
//   shm_bell.{h,cc}         bells: waking a sleeping endpoint from another process
//
// Names. Every endpoint (connection or listener) is an RDM endpoint with its own
// CQ and AV, named "gpusock-ep-<pid>-<start time>-<random tag>-<seq>" with
// fi_setname before fi_enable; shm creates its region as /dev/shm/<name> and
// unlinks it on fi_close. Names are never reused inside a process (shm 1.17
// keeps a process-wide list of the names it created, never prunes it, and would
// hand back an unmapped region for a reused name), nor by a later process with
// the same pid (shm_names.h: a killed process leaves its regions behind, and
// shm refuses a name whose stale region looks alive). Opening the domain
// removes regions, bells and rendezvous files that dead processes left (once
// per process).
//
// Rendezvous. listen(ip:port) creates the POSIX shm object "gpusock-<ip>-<port>"
// (/dev/shm/gpusock-127.0.0.1-5000), takes an OFD write lock on it and writes
// {magic, version, pid, listener endpoint name}. The lock and a live process
// named in it say "a live listener owns this": a second listen gets EADDRINUSE
// (error_detail() names the owner), a stale file from a killed listener is
// taken over (also when a child that inherited the descriptor keeps its lock).
// Port 0 picks a free port in 32768..60999. The file is unlinked when the
// Listener object is destroyed (REQs not yet handed out are refused then;
// requests already handed out keep the listener endpoint alive for their
// ACCEPT/REJECT).
//
// Handshake (messages are FI_MSG injects of CtrlMsg; every message of a
// connection carries the client's random 64-bit nonce):
//   client  connect(addr): find the rendezvous for addr (then for the wildcard
//           addresses of its family); none locked -> kRejected(-ECONNREFUSED)
//           as an event from poll_cm (connect itself returns 0, as for tcp).
//           Send REQ {nonce, client endpoint name, pid, client addr, addr,
//           private data} to the listener endpoint.
//   server  get_request yields REQ and answers ACK ("your REQ is with the
//           application": from then on an ACCEPT or a REJECT will come, a
//           dropped request being refused); create_endpoint(request) makes the
//           connection endpoint and inserts the client's name in its AV;
//           Domain::accept sends ACCEPT {nonce, server endpoint name, pid,
//           server addr, private data} from that endpoint, and once shm took
//           it, the server's poll_cm says kEstablished (with the client's
//           private data). reject() (or dropping an unanswered request) sends
//           REJECT from the listener endpoint.
//   client  ACCEPT -> kEstablished (with the server's private data), the
//           server endpoint becomes the peer; REJECT -> kRejected(-ECONNREFUSED).
//   either  disconnect() sends BYE: the peer says kDisconnected(0), and so do
//           we (as tcp and verbs do for the side that disconnects).
// A first send to a new peer returns -FI_EAGAIN until the peer's progress has
// processed shm's own name exchange, so every control message can be pending;
// it is retried from poll() and poll_cm().
//
// Data. Writes with an immediate are fi_writedata / fi_inject_writedata (inline
// and <= 4096 bytes), the 8-byte CQ data carrying imm | length << 32; they need
// no posted receive. A zero-length plain write (keepalive) takes shm's fast
// RMA path: a 0-byte process_vm_writev to the peer plus a command in its queue,
// completed locally at post time (it fails if the peer process is gone).
//
// Addresses. local_address/peer_address are the sockaddrs of the handshake:
// the server's local is the address the client connected to, its peer the
// client's; the client's peer is the address it connected to, its local the
// same IP (loopback if that was a wildcard) with a port made from its pid and
// endpoint number (49152..65535). No kernel port is involved.
//
// Dead peers. The handshake carries both pids. A per-domain watchdog thread
// (shm_watchdog.h) holds a pidfd for every cross-process peer process (one
// per process, shared by all connections to it, and one for the listener's
// process while a client connects); when one becomes readable it marks each
// connection to that process dead, rings the endpoint's bell, and releases the shm region
// locks the dead process may have held (without that, the next provider call
// spins forever). poll() looks at that flag (an atomic load) on every call,
// poll_cm() too: a dead peer gives kDisconnected(-ECONNRESET) (kError before
// establishment), outstanding writes complete with -ECONNRESET, and the dead
// peer's region and bell are unlinked (shm cannot do it for a killed
// process). A connecting client whose listener dies gets
// kRejected(-ECONNREFUSED); so does one whose REQ was not ACKed when the
// rendezvous stops naming that listener (closed, or replaced). Without
// pidfd_open the watchdog polls kill(pid, 0) every 10 ms.
//
// Waiting. Each endpoint's wait_fd is its bell (shm_bell.h): a datagram
// socket that senders ring when the endpoint sleeps. arm_wait() drains it,
// sets the bell's `armed` word and looks again at everything that could wake
// it: its region's `signal` word (shm sets it on every enqueue and response),
// events and completions already taken, dead or departed peers, a listener
// that closed; a send that met -FI_EAGAIN asks its peer to ring back after its
// next progress pass. After every post and every progress pass the endpoint
// wakes its peer if that one is armed (a fence and a load when it is not).
// maybe_ready() is the same look without the system calls. A peer without a
// bell (an older gpusock) never rings: an endpoint that waits on one does not
// sleep (arm_wait says -EAGAIN).
//
// Peers in the same process. shm maps an in-process peer's region by pointer,
// so an endpoint must not be closed while another live endpoint of the process
// may still touch its region. Each endpoint's fids live in an RdmShared; an
// endpoint holds the RdmShared of every in-process peer it sends to, and before
// its first send it registers itself in the peer's `inbound` list, which keeps
// its own region mapped until that peer object is gone. Cross-process peers map
// regions privately and need none of this.
//
// Limits (shm 1.17): 256 peers per AV (one per connection here, plus the
// listener's short-lived entries, removed after each request), ep_cnt 256 per
// domain advertised but not enforced (300 endpoints in one domain work), each
// endpoint's region is 16 MiB of sparse /dev/shm of which 3.8 MiB is touched
// (creation ~4 ms), so 100 connections in one process cost ~760 MiB of tmpfs
// for both ends. shm 1.17 also keeps ~300 bytes per endpoint ever created in a
// process-wide list until the provider unloads. Each endpoint has one file
// descriptor (its bell); the first 64 peers a process rings also get a
// socket connected to their bell (shm_bell.h).
#include "wire/fabric/fabric_rdm.h"
#include "wire/config.h"
#include "wire/fabric/shm_region.h"
#include "wire/spin_lock.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace gpusock::wire::fabric {
namespace rdm {

RdmDomain::~RdmDomain() {
  if (spares_) spares_->stop();  // its thread opens endpoints of this domain
  close_parked_for_good();
  if (ringer_ >= 0) close(ringer_);
}

gs_status_t RdmDomain::open(std::string *error) {
  gs_status_t ret = open_base(error);
  if (ret < 0) return ret;
  ringer_ = shm::open_ringer();
  if (ringer_ < 0) {
    const int err = errno;
    if (error != nullptr) *error = std::string("gpusock: fabric:shm: no socket for bells: ") + std::strerror(err);
    return -err;
  }
  hints_->open();                 // without a board every endpoint is looked at every time
  wire::note_spin_lock_use();     // shm's region locks (spin_lock.h)
  shm::sweep_stale_files_once();  // what killed processes left in /dev/shm (shm_names.h)
  spares_ = std::make_unique<SpareEndpoints>(
      [this](std::shared_ptr<RdmShared> *out) { return open_shared_now(out, /*for_listener=*/false); },
      static_cast<uint32_t>(config::get(config::Id::kShmSpares)), ringer_);
  return 0;
}

gs_status_t RdmDomain::open_shared(std::shared_ptr<RdmShared> *out, bool for_listener) {
  close_settled_parked();
  if (!for_listener && spares_) {
    if (auto spare = spares_->take()) {
      *out = std::move(spare);
      return 0;
    }
  }
  return open_shared_now(out, for_listener);
}

gs_status_t RdmDomain::open_shared_now(std::shared_ptr<RdmShared> *out, bool for_listener) {
  auto shared = std::make_shared<RdmShared>();
  shared->name = shm::new_endpoint_name(nullptr);
  const auto failed = [&](const char *call, int ret) {
    set_error_detail(std::string("fabric:shm: ") + call + " of endpoint " + shared->name + ": " + fi_error_text(ret));
    return fi_status(ret);
  };
  InfoPtr listener_info;
  if (for_listener) {
    listener_info.reset(fi_dupinfo(info_.get()));
    if (!listener_info) return -ENOMEM;
    listener_info->tx_attr->size = kListenerQueueEntries;
    listener_info->rx_attr->size = kListenerQueueEntries;
  }
  const fi_info *info = for_listener ? listener_info.get() : info_.get();
  int ret = fi_endpoint(domain_, const_cast<fi_info *>(info), &shared->ep, nullptr);
  if (ret != 0) return failed("fi_endpoint", ret);
  ret = fi_setname(&shared->ep->fid, const_cast<char *>(shared->name.c_str()), shared->name.size() + 1);
  if (ret != 0) return failed("fi_setname", ret);
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  av_attr.count = 4;
  ret = fi_av_open(domain_, &av_attr, &shared->av, nullptr);
  if (ret != 0) return failed("fi_av_open", ret);
  ret = open_endpoint_cq(&shared->cq, FI_WAIT_NONE, info);  // shm's wait objects wake nobody in another process
  if (ret < 0) return failed("fi_cq_open", ret);
  ret = fi_ep_bind(shared->ep, &shared->av->fid, 0);
  if (ret == 0) ret = fi_ep_bind(shared->ep, &shared->cq->fid, FI_TRANSMIT | FI_RECV);
  if (ret != 0) return failed("fi_ep_bind", ret);
  ret = fi_enable(shared->ep);  // creates /dev/shm/<name>
  if (ret != 0) return failed("fi_enable", ret);
  (void)shm::release_region_tail(shared->name);  // kept as it is where holes cannot be punched
  // Before the name is published: a peer that finds no bell takes us for one
  // that never sleeps. Without one (another region layout, no resources) the
  // endpoint works and does not sleep either.
  shared->hint_slot = hints_->take_slot();
  if (shared->hint_slot >= 0) shared->board = hints_;
  shared->bell.open(shared->name, hints_.get(), shared->hint_slot);
  registry_add(shared);
  *out = std::move(shared);
  return 0;
}

}  // namespace rdm

gs_status_t open_rdm_domain(const ProviderAttr &attr, std::unique_ptr<Domain> *out, std::string *error) {
  return open_domain_as<rdm::RdmDomain>(attr, out, error);
}

}  // namespace gpusock::wire::fabric
