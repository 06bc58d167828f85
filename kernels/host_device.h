// SPECD_HOST_DEVICE marks the kernels' one-definition helpers (the bf16 attention rounding, the
// int8 KV and activation quantizers) callable from CUDA device code too, so the CUDA kernels
// run the same definition as the CPU and the reference instead of a copy of it.
#ifndef SPECD_KERNELS_HOST_DEVICE_H_
#define SPECD_KERNELS_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define SPECD_HOST_DEVICE __host__ __device__
#else
#define SPECD_HOST_DEVICE
#endif

#endif  // SPECD_KERNELS_HOST_DEVICE_H_
