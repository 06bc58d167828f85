// The bf16 attention arithmetic (KvDtype::kBF16). Every backend stores and multiplies through
// these helpers, so they give the same operands; kernels/cpu then sums them in the order the
// hardware's bf16 dot product does (AVX-512 BF16 vdpbf16ps), so its native and emulated
// paths agree bitwise.
//
// With the KV cache in bf16, attention rounds its other operands to bf16 too, as GPU
// FlashAttention does with bf16 tensors:
// - K and V are stored as bf16 (ToBf16Attn), q is rounded to bf16 before the scores, and
//   each chunk's p = exp(score - chunk max) is rounded to bf16 before p V (the exp-sum l
//   adds the unrounded p).
// - A score is one chain over the head dims taken in pairs, the odd dim first:
//     acc += q[1] k[1]; acc += q[0] k[0]; acc += q[3] k[3]; acc += q[2] k[2]; ...
//   and an output column one chain over the keys in pairs (chunk-relative 2m+1, then 2m).
//   Each product of two bf16 values is exact in f32, so each step is one rounding, and an
//   f32 FMA on the rounded operands reproduces the instruction (measured on Zen 4:
//   3.2 M random lanes, all equal to this order, 10 % differ from the other order).
// - Values below kBf16AttnFlush in magnitude round to +0. The hardware treats subnormal
//   bf16 inputs and outputs as zero where f32 FMAs do not; with every operand 0 or at least
//   2^-30, every product and partial sum is 0 or far above the subnormal range, so the two
//   never meet one. (f16 KV already loses everything below 2^-24.)
#ifndef SPECD_KERNELS_ATTN_BF16_H_
#define SPECD_KERNELS_ATTN_BF16_H_

#include <cstdint>
#include <cstring>

#include "common/util/host_device.h"

namespace specd::kernels {

inline constexpr float kBf16AttnFlush = 0x1p-30f;

// x rounded to nearest even bf16 (bits), |x| < kBf16AttnFlush to +0; NaN stays NaN.
// Branch-free, so loops over it vectorize.
SPECD_HOST_DEVICE inline uint16_t ToBf16Attn(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  const uint32_t mag = u & 0x7FFFFFFFu;
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;  // quiet NaN
  const uint32_t out = mag > 0x7F800000u ? nan : rounded;
  return static_cast<uint16_t>(mag < 0x30800000u ? 0u : out);  // 0x30800000: kBf16AttnFlush
}

SPECD_HOST_DEVICE inline float Bf16AttnToF32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// x as the f32 value of its bf16 rounding (ToBf16Attn).
SPECD_HOST_DEVICE inline float RoundBf16Attn(float x) { return Bf16AttnToF32(ToBf16Attn(x)); }

}  // namespace specd::kernels

#endif  // SPECD_KERNELS_ATTN_BF16_H_
