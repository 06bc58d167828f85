// Tensor element types stored in GGUF files, their block layouts and sizes.
#ifndef SPECD_COMMON_GGUF_GGML_TYPE_H_
#define SPECD_COMMON_GGUF_GGML_TYPE_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace specd::gguf {

// Numeric values are the on-disk ids (ggml's enum); never renumber.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
};

struct GgmlTypeTraits {
  std::string_view name;   // "Q4_1"
  int64_t block_size;      // elements per block (1 for plain types)
  int64_t type_size;       // bytes per block
  bool can_dequantize;     // we implement a reference dequantizer
};

// Traits for a raw on-disk type id; an unknown id is INVALID_ARGUMENT.
absl::StatusOr<GgmlTypeTraits> GetTypeTraits(uint32_t raw_type);
inline absl::StatusOr<GgmlTypeTraits> GetTypeTraits(GgmlType t) {
  return GetTypeTraits(static_cast<uint32_t>(t));
}
std::string_view GgmlTypeName(GgmlType t);  // "?" for unknown

// Bytes occupied by n elements; INVALID_ARGUMENT if n is not a multiple of the
// block size or the byte count overflows.
absl::StatusOr<uint64_t> RowBytes(GgmlType t, int64_t n);

}  // namespace specd::gguf

#endif  // SPECD_COMMON_GGUF_GGML_TYPE_H_
