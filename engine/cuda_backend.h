// The model on an NVIDIA GPU: weights, the paged KV pool and the activation workspace in
// device memory, every op a kernels/cuda launch on one stream, each step's attention planned
// on the host once (PlanAttention) and uploaded with the step's indices. Built only with the
// CUDA toolkit (SPECD_HAVE_CUDA); reach it through engine/backend_factory.h.
#ifndef SPECD_ENGINE_CUDA_BACKEND_H_
#define SPECD_ENGINE_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engine/backend.h"

namespace specd::engine {

// device: the CUDA ordinal. FAILED_PRECONDITION naming it when there is no such device.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device);

}  // namespace specd::engine

#endif  // SPECD_ENGINE_CUDA_BACKEND_H_
