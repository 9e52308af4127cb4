// Top layer: socket, bind, listen, connect, accept, accept4. socket() marks a
// TCP socket pending; bind/listen/connect have routing.h decide it; the calls
// on a gpusock socket go to the library, blocking ones wait in the shim.
#include "preload/fork.h"
#include "wire/log.h"
#include "preload/library.h"
#include "preload/listeners.h"
#include "preload/routing.h"
#include "preload/wait.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

using namespace gpusock::preload;

GS_EXPORT int socket(int domain, int type, int protocol) {
  const Real &R = real();
  if (t_inside || called_from_transport(__builtin_return_address(0))) {
    const int fd = R.socket(domain, type, protocol);
    if (fd >= 0) mark_transport_fd(fd);
    return fd;
  }
  if (!intercept_candidate(domain, type, protocol)) return R.socket(domain, type, protocol);
  // Where every port goes through gpusock the transport is known usable (or
  // not) here; where ports are listed, only at bind/listen/connect of a
  // selected one, so a process whose sockets all stay the kernel's never
  // loads it.
  if (every_port_selected()) {
    const int st = transport_or_fallback();
    if (st < 0) {
      errno = -st;
      return -1;
    }
    if (st > 0) return R.socket(domain, type, protocol);
  }
  const int fd = R.socket(domain, type, protocol);
  if (fd < 0) return fd;
  add_pending(fd, domain);
  return fd;
}

GS_EXPORT int bind(int fd, const sockaddr *addr, socklen_t len) {
  const Real &R = real();
  if (t_inside || called_from_transport(__builtin_return_address(0)))
    return transport_bind(fd, addr, len) ? 0 : R.bind(fd, addr, len);
  const uint8_t k = kind_of(fd);
  if (k == kGs) {
    Inside guard;
    return libc_result(gs().bind(fd, addr, len));
  }
  if (k == kDormant) {  // bound already (as the kernel says of a listening socket)
    errno = EINVAL;
    return -1;
  }
  if (k != kPending) return R.bind(fd, addr, len);
  Pending p;
  uint16_t port = 0;
  if (!take_pending(fd, &p) || port_of(addr, len, &port) < 0) {
    finalize_kernel(fd);
    return R.bind(fd, addr, len);
  }
  if (port == 0) {
    // Ephemeral: decided at listen or connect. The kernel picks the port now,
    // and a gpusock listener later binds that same port, so getsockname
    // answers the same before and after listen.
    const int r = R.bind(fd, addr, len);
    if (r == 0) {
      sockaddr_storage actual{};
      socklen_t al = sizeof actual;
      if (R.getsockname(fd, reinterpret_cast<sockaddr *>(&actual), &al) < 0) {
        std::memcpy(&actual, addr, std::min<size_t>(len, sizeof actual));
        al = len;
      }
      set_pending_bound(fd, actual, al);
    }
    return r;
  }
  const int d = decide_pending(fd, p, port, "bind " + addr_text(addr, len));
  if (d == 0) return R.bind(fd, addr, len);
  if (d < 0) return -1;
  Inside guard;
  const int r = gs().bind(fd, addr, len);
  gpusock::log::write(gpusock::log::kInfo, "shim", "fd %d: bind %s: gpusock (%s)%s", fd, addr_text(addr, len).c_str(),
                      transport_name(), r < 0 ? " failed" : "");
  return libc_result(r);
}

GS_EXPORT int listen(int fd, int backlog) {
  const Real &R = real();
  if (t_inside) return R.listen(fd, backlog);
  uint8_t k = kind_of(fd);
  if (k == kGs || k == kDormant) {
    adopt_if_cloned();
    k = kind_of(fd);
  }
  if (k == kPending) {
    Pending p;
    if (!take_pending(fd, &p)) return R.listen(fd, backlog);
    uint16_t port = 0;
    if (p.bound_len) port_of(reinterpret_cast<sockaddr *>(&p.bound), p.bound_len, &port);
    char what[32];
    snprintf(what, sizeof what, "listen on port %u", port);
    const int d = decide_pending(fd, p, port, what);
    if (d == 0) return R.listen(fd, backlog);
    if (d < 0) return -1;
    bind_recorded(fd, p);
    k = kGs;
  }
  if (k == kDormant) {  // listen() again on an inherited listener: it is used
    if (activate(fd) != 1) return 0;
    k = kGs;
  }
  if (k != kGs) return R.listen(fd, backlog);
  int r;
  {
    auto spec = spec_for_listen(fd);
    ListenArm arm(spec.get());
    Inside guard;
    // From the first moment (listeners.h).
    share_accepts(fd);
    r = gs().listen(fd, backlog);
  }
  if (r == 0) {
    note_listen(fd, backlog);
    if (auto info = sock_info(fd)) info->listening = true;
    if (gpusock::log::enabled(gpusock::log::kInfo)) {
      sockaddr_storage ss{};
      socklen_t sl = sizeof ss;
      Inside guard;
      gs().getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &sl);
      gpusock::log::write(gpusock::log::kInfo, "shim", "fd %d: listening on %s via gpusock (%s)", fd,
                          addr_text(reinterpret_cast<sockaddr *>(&ss), sl).c_str(), transport_name());
    }
  }
  return libc_result(r);
}

GS_EXPORT int connect(int fd, const sockaddr *addr, socklen_t len) {
  const Real &R = real();
  if (t_inside) return R.connect(fd, addr, len);
  uint8_t k = kind_of(fd);
  if (k == kPending) {
    Pending p;
    uint16_t port = 0;
    if (!take_pending(fd, &p) || port_of(addr, len, &port) < 0) {
      finalize_kernel(fd);
      return R.connect(fd, addr, len);
    }
    const int d = decide_pending(fd, p, port, "connect " + addr_text(addr, len));
    if (d == 0) return R.connect(fd, addr, len);
    if (d < 0) return -1;
    bind_recorded(fd, p);
    gpusock::log::write(gpusock::log::kInfo, "shim", "fd %d: connect %s via gpusock (%s)", fd,
                        addr_text(addr, len).c_str(), transport_name());
    k = kGs;
  }
  if (k != kGs) return R.connect(fd, addr, len);
  if (FdSlot *s = slot(fd)) s->wgen.fetch_add(1, std::memory_order_relaxed);
  if (gs_nonblocking(fd)) {
    Inside guard;
    return libc_result(gs().connect(fd, addr, len));
  }
  // Blocking connect: start it non-blocking, then wait in the shim.
  int r;
  {
    Inside guard;
    gs().fcntl(fd, F_SETFL, O_NONBLOCK);
    r = gs().connect(fd, addr, len);
    gs().fcntl(fd, F_SETFL, 0);
  }
  if (r != -EINPROGRESS && r != -EALREADY) return libc_result(r);
  const CallLimit limit = call_limit(fd, false);
  for (;;) {
    const int w = blocking_wait(fd, POLLOUT, limit);
    if (w == -EAGAIN) return libc_result(-EINPROGRESS);  // SO_SNDTIMEO expired, as the kernel reports it
    if (w < 0) return libc_result(w);
    Inside guard;
    sockaddr_storage peer;
    socklen_t pl = sizeof peer;
    if (gs().getpeername(fd, reinterpret_cast<sockaddr *>(&peer), &pl) == 0) return 0;
    int err = 0;
    socklen_t el = sizeof err;
    gs().getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (err) return libc_result(-err);
    // Woken without a result yet (a spurious readiness): wait again.
  }
}

GS_EXPORT int accept4(int fd, sockaddr *addr, socklen_t *len, int flags) {
  const Real &R = real();
  if (!t_inside && (kind_of(fd) == kGs || kind_of(fd) == kDormant)) adopt_if_cloned();
  if (!t_inside && kind_of(fd) == kDormant && accept_ready_dormant(fd) < 0) return -1;
  if (t_inside || kind_of(fd) != kGs) {
    const int r = R.accept4(fd, addr, len, flags);
    if (r >= 0 && kind_of(fd) == kTransport) mark_transport_fd(r);  // libfabric's own listener
    return r;
  }
  FdSlot *s = slot(fd);
  if (s) {
    s->rgen.fetch_add(1, std::memory_order_relaxed);
    s->rtouch.fetch_add(1, std::memory_order_relaxed);  // the listener is used (listeners.h)
  }
  if (!gs_nonblocking(fd)) {  // wait in the shim (signals), then take the connection
    const CallLimit limit = call_limit(fd, true);
    waiter_enter(fd);
    int w;
    while ((w = blocking_wait(fd, POLLIN, limit)) == 0) {}
    waiter_leave(fd);
    if (w < 0) return libc_result(w);
  }
  int r;
  {
    Inside guard;
    r = gs().accept4(fd, addr, len, flags);
  }
  if (r < 0) return libc_result(r);
  attach_gs_fd(r, nullptr);
  gpusock::log::write(gpusock::log::kDebug, "shim", "fd %d: accepted fd %d via gpusock", fd, r);
  return r;
}

GS_EXPORT int accept(int fd, sockaddr *addr, socklen_t *len) {
  if (t_inside || (kind_of(fd) != kGs && kind_of(fd) != kDormant)) {
    const int r = real().accept(fd, addr, len);
    if (r >= 0 && kind_of(fd) == kTransport) mark_transport_fd(r);
    return r;
  }
  return accept4(fd, addr, len, 0);
}
