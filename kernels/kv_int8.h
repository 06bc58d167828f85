// The int8 KV cache (KvDtype::kInt8): its one quantizer, and the attention arithmetic every
// backend runs on it.
//
// Storage: each (token, kv head) row of K and of V is stored as int8 codes and one float
// scale, absmax / 127 (QuantizeKvRow); a code reads back as float(code) * scale.
//
// Attention on an int8 cache works on the codes, as llama.cpp's q8_0 KV cache does, so the
// CPU can use integer and bf16 dot products instead of converting every element to f32:
// - q is quantized per (token, q head) row by the same quantizer: codes qc, scale qs.
// - A score is an integer dot product over the head dims, then scaled (Int8Score):
//     score_j = float(sum_i qc_i kc_ji) * (ks_j * (qs * attention scale))
//   The sum is exact in int32 and in f32 (|sum| <= 512 * 127 * 127 < 2^24), so any order,
//   vector width or instruction (vpdpbusd, f32 FMAs, dp4a) gives the same score.
// - p_j = exp(score_j - chunk max) and the exp-sum l add up as for every dtype.
// - p V is an integer dot product too, with V's scale moved onto p. A chunk row's weights
//   w_j = p_j * vs_j are quantized to unsigned 8-bit codes against the row's largest,
//   wmax (PWeightInverse, PWeightCode): wc_j = round(w_j * 255 / wmax). An output column is
//     o_c = float(sum_j wc_j vc_jc) * (wmax / 255)   (PWeightScale)
//   The sum is exact in int32 and in f32 (|sum| <= 64 * 255 * 127 < 2^24), so vpdpbusd (the
//   weights are its unsigned operand, V's codes its signed one) and f32 FMAs in any order
//   give the same bits. A weight errs by at most wmax / 510, where a bf16 weight erred by
//   up to w / 512: the same near the row's largest weight, coarser for the small ones.
// The reference (kernels/ref) keeps w exact: the CPU kernels' codes are their error against
// it, as bf16's rounding is for the bf16 dtype. The CUDA kernel scores the same way and keeps
// p V in f32 over code * scale, as the reference does (GPU and CPU never share bits; each is
// held to the reference).
#ifndef SPECD_KERNELS_KV_INT8_H_
#define SPECD_KERNELS_KV_INT8_H_

#include <cmath>
#include <cstdint>

#include "common/util/host_device.h"

namespace specd::kernels {

// (static: the CPU's per-ISA translation units each keep their own copy, so the linker never
// hands the generic code one compiled for AVX-512; see kernels/cpu/isa_kernels.h.)

// The code of x at 1 / scale = inv: nearest (even), clamped to [-127, 127]; NaN gives 0.
SPECD_HOST_DEVICE static inline float KvCode(float x, float inv) {
  float c = std::nearbyint(x * inv);
  if (std::isnan(c)) c = 0.0f;  // a NaN input; a cast of the code must not see it
  return c > 127.0f ? 127.0f : (c < -127.0f ? -127.0f : c);
}

// 1 / scale for a row whose largest magnitude is amax (0 for an all-zero row).
SPECD_HOST_DEVICE static inline float KvInverseScale(float amax) { return amax > 0.0f ? 127.0f / amax : 0.0f; }

// x: [n] floats of one (token, kv head) row; codes go to q[0], q[stride], ... Returns the
// row's scale, absmax / 127 (0 for an all-zero row). Codes round to nearest (even).
SPECD_HOST_DEVICE static inline float QuantizeKvRow(const float* x, int32_t n, int8_t* q, int64_t stride) {
  float amax = 0.0f;
  for (int32_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const float inv = KvInverseScale(amax);
  for (int32_t i = 0; i < n; ++i) q[i * stride] = static_cast<int8_t>(KvCode(x[i], inv));
  return amax / 127.0f;
}

// A score from its integer dot product: isum * (ks * qss), qss = qs * attention scale.
SPECD_HOST_DEVICE static inline float Int8Score(float isum, float ks, float qss) { return isum * (ks * qss); }

// p V's weight codes (above). wmax: the chunk row's largest w = p * vs (NaN ignored: a
// running max as `w > wmax ? w : wmax`, from 0).
inline constexpr float kPWeightCodeMax = 255.0f;
SPECD_HOST_DEVICE static inline float PWeightInverse(float wmax) {
  return wmax > 0.0f ? kPWeightCodeMax / wmax : 0.0f;
}
// The code of w (as a float): w * inv clamped to [0, 255] (NaN to 0), then nearest (even).
SPECD_HOST_DEVICE static inline float PWeightCode(float w, float inv) {
  float c = w * inv;
  c = c > 0.0f ? c : 0.0f;
  c = c < kPWeightCodeMax ? c : kPWeightCodeMax;
  return std::nearbyint(c);
}
// What an output column's integer sum is multiplied by.
SPECD_HOST_DEVICE static inline float PWeightScale(float wmax) { return wmax / kPWeightCodeMax; }

}  // namespace specd::kernels

#endif  // SPECD_KERNELS_KV_INT8_H_
