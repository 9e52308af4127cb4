#include "wire/fabric/shm_bell.h"

#include "wire/fabric/shm_names.h"
#include "wire/fabric/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace gpusock::wire::fabric::shm {
namespace {

constexpr uint32_t kBellMagic = 0x4753424c;  // "GSBL"
constexpr uint32_t kBellVersion = 1;
constexpr char kWake = 1;
constexpr size_t kMaxDatagram = 128;  // a request carries an endpoint name (< kNameMax)

bool make_address(const std::string &path, sockaddr_un *out, socklen_t *len) {
  if (path.size() + 1 > sizeof(out->sun_path)) return false;
  std::memset(out, 0, sizeof(*out));
  out->sun_family = AF_UNIX;
  std::memcpy(out->sun_path, path.c_str(), path.size() + 1);
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return true;
}

// Maps the bell page of region `name` (open as `fd`), or nullptr. With
// `create`, appends it first (our own region, not yet published).
BellPage *map_bell_page(int fd, const std::string &name, bool create, void **head_map) {
  ShmRegionHead head{};
  size_t file_size = 0;
  if (!read_region_head(fd, name, &head, &file_size) || head.total_size % kBellPageSize != 0) return nullptr;
  if (create) {
    if (file_size != head.total_size || ftruncate(fd, static_cast<off_t>(head.total_size + kBellPageSize)) != 0)
      return nullptr;
  } else if (file_size < head.total_size + kBellPageSize) {
    return nullptr;  // a peer without a bell
  }
  void *page =
      mmap(nullptr, kBellPageSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(head.total_size));
  if (page == MAP_FAILED) return nullptr;
  if (head_map != nullptr) {
    *head_map = mmap(nullptr, kBellPageSize, PROT_READ, MAP_SHARED, fd, 0);
    if (*head_map == MAP_FAILED) {
      *head_map = nullptr;
      munmap(page, kBellPageSize);
      return nullptr;
    }
  }
  return static_cast<BellPage *>(page);
}

}  // namespace

int open_ringer() { return socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0); }

namespace {

int send_datagram(int sock, const sockaddr_un &addr, socklen_t addr_len, const void *data, size_t len) {
  for (;;) {
    if (sendto(sock, data, len, MSG_DONTWAIT | MSG_NOSIGNAL, reinterpret_cast<const sockaddr *>(&addr), addr_len) >= 0)
      return 0;
    if (errno != EINTR) return -errno;
  }
}

}  // namespace

int send_to_bell(int ringer, const std::string &path, const void *data, size_t len) {
  sockaddr_un addr;
  socklen_t addr_len = 0;
  if (ringer < 0 || !make_address(path, &addr, &addr_len)) return -EINVAL;
  const int rc = send_datagram(ringer, addr, addr_len, data, len);
  if (rc != -EAGAIN) return rc;
  // A datagram stays charged to the socket that sent it until its bell is
  // read, so a ringer shared by many connections runs out of send budget
  // once enough idle bells hold an unread ring, and then fails for every
  // bell: a lost wake-up. A fresh socket tells that from a full bell (which
  // is readable already, and says -EAGAIN again).
  const int fresh = open_ringer();
  if (fresh < 0) return rc;
  const int again = send_datagram(fresh, addr, addr_len, data, len);
  close(fresh);
  return again;
}

int bind_bell(const std::string &path) {
  sockaddr_un addr;
  socklen_t addr_len = 0;
  if (!make_address(path, &addr, &addr_len)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  const int sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (sock < 0) return -1;
  if (bind(sock, reinterpret_cast<sockaddr *>(&addr), addr_len) != 0) {
    const int err = errno;
    close(sock);
    errno = err;
    return -1;
  }
  return sock;
}

int connect_to_bell(const std::string &path) {
  sockaddr_un addr;
  socklen_t addr_len = 0;
  if (!make_address(path, &addr, &addr_len)) return -1;
  const int sock = open_ringer();
  if (sock >= 0 && connect(sock, reinterpret_cast<sockaddr *>(&addr), addr_len) == 0) return sock;
  if (sock >= 0) close(sock);
  return -1;
}

int ring_connected(int sock) {
  ssize_t rc;
  while ((rc = send(sock, &kWake, 1, MSG_DONTWAIT | MSG_NOSIGNAL)) < 0 && errno == EINTR) {}
  return rc >= 0 ? 0 : -errno;
}

namespace {

// Reads every datagram waiting on a bell socket, calling on_datagram(data,
// len) for each, kBatch to a recvmmsg: fewer than kBatch means the queue was
// empty after them, so a drain is one system call, not one per datagram plus
// the EAGAIN that ends it. Whether any came; *emptied: the queue was seen
// empty (false after an error other than EAGAIN).
template <class OnDatagram>
bool read_bell_datagrams(int sock, bool *emptied, OnDatagram on_datagram) {
  constexpr unsigned kBatch = 8;
  char buffers[kBatch][kMaxDatagram];
  iovec iov[kBatch];
  mmsghdr msgs[kBatch];
  bool any = false;
  for (;;) {
    for (unsigned i = 0; i < kBatch; ++i) {
      iov[i] = {buffers[i], kMaxDatagram - 1};
      msgs[i] = {};
      msgs[i].msg_hdr.msg_iov = &iov[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
    }
    const int n = recvmmsg(sock, msgs, kBatch, MSG_DONTWAIT, nullptr);
    if (n < 0) {
      if (errno == EINTR) continue;
      *emptied = errno == EAGAIN;
      return any;
    }
    any = any || n > 0;
    for (int i = 0; i < n; ++i) on_datagram(buffers[i], static_cast<size_t>(msgs[i].msg_len));
    if (static_cast<unsigned>(n) < kBatch) {
      *emptied = true;
      return any;
    }
  }
}

}  // namespace

bool drain_bell_socket(int sock) {
  bool emptied = false;
  return read_bell_datagrams(sock, &emptied, [](const char *, size_t) {});
}

// --- our bell -------------------------------------------------------------------

Bell::~Bell() {
  if (sock_ >= 0) {
    close(sock_);
    if (creator_.here()) unlink(path_.c_str());
  }
  if (page_ != nullptr) munmap(page_, kBellPageSize);
  if (head_map_ != nullptr) munmap(head_map_, kBellPageSize);
}

bool Bell::open(const std::string &name, const HintBoard *board, int32_t slot) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return false;
  page_ = map_bell_page(fd, name, true, &head_map_);
  close(fd);
  if (page_ == nullptr) return false;
  signal_ = &static_cast<const ShmRegionHead *>(head_map_)->signal;
  path_ = bell_path(name);
  sock_ = bind_bell(path_);
  if (sock_ < 0) return false;
  if (board != nullptr && board->valid() && slot >= 0 && board->name().size() < sizeof(page_->hint_board)) {
    std::memcpy(page_->hint_board, board->name().c_str(), board->name().size() + 1);
    page_->hint_slot = static_cast<uint32_t>(slot) + 1;
  }
  page_->marks_hints = kMarksHintsVersion;
  // Last: a peer that finds the magic may ring, and ask for ring-backs.
  page_->version = kBellVersion;
  __atomic_store_n(&page_->magic, kBellMagic, __ATOMIC_RELEASE);
  return true;
}

bool Bell::drain() {
  if (sock_ < 0) return false;
  return read_bell_datagrams(sock_, &drained_, [&](char *data, size_t len) {
    if (len <= 1) return;  // a wake-up
    data[len] = '\0';      // room kept: at most kMaxDatagram - 1 are read
    const std::string name(data, std::strlen(data));
    ProcessId owner;
    if (!parse_endpoint_name(name, &owner)) return;  // not a request of ours
    if (std::find(requesters_.begin(), requesters_.end(), name) == requesters_.end()) requesters_.push_back(name);
  });
}

void Bell::collect_requests() {
  if (page_ == nullptr) return;
  // The counter first: every request it counts sent its name before.
  requests_seen_ = page_->requests.load(std::memory_order_acquire);
  drain();
}

void Bell::serve_requests(int ringer) {
  for (const std::string &name : requesters_) (void)send_to_bell(ringer, bell_path(name), &kWake, 1);
  requesters_.clear();
}

void Bell::close_for_good(int ringer) {
  if (page_ == nullptr || !creator_.here()) return;
  page_->closed.store(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  collect_requests();
  serve_requests(ringer);
  if (sock_ >= 0) {
    close(sock_);
    unlink(path_.c_str());
    sock_ = -1;
  }
}

// --- a peer's bell --------------------------------------------------------------

PeerBell &PeerBell::operator=(PeerBell &&other) noexcept {
  if (this != &other) {
    reset();
    page_ = other.page_;
    head_map_ = other.head_map_;
    signal_ = other.signal_;
    path_ = std::move(other.path_);
    ringer_ = other.ringer_;
    connected_ = other.connected_;
    hint_ = std::move(other.hint_);
    other.page_ = nullptr;
    other.head_map_ = nullptr;
    other.signal_ = nullptr;
    other.connected_ = -1;
  }
  return *this;
}

namespace {

std::atomic<int> g_connected_ringers{0};

// One of the process's kConnectedRingers, if any is left. A load first, so
// that once they are all taken a ring by path costs no locked instruction.
bool reserve_connected_ringer(int limit) {
  if (g_connected_ringers.load(std::memory_order_relaxed) >= limit) return false;
  if (g_connected_ringers.fetch_add(1, std::memory_order_relaxed) < limit) return true;
  g_connected_ringers.fetch_sub(1, std::memory_order_relaxed);
  return false;
}

}  // namespace

void PeerBell::drop_connected() const {
  if (connected_ < 0) return;
  close(connected_);
  connected_ = -1;
  g_connected_ringers.fetch_sub(1, std::memory_order_relaxed);
}

void PeerBell::reset() {
  if (page_ != nullptr) munmap(page_, kBellPageSize);
  if (head_map_ != nullptr) munmap(head_map_, kBellPageSize);
  drop_connected();
  hint_.reset();
  page_ = nullptr;
  head_map_ = nullptr;
  signal_ = nullptr;
}

bool PeerBell::open(const std::string &name, int ringer) {
  reset();
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return false;
  void *head_map = nullptr;
  BellPage *page = map_bell_page(fd, name, false, &head_map);
  close(fd);
  if (page == nullptr) return false;
  if (__atomic_load_n(&page->magic, __ATOMIC_ACQUIRE) != kBellMagic || page->version != kBellVersion) {
    munmap(page, kBellPageSize);
    munmap(head_map, kBellPageSize);
    return false;
  }
  page_ = page;
  head_map_ = head_map;
  signal_ = &static_cast<const ShmRegionHead *>(head_map)->signal;
  path_ = bell_path(name);
  ringer_ = ringer;
  if (page->hint_slot != 0) {
    char board[sizeof(page->hint_board)];
    std::memcpy(board, page->hint_board, sizeof(board));
    board[sizeof(board) - 1] = '\0';
    hint_.open(board, page->hint_slot - 1);  // without it, the peer looks at us every time
  }
  return true;
}

int PeerBell::request_ringback(const std::string &our_name) const {
  if (page_ == nullptr) return -ENOTSUP;
  const int rc = send_to_bell(ringer_, path_, our_name.c_str(), our_name.size() + 1);
  if (rc == -ENOENT) return -ECONNREFUSED;
  // Counted also when its queue was full: the peer then drains it on its
  // next pass, and our next request finds room.
  if (rc == 0 || rc == -EAGAIN) {
    page_->requests.fetch_add(1, std::memory_order_seq_cst);
    hint_.mark();
  }
  return rc;
}

int PeerBell::ring() const {
  if (page_ == nullptr) return -ENOTSUP;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  hint_.mark();
  if (connected_ < 0 && reserve_connected_ringer(kConnectedRingers)) {
    connected_ = connect_to_bell(path_);
    if (connected_ < 0) g_connected_ringers.fetch_sub(1, std::memory_order_relaxed);
  }
  int rc = -ENOTCONN;
  if (connected_ >= 0) {
    rc = ring_connected(connected_);
    if (rc == -ECONNREFUSED || rc == -ENOTCONN) drop_connected();  // its bell was made again: by path from now on
  }
  if (connected_ < 0) rc = send_to_bell(ringer_, path_, &kWake, 1);
  return rc == -EAGAIN ? 0 : rc;  // its queue is full: it is readable already
}

bool PeerBell::take_admission() const {
  if (page_ == nullptr || page_->admission_cap == 0) return true;
  for (uint32_t taken = admitted();;) {
    if (all_admitted(taken)) return false;
    if (page_->admitted.compare_exchange_weak(taken, taken + 1, std::memory_order_acq_rel)) return true;
  }
}

}  // namespace gpusock::wire::fabric::shm
