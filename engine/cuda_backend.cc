#include "engine/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cuda/attention_plan.h"
#include "kernels/cuda/launch.h"
#include "kernels/ref/ops.h"

namespace specd::engine {
namespace {

namespace kc = kernels::cuda;
using gguf::GgmlType;

absl::Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  // Reported here: clear it, or the next launch's check would blame its kernel.
  static_cast<void>(cudaGetLastError());
  return absl::InternalError(absl::StrCat("CUDA ", what, ": ", cudaGetErrorString(e)));
}

// The first error since the last Sync: ops return nothing, so they report here.
class StickyError {
 public:
  void Note(absl::Status st) {
    if (error_.ok() && !st.ok()) error_ = std::move(st);
  }
  absl::Status Take() { return std::exchange(error_, absl::OkStatus()); }

 private:
  absl::Status error_;
};

// The backend's stream, destroyed after everything that uses it (the first member).
class OwnedStream {
 public:
  explicit OwnedStream(cudaStream_t s) : stream_(s) {}
  ~OwnedStream() {
    cudaStreamSynchronize(stream_);  // nothing to report from a destructor
    cudaStreamDestroy(stream_);
  }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_;
};

// Whether the backend's stream is being captured into a graph: then nothing may allocate,
// upload or download (a capture would keep the host pointer, not the data), and a buffer that
// must grow fails the capture. generation counts the moves of buffers that recorded steps
// name, so a graph made before a move is never replayed after it.
struct CaptureState {
  bool capturing = false;
  int64_t generation = 0;
};

absl::Status RefuseWhileCapturing(const CaptureState& c, const char* what) {
  if (!c.capturing) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(what, " while a step is captured"));
}

class CudaMemory final : public DeviceMemory {
 public:
  CudaMemory(int device, cudaStream_t stream, StickyError* errors, const CaptureState* capture)
      : device_(device), stream_(stream), errors_(errors), capture_(capture) {}
  bool host_addressable() const override { return false; }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    if (absl::Status st = RefuseWhileCapturing(*capture_, "allocate"); !st.ok()) return st;
    // The device is per host thread: whichever thread allocates, it is this one.
    if (absl::Status st = Cuda(cudaSetDevice(device_), "set device"); !st.ok()) return st;
    void* p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 64)); e != cudaSuccess) {
      static_cast<void>(cudaGetLastError());  // reported here, not by the next launch
      return absl::ResourceExhaustedError(absl::StrFormat(
          "cuda:%d: cannot allocate %d bytes: %s", device_, bytes, cudaGetErrorString(e)));
    }
    absl::Status st = Cuda(cudaMemsetAsync(p, 0, bytes, stream_), "memset");
    if (!st.ok()) {
      cudaFree(p);
      return st;
    }
    return p;
  }
  void Free(void* p) override {
    // Nothing to report: a failed free leaves memory the process gives back at exit.
    cudaStreamSynchronize(stream_);
    cudaFree(p);
  }
  absl::Status Upload(void* dst, const void* src, size_t bytes) override {
    if (absl::Status st = RefuseWhileCapturing(*capture_, "upload"); !st.ok()) return st;
    if (bytes == 0) return absl::OkStatus();
    // From pageable memory the call returns once `src` is staged, so the caller may reuse it.
    return Cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "upload");
  }
  absl::Status Download(void* dst, const void* src, size_t bytes) override {
    if (absl::Status refused = RefuseWhileCapturing(*capture_, "download"); !refused.ok()) return refused;
    absl::Status st;
    if (bytes > 0) st = Cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "download");
    st.Update(Cuda(cudaStreamSynchronize(stream_), "download sync"));
    absl::Status earlier = errors_->Take();
    return earlier.ok() ? st : earlier;
  }
  absl::Status Copy2D(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                      size_t rows) override {
    if (rows == 0 || width == 0) return absl::OkStatus();
    absl::Status st = Cuda(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows,
                                             cudaMemcpyDeviceToDevice, stream_),
                           "copy 2d");
    errors_->Note(st);
    return st;
  }

 private:
  int device_;
  cudaStream_t stream_;
  StickyError* errors_;
  const CaptureState* capture_;
};

// A device buffer that grows (rarely: the first steps, or a larger batch than any before).
// Growing moves it: when recorded steps name it (`steps` given), they are stale from then on.
class GrowingBuffer {
 public:
  absl::Status Reserve(DeviceMemory& memory, size_t bytes, CaptureState* steps) {
    if (bytes <= buf_.bytes()) return absl::OkStatus();
    // (Allocate refuses during a capture too; this names the cause.)
    if (steps != nullptr) {
      if (absl::Status st = RefuseWhileCapturing(*steps, "a buffer growing"); !st.ok()) return st;
    }
    absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(memory, bytes + bytes / 2);
    if (!b.ok()) return b.status();
    buf_ = *std::move(b);
    if (steps != nullptr) ++steps->generation;
    return absl::OkStatus();
  }
  template <typename T>
  T* as() const {
    return buf_.as<T>();
  }
  // Whole elements of T it holds.
  template <typename T>
  int64_t capacity() const {
    return static_cast<int64_t>(buf_.bytes() / sizeof(T));
  }

 private:
  DeviceBuffer buf_;
};

// One recorded step: an instantiated graph, and the buffers' generation it names.
struct StepGraph {
  struct ExecDeleter {
    void operator()(cudaGraphExec_t e) const { cudaGraphExecDestroy(e); }  // nothing to report
  };
  std::unique_ptr<std::remove_pointer_t<cudaGraphExec_t>, ExecDeleter> exec;
  int64_t generation = 0;
};

bool CudaMatMulType(GgmlType t) {
  switch (t) {
    case GgmlType::kF32: case GgmlType::kF16: case GgmlType::kBF16:
    case GgmlType::kQ8_0: case GgmlType::kQ4_0: case GgmlType::kQ4_1:
      return true;
    default:
      return false;
  }
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, cudaStream_t stream)
      : owned_stream_(stream), device_(device), stream_(stream),
        memory_(device, stream, &errors_, &capture_) {
    // SPECD_CUDA_MATMUL=reference: the bitwise-reference MatMul (slow), to tell a kernel's
    // error from the rest of the forward's.
    const char* k = std::getenv("SPECD_CUDA_MATMUL");
    if (k != nullptr && std::string(k) == "reference") matmul_kernel_ = kc::CudaMatMulKernel::kReference;
    // SPECD_CUDA_GRAPHS=off: every step issued launch by launch (to measure what graphs save).
    const char* g = std::getenv("SPECD_CUDA_GRAPHS");
    graphs_ = !(g != nullptr && std::string(g) == "off");
  }

  // Steps as CUDA graphs: a shape's first step runs launch by launch (and grows every buffer
  // it needs), its second is captured, instantiated and launched, and later ones launch the
  // graph. A graph is dropped when a buffer it names moves, and recaptured at its next step.
  bool replays_steps() const override { return graphs_; }
  absl::Status RunStep(const StepGraphKey& key, absl::FunctionRef<absl::Status()> ops) override {
    if (!graphs_) return Eager(ops);
    auto it = step_graphs_.find(key);
    if (it != step_graphs_.end() && it->second.generation != capture_.generation) {
      step_graphs_.erase(it);
      ++graph_stats_.discarded;
      it = step_graphs_.end();
    }
    if (it == step_graphs_.end()) {
      if (seen_shapes_.insert(key).second) return Eager(ops);
      auto failed = failed_captures_.find(key);
      if (failed != failed_captures_.end() && failed->second == capture_.generation) return Eager(ops);
      absl::StatusOr<StepGraph> graph = Capture(ops);
      if (!graph.ok()) {  // what cannot be captured runs as it is, until a buffer moves
        failed_captures_[key] = capture_.generation;
        return Eager(ops);
      }
      failed_captures_.erase(key);
      ++graph_stats_.captures;
      it = step_graphs_.emplace(key, *std::move(graph)).first;
    }
    ++graph_stats_.replays;
    absl::Status st = Cuda(cudaGraphLaunch(it->second.exec.get(), stream_), "graph launch");
    errors_.Note(st);
    return st;
  }
  void ForgetSteps(const void* owner) override {
    absl::erase_if(step_graphs_, [&](const auto& entry) {
      if (entry.first.owner != owner) return false;
      ++graph_stats_.discarded;
      return true;
    });
    absl::erase_if(seen_shapes_, [&](const StepGraphKey& k) { return k.owner == owner; });
    absl::erase_if(failed_captures_, [&](const auto& entry) { return entry.first.owner == owner; });
  }
  StepGraphStats step_graph_stats() const override { return graph_stats_; }
  void* device_stream() override { return stream_; }

  std::string_view name() const override { return name_; }
  DeviceMemory& memory() override { return memory_; }

  absl::Status PlaceWeight(kernels::WeightMatrix* w, WeightUse use, WeightStorage* keep) override {
    // The embedding lookup reads the same six types as the products.
    if (!CudaMatMulType(w->type)) {
      return absl::UnimplementedError(absl::StrFormat(
          "the CUDA backend reads F32, F16, BF16, Q8_0, Q4_0 and Q4_1 weights, not %s",
          gguf::GgmlTypeName(w->type)));
    }
    const bool exact = use == WeightUse::kMatMulExact || use == WeightUse::kTableAndMatMulExact;
    if (exact && w->type != GgmlType::kF32 && w->type != GgmlType::kF16 && w->type != GgmlType::kBF16) {
      return absl::UnimplementedError(
          "exact activations on CUDA need float weights (re-encode the model to F16)");
    }
    return CopyWeightTo(memory_, w, keep);
  }
  absl::Status PlaceVector(const float** v, int64_t n, WeightStorage* keep) override {
    return CopyVectorTo(memory_, v, n, keep);
  }
  absl::Status Sync() override {
    absl::Status st = Cuda(cudaStreamSynchronize(stream_), "sync");
    absl::Status earlier = errors_.Take();
    return earlier.ok() ? st : earlier;
  }

  void MatMul(const kernels::WeightMatrix& w, const float* x, int64_t T, float* y) override {
    absl::Status st = scratch_.Reserve(memory_, static_cast<size_t>(kc::MatMulScratchBytes(T, w.cols)), &capture_);
    if (st.ok()) st = kc::LaunchMatMul(w, x, T, y, scratch_.as<void>(), stream_, matmul_kernel_);
    errors_.Note(st);
  }
  // q, k, v (gate, up) of one input: its activation blocks once, when every weight is quantized.
  void MatMulShared(const kernels::WeightMatrix* ws, int n, const float* x, int64_t T,
                    float* const* ys) override {
    bool blocks = true;
    for (int i = 0; i < n; ++i) {
      blocks = blocks && ws[i].cols == ws[0].cols &&
               (ws[i].type == GgmlType::kQ8_0 || ws[i].type == GgmlType::kQ4_0 || ws[i].type == GgmlType::kQ4_1);
    }
    if (!blocks) {
      for (int i = 0; i < n; ++i) MatMul(ws[i], x, T, ys[i]);
      return;
    }
    absl::Status st = scratch_.Reserve(memory_, static_cast<size_t>(kc::MatMulScratchBytes(T, ws[0].cols)), &capture_);
    if (st.ok()) st = kc::LaunchMatMuls(ws, n, x, T, ys, scratch_.as<void>(), stream_, matmul_kernel_);
    errors_.Note(st);
  }
  void MatMulExact(const kernels::WeightMatrix& w, const float* x, int64_t T, float* y) override {
    // PlaceWeight admitted float weights only, whose product reads float activations.
    MatMul(w, x, T, y);
  }
  void RmsNorm(const float* x, const float* w, int64_t T, int64_t D, float eps, float* out) override {
    errors_.Note(kc::LaunchRmsNorm(x, T, D, w, eps, out, stream_));
  }
  void Rope(float* x, int64_t T, int64_t H, int64_t head_dim, const int32_t* positions,
            const kernels::RopeParams& params) override {
    absl::StatusOr<const double*> inv_freq = PlanRope(params);
    absl::Status st = inv_freq.status();
    if (st.ok()) {
      st = kc::LaunchRope(x, T, static_cast<int32_t>(H), static_cast<int32_t>(head_dim), params.rope_dim,
                          params.layout == kernels::RopeLayout::kNeox, positions, *inv_freq, stream_);
    }
    errors_.Note(st);
  }
  void RopeQK(float* q, int64_t Hq, float* k, int64_t Hk, int64_t T, int64_t head_dim, const int32_t* positions,
              const kernels::RopeParams& params) override {
    absl::StatusOr<const double*> inv_freq = PlanRope(params);
    absl::Status st = inv_freq.status();
    if (st.ok()) {
      st = kc::LaunchRopeQK(q, static_cast<int32_t>(Hq), k, static_cast<int32_t>(Hk), T,
                            static_cast<int32_t>(head_dim), params.rope_dim,
                            params.layout == kernels::RopeLayout::kNeox, positions, *inv_freq, stream_);
    }
    errors_.Note(st);
  }
  void SwiGlu(const float* gate, const float* up, int64_t T, int64_t F, float* out) override {
    errors_.Note(kc::LaunchSwiGlu(gate, up, T * F, out, stream_));
  }
  void AddInPlace(float* x, const float* y, int64_t n) override {
    errors_.Note(kc::LaunchAddInPlace(x, y, n, stream_));
  }
  void AddRmsNorm(float* x, const float* y, const float* w, int64_t T, int64_t D, float eps,
                  float* out) override {
    errors_.Note(kc::LaunchAddRmsNorm(x, y, T, D, w, eps, out, stream_));
  }
  void AddBias(float* x, const float* b, int64_t T, int64_t N) override {
    errors_.Note(kc::LaunchAddBias(x, T, N, b, stream_));
  }
  void EmbeddingLookup(const kernels::WeightMatrix& table, const int32_t* ids, int64_t T, float* out) override {
    errors_.Note(kc::LaunchEmbeddingLookup(table, ids, T, out, stream_));
  }
  void GatherRows(const float* x, const int32_t* rows, int64_t R, int64_t D, float* out) override {
    errors_.Note(kc::LaunchGatherRows(x, rows, R, D, out, stream_));
  }
  void WriteKv(const float* k, const float* v, const int64_t* slots, int64_t T,
               const kernels::PagedKvLayer& layer) override {
    errors_.Note(kc::LaunchWriteKv(k, v, T, slots, layer, stream_));
  }
  absl::Status PlanAttention(const int32_t* positions, const int32_t* const* block_tables, int64_t T,
                             int32_t num_kv_heads, int32_t block_size) override;
  void PagedAttention(const float* q, int64_t Hq, const kernels::PagedKvLayer& layer, float scale,
                      float* out) override {
    const int32_t group = static_cast<int32_t>(Hq) / layer.num_kv_heads;
    // The kernel's limits (a block folds a row per thread; the chunk and rows in shared memory).
    if (Hq % layer.num_kv_heads != 0 || group > 32 || layer.head_dim > 256 || layer.head_dim < 1) {
      errors_.Note(absl::UnimplementedError(absl::StrFormat(
          "CUDA attention: %d query heads over %d kv heads of dim %d (up to 32 per kv head, dim <= 256)",
          Hq, layer.num_kv_heads, layer.head_dim)));
      return;
    }
    // Reserved here for the first step; PlanAttention reserves later steps' ahead of RunStep.
    partial_floats_ = std::max(partial_floats_, kc::CudaAttnPartialFloats(group, layer.head_dim));
    absl::Status st = ReservePartials();
    plan_.partials = partials_.as<float>();
    // A captured launch covers the plan buffers' capacities; the step's counts stop the rest.
    plan_.counts = capture_.capturing ? counts_.as<int64_t>() : nullptr;
    plan_.item_grid = items_.capacity<kc::CudaAttnItem>();
    plan_.merge_grid = merges_.capacity<kc::CudaAttnMerge>();
    if (st.ok()) st = kc::LaunchPagedAttention(q, static_cast<int32_t>(Hq), layer, scale, out, plan_, stream_);
    errors_.Note(st);
  }

  // The plan's arrays up, both phases on the stream, only outcomes, tokens and logprobs down.
  absl::StatusOr<std::vector<sampling::VerifyResult>> VerifyBlockwise(
      const sampling::BlockwisePlan& plan, const float* logits, int64_t rows) override {
    namespace bw = sampling::blockwise;
    const size_t R = static_cast<size_t>(plan.num_rows()), S = static_cast<size_t>(plan.num_seqs());
    if (absl::Status st = plan.CheckReadsWithin(rows); !st.ok()) return st;
    kc::DeviceVerifyBuffers buf;
    absl::Status st = PutPlan(plan, &buf.plan);
    if (st.ok()) st = verify_.weights.Reserve(memory_, std::max<size_t>(R, 1) * plan.vocab() * sizeof(float), nullptr);
    if (st.ok()) st = verify_.summaries.Reserve(memory_, std::max<size_t>(R, 1) * sizeof(bw::RowSummary), nullptr);
    if (st.ok()) st = verify_.outcomes.Reserve(memory_, std::max<size_t>(S, 1) * sizeof(bw::SeqOutcome), nullptr);
    if (st.ok()) st = verify_.tokens.Reserve(memory_, std::max<size_t>(R, 1) * sizeof(int32_t), nullptr);
    if (st.ok()) st = verify_.logprobs.Reserve(memory_, std::max<size_t>(R, 1) * sizeof(float), nullptr);
    const size_t top_n = std::max<size_t>(R, 1) * bw::kMaxLogprobsValue;
    if (st.ok()) st = verify_.top.Reserve(memory_, top_n * sizeof(bw::TopLogprobEntry), nullptr);
    if (!st.ok()) return st;
    buf.logits = logits;
    buf.weights = verify_.weights.as<float>();
    buf.summaries = verify_.summaries.as<bw::RowSummary>();
    buf.outcomes = verify_.outcomes.as<bw::SeqOutcome>();
    buf.tokens = verify_.tokens.as<int32_t>();
    buf.logprobs = verify_.logprobs.as<float>();
    buf.top = verify_.top.as<bw::TopLogprobEntry>();
    if (st = kc::LaunchBlockwiseVerify(buf, stream_); !st.ok()) return st;
    std::vector<bw::SeqOutcome> outcomes(S);
    std::vector<int32_t> tokens(R);
    std::vector<float> logprobs(R);
    // Downloads wait for the stream, so the plan's host arrays outlived their uploads.
    st = memory_.Download(outcomes.data(), buf.outcomes, S * sizeof(bw::SeqOutcome));
    if (st.ok()) st = memory_.Download(tokens.data(), buf.tokens, R * sizeof(int32_t));
    if (st.ok()) st = memory_.Download(logprobs.data(), buf.logprobs, R * sizeof(float));
    // Top logprobs only where a request asked for them.
    bool want_top = false;
    for (const bw::Transforms& t : plan.transforms()) want_top = want_top || t.num_logprobs > 0;
    std::vector<bw::TopLogprobEntry> top(want_top ? R * bw::kMaxLogprobsValue : 0);
    if (st.ok() && want_top) {
      st = memory_.Download(top.data(), buf.top, top.size() * sizeof(bw::TopLogprobEntry));
    }
    if (absl::Status late = Sync(); st.ok()) st = late;
    if (!st.ok()) return st;
    return sampling::CollectResults(plan, outcomes, tokens, logprobs, top);
  }

  // The plan's arrays up, one block per row on the stream, only q down.
  absl::StatusOr<std::vector<sampling::BlockwiseProposal>> ProposeBlockwise(
      const sampling::BlockwisePlan& plan, const float* logits, int64_t rows,
      int32_t top_n) override {
    namespace bw = sampling::blockwise;
    if (absl::Status st = sampling::CheckProposalTopN(top_n); !st.ok()) return st;
    if (absl::Status st = plan.CheckReadsWithin(rows); !st.ok()) return st;
    const size_t R = static_cast<size_t>(plan.num_rows());
    kc::DeviceProposeBuffers buf;
    absl::Status st = PutPlan(plan, &buf.plan);
    const size_t n = std::max<size_t>(R, 1) * static_cast<size_t>(top_n);
    if (st.ok()) st = verify_.weights.Reserve(memory_, std::max<size_t>(R, 1) * plan.vocab() * sizeof(float), nullptr);
    if (st.ok()) st = propose_.ids.Reserve(memory_, n * sizeof(int32_t), nullptr);
    if (st.ok()) st = propose_.probs.Reserve(memory_, n * sizeof(float), nullptr);
    if (st.ok()) st = propose_.scratch.Reserve(memory_, n * sizeof(float), nullptr);
    if (st.ok()) st = propose_.outs.Reserve(memory_, std::max<size_t>(R, 1) * sizeof(bw::ProposalOut), nullptr);
    if (!st.ok()) return st;
    buf.logits = logits;
    buf.weights = verify_.weights.as<float>();
    buf.top_n = top_n;
    buf.ids = propose_.ids.as<int32_t>();
    buf.probs = propose_.probs.as<float>();
    buf.scratch = propose_.scratch.as<float>();
    buf.outs = propose_.outs.as<bw::ProposalOut>();
    if (st = kc::LaunchBlockwisePropose(buf, stream_); !st.ok()) return st;
    std::vector<bw::ProposalOut> outs(R);
    std::vector<int32_t> ids(R * top_n);
    std::vector<float> probs(R * top_n);
    // Downloads wait for the stream, so the plan's host arrays outlived their uploads.
    st = memory_.Download(outs.data(), buf.outs, R * sizeof(bw::ProposalOut));
    if (st.ok()) st = memory_.Download(ids.data(), buf.ids, ids.size() * sizeof(int32_t));
    if (st.ok()) st = memory_.Download(probs.data(), buf.probs, probs.size() * sizeof(float));
    if (absl::Status late = Sync(); st.ok()) st = late;
    if (!st.ok()) return st;
    return sampling::CollectProposals(plan, outs, ids, probs, top_n);
  }

 private:
  absl::Status Eager(absl::FunctionRef<absl::Status()> ops) {
    ++graph_stats_.eager;
    return ops();
  }
  // ops() captured from the stream into an instantiated graph; nothing runs yet. Errors the
  // capture met stay out of the backend's sticky error (the step then runs as it is).
  absl::StatusOr<StepGraph> Capture(absl::FunctionRef<absl::Status()> ops) {
    absl::Status earlier = errors_.Take();
    absl::Status st = Cuda(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin capture");
    if (st.ok()) {
      capture_.capturing = true;
      st = ops();
      capture_.capturing = false;
      cudaGraph_t graph = nullptr;
      absl::Status ended = Cuda(cudaStreamEndCapture(stream_, &graph), "end capture");
      absl::Status noted = errors_.Take();
      if (st.ok()) st = noted;
      if (st.ok()) st = ended;
      cudaGraphExec_t exec = nullptr;
      if (st.ok()) st = Cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate graph");
      if (graph != nullptr) cudaGraphDestroy(graph);  // the instance keeps its own copy
      if (st.ok()) {
        errors_.Note(earlier);
        StepGraph g;
        g.exec.reset(exec);
        g.generation = capture_.generation;
        return g;
      }
    }
    errors_.Note(earlier);
    return st;
  }
  absl::Status ReservePartials() {
    return partials_.Reserve(
        memory_, static_cast<size_t>(std::max<int64_t>(1, num_partials_) * std::max<int64_t>(1, partial_floats_)) *
                     sizeof(float),
        &capture_);
  }
  // A blockwise plan's arrays into their device buffers; *view points at them.
  absl::Status PutPlan(const sampling::BlockwisePlan& plan, sampling::blockwise::PlanView* view) {
    namespace bw = sampling::blockwise;
    absl::Status st = Put(verify_.transforms, plan.transforms().data(), plan.transforms().size(), nullptr);
    if (st.ok()) st = Put(verify_.rows, plan.rows().data(), plan.rows().size(), nullptr);
    if (st.ok()) st = Put(verify_.seqs, plan.seqs().data(), plan.seqs().size(), nullptr);
    if (st.ok()) st = Put(verify_.penalties, plan.penalties().data(), plan.penalties().size(), nullptr);
    if (st.ok()) st = Put(verify_.proposals, plan.proposals().data(), plan.proposals().size(), nullptr);
    if (st.ok()) st = Put(verify_.stop_ids, plan.stop_ids().data(), plan.stop_ids().size(), nullptr);
    *view = plan.View();
    view->transforms = verify_.transforms.as<bw::Transforms>();
    view->rows = verify_.rows.as<bw::RowPlan>();
    view->seqs = verify_.seqs.as<bw::SeqPlan>();
    view->penalties = verify_.penalties.as<bw::PenaltyEntry>();
    view->proposals = verify_.proposals.as<bw::ProposalEntry>();
    view->stop_ids = verify_.stop_ids.as<int32_t>();
    return st;
  }
  // The angles' frequencies, from the reference's own planner: one device copy per set of
  // frequencies (models sharing this backend may differ), never moved, so a recorded step
  // keeps reading its own model's.
  absl::StatusOr<const double*> PlanRope(const kernels::RopeParams& p) {
    std::vector<double> freq(static_cast<size_t>(p.rope_dim / 2));
    kernels::ref::RopeInvFreq(p, freq.data());
    for (const auto& [host, device] : inv_freqs_) {
      if (host == freq) return device.as<const double>();
    }
    absl::StatusOr<DeviceBuffer> buf = DeviceBuffer::Allocate(memory_, std::max<size_t>(freq.size(), 1) * sizeof(double));
    if (!buf.ok()) return buf.status();
    absl::Status st = memory_.Upload(buf->data(), freq.data(), freq.size() * sizeof(double));
    if (!st.ok()) return st;
    inv_freqs_.emplace_back(std::move(freq), *std::move(buf));
    return inv_freqs_.back().second.as<const double>();
  }
  // Host vector -> growing device buffer (one upload). steps: the capture state when
  // recorded steps name the buffer (the attention plan's), else null (verification's).
  template <typename T>
  absl::Status Put(GrowingBuffer& buf, const T* data, size_t n, CaptureState* steps) {
    absl::Status st = buf.Reserve(memory_, std::max<size_t>(n, 1) * sizeof(T), steps);
    if (st.ok()) st = memory_.Upload(buf.as<void>(), data, n * sizeof(T));
    return st;
  }

  OwnedStream owned_stream_;  // first: destroyed after every buffer below has been freed
  int device_;
  cudaStream_t stream_;
  std::string name_ = "cuda";
  StickyError errors_;
  CaptureState capture_;
  CudaMemory memory_;
  bool graphs_ = true;
  absl::flat_hash_map<StepGraphKey, StepGraph> step_graphs_;
  absl::flat_hash_set<StepGraphKey> seen_shapes_;
  absl::flat_hash_map<StepGraphKey, int64_t> failed_captures_;  // key -> generation it failed at
  StepGraphStats graph_stats_;
  kc::CudaMatMulKernel matmul_kernel_ = kc::CudaMatMulKernel::kWarpPerRow;
  GrowingBuffer scratch_;  // MatMul's activation blocks
  std::vector<std::pair<std::vector<double>, DeviceBuffer>> inv_freqs_;  // PlanRope's
  // The step's plan: host side, then its device copies.
  std::vector<int32_t> tables_host_;
  std::vector<int64_t> offsets_host_;
  GrowingBuffer positions_, tables_, offsets_, items_, merges_, partials_, counts_;
  int64_t num_partials_ = 0;
  int64_t partial_floats_ = 0;  // floats of one attention partial (known from the first step)
  kc::DeviceAttentionPlan plan_;
  // VerifyBlockwise's plan arrays and outputs.
  struct VerifyBuffers {
    GrowingBuffer transforms, rows, seqs, penalties, proposals, stop_ids;
    GrowingBuffer weights, summaries, outcomes, tokens, logprobs, top;
  } verify_;
  struct ProposeBuffers {  // ProposeBlockwise's outputs (the plan and weights: verify_'s)
    GrowingBuffer ids, probs, scratch, outs;
  } propose_;
};

absl::Status CudaBackend::PlanAttention(const int32_t* positions, const int32_t* const* block_tables, int64_t T,
                                        int32_t num_kv_heads, int32_t block_size) {
  // Each step starts here, on whichever thread runs it: make this backend's device current.
  if (absl::Status st = Cuda(cudaSetDevice(device_), "set device"); !st.ok()) return st;
  const kc::CudaAttentionPlan plan = kc::PlanCudaAttention(positions, T, num_kv_heads);
  // Every token's table once, in order of first use: a sequence's tokens share one.
  absl::flat_hash_map<const int32_t*, int64_t> blocks_needed;
  std::vector<const int32_t*> order;
  for (int64_t t = 0; t < T; ++t) {
    auto [it, fresh] = blocks_needed.try_emplace(block_tables[t], 0);
    if (fresh) order.push_back(block_tables[t]);
    it->second = std::max<int64_t>(it->second, positions[t] / block_size + 1);
  }
  absl::flat_hash_map<const int32_t*, int64_t> start;
  tables_host_.clear();
  for (const int32_t* table : order) {
    start[table] = static_cast<int64_t>(tables_host_.size());
    tables_host_.insert(tables_host_.end(), table, table + blocks_needed[table]);
  }
  offsets_host_.resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) offsets_host_[t] = start[block_tables[t]];
  absl::Status st = Put(positions_, positions, static_cast<size_t>(T), &capture_);
  if (st.ok()) st = Put(tables_, tables_host_.data(), tables_host_.size(), &capture_);
  if (st.ok()) st = Put(offsets_, offsets_host_.data(), offsets_host_.size(), &capture_);
  if (st.ok()) st = Put(items_, plan.items.data(), plan.items.size(), &capture_);
  if (st.ok()) st = Put(merges_, plan.merges.data(), plan.merges.size(), &capture_);
  const int64_t counts[2] = {static_cast<int64_t>(plan.items.size()), static_cast<int64_t>(plan.merges.size())};
  if (st.ok()) st = Put(counts_, counts, 2, &capture_);
  num_partials_ = plan.num_partials;
  // Before RunStep, so that a step needing more partials moves the buffer (and retires the
  // graphs naming it) here rather than inside a capture.
  if (st.ok() && partial_floats_ > 0) st = ReservePartials();
  if (!st.ok()) return st;
  plan_ = kc::DeviceAttentionPlan{};
  plan_.T = T;
  plan_.positions = positions_.as<int32_t>();
  plan_.tables = tables_.as<int32_t>();
  plan_.table_offsets = offsets_.as<int64_t>();
  plan_.items = items_.as<kc::CudaAttnItem>();
  plan_.num_items = static_cast<int64_t>(plan.items.size());
  plan_.merges = merges_.as<kc::CudaAttnMerge>();
  plan_.num_merges = static_cast<int64_t>(plan.merges.size());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "--device cuda:%d: no such CUDA device (this machine has %d)", device, count));
  }
  if (absl::Status st = Cuda(cudaSetDevice(device), "set device"); !st.ok()) return st;
  cudaStream_t stream = nullptr;
  if (absl::Status st = Cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"); !st.ok()) {
    return st;
  }
  return std::unique_ptr<Backend>(new CudaBackend(device, stream));
}

}  // namespace specd::engine
