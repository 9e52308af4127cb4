// gpusock device API: the socket calls that move no data (socket, bind,
// listen, connect, accept, shutdown, close, nop, should_stop), each a template
// on the scope that runs it (BlockScope, WarpScope or ThreadScope, scope.cuh). The leader
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
#include <sys/socket.h>

namespace gpusock {
namespace detail {

using namespace channel;

template <class S>
GS_HD int socket(const DeviceContext &c, int domain, int type) {
  return on_leader<S>([&] {
    if (domain != AF_INET && domain != AF_INET6) return -EAFNOSUPPORT;
    if ((type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC)) != SOCK_STREAM) return -EPROTONOSUPPORT;
    return claim_slot(c, (type & SOCK_NONBLOCK) != 0);
  });
}

template <class S>
GS_HD int bind(const DeviceContext &c, int s, const sockaddr *addr, socklen_t len) {
  return on_leader<S>([&] {
    if (const int rc = open_socket(c, s); rc < 0) return rc;
    return control_with_address(c, s, kOpBind, addr, len);
  });
}

template <class S>
GS_HD int listen(const DeviceContext &c, int s, int backlog) {
  return on_leader<S>([&] {
    if (const int rc = open_socket(c, s); rc < 0) return rc;
    return control_with_arg(c, s, kOpListen, backlog);
  });
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
      return status_error(st, -ECONNREFUSED);
    }
    if (const int rc = wait_more(c, backoff, nonblocking, deadline, -EALREADY); rc < 0) return rc;
  }
}

// Leader: starts a connect on s, or waits for the one under way.
GS_HD int connect_leader(const DeviceContext &c, int s, const sockaddr *addr, socklen_t len, int timeout_ms) {
  if (const int rc = open_socket(c, s); rc < 0) return rc;
  DeviceSocket &d = c.sockets[s];
  const bool nonblocking = (d.flags & kDevNonblocking) != 0;
  if (d.flags & kDevConnecting) return wait_connected(c, s, deadline_after(timeout_ms), nonblocking);
  if (prim::load_acquire(&c.status[s].state) & kStConnected) return -EISCONN;
  const int rc = control_with_address(c, s, kOpConnect, addr, len);
  if (rc != 0) return rc;
  d.buffer = prim::load_acquire(&c.status[s].buffer);  // published before the completion
  d.flags |= kDevConnecting;
  return nonblocking ? -EINPROGRESS : wait_connected(c, s, deadline_after(timeout_ms), false);
}

template <class S>
GS_HD int connect(const DeviceContext &c, int s, const sockaddr *addr, socklen_t len, int timeout_ms) {
  return on_leader<S>([&] { return connect_leader(c, s, addr, len, timeout_ms); });
}

// Leader: waits for a connection queued on the listener and takes it.
GS_HD int accept_leader(const DeviceContext &c, int listener, int flags, int timeout_ms) {
  int rc = open_socket(c, listener);
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
    rc = wait_more(c, backoff, nonblocking, deadline);
  }
  if (slot >= 0) {  // claimed for nothing: hand it back
    push_request(c, make_request(c, slot, kOpClose));
    c.sockets[slot].flags = 0;
  }
  return rc;
}

template <class S>
GS_HD int accept(const DeviceContext &c, int listener, int flags, int timeout_ms) {
  return on_leader<S>([&] { return accept_leader(c, listener, flags, timeout_ms); });
}

template <class S>
GS_HD int shutdown(const DeviceContext &c, int s, int how) {
  return on_leader<S>([&] {
    if (const int rc = open_socket(c, s); rc < 0) return rc;
    if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) return -EINVAL;
    const int rc = control_with_arg(c, s, kOpShutdown, how);
    if (rc == 0) {
      if (how == SHUT_RD || how == SHUT_RDWR) c.sockets[s].flags |= kDevShutRd;
      if (how == SHUT_WR || how == SHUT_RDWR) c.sockets[s].flags |= kDevShutWr;
    }
    return rc;
  });
}

template <class S>
GS_HD int close(const DeviceContext &c, int s) {
  return on_leader<S>([&] {
    if (const int rc = open_socket(c, s); rc < 0) return rc;
    const int rc = push_request(c, make_request(c, s, kOpClose));  // flushed and released by the proxy
    c.sockets[s].flags = 0;
    return rc;
  });
}

// A request the proxy answers at once: one doorbell round trip.
template <class S>
GS_HD int nop(const DeviceContext &c, int s) {
  return on_leader<S>([&] {
    if (const int rc = open_socket(c, s); rc < 0) return rc;
    return control(c, s, make_request(c, s, kOpNop));
  });
}

template <class S>
GS_HD bool should_stop(const DeviceContext &c) {
  return on_leader<S>([&] { return stop_requested(c); });
}

}  // namespace detail
}  // namespace gpusock

#endif
