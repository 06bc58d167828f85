// CUDA twins of ref::Rope, SwiGlu, AddInPlace, AddBias, EmbeddingLookup and WriteKv, with the
// host entry points of ops.h. One thread per output element (or per KV row for int8, whose
// scale needs the whole row); the float steps are the reference's, contraction-free where the
// reference's bits are the contract (dequantization, KV conversion).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attn_bf16.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/kv_int8.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/ops.h"
#include "kernels/ref/ops.h"

namespace specd::kernels::cuda {
namespace {

using gguf::GgmlType;

// Two tensors at the same positions (a layer's q and k) in one launch; x1 may be absent (H1 0).
// x0: [T, H0, head_dim], x1: [T, H1, head_dim]; inv_freq: [rope_dim / 2] (double, from the
// host). One thread per (token, head of either, pair): each pair's arithmetic is the same
// whichever tensor it is in and whatever else the launch carries.
__global__ void RopeKernel(float* x0, int32_t H0, float* x1, int32_t H1, int64_t T, int32_t head_dim,
                           int32_t half, bool neox, const int32_t* positions, const double* inv_freq) {
  const int32_t H = H0 + H1;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= T * H * half) return;
  const int32_t i = static_cast<int32_t>(idx % half);
  const int64_t th = idx / half;
  const int64_t t = th / H;
  const int32_t h = static_cast<int32_t>(th % H);
  float* v = h < H0 ? x0 + (t * H0 + h) * head_dim : x1 + (t * H1 + (h - H0)) * head_dim;
  const double angle = static_cast<double>(positions[t]) * inv_freq[i];
  const float c = static_cast<float>(cos(angle));
  const float s = static_cast<float>(sin(angle));
  const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
  const float a = v[i0], b = v[i1];
  v[i0] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  v[i1] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
}

__global__ void SwiGluKernel(const float* gate, const float* up, int64_t n, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = gate[i];
  out[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[i]);
}

__global__ void AddKernel(float* x, const float* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = __fadd_rn(x[i], y[i]);
}

__global__ void AddBiasKernel(float* x, int64_t T, int64_t N, const float* b) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < T * N) x[i] = __fadd_rn(x[i], b[i % N]);
}

__device__ __forceinline__ uint16_t Ld16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

// Element k of a row of `type` as the reference dequantizes it: scale * float(q) + min.
__device__ float DequantElement(GgmlType type, const uint8_t* row, int64_t k) {
  switch (type) {
    case GgmlType::kF32: return reinterpret_cast<const float*>(row)[k];  // rows are 4-byte aligned
    case GgmlType::kF16: return HalfBitsToF32(Ld16(row + 2 * k));
    case GgmlType::kBF16: return Bf16BitsToF32(Ld16(row + 2 * k));
    case GgmlType::kQ8_0: {
      const uint8_t* b = row + (k / 32) * 34;
      const float d = HalfBitsToF32(Ld16(b));
      return __fadd_rn(__fmul_rn(d, static_cast<float>(static_cast<int8_t>(b[2 + k % 32]))), 0.0f);
    }
    case GgmlType::kQ4_0: {
      const uint8_t* b = row + (k / 32) * 18;
      const int i = static_cast<int>(k % 32);
      const int code = i < 16 ? (b[2 + i] & 0x0F) : (b[2 + i - 16] >> 4);
      return __fadd_rn(__fmul_rn(HalfBitsToF32(Ld16(b)), static_cast<float>(code - 8)), 0.0f);
    }
    case GgmlType::kQ4_1: {
      const uint8_t* b = row + (k / 32) * 20;
      const int i = static_cast<int>(k % 32);
      const int code = i < 16 ? (b[4 + i] & 0x0F) : (b[4 + i - 16] >> 4);
      return __fadd_rn(__fmul_rn(HalfBitsToF32(Ld16(b)), static_cast<float>(code)), HalfBitsToF32(Ld16(b + 2)));
    }
    default: return __int_as_float(0x7FC00000);  // rejected on the host
  }
}

// out: [T, cols]; one thread per element.
__global__ void EmbeddingKernel(GgmlType type, const uint8_t* table, uint64_t row_bytes, int64_t cols,
                                const int32_t* ids, int64_t T, float* out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= T * cols) return;
  const int64_t t = idx / cols, k = idx % cols;
  out[idx] = DequantElement(type, table + static_cast<uint64_t>(ids[t]) * row_bytes, k);
}

// PagedKvLayer's index math on the device.
struct PoolShape {
  int32_t block_size, num_kv_heads, head_dim;
  __device__ int64_t VIndex(int64_t slot, int32_t h) const {
    return ((slot / block_size * num_kv_heads + h) * block_size + slot % block_size) * head_dim;
  }
  __device__ int64_t KIndex(int64_t slot, int32_t h, int32_t i) const {
    return ((slot / block_size * num_kv_heads + h) * head_dim + i) * block_size + slot % block_size;
  }
  __device__ int64_t SIndex(int64_t slot, int32_t h) const {
    return (slot / block_size * num_kv_heads + h) * block_size + slot % block_size;
  }
};

// f32 / f16 / bf16: one thread per (token, kv head, dim).
__global__ void WriteKvKernel(const float* k, const float* v, int64_t T, const int64_t* slots, KvDtype dt,
                              PoolShape s, void* kp, void* vp) {
  const int64_t row = static_cast<int64_t>(s.num_kv_heads) * s.head_dim;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= T * row) return;
  const int64_t t = idx / row;
  const int32_t h = static_cast<int32_t>(idx % row / s.head_dim), i = static_cast<int32_t>(idx % s.head_dim);
  if (slots[t] < 0) return;  // a padding row of a bucketed step
  const int64_t kd = s.KIndex(slots[t], h, i), vd = s.VIndex(slots[t], h) + i;
  switch (dt) {
    case KvDtype::kF32:
      static_cast<float*>(kp)[kd] = k[idx];
      static_cast<float*>(vp)[vd] = v[idx];
      break;
    case KvDtype::kF16:
      static_cast<uint16_t*>(kp)[kd] = F32ToHalfBits(k[idx]);
      static_cast<uint16_t*>(vp)[vd] = F32ToHalfBits(v[idx]);
      break;
    case KvDtype::kBF16:
      static_cast<uint16_t*>(kp)[kd] = ToBf16Attn(k[idx]);
      static_cast<uint16_t*>(vp)[vd] = ToBf16Attn(v[idx]);
      break;
    case KvDtype::kInt8:
      break;  // WriteKvInt8Kernel
  }
}

// int8: one thread per (token, kv head) row of K and of V.
__global__ void WriteKvInt8Kernel(const float* k, const float* v, int64_t T, const int64_t* slots,
                                  PoolShape s, int8_t* kp, int8_t* vp, float* ks, float* vs) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= T * s.num_kv_heads) return;
  const int64_t t = idx / s.num_kv_heads;
  const int32_t h = static_cast<int32_t>(idx % s.num_kv_heads);
  const int64_t src = idx * s.head_dim;
  if (slots[t] < 0) return;  // a padding row of a bucketed step
  ks[s.SIndex(slots[t], h)] = QuantizeKvRow(k + src, s.head_dim, kp + s.KIndex(slots[t], h, 0), s.block_size);
  vs[s.SIndex(slots[t], h)] = QuantizeKvRow(v + src, s.head_dim, vp + s.VIndex(slots[t], h), 1);
}

constexpr int kThreads = 256;

// out[r, :] = x[rows[r], :]; one thread per output element.
__global__ void GatherRowsKernel(const float* x, const int32_t* rows, int64_t R, int64_t D, float* out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < R * D) out[idx] = x[static_cast<int64_t>(rows[idx / D]) * D + idx % D];
}

cudaStream_t Stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

absl::Status LaunchRope(float* x, int64_t T, int32_t num_heads, int32_t head_dim, int32_t rope_dim, bool neox,
                        const int32_t* positions, const double* inv_freq, void* stream) {
  return LaunchRopeQK(x, num_heads, nullptr, 0, T, head_dim, rope_dim, neox, positions, inv_freq, stream);
}

absl::Status LaunchRopeQK(float* q, int32_t q_heads, float* k, int32_t k_heads, int64_t T, int32_t head_dim,
                          int32_t rope_dim, bool neox, const int32_t* positions, const double* inv_freq,
                          void* stream) {
  const int32_t half = rope_dim / 2;
  const int64_t work = T * (q_heads + k_heads) * half;
  if (work == 0) return absl::OkStatus();
  RopeKernel<<<BlocksFor(work, kThreads), kThreads, 0, Stream(stream)>>>(q, q_heads, k, k_heads, T, head_dim, half,
                                                                         neox, positions, inv_freq);
  return CudaCheck(cudaGetLastError(), "RopeKernel");
}

absl::Status LaunchSwiGlu(const float* gate, const float* up, int64_t n, float* out, void* stream) {
  if (n == 0) return absl::OkStatus();
  SwiGluKernel<<<BlocksFor(n, kThreads), kThreads, 0, Stream(stream)>>>(gate, up, n, out);
  return CudaCheck(cudaGetLastError(), "SwiGluKernel");
}

absl::Status LaunchAddInPlace(float* x, const float* y, int64_t n, void* stream) {
  if (n == 0) return absl::OkStatus();
  AddKernel<<<BlocksFor(n, kThreads), kThreads, 0, Stream(stream)>>>(x, y, n);
  return CudaCheck(cudaGetLastError(), "AddKernel");
}

absl::Status LaunchAddBias(float* x, int64_t T, int64_t N, const float* b, void* stream) {
  if (T * N == 0) return absl::OkStatus();
  AddBiasKernel<<<BlocksFor(T * N, kThreads), kThreads, 0, Stream(stream)>>>(x, T, N, b);
  return CudaCheck(cudaGetLastError(), "AddBiasKernel");
}

absl::Status LaunchEmbeddingLookup(const WeightMatrix& table, const int32_t* ids, int64_t T, float* out,
                                   void* stream) {
  const int64_t n = T * table.cols;
  if (n == 0) return absl::OkStatus();
  EmbeddingKernel<<<BlocksFor(n, kThreads), kThreads, 0, Stream(stream)>>>(table.type, table.data, table.row_bytes,
                                                                           table.cols, ids, T, out);
  return CudaCheck(cudaGetLastError(), "EmbeddingKernel");
}

absl::Status LaunchGatherRows(const float* x, const int32_t* rows, int64_t R, int64_t D, float* out, void* stream) {
  if (R * D == 0) return absl::OkStatus();
  GatherRowsKernel<<<BlocksFor(R * D, kThreads), kThreads, 0, Stream(stream)>>>(x, rows, R, D, out);
  return CudaCheck(cudaGetLastError(), "GatherRowsKernel");
}

absl::Status LaunchWriteKv(const float* k, const float* v, int64_t T, const int64_t* slots, const PagedKvLayer& kv,
                           void* stream) {
  if (T == 0) return absl::OkStatus();
  const PoolShape shape{kv.block_size, kv.num_kv_heads, kv.head_dim};
  const int64_t row = static_cast<int64_t>(kv.num_kv_heads) * kv.head_dim;
  if (kv.dtype == KvDtype::kInt8) {
    WriteKvInt8Kernel<<<BlocksFor(T * kv.num_kv_heads, 64), 64, 0, Stream(stream)>>>(
        k, v, T, slots, shape, static_cast<int8_t*>(kv.k), static_cast<int8_t*>(kv.v), kv.k_scale, kv.v_scale);
  } else {
    WriteKvKernel<<<BlocksFor(T * row, kThreads), kThreads, 0, Stream(stream)>>>(k, v, T, slots, kv.dtype, shape,
                                                                                 kv.k, kv.v);
  }
  return CudaCheck(cudaGetLastError(), "WriteKvKernel");
}

absl::Status RopeHost(float* x, int64_t T, int32_t num_heads, int32_t head_dim, const int32_t* positions,
                      const RopeParams& p) {
  if (p.rope_dim <= 0 || p.rope_dim % 2 != 0 || p.rope_dim > head_dim) {
    return absl::InvalidArgumentError("RopeHost: rope_dim must be even and at most head_dim");
  }
  const int32_t half = p.rope_dim / 2;
  std::vector<double> inv_freq(half);
  ref::RopeInvFreq(p, inv_freq.data());  // the plan: the reference's own frequencies
  const size_t n = static_cast<size_t>(T) * num_heads * head_dim;
  DeviceArray<float> dx;
  DeviceArray<int32_t> dpos;
  DeviceArray<double> dfreq;
  absl::Status st = dx.Upload(x, n);
  if (st.ok()) st.Update(dpos.Upload(positions, static_cast<size_t>(T)));
  if (st.ok()) st.Update(dfreq.Upload(inv_freq.data(), inv_freq.size()));
  if (!st.ok()) return st;
  st.Update(LaunchRope(dx.get(), T, num_heads, head_dim, p.rope_dim, p.layout == RopeLayout::kNeox, dpos.get(),
                  dfreq.get(), nullptr));
  if (st.ok()) st.Update(LaunchStatus("RopeKernel"));
  if (!st.ok()) return st;
  return dx.Download(x, n);
}

absl::Status RopeQKHost(float* q, int32_t q_heads, float* k, int32_t k_heads, int64_t T, int32_t head_dim,
                        const int32_t* positions, const RopeParams& p) {
  if (p.rope_dim <= 0 || p.rope_dim % 2 != 0 || p.rope_dim > head_dim) {
    return absl::InvalidArgumentError("RopeQKHost: rope_dim must be even and at most head_dim");
  }
  std::vector<double> inv_freq(p.rope_dim / 2);
  ref::RopeInvFreq(p, inv_freq.data());
  const size_t nq = static_cast<size_t>(T) * q_heads * head_dim, nk = static_cast<size_t>(T) * k_heads * head_dim;
  DeviceArray<float> dq, dk;
  DeviceArray<int32_t> dpos;
  DeviceArray<double> dfreq;
  absl::Status st = dq.Upload(q, nq);
  if (st.ok()) st.Update(dk.Upload(k, nk));
  if (st.ok()) st.Update(dpos.Upload(positions, static_cast<size_t>(T)));
  if (st.ok()) st.Update(dfreq.Upload(inv_freq.data(), inv_freq.size()));
  if (!st.ok()) return st;
  st.Update(LaunchRopeQK(dq.get(), q_heads, dk.get(), k_heads, T, head_dim, p.rope_dim,
                         p.layout == RopeLayout::kNeox, dpos.get(), dfreq.get(), nullptr));
  if (st.ok()) st.Update(LaunchStatus("RopeKernel"));
  if (st.ok()) st.Update(dq.Download(q, nq));
  if (st.ok()) st.Update(dk.Download(k, nk));
  return st;
}

absl::Status SwiGluHost(const float* gate, const float* up, int64_t T, int64_t F, float* out) {
  const size_t n = static_cast<size_t>(T * F);
  DeviceArray<float> dg, du, dout;
  absl::Status st = dg.Upload(gate, n);
  if (st.ok()) st.Update(du.Upload(up, n));
  if (st.ok()) st.Update(dout.Alloc(n));
  if (!st.ok()) return st;
  st.Update(LaunchSwiGlu(dg.get(), du.get(), static_cast<int64_t>(n), dout.get(), nullptr));
  if (st.ok()) st.Update(LaunchStatus("SwiGluKernel"));
  if (!st.ok()) return st;
  return dout.Download(out, n);
}

absl::Status AddInPlaceHost(float* x, const float* y, int64_t n) {
  DeviceArray<float> dx, dy;
  absl::Status st = dx.Upload(x, static_cast<size_t>(n));
  if (st.ok()) st.Update(dy.Upload(y, static_cast<size_t>(n)));
  if (!st.ok()) return st;
  st.Update(LaunchAddInPlace(dx.get(), dy.get(), n, nullptr));
  if (st.ok()) st.Update(LaunchStatus("AddKernel"));
  if (!st.ok()) return st;
  return dx.Download(x, static_cast<size_t>(n));
}

absl::Status AddBiasHost(float* x, int64_t T, int64_t N, const float* b) {
  DeviceArray<float> dx, db;
  absl::Status st = dx.Upload(x, static_cast<size_t>(T * N));
  if (st.ok()) st.Update(db.Upload(b, static_cast<size_t>(N)));
  if (!st.ok()) return st;
  st.Update(LaunchAddBias(dx.get(), T, N, db.get(), nullptr));
  if (st.ok()) st.Update(LaunchStatus("AddBiasKernel"));
  if (!st.ok()) return st;
  return dx.Download(x, static_cast<size_t>(T * N));
}

absl::Status EmbeddingLookupHost(const WeightMatrix& table, const int32_t* ids, int64_t T, float* out) {
  switch (table.type) {
    case GgmlType::kF32: case GgmlType::kF16: case GgmlType::kBF16:
    case GgmlType::kQ8_0: case GgmlType::kQ4_0: case GgmlType::kQ4_1:
      break;
    default:
      return absl::UnimplementedError("EmbeddingLookupHost: table type not supported on CUDA yet");
  }
  const bool quantized = table.type != GgmlType::kF32 && table.type != GgmlType::kF16 && table.type != GgmlType::kBF16;
  if (quantized && table.cols % 32 != 0) {
    return absl::InvalidArgumentError("EmbeddingLookupHost: cols must be a multiple of 32 for quantized tables");
  }
  for (int64_t t = 0; t < T; ++t) {
    if (ids[t] < 0 || ids[t] >= table.rows) {
      return absl::InvalidArgumentError("EmbeddingLookupHost: id out of range");
    }
  }
  DeviceArray<uint8_t> dtable;
  DeviceArray<int32_t> dids;
  DeviceArray<float> dout;
  const size_t n = static_cast<size_t>(T * table.cols);
  absl::Status st = dtable.Upload(table.data, static_cast<size_t>(table.rows) * table.row_bytes);
  if (st.ok()) st.Update(dids.Upload(ids, static_cast<size_t>(T)));
  if (st.ok()) st.Update(dout.Alloc(n));
  if (!st.ok()) return st;
  WeightMatrix on_device = table;
  on_device.data = dtable.get();
  st.Update(LaunchEmbeddingLookup(on_device, dids.get(), T, dout.get(), nullptr));
  if (st.ok()) st.Update(LaunchStatus("EmbeddingKernel"));
  if (!st.ok()) return st;
  return dout.Download(out, n);
}

absl::Status GatherRowsHost(const float* x, int64_t rows_of_x, const int32_t* rows, int64_t R, int64_t D,
                           float* out) {
  for (int64_t r = 0; r < R; ++r) {
    if (rows[r] < 0 || rows[r] >= rows_of_x) return absl::InvalidArgumentError("GatherRowsHost: row out of range");
  }
  DeviceArray<float> dx, dout;
  DeviceArray<int32_t> drows;
  absl::Status st = dx.Upload(x, static_cast<size_t>(rows_of_x * D));
  if (st.ok()) st.Update(drows.Upload(rows, static_cast<size_t>(R)));
  if (st.ok()) st.Update(dout.Alloc(static_cast<size_t>(R * D)));
  if (st.ok()) st.Update(LaunchGatherRows(dx.get(), drows.get(), R, D, dout.get(), nullptr));
  if (st.ok()) st.Update(LaunchStatus("GatherRowsKernel"));
  if (!st.ok()) return st;
  return dout.Download(out, static_cast<size_t>(R * D));
}

absl::Status WriteKvHost(const float* k, const float* v, int64_t T, const int64_t* slots, const PagedKvLayer& kv) {
  if (kv.block_size <= 0 || kv.num_kv_heads <= 0 || kv.head_dim <= 0) {
    return absl::InvalidArgumentError("WriteKvHost: block_size, num_kv_heads and head_dim must be positive");
  }
  if (kv.dtype == KvDtype::kInt8 && (kv.k_scale == nullptr || kv.v_scale == nullptr)) {
    return absl::InvalidArgumentError("WriteKvHost: an int8 pool needs k_scale and v_scale");
  }
  const int64_t slots_total = kv.num_blocks * kv.block_size;
  std::vector<int64_t> sorted(slots, slots + T);
  std::sort(sorted.begin(), sorted.end());
  for (int64_t t = 0; t < T; ++t) {
    if (sorted[t] < 0) continue;  // padding rows: nothing stored
    if (sorted[t] >= slots_total) return absl::InvalidArgumentError("WriteKvHost: bad slot");
    // The tokens write in parallel: two into one slot would race (the reference keeps the last).
    if (t > 0 && sorted[t] == sorted[t - 1]) return absl::InvalidArgumentError("WriteKvHost: a slot written twice");
  }
  const int64_t row = static_cast<int64_t>(kv.num_kv_heads) * kv.head_dim;
  const size_t pool_bytes = static_cast<size_t>(slots_total * row * KvDtypeSize(kv.dtype));
  const size_t scales = kv.dtype == KvDtype::kInt8 ? static_cast<size_t>(slots_total * kv.num_kv_heads) : 0;
  DeviceArray<float> dk, dv, dks, dvs;
  DeviceArray<int64_t> dslots;
  DeviceArray<uint8_t> dkp, dvp;
  absl::Status st = dk.Upload(k, static_cast<size_t>(T * row));
  if (st.ok()) st.Update(dv.Upload(v, static_cast<size_t>(T * row)));
  if (st.ok()) st.Update(dslots.Upload(slots, static_cast<size_t>(T)));
  if (st.ok()) st.Update(dkp.Upload(static_cast<const uint8_t*>(kv.k), pool_bytes));
  if (st.ok()) st.Update(dvp.Upload(static_cast<const uint8_t*>(kv.v), pool_bytes));
  if (st.ok() && scales > 0) st.Update(dks.Upload(kv.k_scale, scales));
  if (st.ok() && scales > 0) st.Update(dvs.Upload(kv.v_scale, scales));
  if (!st.ok()) return st;
  PagedKvLayer on_device = kv;
  on_device.k = dkp.get();
  on_device.v = dvp.get();
  on_device.k_scale = dks.get();
  on_device.v_scale = dvs.get();
  st.Update(LaunchWriteKv(dk.get(), dv.get(), T, dslots.get(), on_device, nullptr));
  if (st.ok()) st.Update(LaunchStatus("WriteKvKernel"));
  if (!st.ok()) return st;
  if (absl::Status e = dkp.Download(static_cast<uint8_t*>(kv.k), pool_bytes); !e.ok()) return e;
  if (absl::Status e = dvp.Download(static_cast<uint8_t*>(kv.v), pool_bytes); !e.ok()) return e;
  if (scales == 0) return absl::OkStatus();
  if (absl::Status e = dks.Download(kv.k_scale, scales); !e.ok()) return e;
  return dvs.Download(kv.v_scale, scales);
}

}  // namespace specd::kernels::cuda
