// Backends by name: what --device selects.
#ifndef SPECD_ENGINE_BACKEND_FACTORY_H_
#define SPECD_ENGINE_BACKEND_FACTORY_H_

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/backend.h"

namespace specd::engine {

// "cpu" (threads <= 0: every core), "ref" (plain loops), "cuda" or "cuda:N". An unknown name
// is INVALID_ARGUMENT naming --device; "cuda" in a build without the CUDA toolkit is
// UNAVAILABLE, and on a machine without that device FAILED_PRECONDITION.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(std::string_view device, int threads);

// A device's ceilings, measured now (kernels/cuda/ceilings.h): copy traffic and a large bf16
// GEMM's rate. UNAVAILABLE for the CPU or without the CUDA backend.
struct DeviceCeilings {
  double copy_gbs = 0;      // GB/s of device-to-device copy traffic (read + write)
  double bf16_tflops = 0;   // TFLOP/s of an 8192^3 bf16 GEMM (cuBLAS)
};
absl::StatusOr<DeviceCeilings> MeasureDeviceCeilings(std::string_view device);

// Whether this build carries the CUDA backend.
bool CudaBackendBuilt();

}  // namespace specd::engine

#endif  // SPECD_ENGINE_BACKEND_FACTORY_H_
