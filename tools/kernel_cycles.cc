// kernel_cycles: compute cost of the CPU MatMul kernels in TSC cycles per 32-value block,
// robust to a loaded machine (minimum over many repetitions; a preempted repetition
// only ever looks slower).
//
//   kernel_cycles [--reps N] [--isa generic|avx2|avx512vnni|avxvnni|...] [--no-dram]
//                 [--type Q4_1] [-T 16]
//                 [--packed]   (Q4_1 / Q4_0 read from cpu::PackWeight's layout, as the engine loads them)
//
// One thread, weights resident in L2 (a 192 x 768 matrix and one of 384 rows), so the figure is the
// kernel's own cost, not DRAM's. For each weight type and T it prints
//   cyc/blk  = cycles / (rows * cols/32 * T)      (per block dot product)
//   cyc/wblk = cycles / (rows * cols/32)          (per weight block, all T rows)
//   tile/wblk = what each further weight block adds:
//               (cycles at 2 * rows - cycles) / (rows * cols/32)
//   per call  = the rest, paid once a call whatever the rows: quantizing the T activation rows
//               and the dispatch (a quarter of cyc/wblk's figure at T = 5 on the Intel VM of
//               2026-12-07), so tile/wblk is the kernel's own cost
// and the same for one whole MatMul streaming from a >= 128 MB set of copies
// ("dram", the decode-like case), plus ParallelFor overhead of the pool.
#include <x86intrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/huge_page_arena.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kernel_types.h"
#include "kernels/ref/ops.h"

namespace specd::kernels {
namespace {

using gguf::GgmlType;

struct TypeSpec {
  GgmlType type;
  const char* name;
  int64_t block, bytes;
};

std::vector<uint8_t> MakeWeights(const TypeSpec& s, int64_t rows, int64_t cols, uint64_t* rb) {
  *rb = static_cast<uint64_t>(cols / s.block * s.bytes);
  std::vector<uint8_t> w(*rb * rows);
  std::mt19937 rng(42);
  for (auto& b : w) b = static_cast<uint8_t>(rng() & 0xFF);
  const uint16_t small = ref::F32ToF16(0.01f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < cols / s.block; ++b) {
      uint8_t* p = w.data() + r * *rb + b * s.bytes;
      switch (s.type) {
        case GgmlType::kQ8_0: case GgmlType::kQ4_0: std::memcpy(p, &small, 2); break;
        case GgmlType::kQ4_1: case GgmlType::kQ4_K:
          std::memcpy(p, &small, 2);
          std::memcpy(p + 2, &small, 2);
          break;
        case GgmlType::kQ6_K: std::memcpy(p + 208, &small, 2); break;
        default: break;
      }
    }
  }
  return w;
}

template <class F>
uint64_t MinCycles(int reps, F&& f) {
  uint64_t best = ~uint64_t{0};
  for (int r = 0; r < reps; ++r) {
    const uint64_t t0 = __rdtsc();
    f();
    const uint64_t t1 = __rdtsc();
    best = std::min(best, t1 - t0);
  }
  return best;
}

int Main(int argc, char** argv) {
  int reps = 200;
  bool dram = true;
  bool packed = false;
  std::string only_type;
  int64_t only_t = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--packed") {
      packed = true;
    } else if (a == "--no-dram") {
      dram = false;
    } else if (a == "--type" && i + 1 < argc) {
      only_type = argv[++i];
    } else if (a == "-T" && i + 1 < argc) {
      only_t = std::atoi(argv[++i]);
    } else if (a == "--isa" && i + 1 < argc) {
      const std::string v = argv[++i];
      bool found = false;
      for (cpu::Isa isa : cpu::AllIsas()) {
        if (v != cpu::IsaName(isa)) continue;
        found = true;
        if (!cpu::IsaSupported(isa)) {
          std::fprintf(stderr, "--isa %s: not supported on this CPU\n", v.c_str());
          return 2;
        }
        cpu::SetIsa(isa);
      }
      if (!found) {
        std::fprintf(stderr, "--isa %s: unknown (generic, avx2, avx512vnni, vnni_emulated, avxvnni, "
                     "avxvnni_emulated)\n", v.c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: kernel_cycles [--reps N] [--isa generic|avx2|avx512vnni|avxvnni|...] "
                   "[--no-dram] [--type Q4_1] [-T 16] [--packed]\n");
      return 2;
    }
  }
  std::printf("isa %s, TSC cycles, min of %d reps\n", cpu::IsaName(cpu::ActiveIsa()), reps);
  cpu::ThreadPool pool1(1);
  const TypeSpec types[] = {{GgmlType::kQ4_1, "Q4_1", 32, 20}, {GgmlType::kQ8_0, "Q8_0", 32, 34},
                            {GgmlType::kQ4_0, "Q4_0", 32, 18}, {GgmlType::kQ4_K, "Q4_K", 256, 144},
                            {GgmlType::kQ6_K, "Q6_K", 256, 210}};
  const int64_t rows = 192, cols = 1536 / 2;  // 768: a multiple of 256 for the K-quants
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> x(64 * 1536), y(64 * 49152);
  for (auto& v : x) v = u(rng);
  std::printf("%-5s %4s %9s %9s %10s %9s\n", "type", "T", "cyc/blk", "cyc/wblk", "tile/wblk",
              "per call");
  for (const TypeSpec& s : types) {
    if (!only_type.empty() && only_type != s.name) continue;
    // The matrix, and one of twice its rows for the tile's own cost (see the top).
    uint64_t rb;
    std::vector<uint8_t> wb = MakeWeights(s, rows, cols, &rb);
    std::vector<uint8_t> wb2 = MakeWeights(s, 2 * rows, cols, &rb);
    WeightMatrix w{s.type, wb.data(), rows, cols, rb}, w2{s.type, wb2.data(), 2 * rows, cols, rb};
    std::unique_ptr<uint8_t[]> pb = packed ? cpu::PackWeightCopy(&w) : nullptr;
    std::unique_ptr<uint8_t[]> pb2 = packed ? cpu::PackWeightCopy(&w2) : nullptr;
    for (int64_t T : {1, 2, 3, 4, 5, 6, 8, 9, 16, 64}) {
      if (only_t > 0 && T != only_t) continue;
      const uint64_t c = MinCycles(reps, [&] { cpu::MatMul(pool1, w, x.data(), T, y.data()); });
      const uint64_t c2 = MinCycles(reps, [&] { cpu::MatMul(pool1, w2, x.data(), T, y.data()); });
      const double wblk = static_cast<double>(rows) * (cols / 32);
      const double tile = (static_cast<double>(c2) - static_cast<double>(c)) / wblk;
      std::printf("%-5s %4lld %9.2f %9.2f %10.2f %9.0f\n", s.name, static_cast<long long>(T),
                  c / (wblk * T), c / wblk, tile, static_cast<double>(c) - tile * wblk);
    }
  }
  // Streaming (copies rotated through ~128 MB): Q4_1 576 x 1536 and 1536 x 576 and the Q8_0
  // head, T = 1, 2, 3, 5 (the verifications of k = 1, 2, 4 drafts) and 16, one and two threads.
  cpu::ThreadPool pool2(2);
  struct Stream {
    TypeSpec s;
    int64_t rows, cols;
  } streams[] = {{types[0], 576, 1536}, {types[0], 1536, 576}, {types[1], 49152, 576}};
  for (const Stream& st : streams) {
    if (!dram) break;
    uint64_t rb;
    std::vector<uint8_t> one = MakeWeights(st.s, st.rows, st.cols, &rb);
    const int64_t copies = std::max<int64_t>(2, (int64_t{128} << 20) / one.size() + 1);
    std::vector<uint8_t> all(one.size() * copies);
    for (int64_t c = 0; c < copies; ++c) std::memcpy(all.data() + c * one.size(), one.data(), one.size());
    // The packed copies on huge pages, as the engine places them (engine/huge_page_arena.h).
    engine::HugePageArena packs;
    std::vector<const uint8_t*> packed_at(copies, nullptr);
    for (int64_t c = 0; packed && c < copies; ++c) {
      WeightMatrix copy{st.s.type, all.data() + c * one.size(), st.rows, st.cols, rb};
      absl::StatusOr<uint8_t*> at = packs.Allocate(static_cast<size_t>(cpu::PackedWeightBytes(copy)));
      if (!at.ok()) {
        std::fprintf(stderr, "kernel_cycles: %s\n", std::string(at.status().message()).c_str());
        return 1;
      }
      cpu::PackWeight(copy, *at);
      packed_at[c] = *at;
    }
    for (int threads : {1, 2}) {
      cpu::ThreadPool& pool = threads == 1 ? pool1 : pool2;
      for (int64_t T : {1, 2, 3, 5, 16}) {
        int64_t i = 0;
        const uint64_t c = MinCycles(std::max(8, reps / 4), [&] {
          WeightMatrix w{st.s.type, all.data() + (i % copies) * one.size(), st.rows, st.cols, rb};
          w.packed = packed_at[i++ % copies];
          cpu::MatMul(pool, w, x.data(), T, y.data());
        });
        const double wblk = static_cast<double>(st.rows) * (st.cols / 32);
        std::printf("dram %s %lldx%lld thr=%d T=%lld: %9.0f cyc  %6.2f cyc/wblk  %6.2f B/cyc\n",
                    st.s.name, static_cast<long long>(st.rows), static_cast<long long>(st.cols),
                    threads, static_cast<long long>(T), static_cast<double>(c), c / wblk,
                    one.size() / static_cast<double>(c));
      }
    }
  }
  // Pool overhead: an empty ParallelFor over 2 threads.
  const uint64_t pf = MinCycles(reps * 10, [&] { pool2.ParallelFor(2, [](int64_t, int64_t) {}); });
  std::printf("ParallelFor(2 threads, empty): %llu cyc (min)\n", static_cast<unsigned long long>(pf));
  return 0;
}

}  // namespace
}  // namespace specd::kernels

int main(int argc, char** argv) { return specd::kernels::Main(argc, argv); }
