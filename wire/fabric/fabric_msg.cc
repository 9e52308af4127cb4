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
// One EQ per domain serves every endpoint (an EQ costs file descriptors);
// events are routed by fid to per-endpoint mailboxes under the domain's CM
// mutex. A listener has an EQ of its own, read only by get_request, because
// tcp accepts on the listening socket inside fi_eq_read: a process takes a
// connection off the kernel's queue only when its socket layer asks
// (fabric_msg.h, MsgListenerCore). Files: this one (domain, EQs, listener),
// fabric_msg.h (what they share), fabric_msg_endpoint.cc,
// fabric_msg_cq_group.cc (shared CQs).
//
// Shared completion queues. A tcp CQ costs three file descriptors (an epoll set
// and a socket pair for its signal) beside the endpoint's socket, so a process
// short of descriptors may share them (GPUSOCK_TCP_CQ_SHARE = K > 1; by default
// each endpoint has its own): while the domain holds fewer than K endpoints
// each has a CQ of its own; beyond, a new endpoint joins the newest CQ its
// thread opened that has room, K to a CQ. Sharing is not free in libfabric
// 1.17: each read of a shared CQ progresses every member's socket, and the CQ's
// fd wakes every thread asleep on any member (a server whose accepting thread
// is not the one serving, a client that opens its connections before handing
// them to threads). Each endpoint has a tag, its place in its CQ, sent to the
// peer after the private data of its connection request or accept; the peer's
// writes carry it in their CQ data (make_cq_data), as tcp says nothing else of
// which endpoint a remote write came in on. Our own writes are told apart by
// their context (a slot of one endpoint's ring). Whoever reads a CQ (tcp
// progresses every member's socket inside the read) routes what it read to its
// members under the CQ's mutex, in order; each takes its own. A CQ of one
// endpoint works the same way.
//
// Data progress: tcp progresses sockets inside fi_cq_read (it runs epoll on the
// CQ's wait set), so a peer's FI_SHUTDOWN is noticed by poll(), or by poll_cm(),
// which reads the CQ (what it finds waits for poll()) at most once per 10 ms
// while established.
//
// Waiting. Each CQ has an FI_WAIT_FD wait object: an epoll fd over its
// members' sockets (POLLIN, and POLLOUT while sends are queued) and the CQ's
// signal. That fd is each member's wait_fd; arm_wait reads the CQ once more
// (routing what it finds) and, when nothing waits for the member, marks it
// asleep, then looks at the mailbox. Any read may reset the signal (tcp does
// when its epoll reports it), so after every read, under the mutex, the CQ is
// signalled again while a member asleep has completions or CM events
// waiting; a member that sleeps meanwhile yields its CPU to the one the fd is
// readable for, rather than spin through its own sleeps. CM progress of
// connecting and accepted sockets sits in the domain EQ's wait set instead; a
// CM thread per domain sleeps on the EQ's fd and pumps it whenever it fires,
// and whoever routes an event (that thread, or an endpoint pumping in
// poll_cm) wakes the endpoint with fi_cq_signal. One thread and one wake-up
// per CM event, however many connections sleep. No wake-up is lost: the
// router counts the event (pending, seq_cst) before it signals, and the
// sleeper marks itself asleep before it reads the count. A listener's wait_fd
// is its own EQ's (the listening socket and the requests being read are in
// its set), and its arm_wait is fi_trywait on that EQ.
//
// Writes with an immediate are fi_writedata / fi_inject_writedata (inline and
// <= 128 bytes); the 8-byte CQ data carries the immediate, the target's CQ tag
// and the length, because tcp reports len 0 for a remote write. tcp needs no
// posted receive for them (mode has no FI_RX_CQ_DATA); if a provider asked for
// it, post_recv would post that many zero-length receives (deferred until the
// fid_ep exists).
//
// A zero-length plain write (keepalive) goes over the wire: tcp sends an RMA
// header and completes it locally once the socket took it, so it fails with
// the connection.
//
// A Listener destroyed while requests it handed out live on keeps its pep (the
// kernel port stays bound) until the last of them goes; what its EQ holds is
// refused at once, and connections arriving meanwhile wait in the kernel's
// queue (another process's, when the listening socket is shared) or are reset
// when the pep closes.
#include "wire/fabric/fabric_msg.h"

#include "wire/config.h"

#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace gpusock::wire::fabric {
namespace msg {
namespace {

class MsgListener final : public Listener {
 public:
  explicit MsgListener(std::shared_ptr<MsgListenerCore> core) : core_(std::move(core)) {}
  ~MsgListener() override { core_->shutdown(); }
  int get_request(std::unique_ptr<ConnectionRequest> *out) override;
  gs_status_t local_address(sockaddr_storage *out, socklen_t *len) const override;
  int wait_fd() const override { return core_->eq_fd; }
  gs_status_t arm_wait() override;

 private:
  std::shared_ptr<MsgListenerCore> core_;
};

// The listening socket among the members of an epoll set (tcp's EQ wait fd
// right after fi_listen: its signal and the pep's socket), found through
// /proc/self/fdinfo, which lists the members; -1 if none is found.
int listening_member(int epoll_fd) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/fdinfo/%d", epoll_fd);
  FILE *f = std::fopen(path, "re");
  if (f == nullptr) return -1;
  int found = -1;
  char line[256];
  while (found < 0 && std::fgets(line, sizeof line, f) != nullptr) {
    int fd = -1;
    if (std::sscanf(line, "tfd: %d", &fd) != 1) continue;
    int on = 0;
    socklen_t len = sizeof on;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &len) == 0 && on) found = fd;
  }
  std::fclose(f);
  return found;
}

}  // namespace

gs_status_t open_cm_eq(fid_fabric *fabric, fid_eq **eq, int *wait_fd, std::string *error) {
  fi_eq_attr eq_attr{};
  eq_attr.size = 1024;
  eq_attr.wait_obj = FI_WAIT_FD;
  int rc = fi_eq_open(fabric, &eq_attr, eq, nullptr);
  if (rc == 0) rc = fi_control(&(*eq)->fid, FI_GETWAIT, wait_fd);
  if (rc != 0 && error != nullptr) *error = "gpusock: fi_eq_open(tcp): " + fi_error_text(rc);
  return rc != 0 ? fi_status(rc) : 0;
}

int read_cm_event(fid_eq *eq, RawCmEvent *out, fid_t *fid) {
  alignas(fi_eq_cm_entry) uint8_t buffer[sizeof(fi_eq_cm_entry) + kMaxCmData];
  uint32_t event = 0;
  ssize_t ret = fi_eq_read(eq, &event, buffer, sizeof(buffer), 0);
  *out = RawCmEvent{};
  if (ret == -FI_EAVAIL) {
    fi_eq_err_entry err{};
    if (fi_eq_readerr(eq, &err, 0) < 0) return 0;
    out->type = RawCmEvent::kError;
    out->err = err.err != 0 ? err.err : EIO;
    if (out->err >= FI_ERRNO_OFFSET) out->err = -fi_status(-out->err);
    if (err.err_data != nullptr && err.err_data_size > 0) {
      out->data_len = static_cast<uint32_t>(std::min<size_t>(err.err_data_size, sizeof(out->data)));
      std::memcpy(out->data, err.err_data, out->data_len);
    }
    *fid = err.fid;
    return 1;
  }
  if (ret < 0) return 0;  // -FI_EAGAIN: empty
  const auto *entry = reinterpret_cast<const fi_eq_cm_entry *>(buffer);
  const size_t data_len = static_cast<size_t>(ret) > sizeof(fi_eq_cm_entry) ? ret - sizeof(fi_eq_cm_entry) : 0;
  out->data_len = static_cast<uint32_t>(std::min(data_len, sizeof(out->data)));
  std::memcpy(out->data, entry->data, out->data_len);
  *fid = entry->fid;
  switch (event) {
    case FI_CONNREQ:
      out->type = RawCmEvent::kConnReq;
      out->info = entry->info;
      return 1;
    case FI_CONNECTED:
      out->type = RawCmEvent::kConnected;
      return 1;
    case FI_SHUTDOWN:
      out->type = RawCmEvent::kShutdown;
      return 1;
    default:
      if (entry->info != nullptr) fi_freeinfo(entry->info);
      return -1;
  }
}

// --- domain ------------------------------------------------------------------

MsgDomain::~MsgDomain() {
  if (cm_thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof(one));
    cm_thread_.join();
  }
  if (stop_fd_ >= 0) close(stop_fd_);
  close_fid(eq_);
}

gs_status_t MsgDomain::open(std::string *error) {
  gs_status_t ret = open_base(error);
  if (ret < 0) return ret;
  ret = open_cm_eq(fabric_, &eq_, &eq_fd_, error);
  if (ret < 0) return ret;
  stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd_ < 0) return -errno;
  // The thread lives in other people's programs (the preload shim): it takes
  // none of their signals.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  bool started = true;
  try {
    cm_thread_ = std::thread([this] { run_cm(); });
    (void)pthread_setname_np(cm_thread_.native_handle(), "gs-tcp-cm");  // for top -H, perf, gdb
  } catch (...) {
    started = false;
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (!started) {
    if (error != nullptr) *error = "gpusock: fabric:tcp: cannot start the connection-management thread";
    return -EAGAIN;
  }
  return 0;
}

void MsgDomain::run_cm() {
  pollfd fds[2] = {{eq_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  fid *eq_fid = &eq_->fid;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(cm_mutex_);
      pump_locked();
    }
    // fi_trywait resets the EQ's signal (and lets tcp progress its CM
    // sockets); -FI_EAGAIN: something is there already.
    const int ready = fi_trywait(fabric_, &eq_fid, 1);
    if (ready == -FI_EAGAIN) continue;
    if (::poll(fds, 2, ready == 0 ? -1 : 1) < 0 && errno != EINTR) return;
    if (fds[1].revents != 0) return;
  }
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

gs_status_t MsgDomain::join_cq_group(const TxRing *ring, const CmMailbox *mailbox, std::shared_ptr<CqGroup> *group,
                                     uint32_t *tag) {
  const auto share = static_cast<uint32_t>(std::min<long>(config::get(config::Id::kTcpCqShare), CqGroup::kMaxMembers));
  std::shared_ptr<CqGroup> current;
  int joined = -ENOSPC;
  // Zero-length receives (FI_RX_CQ_DATA) carry no tag, and a tag needs the
  // CQ data's high half: a queue each.
  if (share <= 1 || rx_cq_data_ || !length_in_cq_data_ || cq_members_.load(std::memory_order_relaxed) < share) {
    gs_status_t ret = CqGroup::open(*this, 1, &current);
    if (ret < 0) return ret;
    joined = current->join(ring, mailbox);
  } else {
    std::lock_guard lock(groups_mu_);
    std::weak_ptr<CqGroup> &slot = thread_groups_[std::this_thread::get_id()];
    current = slot.lock();
    if (current && current->here()) joined = current->join(ring, mailbox);  // -ENOSPC when full
    if (joined == -ENOSPC) {
      gs_status_t ret = CqGroup::open(*this, share, &current);
      if (ret < 0) return ret;
      slot = current;
      std::erase_if(thread_groups_, [](const auto &entry) { return entry.second.expired(); });
      joined = current->join(ring, mailbox);
    }
  }
  if (joined < 0) return joined;
  cq_members_.fetch_add(1, std::memory_order_relaxed);
  *tag = static_cast<uint32_t>(joined);
  *group = std::move(current);
  return 0;
}

void MsgDomain::deliver_locked(CmMailbox *mailbox, RawCmEvent &&event) {
  mailbox->events.push_back(std::move(event));
  mailbox->pending.fetch_add(1, std::memory_order_seq_cst);
  if (mailbox->wake_cq != nullptr) fi_cq_signal(mailbox->wake_cq);
}

void MsgDomain::route(fid_t fid, RawCmEvent &&event) {
  auto it = mailboxes_.find(fid);
  if (it == mailboxes_.end()) {
    // Nobody listens for this fid any more.
    if (event.info != nullptr) fi_freeinfo(event.info);
    return;
  }
  deliver_locked(it->second, std::move(event));
}

void MsgDomain::pump_locked() {
  for (int i = 0; i < 256; ++i) {
    RawCmEvent raw;
    fid_t fid = nullptr;
    const int got = read_cm_event(eq_, &raw, &fid);
    if (got == 0) break;
    if (got > 0) route(fid, std::move(raw));
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
  gs_status_t status = open_cm_eq(fabric_, &core->eq, &core->eq_fd, nullptr);
  if (status < 0) return status;
  int ret = fi_passive_ep(fabric_, info.get(), &core->pep, nullptr);
  if (ret != 0) return fi_status(ret);
  ret = fi_pep_bind(core->pep, &core->eq->fid, 0);
  if (ret != 0) return fi_status(ret);
  if (backlog > 0) {
    int value = backlog;
    (void)fi_control(&core->pep->fid, FI_BACKLOG, &value);
  }
  ret = fi_listen(core->pep);
  if (ret != 0) return fi_status(ret);  // ~MsgListenerCore closes
  core->listen_fd = listening_member(core->eq_fd);
  *out = std::make_unique<MsgListener>(std::move(core));
  return 0;
}

// --- listener ----------------------------------------------------------------

int MsgListenerCore::next_request_locked(RawCmEvent *out) {
  for (int i = 0; i < 64; ++i) {
    fid_t fid = nullptr;
    const int got = read_cm_event(eq, out, &fid);
    if (got == 0) return 0;
    if (got < 0 || out->type != RawCmEvent::kConnReq || out->info == nullptr) continue;  // nothing else comes here
    if (!closed) return 1;
    fi_reject(pep, out->info->handle, nullptr, 0);
    fi_freeinfo(out->info);
    out->info = nullptr;
  }
  return 0;
}

void MsgListenerCore::refuse_queued_locked() {
  RawCmEvent event;
  if (!creator.here()) return;  // the EQ and its set are another process's
  if (!closed && listen_fd >= 0) (void)epoll_ctl(eq_fd, EPOLL_CTL_DEL, listen_fd, nullptr);  // fi_close ignores it
  closed = true;
  while (next_request_locked(&event) > 0) {}
}

MsgListenerCore::~MsgListenerCore() {
  if (!creator.here()) return;  // left to its process (creator.h)
  if (pep != nullptr && eq != nullptr) {
    // tcp does not drop a closed pep's queued FI_CONNREQs: take them now (and
    // refuse them) so that none is left naming a freed fid.
    std::lock_guard<std::mutex> lock(mu);
    refuse_queued_locked();
  }
  close_fid(pep);
  close_fid(eq);
}

void MsgListenerCore::shutdown() {
  std::lock_guard<std::mutex> lock(mu);
  refuse_queued_locked();
}

int MsgListener::get_request(std::unique_ptr<ConnectionRequest> *out) {
  if (out == nullptr) return -EINVAL;
  std::lock_guard<std::mutex> lock(core_->mu);
  RawCmEvent event;
  if (core_->next_request_locked(&event) == 0) return 0;
  *out = std::make_unique<MsgConnectionRequest>(core_, std::move(event));
  return 1;
}

gs_status_t MsgListener::arm_wait() {
  // Resets the EQ's signal; -FI_EAGAIN when events wait. The listening
  // socket and the requests being read are in the EQ's wait set.
  std::lock_guard<std::mutex> lock(core_->mu);
  fid *eq_fid = &core_->eq->fid;
  const int rc = fi_trywait(core_->domain->fabric(), &eq_fid, 1);
  return rc == 0 ? 0 : rc == -FI_EAGAIN ? -EAGAIN : fi_status(rc);
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

}  // namespace msg

gs_status_t open_msg_domain(const ProviderAttr &attr, std::unique_ptr<Domain> *out, std::string *error) {
  return open_domain_as<msg::MsgDomain>(attr, out, error);
}

}  // namespace gpusock::wire::fabric
