// Reference kernels: plain loops, written to be obviously correct. Every fast
// backend (kernels/cpu, kernels/cuda) has the same functions and is tested
// against these in tests/kernels/ops_test.cc. Shapes are row-major; [T, D]
// means T rows of D contiguous floats.
#ifndef SPECD_KERNELS_REF_OPS_H_
#define SPECD_KERNELS_REF_OPS_H_

#include <cstdint>

#include "kernels/kernel_types.h"

namespace specd::kernels::ref {

// y[t, n] = sum_k W[n, k] * x[t, k].  x: [T, w.cols], y: [T, w.rows].
// F32/F16/BF16 weights: f32 dot product on the unquantized activations.
// Quantized weights (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K): activations are quantized
// with QuantizeActRow (kernels/act_quant.h) and each 32-block dot is integer.
void MatMul(const WeightMatrix& w, const float* x, int64_t T, float* y);

// out[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * w.   x, out: [T, D]; w: [D].
void RmsNorm(const float* x, int64_t T, int64_t D, const float* w, float eps, float* out);

// Rotary position embedding, in place.  x: [T, num_heads, head_dim]; positions: [T].
// Rotates the first p.rope_dim dims of each head; the rest are unchanged.
void Rope(float* x, int64_t T, int32_t num_heads, int32_t head_dim, const int32_t* positions,
          const RopeParams& p);

// out = silu(gate) * up.  gate, up, out: [T, F] (out may alias gate or up).
void SwiGlu(const float* gate, const float* up, int64_t T, int64_t F, float* out);

// Numerically stable softmax of x[0..n), in place.
void Softmax(float* x, int64_t n);

// x[i] += y[i] for i < n.
void AddInPlace(float* x, const float* y, int64_t n);

// x[t, :] += b.  x: [T, N]; b: [N].
void AddBias(float* x, int64_t T, int64_t N, const float* b);

// out[t, :] = dequantized row ids[t] of table.  table: [vocab, D]; out: [T, D].
void EmbeddingLookup(const WeightMatrix& table, const int32_t* ids, int64_t T, float* out);

// Stores k[t], v[t] ([num_kv_heads, head_dim] each) into slot slots[t] (PagedKvLayer::Index)
// (= block * block_size + offset) of the pool, converting to kv.dtype
// (round to nearest even).  k, v: [T, num_kv_heads, head_dim]. A negative slot is a padding
// row (a step bucketed for a CUDA graph): nothing is stored for it.
void WriteKv(const float* k, const float* v, int64_t T, const int64_t* slots,
             const PagedKvLayer& kv);

// Causal paged attention. q: [T, num_q_heads, head_dim]; out: same shape.
// Query token t at position p = positions[t] attends KV positions 0..p of its own
// sequence, whose block table is block_tables[t] (position j lives in slot
// block_tables[t][j / block_size] * block_size + j % block_size; already written).
// Grouped-query: q head h reads kv head h / (num_q_heads / num_kv_heads).
// out = softmax(scale * q K^T) V.
void PagedAttention(const float* q, int64_t T, int32_t num_q_heads, const int32_t* positions,
                    const int32_t* const* block_tables, const PagedKvLayer& kv, float scale,
                    float* out);

// ---- helpers shared with tests ----

// Dequantizes one row of n elements (n a multiple of the block size) of any
// MatMul type; returns false for an unsupported type.
bool DequantizeRow(gguf::GgmlType type, const void* src, int64_t n, float* dst);

// Per-pair inverse frequencies of RoPE after Llama-3 / linear scaling:
// inv_freq[i] for i < rope_dim / 2 (the angle of pair i at position p is p * inv_freq[i]).
void RopeInvFreq(const RopeParams& p, double* inv_freq);

// Integer form of 32-value sub-block `sb` of a quantized row (Q8_0, Q4_0, Q4_1, Q4_K,
// Q6_K): value i = scale * (sub_scale[i] * q[i]) + min.  sub_scale is the Q6_K per-16
// scale (1 for the other types), min is nonzero only for Q4_1 / Q4_K.
struct IntSubBlock {
  int32_t q[32];
  int32_t sub_scale[32];
  float scale;
  float min;
};
void DecodeIntSubBlock(gguf::GgmlType type, const uint8_t* row, int64_t sb, IntSubBlock* out);

// Dim i of kv head h of the token in `slot`, from the K or V pool, as f32 (any KV dtype; int8
// codes times their row's scale). The one reader of pool elements for the plain loops.
float KAt(const PagedKvLayer& kv, int64_t slot, int32_t h, int32_t i);
float VAt(const PagedKvLayer& kv, int64_t slot, int32_t h, int32_t i);

float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);   // round to nearest even
float BF16ToF32(uint16_t h);
uint16_t F32ToBF16(float f);  // round to nearest even, NaN stays NaN

}  // namespace specd::kernels::ref

#endif  // SPECD_KERNELS_REF_OPS_H_
