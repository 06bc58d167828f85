// The packed weights' host memory (engine/huge_page_arena.h): aligned, zeroed, disjoint
// allocations in huge-page-aligned chunks, and the CPU backend placing packed copies there.
#include "engine/huge_page_arena.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/backend_factory.h"
#include "gtest/gtest.h"
#include "kernels/cpu/ops.h"

namespace specd::engine {
namespace {

uintptr_t Addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

TEST(HugePageArenaTest, AllocationsAreAlignedZeroedAndDisjoint) {
  HugePageArena arena;
  std::mt19937 rng(7);
  std::vector<std::pair<uint8_t*, size_t>> got;
  for (int i = 0; i < 200; ++i) {
    const size_t bytes = std::uniform_int_distribution<size_t>(0, 1 << 20)(rng);
    absl::StatusOr<uint8_t*> p = arena.Allocate(bytes);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(Addr(*p) % HugePageArena::kAlign, 0u) << "allocation " << i;
    for (size_t b = 0; b < bytes; b += 4093) ASSERT_EQ((*p)[b], 0) << "allocation " << i << " byte " << b;
    std::memset(*p, 0xA5, bytes);  // writable through its last byte
    got.emplace_back(*p, bytes);
  }
  // ~100 MB in 32 MiB chunks: more than one chunk, each starting on a huge page.
  EXPECT_GE(arena.chunks(), 3u);
  for (size_t i = 0; i < got.size(); ++i) {
    const int c = arena.chunk_of(got[i].first);
    ASSERT_GE(c, 0) << "allocation " << i << " outside the arena";
    if (i == 0 || arena.chunk_of(got[i - 1].first) != c) {
      EXPECT_EQ(Addr(got[i].first) % HugePageArena::kHugePage, 0u) << "chunk " << c << " start";
    }
    if (i > 0 && arena.chunk_of(got[i - 1].first) == c) {
      EXPECT_GE(Addr(got[i].first), Addr(got[i - 1].first) + got[i - 1].second) << "overlap at " << i;
    }
  }
}

TEST(HugePageArenaTest, ALargeRequestGetsAChunkOfItsOwn) {
  HugePageArena arena;
  ASSERT_TRUE(arena.Allocate(100).ok());
  const size_t big = HugePageArena::kChunkBytes + 3 * HugePageArena::kHugePage + 5;
  absl::StatusOr<uint8_t*> p = arena.Allocate(big);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(arena.chunks(), 2u);
  std::memset(*p, 1, big);
  EXPECT_EQ(arena.chunk_of(*p + big - 1), 1);
}

TEST(HugePageArenaTest, MovingKeepsTheMemory) {
  HugePageArena a;
  absl::StatusOr<uint8_t*> p = a.Allocate(4096);
  ASSERT_TRUE(p.ok());
  std::memset(*p, 42, 4096);
  HugePageArena b = std::move(a);
  EXPECT_EQ(a.chunks(), 0u);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  EXPECT_EQ(b.chunks(), 1u);
  EXPECT_EQ(b.chunk_of(*p), 0);
  EXPECT_EQ((*p)[4095], 42);
}

// Where the kernel has transparent huge pages at all, it takes the advice for every chunk.
TEST(HugePageArenaTest, EveryChunkIsAdvisedWhereTheKernelHasHugePages) {
  std::ifstream mode("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  const bool thp = static_cast<bool>(std::getline(mode, line));
  HugePageArena arena;
  ASSERT_TRUE(arena.Allocate(HugePageArena::kChunkBytes).ok());
  ASSERT_TRUE(arena.Allocate(HugePageArena::kChunkBytes).ok());
  ASSERT_EQ(arena.chunks(), 2u);
  if (thp) {
    EXPECT_EQ(arena.advised_chunks(), 2u) << "THP mode: " << line;
  } else {
    std::printf("no transparent huge pages in this kernel: %zu of 2 chunks advised\n", arena.advised_chunks());
  }
}

// The CPU backend puts a quantized matrix's packed copy in the model's arena, written as
// PackWeight writes it.
TEST(HugePageArenaTest, CpuBackendPacksIntoTheArena) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend("cpu", 1);
  ASSERT_TRUE(backend.ok()) << backend.status();
  // Q4_1: 20-byte blocks of 32 values; 40 rows x 128 columns (4 blocks a row).
  const int64_t rows = 40, cols = 128, row_bytes = 4 * 20;
  std::vector<uint8_t> data(static_cast<size_t>(rows * row_bytes));
  std::mt19937 rng(3);
  for (uint8_t& b : data) b = static_cast<uint8_t>(rng() & 0x3F);  // f16 halves stay finite
  kernels::WeightMatrix w{gguf::GgmlType::kQ4_1, data.data(), rows, cols, static_cast<uint64_t>(row_bytes)};
  WeightStorage keep;
  ASSERT_TRUE((*backend)->PlaceWeight(&w, WeightUse::kMatMul, &keep).ok());
  if (!kernels::cpu::PackingEnabled()) {  // the generic ISA, or SPECD_KERNELS_PACK=0
    EXPECT_EQ(w.packed, nullptr);
    EXPECT_EQ(keep.packed.chunks(), 0u);
    return;
  }
  ASSERT_NE(w.packed, nullptr);
  EXPECT_EQ(keep.packed.chunk_of(w.packed), 0);
  EXPECT_TRUE(keep.host.empty());
  const int64_t bytes = kernels::cpu::PackedWeightBytes(w);
  std::vector<uint8_t> want(static_cast<size_t>(bytes) + 64);
  auto* aligned = reinterpret_cast<uint8_t*>((Addr(want.data()) + 63) & ~uintptr_t{63});
  kernels::cpu::PackWeight(w, aligned);
  EXPECT_EQ(std::memcmp(w.packed, aligned, static_cast<size_t>(bytes)), 0);
}

}  // namespace
}  // namespace specd::engine
