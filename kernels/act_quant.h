// The one definition of the quantized activation format used by every quantized
// MatMul (reference and fast): each row of activations is cut into blocks of 32
// floats and each block becomes int8 values with one f32 scale, plus the scaled
// block sum that the Q4_1 / Q4_K min terms need.
//
//   d  = max|x| / 127          (0 for an all-zero block)
//   q  = round_half_even(x * (1/d)), clamped to [-127, 127]
//   s  = d * sum(q)            (exact integer sum, then one f32 multiply)
//
// Dot product with a weight block whose values are w = dw * wq + mw:
//   sum_k w_k x_k  ~=  (dw * d) * sum_k (wq_k * q_k)  +  mw * s
// where the integer sum is exact. Every backend must produce bitwise the same
// blocks as QuantizeActRow below (the op test checks it).
#ifndef SPECD_KERNELS_ACT_QUANT_H_
#define SPECD_KERNELS_ACT_QUANT_H_

#include <cmath>
#include <cstdint>

#include "common/util/host_device.h"

namespace specd::kernels {

inline constexpr int kActBlockSize = 32;

struct ActBlockQ8 {
  float d;                    // scale
  float s;                    // d * sum(qs)
  int8_t qs[kActBlockSize];   // quantized values
};
static_assert(sizeof(ActBlockQ8) == 40);

// n must be a multiple of kActBlockSize; writes n / 32 blocks.
SPECD_HOST_DEVICE inline void QuantizeActRow(const float* x, int64_t n, ActBlockQ8* out) {
  for (int64_t b = 0; b < n / kActBlockSize; ++b) {
    const float* xb = x + b * kActBlockSize;
    float amax = 0.0f;
    for (int i = 0; i < kActBlockSize; ++i) {
      const float a = std::fabs(xb[i]);
      amax = a > amax ? a : amax;
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t sum = 0;
    for (int i = 0; i < kActBlockSize; ++i) {
      float v = std::nearbyint(xb[i] * id);
      v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
      out[b].qs[i] = static_cast<int8_t>(v);
      sum += out[b].qs[i];
    }
    out[b].d = d;
    out[b].s = d * static_cast<float>(sum);
  }
}

}  // namespace specd::kernels

#endif  // SPECD_KERNELS_ACT_QUANT_H_
