// gpusock device API: kernel-side helpers that work on both backends
// (threadIdx/__syncthreads are CUDA-only; these are what a kernel written for
// both uses), a sleep, and an IPv4 address built on the device.
#ifndef GPUSOCK_GPU_KERNEL_HELPERS_CUH
#define GPUSOCK_GPU_KERNEL_HELPERS_CUH

#include <gpusock/gpu/primitives.cuh>
#include <gpusock/hd.h>

#include <netinet/in.h>
#include <sched.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>

namespace gpusock {

using prim::block_dim;
using prim::block_index;
using prim::grid_dim;
using prim::lane;
using prim::now_ns;
using prim::sync_block;
using prim::sync_warp;
using prim::thread_rank;
using prim::warp_index;
using prim::warp_size;

// Sleeps about ns nanoseconds (the GPU caps one __nanosleep at ~1 ms).
GS_HD void pause_ns(uint32_t ns) {
#if defined(__CUDA_ARCH__)
  __nanosleep(ns);
#else
  if (ns < 2000) {
    sched_yield();
  } else {
    timespec ts{0, static_cast<long>(ns)};
    nanosleep(&ts, nullptr);
  }
#endif
}

// An IPv4 address for gbind/gconnect, built without htons (not a device function).
GS_HD sockaddr_in ipv4_address(uint8_t a, uint8_t b, uint8_t c, uint8_t d, uint16_t port) {
  sockaddr_in s{};
  s.sin_family = AF_INET;
  uint8_t *p = reinterpret_cast<uint8_t *>(&s.sin_port);
  p[0] = static_cast<uint8_t>(port >> 8);
  p[1] = static_cast<uint8_t>(port);
  uint8_t *q = reinterpret_cast<uint8_t *>(&s.sin_addr.s_addr);
  q[0] = a;
  q[1] = b;
  q[2] = c;
  q[3] = d;
  return s;
}

}  // namespace gpusock

#endif
