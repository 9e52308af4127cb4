// Socket options (setsockopt/getsockopt) and addresses of a StreamSocket.
#include "wire/socket/stream_socket.h"

#include "wire/socket_rules.h"

#include <gpusock/socket.h>

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace gpusock::socket {

using namespace gpusock::wire;

namespace {

template <class T>
int get_value(const void *val, socklen_t len, T *out) {
  if (!val || len < sizeof(T)) return -EINVAL;
  std::memcpy(out, val, sizeof(T));
  return 0;
}

template <class T>
int put_value(void *val, socklen_t *len, T value) {
  if (!val || !len || *len < sizeof(T)) return -EINVAL;
  std::memcpy(val, &value, sizeof(T));
  *len = sizeof(T);
  return 0;
}

}  // namespace

int system_keepalive_seconds() {
  int value = 7200;
  if (FILE *f = std::fopen("/proc/sys/net/ipv4/tcp_keepalive_time", "r")) {
    if (std::fscanf(f, "%d", &value) != 1 || value <= 0) value = 7200;
    std::fclose(f);
  }
  return value;
}

// IPV6_V6ONLY in force: as set, else net.ipv6.bindv6only (0 unless changed).
int StreamSocket::v6only() const {
  if (options_.v6only >= 0) return options_.v6only;
  static const int system = [] {
    int value = 0;
    if (FILE *f = std::fopen("/proc/sys/net/ipv6/bindv6only", "r")) {
      if (std::fscanf(f, "%d", &value) != 1) value = 0;
      std::fclose(f);
    }
    return value != 0;
  }();
  return system;
}

int StreamSocket::setsockopt(int level, int name, const void *val, socklen_t len) {
  std::lock_guard lock(mu_);
  int v = 0;
  const bool unconnected = role_ == Role::kNew || role_ == Role::kBound || role_ == Role::kListening;
  if (level == SOL_SOCKET) {
    if (name == SO_LINGER) return get_value(val, len, &options_.linger_opt);
    if (int rc = get_value(val, len, &v); rc < 0) return rc;
    switch (name) {
      case SO_REUSEADDR:
        options_.reuseaddr = v != 0;
        return 0;
      case SO_REUSEPORT:
        return 0;
      case SO_KEEPALIVE:
        options_.keepalive = v != 0;
        next_keepalive_ = {};
        if (options_.keepalive) context_.kick();  // its timer runs in the background
        return 0;
      case SO_OOBINLINE:
        options_.oobinline = v != 0;
        return 0;
      case SO_RCVBUF:  // §7.1: the ring is twice the value; only before buffers exist
        if (unconnected && v > 0) {
          options_.rbuf_size = static_cast<uint32_t>(std::min(v, 1 << 29)) * 2;
          options_.rbuf_auto = false;
        }
        return 0;
      case SO_SNDBUF:
        if (unconnected && v > 0) {
          options_.sbuf_size = rules::send_ring_size(std::min(v, 1 << 29) * 2);
          options_.sbuf_auto = false;
        }
        return 0;
      case SO_RCVLOWAT:
      case SO_SNDLOWAT:
      case SO_PRIORITY:
        return 0;
      default:
        return -ENOPROTOOPT;
    }
  }
  if (level == IPPROTO_TCP) {
    if (int rc = get_value(val, len, &v); rc < 0) return rc;
    switch (name) {
      case TCP_NODELAY:
        options_.nodelay = v != 0;
        return 0;  // never delays anyway
      case TCP_KEEPIDLE:
        if (v <= 0) return -EINVAL;
        options_.keepidle_s = v;
        return 0;
      case TCP_MAXSEG:
      case TCP_KEEPCNT:
      case TCP_KEEPINTVL:
      case TCP_QUICKACK:
      case TCP_CORK:
        return 0;  // accepted, no meaning here
      default:
        return -ENOPROTOOPT;
    }
  }
  if (level == SOL_RDMA) {
    if (!unconnected) return -EINVAL;  // sizes are fixed once the connection exists
    if (int rc = get_value(val, len, &v); rc < 0) return rc;
    if (v < 0 || v > kQpMaxSize) return -EINVAL;
    switch (name) {
      case 0:
        options_.sq_size = static_cast<uint16_t>(v);
        return 0;  // RDMA_SQSIZE
      case 1:
        options_.rq_size = static_cast<uint16_t>(v);
        return 0;  // RDMA_RQSIZE
      case 2:
        options_.inline_size = static_cast<uint32_t>(v);
        return 0;  // RDMA_INLINE
      case 3:
        options_.iomap_size = scale_decode(scale_encode(static_cast<uint32_t>(v)));
        return 0;
      default:
        return -ENOPROTOOPT;
    }
  }
  if (level == SOL_GPUSOCK && name == GS_ACCEPT_ON_DEMAND) {
    if (int rc = get_value(val, len, &v); rc < 0) return rc;
    options_.accept_on_demand = v != 0;
    context_.kick();  // the background thread takes its requests again, or stops
    return 0;
  }
  if (level == IPPROTO_IPV6 && name == IPV6_V6ONLY) {
    if (family_ != AF_INET6) return -ENOPROTOOPT;
    if (int rc = get_value(val, len, &v); rc < 0) return rc;
    if (role_ != Role::kNew && role_ != Role::kBound) return -EINVAL;  // as the kernel: before bind's effect
    options_.v6only = v != 0;
    return 0;
  }
  if (level == IPPROTO_IP && name == IP_TOS) return 0;
  return -ENOPROTOOPT;
}

int StreamSocket::getsockopt(int level, int name, void *val, socklen_t *len) {
  std::lock_guard lock(mu_);
  if (level == SOL_SOCKET) {
    switch (name) {
      case SO_ERROR: {
        int err = so_error_;
        if (!err && role_ == Role::kConnected && conn_.core().state() == StreamState::kError)
          err = -conn_.core().error();
        so_error_ = 0;
        return put_value(val, len, err);
      }
      case SO_TYPE:
        return put_value(val, len, int(SOCK_STREAM));
      case SO_DOMAIN:
        return put_value(val, len, family_);
      case SO_PROTOCOL:
        return put_value(val, len, int(IPPROTO_TCP));
      case SO_ACCEPTCONN:
        return put_value(val, len, int(role_ == Role::kListening));
      case SO_RCVBUF:
        return put_value(val, len, int(options_.rbuf_size));
      case SO_SNDBUF:
        return put_value(val, len, int(options_.sbuf_size));
      case SO_REUSEADDR:
        return put_value(val, len, int(options_.reuseaddr));
      case SO_KEEPALIVE:
        return put_value(val, len, int(options_.keepalive));
      case SO_OOBINLINE:
        return put_value(val, len, int(options_.oobinline));
      case SO_LINGER:
        return put_value(val, len, options_.linger_opt);
      default:
        return -ENOPROTOOPT;
    }
  }
  if (level == IPPROTO_TCP) {
    switch (name) {
      case TCP_NODELAY:
        return put_value(val, len, int(options_.nodelay));
      case TCP_MAXSEG:
        return put_value(val, len, int(kMaxTransfer));
      case TCP_KEEPIDLE:
        return put_value(val, len, options_.keepidle_s > 0 ? options_.keepidle_s : system_keepalive_seconds());
      case TCP_KEEPCNT:
      case TCP_KEEPINTVL:
        return put_value(val, len, 1);
      default:
        return -ENOPROTOOPT;
    }
  }
  if (level == IPPROTO_IPV6 && name == IPV6_V6ONLY && family_ == AF_INET6) return put_value(val, len, v6only());
  if (level == SOL_GPUSOCK && name == GS_ACCEPT_ON_DEMAND)  // in force: not over verbs (include/gpusock/socket.h)
    return put_value(val, len, int(options_.accept_on_demand && domain_->caps().requests_wait));
  if (level == SOL_RDMA) {
    switch (name) {
      case 0:
        return put_value(val, len, int(options_.sq_size));
      case 1:
        return put_value(val, len, int(options_.rq_size));
      case 2:
        return put_value(val, len, int(options_.inline_size));
      case 3:
        return put_value(val, len, int(options_.iomap_size));
      default:
        return -ENOPROTOOPT;
    }
  }
  return -ENOPROTOOPT;
}

int StreamSocket::getsockname(sockaddr *addr, socklen_t *len) {
  std::lock_guard lock(mu_);
  if (!addr || !len) return -EFAULT;
  sockaddr_storage unbound{};
  const sockaddr_storage *src = &local_addr_;
  socklen_t src_len = local_len_;
  if (src_len == 0) {
    unbound.ss_family = static_cast<sa_family_t>(family_);
    src = &unbound;
    src_len = family_ == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  }
  std::memcpy(addr, src, std::min(*len, src_len));
  *len = src_len;
  return 0;
}

int StreamSocket::getpeername(sockaddr *addr, socklen_t *len) {
  std::lock_guard lock(mu_);
  if (!addr || !len) return -EFAULT;
  if (role_ != Role::kConnected || peer_len_ == 0) return -ENOTCONN;
  std::memcpy(addr, &peer_addr_, std::min(*len, peer_len_));
  *len = peer_len_;
  return 0;
}

}  // namespace gpusock::socket
