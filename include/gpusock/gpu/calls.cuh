// gpusock device API: the public calls (GPUnet's names), each in two
// cooperative forms made from one declaration:
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

// Status-only calls return gs_status_t; calls that return a descriptor or a
// count in the same word keep POSIX's int / ssize_t (docs/architecture.md).
// Defines `name`, the block form (detail::op<BlockScope>), and `name_warp`,
// the warp form (detail::op<WarpScope>), both taking `params` (default
// arguments included) and passing `args` on.
#define GPUSOCK_BLOCK_AND_WARP_CALL(ret, name, op, params, args) \
  GS_HD ret name params { return detail::op<BlockScope> args; }  \
  GS_HD ret name##_warp params { return detail::op<WarpScope> args; }

// protocol: ignored.
GPUSOCK_BLOCK_AND_WARP_CALL(int, gsocket, socket, (const DeviceContext &c, int domain, int type, int /*protocol*/ = 0),
                            (c, domain, type))
GPUSOCK_BLOCK_AND_WARP_CALL(gs_status_t, gbind, bind,
                            (const DeviceContext &c, int s, const sockaddr *addr, socklen_t len), (c, s, addr, len))
GPUSOCK_BLOCK_AND_WARP_CALL(gs_status_t, glisten, listen, (const DeviceContext &c, int s, int backlog), (c, s, backlog))
// flags: SOCK_NONBLOCK for the new socket. The listener's own mode decides
// whether gaccept waits.
GPUSOCK_BLOCK_AND_WARP_CALL(int, gaccept, accept, (const DeviceContext &c, int s, int flags = 0, int timeout_ms = -1),
                            (c, s, flags, timeout_ms))
GPUSOCK_BLOCK_AND_WARP_CALL(gs_status_t, gconnect, connect,
                            (const DeviceContext &c, int s, const sockaddr *addr, socklen_t len, int timeout_ms = -1),
                            (c, s, addr, len, timeout_ms))
// Blocking: returns once all len bytes are in the send ring. MSG_DONTWAIT:
// what fits now, or -EAGAIN.
GPUSOCK_BLOCK_AND_WARP_CALL(ssize_t, gsend, send,
                            (const DeviceContext &c, int s, const void *buf, size_t len, int flags = 0,
                             int timeout_ms = -1),
                            (c, s, buf, len, flags, timeout_ms))
// What is available (at least 1 byte), 0 at EOF; MSG_WAITALL: all len bytes.
GPUSOCK_BLOCK_AND_WARP_CALL(ssize_t, grecv, recv,
                            (const DeviceContext &c, int s, void *buf, size_t len, int flags = 0, int timeout_ms = -1),
                            (c, s, buf, len, flags, timeout_ms))
GPUSOCK_BLOCK_AND_WARP_CALL(gs_status_t, gshutdown, shutdown, (const DeviceContext &c, int s, int how), (c, s, how))
GPUSOCK_BLOCK_AND_WARP_CALL(gs_status_t, gclose, close, (const DeviceContext &c, int s), (c, s))
// Threads of the scope share the fds; returns how many have revents, 0 on timeout.
GPUSOCK_BLOCK_AND_WARP_CALL(int, gpoll, poll, (const DeviceContext &c, gpollfd *fds, int nfds, int timeout_ms),
                            (c, fds, nfds, timeout_ms))
// True once the host called Proxy::request_kernel_stop().
GPUSOCK_BLOCK_AND_WARP_CALL(bool, gshould_stop, should_stop, (const DeviceContext &c), (c))
// A request the proxy answers at once: one doorbell round trip.
GPUSOCK_BLOCK_AND_WARP_CALL(gs_status_t, gnop, nop, (const DeviceContext &c, int s), (c, s))

#undef GPUSOCK_BLOCK_AND_WARP_CALL

}  // namespace gpusock

#endif
