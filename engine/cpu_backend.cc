// Backend over the fast CPU kernels (runtime SIMD dispatch, thread pool).
#include <cstdint>
#include <memory>

#include "engine/backend.h"
#include "kernels/cpu/matmul_exact.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"

namespace specd::engine {
namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : pool_(threads) {}
  void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t, int64_t)> fn) override {
    pool_.ParallelFor(n, [&](int64_t b, int64_t e) { fn(b, e); });
  }
  std::string_view name() const override { return "cpu"; }
  std::unique_ptr<uint8_t[]> PackWeight(kernels::WeightMatrix* w) override {
    if (!kernels::cpu::PackingEnabled()) return nullptr;
    return kernels::cpu::PackWeightCopy(w);
  }
  void MatMul(const kernels::WeightMatrix& w, const float* x, int64_t T, float* y) override {
    kernels::cpu::MatMul(pool_, w, x, T, y);
  }
  void MatMulShared(const kernels::WeightMatrix* ws, int n, const float* x, int64_t T,
                    float* const* ys) override {
    kernels::cpu::MatMulShared(pool_, ws, n, x, T, ys);
  }
  void MatMulExact(const kernels::WeightMatrix& w, const float* x, int64_t T,
                   float* y) override {
    kernels::cpu::MatMulExact(pool_, w, x, T, y);
  }
  void RmsNorm(const float* x, const float* w, int64_t T, int64_t D, float eps,
               float* out) override {
    kernels::cpu::RmsNorm(pool_, x, T, D, w, eps, out);
  }
  void Rope(float* x, int64_t T, int64_t H, int64_t head_dim, const int32_t* positions,
            const kernels::RopeParams& params) override {
    kernels::cpu::Rope(pool_, x, T, static_cast<int32_t>(H), static_cast<int32_t>(head_dim),
                       positions, params);
  }
  void SwiGlu(const float* gate, const float* up, int64_t T, int64_t F, float* out) override {
    kernels::cpu::SwiGlu(pool_, gate, up, T, F, out);
  }
  void AddInPlace(float* x, const float* y, int64_t n) override {
    kernels::cpu::AddInPlace(pool_, x, y, n);
  }
  void AddBias(float* x, const float* b, int64_t T, int64_t N) override {
    kernels::cpu::AddBias(pool_, x, T, N, b);
  }
  void EmbeddingLookup(const kernels::WeightMatrix& table, const int32_t* ids, int64_t T,
                       float* out) override {
    kernels::cpu::EmbeddingLookup(pool_, table, ids, T, out);
  }
  void WriteKv(const float* k, const float* v, const int64_t* slots, int64_t T,
               const kernels::PagedKvLayer& layer) override {
    kernels::cpu::WriteKv(pool_, k, v, T, slots, layer);
  }
  void PagedAttention(const float* q, int64_t T, int64_t Hq, const int32_t* positions,
                      const int32_t* const* block_tables, const kernels::PagedKvLayer& layer,
                      float scale, float* out) override {
    kernels::cpu::PagedAttention(pool_, q, T, static_cast<int32_t>(Hq), positions, block_tables,
                                 layer, scale, out);
  }

 private:
  kernels::cpu::ThreadPool pool_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace specd::engine
