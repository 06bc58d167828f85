// Reference (plain-loop) dequantization and quantization of GGUF tensor types.
// Block layouts follow the GGUF format: e.g. Q4_1 = {f16 d, f16 m, u8 qs[16]} per 32 values.
#ifndef SPECD_COMMON_GGUF_QUANTS_H_
#define SPECD_COMMON_GGUF_QUANTS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/gguf/ggml_type.h"

namespace specd::gguf {

float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);    // round to nearest even
float BF16ToF32(uint16_t h);
uint16_t F32ToBF16(float f);   // round to nearest even, NaN stays NaN

// dst: [n] floats. n must be a multiple of the type's block size.
// Supported: F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K (and more where noted in .cc).
absl::Status DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n);

// Writes RowBytes(type, n) bytes. Supported: F32, F16, BF16, Q4_0, Q4_1, Q8_0.
absl::Status QuantizeRow(GgmlType type, const float* src, void* dst, int64_t n);

}  // namespace specd::gguf

#endif  // SPECD_COMMON_GGUF_QUANTS_H_
