// Backend over the fast CPU kernels (runtime SIMD dispatch, thread pool).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/backend.h"
#include "kernels/cpu/matmul_exact.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"

namespace specd::engine {
namespace {

// The step PlanAttention was given (host arrays, valid through the step).
struct PlannedAttention {
  const int32_t* positions = nullptr;
  const int32_t* const* block_tables = nullptr;
  int64_t T = 0;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : pool_(threads) {}
  void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t, int64_t)> fn) override {
    pool_.ParallelFor(n, [&](int64_t b, int64_t e) { fn(b, e); });
  }
  std::string_view name() const override { return "cpu"; }
  absl::Status PlaceWeight(kernels::WeightMatrix* w, WeightUse use,
                           WeightStorage* keep) override {
    // The matrix stays in the file mapping; quantized ones that MatMul reads get a copy in
    // the lane layout.
    if (use != WeightUse::kMatMul && use != WeightUse::kTableAndMatMul) return absl::OkStatus();
    if (!kernels::cpu::PackingEnabled()) return absl::OkStatus();
    // Every step streams the packed copies through in full: they go on huge pages.
    const int64_t bytes = kernels::cpu::PackedWeightBytes(*w);
    if (bytes == 0) return absl::OkStatus();  // a type without a packed layout
    absl::StatusOr<uint8_t*> out = keep->packed.Allocate(static_cast<size_t>(bytes));
    if (!out.ok()) return out.status();
    kernels::cpu::PackWeight(*w, *out);
    w->packed = *out;
    return absl::OkStatus();
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
    // Every layer's q and k of a step turn by the same angles: their cos and sin once a step.
    if (!rope_.ready || rope_.positions != positions || rope_.T != T || rope_.params != &params) {
      const size_t n = static_cast<size_t>(T) * static_cast<size_t>(params.rope_dim / 2);
      if (rope_.cs.size() < n) {
        rope_.cs.resize(n);
        rope_.sn.resize(n);
      }
      kernels::cpu::RopeAngles(pool_, T, positions, params, rope_.cs.data(), rope_.sn.data());
      rope_.ready = true;
      rope_.positions = positions;
      rope_.T = T;
      rope_.params = &params;
    }
    kernels::cpu::RopeRotate(pool_, x, T, static_cast<int32_t>(H), static_cast<int32_t>(head_dim),
                             rope_.cs.data(), rope_.sn.data(), params);
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
  void GatherRows(const float* x, const int32_t* rows, int64_t R, int64_t D,
                  float* out) override {
    for (int64_t r = 0; r < R; ++r) std::copy_n(x + rows[r] * D, D, out + r * D);
  }
  void WriteKv(const float* k, const float* v, const int64_t* slots, int64_t T,
               const kernels::PagedKvLayer& layer) override {
    kernels::cpu::WriteKv(pool_, k, v, T, slots, layer);
  }
  absl::Status PlanAttention(const int32_t* positions, const int32_t* const* block_tables,
                             int64_t T, int32_t /*num_kv_heads*/, int32_t /*block_size*/) override {
    // The CPU kernel splits its work per call, from the host arrays themselves.
    step_ = {positions, block_tables, T};
    rope_.ready = false;  // a new step: new positions behind the same pointer
    return absl::OkStatus();
  }
  void PagedAttention(const float* q, int64_t Hq, const kernels::PagedKvLayer& layer,
                      float scale, float* out) override {
    kernels::cpu::PagedAttention(pool_, q, step_.T, static_cast<int32_t>(Hq), step_.positions,
                                 step_.block_tables, layer, scale, out);
  }

 private:
  kernels::cpu::ThreadPool pool_;
  PlannedAttention step_;
  // The step's RoPE angles: cs, sn [T, rope_dim / 2] for these positions and parameters.
  struct RopeAngles {
    bool ready = false;
    const int32_t* positions = nullptr;
    int64_t T = 0;
    const kernels::RopeParams* params = nullptr;
    std::vector<float> cs, sn;
  } rope_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace specd::engine
