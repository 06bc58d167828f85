#include "kernels/cuda/ceilings.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/device_util.cuh"

namespace specd::kernels::cuda {
namespace {

// Milliseconds of the fastest of `reps` runs of fn, timed with events on the default stream.
template <class Fn>
absl::StatusOr<float> BestMs(int reps, Fn fn) {
  cudaEvent_t a, b;
  if (absl::Status st = CudaCheck(cudaEventCreate(&a), "event"); !st.ok()) return st;
  if (absl::Status st = CudaCheck(cudaEventCreate(&b), "event"); !st.ok()) return st;
  float best = 1e30f;
  absl::Status st;
  for (int r = 0; r <= reps && st.ok(); ++r) {  // run 0 warms up
    st.Update(CudaCheck(cudaEventRecord(a), "record"));
    st.Update(fn());
    st.Update(CudaCheck(cudaEventRecord(b), "record"));
    st.Update(CudaCheck(cudaEventSynchronize(b), "sync"));
    float ms = 0;
    st.Update(CudaCheck(cudaEventElapsedTime(&ms, a, b), "elapsed"));
    if (r > 0) best = std::min(best, ms);
  }
  cudaEventDestroy(a);  // nothing to report: the measurement is done
  cudaEventDestroy(b);
  if (!st.ok()) return st;
  return best;
}

// cuBLAS, opened here rather than linked: only this measurement uses it (the header gives the
// types; the library comes from the machine's CUDA install).
struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  // cublasGemmEx's C signature (the header also declares C++ overloads).
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                    const void*, const void*, cudaDataType, int, const void*, cudaDataType, int,
                                    const void*, void*, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  GemmEx gemm = nullptr;
};

absl::StatusOr<Cublas> OpenCublas() {
  void* lib = nullptr;
  for (const char* name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}) {
    if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
  }
  if (lib == nullptr) return absl::UnavailableError("cuBLAS: no libcublas.so on the library path");
  Cublas c;
  c.create = reinterpret_cast<decltype(c.create)>(dlsym(lib, "cublasCreate_v2"));
  c.destroy = reinterpret_cast<decltype(c.destroy)>(dlsym(lib, "cublasDestroy_v2"));
  c.gemm = reinterpret_cast<decltype(c.gemm)>(dlsym(lib, "cublasGemmEx"));
  if (c.create == nullptr || c.destroy == nullptr || c.gemm == nullptr) {
    return absl::UnavailableError("cuBLAS: cublasCreate_v2 / cublasDestroy_v2 / cublasGemmEx not found");
  }
  return c;  // the library stays open: the process measures once
}

}  // namespace

absl::StatusOr<double> MeasureCopyBandwidth(int64_t bytes) {
  DeviceArray<uint8_t> src, dst;
  absl::Status st = src.Alloc(static_cast<size_t>(bytes));
  st.Update(dst.Alloc(static_cast<size_t>(bytes)));
  st.Update(CudaCheck(cudaMemset(src.get(), 1, static_cast<size_t>(bytes)), "memset"));
  if (!st.ok()) return st;
  absl::StatusOr<float> ms = BestMs(5, [&] {
    return CudaCheck(cudaMemcpyAsync(dst.get(), src.get(), static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice),
                     "copy");
  });
  if (!ms.ok()) return ms.status();
  return 2.0 * static_cast<double>(bytes) / (*ms * 1e-3) / 1e9;
}

absl::StatusOr<double> MeasureBf16GemmRate(int n) {
  const size_t elems = static_cast<size_t>(n) * n;
  DeviceArray<uint16_t> a, b;
  DeviceArray<float> c;
  absl::Status st = a.Alloc(elems);
  st.Update(b.Alloc(elems));
  st.Update(c.Alloc(elems));
  // 0x3C00..: small finite bf16 values; the rate does not depend on them.
  st.Update(CudaCheck(cudaMemset(a.get(), 0x3C, elems * 2), "memset"));
  st.Update(CudaCheck(cudaMemset(b.get(), 0x3C, elems * 2), "memset"));
  if (!st.ok()) return st;
  absl::StatusOr<Cublas> blas = OpenCublas();
  if (!blas.ok()) return blas.status();
  cublasHandle_t h;
  if (blas->create(&h) != CUBLAS_STATUS_SUCCESS) return absl::InternalError("cublasCreate failed");
  const float alpha = 1.0f, beta = 0.0f;
  absl::StatusOr<float> ms = BestMs(5, [&]() -> absl::Status {
    const cublasStatus_t s = blas->gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.get(), CUDA_R_16BF, n,
                                          b.get(), CUDA_R_16BF, n, &beta, c.get(), CUDA_R_32F, n,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) return absl::InternalError("cublasGemmEx failed: " + std::to_string(s));
    return absl::OkStatus();
  });
  blas->destroy(h);  // nothing to report: the measurement is done
  if (!ms.ok()) return ms.status();
  return 2.0 * n * static_cast<double>(n) * n / (*ms * 1e-3) / 1e12;
}

}  // namespace specd::kernels::cuda
