// Reader for GGUF v2/v3 model files: metadata, tensor infos, mmap'd tensor data.
#ifndef SPECD_COMMON_GGUF_GGUF_FILE_H_
#define SPECD_COMMON_GGUF_GGUF_FILE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/gguf/ggml_type.h"
#include "common/gguf/gguf_value.h"

namespace specd::gguf {

struct TensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the fastest-varying (row length)
  GgmlType type;
  uint64_t offset;            // relative to the start of the tensor data section
  uint64_t num_bytes;
  int64_t num_elements;
  const uint8_t* data;        // points into the mapping; valid while the GgufFile lives
};

class GgufFile {
 public:
  // Maps the file read-only; tensor data is never copied.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses an in-memory image (the caller keeps `bytes` alive). Used by fuzzing and tests.
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBuffer(absl::Span<const uint8_t> bytes);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return size_; }
  const std::string& path() const { return path_; }
  // Absolute byte offset of the tensor data section (header end rounded up to alignment()).
  uint64_t data_offset() const { return data_offset_; }

  // Metadata, in file order.
  const std::vector<std::pair<std::string, Value>>& metadata() const { return metadata_; }
  const Value* Find(std::string_view key) const;  // nullptr if absent

  // Typed getters: NOT_FOUND naming the key when absent, INVALID_ARGUMENT naming the
  // key when the stored type does not fit. GetInt accepts any integer type that fits.
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;  // float32/float64/integers
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  absl::StatusOr<std::vector<float>> GetFloatArray(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* FindTensor(std::string_view name) const;  // nullptr if absent

 private:
  GgufFile() = default;
  absl::Status Parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* mapping_ = nullptr;  // non-null when we own an mmap
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, Value>> metadata_;
  std::vector<TensorInfo> tensors_;
  uint64_t data_offset_ = 0;
  // Name -> index into metadata_ / tensors_ (also how duplicates are detected).
  absl::flat_hash_map<std::string, size_t> key_index_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
};

}  // namespace specd::gguf

#endif  // SPECD_COMMON_GGUF_GGUF_FILE_H_
