// CUDA RMSNorm (first CUDA kernel; the rest of the CUDA backend follows the same pattern:
// a plain reference twin in kernels/ref and an op-vs-reference test).
#ifndef SPECD_KERNELS_CUDA_RMS_NORM_H_
#define SPECD_KERNELS_CUDA_RMS_NORM_H_

#include <cstdint>

#include "absl/status/status.h"

namespace specd::kernels::cuda {

// Number of CUDA devices this process can use; 0 when there is no driver or device.
int DeviceCount();

// Host-side convenience for tests: copies x [T, D] and w [D] to the device, runs the kernel,
// copies out [T, D] back. Same math as ref::RmsNorm.
absl::Status RmsNormHost(const float* x, int64_t T, int64_t D, const float* w, float eps,
                         float* out);
// The residual add and the norm in one launch: x [T, D] += y, out = RmsNorm(x); x and out are
// copied back.
absl::Status AddRmsNormHost(float* x, const float* y, int64_t T, int64_t D, const float* w,
                            float eps, float* out);

}  // namespace specd::kernels::cuda

#endif  // SPECD_KERNELS_CUDA_RMS_NORM_H_
