// What a gpusock socket accepts, whoever drives it: the CPU sockets
// (wire/socket/StreamSocket) and the proxy's GPU sockets apply the same rules,
// from here, so that a call fails the same way on both.
#pragma once

#include "wire/connection_driver.h"

#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

namespace gpusock::wire::rules {

// listen(): a backlog of 0 or less means 1, as on Linux; more is cut to this.
inline constexpr int kMaxBacklog = 4096;
inline int clamp_backlog(int backlog) { return std::clamp(backlog <= 0 ? 1 : backlog, 1, kMaxBacklog); }

// bind() and connect(): the address is an IPv4 or IPv6 one (of `family`
// when the socket has one; AF_UNSPEC: either) and `len` covers it. 0, -EINVAL
// or -EAFNOSUPPORT. The proxy passes AF_UNSPEC: a GPU socket's family stays
// on the GPU (gsocket claims its slot there, with no round trip).
inline int check_address(const sockaddr *addr, socklen_t len, int family) {
  if (!addr || len < sizeof(sa_family_t) || len > sizeof(sockaddr_storage)) return -EINVAL;
  const int given = addr->sa_family;
  if (family != AF_UNSPEC ? given != family : given != AF_INET && given != AF_INET6) return -EAFNOSUPPORT;
  if ((given == AF_INET && len < sizeof(sockaddr_in)) || (given == AF_INET6 && len < sizeof(sockaddr_in6)))
    return -EINVAL;
  return 0;
}

// listen() on a socket never bound: any address, any port, as TCP does.
inline socklen_t any_address(int family, sockaddr_storage *out) {
  std::memset(out, 0, sizeof *out);
  out->ss_family = static_cast<sa_family_t>(family);
  return family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

// Ring sizes: the receive ring as the driver sizes it (even, within what a
// record can address), the send ring at least one page.
inline constexpr uint32_t kMinSendRing = 4096;
inline uint32_t send_ring_size(uint32_t requested) { return std::max(requested, kMinSendRing); }
using wire::receive_ring_size;

}  // namespace gpusock::wire::rules
