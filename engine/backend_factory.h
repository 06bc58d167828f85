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

// Whether this build carries the CUDA backend.
bool CudaBackendBuilt();

}  // namespace specd::engine

#endif  // SPECD_ENGINE_BACKEND_FACTORY_H_
