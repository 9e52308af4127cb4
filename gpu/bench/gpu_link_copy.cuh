// The baseline of a GPU-to-GPU link: the same bytes moved by the CUDA runtime
// between two GPUs of this process (cudaMemcpyPeerAsync, with peer access
// where the GPUs allow it), no socket involved. A stream of `bytes` in
// `window` pieces, the window that arrived checked at the end; or `rounds`
// round trips of `size` bytes (a copy there and a copy back, each waited for).
// On the host backend the "GPUs" are host memory and the copies memcpy: only
// the code path.
#pragma once

#include "gpu/bench/gpu_link_kernels.cuh"
#include "test-support/timing.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace gpusock::link {

struct CopyArgs {
  bool stream = true;
  uint64_t bytes = 0, window = 0, seed = 0;
  uint32_t size = 0;
  int64_t rounds = 0;
  int gpu = 0;  // from this GPU to the next one
  bool host_backend = false;
};

// `bytes` in `window` pieces, each handed to move(n) (0 or < 0); returns 0
// or the first failure.
template <class Move>
int move_in_pieces(const CopyArgs &a, const Move &move) {
  for (uint64_t moved = 0; moved < a.bytes;) {
    const uint64_t n = std::min(a.window, a.bytes - moved);
    if (int rc = move(n); rc < 0) return rc;
    moved += n;
  }
  return 0;
}

inline int run_copy_on_host(const CopyArgs &a, LinkResult *out) {
  const size_t len = a.stream ? a.window : a.size;
  std::vector<uint8_t> src(len), dst(len), back(len);
  for (size_t i = 0; i < len; ++i) src[i] = pattern_byte(i, a.seed);
  if (a.stream) {
    const test::Stopwatch watch;
    move_in_pieces(a, [&](uint64_t n) {
      std::memcpy(dst.data(), src.data(), n);
      return 0;
    });
    out->ns = static_cast<int64_t>(watch.seconds() * 1e9);
    out->bytes = static_cast<int64_t>(a.bytes);
    out->bad = std::memcmp(dst.data(), src.data(), std::min<uint64_t>(len, a.bytes)) != 0;
    return 0;
  }
  timed_rounds(a.rounds, out, [&](int64_t) {
    std::memcpy(dst.data(), src.data(), len);
    std::memcpy(back.data(), dst.data(), len);
    return true;
  });
  out->bytes = out->rounds * a.size;
  out->bad = std::memcmp(back.data(), src.data(), len) != 0;
  return 0;
}

#if defined(__CUDACC__)

inline int copy_failed(const char *what, cudaError_t err) {
  std::fprintf(stderr, "gpu_link: %s: %s\n", what, cudaGetErrorString(err));
  return -EIO;
}

// Device buffers of `len` bytes on GPUs a and b, peer access turned on both
// ways where the GPUs allow it.
struct PeerPair {
  int a = 0, b = 1;
  void *on_a = nullptr, *on_b = nullptr;
  bool peer_access = false;
  ~PeerPair() {
    if (on_a) cudaSetDevice(a), cudaFree(on_a);
    if (on_b) cudaSetDevice(b), cudaFree(on_b);
  }
  int open(size_t len) {
    int can_ab = 0, can_ba = 0;
    cudaDeviceCanAccessPeer(&can_ab, a, b);
    cudaDeviceCanAccessPeer(&can_ba, b, a);
    peer_access = can_ab && can_ba;
    for (int side : {a, b}) {
      if (cudaError_t e = cudaSetDevice(side); e != cudaSuccess) return copy_failed("cudaSetDevice", e);
      if (peer_access) {
        const cudaError_t e = cudaDeviceEnablePeerAccess(side == a ? b : a, 0);
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) return copy_failed("peer access", e);
        cudaGetLastError();  // clears "already enabled"
      }
      if (cudaError_t e = cudaMalloc(side == a ? &on_a : &on_b, len); e != cudaSuccess)
        return copy_failed("cudaMalloc", e);
    }
    return 0;
  }
};

inline int run_copy_on_gpus(const CopyArgs &a, LinkResult *out) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < a.gpu + 2) {
    std::fprintf(stderr, "gpu_link: the peer copy needs GPUs %d and %d; %d here\n", a.gpu, a.gpu + 1, count);
    return -ENODEV;
  }
  const size_t len = a.stream ? a.window : a.size;
  PeerPair pair;
  pair.a = a.gpu;
  pair.b = a.gpu + 1;
  if (int rc = pair.open(len); rc < 0) return rc;
  std::vector<uint8_t> pattern(len), seen(len);
  for (size_t i = 0; i < len; ++i) pattern[i] = pattern_byte(i, a.seed);
  cudaSetDevice(pair.a);
  if (cudaError_t e = cudaMemcpy(pair.on_a, pattern.data(), len, cudaMemcpyHostToDevice); e != cudaSuccess)
    return copy_failed("cudaMemcpy", e);
  cudaStream_t stream = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess)
    return copy_failed("cudaStreamCreate", e);
  const auto there = [&](uint64_t n) { return cudaMemcpyPeerAsync(pair.on_b, pair.b, pair.on_a, pair.a, n, stream); };
  const auto back = [&](uint64_t n) { return cudaMemcpyPeerAsync(pair.on_a, pair.a, pair.on_b, pair.b, n, stream); };
  cudaError_t err = there(len);  // warm-up: the first copy sets up the path
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  if (a.stream && err == cudaSuccess) {
    // The copies are queued, then waited for: the time is the whole of both.
    const test::Stopwatch watch;
    const int queued = move_in_pieces(a, [&](uint64_t n) { return there(n) == cudaSuccess ? 0 : -EIO; });
    err = queued < 0 ? cudaErrorUnknown : cudaStreamSynchronize(stream);
    out->ns = static_cast<int64_t>(watch.seconds() * 1e9);
    out->bytes = static_cast<int64_t>(a.bytes);
  } else if (err == cudaSuccess) {
    timed_rounds(a.rounds, out, [&](int64_t) {
      err = there(len);
      if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
      if (err == cudaSuccess) err = back(len);
      if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
      return err == cudaSuccess;
    });
    out->bytes = out->rounds * a.size;
  }
  cudaStreamDestroy(stream);
  if (err != cudaSuccess) return copy_failed("cudaMemcpyPeerAsync", err);
  cudaSetDevice(a.stream ? pair.b : pair.a);
  err = cudaMemcpy(seen.data(), a.stream ? pair.on_b : pair.on_a, len, cudaMemcpyDeviceToHost);
  if (err != cudaSuccess) return copy_failed("cudaMemcpy", err);
  out->bad = std::memcmp(seen.data(), pattern.data(), len) != 0;
  std::fprintf(stderr, "gpu_link: peer copy GPU %d -> %d, peer access %s\n", pair.a, pair.b,
               pair.peer_access ? "on" : "not possible (through host memory)");
  return 0;
}

#endif

// The peer copy on GPUs when this binary has CUDA and --host-backend was not
// given, else on host memory.
inline int run_copy(const CopyArgs &a, LinkResult *out) {
  *out = LinkResult{};
#if defined(__CUDACC__)
  if (!a.host_backend) return run_copy_on_gpus(a, out);
#endif
  return run_copy_on_host(a, out);
}

}  // namespace gpusock::link
