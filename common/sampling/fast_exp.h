// exp of non-positive arguments at float precision, written as plain arithmetic the compiler
// vectorizes (no libm call per element). Every sampled token pays it over a whole row of
// logits (49,152 for the default model), once for the log-normalizer of its logprob and once
// more per verified row for p; std::exp in double there cost ~0.5 ms a row.
//
// The reference twin is std::exp in double: tests/unit/sampling_test.cc holds the relative
// error below 4e-7 over [-87, 0]. The operations are the same float steps in the same order
// at any SIMD width (and the library builds with -ffp-contract=off), so a value is the same
// bits on every machine.
#ifndef SPECD_COMMON_SAMPLING_FAST_EXP_H_
#define SPECD_COMMON_SAMPLING_FAST_EXP_H_

#include <cstdint>
#include <cstring>

#include "common/util/host_device.h"

namespace specd::sampling {

// A pass over a whole row of logits, compiled twice and picked at load time: for AVX2 (8
// lanes) and for the baseline (4). Only the vector width differs: the same IEEE operations,
// so the same bits (the library builds with -ffp-contract=off: no fused multiply-adds).
#define SPECD_ROW_PASS __attribute__((target_clones("avx2", "default")))

// Below this exp() returns 0: exp(-87) = 1.6e-38 is below float's normal range, and weighs
// nothing beside the largest entry of a row (exp(0) = 1).
inline constexpr float kExpFloor = -87.0f;

// exp(x) for x <= 0 (also -inf); 0 below kExpFloor. The CUDA sampling kernels call this same
// definition (built without fused multiply-adds there too: kernels/cuda/CMakeLists.txt).
SPECD_HOST_DEVICE inline float ExpNonPositive(float x) {
  const float clamped = x < kExpFloor ? kExpFloor : x;
  // x = n ln2 + r with n an integer and |r| <= ln2 / 2. n by the round-to-nearest of adding
  // 1.5 * 2^23 (exact for |n| < 2^22); ln2 in two parts so n * ln2_hi is exact.
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kRound = 12582912.0f;         // 1.5 * 2^23
  constexpr float kLn2Hi = 0.693145751953125f;  // ln2 to 16 bits: n * kLn2Hi exact for |n| < 256
  constexpr float kLn2Lo = 1.42860682030941723e-6f;  // ln2 - kLn2Hi
  const float n = (clamped * kLog2e + kRound) - kRound;
  const float r = (clamped - n * kLn2Hi) - n * kLn2Lo;
  // e^r by its Taylor series to r^7: the remainder r^8 / 8! < 6e-9 for |r| <= ln2 / 2.
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n from the exponent bits: n in [-126, 0], so a normal float.
  const int32_t biased = static_cast<int32_t>(n) + 127;
  const uint32_t scale_bits = static_cast<uint32_t>(biased) << 23;
  float scale;
  memcpy(&scale, &scale_bits, sizeof(scale));  // a bit cast device code can make too
  return x < kExpFloor ? 0.0f : p * scale;
}

}  // namespace specd::sampling

#endif  // SPECD_COMMON_SAMPLING_FAST_EXP_H_
