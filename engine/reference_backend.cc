// Backend over the plain-loop reference kernels: the model-level twin of the fast backends.
#include "engine/backend.h"
#include "kernels/ref/matmul_exact.h"
#include "kernels/ref/ops.h"

namespace specd::engine {
namespace {

class ReferenceBackend final : public Backend {
 public:
  std::string_view name() const override { return "ref"; }
  void MatMul(const kernels::WeightMatrix& w, const float* x, int64_t T, float* y) override {
    kernels::ref::MatMul(w, x, T, y);
  }
  void MatMulExact(const kernels::WeightMatrix& w, const float* x, int64_t T,
                   float* y) override {
    kernels::ref::MatMulExact(w, x, T, y);
  }
  void RmsNorm(const float* x, const float* w, int64_t T, int64_t D, float eps,
               float* out) override {
    kernels::ref::RmsNorm(x, T, D, w, eps, out);
  }
  void Rope(float* x, int64_t T, int64_t H, int64_t head_dim, const int32_t* positions,
            const kernels::RopeParams& params) override {
    kernels::ref::Rope(x, T, static_cast<int32_t>(H), static_cast<int32_t>(head_dim), positions,
                       params);
  }
  void SwiGlu(const float* gate, const float* up, int64_t T, int64_t F, float* out) override {
    kernels::ref::SwiGlu(gate, up, T, F, out);
  }
  void AddInPlace(float* x, const float* y, int64_t n) override {
    kernels::ref::AddInPlace(x, y, n);
  }
  void AddBias(float* x, const float* b, int64_t T, int64_t N) override {
    kernels::ref::AddBias(x, T, N, b);
  }
  void EmbeddingLookup(const kernels::WeightMatrix& table, const int32_t* ids, int64_t T,
                       float* out) override {
    kernels::ref::EmbeddingLookup(table, ids, T, out);
  }
  void GatherRows(const float* x, const int32_t* rows, int64_t R, int64_t D,
                  float* out) override {
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t i = 0; i < D; ++i) out[r * D + i] = x[rows[r] * D + i];
    }
  }
  void WriteKv(const float* k, const float* v, const int64_t* slots, int64_t T,
               const kernels::PagedKvLayer& layer) override {
    kernels::ref::WriteKv(k, v, T, slots, layer);
  }
  absl::Status PlanAttention(const int32_t* positions, const int32_t* const* block_tables,
                             int64_t T, int32_t /*num_kv_heads*/, int32_t /*block_size*/) override {
    positions_ = positions;
    block_tables_ = block_tables;
    T_ = T;
    return absl::OkStatus();
  }
  void PagedAttention(const float* q, int64_t Hq, const kernels::PagedKvLayer& layer,
                      float scale, float* out) override {
    kernels::ref::PagedAttention(q, T_, static_cast<int32_t>(Hq), positions_, block_tables_,
                                 layer, scale, out);
  }

 private:
  // The planned step: host arrays, valid through it.
  const int32_t* positions_ = nullptr;
  const int32_t* const* block_tables_ = nullptr;
  int64_t T_ = 0;
};

}  // namespace

std::unique_ptr<Backend> MakeReferenceBackend() { return std::make_unique<ReferenceBackend>(); }

}  // namespace specd::engine
