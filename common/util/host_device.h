// SPECD_HOST_DEVICE marks one-definition helpers (the bf16 attention rounding, the int8 KV
// and activation quantizers, the sampling row math: fast exp, Philox, penalties, the blockwise
// verifier) callable from CUDA device code too, so the CUDA kernels run the same definition
// as the CPU and the reference instead of a copy of it.
#ifndef SPECD_COMMON_UTIL_HOST_DEVICE_H_
#define SPECD_COMMON_UTIL_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define SPECD_HOST_DEVICE __host__ __device__
#else
#define SPECD_HOST_DEVICE
#endif

#endif  // SPECD_COMMON_UTIL_HOST_DEVICE_H_
