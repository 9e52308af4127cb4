// fabric:shm peers: control messages, addresses, the in-process registry and
// AV entries (fabric_rdm.h).
#include "wire/fabric/fabric_rdm.h"
#include "wire/status_kinds.h"

#include <arpa/inet.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>

namespace gpusock::wire::fabric::rdm {
namespace {

constexpr uint32_t kCtrlMagic = 0x4753484d;  // "GSHM"
constexpr uint16_t kCtrlVersion = 1;

// Constructed on first use: the library may be called from other static
// constructors (the preload shim).
struct Registry {
  std::mutex mu;
  std::unordered_map<std::string, std::weak_ptr<RdmShared>> map;
};
Registry &registry() {
  static Registry *instance = new Registry;  // never destroyed: endpoints may outlive static destructors
  return *instance;
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

}  // namespace

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

bool ipv4_client(const sockaddr_storage &addr) {
  return addr.ss_family == AF_INET || IN6_IS_ADDR_V4MAPPED(&reinterpret_cast<const sockaddr_in6 &>(addr).sin6_addr);
}

sockaddr_storage as_family(const sockaddr_storage &addr, sa_family_t family) {
  sockaddr_storage out = addr;
  if (addr.ss_family == AF_INET && family == AF_INET6) {
    const auto &a4 = reinterpret_cast<const sockaddr_in &>(addr);
    auto &a6 = reinterpret_cast<sockaddr_in6 &>(out);
    out = {};
    a6.sin6_family = AF_INET6;
    a6.sin6_port = a4.sin_port;
    a6.sin6_addr.s6_addr[10] = a6.sin6_addr.s6_addr[11] = 0xff;
    std::memcpy(&a6.sin6_addr.s6_addr[12], &a4.sin_addr, 4);
  } else if (addr.ss_family == AF_INET6 && family == AF_INET && ipv4_client(addr)) {
    const auto &a6 = reinterpret_cast<const sockaddr_in6 &>(addr);
    auto &a4 = reinterpret_cast<sockaddr_in &>(out);
    out = {};
    a4.sin_family = AF_INET;
    a4.sin_port = a6.sin6_port;
    std::memcpy(&a4.sin_addr, &a6.sin6_addr.s6_addr[12], 4);
  }
  return out;
}

std::vector<std::string> rendezvous_candidates(const sockaddr_storage &addr) {
  const uint16_t port = sockaddr_port(addr);
  std::vector<std::string> names;
  names.push_back(shm::rendezvous_name(sockaddr_ip(addr), port));
  if (addr.ss_family == AF_INET) {
    names.push_back(shm::rendezvous_name("0.0.0.0", port));
    names.push_back(shm::rendezvous_name("::", port));
  } else {
    const in6_addr &a6 = reinterpret_cast<const sockaddr_in6 &>(addr).sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a6)) {
      char text[INET_ADDRSTRLEN] = {};
      inet_ntop(AF_INET, &a6.s6_addr[12], text, sizeof(text));
      names.push_back(shm::rendezvous_name(text, port));
      names.push_back(shm::rendezvous_name("0.0.0.0", port));
    }
    names.push_back(shm::rendezvous_name("::", port));
  }
  return names;
}

RdmShared::~RdmShared() {
  if (!creator.here()) return;  // left to its process (creator.h); so is its bell
  close_fid(ep);                // unlinks /dev/shm/<name> (and the bell page appended to it)
  close_fid(cq);
  close_fid(av);
  if (board) board->give_slot(hint_slot);
}

void registry_add(const std::shared_ptr<RdmShared> &shared) {
  Registry &reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.map[shared->name] = shared;
}

void retire_shared(const std::shared_ptr<RdmShared> &shared, int ringer) {
  if (!shared) return;
  {
    Registry &reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    reg.map.erase(shared->name);
  }
  std::vector<std::shared_ptr<RdmShared>> release;
  {
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->alive.store(false, std::memory_order_seq_cst);
    release.swap(shared->inbound);
  }
  const char one = 1;
  for (const auto &sender : release) (void)shm::send_to_bell(ringer, shm::bell_path(sender->name), &one, 1);
  shared->bell.close_for_good(ringer);
}

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

gs_status_t insert_peer(const std::shared_ptr<RdmShared> &self, const char *name, pid_t pid, int ringer, PeerRef *out) {
  if (memchr(name, '\0', kNameMax) == nullptr) return -EINVAL;
  std::shared_ptr<RdmShared> pin;
  if (pid == getpid()) {
    pin = pin_local_peer(self, name);
    if (!pin) return -ECONNREFUSED;
  }
  {
    std::lock_guard<std::mutex> lock(self->av_mu);
    auto &[addr, inserts] = self->av_names[name];
    if (inserts == 0) {
      errno = 0;
      const int ret = fi_av_insert(self->av, name, 1, &addr, 0, nullptr);
      if (ret != 1) {
        // shm 1.17 returns only a count; why the peer's region could not be
        // mapped is left in errno by its shm_open or mmap.
        const int err = errno;
        self->av_names.erase(name);
        const gs_status_t status = ret < 0 ? fi_status(ret) : out_of_resources(-err) ? -err : -EIO;
        set_error_detail(std::string("fabric:shm: mapping peer ") + name + ": " +
                         (ret < 0 ? fi_error_text(ret) : std::string(std::strerror(-status))));
        return status;
      }
    }
    ++inserts;
    out->addr = addr;
  }
  out->pin = std::move(pin);
  out->bell.open(name, ringer);  // none: a peer that never sleeps
  return 0;
}

void remove_peer(RdmShared &self, PeerRef *ref) {
  if (ref->valid()) {
    std::lock_guard<std::mutex> lock(self.av_mu);
    const auto named = std::find_if(self.av_names.begin(), self.av_names.end(),
                                    [&](const auto &entry) { return entry.second.first == ref->addr; });
    if (named == self.av_names.end() || --named->second.second == 0) {
      fi_av_remove(self.av, &ref->addr, 1, 0);
      if (named != self.av_names.end()) self.av_names.erase(named);
    }
  }
  ref->addr = FI_ADDR_NOTAVAIL;
  ref->pin.reset();
  ref->bell.reset();
}

}  // namespace gpusock::wire::fabric::rdm
