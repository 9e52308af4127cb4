/* gpusock's one host/device marker. Code that compiles for the CPU and, under
 * nvcc, for the GPU (the protocol core, the channel ABI, the device API, GPU
 * programs' kernel functors) marks its functions GS_HD: __host__ __device__
 * inline under nvcc, plain inline elsewhere. */
#ifndef GPUSOCK_HD_H
#define GPUSOCK_HD_H

#if defined(__CUDACC__)
#define GS_HD __host__ __device__ inline
#else
#define GS_HD inline
#endif

#endif
