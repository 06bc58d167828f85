// The op set the model forward runs on. The CPU backend wraps kernels/cpu, the reference
// backend wraps kernels/ref (plain loops), and the CUDA backend (engine/cuda_backend.cc)
// wraps kernels/cuda: one interface, so the reference backend is the twin of both.
//
// Every pointer an op takes (activations, the step's index arrays, weights placed by
// PlaceWeight / PlaceVector, the KV pool) is in the backend's memory(): host memory on the CPU,
// device memory on a GPU. The host plans each step once (PlanAttention: which keys each token
// reads) and the layers' ops run on that plan (plan on the host, run on the device), so a GPU
// step takes in only its indices and gives back only the requested rows.
#ifndef SPECD_ENGINE_BACKEND_H_
#define SPECD_ENGINE_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "common/sampling/blockwise_verify_host.h"
#include "engine/device_memory.h"
#include "engine/huge_page_arena.h"
#include "kernels/kernel_types.h"

namespace specd::engine {

// How the forward reads a weight matrix (what a backend may prepare for).
enum class WeightUse {
  kMatMul,          // MatMul / MatMulShared (int8 activation blocks)
  kMatMulExact,     // MatMulExact only (float activations)
  kTable,           // EmbeddingLookup only
  kTableAndMatMul,  // both: tied input and output embeddings
  kTableAndMatMulExact,  // both, the products with float activations (exact mode)
};

// What placing a model's weights allocated; held as long as the weights.
struct WeightStorage {
  std::vector<std::unique_ptr<uint8_t[]>> host;  // re-encoded copies (host memory)
  HugePageArena packed;                          // the CPU kernels' packed copies
  std::vector<DeviceBuffer> device;              // copies in a backend's memory
};

// The shape of one step's ops (a forward after its uploads and attention plan): every launch
// size and buffer an op is handed follows from it, so two steps with the same key issue the
// same ops on the same buffers, and a recording of one (a CUDA graph) replays the other.
// owner: the model issuing them (one backend may run a target and a draft).
struct StepGraphKey {
  const void* owner = nullptr;
  int64_t tokens = 0;       // rows of every activation op (padded to a bucket)
  int64_t logit_rows = 0;   // rows through the output head
  int64_t hidden_rows = 0;  // final hidden states gathered
  friend bool operator==(const StepGraphKey&, const StepGraphKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const StepGraphKey& k) {
    return H::combine(std::move(h), k.owner, k.tokens, k.logit_rows, k.hidden_rows);
  }
};

// What RunStep did, since the backend was made.
struct StepGraphStats {
  int64_t eager = 0;      // steps issued op by op (a key's first step, or a failed capture)
  int64_t captures = 0;   // recordings made
  int64_t replays = 0;    // steps run from a recording (each of them also counted here)
  int64_t discarded = 0;  // recordings dropped: a buffer they name moved, or their model went
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // Where the ops' pointers point.
  virtual DeviceMemory& memory() { return HostMemory(); }

  // Host work between forwards (verifying each sequence's logit rows): fn(begin, end) over
  // disjoint ranges covering [0, n), on the backend's threads where it has them, returning
  // when all are done. Each range must be independent of the others.
  virtual void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t, int64_t)> fn) {
    if (n > 0) fn(0, n);
  }

  // Called once per weight matrix at load (after any re-encoding): puts w where this
  // backend's kernels read it. The CPU backend leaves w->data in the file mapping and may add a
  // copy in its kernels' layout (w->packed); a device backend copies the matrix into memory()
  // (w->data then points there). What it allocates goes into `keep`. Results never depend on
  // how a weight was placed.
  virtual absl::Status PlaceWeight(kernels::WeightMatrix* /*w*/, WeightUse /*use*/,
                                   WeightStorage* /*keep*/) {
    return absl::OkStatus();
  }
  // The same for a float vector of n values (norm weights, biases): *v points into memory()
  // afterwards.
  virtual absl::Status PlaceVector(const float** /*v*/, int64_t /*n*/, WeightStorage* /*keep*/) {
    return absl::OkStatus();
  }

  // Speculative verification of a step where its logits are (common/sampling/
  // blockwise_verify.h), so only tokens leave the backend's memory. logits: [rows, vocab] in
  // memory(). One result per plan sequence, as sampling::VerifyDraft's (without top
  // logprobs). The default runs the blockwise host twin on the logits in place (host-readable
  // memory); a device backend runs the same algorithm as kernels.
  virtual absl::StatusOr<std::vector<sampling::VerifyResult>> VerifyBlockwise(
      const sampling::BlockwisePlan& plan, const float* logits, int64_t rows);
  // A draft's proposals where its logits are (common/sampling/blockwise_propose.h): one plan
  // sequence per logits row; only q (top_n entries at most) comes back. Default: the host twin.
  virtual absl::StatusOr<std::vector<sampling::BlockwiseProposal>> ProposeBlockwise(
      const sampling::BlockwisePlan& plan, const float* logits, int64_t rows, int32_t top_n);

  // Steps as recordings (CUDA graphs). True when RunStep may replay an earlier step's ops
  // instead of issuing them: the caller then pads steps to bucketed shapes (StepGraphKey),
  // keeps every varying input in memory() (uploaded before RunStep) and hands the ops only
  // pointers and sizes that the key fixes.
  virtual bool replays_steps() const { return false; }
  // Issues ops() (every op of one step, none of them an upload or a download), or replays the
  // recording of an earlier step with this key. ops() returns the first error it met; a
  // backend that cannot record a step issues it as it is. Default: ops().
  virtual absl::Status RunStep(const StepGraphKey& /*key*/, absl::FunctionRef<absl::Status()> ops) {
    return ops();
  }
  // Drops the recordings of `owner`'s steps (a model going away).
  virtual void ForgetSteps(const void* /*owner*/) {}
  virtual StepGraphStats step_graph_stats() const { return {}; }
  // The queue the ops run on (a cudaStream_t), for collectives that must join it; null on
  // the CPU.
  virtual void* device_stream() { return nullptr; }

  // Waits for the ops issued so far; returns the first error any of them met (a device
  // backend's kernels report errors late). The CPU backends' ops cannot fail.
  virtual absl::Status Sync() { return absl::OkStatus(); }

  // x: [T, w.cols] -> y: [T, w.rows]
  virtual void MatMul(const kernels::WeightMatrix& w, const float* x, int64_t T, float* y) = 0;
  // ys[i] = ws[i] x for n weights sharing the input x: [T, cols]; bitwise the same as n
  // MatMul calls. Backends may quantize x once and run the products together. (ws and ys
  // are host arrays; the matrices and rows they name are in memory().)
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
  // x: [T, H, head_dim], rotated in place at positions[T]. params is host data (the backend
  // plans its angles on the host). A backend may compute the angles once a step (from one
  // PlanAttention to the next): positions and params keep their contents through a step.
  virtual void Rope(float* x, int64_t T, int64_t H, int64_t head_dim, const int32_t* positions,
                    const kernels::RopeParams& params) = 0;
  // A layer's q: [T, Hq, head_dim] and k: [T, Hk, head_dim] at the same positions: bitwise
  // Rope(q) then Rope(k); a device backend rotates both in one launch.
  virtual void RopeQK(float* q, int64_t Hq, float* k, int64_t Hk, int64_t T, int64_t head_dim,
                      const int32_t* positions, const kernels::RopeParams& params) {
    Rope(q, T, Hq, head_dim, positions, params);
    Rope(k, T, Hk, head_dim, positions, params);
  }
  // gate, up, out: [T, F]
  virtual void SwiGlu(const float* gate, const float* up, int64_t T, int64_t F, float* out) = 0;
  // x[i] += y[i], i < n
  virtual void AddInPlace(float* x, const float* y, int64_t n) = 0;
  // x += y, then out = RmsNorm(x, w): a layer's residual add and the norm after it.
  // x, y, out: [T, D]; w: [D]. Bitwise AddInPlace then RmsNorm; a device backend runs the
  // two as one launch.
  virtual void AddRmsNorm(float* x, const float* y, const float* w, int64_t T, int64_t D,
                          float eps, float* out) {
    AddInPlace(x, y, T * D);
    RmsNorm(x, w, T, D, eps, out);
  }
  // x: [T, N] += b: [N]
  virtual void AddBias(float* x, const float* b, int64_t T, int64_t N) = 0;
  // table: [vocab, D]; ids: [T] -> out: [T, D]
  virtual void EmbeddingLookup(const kernels::WeightMatrix& table, const int32_t* ids, int64_t T,
                               float* out) = 0;
  // out[r, :] = x[rows[r], :] for r < R.  x: [*, D]; rows: [R]; out: [R, D]
  virtual void GatherRows(const float* x, const int32_t* rows, int64_t R, int64_t D,
                          float* out) = 0;
  // k, v: [T, Hkv, d] stored at slots[T] of the layer's pool; a negative slot is a padding
  // row (a bucketed step's), not stored.
  virtual void WriteKv(const float* k, const float* v, const int64_t* slots, int64_t T,
                       const kernels::PagedKvLayer& layer) = 0;

  // Plans one step's attention on the host, once for all its layers: token t attends
  // positions 0..positions[t] of the sequence whose block table is block_tables[t]. Host
  // arrays of T entries (the tables are PagedKvCache::BlockTable's), valid until the step's
  // last PagedAttention returns. num_kv_heads, block_size: the pool's geometry.
  virtual absl::Status PlanAttention(const int32_t* positions, const int32_t* const* block_tables,
                                     int64_t T, int32_t num_kv_heads, int32_t block_size) = 0;
  // q, out: [T, Hq, d] of the planned step; the layer's pool matches the planned geometry.
  virtual void PagedAttention(const float* q, int64_t Hq, const kernels::PagedKvLayer& layer,
                              float scale, float* out) = 0;
};

// threads <= 0: one per hardware core.
std::unique_ptr<Backend> MakeCpuBackend(int threads);
std::unique_ptr<Backend> MakeReferenceBackend();

// Copies w (rows of w->cols values of w->type, at stride w->row_bytes) into `memory`, rows
// packed back to back; w then points there. What a backend whose memory is not the file
// mapping's does in PlaceWeight.
absl::Status CopyWeightTo(DeviceMemory& memory, kernels::WeightMatrix* w, WeightStorage* keep);
// *v: n floats -> a copy in `memory`.
absl::Status CopyVectorTo(DeviceMemory& memory, const float** v, int64_t n, WeightStorage* keep);

}  // namespace specd::engine

#endif  // SPECD_ENGINE_BACKEND_H_
