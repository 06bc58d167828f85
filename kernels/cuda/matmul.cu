// CUDA twin of ref::MatMul with the reference's exact arithmetic, so its output is bitwise the
// reference's (tests/kernels/cuda_ops_test.cc): float weights (F32, F16, BF16) as one sum over
// k in order; quantized weights (Q8_0, Q4_0, Q4_1) on int8 activation blocks (act_quant.h's
// QuantizeActRow itself, one thread per block), each block an exact integer dot, then
// acc += (scale * d_act) * isum [+ min * s_act], blocks in order. One thread per (row, token):
// a row's result never depends on T or on the other rows (batch invariant). This is the
// correctness twin the fast kernels (a warp per row, cuBLAS for prefill) will be held against.
#include <cmath>

#include "kernels/act_quant.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/ops.h"

namespace specd::kernels::cuda {
namespace {

using gguf::GgmlType;

__device__ __forceinline__ uint16_t Ld16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// x: [T, K] -> act: [T, K / 32]; one thread per block of 32, through QuantizeActRow itself.
__global__ void QuantizeActKernel(const float* x, int64_t blocks, ActBlockQ8* act) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b < blocks) QuantizeActRow(x + b * kActBlockSize, kActBlockSize, act + b);
}

// y[t, n] for float weights: one thread per (token, row).
__global__ void MatMulFloatKernel(GgmlType type, const uint8_t* w, uint64_t row_bytes, int64_t rows, int64_t K,
                                  const float* x, int64_t T, float* y) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= T * rows) return;
  const uint8_t* row = w + static_cast<uint64_t>(idx % rows) * row_bytes;  // y[t, n]: n = idx % rows
  const float* xt = x + idx / rows * K;
  float acc = 0.0f;
  for (int64_t k = 0; k < K; ++k) {
    float wk;
    if (type == GgmlType::kF32) {
      wk = reinterpret_cast<const float*>(row)[k];
    } else if (type == GgmlType::kF16) {
      wk = HalfBitsToF32(Ld16(row + 2 * k));
    } else {
      wk = Bf16BitsToF32(Ld16(row + 2 * k));
    }
    acc = __fadd_rn(acc, __fmul_rn(wk, xt[k]));
  }
  y[idx] = acc;
}

// y[t, n] for Q8_0 / Q4_0 / Q4_1 weights on quantized activations: one thread per (token, row).
__global__ void MatMulQuantKernel(GgmlType type, const uint8_t* w, uint64_t row_bytes, int64_t rows, int64_t nb,
                                  const ActBlockQ8* act, int64_t T, float* y) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= T * rows) return;
  const uint8_t* row = w + static_cast<uint64_t>(idx % rows) * row_bytes;  // y[t, n]: t = idx / rows
  const ActBlockQ8* at = act + idx / rows * nb;
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const ActBlockQ8& a = at[b];
    int32_t isum = 0;
    float scale, min = 0.0f;
    if (type == GgmlType::kQ8_0) {
      const uint8_t* blk = row + b * 34;
      scale = HalfBitsToF32(Ld16(blk));
      for (int i = 0; i < 32; ++i) isum += static_cast<int8_t>(blk[2 + i]) * a.qs[i];
    } else if (type == GgmlType::kQ4_0) {
      const uint8_t* blk = row + b * 18;
      scale = HalfBitsToF32(Ld16(blk));
      for (int i = 0; i < 16; ++i) {
        isum += ((blk[2 + i] & 0x0F) - 8) * a.qs[i];
        isum += ((blk[2 + i] >> 4) - 8) * a.qs[i + 16];
      }
    } else {  // Q4_1
      const uint8_t* blk = row + b * 20;
      scale = HalfBitsToF32(Ld16(blk));
      min = HalfBitsToF32(Ld16(blk + 2));
      for (int i = 0; i < 16; ++i) {
        isum += (blk[4 + i] & 0x0F) * a.qs[i];
        isum += (blk[4 + i] >> 4) * a.qs[i + 16];
      }
    }
    acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(scale, a.d), static_cast<float>(isum)));
    if (min != 0.0f) acc = __fadd_rn(acc, __fmul_rn(min, a.s));
  }
  y[idx] = acc;
}

constexpr int kThreads = 256;

}  // namespace

int64_t MatMulScratchBytes(int64_t T, int64_t cols) {
  return T * (cols / kActBlockSize) * static_cast<int64_t>(sizeof(ActBlockQ8));
}

absl::Status LaunchMatMul(const WeightMatrix& w, const float* x, int64_t T, float* y, void* scratch, void* stream) {
  const bool is_float = w.type == GgmlType::kF32 || w.type == GgmlType::kF16 || w.type == GgmlType::kBF16;
  const bool is_quant = w.type == GgmlType::kQ8_0 || w.type == GgmlType::kQ4_0 || w.type == GgmlType::kQ4_1;
  if (!is_float && !is_quant) return absl::UnimplementedError("MatMul: weight type not supported on CUDA yet");
  if (is_quant && w.cols % kActBlockSize != 0) {
    return absl::InvalidArgumentError("MatMul: cols must be a multiple of 32 for quantized weights");
  }
  const int64_t outputs = T * w.rows;
  if (outputs == 0) return absl::OkStatus();
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (is_float) {
    MatMulFloatKernel<<<BlocksFor(outputs, kThreads), kThreads, 0, s>>>(w.type, w.data, w.row_bytes, w.rows, w.cols,
                                                                        x, T, y);
    return CudaCheck(cudaGetLastError(), "MatMulFloatKernel");
  }
  const int64_t nb = w.cols / kActBlockSize;
  auto* act = static_cast<ActBlockQ8*>(scratch);
  QuantizeActKernel<<<BlocksFor(T * nb, kThreads), kThreads, 0, s>>>(x, T * nb, act);
  if (absl::Status e = CudaCheck(cudaGetLastError(), "QuantizeActKernel"); !e.ok()) return e;
  MatMulQuantKernel<<<BlocksFor(outputs, kThreads), kThreads, 0, s>>>(w.type, w.data, w.row_bytes, w.rows, nb, act,
                                                                      T, y);
  return CudaCheck(cudaGetLastError(), "MatMulQuantKernel");
}

absl::Status MatMulHost(const WeightMatrix& w, const float* x, int64_t T, float* y) {
  const int64_t K = w.cols;
  DeviceArray<uint8_t> dw, dact;
  DeviceArray<float> dx, dy;
  absl::Status st = dw.Upload(w.data, static_cast<size_t>(w.rows) * w.row_bytes);
  if (st.ok()) st.Update(dx.Upload(x, static_cast<size_t>(T * K)));
  if (st.ok()) st.Update(dy.Alloc(static_cast<size_t>(T * w.rows)));
  if (st.ok()) st.Update(dact.Alloc(static_cast<size_t>(MatMulScratchBytes(T, K))));
  if (!st.ok()) return st;
  WeightMatrix on_device = w;
  on_device.data = dw.get();
  st.Update(LaunchMatMul(on_device, dx.get(), T, dy.get(), dact.get(), nullptr));
  if (st.ok()) st.Update(LaunchStatus("MatMul"));
  if (!st.ok()) return st;
  return dy.Download(y, static_cast<size_t>(T * w.rows));
}

}  // namespace specd::kernels::cuda
