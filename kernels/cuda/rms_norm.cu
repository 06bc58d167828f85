#include "kernels/cuda/rms_norm.h"

#include "kernels/cuda/launch.h"

#include <cuda_runtime.h>

#include <string>

namespace specd::kernels::cuda {
namespace {

// One block per row; threads stride over D, then a shared-memory tree reduction.
// x, out: [T, D]; w: [D]
__global__ void RmsNormKernel(const float* x, int64_t D, const float* w, float eps, float* out) {
  extern __shared__ float partial[];
  const float* row = x + blockIdx.x * D;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) sum += row[i] * row[i];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float scale = rsqrtf(partial[0] / static_cast<float>(D) + eps);
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    out[blockIdx.x * D + i] = row[i] * scale * w[i];
  }
}

absl::Status Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace

absl::Status LaunchRmsNorm(const float* x, int64_t T, int64_t D, const float* w, float eps, float* out,
                           void* stream) {
  if (T == 0) return absl::OkStatus();
  constexpr int kThreads = 256;
  RmsNormKernel<<<static_cast<unsigned>(T), kThreads, kThreads * sizeof(float), static_cast<cudaStream_t>(stream)>>>(
      x, D, w, eps, out);
  return Check(cudaGetLastError(), "RmsNormKernel");
}

int DeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

absl::Status RmsNormHost(const float* x, int64_t T, int64_t D, const float* w, float eps,
                         float* out) {
  float *dx = nullptr, *dw = nullptr, *dout = nullptr;
  const size_t xb = sizeof(float) * T * D, wb = sizeof(float) * D;
  absl::Status st = Check(cudaMalloc(&dx, xb), "cudaMalloc x");
  if (st.ok()) st.Update(Check(cudaMalloc(&dw, wb), "cudaMalloc w"));
  if (st.ok()) st.Update(Check(cudaMalloc(&dout, xb), "cudaMalloc out"));
  if (st.ok()) st.Update(Check(cudaMemcpy(dx, x, xb, cudaMemcpyHostToDevice), "copy x"));
  if (st.ok()) st.Update(Check(cudaMemcpy(dw, w, wb, cudaMemcpyHostToDevice), "copy w"));
  if (st.ok()) st.Update(LaunchRmsNorm(dx, T, D, dw, eps, dout, nullptr));
  if (st.ok()) st.Update(Check(cudaMemcpy(out, dout, xb, cudaMemcpyDeviceToHost), "copy out"));
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dout);
  return st;
}

}  // namespace specd::kernels::cuda
