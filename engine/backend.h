// The op set the model forward runs on. The CPU backend wraps kernels/cpu, the reference
// backend wraps kernels/ref (plain loops), and a CUDA backend will implement the same calls.
#ifndef SPECD_ENGINE_BACKEND_H_
#define SPECD_ENGINE_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "kernels/kernel_types.h"

namespace specd::engine {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // Host work between forwards (verifying each sequence's logit rows): fn(begin, end) over
  // disjoint ranges covering [0, n), on the backend's threads where it has them, returning
  // when all are done. Each range must be independent of the others.
  virtual void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t, int64_t)> fn) {
    if (n > 0) fn(0, n);
  }

  // Planned once at load: a backend may keep a weight matrix in a layout of its own kernels.
  // It returns the buffer holding that copy and points w->packed into it (the caller keeps the
  // buffer as long as the weights); nullptr: nothing to pack, w unchanged. Results never
  // depend on whether a weight was packed.
  virtual std::unique_ptr<uint8_t[]> PackWeight(kernels::WeightMatrix* /*w*/) { return nullptr; }

  // x: [T, w.cols] -> y: [T, w.rows]
  virtual void MatMul(const kernels::WeightMatrix& w, const float* x, int64_t T, float* y) = 0;
  // ys[i] = ws[i] x for n weights sharing the input x: [T, cols]; bitwise the same as n
  // MatMul calls. Backends may quantize x once and run the products together.
  virtual void MatMulShared(const kernels::WeightMatrix* ws, int n, const float* x, int64_t T,
                            float* const* ys) {
    for (int i = 0; i < n; ++i) MatMul(ws[i], x, T, ys[i]);
  }
  // Same product with float activations for every weight type (no int8 activation rounding):
  // the "exact activations" mode used to check the model against a float64 reference.
  virtual void MatMulExact(const kernels::WeightMatrix& w, const float* x, int64_t T,
                           float* y) = 0;
  // x, out: [T, D]; w: [D]
  virtual void RmsNorm(const float* x, const float* w, int64_t T, int64_t D, float eps,
                       float* out) = 0;
  // x: [T, H, head_dim], rotated in place at positions[T]
  virtual void Rope(float* x, int64_t T, int64_t H, int64_t head_dim, const int32_t* positions,
                    const kernels::RopeParams& params) = 0;
  // gate, up, out: [T, F]
  virtual void SwiGlu(const float* gate, const float* up, int64_t T, int64_t F, float* out) = 0;
  // x[i] += y[i], i < n
  virtual void AddInPlace(float* x, const float* y, int64_t n) = 0;
  // x: [T, N] += b: [N]
  virtual void AddBias(float* x, const float* b, int64_t T, int64_t N) = 0;
  // table: [vocab, D]; ids: [T] -> out: [T, D]
  virtual void EmbeddingLookup(const kernels::WeightMatrix& table, const int32_t* ids, int64_t T,
                               float* out) = 0;
  // k, v: [T, Hkv, d] stored at slots[T] of the layer's pool
  virtual void WriteKv(const float* k, const float* v, const int64_t* slots, int64_t T,
                       const kernels::PagedKvLayer& layer) = 0;
  // q, out: [T, Hq, d]; token t attends positions 0..positions[t] of block_tables[t]
  virtual void PagedAttention(const float* q, int64_t T, int64_t Hq, const int32_t* positions,
                              const int32_t* const* block_tables,
                              const kernels::PagedKvLayer& layer, float scale, float* out) = 0;
};

// threads <= 0: one per hardware core.
std::unique_ptr<Backend> MakeCpuBackend(int threads);
std::unique_ptr<Backend> MakeReferenceBackend();

}  // namespace specd::engine

#endif  // SPECD_ENGINE_BACKEND_H_
