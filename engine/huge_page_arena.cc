#include "engine/huge_page_arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <utility>

#include "absl/strings/str_format.h"

namespace specd::engine {

bool HugePagesWanted() {
  static const bool wanted = [] {
    const char* v = std::getenv("SPECD_HUGE_PAGES");
    return v == nullptr || std::string_view(v) != "0";
  }();
  return wanted;
}

bool AdviseHugePages(void* p, size_t bytes) {
  return HugePagesWanted() && madvise(p, bytes, MADV_HUGEPAGE) == 0;
}

HugePageArena::HugePageArena(HugePageArena&& other) noexcept
    : chunks_(std::exchange(other.chunks_, {})), advised_(std::exchange(other.advised_, 0)) {}

HugePageArena& HugePageArena::operator=(HugePageArena&& other) noexcept {
  if (this != &other) {
    Release();
    chunks_ = std::exchange(other.chunks_, {});
    advised_ = std::exchange(other.advised_, 0);
  }
  return *this;
}

HugePageArena::~HugePageArena() { Release(); }

void HugePageArena::Release() {
  for (const Chunk& c : chunks_) {
    // munmap of a range this arena mapped fails only on a bad argument, i.e. a bug here.
    if (munmap(c.map, c.map_bytes) != 0) std::abort();
  }
  chunks_.clear();
  advised_ = 0;
}

absl::StatusOr<uint8_t*> HugePageArena::Allocate(size_t bytes) {
  const size_t need = (bytes == 0 ? kAlign : bytes + kAlign - 1) / kAlign * kAlign;
  if (chunks_.empty() || chunks_.back().bytes - chunks_.back().used < need) {
    // A new chunk: whole huge pages, mapped with one page of slack to align its start.
    const size_t chunk = std::max(kChunkBytes, (need + kHugePage - 1) / kHugePage * kHugePage);
    const size_t map_bytes = chunk + kHugePage;
    void* map = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("cannot map %d bytes of host memory for weights", map_bytes));
    }
    const uintptr_t at = (reinterpret_cast<uintptr_t>(map) + kHugePage - 1) & ~(kHugePage - 1);
    Chunk c{reinterpret_cast<uint8_t*>(at), chunk, 0, map, map_bytes};
    // Advice only: refused (THP off, an old kernel), the chunk is ordinary memory.
    if (AdviseHugePages(c.base, c.bytes)) ++advised_;
    chunks_.push_back(c);
  }
  Chunk& c = chunks_.back();
  uint8_t* p = c.base + c.used;
  c.used += need;
  return p;
}

int HugePageArena::chunk_of(const void* p) const {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < chunks_.size(); ++i) {
    if (b >= chunks_[i].base && b < chunks_[i].base + chunks_[i].bytes) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace specd::engine
