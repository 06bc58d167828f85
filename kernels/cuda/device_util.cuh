// Device-side helpers shared by the CUDA kernels, and the host wrappers' buffer handling.
// Only .cu files include this header.
#ifndef SPECD_KERNELS_CUDA_DEVICE_UTIL_CUH_
#define SPECD_KERNELS_CUDA_DEVICE_UTIL_CUH_

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace specd::kernels::cuda {

inline absl::Status CudaCheck(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

// A device allocation of n elements, freed when it goes out of scope.
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    if (p_ != nullptr) cudaFree(p_);  // nothing to report from a destructor
  }
  absl::Status Alloc(size_t n) {
    if (p_ != nullptr) cudaFree(p_);  // a second Alloc replaces the first
    p_ = nullptr;
    return CudaCheck(cudaMalloc(&p_, (n > 0 ? n : 1) * sizeof(T)), "cudaMalloc");
  }
  // Allocates n elements and copies them from host memory.
  absl::Status Upload(const T* src, size_t n) {
    if (absl::Status st = Alloc(n); !st.ok()) return st;
    if (n == 0) return absl::OkStatus();
    return CudaCheck(cudaMemcpy(p_, src, n * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  absl::Status Download(T* dst, size_t n) const {
    if (n == 0) return absl::OkStatus();
    return CudaCheck(cudaMemcpy(dst, p_, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
  }
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
};

// After a launch: the launch error, then the kernel's own.
inline absl::Status LaunchStatus(const char* what) {
  if (absl::Status st = CudaCheck(cudaGetLastError(), what); !st.ok()) return st;
  return CudaCheck(cudaDeviceSynchronize(), what);
}

__device__ __forceinline__ float HalfBitsToF32(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t F32ToHalfBits(float x) { return __half_as_ushort(__float2half_rn(x)); }
__device__ __forceinline__ float Bf16BitsToF32(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

inline unsigned BlocksFor(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace specd::kernels::cuda

#endif  // SPECD_KERNELS_CUDA_DEVICE_UTIL_CUH_
