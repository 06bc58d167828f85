// The int8 KV cache's one quantizer (KvDtype::kInt8). Every backend writes K and V rows
// through it, so they store the same bytes; a code reads back as float(code) * scale.
#ifndef SPECD_KERNELS_KV_INT8_H_
#define SPECD_KERNELS_KV_INT8_H_

#include <cmath>
#include <cstdint>

#include "common/util/host_device.h"

namespace specd::kernels {

// x: [n] floats of one (token, kv head) row; codes go to q[0], q[stride], ... Returns the
// row's scale, absmax / 127 (0 for an all-zero row). Codes round to nearest (even).
SPECD_HOST_DEVICE inline float QuantizeKvRow(const float* x, int32_t n, int8_t* q, int64_t stride) {
  float amax = 0.0f;
  for (int32_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  for (int32_t i = 0; i < n; ++i) {
    float c = std::nearbyint(x[i] * inv);
    if (std::isnan(c)) c = 0.0f;  // a NaN input; the cast below must not see it
    c = c > 127.0f ? 127.0f : (c < -127.0f ? -127.0f : c);
    q[i * stride] = static_cast<int8_t>(c);
  }
  return amax / 127.0f;
}

}  // namespace specd::kernels

#endif  // SPECD_KERNELS_KV_INT8_H_
