#include "engine/device_memory.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_format.h"

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

}  // namespace specd::engine
