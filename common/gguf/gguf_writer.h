// Writes GGUF v3 files (tests, fixtures, the tiny-model tool).
#ifndef SPECD_COMMON_GGUF_GGUF_WRITER_H_
#define SPECD_COMMON_GGUF_GGUF_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/gguf/ggml_type.h"
#include "common/gguf/gguf_value.h"

namespace specd::gguf {

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t version = 3, uint64_t alignment = 32);

  void Set(std::string key, Value value);  // replaces an existing key
  // `bytes` must hold exactly RowBytes(type, num_elements) bytes; dims in ggml order.
  absl::Status AddTensor(std::string name, GgmlType type, std::vector<int64_t> dims,
                         std::vector<uint8_t> bytes);
  // Convenience: quantizes f32 values into `type` (any type QuantizeRow supports).
  absl::Status AddTensorF32(std::string name, GgmlType type, std::vector<int64_t> dims,
                            const std::vector<float>& values);

  absl::StatusOr<std::string> Serialize() const;
  absl::Status WriteFile(const std::string& path) const;

 private:
  uint32_t version_;
  uint64_t alignment_;
  std::vector<std::pair<std::string, Value>> metadata_;
  struct PendingTensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> dims;
    std::vector<uint8_t> bytes;
  };
  std::vector<PendingTensor> tensors_;
};

}  // namespace specd::gguf

#endif  // SPECD_COMMON_GGUF_GGUF_WRITER_H_
