// The device's ceilings, measured in the same run as a benchmark's figures so they can be
// printed as ratios (never compared across runs): copy bandwidth and a large bf16 GEMM's rate.
#ifndef SPECD_KERNELS_CUDA_CEILINGS_H_
#define SPECD_KERNELS_CUDA_CEILINGS_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace specd::kernels::cuda {

// Device-to-device copy of `bytes`, best of 5: GB/s of memory traffic (read + write).
absl::StatusOr<double> MeasureCopyBandwidth(int64_t bytes = int64_t{1} << 30);
// C = A B on n x n bf16 matrices, f32 accumulation (cuBLAS, default algorithm), best of 5:
// TFLOP/s (2 n^3 per product).
absl::StatusOr<double> MeasureBf16GemmRate(int n = 8192);

}  // namespace specd::kernels::cuda

#endif  // SPECD_KERNELS_CUDA_CEILINGS_H_
