// The names of fork relays' child ends (relay_name.h).
#include "preload/relay_name.h"

#include <netinet/in.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

namespace gpusock::preload {

namespace {

// sun_path of a relay end: an abstract name (a leading 0 byte), the tag, the
// binding process and a serial (names are unique per network namespace), then
// each address as its length and its bytes.
constexpr char kTag[] = "gpusock-relay";
constexpr size_t kTagLen = sizeof kTag - 1;
constexpr size_t kHeaderLen = 1 + kTagLen + 2 * sizeof(uint32_t);

bool fits(socklen_t len) { return len > 0 && len <= sizeof(sockaddr_in6); }

size_t encode(const ConnectionNames &names, uint32_t serial, char *path) {
  const uint32_t pid = static_cast<uint32_t>(getpid());
  size_t at = 0;
  path[at++] = 0;
  std::memcpy(path + at, kTag, kTagLen);
  at += kTagLen;
  std::memcpy(path + at, &pid, sizeof pid);
  at += sizeof pid;
  std::memcpy(path + at, &serial, sizeof serial);
  at += sizeof serial;
  for (auto [addr, len] : {std::pair{&names.local, names.local_len}, std::pair{&names.peer, names.peer_len}}) {
    path[at++] = static_cast<char>(len);
    std::memcpy(path + at, addr, len);
    at += len;
  }
  return at;
}

// One address at path[*at], within n bytes.
bool decode_one(const char *path, size_t n, size_t *at, sockaddr_storage *addr, socklen_t *len) {
  if (*at >= n) return false;
  *len = static_cast<uint8_t>(path[(*at)++]);
  if (!fits(*len) || *at + *len > n) return false;
  std::memcpy(addr, path + *at, *len);
  *at += *len;
  return true;
}

}  // namespace

bool name_relay_end(int c, const ConnectionNames &names) {
  static std::atomic<uint32_t> serial{0};
  if (!fits(names.local_len) || !fits(names.peer_len)) return false;
  static_assert(kHeaderLen + 2 * (1 + sizeof(sockaddr_in6)) <= sizeof(sockaddr_un::sun_path));
  for (int attempt = 0; attempt < 8; ++attempt) {  // a name left by an earlier process of this pid
    sockaddr_un un{};
    un.sun_family = AF_UNIX;
    const size_t n = encode(names, serial.fetch_add(1), un.sun_path);
    if (real().bind(c, reinterpret_cast<sockaddr *>(&un),
                    static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + n)) == 0)
      return true;
    if (errno != EADDRINUSE) return false;
  }
  return false;
}

bool relay_end_names(int fd, ConnectionNames *out) {
  sockaddr_un un{};
  socklen_t len = sizeof un;
  if (real().getsockname(fd, reinterpret_cast<sockaddr *>(&un), &len) < 0 || un.sun_family != AF_UNIX ||
      len < offsetof(sockaddr_un, sun_path) + kHeaderLen)
    return false;
  const size_t n = std::min<size_t>(len, sizeof un) - offsetof(sockaddr_un, sun_path);
  if (un.sun_path[0] != 0 || std::memcmp(un.sun_path + 1, kTag, kTagLen) != 0) return false;
  size_t at = kHeaderLen;
  return decode_one(un.sun_path, n, &at, &out->local, &out->local_len) &&
         decode_one(un.sun_path, n, &at, &out->peer, &out->peer_len);
}

bool is_relay_end(int fd) {
  ConnectionNames names;
  return relay_end_names(fd, &names);
}

void copy_address_out(const sockaddr_storage &from, socklen_t from_len, sockaddr *to, socklen_t *len) {
  std::memcpy(to, &from, std::min(*len, from_len));
  *len = from_len;
}

}  // namespace gpusock::preload
