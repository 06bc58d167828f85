#include "engine/device_memory.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_format.h"
#include "engine/huge_page_arena.h"

namespace specd::engine {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

class PlainHostMemory final : public DeviceMemory {
 public:
  bool host_addressable() const override { return true; }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    const size_t rounded = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
    // A buffer of a huge page or more (a layer's KV pool) starts on a huge page, and its whole
    // huge pages are advised onto them (the tail stays on 4 KB pages: nothing is allocated
    // beyond the buffer). Attention at depth streams the whole pool every step; on 4 KB pages
    // it misses the TLB once per 4 KB.
    const bool huge = rounded >= kHugePage;
    // posix_memalign: aligned_alloc wants the size a multiple of the alignment (ASan checks).
    void* p = nullptr;
    if (posix_memalign(&p, huge ? kHugePage : 64, rounded) != 0) p = nullptr;
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrFormat("cannot allocate %d bytes", bytes));
    }
    // Advice only: where the kernel declines, the buffer works on 4 KB pages.
    if (huge) static_cast<void>(AdviseHugePages(p, rounded / kHugePage * kHugePage));
    std::memset(p, 0, rounded);
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
