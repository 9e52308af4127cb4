// gpusock device API: the public calls (GPUnet's names), each a template on
// the scope that makes the call together (scope.cuh):
//   gsend(ctx, ...)               BlockScope, the default: every thread of the
//                                 block calls with the same arguments; all move
//                                 the data and all get the result
//   gsend<WarpScope>(ctx, ...)    every lane of one warp calls; the warp owns the
//                                 socket, so one block can serve many sockets
//   gsend<ThreadScope>(ctx, ...)  one thread calls alone and owns the socket
// gsend_warp(ctx, ...) and the other _warp names are GPUnet-style aliases of
// the warp form. Every call returns >= 0 or a negated errno; gpusock/gpu.cuh
// says more.
#ifndef GPUSOCK_GPU_CALLS_CUH
#define GPUSOCK_GPU_CALLS_CUH

#include <gpusock/gpu/channel_ops.cuh>
#include <gpusock/gpu/scope.cuh>
#include <gpusock/gpu/socket_control.cuh>
#include <gpusock/gpu/socket_data.cuh>
#include <gpusock/hd.h>

#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>

namespace gpusock {

// Status-only calls return gs_status_t; calls that return a descriptor or a
// count in the same word keep POSIX's int / ssize_t (docs/architecture.md).

// protocol: ignored.
template <class S = BlockScope>
GS_HD int gsocket(const DeviceContext &c, int domain, int type, int /*protocol*/ = 0) {
  return detail::socket<S>(c, domain, type);
}

template <class S = BlockScope>
GS_HD gs_status_t gbind(const DeviceContext &c, int s, const sockaddr *addr, socklen_t len) {
  return detail::bind<S>(c, s, addr, len);
}

template <class S = BlockScope>
GS_HD gs_status_t glisten(const DeviceContext &c, int s, int backlog) {
  return detail::listen<S>(c, s, backlog);
}

// flags: SOCK_NONBLOCK for the new socket. The listener's own mode decides
// whether gaccept waits.
template <class S = BlockScope>
GS_HD int gaccept(const DeviceContext &c, int s, int flags = 0, int timeout_ms = -1) {
  return detail::accept<S>(c, s, flags, timeout_ms);
}

template <class S = BlockScope>
GS_HD gs_status_t gconnect(const DeviceContext &c, int s, const sockaddr *addr, socklen_t len, int timeout_ms = -1) {
  return detail::connect<S>(c, s, addr, len, timeout_ms);
}

// Blocking: returns once all len bytes are in the send ring. MSG_DONTWAIT:
// what fits now, or -EAGAIN.
template <class S = BlockScope>
GS_HD ssize_t gsend(const DeviceContext &c, int s, const void *buf, size_t len, int flags = 0, int timeout_ms = -1) {
  return detail::send<S>(c, s, buf, len, flags, timeout_ms);
}

// What is available (at least 1 byte), 0 at EOF; MSG_WAITALL: all len bytes.
template <class S = BlockScope>
GS_HD ssize_t grecv(const DeviceContext &c, int s, void *buf, size_t len, int flags = 0, int timeout_ms = -1) {
  return detail::recv<S>(c, s, buf, len, flags, timeout_ms);
}

template <class S = BlockScope>
GS_HD gs_status_t gshutdown(const DeviceContext &c, int s, int how) {
  return detail::shutdown<S>(c, s, how);
}

template <class S = BlockScope>
GS_HD gs_status_t gclose(const DeviceContext &c, int s) {
  return detail::close<S>(c, s);
}

// Threads of the scope share the fds; returns how many have revents, 0 on timeout.
template <class S = BlockScope>
GS_HD int gpoll(const DeviceContext &c, gpollfd *fds, int nfds, int timeout_ms) {
  return detail::poll<S>(c, fds, nfds, timeout_ms);
}

// True once the host called Proxy::request_kernel_stop().
template <class S = BlockScope>
GS_HD bool gshould_stop(const DeviceContext &c) {
  return detail::should_stop<S>(c);
}

// A request the proxy answers at once: one doorbell round trip.
template <class S = BlockScope>
GS_HD gs_status_t gnop(const DeviceContext &c, int s) {
  return detail::nop<S>(c, s);
}

// ---- GPUnet-style names of the warp form ----
GS_HD int gsocket_warp(const DeviceContext &c, int domain, int type, int protocol = 0) {
  return gsocket<WarpScope>(c, domain, type, protocol);
}
GS_HD gs_status_t gbind_warp(const DeviceContext &c, int s, const sockaddr *addr, socklen_t len) {
  return gbind<WarpScope>(c, s, addr, len);
}
GS_HD gs_status_t glisten_warp(const DeviceContext &c, int s, int backlog) { return glisten<WarpScope>(c, s, backlog); }
GS_HD int gaccept_warp(const DeviceContext &c, int s, int flags = 0, int timeout_ms = -1) {
  return gaccept<WarpScope>(c, s, flags, timeout_ms);
}
GS_HD gs_status_t gconnect_warp(const DeviceContext &c, int s, const sockaddr *addr, socklen_t len,
                                int timeout_ms = -1) {
  return gconnect<WarpScope>(c, s, addr, len, timeout_ms);
}
GS_HD ssize_t gsend_warp(const DeviceContext &c, int s, const void *buf, size_t len, int flags = 0,
                         int timeout_ms = -1) {
  return gsend<WarpScope>(c, s, buf, len, flags, timeout_ms);
}
GS_HD ssize_t grecv_warp(const DeviceContext &c, int s, void *buf, size_t len, int flags = 0, int timeout_ms = -1) {
  return grecv<WarpScope>(c, s, buf, len, flags, timeout_ms);
}
GS_HD gs_status_t gshutdown_warp(const DeviceContext &c, int s, int how) { return gshutdown<WarpScope>(c, s, how); }
GS_HD gs_status_t gclose_warp(const DeviceContext &c, int s) { return gclose<WarpScope>(c, s); }
GS_HD int gpoll_warp(const DeviceContext &c, gpollfd *fds, int nfds, int timeout_ms) {
  return gpoll<WarpScope>(c, fds, nfds, timeout_ms);
}
GS_HD bool gshould_stop_warp(const DeviceContext &c) { return gshould_stop<WarpScope>(c); }
GS_HD gs_status_t gnop_warp(const DeviceContext &c, int s) { return gnop<WarpScope>(c, s); }

}  // namespace gpusock

#endif
