// CUDA twin of ref::MatMul with the reference's exact arithmetic, so its output is bitwise the
// reference's (tests/kernels/cuda_ops_test.cc): float weights (F32, F16, BF16) as one sum over
// k in order; quantized weights (Q8_0, Q4_0, Q4_1) on int8 activation blocks (act_quant.h's
// QuantizeActRow itself, one thread per block), each block an exact integer dot, then
// acc += (scale * d_act) * isum [+ min * s_act], blocks in order. One thread per (row, token):
// a row's result never depends on T or on the other rows (batch invariant). This is the
// correctness twin the fast kernels (below: a warp per row; cuBLAS for prefill, not yet) are
// held against.
#include <cmath>
#include <vector>

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

// ---- The fast kernels: one warp per weight row, the row read once for up to kWarpTokens
// tokens (decode and verification rows: the memory-bound regime). Lane l sums the row's blocks
// (elements, for float weights) l, l + 32, ... in order, each block with the reference's own
// steps; then lanes 16, 8, 4, 2, 1 apart are added, and lane 0's sum is the result. That order
// depends only on the row's length, never on T or on the other rows: batch invariant, so a
// verification row and a decode row of the same token give the same bits. Not bitwise the
// reference (which sums the blocks in one chain): held to it within a tolerance.
constexpr int kWarpRows = 4;     // warps (rows) per thread block
constexpr int kWarpTokens = 8;   // tokens per pass over a row

__device__ __forceinline__ int32_t Pack4(uint32_t b0, uint32_t b1, uint32_t b2, uint32_t b3) {
  return static_cast<int32_t>((b0 & 0xFF) | ((b1 & 0xFF) << 8) | ((b2 & 0xFF) << 16) | ((b3 & 0xFF) << 24));
}

// Weight block b of a quantized row as 8 words of four int8 codes (elements 4i .. 4i + 3, the
// codes the reference multiplies), its scale and min (Q4_1; else 0).
__device__ __forceinline__ void DecodeQuantBlock(GgmlType type, const uint8_t* row, int64_t b, int32_t (&wq)[8],
                                                 float* scale, float* min) {
  *min = 0.0f;
  if (type == GgmlType::kQ8_0) {
    const uint8_t* blk = row + b * 34;
    *scale = HalfBitsToF32(Ld16(blk));
#pragma unroll
    for (int i = 0; i < 8; ++i) wq[i] = Pack4(blk[2 + 4 * i], blk[3 + 4 * i], blk[4 + 4 * i], blk[5 + 4 * i]);
  } else if (type == GgmlType::kQ4_0) {
    const uint8_t* blk = row + b * 18;
    *scale = HalfBitsToF32(Ld16(blk));
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // elements 4i..4i+3: low nibbles; 16 + 4i..: high nibbles
      const uint8_t* q = blk + 2 + 4 * i;
      wq[i] = Pack4((q[0] & 0x0F) - 8, (q[1] & 0x0F) - 8, (q[2] & 0x0F) - 8, (q[3] & 0x0F) - 8);
      wq[i + 4] = Pack4((q[0] >> 4) - 8, (q[1] >> 4) - 8, (q[2] >> 4) - 8, (q[3] >> 4) - 8);
    }
  } else if ((reinterpret_cast<uintptr_t>(row) & 3) == 0) {  // Q4_1, the row 4-byte aligned
    // The 20-byte block as five words (not 20 byte loads): the same codes, masked per byte.
    const uint32_t* blk = reinterpret_cast<const uint32_t*>(row + b * 20);
    const uint32_t head = blk[0];
    *scale = HalfBitsToF32(static_cast<uint16_t>(head & 0xFFFF));
    *min = HalfBitsToF32(static_cast<uint16_t>(head >> 16));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t q = blk[1 + i];
      wq[i] = static_cast<int32_t>(q & 0x0F0F0F0Fu);
      wq[i + 4] = static_cast<int32_t>((q >> 4) & 0x0F0F0F0Fu);
    }
  } else {  // Q4_1
    const uint8_t* blk = row + b * 20;
    *scale = HalfBitsToF32(Ld16(blk));
    *min = HalfBitsToF32(Ld16(blk + 2));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint8_t* q = blk + 4 + 4 * i;
      wq[i] = Pack4(q[0] & 0x0F, q[1] & 0x0F, q[2] & 0x0F, q[3] & 0x0F);
      wq[i + 4] = Pack4(q[0] >> 4, q[1] >> 4, q[2] >> 4, q[3] >> 4);
    }
  }
}

// Lane 0 gets the warp's sum: xor partners 16, 8, 4, 2, 1, a fixed order.
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Row n of a quantized weight (rows x nb blocks) for T tokens, by one warp: what every quantized
// warp kernel runs per row, so a row's bits do not depend on which launch it was part of.
__device__ __forceinline__ void QuantRowWarp(GgmlType type, const uint8_t* w, uint64_t row_bytes, int64_t rows,
                                             int64_t n, int64_t nb, const ActBlockQ8* act, int64_t T, float* y,
                                             int lane) {
  const uint8_t* row = w + static_cast<uint64_t>(n) * row_bytes;
  for (int64_t t0 = 0; t0 < T; t0 += kWarpTokens) {
    const int nt = T - t0 < kWarpTokens ? static_cast<int>(T - t0) : kWarpTokens;
    float acc[kWarpTokens];
#pragma unroll
    for (int t = 0; t < kWarpTokens; ++t) acc[t] = 0.0f;
    for (int64_t b = lane; b < nb; b += 32) {
      int32_t wq[8];
      float scale, min;
      DecodeQuantBlock(type, row, b, wq, &scale, &min);
#pragma unroll
      for (int t = 0; t < kWarpTokens; ++t) {
        if (t < nt) {
          const ActBlockQ8& a = act[(t0 + t) * nb + b];
          const int32_t* aq = reinterpret_cast<const int32_t*>(a.qs);
          int32_t isum = 0;
#pragma unroll
          for (int i = 0; i < 8; ++i) isum = __dp4a(wq[i], aq[i], isum);
          acc[t] = __fadd_rn(acc[t], __fmul_rn(__fmul_rn(scale, a.d), static_cast<float>(isum)));
          if (min != 0.0f) acc[t] = __fadd_rn(acc[t], __fmul_rn(min, a.s));
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kWarpTokens; ++t) {
      const float v = WarpSum(acc[t]);
      if (lane == 0 && t < nt) y[(t0 + t) * rows + n] = v;
    }
  }
}

__global__ void __launch_bounds__(kWarpRows * 32) MatMulQuantWarpKernel(GgmlType type, const uint8_t* w,
                                                                        uint64_t row_bytes, int64_t rows, int64_t nb,
                                                                        const ActBlockQ8* act, int64_t T, float* y) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpRows + (threadIdx.x >> 5);
  if (n >= rows) return;  // the whole warp: n is per warp
  QuantRowWarp(type, w, row_bytes, rows, n, nb, act, T, y, threadIdx.x & 31);
}

// Several quantized weights of one input (q, k, v; gate, up) in one launch: matrix i owns the
// thread blocks [first_block[i], first_block[i + 1]), a whole number of blocks per matrix, and
// each of its rows runs QuantRowWarp as MatMulQuantWarpKernel would: the same bits, one launch
// instead of n.
struct SharedMatMuls {
  static constexpr int kMax = 4;
  int n = 0;
  const uint8_t* w[kMax];
  uint64_t row_bytes[kMax];
  int64_t rows[kMax];
  float* y[kMax];
  int64_t first_block[kMax + 1];
};

// This thread block's rows of the matrices in m: matrix i owns blocks [first_block[i], ...).
__device__ __forceinline__ void SharedMatMulsRows(GgmlType type, const SharedMatMuls& m, int64_t nb,
                                                  const ActBlockQ8* act, int64_t T) {
  const int64_t block = blockIdx.x;
  int i = 0;
  while (i + 1 < m.n && block >= m.first_block[i + 1]) ++i;
  const int64_t n = (block - m.first_block[i]) * kWarpRows + (threadIdx.x >> 5);
  if (n >= m.rows[i]) return;  // the whole warp
  QuantRowWarp(type, m.w[i], m.row_bytes[i], m.rows[i], n, nb, act, T, m.y[i], threadIdx.x & 31);
}

__global__ void __launch_bounds__(kWarpRows * 32) MatMulQuantWarpSharedKernel(GgmlType type, SharedMatMuls m,
                                                                              int64_t nb, const ActBlockQ8* act,
                                                                              int64_t T) {
  SharedMatMulsRows(type, m, nb, act, T);
}

// ---- Activations quantized by each thread block itself (decode and verification steps):
// every block turns x's T x nb activation blocks into shared memory with QuantizeActRow, as
// QuantizeActKernel would into global memory, then runs the same warp code on them. The same
// bits, and one launch per product instead of two (the H200 step is launch-bound). Used when
// the blocks fit kFusedActBytes of shared memory.
constexpr int64_t kFusedActBytes = 32 * 1024;

extern __shared__ __align__(16) unsigned char fused_act_smem[];

__device__ __forceinline__ const ActBlockQ8* QuantizeActIntoShared(const float* x, int64_t blocks) {
  ActBlockQ8* act = reinterpret_cast<ActBlockQ8*>(fused_act_smem);
  for (int64_t b = threadIdx.x; b < blocks; b += blockDim.x) {
    QuantizeActRow(x + b * kActBlockSize, kActBlockSize, act + b);
  }
  __syncthreads();  // before any warp returns: every thread takes part above
  return act;
}

__global__ void __launch_bounds__(kWarpRows * 32) MatMulQuantWarpFusedKernel(GgmlType type, const uint8_t* w,
                                                                             uint64_t row_bytes, int64_t rows,
                                                                             int64_t nb, const float* x, int64_t T,
                                                                             float* y) {
  const ActBlockQ8* act = QuantizeActIntoShared(x, T * nb);
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpRows + (threadIdx.x >> 5);
  if (n >= rows) return;
  QuantRowWarp(type, w, row_bytes, rows, n, nb, act, T, y, threadIdx.x & 31);
}

__global__ void __launch_bounds__(kWarpRows * 32) MatMulQuantWarpSharedFusedKernel(GgmlType type, SharedMatMuls m,
                                                                                   int64_t nb, const float* x,
                                                                                   int64_t T) {
  SharedMatMulsRows(type, m, nb, QuantizeActIntoShared(x, T * nb), T);
}

bool FusesActQuant(int64_t T, int64_t nb) {
  return T * nb * static_cast<int64_t>(sizeof(ActBlockQ8)) <= kFusedActBytes;
}

__global__ void __launch_bounds__(kWarpRows * 32) MatMulFloatWarpKernel(GgmlType type, const uint8_t* w,
                                                                        uint64_t row_bytes, int64_t rows, int64_t K,
                                                                        const float* x, int64_t T, float* y) {
  const int lane = threadIdx.x & 31;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpRows + (threadIdx.x >> 5);
  if (n >= rows) return;
  const uint8_t* row = w + static_cast<uint64_t>(n) * row_bytes;
  for (int64_t t0 = 0; t0 < T; t0 += kWarpTokens) {
    const int nt = T - t0 < kWarpTokens ? static_cast<int>(T - t0) : kWarpTokens;
    float acc[kWarpTokens];
#pragma unroll
    for (int t = 0; t < kWarpTokens; ++t) acc[t] = 0.0f;
    for (int64_t k = lane; k < K; k += 32) {
      float wk;
      if (type == GgmlType::kF32) {
        wk = reinterpret_cast<const float*>(row)[k];
      } else if (type == GgmlType::kF16) {
        wk = HalfBitsToF32(Ld16(row + 2 * k));
      } else {
        wk = Bf16BitsToF32(Ld16(row + 2 * k));
      }
#pragma unroll
      for (int t = 0; t < kWarpTokens; ++t) {
        if (t < nt) acc[t] = __fadd_rn(acc[t], __fmul_rn(wk, x[(t0 + t) * K + k]));
      }
    }
#pragma unroll
    for (int t = 0; t < kWarpTokens; ++t) {
      const float v = WarpSum(acc[t]);
      if (lane == 0 && t < nt) y[(t0 + t) * rows + n] = v;
    }
  }
}

}  // namespace

int64_t MatMulScratchBytes(int64_t T, int64_t cols) {
  return T * (cols / kActBlockSize) * static_cast<int64_t>(sizeof(ActBlockQ8));
}

bool IsQuantizedType(GgmlType t) { return t == GgmlType::kQ8_0 || t == GgmlType::kQ4_0 || t == GgmlType::kQ4_1; }
bool IsFloatType(GgmlType t) { return t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16; }

absl::Status LaunchQuantizeAct(const float* x, int64_t T, int64_t cols, void* scratch, void* stream) {
  if (cols % kActBlockSize != 0) {
    return absl::InvalidArgumentError("MatMul: cols must be a multiple of 32 for quantized weights");
  }
  const int64_t blocks = T * (cols / kActBlockSize);
  if (blocks == 0) return absl::OkStatus();
  QuantizeActKernel<<<BlocksFor(blocks, kThreads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, blocks, static_cast<ActBlockQ8*>(scratch));
  return CudaCheck(cudaGetLastError(), "QuantizeActKernel");
}

absl::Status LaunchMatMulOnBlocks(const WeightMatrix& w, const void* act_blocks, int64_t T, float* y, void* stream,
                                  CudaMatMulKernel kernel) {
  if (!IsQuantizedType(w.type)) return absl::InvalidArgumentError("MatMul on activation blocks: not a quantized weight");
  if (w.cols % kActBlockSize != 0) {
    return absl::InvalidArgumentError("MatMul: cols must be a multiple of 32 for quantized weights");
  }
  if (T * w.rows == 0) return absl::OkStatus();
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t nb = w.cols / kActBlockSize;
  const auto* act = static_cast<const ActBlockQ8*>(act_blocks);
  if (kernel == CudaMatMulKernel::kWarpPerRow) {
    MatMulQuantWarpKernel<<<BlocksFor(w.rows, kWarpRows), kWarpRows * 32, 0, s>>>(w.type, w.data, w.row_bytes, w.rows,
                                                                                nb, act, T, y);
  } else {
    MatMulQuantKernel<<<BlocksFor(T * w.rows, kThreads), kThreads, 0, s>>>(w.type, w.data, w.row_bytes, w.rows, nb,
                                                                           act, T, y);
  }
  return CudaCheck(cudaGetLastError(), "MatMulQuantKernel");
}

namespace {

// The one-launch plan of n quantized weights of one type and width (the warp kernel); false
// when they cannot share a launch.
bool PlanSharedMatMuls(const WeightMatrix* ws, int n, float* const* ys, CudaMatMulKernel kernel, SharedMatMuls* m) {
  bool one_launch = kernel == CudaMatMulKernel::kWarpPerRow && n >= 1 && n <= SharedMatMuls::kMax;
  for (int i = 0; i < n && one_launch; ++i) {
    one_launch = IsQuantizedType(ws[i].type) && ws[i].type == ws[0].type && ws[i].cols == ws[0].cols;
  }
  if (!one_launch || ws[0].cols % kActBlockSize != 0) return false;
  m->n = n;
  m->first_block[0] = 0;
  for (int i = 0; i < n; ++i) {
    m->w[i] = ws[i].data;
    m->row_bytes[i] = ws[i].row_bytes;
    m->rows[i] = ws[i].rows;
    m->y[i] = ys[i];
    m->first_block[i + 1] = m->first_block[i] + (ws[i].rows + kWarpRows - 1) / kWarpRows;
  }
  return true;
}

}  // namespace

absl::Status LaunchMatMulsOnBlocks(const WeightMatrix* ws, int n, const void* act_blocks, int64_t T,
                                   float* const* ys, void* stream, CudaMatMulKernel kernel) {
  SharedMatMuls m;
  if (!PlanSharedMatMuls(ws, n, ys, kernel, &m)) {
    for (int i = 0; i < n; ++i) {
      if (absl::Status st = LaunchMatMulOnBlocks(ws[i], act_blocks, T, ys[i], stream, kernel); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
  if (T == 0 || m.first_block[n] == 0) return absl::OkStatus();
  MatMulQuantWarpSharedKernel<<<static_cast<unsigned>(m.first_block[n]), kWarpRows * 32, 0,
                                static_cast<cudaStream_t>(stream)>>>(ws[0].type, m, ws[0].cols / kActBlockSize,
                                                                     static_cast<const ActBlockQ8*>(act_blocks), T);
  return CudaCheck(cudaGetLastError(), "MatMulQuantWarpSharedKernel");
}

absl::Status LaunchMatMuls(const WeightMatrix* ws, int n, const float* x, int64_t T, float* const* ys, void* scratch,
                           void* stream, CudaMatMulKernel kernel, ActQuant act) {
  SharedMatMuls m;
  const bool planned = PlanSharedMatMuls(ws, n, ys, kernel, &m);
  const int64_t nb = ws[0].cols / kActBlockSize;
  if (planned && act == ActQuant::kAuto && FusesActQuant(T, nb)) {
    if (T == 0 || m.first_block[n] == 0) return absl::OkStatus();
    MatMulQuantWarpSharedFusedKernel<<<static_cast<unsigned>(m.first_block[n]), kWarpRows * 32,
                                       static_cast<size_t>(T * nb) * sizeof(ActBlockQ8),
                                       static_cast<cudaStream_t>(stream)>>>(ws[0].type, m, nb, x, T);
    return CudaCheck(cudaGetLastError(), "MatMulQuantWarpSharedFusedKernel");
  }
  absl::Status st = LaunchQuantizeAct(x, T, ws[0].cols, scratch, stream);
  if (!st.ok()) return st;
  return LaunchMatMulsOnBlocks(ws, n, scratch, T, ys, stream, kernel);
}

absl::Status LaunchMatMul(const WeightMatrix& w, const float* x, int64_t T, float* y, void* scratch, void* stream,
                          CudaMatMulKernel kernel, ActQuant act) {
  if (!IsFloatType(w.type) && !IsQuantizedType(w.type)) {
    return absl::UnimplementedError("MatMul: weight type not supported on CUDA yet");
  }
  if (IsQuantizedType(w.type)) {
    const int64_t nb = w.cols / kActBlockSize;
    if (kernel == CudaMatMulKernel::kWarpPerRow && act == ActQuant::kAuto && w.cols % kActBlockSize == 0 &&
        FusesActQuant(T, nb)) {
      if (T * w.rows == 0) return absl::OkStatus();
      MatMulQuantWarpFusedKernel<<<BlocksFor(w.rows, kWarpRows), kWarpRows * 32,
                                   static_cast<size_t>(T * nb) * sizeof(ActBlockQ8),
                                   static_cast<cudaStream_t>(stream)>>>(w.type, w.data, w.row_bytes, w.rows, nb, x,
                                                                        T, y);
      return CudaCheck(cudaGetLastError(), "MatMulQuantWarpFusedKernel");
    }
    absl::Status st = LaunchQuantizeAct(x, T, w.cols, scratch, stream);
    if (!st.ok()) return st;
    return LaunchMatMulOnBlocks(w, scratch, T, y, stream, kernel);
  }
  if (T * w.rows == 0) return absl::OkStatus();
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (kernel == CudaMatMulKernel::kWarpPerRow) {
    MatMulFloatWarpKernel<<<BlocksFor(w.rows, kWarpRows), kWarpRows * 32, 0, s>>>(w.type, w.data, w.row_bytes, w.rows,
                                                                                w.cols, x, T, y);
  } else {
    MatMulFloatKernel<<<BlocksFor(T * w.rows, kThreads), kThreads, 0, s>>>(w.type, w.data, w.row_bytes, w.rows, w.cols,
                                                                           x, T, y);
  }
  return CudaCheck(cudaGetLastError(), "MatMulFloatKernel");
}

absl::Status MatMulHost(const WeightMatrix& w, const float* x, int64_t T, float* y, CudaMatMulKernel kernel,
                        ActQuant act) {
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
  st.Update(LaunchMatMul(on_device, dx.get(), T, dy.get(), dact.get(), nullptr, kernel, act));
  if (st.ok()) st.Update(LaunchStatus("MatMul"));
  if (!st.ok()) return st;
  return dy.Download(y, static_cast<size_t>(T * w.rows));
}

absl::Status MatMulSharedHost(const WeightMatrix* ws, int n, const float* x, int64_t T, float* const* ys,
                              ActQuant act) {
  if (n < 1 || n > 4) return absl::InvalidArgumentError("MatMulSharedHost: 1 to 4 weights");
  const int64_t K = ws[0].cols;
  std::vector<DeviceArray<uint8_t>> dw(static_cast<size_t>(n));
  std::vector<DeviceArray<float>> dy(static_cast<size_t>(n));
  DeviceArray<float> dx;
  DeviceArray<uint8_t> dact;
  std::vector<WeightMatrix> on_device(ws, ws + n);
  std::vector<float*> outs(static_cast<size_t>(n));
  absl::Status st = dx.Upload(x, static_cast<size_t>(T * K));
  if (st.ok()) st.Update(dact.Alloc(static_cast<size_t>(MatMulScratchBytes(T, K))));
  for (int i = 0; i < n && st.ok(); ++i) {
    if (ws[i].cols != K) return absl::InvalidArgumentError("MatMulSharedHost: the weights' widths differ");
    st.Update(dw[i].Upload(ws[i].data, static_cast<size_t>(ws[i].rows) * ws[i].row_bytes));
    if (st.ok()) st.Update(dy[i].Alloc(static_cast<size_t>(T * ws[i].rows)));
    on_device[i].data = dw[i].get();
    outs[i] = dy[i].get();
  }
  if (st.ok()) {
    st.Update(LaunchMatMuls(on_device.data(), n, dx.get(), T, outs.data(), dact.get(), nullptr,
                            CudaMatMulKernel::kWarpPerRow, act));
  }
  if (st.ok()) st.Update(LaunchStatus("MatMulShared"));
  for (int i = 0; i < n && st.ok(); ++i) st.Update(dy[i].Download(ys[i], static_cast<size_t>(T * ws[i].rows)));
  return st;
}

}  // namespace specd::kernels::cuda
