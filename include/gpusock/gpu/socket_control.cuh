// gpusock device API: the socket calls that move no data (socket, bind,
// listen, connect, accept, shutdown, close, nop, should_stop), each a template
// on the scope that runs it (BlockScope or WarpScope, scope.cuh). The leader
// talks to the proxy (channel_ops.cuh); every thread gets the result.
// calls.cuh gives them their public names.
#ifndef GPUSOCK_GPU_SOCKET_CONTROL_CUH
#define GPUSOCK_GPU_SOCKET_CONTROL_CUH

#include <gpusock/channel.h>
#include <gpusock/gpu/channel_ops.cuh>
#include <gpusock/gpu/primitives.cuh>
#include <gpusock/gpu/scope.cuh>
#include <gpusock/hd.h>

#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

namespace gpusock {
namespace detail {

using namespace channel;

template <class S>
GS_HD int socket(const DeviceContext &c, int domain, int type) {
  int rc = 0;
  if (S::leader()) {
    if (domain != AF_INET && domain != AF_INET6) rc = -EAFNOSUPPORT;
    else if ((type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC)) != SOCK_STREAM) rc = -EPROTONOSUPPORT;
    else rc = claim_slot(c, (type & SOCK_NONBLOCK) != 0);
  }
  return S::broadcast(rc);
}

template <class S>
GS_HD int bind(const DeviceContext &c, int s, const sockaddr *addr, socklen_t len) {
  int rc = 0;
  if (S::leader()) {
    rc = open_socket(c, s);
    if (rc == 0 && (addr == nullptr || len < sizeof(sa_family_t) || len > kMaxAddrLen)) rc = -EINVAL;
    if (rc == 0) {
      Request r = make_request(c, s, kOpBind);
      r.addr_len = static_cast<uint32_t>(len);
      memcpy(r.addr, addr, len);
      rc = control(c, s, r);
    }
  }
  return S::broadcast(rc);
}

template <class S>
GS_HD int listen(const DeviceContext &c, int s, int backlog) {
  int rc = 0;
  if (S::leader()) {
    rc = open_socket(c, s);
    if (rc == 0) {
      Request r = make_request(c, s, kOpListen);
      r.arg0 = backlog;
      rc = control(c, s, r);
    }
  }
  return S::broadcast(rc);
}

// Leader: waits for the connect started earlier on s.
GS_HD int wait_connected(const DeviceContext &c, int s, uint64_t deadline, bool nonblocking) {
  DeviceSocket &d = c.sockets[s];
  const SocketStatus *st = c.status + s;
  prim::Backoff backoff;
  for (;;) {
    const StatusView v = read_status(c, st);
    if (v.state & kStConnected) {
      prim::fence_acquire();
      d.flags &= ~kDevConnecting;
      return 0;
    }
    if (v.state & (kStFailed | kStError)) {
      prim::fence_acquire();
      d.flags &= ~kDevConnecting;
      const int err = prim::load_acquire(&st->error);
      return err < 0 ? err : -ECONNREFUSED;
    }
    if (nonblocking) return -EALREADY;
    if (backoff.stop_check_due() && stop_requested(c)) return -ESHUTDOWN;
    if (prim::now_ns() >= deadline) return -ETIMEDOUT;
    backoff.pause();
  }
}

template <class S>
GS_HD int connect(const DeviceContext &c, int s, const sockaddr *addr, socklen_t len, int timeout_ms) {
  int rc = 0;
  if (S::leader()) {
    rc = open_socket(c, s);
    DeviceSocket &d = c.sockets[s];
    const bool nonblocking = rc == 0 && (d.flags & kDevNonblocking);
    if (rc == 0 && (d.flags & kDevConnecting)) {
      rc = wait_connected(c, s, deadline_after(timeout_ms), nonblocking);
    } else if (rc == 0 && (prim::load_acquire(&c.status[s].state) & kStConnected)) {
      rc = -EISCONN;
    } else if (rc == 0) {
      if (addr == nullptr || len < sizeof(sa_family_t) || len > kMaxAddrLen) rc = -EINVAL;
      if (rc == 0) {
        Request r = make_request(c, s, kOpConnect);
        r.addr_len = static_cast<uint32_t>(len);
        memcpy(r.addr, addr, len);
        rc = control(c, s, r);
      }
      if (rc == 0) {
        d.buffer = prim::load_acquire(&c.status[s].buffer);  // published before the completion
        d.flags |= kDevConnecting;
        rc = nonblocking ? -EINPROGRESS : wait_connected(c, s, deadline_after(timeout_ms), false);
      }
    }
  }
  return S::broadcast(rc);
}

template <class S>
GS_HD int accept(const DeviceContext &c, int listener, int flags, int timeout_ms) {
  int rc = 0;
  if (S::leader()) {
    rc = open_socket(c, listener);
    const bool nonblocking = rc == 0 && (c.sockets[listener].flags & kDevNonblocking);
    const uint64_t deadline = deadline_after(timeout_ms);
    const SocketStatus *lst = c.status + listener;
    int slot = -1;
    prim::Backoff backoff;
    while (rc == 0) {
      const StatusView v = read_status(c, lst);
      if (!(v.state & kStListening)) {
        rc = -EINVAL;
        break;
      }
      if (v.accept_queued > 0) {
        if (slot < 0) {
          slot = claim_slot(c, (flags & SOCK_NONBLOCK) != 0);
          if (slot < 0) {
            rc = slot;
            break;
          }
        }
        Request r = make_request(c, slot, kOpAccept);
        r.arg0 = listener;
        r.arg1 = static_cast<int32_t>(c.sockets[listener].gen);
        const int got = control(c, slot, r);
        if (got == 0) {
          c.sockets[slot].buffer = prim::load_acquire(&c.status[slot].buffer);
          rc = slot;
          slot = -1;
          break;
        }
        if (got != -EAGAIN) {  // -EAGAIN: another block took that connection
          rc = got;
          break;
        }
        continue;
      }
      if (nonblocking) rc = -EAGAIN;
      else if (backoff.stop_check_due() && stop_requested(c)) rc = -ESHUTDOWN;
      else if (prim::now_ns() >= deadline) rc = -ETIMEDOUT;
      else backoff.pause();
    }
    if (slot >= 0) {  // claimed for nothing: hand it back
      push_request(c, make_request(c, slot, kOpClose));
      c.sockets[slot].flags = 0;
    }
  }
  return S::broadcast(rc);
}

template <class S>
GS_HD int shutdown(const DeviceContext &c, int s, int how) {
  int rc = 0;
  if (S::leader()) {
    rc = open_socket(c, s);
    if (rc == 0 && how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) rc = -EINVAL;
    if (rc == 0) {
      Request r = make_request(c, s, kOpShutdown);
      r.arg0 = how;
      rc = control(c, s, r);
      if (rc == 0) {
        if (how == SHUT_RD || how == SHUT_RDWR) c.sockets[s].flags |= kDevShutRd;
        if (how == SHUT_WR || how == SHUT_RDWR) c.sockets[s].flags |= kDevShutWr;
      }
    }
  }
  return S::broadcast(rc);
}

template <class S>
GS_HD int close(const DeviceContext &c, int s) {
  int rc = 0;
  if (S::leader()) {
    rc = open_socket(c, s);
    if (rc == 0) {
      rc = push_request(c, make_request(c, s, kOpClose));  // flushed and released by the proxy
      c.sockets[s].flags = 0;
    }
  }
  return S::broadcast(rc);
}

template <class S>
GS_HD int nop(const DeviceContext &c, int s) {
  int rc = 0;
  if (S::leader()) {
    rc = open_socket(c, s);
    if (rc == 0) rc = control(c, s, make_request(c, s, kOpNop));
  }
  return S::broadcast(rc);
}

template <class S>
GS_HD bool should_stop(const DeviceContext &c) {
  bool stop = false;
  if (S::leader()) stop = stop_requested(c);
  return S::broadcast(stop);
}

}  // namespace detail
}  // namespace gpusock

#endif
