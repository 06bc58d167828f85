// CPU kernel benchmarks: MatMul per weight type on the SmolLM2-135M shapes, as GB/s of
// weight bytes, next to a memory read bandwidth baseline measured in the same run.
//
//   kernel_bench [--benchmark_filter=...]
//
// Weights are replicated over >= 128 MB of copies that the benchmark cycles through,
// so every iteration streams its weights from DRAM as a real forward pass does (one
// 576x576 Q4_1 matrix alone would sit in L2). `frac_of_membw` is the MatMul's weight
// GB/s over the streaming-read GB/s measured with the same thread count.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kernel_types.h"
#include "kernels/ref/ops.h"

namespace specd::kernels {
namespace {

using gguf::GgmlType;

constexpr int64_t kStreamBytes = int64_t{256} << 20;
constexpr int64_t kWeightSetBytes = int64_t{128} << 20;

std::map<int, double>& MemBw() {  // threads -> bytes/s
  static std::map<int, double> m;
  return m;
}

cpu::ThreadPool& Pool(int threads) {
  static std::map<int, std::unique_ptr<cpu::ThreadPool>> pools;
  auto& p = pools[threads];
  if (!p) p = std::make_unique<cpu::ThreadPool>(threads);
  return *p;
}

// Streaming read: sum of 64-bit words over a 256 MB buffer.
void BM_MemRead(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  static std::vector<uint64_t> buf(kStreamBytes / 8, 1);
  cpu::ThreadPool& pool = Pool(threads);
  const int64_t n = static_cast<int64_t>(buf.size());
  std::vector<uint64_t> partial(64 * 8);
  for (auto _ : state) {
    pool.ParallelFor(threads, [&](int64_t b, int64_t e) {
      for (int64_t part = b; part < e; ++part) {
        const int64_t lo = n * part / threads, hi = n * (part + 1) / threads;
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (int64_t i = lo; i + 4 <= hi; i += 4) {
          s0 += buf[i];
          s1 += buf[i + 1];
          s2 += buf[i + 2];
          s3 += buf[i + 3];
        }
        partial[part * 8] = s0 + s1 + s2 + s3;
      }
    });
    benchmark::DoNotOptimize(partial.data());
  }
  state.SetBytesProcessed(state.iterations() * kStreamBytes);
  state.counters["threads"] = threads;
}

struct TypeSpec {
  GgmlType type;
  int64_t block, bytes;
};

TypeSpec Spec(GgmlType t) {
  switch (t) {
    case GgmlType::kF32: return {t, 1, 4};
    case GgmlType::kF16: return {t, 1, 2};
    case GgmlType::kBF16: return {t, 1, 2};
    case GgmlType::kQ8_0: return {t, 32, 34};
    case GgmlType::kQ4_0: return {t, 32, 18};
    case GgmlType::kQ4_1: return {t, 32, 20};
    case GgmlType::kQ4_K: return {t, 256, 144};
    case GgmlType::kQ6_K: return {t, 256, 210};
    default: return {t, 1, 4};
  }
}

// Random but valid weight bytes (small f16 scales so outputs stay finite).
std::vector<uint8_t> MakeWeights(GgmlType t, int64_t rows, int64_t cols, uint64_t* row_bytes) {
  const TypeSpec s = Spec(t);
  *row_bytes = static_cast<uint64_t>(cols / s.block * s.bytes);
  std::vector<uint8_t> w(*row_bytes * rows);
  std::mt19937 rng(42);
  for (auto& b : w) b = static_cast<uint8_t>(rng() & 0xFF);
  const uint16_t small = ref::F32ToF16(0.01f);
  auto put = [&](size_t off) { std::memcpy(&w[off], &small, 2); };
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < cols / s.block; ++b) {
      const size_t off = r * *row_bytes + b * s.bytes;
      switch (t) {
        case GgmlType::kF16:
        case GgmlType::kBF16: put(off); break;
        case GgmlType::kF32: {
          const float f = 0.01f;
          std::memcpy(&w[off], &f, 4);
          break;
        }
        case GgmlType::kQ8_0:
        case GgmlType::kQ4_0: put(off); break;
        case GgmlType::kQ4_1:
        case GgmlType::kQ4_K: put(off); put(off + 2); break;
        case GgmlType::kQ6_K: put(off + 208); break;
        default: break;
      }
    }
  }
  return w;
}

// Copies of one weight matrix totalling >= kWeightSetBytes.
struct WeightSet {
  std::vector<uint8_t> bytes;
  std::vector<WeightMatrix> mats;
  uint64_t matrix_bytes = 0;
};

WeightSet MakeSet(GgmlType t, int64_t rows, int64_t cols) {
  uint64_t rb;
  std::vector<uint8_t> one = MakeWeights(t, rows, cols, &rb);
  WeightSet s;
  s.matrix_bytes = one.size();
  const int64_t copies = (kWeightSetBytes + one.size() - 1) / one.size();
  s.bytes.resize(one.size() * copies);
  for (int64_t c = 0; c < copies; ++c) {
    std::memcpy(s.bytes.data() + c * one.size(), one.data(), one.size());
  }
  for (int64_t c = 0; c < copies; ++c) {
    s.mats.push_back(WeightMatrix{t, s.bytes.data() + c * one.size(), rows, cols, rb});
  }
  return s;
}

void Finish(benchmark::State& state, uint64_t bytes_per_iter, int threads, int64_t T) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes_per_iter));
  state.SetItemsProcessed(state.iterations() * T);  // activation rows (tokens)
  const auto it = MemBw().find(threads);
  if (it != MemBw().end() && it->second > 0) {
    // bytes/s of this run relative to the measured streaming read.
    state.counters["frac_of_membw"] = benchmark::Counter(
        static_cast<double>(bytes_per_iter) / it->second,
        benchmark::Counter::kIsIterationInvariantRate);
  }
}

// args: type, rows, cols, T, threads
void BM_MatMul(benchmark::State& state) {
  const auto type = static_cast<GgmlType>(state.range(0));
  const int64_t rows = state.range(1), cols = state.range(2), T = state.range(3);
  const int threads = static_cast<int>(state.range(4));
  WeightSet set = MakeSet(type, rows, cols);
  std::vector<float> x(T * cols), y(T * rows);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& v : x) v = u(rng);
  cpu::ThreadPool& pool = Pool(threads);
  size_t i = 0;
  for (auto _ : state) {
    cpu::MatMul(pool, set.mats[i], x.data(), T, y.data());
    benchmark::DoNotOptimize(y.data());
    if (++i == set.mats.size()) i = 0;
  }
  Finish(state, set.matrix_bytes, threads, T);
  state.SetLabel(std::string(cpu::IsaName(cpu::ActiveIsa())));
}

// All seven projections of one SmolLM2-135M layer (Q4_1), 30 layers deep in memory.
// items/s = tokens/s through the layer stack's matmuls alone (head excluded):
// tok/s of the model's matmuls ~= items_per_second / 30.
void BM_SmolLayer(benchmark::State& state) {
  const int64_t T = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  constexpr int kLayers = 30;
  const int64_t shapes[7][2] = {{576, 576}, {192, 576}, {192, 576}, {576, 576},
                                {1536, 576}, {1536, 576}, {576, 1536}};
  std::vector<std::vector<uint8_t>> store;
  std::vector<WeightMatrix> mats;
  uint64_t layer_bytes = 0;
  for (int l = 0; l < kLayers; ++l) {
    for (auto& s : shapes) {
      uint64_t rb;
      store.push_back(MakeWeights(GgmlType::kQ4_1, s[0], s[1], &rb));
      mats.push_back(WeightMatrix{GgmlType::kQ4_1, store.back().data(), s[0], s[1], rb});
      if (l == 0) layer_bytes += store.back().size();
    }
  }
  std::vector<float> x(T * 1536), y(T * 1536);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& v : x) v = u(rng);
  cpu::ThreadPool& pool = Pool(threads);
  int layer = 0;
  for (auto _ : state) {
    for (int m = 0; m < 7; ++m) cpu::MatMul(pool, mats[layer * 7 + m], x.data(), T, y.data());
    benchmark::DoNotOptimize(y.data());
    if (++layer == kLayers) layer = 0;
  }
  Finish(state, layer_bytes, threads, T);
}

void RegisterAll() {
  for (int threads : {1, 2}) {
    benchmark::RegisterBenchmark("BM_MemRead", BM_MemRead)->Arg(threads)->UseRealTime()->Unit(benchmark::kMillisecond);
  }
  const int64_t smol[][2] = {{576, 576}, {192, 576}, {1536, 576}, {576, 1536}};
  const GgmlType qtypes[] = {GgmlType::kQ4_1, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kF16};
  for (int threads : {1, 2}) {
    for (GgmlType t : qtypes) {
      for (auto& s : smol) {
        for (int64_t T : {1, 4, 5, 16}) {
          benchmark::RegisterBenchmark("BM_MatMul", BM_MatMul)
              ->Args({static_cast<int64_t>(t), s[0], s[1], T, threads})
              ->ArgNames({"type", "rows", "cols", "T", "thr"})
              ->UseRealTime();
        }
      }
    }
    // Tied output head (Q8_0 49152 x 576), and as the F16 re-encoded target has it.
    for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kF16}) {
      for (int64_t T : {1, 4, 5, 16}) {
        benchmark::RegisterBenchmark("BM_MatMul_head", BM_MatMul)
            ->Args({static_cast<int64_t>(t), 49152, 576, T, threads})
            ->ArgNames({"type", "rows", "cols", "T", "thr"})
            ->UseRealTime();
      }
    }
    // K-quants need cols % 256 == 0.
    for (GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ6_K}) {
      for (int64_t T : {1, 4, 16}) {
        benchmark::RegisterBenchmark("BM_MatMul_kquant", BM_MatMul)
            ->Args({static_cast<int64_t>(t), 576, 1536, T, threads})
            ->ArgNames({"type", "rows", "cols", "T", "thr"})
            ->UseRealTime();
      }
    }
    for (int64_t T : {1, 16, 128}) {
      benchmark::RegisterBenchmark("BM_SmolLayer", BM_SmolLayer)
          ->Args({T, threads})
          ->ArgNames({"T", "thr"})
          ->UseRealTime();
    }
  }
}

// Runs the bandwidth baseline first so the MatMul runs can report frac_of_membw.
class BwReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.benchmark_name().rfind("BM_MemRead", 0) == 0 && r.real_accumulated_time > 0) {
        const double bps = static_cast<double>(kStreamBytes) * r.iterations / r.real_accumulated_time;
        const auto it = r.counters.find("threads");
        if (it != r.counters.end()) MemBw()[static_cast<int>(it->second.value)] = bps;
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

}  // namespace
}  // namespace specd::kernels

int main(int argc, char** argv) {
  specd::kernels::RegisterAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  specd::kernels::BwReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
