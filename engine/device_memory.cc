#include "engine/device_memory.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/gguf/ggml_type.h"
#include "engine/backend.h"

namespace specd::engine {
namespace {

class PlainHostMemory final : public DeviceMemory {
 public:
  bool host_addressable() const override { return true; }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrFormat("cannot allocate %d bytes", bytes));
    }
    std::memset(p, 0, rounded == 0 ? 64 : rounded);
    return p;
  }
  void Free(void* p) override { std::free(p); }
  absl::Status Upload(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Download(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Copy2D(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                      size_t width, size_t rows) override {
    for (size_t r = 0; r < rows; ++r) {
      std::memcpy(static_cast<uint8_t*>(dst) + r * dst_pitch,
                  static_cast<const uint8_t*>(src) + r * src_pitch, width);
    }
    return absl::OkStatus();
  }
};

}  // namespace

DeviceMemory& HostMemory() {
  static PlainHostMemory* const memory = new PlainHostMemory();
  return *memory;
}

absl::Status CopyWeightTo(DeviceMemory& memory, kernels::WeightMatrix* w, WeightStorage* keep) {
  absl::StatusOr<uint64_t> row_bytes = gguf::RowBytes(w->type, w->cols);
  if (!row_bytes.ok()) return row_bytes.status();
  // Staged on the host so a column slice (a tensor-parallel shard: rows shorter than their
  // stride) lands compact.
  std::vector<uint8_t> staged(static_cast<size_t>(*row_bytes * w->rows));
  for (int64_t r = 0; r < w->rows; ++r) {
    std::memcpy(staged.data() + r * *row_bytes, w->data + r * w->row_bytes, *row_bytes);
  }
  absl::StatusOr<DeviceBuffer> buf = DeviceBuffer::Allocate(memory, staged.size());
  if (!buf.ok()) return buf.status();
  absl::Status st = memory.Upload(buf->data(), staged.data(), staged.size());
  if (!st.ok()) return st;
  w->data = buf->as<const uint8_t>();
  w->row_bytes = *row_bytes;
  w->packed = nullptr;
  keep->device.push_back(*std::move(buf));
  return absl::OkStatus();
}

absl::Status CopyVectorTo(DeviceMemory& memory, const float** v, int64_t n, WeightStorage* keep) {
  if (*v == nullptr) return absl::OkStatus();
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  absl::StatusOr<DeviceBuffer> buf = DeviceBuffer::Allocate(memory, bytes);
  if (!buf.ok()) return buf.status();
  absl::Status st = memory.Upload(buf->data(), *v, bytes);
  if (!st.ok()) return st;
  *v = buf->as<const float>();
  keep->device.push_back(*std::move(buf));
  return absl::OkStatus();
}

}  // namespace specd::engine
