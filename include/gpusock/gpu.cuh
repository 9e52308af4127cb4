// gpusock GPU sockets: the device API (GPUnet's call names), header-only.
//
// Every call is a template on the scope whose threads make it together:
//   gsend(ctx, ...)               BlockScope (default): every thread of the
//                                 block calls with the same arguments; all
//                                 threads move the data
//   gsend<WarpScope>(ctx, ...)    every lane of one warp calls; the warp owns the
//                                 socket, so one block can serve many sockets at
//                                 once (GPUnet's gsend_warp is the same call)
//   gsend<ThreadScope>(ctx, ...)  one thread alone owns the socket
// Every call returns >= 0 or a negated errno. Blocking calls take timeout_ms
// (-1: none) and return -ETIMEDOUT when it passes; MSG_DONTWAIT or a
// SOCK_NONBLOCK socket give -EAGAIN instead of waiting. When the host calls
// Proxy::request_kernel_stop(), blocking calls return -ESHUTDOWN and
// gshould_stop() turns true, so persistent kernels can leave their loop.
//
// One source, two backends. Under nvcc's device pass (__CUDA_ARCH__) the
// primitives map to CUDA intrinsics. Everywhere else (g++, or nvcc's host
// pass) they map to host threads: gpusock::Grid runs a "kernel" functor on
// blocks x threads std::threads, with barriers for __syncthreads/__syncwarp.
// The socket code above the primitives is the same for both; the host backend
// is how CI tests it without a GPU, and a fallback where no GPU exists.
//
// This header includes the parts, bottom to top. Device code, gpusock/gpu/:
//   primitives.cuh      thread rank, barriers, system-scope loads/stores/fences,
//                       atomics, clock, Backoff, poll teams: the only
//                       backend-aware code
//   scope.cuh           BlockScope, WarpScope, ThreadScope, group_copy
//   channel_ops.cuh     the leader's side of the channel: request ring,
//                       control requests, slot claims, status reads
//   socket_control.cuh  socket, bind, listen, connect, accept, shutdown, close
//   socket_data.cuh     recv, send, poll: the data path
//   calls.cuh           the public calls, gsend<S>, ... and the _warp names
//   kernel_helpers.cuh  thread_rank(), sync_block(), pause_ns, ipv4_address, ...
// Host code, gpusock/host/:
//   backend.h           host threads as threadblocks and warps
//   launch.cuh          Backend, Grid, choose_backend, memory_resource_for
//   devices.cuh         GpuSet: several GPUs in one process, one proxy each
// The channel's layout is gpusock/channel.h, the proxy gpusock/proxy.h.
#ifndef GPUSOCK_GPU_CUH
#define GPUSOCK_GPU_CUH

#include <gpusock/channel.h>
#include <gpusock/hd.h>
#include <gpusock/proxy.h>

#include <gpusock/host/backend.h>
#include <gpusock/gpu/primitives.cuh>
#include <gpusock/gpu/scope.cuh>
#include <gpusock/gpu/channel_ops.cuh>
#include <gpusock/gpu/socket_control.cuh>
#include <gpusock/gpu/socket_data.cuh>
#include <gpusock/gpu/calls.cuh>
#include <gpusock/gpu/kernel_helpers.cuh>
#include <gpusock/host/launch.cuh>
#include <gpusock/host/devices.cuh>

#endif
