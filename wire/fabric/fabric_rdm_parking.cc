// Endpoints kept open after their owner let them go, until the peer has read
// their name exchange.
//
// shm 1.17 introduces a sender to a receiver with a name exchange, queued in
// the receiver's region on the first send; the receiver maps the region it
// names when it reads it. If the sender's endpoint was closed in between
// (which unlinks its region), the map fails and shm dereferences a null
// region (smr_progress_connreq; later libfabric checks): a client that gave
// up on a connect whose REQ was still waiting crashed the listener's process
// when that listener next read its queue. So an endpoint whose last control
// message still met -FI_EAGAIN (the exchange unread) at a live peer is not
// closed: the domain keeps its fids here and closes them once a probe goes
// through (the exchange was read) or the peer's endpoint or process is gone.
#include "wire/fabric/fabric_rdm.h"

#include <unistd.h>

#include <chrono>
#include <thread>

namespace gpusock::wire::fabric::rdm {
namespace {

constexpr size_t kMaxParked = 64;  // each holds a region (~4 MiB of tmpfs touched)

bool region_exists(const std::string &name) { return access(("/dev/shm/" + name).c_str(), F_OK) == 0; }

void close_parked(ParkedEndpoint *parked) {
  remove_peer(*parked->shared, &parked->peer);
  parked->shared.reset();  // the last reference: fi_close, shm unlinks the region
}

}  // namespace

bool ParkedEndpoint::settled() const {
  if (!shm::endpoint_owner_alive(peer_name) || !region_exists(peer_name)) return true;
  // -FI_EAGAIN while the exchange is unread; a probe that goes is ignored.
  const CtrlMsg probe = make_ctrl(kProbe, 0, shared->name);
  return fi_inject(shared->ep, &probe, sizeof probe, peer.addr) != -FI_EAGAIN;
}

void RdmDomain::park(ParkedEndpoint &&endpoint) {
  // An in-process peer keeps our region mapped by its pin (fabric_rdm.cc,
  // "Peers in the same process"); no peer, nothing to wait for.
  if (!endpoint.peer.valid() || endpoint.peer.pin) {
    close_parked(&endpoint);
    return;
  }
  std::lock_guard<std::mutex> lock(parked_mu_);
  parked_.push_back(std::move(endpoint));
  close_settled_locked();
  if (parked_.size() > kMaxParked) {
    close_parked(&parked_.front());
    parked_.pop_front();
  }
}

void RdmDomain::close_settled_parked() {
  std::lock_guard<std::mutex> lock(parked_mu_);
  close_settled_locked();
}

void RdmDomain::close_settled_locked() {
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (it->settled()) {
      close_parked(&*it);
      it = parked_.erase(it);
    } else {
      ++it;
    }
  }
}

// The domain is going: its endpoints must close before it does. Peers that
// still progress get a moment to read what waits.
void RdmDomain::close_parked_for_good() {
  std::lock_guard<std::mutex> lock(parked_mu_);
  for (int i = 0; i < 100 && !parked_.empty(); ++i) {
    close_settled_locked();
    if (!parked_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (auto &parked : parked_) close_parked(&parked);
  parked_.clear();
}

}  // namespace gpusock::wire::fabric::rdm
