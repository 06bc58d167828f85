// Host memory for what a step streams through in full (the packed weights): bump-allocated from
// chunks aligned to 2 MiB and advised as transparent huge pages (madvise MADV_HUGEPAGE), so the
// ~100 MB of weights a decode step reads sit on ~50 TLB entries instead of ~25,000 4 KiB pages.
// Measured: batch-1 decode 1.06-1.18x on the default model (Zen 4) (docs/PERFORMANCE.md, "Huge pages").
// Where the kernel offers no huge pages (transparent_hugepage=never, or madvise refused) the
// chunks are ordinary anonymous memory and nothing else changes. SPECD_HUGE_PAGES=0 turns the
// advice off.
#ifndef SPECD_ENGINE_HUGE_PAGE_ARENA_H_
#define SPECD_ENGINE_HUGE_PAGE_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace specd::engine {

// Whether host memory is advised as huge pages: yes unless SPECD_HUGE_PAGES=0.
bool HugePagesWanted();
// Advises [p, p + bytes) (p and bytes whole 4 KiB pages) as transparent huge pages, when
// wanted; whether the kernel took the advice.
bool AdviseHugePages(void* p, size_t bytes);

class HugePageArena {
 public:
  static constexpr size_t kHugePage = size_t{2} << 20;
  static constexpr size_t kChunkBytes = size_t{32} << 20;  // a chunk, unless one request is larger
  static constexpr size_t kAlign = 64;                      // every allocation's alignment

  HugePageArena() = default;
  HugePageArena(const HugePageArena&) = delete;
  HugePageArena& operator=(const HugePageArena&) = delete;
  HugePageArena(HugePageArena&& other) noexcept;
  HugePageArena& operator=(HugePageArena&& other) noexcept;
  ~HugePageArena();

  // `bytes` of zeroed memory, kAlign-aligned, valid until the arena is destroyed. Pages are
  // mapped lazily: a chunk's untouched tail costs address space, not memory.
  absl::StatusOr<uint8_t*> Allocate(size_t bytes);

  size_t chunks() const { return chunks_.size(); }
  // Chunks the kernel accepted the huge-page advice for (it may still back them with small
  // pages when memory is fragmented; /proc/PID/smaps AnonHugePages shows what it did).
  size_t advised_chunks() const { return advised_; }
  // The chunk holding p, or -1: for tests.
  int chunk_of(const void* p) const;

 private:
  struct Chunk {
    uint8_t* base = nullptr;  // kHugePage-aligned
    size_t bytes = 0;
    size_t used = 0;
    void* map = nullptr;  // what mmap returned (base rounded up inside it)
    size_t map_bytes = 0;
  };
  void Release();

  std::vector<Chunk> chunks_;
  size_t advised_ = 0;
};

}  // namespace specd::engine

#endif  // SPECD_ENGINE_HUGE_PAGE_ARENA_H_
