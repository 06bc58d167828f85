#include "kernels/cuda/rms_norm.h"

#include "kernels/cuda/launch.h"

#include <cuda_runtime.h>

#include <string>

namespace specd::kernels::cuda {
namespace {

// One block's row: threads stride over D, then a shared-memory tree reduction.
// row, out_row: [D]; w: [D]; partial: [blockDim.x] shared
__device__ void RmsNormRow(const float* row, int64_t D, const float* w, float eps, float* out_row,
                           float* partial) {
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) sum += row[i] * row[i];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float scale = rsqrtf(partial[0] / static_cast<float>(D) + eps);
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) out_row[i] = row[i] * scale * w[i];
}

// One block per row.  x, out: [T, D]; w: [D]
__global__ void RmsNormKernel(const float* x, int64_t D, const float* w, float eps, float* out) {
  extern __shared__ float partial[];
  RmsNormRow(x + blockIdx.x * D, D, w, eps, out + blockIdx.x * D, partial);
}

// x += y, then RmsNorm: each thread adds the elements it then reads (the same stride), so the
// row needs no barrier between the two, and each step is the lone kernels' (AddKernel's
// __fadd_rn, RmsNormRow).  x, y, out: [T, D]; w: [D]
__global__ void AddRmsNormKernel(float* x, const float* y, int64_t D, const float* w, float eps,
                                 float* out) {
  extern __shared__ float partial[];
  float* row = x + blockIdx.x * D;
  const float* add = y + blockIdx.x * D;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) row[i] = __fadd_rn(row[i], add[i]);
  RmsNormRow(row, D, w, eps, out + blockIdx.x * D, partial);
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

absl::Status LaunchAddRmsNorm(float* x, const float* y, int64_t T, int64_t D, const float* w, float eps,
                              float* out, void* stream) {
  if (T == 0) return absl::OkStatus();
  constexpr int kThreads = 256;  // RmsNorm's: the same reduction tree, so the same bits
  AddRmsNormKernel<<<static_cast<unsigned>(T), kThreads, kThreads * sizeof(float),
                     static_cast<cudaStream_t>(stream)>>>(x, y, D, w, eps, out);
  return Check(cudaGetLastError(), "AddRmsNormKernel");
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

absl::Status AddRmsNormHost(float* x, const float* y, int64_t T, int64_t D, const float* w, float eps,
                            float* out) {
  float *dx = nullptr, *dy = nullptr, *dw = nullptr, *dout = nullptr;
  const size_t xb = sizeof(float) * T * D, wb = sizeof(float) * D;
  absl::Status st = Check(cudaMalloc(&dx, xb), "cudaMalloc x");
  if (st.ok()) st.Update(Check(cudaMalloc(&dy, xb), "cudaMalloc y"));
  if (st.ok()) st.Update(Check(cudaMalloc(&dw, wb), "cudaMalloc w"));
  if (st.ok()) st.Update(Check(cudaMalloc(&dout, xb), "cudaMalloc out"));
  if (st.ok()) st.Update(Check(cudaMemcpy(dx, x, xb, cudaMemcpyHostToDevice), "copy x"));
  if (st.ok()) st.Update(Check(cudaMemcpy(dy, y, xb, cudaMemcpyHostToDevice), "copy y"));
  if (st.ok()) st.Update(Check(cudaMemcpy(dw, w, wb, cudaMemcpyHostToDevice), "copy w"));
  if (st.ok()) st.Update(LaunchAddRmsNorm(dx, dy, T, D, dw, eps, dout, nullptr));
  if (st.ok()) st.Update(Check(cudaMemcpy(x, dx, xb, cudaMemcpyDeviceToHost), "copy x back"));
  if (st.ok()) st.Update(Check(cudaMemcpy(out, dout, xb, cudaMemcpyDeviceToHost), "copy out"));
  cudaFree(dx);
  cudaFree(dy);
  cudaFree(dw);
  cudaFree(dout);
  return st;
}

}  // namespace specd::kernels::cuda
