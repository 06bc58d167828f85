#include "engine/backend_factory.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#if SPECD_HAVE_CUDA
#include "engine/cuda_backend.h"
#include "kernels/cuda/ceilings.h"
#endif

namespace specd::engine {

bool CudaBackendBuilt() { return SPECD_HAVE_CUDA != 0; }

absl::StatusOr<DeviceCeilings> MeasureDeviceCeilings(std::string_view device_name) {
  const std::string device(device_name);
  if (device.rfind("cuda", 0) != 0) {
    return absl::UnavailableError(absl::StrCat("--device ", device, ": no device ceilings to measure"));
  }
  // Validates the name and the device, and makes it current.
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(device, 1);
  if (!backend.ok()) return backend.status();
#if SPECD_HAVE_CUDA
  DeviceCeilings c;
  absl::StatusOr<double> copy = kernels::cuda::MeasureCopyBandwidth();
  if (!copy.ok()) return copy.status();
  absl::StatusOr<double> gemm = kernels::cuda::MeasureBf16GemmRate();
  if (!gemm.ok()) return gemm.status();
  c.copy_gbs = *copy;
  c.bf16_tflops = *gemm;
  return c;
#else
  return absl::UnavailableError("no CUDA backend in this build");
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(std::string_view device_name, int threads) {
  const std::string device(device_name);
  if (device == "cpu") return MakeCpuBackend(threads);
  if (device == "ref") return MakeReferenceBackend();
  if (device.rfind("cuda", 0) == 0) {
    int n = 0;
    const std::string ordinal = device.substr(4);
    if (!ordinal.empty() &&
        !(ordinal[0] == ':' && absl::SimpleAtoi(ordinal.substr(1), &n) && n >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--device ", device, ": expected cuda or cuda:N with N a device ordinal"));
    }
#if SPECD_HAVE_CUDA
    return MakeCudaBackend(n);
#else
    return absl::UnavailableError(absl::StrCat("--device ", device,
                                               ": this build has no CUDA backend (nvcc was not "
                                               "found when it was configured)"));
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device ", device, ": unknown device (cpu, ref, cuda, cuda:N)"));
}

}  // namespace specd::engine
