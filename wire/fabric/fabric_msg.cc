// FI_EP_MSG flavour ("fabric:tcp"): libfabric's own connection management.
//
//   listen      fi_passive_ep bound to the sockaddr (a real kernel TCP port;
//               port 0 gets an ephemeral one, read back with fi_getname)
//   connect     the fid_ep is created here, when the peer's address family is
//               known; our record travels as CM private data
//   get_request FI_CONNREQ (fi_info with the connection handle + private data)
//   accept      fi_endpoint(request info) + fi_accept with our record
//   events      FI_CONNECTED -> kEstablished (client: the server's record from
//               the event; server: the client's record from the request)
//               ECONNREFUSED error (no listener, or fi_reject) -> kRejected
//               FI_SHUTDOWN (fi_shutdown either side, peer death) -> kDisconnected
//
// One EQ per domain serves every endpoint and listener (an EQ costs file
// descriptors); events are routed by fid to per-object mailboxes under the
// domain's CM mutex. Each endpoint has its own CQ, so data completions need no
// routing and poll() takes no lock of ours.
//
// Data progress: tcp progresses sockets inside fi_cq_read (it runs epoll on the
// CQ's wait set), so a peer's FI_SHUTDOWN is noticed by poll(), or by poll_cm()
// which does a zero-entry fi_cq_read at most once per millisecond while
// established.
//
// Writes with an immediate are fi_writedata / fi_inject_writedata (inline and
// <= 128 bytes); the 8-byte CQ data carries imm | length << 32, because tcp
// reports len 0 for a remote write. tcp needs no posted receive for them (mode
// has no FI_RX_CQ_DATA); if a provider asked for it, post_recv would post that
// many zero-length receives (deferred until the fid_ep exists).
//
// A zero-length plain write (keepalive) goes over the wire: tcp sends an RMA
// header and completes it locally once the socket took it, so it fails with
// the connection.
//
// A Listener destroyed while requests it handed out live on keeps its pep (the
// kernel port stays bound) until the last of them goes; connection requests
// arriving meanwhile are refused as they are read off the EQ.
#include "wire/fabric/fabric_common.h"

#include <netinet/in.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <unordered_map>

namespace gpusock::wire::fabric {
namespace {

constexpr size_t kMaxCmData = 256;  // tcp's TCPX_MAX_CM_DATA_SIZE

// A CM event as read from the EQ, before the endpoint interprets it.
struct RawCmEvent {
  enum Type : uint8_t { kConnReq, kConnected, kShutdown, kError } type = kError;
  int err = 0;                 // kError / error shutdown: positive errno
  fi_info *info = nullptr;     // kConnReq: owned
  uint8_t data[64] = {};
  uint32_t data_len = 0;
};

// Events for one fid; guarded by MsgDomain::cm_mutex_.
struct CmMailbox {
  std::deque<RawCmEvent> events;
  std::atomic<uint32_t> pending{0};
  fid_pep *refuse_from = nullptr;  // a closed listener: refuse its FI_CONNREQs on arrival
};

class MsgDomain;

struct MsgListenerCore {
  MsgDomain *domain = nullptr;
  fid_pep *pep = nullptr;
  CmMailbox mailbox;
  ~MsgListenerCore();
  // The Listener object is going: refuse what waits and what comes. The pep
  // stays open while requests handed out still need it for fi_reject.
  void shutdown();
  // Read the EQ, then refuse every connection request waiting here; with the
  // domain's CM mutex held.
  void refuse_queued_locked();
};

class MsgConnectionRequest final : public ConnectionRequest {
 public:
  MsgConnectionRequest(std::shared_ptr<MsgListenerCore> core, RawCmEvent &&event)
      : core_(std::move(core)), info_(event.info), len_(event.data_len) {
    event.info = nullptr;
    std::memcpy(data_, event.data, len_);
  }
  ~MsgConnectionRequest() override;

  const uint8_t *private_data() const override { return data_; }
  uint32_t private_len() const override { return len_; }
  void reject() override;

  fi_info *info() const { return info_; }
  bool answered() const { return accepted_ || rejected_; }
  void mark_accepted() { accepted_ = true; }

 private:
  std::shared_ptr<MsgListenerCore> core_;
  fi_info *info_;
  uint8_t data_[64];
  uint32_t len_;
  bool accepted_ = false;
  bool rejected_ = false;
};

class MsgEndpoint;

class MsgDomain final : public FabricDomainBase {
 public:
  explicit MsgDomain(const ProviderAttr &attr) : FabricDomainBase(attr) {}
  ~MsgDomain() override { close_fid(eq_); }

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

  // An fi_info for an endpoint of `family` (src/dest addresses cleared).
  InfoPtr endpoint_info(int family) const;

 private:
  void route(fid_t fid, RawCmEvent &&event);

  fid_eq *eq_ = nullptr;
  std::mutex cm_mutex_;
  std::unordered_map<fid_t, CmMailbox *> mailboxes_;
};

class MsgListener final : public Listener {
 public:
  explicit MsgListener(std::shared_ptr<MsgListenerCore> core) : core_(std::move(core)) {}
  ~MsgListener() override { core_->shutdown(); }
  int get_request(std::unique_ptr<ConnectionRequest> *out) override;
  gs_status_t local_address(sockaddr_storage *out, socklen_t *len) const override;

 private:
  std::shared_ptr<MsgListenerCore> core_;
};

class MsgEndpoint final : public FabricEndpointBase {
 public:
  explicit MsgEndpoint(MsgDomain *domain) : domain_(domain) {}
  ~MsgEndpoint() override;

  gs_status_t init();
  // Passive side: the fid_ep from a connection request.
  gs_status_t init_from_request(MsgConnectionRequest *request);
  gs_status_t start_accept(MsgConnectionRequest *request, const void *private_data, uint32_t private_len);

  gs_status_t connect(const sockaddr *addr, socklen_t len, const void *private_data,
                      uint32_t private_len) override;
  gs_status_t post_write(const WriteRequest &request) override;
  gs_status_t post_recv(uint32_t count) override;
  int poll(Completion *out, int max) override;
  int poll_cm(CmEvent *out) override;
  void disconnect() override;
  gs_status_t local_address(sockaddr_storage *out, socklen_t *len) const override;
  gs_status_t peer_address(sockaddr_storage *out, socklen_t *len) const override;

 private:
  gs_status_t open_ep(fi_info *info);
  gs_status_t post_recvs(uint32_t count);

  MsgDomain *domain_;
  fid_ep *ep_ = nullptr;
  fid_cq *cq_ = nullptr;
  CmMailbox mailbox_;
  bool registered_ = false;
  bool rx_cq_data_ = false;
  uint32_t deferred_recvs_ = 0;     // FI_RX_CQ_DATA: receives asked for before the ep existed
  uint64_t last_cm_check_ms_ = 0;
  bool cm_check_now_ = false;       // poll() saw an error: look at the EQ soon
  uint8_t peer_record_[64] = {};    // passive side: the client's private data
  uint32_t peer_record_len_ = 0;
  static char recv_dummy_;
};

char MsgEndpoint::recv_dummy_;

// --- domain ------------------------------------------------------------------

gs_status_t MsgDomain::open(std::string *error) {
  gs_status_t ret = open_base(error);
  if (ret < 0) return ret;
  fi_eq_attr eq_attr{};
  eq_attr.size = 1024;
  eq_attr.wait_obj = FI_WAIT_UNSPEC;
  int rc = fi_eq_open(fabric_, &eq_attr, &eq_, nullptr);
  if (rc != 0) {
    if (error != nullptr) *error = "gpusock: fi_eq_open(tcp): " + fi_error_text(rc);
    return fi_status(rc);
  }
  return 0;
}

InfoPtr MsgDomain::endpoint_info(int family) const {
  InfoPtr info(fi_dupinfo(info_.get()));
  if (!info) return info;
  std::free(info->src_addr);
  info->src_addr = nullptr;
  info->src_addrlen = 0;
  std::free(info->dest_addr);
  info->dest_addr = nullptr;
  info->dest_addrlen = 0;
  info->addr_format = family == AF_INET6 ? FI_SOCKADDR_IN6 : FI_SOCKADDR_IN;
  return info;
}

void MsgDomain::route(fid_t fid, RawCmEvent &&event) {
  auto it = mailboxes_.find(fid);
  if (it == mailboxes_.end()) {
    // Nobody listens for this fid any more.
    if (event.info != nullptr) fi_freeinfo(event.info);
    return;
  }
  if (it->second->refuse_from != nullptr && event.info != nullptr) {
    fi_reject(it->second->refuse_from, event.info->handle, nullptr, 0);
    fi_freeinfo(event.info);
    return;
  }
  it->second->events.push_back(std::move(event));
  it->second->pending.fetch_add(1, std::memory_order_release);
}

void MsgDomain::pump_locked() {
  alignas(fi_eq_cm_entry) uint8_t buffer[sizeof(fi_eq_cm_entry) + kMaxCmData];
  for (int i = 0; i < 256; ++i) {
    uint32_t event = 0;
    ssize_t ret = fi_eq_read(eq_, &event, buffer, sizeof(buffer), 0);
    if (ret == -FI_EAVAIL) {
      fi_eq_err_entry err{};
      ret = fi_eq_readerr(eq_, &err, 0);
      if (ret < 0) break;
      RawCmEvent raw;
      raw.type = RawCmEvent::kError;
      raw.err = err.err != 0 ? err.err : EIO;
      if (raw.err >= FI_ERRNO_OFFSET) raw.err = -fi_status(-raw.err);
      if (err.err_data != nullptr && err.err_data_size > 0) {
        raw.data_len = static_cast<uint32_t>(std::min<size_t>(err.err_data_size, sizeof(raw.data)));
        std::memcpy(raw.data, err.err_data, raw.data_len);
      }
      route(err.fid, std::move(raw));
      continue;
    }
    if (ret < 0) break;  // -FI_EAGAIN: empty
    const auto *entry = reinterpret_cast<const fi_eq_cm_entry *>(buffer);
    RawCmEvent raw;
    const size_t data_len = static_cast<size_t>(ret) > sizeof(fi_eq_cm_entry) ? ret - sizeof(fi_eq_cm_entry) : 0;
    raw.data_len = static_cast<uint32_t>(std::min(data_len, sizeof(raw.data)));
    std::memcpy(raw.data, entry->data, raw.data_len);
    switch (event) {
      case FI_CONNREQ:
        raw.type = RawCmEvent::kConnReq;
        raw.info = entry->info;
        break;
      case FI_CONNECTED: raw.type = RawCmEvent::kConnected; break;
      case FI_SHUTDOWN: raw.type = RawCmEvent::kShutdown; break;
      default:
        if (entry->info != nullptr) fi_freeinfo(entry->info);
        continue;
    }
    route(entry->fid, std::move(raw));
  }
}

bool MsgDomain::next_event(CmMailbox *mailbox, bool pump, RawCmEvent *out) {
  if (!pump && mailbox->pending.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard<std::mutex> lock(cm_mutex_);
  if (mailbox->events.empty() && pump) pump_locked();
  if (mailbox->events.empty()) return false;
  *out = std::move(mailbox->events.front());
  mailbox->events.pop_front();
  mailbox->pending.fetch_sub(1, std::memory_order_relaxed);
  return true;
}

gs_status_t MsgDomain::create_endpoint(ConnectionRequest *request, std::unique_ptr<Endpoint> *out) {
  return create_endpoint_as<MsgEndpoint, MsgConnectionRequest>(this, request, out);
}

gs_status_t MsgDomain::accept(Endpoint *endpoint, ConnectionRequest *request, const void *private_data,
                              uint32_t private_len) {
  return accept_as<MsgEndpoint, MsgConnectionRequest>(caps_, endpoint, request, private_data, private_len);
}

gs_status_t MsgDomain::listen(const sockaddr *addr, socklen_t len, int backlog, std::unique_ptr<Listener> *out) {
  sockaddr_storage bind_addr;
  if (out == nullptr || !copy_sockaddr(addr, len, &bind_addr)) return -EINVAL;
  InfoPtr info = endpoint_info(addr->sa_family);
  if (!info) return -ENOMEM;
  const socklen_t addr_len = sockaddr_len(addr);
  info->src_addr = std::malloc(addr_len);
  if (info->src_addr == nullptr) return -ENOMEM;
  std::memcpy(info->src_addr, &bind_addr, addr_len);
  info->src_addrlen = addr_len;

  auto core = std::make_shared<MsgListenerCore>();
  core->domain = this;
  int ret = fi_passive_ep(fabric_, info.get(), &core->pep, nullptr);
  if (ret != 0) return fi_status(ret);
  ret = fi_pep_bind(core->pep, &eq_->fid, 0);
  if (ret != 0) return fi_status(ret);
  if (backlog > 0) {
    int value = backlog;
    (void)fi_control(&core->pep->fid, FI_BACKLOG, &value);
  }
  {
    std::lock_guard<std::mutex> lock(cm_mutex_);
    add_mailbox(&core->pep->fid, &core->mailbox);
  }
  ret = fi_listen(core->pep);
  if (ret != 0) return fi_status(ret);  // ~MsgListenerCore unregisters and closes
  *out = std::make_unique<MsgListener>(std::move(core));
  return 0;
}

// --- listener ----------------------------------------------------------------

void MsgListenerCore::refuse_queued_locked() {
  domain->pump_locked();
  for (RawCmEvent &event : mailbox.events) {
    if (event.type == RawCmEvent::kConnReq && event.info != nullptr) {
      fi_reject(pep, event.info->handle, nullptr, 0);
      fi_freeinfo(event.info);
    }
  }
  mailbox.events.clear();
}

MsgListenerCore::~MsgListenerCore() {
  if (pep == nullptr) return;
  std::lock_guard<std::mutex> lock(domain->cm_mutex());
  // tcp does not drop a closed pep's queued FI_CONNREQs: take them now (and
  // refuse them) so that none is left naming a freed fid. The mailbox goes
  // after the pump, which still routes to it.
  refuse_queued_locked();
  domain->remove_mailbox(&pep->fid);
  close_fid(pep);
}

void MsgListenerCore::shutdown() {
  std::lock_guard<std::mutex> lock(domain->cm_mutex());
  refuse_queued_locked();
  mailbox.pending.store(0, std::memory_order_relaxed);
  mailbox.refuse_from = pep;
}

int MsgListener::get_request(std::unique_ptr<ConnectionRequest> *out) {
  if (out == nullptr) return -EINVAL;
  RawCmEvent event;
  while (core_->domain->next_event(&core_->mailbox, true, &event)) {
    if (event.type != RawCmEvent::kConnReq || event.info == nullptr) continue;
    *out = std::make_unique<MsgConnectionRequest>(core_, std::move(event));
    return 1;
  }
  return 0;
}

gs_status_t MsgListener::local_address(sockaddr_storage *out, socklen_t *len) const {
  sockaddr_storage addr{};
  size_t addr_len = sizeof(addr);
  int ret = fi_getname(&core_->pep->fid, &addr, &addr_len);
  if (ret != 0) return fi_status(ret);
  return output_sockaddr(addr, out, len);
}

// --- connection request ------------------------------------------------------

MsgConnectionRequest::~MsgConnectionRequest() {
  // An unanswered request is refused (fi_reject also frees the handle when an
  // endpoint was made from it and never accepted).
  if (!answered() && info_ != nullptr && info_->handle != nullptr) fi_reject(core_->pep, info_->handle, nullptr, 0);
  if (info_ != nullptr) fi_freeinfo(info_);
}

void MsgConnectionRequest::reject() {
  if (answered() || info_ == nullptr) return;
  rejected_ = true;
  fi_reject(core_->pep, info_->handle, nullptr, 0);
}

// --- endpoint ----------------------------------------------------------------

gs_status_t MsgEndpoint::init() {
  rx_cq_data_ = domain_->rx_cq_data();
  gs_status_t ret = init_base(*domain_);
  if (ret < 0) return ret;
  return domain_->open_endpoint_cq(&cq_);
}

gs_status_t MsgEndpoint::open_ep(fi_info *info) {
  int ret = fi_endpoint(domain_->domain(), info, &ep_, nullptr);
  if (ret != 0) return fi_status(ret);
  ret = fi_ep_bind(ep_, &domain_->eq()->fid, 0);
  if (ret == 0) ret = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV);
  if (ret == 0) ret = fi_enable(ep_);
  if (ret != 0) return fi_status(ret);
  std::lock_guard<std::mutex> lock(domain_->cm_mutex());
  domain_->add_mailbox(&ep_->fid, &mailbox_);
  registered_ = true;
  return 0;
}

gs_status_t MsgEndpoint::init_from_request(MsgConnectionRequest *request) {
  gs_status_t ret = open_ep(request->info());
  if (ret < 0) return ret;
  peer_record_len_ = request->private_len();
  std::memcpy(peer_record_, request->private_data(), peer_record_len_);
  return 0;
}

gs_status_t MsgEndpoint::start_accept(MsgConnectionRequest *request, const void *private_data,
                                      uint32_t private_len) {
  if (ep_ == nullptr || state_ != State::kIdle) return -EINVAL;
  gs_status_t ret = post_recvs(deferred_recvs_);
  if (ret < 0) return ret;
  deferred_recvs_ = 0;
  int rc = fi_accept(ep_, private_data, private_len);
  if (rc != 0) return fi_status(rc);
  request->mark_accepted();
  state_ = State::kAccepting;
  return 0;
}

MsgEndpoint::~MsgEndpoint() {
  if (ep_ != nullptr) {
    std::lock_guard<std::mutex> lock(domain_->cm_mutex());
    if (registered_) domain_->remove_mailbox(&ep_->fid);
    close_fid(ep_);  // tcp drops this fid's queued EQ events on close
  }
  for (RawCmEvent &event : mailbox_.events) {
    if (event.info != nullptr) fi_freeinfo(event.info);
  }
  close_fid(cq_);
}

gs_status_t MsgEndpoint::connect(const sockaddr *addr, socklen_t len, const void *private_data,
                                 uint32_t private_len) {
  sockaddr_storage peer;
  if (!copy_sockaddr(addr, len, &peer)) return -EINVAL;
  if (private_len > sizeof(peer_record_) || (private_len != 0 && private_data == nullptr)) return -EINVAL;
  if (ep_ != nullptr || state_ != State::kIdle) return -EISCONN;
  InfoPtr info = domain_->endpoint_info(addr->sa_family);
  if (!info) return -ENOMEM;
  gs_status_t ret = open_ep(info.get());
  if (ret < 0) return ret;
  ret = post_recvs(deferred_recvs_);
  if (ret < 0) return ret;
  deferred_recvs_ = 0;
  int rc = fi_connect(ep_, &peer, private_data, private_len);
  if (rc == -FI_ECONNREFUSED) {
    // Refused synchronously: report it the way an asynchronous refusal is.
    RawCmEvent event;
    event.type = RawCmEvent::kError;
    event.err = ECONNREFUSED;
    std::lock_guard<std::mutex> lock(domain_->cm_mutex());
    mailbox_.events.push_back(event);
    mailbox_.pending.fetch_add(1, std::memory_order_release);
  } else if (rc != 0) {
    return fi_status(rc);
  }
  state_ = State::kConnecting;
  return 0;
}

gs_status_t MsgEndpoint::post_recvs(uint32_t count) {
  if (!rx_cq_data_) return 0;
  for (uint32_t i = 0; i < count; ++i) {
    ssize_t ret = fi_recv(ep_, &recv_dummy_, 0, nullptr, FI_ADDR_UNSPEC, nullptr);
    if (ret != 0) return fi_status(ret);
  }
  return 0;
}

gs_status_t MsgEndpoint::post_recv(uint32_t count) {
  if (!rx_cq_data_) return 0;  // tcp: remote CQ data needs no receive
  if (ep_ == nullptr) {
    deferred_recvs_ += count;
    return 0;
  }
  return post_recvs(count);
}

gs_status_t MsgEndpoint::post_write(const WriteRequest &request) { return post_write_to(ep_, 0, request); }

int MsgEndpoint::poll(Completion *out, int max) {
  if (cq_ == nullptr || max <= 0) return 0;
  int n = 0;
  const int got = read_cq(
      cq_, out, max, &n, [](const fi_cq_data_entry &) {},
      [this](const fi_cq_err_entry &, bool) { cm_check_now_ = true; });  // the EQ may say why
  if (got < 0) return got;
  if (!ring_.empty()) n += ring_.drain(out + n, max - n);
  return n;
}

int MsgEndpoint::poll_cm(CmEvent *out) {
  if (out == nullptr || ep_ == nullptr) return 0;
  bool pump = true;
  if (state_ == State::kEstablished || state_ == State::kClosed) {
    // Established: the EQ only ever brings FI_SHUTDOWN, which tcp raises from
    // CQ progress; look at most once a millisecond unless poll() saw an error.
    const uint64_t now = coarse_ms();
    pump = cm_check_now_ || now != last_cm_check_ms_;
    if (pump) {
      last_cm_check_ms_ = now;
      cm_check_now_ = false;
      if (state_ == State::kEstablished) (void)fi_cq_read(cq_, nullptr, 0);  // progress only
    }
  }
  RawCmEvent event;
  while (domain_->next_event(&mailbox_, pump, &event)) {
    *out = CmEvent{};
    switch (event.type) {
      case RawCmEvent::kConnected:
        if (state_ != State::kConnecting && state_ != State::kAccepting) continue;
        out->kind = CmEventKind::kEstablished;
        if (state_ == State::kAccepting) {
          out->peer_private_len = peer_record_len_;
          std::memcpy(out->peer_private_data, peer_record_, peer_record_len_);
        } else {
          out->peer_private_len = event.data_len;
          std::memcpy(out->peer_private_data, event.data, event.data_len);
        }
        state_ = State::kEstablished;
        return 1;
      case RawCmEvent::kShutdown:
        if (state_ == State::kClosed) continue;
        out->kind = state_ == State::kEstablished ? CmEventKind::kDisconnected : CmEventKind::kError;
        out->status = state_ == State::kEstablished ? 0 : -ECONNRESET;
        state_ = State::kClosed;
        ring_.fail_all(-ECONNRESET);
        return 1;
      case RawCmEvent::kError:
        if (state_ == State::kClosed) continue;
        out->status = -event.err;
        if (state_ == State::kConnecting) {
          out->kind = event.err == ECONNREFUSED ? CmEventKind::kRejected : CmEventKind::kError;
          out->peer_private_len = event.data_len;
          std::memcpy(out->peer_private_data, event.data, event.data_len);
        } else if (state_ == State::kEstablished) {
          out->kind = CmEventKind::kDisconnected;
        } else {
          out->kind = CmEventKind::kError;
        }
        state_ = State::kClosed;
        ring_.fail_all(-ECONNRESET);
        return 1;
      default:
        if (event.info != nullptr) fi_freeinfo(event.info);
        continue;
    }
  }
  return 0;
}

void MsgEndpoint::disconnect() {
  if (ep_ == nullptr) return;
  if (state_ == State::kEstablished || state_ == State::kConnecting || state_ == State::kAccepting) {
    // tcp flushes what is queued, closes the socket and raises FI_SHUTDOWN on
    // both sides (ours included).
    (void)fi_shutdown(ep_, 0);
  }
}

gs_status_t MsgEndpoint::local_address(sockaddr_storage *out, socklen_t *len) const {
  if (ep_ == nullptr) return -ENOTCONN;
  sockaddr_storage addr{};
  size_t addr_len = sizeof(addr);
  int ret = fi_getname(&ep_->fid, &addr, &addr_len);
  if (ret != 0) return fi_status(ret);
  return output_sockaddr(addr, out, len);
}

gs_status_t MsgEndpoint::peer_address(sockaddr_storage *out, socklen_t *len) const {
  if (ep_ == nullptr) return -ENOTCONN;
  sockaddr_storage addr{};
  size_t addr_len = sizeof(addr);
  int ret = fi_getpeer(ep_, &addr, &addr_len);
  if (ret != 0) return fi_status(ret);
  return output_sockaddr(addr, out, len);
}

}  // namespace

gs_status_t open_msg_domain(const ProviderAttr &attr, std::unique_ptr<Domain> *out, std::string *error) {
  return open_domain_as<MsgDomain>(attr, out, error);
}

}  // namespace gpusock::wire::fabric
