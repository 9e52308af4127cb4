// FI_EP_RDM flavour ("fabric:shm"): connections made by gpusock itself.
//
// shm has no connection management, no listening ports and no failure
// detection, so this file supplies them.
//
// Names. Every endpoint (connection or listener) is an RDM endpoint with its own
// CQ and AV, named "gpusock-ep-<pid>-<start time>-<random tag>-<seq>" with
// fi_setname before fi_enable; shm creates its region as /dev/shm/<name> and
// unlinks it on fi_close. Names are never reused inside a process (shm 1.17
// keeps a process-wide list of the names it created, never prunes it, and would
// hand back an unmapped region for a reused name), nor by a later process with
// the same pid (shm_names.h: a killed process leaves its regions behind, and
// shm refuses a name whose stale region looks alive). Opening the domain
// removes regions and rendezvous files that dead processes left (once per
// process).
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
// holds a pidfd for every cross-process peer (and for the listener while a
// client connects); when one becomes readable it marks the connection dead and
// releases the shm region locks the dead process may have held (see "stuck
// locks" below: without that, the next provider call spins forever). poll()
// looks at that flag (an atomic load) on every call, poll_cm() too: a dead peer
// gives kDisconnected(-ECONNRESET) (kError before establishment), outstanding
// writes complete with -ECONNRESET, and the dead peer's region file is unlinked
// (shm cannot do it for a killed process). A connecting client whose listener
// dies gets kRejected(-ECONNREFUSED); so does one whose REQ was not ACKed when
// the rendezvous stops naming that listener (closed, or replaced). Without
// pidfd_open the watchdog polls kill(pid, 0) every 10 ms.
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
// process-wide list until the provider unloads.
#include "wire/fabric/fabric_common.h"
#include "wire/fabric/shm_names.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <cstddef>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace gpusock::wire::fabric {
namespace {

constexpr uint32_t kCtrlMagic = 0x4753484d;  // "GSHM"
constexpr uint16_t kCtrlVersion = 1;
using shm::kNameMax;
using shm::new_endpoint_name;
using shm::read_rendezvous;
using shm::Rendezvous;
using shm::rendezvous_name;
constexpr int kConnCtrlBufs = 4;
constexpr int kListenerCtrlBufs = 32;
constexpr uint64_t kLivenessIntervalMs = 10;

enum CtrlType : uint16_t { kReq = 1, kAccept = 2, kReject = 3, kBye = 4, kAck = 5 };

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

uint64_t random_u64() {
  uint64_t value = 0;
  if (getrandom(&value, sizeof(value), 0) != sizeof(value)) {
    value = static_cast<uint64_t>(getpid()) * 0x9e3779b97f4a7c15ull ^ coarse_ms();
  }
  return value;
}

uint16_t sockaddr_port(const sockaddr_storage &addr) {
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in &>(addr).sin_port);
  return ntohs(reinterpret_cast<const sockaddr_in6 &>(addr).sin6_port);
}

void set_sockaddr_port(sockaddr_storage *addr, uint16_t port) {
  if (addr->ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in *>(addr)->sin_port = htons(port);
  } else {
    reinterpret_cast<sockaddr_in6 *>(addr)->sin6_port = htons(port);
  }
}

std::string sockaddr_ip(const sockaddr_storage &addr) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in &>(addr).sin_addr, text, sizeof(text));
  } else {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6 &>(addr).sin6_addr, text, sizeof(text));
  }
  return text;
}

bool is_wildcard(const sockaddr_storage &addr) {
  if (addr.ss_family == AF_INET) return reinterpret_cast<const sockaddr_in &>(addr).sin_addr.s_addr == INADDR_ANY;
  return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6 &>(addr).sin6_addr);
}

// Rendezvous names a client tries for `addr`, most specific first.
std::vector<std::string> rendezvous_candidates(const sockaddr_storage &addr) {
  const uint16_t port = sockaddr_port(addr);
  std::vector<std::string> names;
  names.push_back(rendezvous_name(sockaddr_ip(addr), port));
  if (addr.ss_family == AF_INET) {
    names.push_back(rendezvous_name("0.0.0.0", port));
    names.push_back(rendezvous_name("::", port));
  } else {
    const in6_addr &a6 = reinterpret_cast<const sockaddr_in6 &>(addr).sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a6)) {
      char text[INET_ADDRSTRLEN] = {};
      inet_ntop(AF_INET, &a6.s6_addr[12], text, sizeof(text));
      names.push_back(rendezvous_name(text, port));
      names.push_back(rendezvous_name("0.0.0.0", port));
    }
    names.push_back(rendezvous_name("::", port));
  }
  return names;
}

// Watches a peer process for its death.
class PidWatch {
 public:
  ~PidWatch() { reset(); }
  void watch(pid_t pid) {
    reset();
    if (pid <= 0 || pid == getpid()) return;  // our own process cannot die under us
    pid_ = pid;
    fd_ = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  }
  void reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    pid_ = 0;
  }
  bool active() const { return pid_ > 0; }
  bool dead() const {
    if (pid_ <= 0) return false;
    if (fd_ >= 0) {
      pollfd pfd{fd_, POLLIN, 0};
      return ::poll(&pfd, 1, 0) > 0;
    }
    return kill(pid_, 0) != 0 && errno == ESRCH;
  }

 private:
  pid_t pid_ = 0;
  int fd_ = -1;
};

// --- stuck locks --------------------------------------------------------------
//
// Every shm region has a process-shared spinlock, taken by its owner while it
// progresses and by every sender while it enqueues. A process SIGKILLed inside
// such a section leaves the lock held for good, and the next fi_writedata,
// fi_inject or fi_cq_read that needs it spins forever. A per-domain watchdog
// thread watches each cross-process peer's pidfd; when the peer dies it marks
// the connection dead and releases the locks of the two regions the connection
// uses (the peer's and ours). After the peer's death only our endpoint's thread
// touches those locks, so releasing them cannot break a live holder. Listener
// regions take REQs from processes not yet known, so there the watchdog
// releases the lock only when it stayed held for kStuckLockMs.
//
// Torn enqueues. A write with remote CQ data is two commands in the receiver's
// queue (the write, then its RMA iov), committed one after the other under
// the receiver's lock; shm's consumer takes the second as "the head after the
// first" without checking that it was committed. A sender SIGKILLed between
// the two commits leaves a write whose iov the consumer reads from a stale
// slot; it then discards one slot more than was written, keeps walking stale
// slots of earlier laps, and dies on the first stale name-exchange command
// whose inject buffer has been reused (a NULL peer region: SIGSEGV in
// fi_cq_read). So, once a peer is dead: our endpoint never calls
// the provider on that connection again (poll, writes, control messages), and
// when the dead peer died holding OUR region's lock (the only way an enqueue
// can be torn), the watchdog drops what is pending in our command queue
// before it releases that lock, for a thread of ours that was already
// spinning on it inside fi_cq_read. It knows whether one was: the endpoint
// marks its provider calls (PeerWatch::in_provider).
//
// Reaching the lock needs shm's region layout: the head of struct smr_region,
// SMR_VERSION 4 (libfabric 1.17), and its command queue (a cirque: size,
// mask, read and write counts). A region whose head does not check out
// (version, size, name) is left alone.
constexpr uint8_t kShmRegionVersion = 4;
constexpr uint64_t kStuckLockMs = 2000;
// Our region's lock still held this long after its peer died, by a thread of
// ours inside the provider: that thread is spinning on it, not holding it (a
// progress pass holds it for microseconds).
constexpr uint64_t kDeadHolderMs = 1000;
constexpr int kWatchdogTickMs = 10;

struct ShmRegionHead {
  uint8_t version;
  uint8_t resv;
  uint16_t flags;
  int pid;
  uint8_t cma_cap_peer;
  uint8_t cma_cap_self;
  uint32_t max_sar_buf_per_peer;
  void *base_addr;
  int lock;  // pthread_spinlock_t
  int32_t signal;
  void *map;
  size_t total_size;
  size_t cmd_cnt;
  size_t sar_cnt;
  size_t cmd_queue_offset;
  size_t resp_queue_offset;
  size_t inject_pool_offset;
  size_t sar_pool_offset;
  size_t peer_data_offset;
  size_t name_offset;
  size_t sock_name_offset;
};
static_assert(offsetof(ShmRegionHead, lock) == 24, "shm 1.17 region layout");
static_assert(offsetof(ShmRegionHead, cmd_queue_offset) == 64, "shm 1.17 region layout");

// The head of shm's command queue (OFI_DECLARE_CIRQUE), entries after it.
struct ShmCirqueHead {
  size_t size;
  size_t size_mask;
  size_t rcnt;
  size_t wcnt;
};
static_assert(sizeof(pthread_spinlock_t) == sizeof(int), "glibc spinlock");

int spin_unlocked_value() {
  static const int value = [] {
    pthread_spinlock_t lock;
    pthread_spin_init(&lock, PTHREAD_PROCESS_SHARED);
    const int v = static_cast<int>(lock);
    pthread_spin_destroy(&lock);
    return v;
  }();
  return value;
}

// Our own mapping of a region, for its lock word.
class RegionLock {
 public:
  RegionLock() = default;
  RegionLock(const RegionLock &) = delete;
  RegionLock &operator=(const RegionLock &) = delete;
  ~RegionLock() {
    if (base_ != nullptr) munmap(base_, size_);
  }

  bool open(const std::string &name) {
    int fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) return false;
    struct stat st {};
    void *base = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size >= static_cast<off_t>(sizeof(ShmRegionHead))) {
      base = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    close(fd);
    if (base == MAP_FAILED) return false;
    base_ = base;
    size_ = static_cast<size_t>(st.st_size);
    const auto *head = static_cast<const ShmRegionHead *>(base);
    const bool ok = head->version == kShmRegionVersion && head->total_size == size_ &&
                    head->name_offset < size_ && head->name_offset + name.size() < size_ &&
                    std::strcmp(static_cast<const char *>(base) + head->name_offset, name.c_str()) == 0;
    if (!ok) return false;  // ~RegionLock unmaps
    lock_ = &static_cast<ShmRegionHead *>(base)->lock;
    if (head->cmd_queue_offset + sizeof(ShmCirqueHead) <= size_) {
      auto *queue = reinterpret_cast<ShmCirqueHead *>(static_cast<char *>(base) + head->cmd_queue_offset);
      if (queue->size != 0 && (queue->size & (queue->size - 1)) == 0 && queue->size_mask == queue->size - 1)
        queue_ = queue;
    }
    return true;
  }
  bool held() const { return __atomic_load_n(lock_, __ATOMIC_ACQUIRE) != spin_unlocked_value(); }
  void release() { __atomic_store_n(lock_, spin_unlocked_value(), __ATOMIC_RELEASE); }
  // With the lock held by a dead sender: forget every command not yet
  // consumed, a torn last pair among them (see "Torn enqueues").
  void drop_pending_commands() {
    if (queue_ != nullptr) __atomic_store_n(&queue_->wcnt, __atomic_load_n(&queue_->rcnt, __ATOMIC_RELAXED), __ATOMIC_RELEASE);
  }

 private:
  void *base_ = nullptr;
  size_t size_ = 0;
  int *lock_ = nullptr;
  ShmCirqueHead *queue_ = nullptr;
};

// One watched peer (or, in stuck mode, one listener region). For a peer,
// locks[0] is the peer's region, locks[1] (when there) our endpoint's.
struct PeerWatch {
  std::atomic<bool> dead{false};
  // Threads of our endpoint inside a provider call on this connection.
  std::atomic<int> in_provider{0};
  pid_t pid = 0;
  int pidfd = -1;
  bool stuck_mode = false;
  bool own_lock_pending = false;  // dead, and our region's lock not yet settled
  uint64_t held_since_ms = 0;
  std::vector<std::unique_ptr<RegionLock>> locks;
  ~PeerWatch() {
    if (pidfd >= 0) close(pidfd);
  }
};

// One provider call on a watched connection, marked for the watchdog (see
// "Torn enqueues"): false, and no call may be made, once the peer is dead.
class ProviderCall {
 public:
  ProviderCall(bool peer_died, const std::shared_ptr<PeerWatch> &watch) {
    if (peer_died) {
      ok_ = false;
      return;
    }
    if (!watch) return;
    watch_ = watch;
    watch_->in_provider.fetch_add(1, std::memory_order_seq_cst);
    ok_ = !watch_->dead.load(std::memory_order_seq_cst);
  }
  ~ProviderCall() {
    if (watch_) watch_->in_provider.fetch_sub(1, std::memory_order_release);
  }
  ProviderCall(const ProviderCall &) = delete;
  ProviderCall &operator=(const ProviderCall &) = delete;
  explicit operator bool() const { return ok_; }

 private:
  std::shared_ptr<PeerWatch> watch_;  // kept: a call may replace the endpoint's watch
  bool ok_ = true;
};

class ShmWatchdog {
 public:
  ~ShmWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake();
    if (thread_.joinable()) thread_.join();
    if (epfd_ >= 0) close(epfd_);
    if (wakefd_ >= 0) close(wakefd_);
  }

  // When `pid` dies: mark the watch dead and release the regions' locks.
  std::shared_ptr<PeerWatch> watch_pid(pid_t pid, const std::vector<std::string> &regions) {
    auto watch = std::make_shared<PeerWatch>();
    watch->pid = pid;
    watch->pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    add_locks(watch.get(), regions);
    return add(watch) ? watch : nullptr;
  }
  // Release `region`'s lock when it stays held for kStuckLockMs.
  std::shared_ptr<PeerWatch> watch_stuck(const std::string &region) {
    auto watch = std::make_shared<PeerWatch>();
    watch->stuck_mode = true;
    add_locks(watch.get(), {region});
    if (watch->locks.empty()) return nullptr;
    return add(watch) ? watch : nullptr;
  }
  void unwatch(const std::shared_ptr<PeerWatch> &watch) {
    if (!watch) return;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = watches_.begin(); it != watches_.end(); ++it) {
      if (*it == watch) {
        if (watch->pidfd >= 0 && !watch->dead.load(std::memory_order_relaxed)) {
          epoll_ctl(epfd_, EPOLL_CTL_DEL, watch->pidfd, nullptr);
        }
        watches_.erase(it);
        return;
      }
    }
  }

 private:
  static void add_locks(PeerWatch *watch, const std::vector<std::string> &regions) {
    for (const std::string &name : regions) {
      auto region = std::make_unique<RegionLock>();
      if (region->open(name)) watch->locks.push_back(std::move(region));
    }
  }

  void wake() {
    if (wakefd_ < 0) return;
    const uint64_t one = 1;
    (void)!write(wakefd_, &one, sizeof(one));
  }

  bool add(const std::shared_ptr<PeerWatch> &watch) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_) {
      epfd_ = epoll_create1(EPOLL_CLOEXEC);
      wakefd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
      if (epfd_ < 0 || wakefd_ < 0) return false;
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.ptr = nullptr;
      if (epoll_ctl(epfd_, EPOLL_CTL_ADD, wakefd_, &ev) != 0) return false;
      try {
        thread_ = std::thread([this] { run(); });
      } catch (...) {
        return false;
      }
      started_ = true;
    }
    if (watch->pidfd >= 0) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.ptr = watch.get();
      if (epoll_ctl(epfd_, EPOLL_CTL_ADD, watch->pidfd, &ev) != 0) return false;
    }
    watches_.push_back(watch);
    if (watch->stuck_mode || watch->pidfd < 0) wake();  // switch the thread to ticking
    return true;
  }

  // With mu_ held. The peer's lock is released at once (a thread of ours may
  // be spinning on it to enqueue); ours only as settle_own_lock says.
  void fire(PeerWatch *watch) {
    if (watch->dead.load(std::memory_order_relaxed)) return;
    if (watch->pidfd >= 0) epoll_ctl(epfd_, EPOLL_CTL_DEL, watch->pidfd, nullptr);
    // seq_cst, paired with the endpoint's seq_cst in_provider increment and
    // dead load: either it sees dead and stays out, or we see it inside.
    watch->dead.store(true, std::memory_order_seq_cst);
    if (!watch->locks.empty() && watch->locks[0]->held()) watch->locks[0]->release();
    if (watch->locks.size() > 1) {
      watch->own_lock_pending = true;
      watch->held_since_ms = coarse_ms();
      settle_own_lock(watch);
    }
  }

  // Our region's lock after its peer died. Free: nothing was torn. Held with
  // no thread of ours in the provider: the dead peer holds it, possibly over a
  // torn enqueue: drop what is pending, release. Held with one of ours inside:
  // it holds the lock (released in microseconds) or spins on the dead peer's
  // (held for kDeadHolderMs: treat as the dead peer's).
  static void settle_own_lock(PeerWatch *watch) {
    if (!watch->own_lock_pending) return;
    RegionLock &own = *watch->locks[1];
    if (!own.held()) {
      watch->own_lock_pending = false;
      return;
    }
    if (watch->in_provider.load(std::memory_order_seq_cst) == 0 ||
        coarse_ms() - watch->held_since_ms >= kDeadHolderMs) {
      own.drop_pending_commands();
      own.release();
      watch->own_lock_pending = false;
    }
  }

  void run() {
    epoll_event events[16];
    for (;;) {
      bool ticking = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) return;
        for (const auto &watch : watches_)
          ticking = ticking || watch->stuck_mode || watch->pidfd < 0 || watch->own_lock_pending;
      }
      const int n = epoll_wait(epfd_, events, 16, ticking ? kWatchdogTickMs : -1);
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      for (int i = 0; i < n; ++i) {
        if (events[i].data.ptr == nullptr) {
          uint64_t value;
          (void)!read(wakefd_, &value, sizeof(value));
          continue;
        }
        for (const auto &watch : watches_) {
          if (watch.get() == events[i].data.ptr) fire(watch.get());
        }
      }
      const uint64_t now = coarse_ms();
      for (const auto &watch : watches_) {
        settle_own_lock(watch.get());
        if (watch->stuck_mode) {
          if (!watch->locks[0]->held()) {
            watch->held_since_ms = 0;
          } else if (watch->held_since_ms == 0) {
            watch->held_since_ms = now;
          } else if (now - watch->held_since_ms >= kStuckLockMs) {
            watch->locks[0]->release();
            watch->held_since_ms = 0;
          }
        } else if (watch->pidfd < 0 && !watch->dead.load(std::memory_order_relaxed) && kill(watch->pid, 0) != 0 &&
                   errno == ESRCH) {
          fire(watch.get());
        }
      }
    }
  }

  std::mutex mu_;
  std::thread thread_;
  bool started_ = false;
  bool stop_ = false;
  int epfd_ = -1;
  int wakefd_ = -1;
  std::vector<std::shared_ptr<PeerWatch>> watches_;
};

class RdmDomain;

// The libfabric objects of one RDM endpoint, shared with in-process peers (see
// the header comment).
struct RdmShared {
  fid_ep *ep = nullptr;
  fid_cq *cq = nullptr;
  fid_av *av = nullptr;
  std::string name;
  std::mutex mu;
  std::atomic<bool> alive{true};                       // owner not yet destroyed
  std::vector<std::shared_ptr<RdmShared>> inbound;     // in-process senders to us

  ~RdmShared() {
    close_fid(ep);  // unlinks /dev/shm/<name>
    close_fid(cq);
    close_fid(av);
  }
};

// In-process endpoints by name. Constructed on first use: the library may be
// called from other static constructors (the preload shim).
struct Registry {
  std::mutex mu;
  std::unordered_map<std::string, std::weak_ptr<RdmShared>> map;
};
Registry &registry() {
  static Registry *instance = new Registry;  // never destroyed: endpoints may outlive static destructors
  return *instance;
}

void registry_add(const std::shared_ptr<RdmShared> &shared) {
  Registry &reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.map[shared->name] = shared;
}

// The owner is going away: no new in-process peer may find it, and it lets go
// of the senders it was keeping mapped.
void retire_shared(const std::shared_ptr<RdmShared> &shared) {
  if (!shared) return;
  {
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    reg.map.erase(shared->name);
  }
  std::vector<std::shared_ptr<RdmShared>> release;
  {
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->alive.store(false, std::memory_order_release);
    release.swap(shared->inbound);
  }
}

// Before `self` first sends to the in-process endpoint `peer_name`: pin the
// peer and put `self` on its inbound list. nullptr if the peer is gone.
std::shared_ptr<RdmShared> pin_local_peer(const std::shared_ptr<RdmShared> &self, const char *peer_name) {
  std::shared_ptr<RdmShared> peer;
  {
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    auto it = reg.map.find(peer_name);
    if (it != reg.map.end()) peer = it->second.lock();
  }
  if (!peer) return nullptr;
  std::lock_guard<std::mutex> lock(peer->mu);
  if (!peer->alive.load(std::memory_order_relaxed)) return nullptr;
  bool present = false;
  for (const auto &entry : peer->inbound) present = present || entry == self;
  if (!present) peer->inbound.push_back(self);
  return peer;
}

// `self` no longer needs `peer_name` kept mapped (its last message to us has
// been consumed).
void unpin_inbound(const std::shared_ptr<RdmShared> &self, const char *peer_name) {
  std::shared_ptr<RdmShared> release;
  std::lock_guard<std::mutex> lock(self->mu);
  for (auto it = self->inbound.begin(); it != self->inbound.end(); ++it) {
    if ((*it)->name == peer_name) {
      release = std::move(*it);
      self->inbound.erase(it);
      break;
    }
  }
}

// A peer in an endpoint's AV.
struct PeerRef {
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  std::shared_ptr<RdmShared> pin;  // in-process peers only

  PeerRef() = default;
  PeerRef(const PeerRef &) = delete;
  PeerRef &operator=(const PeerRef &) = delete;
  // A moved-from PeerRef no longer names the AV entry (it must be removed once).
  PeerRef(PeerRef &&other) noexcept : addr(other.addr), pin(std::move(other.pin)) { other.addr = FI_ADDR_NOTAVAIL; }
  PeerRef &operator=(PeerRef &&other) noexcept {
    addr = other.addr;
    pin = std::move(other.pin);
    other.addr = FI_ADDR_NOTAVAIL;
    return *this;
  }
  bool valid() const { return addr != FI_ADDR_NOTAVAIL; }
};

gs_status_t insert_peer(const std::shared_ptr<RdmShared> &self, const char *name, pid_t pid, PeerRef *out) {
  if (memchr(name, '\0', kNameMax) == nullptr) return -EINVAL;
  std::shared_ptr<RdmShared> pin;
  if (pid == getpid()) {
    pin = pin_local_peer(self, name);
    if (!pin) return -ECONNREFUSED;
  }
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  int ret = fi_av_insert(self->av, name, 1, &addr, 0, nullptr);
  if (ret != 1) return ret < 0 ? fi_status(ret) : -EIO;
  out->addr = addr;
  out->pin = std::move(pin);
  return 0;
}

// Drop a peer from the AV; for shm this also frees its slot in the region map
// (256 slots) and unmaps a cross-process peer's region.
void remove_peer(fid_av *av, PeerRef *ref) {
  if (ref->valid()) fi_av_remove(av, &ref->addr, 1, 0);
  ref->addr = FI_ADDR_NOTAVAIL;
  ref->pin.reset();
}

bool valid_ctrl(const CtrlMsg &msg, size_t len) {
  return len >= sizeof(CtrlMsg) && msg.magic == kCtrlMagic && msg.version == kCtrlVersion &&
         msg.private_len <= sizeof(msg.private_data) && memchr(msg.name, '\0', sizeof(msg.name)) != nullptr;
}

CtrlMsg make_ctrl(CtrlType type, uint64_t nonce, const std::string &name) {
  CtrlMsg msg;
  std::memset(&msg, 0, sizeof(msg));
  msg.magic = kCtrlMagic;
  msg.version = kCtrlVersion;
  msg.type = type;
  msg.nonce = nonce;
  msg.pid = getpid();
  std::strncpy(msg.name, name.c_str(), sizeof(msg.name) - 1);
  return msg;
}

class RdmDomain final : public FabricDomainBase {
 public:
  explicit RdmDomain(const ProviderAttr &attr) : FabricDomainBase(attr) {}

  gs_status_t open(std::string *error) {
    gs_status_t ret = open_base(error);
    if (ret == 0) shm::sweep_stale_files_once();  // what killed processes left in /dev/shm (shm_names.h)
    return ret;
  }

  gs_status_t create_endpoint(ConnectionRequest *request, std::unique_ptr<Endpoint> *out) override;
  gs_status_t accept(Endpoint *endpoint, ConnectionRequest *request, const void *private_data,
                     uint32_t private_len) override;
  gs_status_t listen(const sockaddr *addr, socklen_t len, int backlog, std::unique_ptr<Listener> *out) override;

  // A named, enabled RDM endpoint with its own CQ and AV.
  gs_status_t open_shared(std::shared_ptr<RdmShared> *out);

  ShmWatchdog &watchdog() { return watchdog_; }

 private:
  ShmWatchdog watchdog_;  // destroyed (joined) before the fabric objects
};

gs_status_t RdmDomain::open_shared(std::shared_ptr<RdmShared> *out) {
  auto shared = std::make_shared<RdmShared>();
  shared->name = new_endpoint_name(nullptr);
  int ret = fi_endpoint(domain_, info_.get(), &shared->ep, nullptr);
  if (ret != 0) return fi_status(ret);
  ret = fi_setname(&shared->ep->fid, const_cast<char *>(shared->name.c_str()), shared->name.size() + 1);
  if (ret != 0) return fi_status(ret);
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  av_attr.count = 4;
  ret = fi_av_open(domain_, &av_attr, &shared->av, nullptr);
  if (ret != 0) return fi_status(ret);
  ret = open_endpoint_cq(&shared->cq);
  if (ret < 0) return ret;
  ret = fi_ep_bind(shared->ep, &shared->av->fid, 0);
  if (ret == 0) ret = fi_ep_bind(shared->ep, &shared->cq->fid, FI_TRANSMIT | FI_RECV);
  if (ret == 0) ret = fi_enable(shared->ep);  // creates /dev/shm/<name>
  if (ret != 0) return fi_status(ret);
  registry_add(shared);
  *out = std::move(shared);
  return 0;
}

// --- listener ----------------------------------------------------------------

struct RdmListenerCore {
  // A control message the client has not made room for yet. A REJECT owns its
  // AV entry (removed once sent); an ACK borrows its request's.
  struct PendingCtrl {
    PeerRef owned;
    fi_addr_t addr = FI_ADDR_NOTAVAIL;
    CtrlMsg msg;
  };

  RdmDomain *domain = nullptr;
  std::shared_ptr<RdmShared> shared;
  std::mutex mu;  // everything below, and the fids
  std::vector<CtrlMsg> bufs;
  std::deque<PendingCtrl> pending;
  int rendezvous_fd = -1;
  std::string rendezvous;
  bool closed = false;  // the Listener object is gone; requests may live on
  sockaddr_storage bound{};
  std::shared_ptr<PeerWatch> stuck_watch;  // releases a lock a dead client left held

  ~RdmListenerCore();
  gs_status_t post_buf(size_t index) {
    return fi_status(fi_recv(shared->ep, &bufs[index], sizeof(CtrlMsg), nullptr, FI_ADDR_UNSPEC, &bufs[index]));
  }
  // All with mu held.
  void send_locked(PendingCtrl &&entry);
  void send_reject_locked(PeerRef &&peer, uint64_t nonce) {
    PendingCtrl entry;
    entry.addr = peer.addr;
    entry.owned = std::move(peer);
    entry.msg = make_ctrl(kReject, nonce, shared->name);
    send_locked(std::move(entry));
  }
  void send_ack_locked(fi_addr_t addr, uint64_t nonce) {
    PendingCtrl entry;
    entry.addr = addr;
    entry.msg = make_ctrl(kAck, nonce, shared->name);
    send_locked(std::move(entry));
  }
  void drop_pending_ack_locked(uint64_t nonce);
  void flush_pending_locked();
  // Read REQs off the CQ; each valid one goes to `on_request`.
  template <class F>
  void drain_locked(F &&on_request);
  // Refuse what arrived but was not handed out, giving clients a moment to
  // make room; then drop what is still pending.
  void refuse_unhandled_locked();
  // The Listener object is going: no new connections (the rendezvous goes at
  // once), but requests already handed out keep the endpoint for their answers.
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
  bool answered() const { return answered_; }
  void mark_accepted() { answered_ = true; }
  const std::shared_ptr<RdmListenerCore> &core() const { return core_; }

 private:
  std::shared_ptr<RdmListenerCore> core_;
  CtrlMsg msg_;
  PeerRef client_;  // in the listener's AV
  bool answered_ = false;
};

class RdmListener final : public Listener {
 public:
  explicit RdmListener(std::shared_ptr<RdmListenerCore> core) : core_(std::move(core)) {}
  ~RdmListener() override {
    ready_.clear();  // refuses them
    core_->shutdown();
  }
  int get_request(std::unique_ptr<ConnectionRequest> *out) override;
  gs_status_t local_address(sockaddr_storage *out, socklen_t *len) const override {
    return output_sockaddr(core_->bound, out, len);
  }

 private:
  std::shared_ptr<RdmListenerCore> core_;
  std::deque<std::unique_ptr<ConnectionRequest>> ready_;
};

void RdmListenerCore::send_locked(PendingCtrl &&entry) {
  if (pending.empty()) {
    ssize_t ret = fi_inject(shared->ep, &entry.msg, sizeof(entry.msg), entry.addr);
    if (ret != -FI_EAGAIN) {
      remove_peer(shared->av, &entry.owned);
      return;
    }
  }
  pending.push_back(std::move(entry));  // keeps the order of messages
}

void RdmListenerCore::drop_pending_ack_locked(uint64_t nonce) {
  for (auto it = pending.begin(); it != pending.end();) {
    if (it->msg.type == kAck && it->msg.nonce == nonce) {
      it = pending.erase(it);
    } else {
      ++it;
    }
  }
}

void RdmListenerCore::flush_pending_locked() {
  while (!pending.empty()) {
    PendingCtrl &entry = pending.front();
    ssize_t ret = fi_inject(shared->ep, &entry.msg, sizeof(entry.msg), entry.addr);
    if (ret == -FI_EAGAIN) return;
    remove_peer(shared->av, &entry.owned);
    pending.pop_front();
  }
}

template <class F>
void RdmListenerCore::drain_locked(F &&on_request) {
  fi_cq_data_entry entries[kCqBatch];
  for (;;) {
    ssize_t got = fi_cq_read(shared->cq, entries, kCqBatch);
    if (got == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(shared->cq, &err, 0) > 0 && err.op_context != nullptr) {
        auto *buf = static_cast<CtrlMsg *>(err.op_context);
        if (buf >= bufs.data() && buf < bufs.data() + bufs.size() && err.err != FI_ECANCELED) {
          post_buf(buf - bufs.data());
        }
      }
      continue;
    }
    if (got <= 0) return;
    for (ssize_t i = 0; i < got; ++i) {
      auto *buf = static_cast<CtrlMsg *>(entries[i].op_context);
      if (buf < bufs.data() || buf >= bufs.data() + bufs.size()) continue;
      if ((entries[i].flags & FI_RECV) == 0) continue;
      const CtrlMsg msg = *buf;
      post_buf(buf - bufs.data());
      if (!valid_ctrl(msg, entries[i].len) || msg.type != kReq) continue;
      on_request(msg);
    }
  }
}

void RdmListenerCore::refuse_unhandled_locked() {
  drain_locked([this](const CtrlMsg &msg) {
    PeerRef peer;
    if (insert_peer(shared, msg.name, msg.pid, &peer) == 0) send_reject_locked(std::move(peer), msg.nonce);
  });
  for (int spin = 0; spin < 200 && !pending.empty(); ++spin) {
    (void)fi_cq_read(shared->cq, nullptr, 0);
    flush_pending_locked();
    if (!pending.empty()) usleep(50);
  }
  for (auto &entry : pending) remove_peer(shared->av, &entry.owned);
  pending.clear();
}

void RdmListenerCore::shutdown() {
  std::lock_guard<std::mutex> lock(mu);
  if (closed) return;
  closed = true;
  if (rendezvous_fd >= 0) {
    shm_unlink(rendezvous.c_str());
    close(rendezvous_fd);  // releases the lock
    rendezvous_fd = -1;
  }
  // Clients whose REQ lands later see the rendezvous gone and give up.
  if (shared && shared->ep != nullptr) refuse_unhandled_locked();
}

RdmListenerCore::~RdmListenerCore() {
  if (stuck_watch) domain->watchdog().unwatch(stuck_watch);
  if (rendezvous_fd >= 0) {  // listen() failed half way
    shm_unlink(rendezvous.c_str());
    close(rendezvous_fd);
  }
  if (shared && shared->ep != nullptr) {
    std::lock_guard<std::mutex> lock(mu);
    refuse_unhandled_locked();
  }
  retire_shared(shared);
}

int RdmListener::get_request(std::unique_ptr<ConnectionRequest> *out) {
  if (out == nullptr) return -EINVAL;
  if (ready_.empty()) {
    std::lock_guard<std::mutex> lock(core_->mu);
    core_->flush_pending_locked();
    core_->drain_locked([this](const CtrlMsg &msg) {
      PeerRef client;
      if (insert_peer(core_->shared, msg.name, msg.pid, &client) != 0) return;  // client already gone
      // The REQ was the client's last message to the listener: the request's
      // pin (if in-process) is all that must keep its region mapped now.
      if (msg.pid == getpid()) unpin_inbound(core_->shared, msg.name);
      // Tell the client its REQ is with the application now: from here on an
      // answer is guaranteed (ACCEPT, or REJECT when the request is dropped).
      core_->send_ack_locked(client.addr, msg.nonce);
      ready_.push_back(std::make_unique<RdmConnectionRequest>(core_, msg, std::move(client)));
    });
  }
  if (ready_.empty()) return 0;
  *out = std::move(ready_.front());
  ready_.pop_front();
  return 1;
}

RdmConnectionRequest::~RdmConnectionRequest() {
  std::lock_guard<std::mutex> lock(core_->mu);
  core_->drop_pending_ack_locked(msg_.nonce);
  if (!answered_ && client_.valid()) {
    answered_ = true;
    core_->send_reject_locked(std::move(client_), msg_.nonce);
  }
  remove_peer(core_->shared->av, &client_);
}

void RdmConnectionRequest::reject() {
  std::lock_guard<std::mutex> lock(core_->mu);
  if (answered_ || !client_.valid()) return;
  answered_ = true;
  core_->send_reject_locked(std::move(client_), msg_.nonce);
}

// --- endpoint ----------------------------------------------------------------

class RdmEndpoint final : public FabricEndpointBase {
 public:
  explicit RdmEndpoint(RdmDomain *domain) : domain_(domain) {}
  ~RdmEndpoint() override;

  gs_status_t init();
  gs_status_t init_from_request(RdmConnectionRequest *request);
  gs_status_t start_accept(RdmConnectionRequest *request, const void *private_data, uint32_t private_len);

  gs_status_t connect(const sockaddr *addr, socklen_t len, const void *private_data,
                      uint32_t private_len) override;
  gs_status_t post_write(const WriteRequest &request) override;
  gs_status_t post_recv(uint32_t) override { return 0; }  // shm: remote CQ data needs no receive
  int poll(Completion *out, int max) override;
  int poll_cm(CmEvent *out) override;
  void disconnect() override;
  gs_status_t local_address(sockaddr_storage *out, socklen_t *len) const override {
    return output_sockaddr(local_, out, len);
  }
  gs_status_t peer_address(sockaddr_storage *out, socklen_t *len) const override {
    return output_sockaddr(peer_sockaddr_, out, len);
  }

 private:

  gs_status_t post_ctrl_buf(int index) {
    return fi_status(
        fi_recv(shared_->ep, &ctrl_bufs_[index], sizeof(CtrlMsg), nullptr, FI_ADDR_UNSPEC, &ctrl_bufs_[index]));
  }
  void queue_event(CmEventKind kind, int status, const uint8_t *data = nullptr, uint32_t len = 0) {
    CmEvent event;
    event.kind = kind;
    event.status = status;
    if (data != nullptr && len != 0) {
      event.peer_private_len = len;
      std::memcpy(event.peer_private_data, data, len);
    }
    events_.push_back(event);
  }
  // Send (or keep pending) one control message.
  void send_ctrl(const PeerRef &dest, const CtrlMsg &msg);
  void flush_ctrl();
  void on_ctrl_sent(uint16_t type);
  void handle_ctrl(const CtrlMsg &msg, size_t len);
  // Reads the CQ: immediates into out (at most max), writes marked in the ring,
  // control messages handled. Returns entries read, or < 0.
  int process_cq(Completion *out, int max, int *produced);
  // Watch a cross-process peer (or the listener while connecting): the
  // watchdog releases the locks of its region and ours when it dies.
  void watch_peer(pid_t pid, const std::string &peer_region);
  void unwatch();
  bool peer_dead() const {
    if (peer_died_) return true;
    if (watch_) return watch_->dead.load(std::memory_order_acquire);
    return fallback_watch_.dead();
  }
  // Guards every provider call on this connection (see "Torn enqueues").
  ProviderCall provider_call() const { return ProviderCall(peer_died_, watch_); }
  void check_liveness();
  void peer_gone(bool dead_process);
  void fail_connect(int status);

  RdmDomain *domain_;
  std::shared_ptr<RdmShared> shared_;
  CtrlMsg ctrl_bufs_[kConnCtrlBufs];
  std::deque<CmEvent> events_;
  std::vector<Completion> stash_;   // data completions read by poll_cm
  bool ctrl_pending_ = false;
  CtrlMsg pending_msg_;
  fi_addr_t pending_dest_ = FI_ADDR_NOTAVAIL;
  PeerRef peer_;
  PeerRef listener_;
  std::string listener_rendezvous_;
  std::string listener_name_;
  std::shared_ptr<PeerWatch> watch_;
  PidWatch fallback_watch_;  // when the watchdog is unavailable
  std::string peer_name_;
  pid_t peer_pid_ = 0;
  // Passive side, until established: the listener the request came through,
  // which can still refuse the client should our ACCEPT never leave.
  std::shared_ptr<RdmListenerCore> origin_;
  uint64_t nonce_ = 0;
  bool req_acked_ = false;  // the listener handed our REQ to its application
  uint8_t peer_record_[64] = {};
  uint32_t peer_record_len_ = 0;
  sockaddr_storage local_{};
  sockaddr_storage peer_sockaddr_{};
  uint32_t idle_polls_ = 0;
  uint64_t last_liveness_ms_ = 0;
  bool peer_died_ = false;  // its process is gone: no provider call on this connection again
};

gs_status_t RdmEndpoint::init() {
  gs_status_t ret = init_base(*domain_);
  if (ret < 0) return ret;
  ret = domain_->open_shared(&shared_);
  if (ret < 0) return ret;
  for (int i = 0; i < kConnCtrlBufs; ++i) {
    ret = post_ctrl_buf(i);
    if (ret < 0) return ret;
  }
  stash_.reserve(64);
  return 0;
}

gs_status_t RdmEndpoint::init_from_request(RdmConnectionRequest *request) {
  const CtrlMsg &msg = request->msg();
  gs_status_t ret = insert_peer(shared_, msg.name, msg.pid, &peer_);
  if (ret < 0) return ret;
  peer_name_ = msg.name;
  peer_pid_ = msg.pid;
  nonce_ = msg.nonce;
  local_ = msg.dst;
  peer_sockaddr_ = msg.src;
  peer_record_len_ = msg.private_len;
  std::memcpy(peer_record_, msg.private_data, msg.private_len);
  origin_ = request->core();
  return 0;
}

gs_status_t RdmEndpoint::start_accept(RdmConnectionRequest *request, const void *private_data,
                                      uint32_t private_len) {
  if (state_ != State::kIdle || !peer_.valid() || request->msg().nonce != nonce_) return -EINVAL;
  CtrlMsg msg = make_ctrl(kAccept, nonce_, shared_->name);
  msg.src = local_;
  msg.private_len = private_len;
  if (private_len != 0) std::memcpy(msg.private_data, private_data, private_len);
  request->mark_accepted();
  watch_peer(peer_pid_, peer_name_);
  state_ = State::kAccepting;
  send_ctrl(peer_, msg);
  return 0;
}

RdmEndpoint::~RdmEndpoint() {
  if (shared_ && shared_->ep != nullptr) {
    if (state_ == State::kEstablished) {
      disconnect();
    } else if (state_ == State::kAccepting && ctrl_pending_ && origin_) {
      // The ACCEPT never left (the client has not progressed since): have the
      // listener refuse it, over the path the REQ already opened.
      ctrl_pending_ = false;
      std::lock_guard<std::mutex> lock(origin_->mu);
      PeerRef client;
      if (insert_peer(origin_->shared, peer_name_.c_str(), peer_pid_, &client) == 0) {
        origin_->send_reject_locked(std::move(client), nonce_);
      }
    }
    // A BYE (or REJECT) the peer has not made room for yet: give it a moment.
    for (int spin = 0; spin < 200 && ctrl_pending_ && !peer_dead(); ++spin) {
      if (ProviderCall call = provider_call()) (void)fi_cq_read(shared_->cq, nullptr, 0);
      flush_ctrl();
      if (ctrl_pending_) usleep(50);
    }
    remove_peer(shared_->av, &peer_);
    remove_peer(shared_->av, &listener_);
  }
  unwatch();
  retire_shared(shared_);
}

void RdmEndpoint::watch_peer(pid_t pid, const std::string &peer_region) {
  unwatch();
  if (pid <= 0 || pid == getpid()) return;  // in-process peers cannot die under us
  watch_ = domain_->watchdog().watch_pid(pid, {peer_region, shared_->name});
  if (!watch_) fallback_watch_.watch(pid);
}

void RdmEndpoint::unwatch() {
  if (watch_) domain_->watchdog().unwatch(watch_);
  watch_.reset();
  fallback_watch_.reset();
}

void RdmEndpoint::fail_connect(int status) {
  queue_event(CmEventKind::kRejected, status);
  state_ = State::kClosed;
  ctrl_pending_ = false;
  unwatch();
  if (shared_) remove_peer(shared_->av, &listener_);
}

gs_status_t RdmEndpoint::connect(const sockaddr *addr, socklen_t len, const void *private_data,
                                 uint32_t private_len) {
  sockaddr_storage dst;
  if (!copy_sockaddr(addr, len, &dst)) return -EINVAL;
  if (private_len > sizeof(CtrlMsg{}.private_data) || (private_len != 0 && private_data == nullptr)) return -EINVAL;
  if (state_ != State::kIdle || peer_.valid()) return -EISCONN;
  peer_sockaddr_ = dst;

  // Our own address: the IP we dialled (loopback for a wildcard), and a port
  // made from pid and endpoint number.
  local_ = dst;
  if (is_wildcard(dst)) {
    if (dst.ss_family == AF_INET) {
      reinterpret_cast<sockaddr_in &>(local_).sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    } else {
      reinterpret_cast<sockaddr_in6 &>(local_).sin6_addr = in6addr_loopback;
    }
  }
  const uint64_t seq = std::strtoull(shared_->name.c_str() + shared_->name.rfind('-') + 1, nullptr, 10);
  set_sockaddr_port(&local_, static_cast<uint16_t>(49152 + ((static_cast<uint64_t>(getpid()) * 7919 + seq) % 16384)));

  state_ = State::kConnecting;
  Rendezvous rv{};
  bool found = false;
  for (const std::string &name : rendezvous_candidates(dst)) {
    if (read_rendezvous(name, &rv)) {
      listener_rendezvous_ = name;
      found = true;
      break;
    }
  }
  if (!found) {
    fail_connect(-ECONNREFUSED);  // reported by poll_cm, like tcp's refusal
    return 0;
  }
  if (insert_peer(shared_, rv.name, rv.pid, &listener_) < 0) {
    fail_connect(-ECONNREFUSED);
    return 0;
  }
  listener_name_ = rv.name;
  watch_peer(rv.pid, rv.name);
  nonce_ = random_u64();
  CtrlMsg msg = make_ctrl(kReq, nonce_, shared_->name);
  msg.src = local_;
  msg.dst = dst;
  msg.private_len = private_len;
  if (private_len != 0) std::memcpy(msg.private_data, private_data, private_len);
  send_ctrl(listener_, msg);
  return 0;
}

void RdmEndpoint::send_ctrl(const PeerRef &dest, const CtrlMsg &msg) {
  pending_msg_ = msg;
  pending_dest_ = dest.addr;
  ctrl_pending_ = true;
  flush_ctrl();
}

void RdmEndpoint::flush_ctrl() {
  if (!ctrl_pending_) return;
  ProviderCall call = provider_call();
  if (!call) {
    ctrl_pending_ = false;  // nobody left to hear it
    return;
  }
  ssize_t ret = fi_inject(shared_->ep, &pending_msg_, sizeof(pending_msg_), pending_dest_);
  if (ret == -FI_EAGAIN) return;  // the peer has to progress first
  ctrl_pending_ = false;
  if (ret != 0) {
    if (state_ == State::kConnecting) {
      fail_connect(-ECONNREFUSED);
    } else if (state_ == State::kAccepting) {
      queue_event(CmEventKind::kError, fi_status(ret));
      state_ = State::kClosed;
    }
    return;
  }
  on_ctrl_sent(pending_msg_.type);
}

void RdmEndpoint::on_ctrl_sent(uint16_t type) {
  if (type == kAccept && state_ == State::kAccepting) {
    origin_.reset();
    state_ = State::kEstablished;
    queue_event(CmEventKind::kEstablished, 0, peer_record_, peer_record_len_);
  }
}

void RdmEndpoint::handle_ctrl(const CtrlMsg &msg, size_t len) {
  if (!valid_ctrl(msg, len) || msg.nonce != nonce_) return;
  switch (msg.type) {
    case kAccept: {
      if (state_ != State::kConnecting) return;
      PeerRef server;
      if (insert_peer(shared_, msg.name, msg.pid, &server) < 0) {
        fail_connect(-ECONNREFUSED);
        return;
      }
      peer_ = std::move(server);
      peer_name_ = msg.name;
      peer_pid_ = msg.pid;
      watch_peer(msg.pid, msg.name);
      remove_peer(shared_->av, &listener_);
      ctrl_pending_ = false;
      state_ = State::kEstablished;
      queue_event(CmEventKind::kEstablished, 0, msg.private_data, msg.private_len);
      return;
    }
    case kAck:
      if (state_ == State::kConnecting) req_acked_ = true;
      return;
    case kReject:
      if (state_ != State::kConnecting) return;
      fail_connect(-ECONNREFUSED);
      return;
    case kBye:
      if (state_ != State::kEstablished && state_ != State::kAccepting) return;
      queue_event(CmEventKind::kDisconnected, 0);
      state_ = State::kClosed;
      ring_.fail_all(-ECONNRESET);
      unwatch();
      return;
    default:
      return;
  }
}

int RdmEndpoint::process_cq(Completion *out, int max, int *produced) {
  ProviderCall call = provider_call();
  if (!call) {
    *produced = 0;
    return 0;
  }
  auto ctrl_index = [this](void *context) {
    auto *buf = static_cast<CtrlMsg *>(context);
    return buf >= ctrl_bufs_ && buf < ctrl_bufs_ + kConnCtrlBufs ? static_cast<int>(buf - ctrl_bufs_) : -1;
  };
  return read_cq(
      shared_->cq, out, max, produced,
      [&](const fi_cq_data_entry &entry) {  // a control message
        const int index = (entry.flags & FI_RECV) != 0 ? ctrl_index(entry.op_context) : -1;
        if (index < 0) return;
        const CtrlMsg msg = ctrl_bufs_[index];
        post_ctrl_buf(index);
        handle_ctrl(msg, entry.len);
      },
      [&](const fi_cq_err_entry &err, bool matched) {
        const int index = matched ? -1 : ctrl_index(err.op_context);
        if (index >= 0 && err.err != FI_ECANCELED) post_ctrl_buf(index);
      });
}

void RdmEndpoint::peer_gone(bool dead_process) {
  const bool established = state_ == State::kEstablished;
  queue_event(established ? CmEventKind::kDisconnected : CmEventKind::kError, -ECONNRESET);
  state_ = State::kClosed;
  ctrl_pending_ = false;
  ring_.fail_all(-ECONNRESET);
  // A dead process's watch stays until we are destroyed: the watchdog may
  // still have our region's lock to settle (see "Torn enqueues").
  if (dead_process) peer_died_ = true;
  else unwatch();
  // shm cannot unlink the region of a killed process; we know its name.
  if (dead_process && !peer_name_.empty()) shm_unlink(peer_name_.c_str());
}

void RdmEndpoint::check_liveness() {
  // The watchdog's verdict is an atomic load; the rest costs system calls.
  const bool watched_dead = watch_ && watch_->dead.load(std::memory_order_acquire);
  const uint64_t now = coarse_ms();
  if (!watched_dead && now - last_liveness_ms_ < kLivenessIntervalMs) return;
  last_liveness_ms_ = now;
  if (state_ == State::kConnecting) {
    if (peer_dead()) {
      fail_connect(-ECONNREFUSED);
      return;
    }
    if (!req_acked_) {
      // REQ not yet with the application: is that listener still there?
      Rendezvous rv{};
      if (!read_rendezvous(listener_rendezvous_, &rv) || listener_name_ != rv.name) fail_connect(-ECONNREFUSED);
    }
    return;
  }
  if (state_ != State::kEstablished && state_ != State::kAccepting) return;
  if (peer_dead()) {
    peer_gone(true);
  } else if (peer_.pin && !peer_.pin->alive.load(std::memory_order_acquire)) {
    peer_gone(false);  // an in-process peer destroyed without a BYE reaching us
  } else if (state_ == State::kAccepting && ctrl_pending_ && !peer_.pin) {
    // ACCEPT still waiting for the client: is its endpoint still there?
    int fd = shm_open(peer_name_.c_str(), O_RDONLY, 0);
    if (fd >= 0) {
      close(fd);
    } else if (errno == ENOENT) {
      peer_gone(false);
    }
  }
}

int RdmEndpoint::poll(Completion *out, int max) {
  if (max <= 0) return 0;
  int n = 0;
  if (!stash_.empty()) [[unlikely]] {
    const int take = std::min<int>(max, static_cast<int>(stash_.size()));
    std::copy(stash_.begin(), stash_.begin() + take, out);
    stash_.erase(stash_.begin(), stash_.begin() + take);
    n = take;
  }
  // A dead peer is noticed before the provider is called again (see "Torn enqueues").
  if (watch_ && watch_->dead.load(std::memory_order_acquire)) [[unlikely]] check_liveness();
  if (ctrl_pending_) [[unlikely]] flush_ctrl();
  int produced = 0;
  const int got = process_cq(out + n, max - n, &produced);
  if (got < 0) [[unlikely]] return got;
  n += produced;
  if (got == 0 && (++idle_polls_ & 15) == 0) check_liveness();
  if (!ring_.empty()) n += ring_.drain(out + n, max - n);
  return n;
}

int RdmEndpoint::poll_cm(CmEvent *out) {
  if (out == nullptr) return 0;
  if (events_.empty() && state_ != State::kClosed && state_ != State::kIdle) {
    if (ctrl_pending_) flush_ctrl();
    Completion buffer[kCqBatch];
    int produced = 0;
    if (process_cq(buffer, kCqBatch, &produced) >= 0) stash_.insert(stash_.end(), buffer, buffer + produced);
    if (events_.empty()) check_liveness();
  }
  if (events_.empty()) return 0;
  *out = events_.front();
  events_.pop_front();
  return 1;
}

void RdmEndpoint::disconnect() {
  if (state_ == State::kEstablished || state_ == State::kAccepting) {
    send_ctrl(peer_, make_ctrl(kBye, nonce_, shared_->name));
    queue_event(CmEventKind::kDisconnected, 0);
    state_ = State::kClosed;
  } else if (state_ == State::kConnecting) {
    ctrl_pending_ = false;
    fail_connect(-ECONNABORTED);
  }
}

gs_status_t RdmEndpoint::post_write(const WriteRequest &request) {
  ProviderCall call = provider_call();
  if (!call) return -ECONNRESET;
  return post_write_to(shared_->ep, peer_.addr, request);
}

// --- domain ------------------------------------------------------------------

gs_status_t RdmDomain::create_endpoint(ConnectionRequest *request, std::unique_ptr<Endpoint> *out) {
  return create_endpoint_as<RdmEndpoint, RdmConnectionRequest>(this, request, out);
}

gs_status_t RdmDomain::accept(Endpoint *endpoint, ConnectionRequest *request, const void *private_data,
                              uint32_t private_len) {
  return accept_as<RdmEndpoint, RdmConnectionRequest>(caps_, endpoint, request, private_data, private_len);
}

gs_status_t RdmDomain::listen(const sockaddr *addr, socklen_t len, int /*backlog*/, std::unique_ptr<Listener> *out) {
  sockaddr_storage bound;
  if (out == nullptr || !copy_sockaddr(addr, len, &bound)) return -EINVAL;
  auto core = std::make_shared<RdmListenerCore>();
  core->domain = this;
  set_error_detail({});

  // Claim the rendezvous name (a free ephemeral port for port 0).
  const bool any_port = sockaddr_port(bound) == 0;
  const std::string ip = sockaddr_ip(bound);
  uint64_t seed = random_u64();
  std::string detail;
  for (int attempt = 0; attempt < (any_port ? 128 : 1); ++attempt) {
    if (any_port) set_sockaddr_port(&bound, static_cast<uint16_t>(32768 + (seed >> 8) % 28232));
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    const std::string name = rendezvous_name(ip, sockaddr_port(bound));
    int fd = -1;
    const int ret = shm::claim_rendezvous(name, &fd, &detail);
    if (ret == -EADDRINUSE) continue;  // a live listener owns it
    if (ret < 0) return ret;
    core->rendezvous_fd = fd;
    core->rendezvous = name;
    break;
  }
  if (core->rendezvous_fd < 0) {
    set_error_detail(any_port ? "fabric:shm: no free port for " + ip : detail);
    return -EADDRINUSE;
  }
  core->bound = bound;

  gs_status_t ret = open_shared(&core->shared);
  if (ret < 0) return ret;
  core->stuck_watch = watchdog_.watch_stuck(core->shared->name);
  core->bufs.resize(kListenerCtrlBufs);
  for (size_t i = 0; i < core->bufs.size(); ++i) {
    ret = core->post_buf(i);
    if (ret < 0) return ret;
  }
  Rendezvous rv{};
  rv.magic = shm::kRendezvousMagic;
  rv.version = shm::kRendezvousVersion;
  rv.pid = getpid();
  std::strncpy(rv.name, core->shared->name.c_str(), sizeof(rv.name) - 1);
  if (ftruncate(core->rendezvous_fd, sizeof(rv)) != 0 ||
      pwrite(core->rendezvous_fd, &rv, sizeof(rv), 0) != static_cast<ssize_t>(sizeof(rv))) {
    return -errno;
  }
  *out = std::make_unique<RdmListener>(std::move(core));
  return 0;
}

}  // namespace

gs_status_t open_rdm_domain(const ProviderAttr &attr, std::unique_ptr<Domain> *out, std::string *error) {
  return open_domain_as<RdmDomain>(attr, out, error);
}

}  // namespace gpusock::wire::fabric
