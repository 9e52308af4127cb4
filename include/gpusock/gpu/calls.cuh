// gpusock device API: the public calls (GPUnet's names), each in two
// cooperative forms:
//   gsend(ctx, ...)       threadblock: every thread of the block calls with the
//                         same arguments; all threads move the data and all get
//                         the result
//   gsend_warp(ctx, ...)  warp: every lane of one warp calls; the warp owns the
//                         socket, so one block can serve many sockets at once
// Every call returns >= 0 or a negated errno; gpusock/gpu.cuh says more.
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

// ---------------------------------------------------------------- block calls
// Every thread of the block calls with the same arguments; all get the result.

GS_HD int gsocket(const DeviceContext &c, int domain, int type, int protocol = 0) {
  (void)protocol;
  return detail::socket<BlockScope>(c, domain, type);
}
GS_HD int gbind(const DeviceContext &c, int s, const sockaddr *addr, socklen_t len) {
  return detail::bind<BlockScope>(c, s, addr, len);
}
GS_HD int glisten(const DeviceContext &c, int s, int backlog) { return detail::listen<BlockScope>(c, s, backlog); }
// flags: SOCK_NONBLOCK for the new socket. The listener's own mode decides
// whether gaccept waits.
GS_HD int gaccept(const DeviceContext &c, int s, int flags = 0, int timeout_ms = -1) {
  return detail::accept<BlockScope>(c, s, flags, timeout_ms);
}
GS_HD int gconnect(const DeviceContext &c, int s, const sockaddr *addr, socklen_t len, int timeout_ms = -1) {
  return detail::connect<BlockScope>(c, s, addr, len, timeout_ms);
}
// Blocking: returns once all len bytes are in the send ring. MSG_DONTWAIT:
// what fits now, or -EAGAIN.
GS_HD ssize_t gsend(const DeviceContext &c, int s, const void *buf, size_t len, int flags = 0,
                     int timeout_ms = -1) {
  return detail::send<BlockScope>(c, s, buf, len, flags, timeout_ms);
}
// What is available (at least 1 byte), 0 at EOF; MSG_WAITALL: all len bytes.
GS_HD ssize_t grecv(const DeviceContext &c, int s, void *buf, size_t len, int flags = 0, int timeout_ms = -1) {
  return detail::recv<BlockScope>(c, s, buf, len, flags, timeout_ms);
}
GS_HD int gshutdown(const DeviceContext &c, int s, int how) { return detail::shutdown<BlockScope>(c, s, how); }
GS_HD int gclose(const DeviceContext &c, int s) { return detail::close<BlockScope>(c, s); }
// Threads of the block share the fds; returns how many have revents, 0 on timeout.
GS_HD int gpoll(const DeviceContext &c, gpollfd *fds, int nfds, int timeout_ms) {
  return detail::poll<BlockScope>(c, fds, nfds, timeout_ms);
}
GS_HD bool gshould_stop(const DeviceContext &c) { return detail::should_stop<BlockScope>(c); }
GS_HD int gnop(const DeviceContext &c, int s) { return detail::nop<BlockScope>(c, s); }

// ---------------------------------------------------------------- warp calls
// Every lane of one warp calls with the same arguments.

GS_HD int gsocket_warp(const DeviceContext &c, int domain, int type, int protocol = 0) {
  (void)protocol;
  return detail::socket<WarpScope>(c, domain, type);
}
GS_HD int gbind_warp(const DeviceContext &c, int s, const sockaddr *addr, socklen_t len) {
  return detail::bind<WarpScope>(c, s, addr, len);
}
GS_HD int glisten_warp(const DeviceContext &c, int s, int backlog) { return detail::listen<WarpScope>(c, s, backlog); }
GS_HD int gaccept_warp(const DeviceContext &c, int s, int flags = 0, int timeout_ms = -1) {
  return detail::accept<WarpScope>(c, s, flags, timeout_ms);
}
GS_HD int gconnect_warp(const DeviceContext &c, int s, const sockaddr *addr, socklen_t len, int timeout_ms = -1) {
  return detail::connect<WarpScope>(c, s, addr, len, timeout_ms);
}
GS_HD ssize_t gsend_warp(const DeviceContext &c, int s, const void *buf, size_t len, int flags = 0,
                          int timeout_ms = -1) {
  return detail::send<WarpScope>(c, s, buf, len, flags, timeout_ms);
}
GS_HD ssize_t grecv_warp(const DeviceContext &c, int s, void *buf, size_t len, int flags = 0,
                          int timeout_ms = -1) {
  return detail::recv<WarpScope>(c, s, buf, len, flags, timeout_ms);
}
GS_HD int gshutdown_warp(const DeviceContext &c, int s, int how) { return detail::shutdown<WarpScope>(c, s, how); }
GS_HD int gclose_warp(const DeviceContext &c, int s) { return detail::close<WarpScope>(c, s); }
GS_HD int gpoll_warp(const DeviceContext &c, gpollfd *fds, int nfds, int timeout_ms) {
  return detail::poll<WarpScope>(c, fds, nfds, timeout_ms);
}
GS_HD bool gshould_stop_warp(const DeviceContext &c) { return detail::should_stop<WarpScope>(c); }
GS_HD int gnop_warp(const DeviceContext &c, int s) { return detail::nop<WarpScope>(c, s); }

}  // namespace gpusock

#endif
