// Types shared by every kernel backend (kernels/ref, kernels/cpu, later kernels/cuda).
#ifndef SPECD_KERNELS_KERNEL_TYPES_H_
#define SPECD_KERNELS_KERNEL_TYPES_H_

#include <cstdint>

#include "common/gguf/ggml_type.h"

namespace specd::kernels {

// A weight matrix as stored in the GGUF file (mmap'd, never dequantized wholesale).
// Row r (output feature r) starts at data + r * row_bytes and holds `cols` elements
// of `type`. y = W x, i.e. y[n] = sum_k W[n, k] * x[k].
struct WeightMatrix {
  gguf::GgmlType type;
  const uint8_t* data;
  int64_t rows;        // out features (ggml ne1)
  int64_t cols;        // in features (ggml ne0), contiguous
  uint64_t row_bytes;  // stride between rows in bytes
  // Optional: the same matrix repacked for a backend's kernels (kernels/cpu: PackWeight's
  // layout), made once at load by whoever owns it. Kernels that do not read it use `data`.
  const uint8_t* packed = nullptr;
};

// kInt8: each (token, kv head) row of K and of V is stored as int8 codes times one float
// scale, absmax / 127 (QuantizeKvRow in kernels/kv_int8.h), the scales in k_scale / v_scale.
// Half the bytes of f16 for the same tokens.
enum class KvDtype { kF16, kBF16, kF32, kInt8 };

// One layer's paged KV pool: v: [num_blocks, num_kv_heads, block_size, head_dim], k the
// same with each (block, head) slab transposed to [head_dim, block_size] (KIndex below).
// A token's slot is block * block_size + offset. Head-major inside a block: one kv head's
// keys (and values) of a block are one contiguous run, which attention reads as a stream (token-major
// rows made it gather 128-byte slices at a 384-byte stride, and wait on memory twice as long).
struct PagedKvLayer {
  KvDtype dtype;
  void* k;
  void* v;
  int64_t num_blocks;
  int32_t block_size;
  int32_t num_kv_heads;
  int32_t head_dim;
  // kInt8 only: one scale per (token, kv head), [num_blocks][kv_heads][block_size] (SIndex).
  float* k_scale = nullptr;
  float* v_scale = nullptr;

  // The scale index of kv head h of the token at `offset` in `block` (kInt8).
  int64_t SIndex(int64_t block, int64_t offset, int32_t h) const {
    return (block * num_kv_heads + h) * block_size + offset;
  }
  int64_t SIndex(int64_t slot, int32_t h) const {
    return SIndex(slot / block_size, slot % block_size, h);
  }

  // V: element index of dim 0 of kv head h of the token at `offset` in `block`; the
  // token's dims follow contiguously and the block's next offsets at a stride of head_dim
  // ([num_blocks][kv_heads][block_size][head_dim]).
  int64_t VIndex(int64_t block, int64_t offset, int32_t h) const {
    return ((block * num_kv_heads + h) * block_size + offset) * head_dim;
  }
  // The same for the token in `slot`.
  int64_t VIndex(int64_t slot, int32_t h) const {
    return VIndex(slot / block_size, slot % block_size, h);
  }
  // K is stored transposed inside a block, [num_blocks][kv_heads][head_dim][block_size], so
  // one dim of a block's keys is contiguous: the attention kernels vectorise across keys,
  // which keeps each score one FMA chain over the dims in order. Element index of dim i of
  // kv head h of the token at `offset` in `block`.
  int64_t KIndex(int64_t block, int64_t offset, int32_t h, int32_t i) const {
    return ((block * num_kv_heads + h) * head_dim + i) * block_size + offset;
  }
  int64_t KIndex(int64_t slot, int32_t h, int32_t i) const {
    return KIndex(slot / block_size, slot % block_size, h, i);
  }
};

enum class RopeLayout {
  kNormal,  // adjacent pairs (x[2i], x[2i+1]) as in GGUF llama
  kNeox,    // halves (x[i], x[i + rope_dim/2]) as in qwen2
};

struct RopeParams {
  int32_t rope_dim;  // rotated dims (<= head_dim, even); the rest pass through
  float freq_base;
  RopeLayout layout;
  // Llama-3 scaling:
  bool llama3_scaling = false;
  float factor = 1, low_freq_factor = 1, high_freq_factor = 4;
  int32_t original_context = 8192;
  // linear scaling: positions are divided by linear_scale
  float linear_scale = 1;
  // Per-pair frequency divisors [rope_dim / 2] (GGUF tensor rope_freqs.weight, how converted
  // Llama 3.1+ files carry their scaling); when set, the Llama-3 fields above are not used.
  // Points into the model file, which outlives every use.
  const float* freq_factors = nullptr;
};

// Weight types MatMul accepts: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K.
// cols must be a multiple of the type's block size (32; 256 for K-quants).
inline bool MatMulSupportsType(gguf::GgmlType t) {
  using gguf::GgmlType;
  switch (t) {
    case GgmlType::kF32: case GgmlType::kF16: case GgmlType::kBF16:
    case GgmlType::kQ8_0: case GgmlType::kQ4_0: case GgmlType::kQ4_1:
    case GgmlType::kQ4_K: case GgmlType::kQ6_K:
      return true;
    default:
      return false;
  }
}

// Bytes of one element of the KV pool.
inline int64_t KvDtypeSize(KvDtype d) {
  return d == KvDtype::kF32 ? 4 : d == KvDtype::kInt8 ? 1 : 2;
}

}  // namespace specd::kernels

#endif  // SPECD_KERNELS_KERNEL_TYPES_H_
