// Speculative verification on the device: blockwise_verify.h's two phases, one thread block per
// verify row (SummarizeRow) and per sequence (FinishSequence), over a CudaBlock whose
// collectives are warp shuffles folded through shared memory in a fixed order (so a row's
// result does not depend on what else is in the step). Built without fused multiply-adds
// (CMakeLists.txt) so the per-token values are the CPU's bits.
#include <cuda_runtime.h>

#include <vector>

#include "common/sampling/blockwise_propose.h"
#include "common/sampling/blockwise_verify.h"
#include "common/sampling/blockwise_verify_host.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/ops.h"

namespace specd::kernels::cuda {
namespace {

namespace bw = ::specd::sampling::blockwise;

constexpr int kSamplingThreads = 512;  // a multiple of 32, at most 32 warps
constexpr int kMaxWarps = 32;
static_assert(kSamplingThreads % 32 == 0 && kSamplingThreads <= 32 * kMaxWarps);

// The Block of blockwise_verify.h on a CUDA thread block. Every collective is called by all
// threads; the slots are reused after a second barrier.
class CudaBlock {
 public:
  __device__ CudaBlock(double* d, long long* l) : d_(d), l_(l) {}
  __device__ int tid() const { return static_cast<int>(threadIdx.x); }
  __device__ int size() const { return static_cast<int>(blockDim.x); }
  __device__ void Sync() { __syncthreads(); }

  __device__ double Sum(double v) { return Reduce(v, d_, 0.0, Plus<double>()); }
  __device__ int64_t SumInt(int64_t v) {
    return Reduce(static_cast<long long>(v), l_, 0LL, Plus<long long>());
  }
  __device__ double Max(double v) { return Reduce(v, d_, -__builtin_huge_val(), MaxOp<double>()); }
  __device__ int32_t MinInt(int32_t v) {
    return static_cast<int32_t>(Reduce(static_cast<long long>(v), l_, 0x7fffffffLL, MinOp()));
  }
  __device__ int32_t MaxInt(int32_t v) {
    return static_cast<int32_t>(Reduce(static_cast<long long>(v), l_, -0x7fffffffLL - 1, MaxOp<long long>()));
  }

  // Warp-level inclusive scans (Hillis-Steele by shuffles), the warps' totals scanned by warp
  // 0; `before` is the previous thread's `through`, fetched rather than recomputed.
  __device__ void InclusiveScan(double v, double* before, double* through) {
    const int lane = tid() % 32, warp = tid() / 32, warps = size() / 32;
    double incl = v;
    for (int o = 1; o < 32; o <<= 1) {
      const double up = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += up;
    }
    if (lane == 31) d_[warp] = incl;
    __syncthreads();
    if (warp == 0) {
      double total = lane < warps ? d_[lane] : 0.0;
      for (int o = 1; o < 32; o <<= 1) {
        const double up = __shfl_up_sync(0xffffffffu, total, o);
        if (lane >= o) total += up;
      }
      d_[kMaxWarps + lane] = total;  // inclusive over warps 0..lane
    }
    __syncthreads();
    const double warp_before = warp == 0 ? 0.0 : d_[kMaxWarps + warp - 1];
    const double mine = warp_before + incl;
    // The previous thread's value: a shuffle inside the warp, the previous warp's last across.
    double prev = __shfl_up_sync(0xffffffffu, mine, 1);
    if (lane == 31) l_[warp] = __double_as_longlong(mine);
    __syncthreads();
    if (lane == 0) prev = warp == 0 ? 0.0 : __longlong_as_double(l_[warp - 1]);
    *before = prev;
    *through = mine;
    __syncthreads();
  }

 private:
  template <class T>
  struct Plus {
    __device__ T operator()(T a, T b) const { return a + b; }
  };
  template <class T>
  struct MaxOp {
    __device__ T operator()(T a, T b) const { return a > b ? a : b; }
  };
  struct MinOp {
    __device__ long long operator()(long long a, long long b) const { return a < b ? a : b; }
  };

  // A butterfly inside each warp (every lane ends with the same bits), then warp 0 folds the
  // warps' values the same way; the result is broadcast through slot kMaxWarps.
  template <class T, class Op>
  __device__ T Reduce(T v, T* slots, T identity, Op op) {
    const int lane = tid() % 32, warp = tid() / 32, warps = size() / 32;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) slots[warp] = v;
    __syncthreads();
    if (warp == 0) {
      T w = lane < warps ? slots[lane] : identity;
      for (int o = 16; o > 0; o >>= 1) w = op(w, __shfl_xor_sync(0xffffffffu, w, o));
      if (lane == 0) slots[kMaxWarps] = w;
    }
    __syncthreads();
    const T result = slots[kMaxWarps];
    __syncthreads();
    return result;
  }

  double* d_;
  long long* l_;
};

__global__ void __launch_bounds__(kSamplingThreads) SummarizeRowsKernel(bw::PlanView plan, const float* logits, float* weights,
                                    bw::RowSummary* summaries) {
  __shared__ double d[2 * kMaxWarps];
  __shared__ long long l[kMaxWarps + 1];
  CudaBlock b(d, l);
  const int32_t r = static_cast<int32_t>(blockIdx.x);
  const bw::RowSummary s =
      bw::SummarizeRow(b, plan, r, logits, weights + static_cast<int64_t>(r) * plan.vocab);
  if (threadIdx.x == 0) summaries[r] = s;
}

__global__ void __launch_bounds__(kSamplingThreads) FinishSequencesKernel(bw::PlanView plan, const float* logits,
                                      const float* weights, const bw::RowSummary* summaries,
                                      bw::SeqOutcome* outcomes, int32_t* tokens,
                                      float* logprobs, bw::TopLogprobEntry* top) {
  __shared__ double d[2 * kMaxWarps];
  __shared__ long long l[kMaxWarps + 1];
  CudaBlock b(d, l);
  const int32_t q = static_cast<int32_t>(blockIdx.x);
  const bw::SeqOutcome o =
      bw::FinishSequence(b, plan, q, logits, weights, summaries, tokens, logprobs, top);
  if (threadIdx.x == 0) outcomes[q] = o;
}

// One block per drafted row: the draft's transforms summarized, then its q ranked and d drawn.
__global__ void __launch_bounds__(kSamplingThreads) ProposeRowsKernel(bw::PlanView plan, const float* logits, float* weights,
                                  int32_t top_n, int32_t* ids, float* probs, float* scratch,
                                  bw::ProposalOut* outs) {
  __shared__ double d[2 * kMaxWarps];
  __shared__ long long l[kMaxWarps + 1];
  CudaBlock b(d, l);
  const int32_t r = static_cast<int32_t>(blockIdx.x);
  float* w = weights + static_cast<int64_t>(r) * plan.vocab;
  const bw::RowSummary s = bw::SummarizeRow(b, plan, r, logits, w);
  const int64_t at = static_cast<int64_t>(r) * top_n;
  const bw::ProposalOut o =
      bw::ProposeFromRow(b, plan, r, logits, w, s, top_n, ids + at, probs + at, scratch + at);
  if (threadIdx.x == 0) outs[r] = o;
}

// The plan's arrays in device memory, copied from the host plan (one upload each).
struct UploadedPlan {
  DeviceArray<bw::Transforms> transforms;
  DeviceArray<bw::RowPlan> rows;
  DeviceArray<bw::SeqPlan> seqs;
  DeviceArray<bw::PenaltyEntry> penalties;
  DeviceArray<bw::ProposalEntry> proposals;
  DeviceArray<int32_t> stop_ids;

  absl::Status Upload(const sampling::BlockwisePlan& plan, bw::PlanView* view) {
    absl::Status st = transforms.Upload(plan.transforms().data(), plan.transforms().size());
    // Update keeps the first error.
    if (st.ok()) st.Update(rows.Upload(plan.rows().data(), plan.rows().size()));
    if (st.ok()) st.Update(seqs.Upload(plan.seqs().data(), plan.seqs().size()));
    if (st.ok()) st.Update(penalties.Upload(plan.penalties().data(), plan.penalties().size()));
    if (st.ok()) st.Update(proposals.Upload(plan.proposals().data(), plan.proposals().size()));
    if (st.ok()) st.Update(stop_ids.Upload(plan.stop_ids().data(), plan.stop_ids().size()));
    *view = plan.View();
    view->transforms = transforms.get();
    view->rows = rows.get();
    view->seqs = seqs.get();
    view->penalties = penalties.get();
    view->proposals = proposals.get();
    view->stop_ids = stop_ids.get();
    return st;
  }
};

}  // namespace

absl::Status LaunchBlockwisePropose(const DeviceProposeBuffers& buf, void* stream) {
  if (buf.plan.num_rows == 0) return absl::OkStatus();
  if (buf.top_n < 1 || buf.top_n > bw::kMaxBlockwiseTopN) {
    return absl::InvalidArgumentError("top_n is outside [1, kMaxBlockwiseTopN]");
  }
  ProposeRowsKernel<<<buf.plan.num_rows, kSamplingThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      buf.plan, buf.logits, buf.weights, buf.top_n, buf.ids, buf.probs, buf.scratch, buf.outs);
  return CudaCheck(cudaGetLastError(), "ProposeRows");
}

absl::StatusOr<std::vector<sampling::BlockwiseProposal>> ProposeBlockwiseHost(
    const sampling::BlockwisePlan& plan, const float* logits, int64_t logits_rows,
    int32_t top_n) {
  const int64_t vocab = plan.vocab();
  if (absl::Status st = plan.CheckReadsWithin(logits_rows); !st.ok()) return st;
  if (absl::Status st = sampling::CheckProposalTopN(top_n); !st.ok()) return st;
  const size_t R = static_cast<size_t>(plan.num_rows());
  UploadedPlan up;
  DeviceProposeBuffers buf;
  DeviceArray<float> d_logits, weights, probs, scratch;
  DeviceArray<int32_t> ids;
  DeviceArray<bw::ProposalOut> outs;
  absl::Status st = up.Upload(plan, &buf.plan);
  if (st.ok()) st.Update(d_logits.Upload(logits, static_cast<size_t>(logits_rows * vocab)));
  if (st.ok()) st.Update(weights.Alloc(R * vocab));
  if (st.ok()) st.Update(probs.Alloc(R * top_n));
  if (st.ok()) st.Update(scratch.Alloc(R * top_n));
  if (st.ok()) st.Update(ids.Alloc(R * top_n));
  if (st.ok()) st.Update(outs.Alloc(R));
  if (!st.ok()) return st;
  buf.logits = d_logits.get();
  buf.weights = weights.get();
  buf.top_n = top_n;
  buf.ids = ids.get();
  buf.probs = probs.get();
  buf.scratch = scratch.get();
  buf.outs = outs.get();
  st.Update(LaunchBlockwisePropose(buf, nullptr));
  if (st.ok()) st.Update(CudaCheck(cudaDeviceSynchronize(), "blockwise propose"));
  std::vector<bw::ProposalOut> host_outs(R);
  std::vector<int32_t> host_ids(R * top_n);
  std::vector<float> host_probs(R * top_n);
  if (st.ok()) st.Update(outs.Download(host_outs.data(), R));
  if (st.ok()) st.Update(ids.Download(host_ids.data(), host_ids.size()));
  if (st.ok()) st.Update(probs.Download(host_probs.data(), host_probs.size()));
  if (!st.ok()) return st;
  return sampling::CollectProposals(plan, host_outs, host_ids, host_probs, top_n);
}

absl::Status LaunchBlockwiseVerify(const DeviceVerifyBuffers& buf, void* stream) {
  const bw::PlanView& plan = buf.plan;
  if (plan.num_rows == 0) return absl::OkStatus();
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  SummarizeRowsKernel<<<plan.num_rows, kSamplingThreads, 0, s>>>(plan, buf.logits, buf.weights,
                                                                 buf.summaries);
  if (absl::Status st = CudaCheck(cudaGetLastError(), "SummarizeRows"); !st.ok()) return st;
  if (plan.num_seqs == 0) return absl::OkStatus();
  FinishSequencesKernel<<<plan.num_seqs, kSamplingThreads, 0, s>>>(
      plan, buf.logits, buf.weights, buf.summaries, buf.outcomes, buf.tokens, buf.logprobs,
      buf.top);
  return CudaCheck(cudaGetLastError(), "FinishSequences");
}

absl::StatusOr<std::vector<sampling::VerifyResult>> VerifyBlockwiseHost(
    const sampling::BlockwisePlan& plan, const float* logits, int64_t logits_rows) {
  const int64_t vocab = plan.vocab();
  if (absl::Status st = plan.CheckReadsWithin(logits_rows); !st.ok()) return st;
  UploadedPlan up;
  DeviceVerifyBuffers buf;
  DeviceArray<float> d_logits, weights, logprobs;
  DeviceArray<bw::RowSummary> summaries;
  DeviceArray<bw::SeqOutcome> outcomes;
  DeviceArray<int32_t> tokens;
  DeviceArray<bw::TopLogprobEntry> top;
  const size_t top_n = static_cast<size_t>(plan.num_rows()) * bw::kMaxLogprobsValue;
  absl::Status st = up.Upload(plan, &buf.plan);
  if (st.ok()) st.Update(d_logits.Upload(logits, static_cast<size_t>(logits_rows * vocab)));
  if (st.ok()) st.Update(top.Alloc(top_n));
  if (st.ok()) st.Update(weights.Alloc(static_cast<size_t>(plan.num_rows()) * vocab));
  if (st.ok()) st.Update(summaries.Alloc(plan.num_rows()));
  if (st.ok()) st.Update(outcomes.Alloc(plan.num_seqs()));
  if (st.ok()) st.Update(tokens.Alloc(plan.num_rows()));
  if (st.ok()) st.Update(logprobs.Alloc(plan.num_rows()));
  if (!st.ok()) return st;

  buf.logits = d_logits.get();
  buf.weights = weights.get();
  buf.summaries = summaries.get();
  buf.outcomes = outcomes.get();
  buf.tokens = tokens.get();
  buf.logprobs = logprobs.get();
  buf.top = top.get();
  st.Update(LaunchBlockwiseVerify(buf, nullptr));
  if (st.ok()) st.Update(CudaCheck(cudaDeviceSynchronize(), "blockwise verify"));
  if (!st.ok()) return st;

  std::vector<bw::SeqOutcome> host_outcomes(plan.num_seqs());
  std::vector<int32_t> host_tokens(plan.num_rows());
  std::vector<float> host_logprobs(plan.num_rows());
  st.Update(outcomes.Download(host_outcomes.data(), host_outcomes.size()));
  if (st.ok()) st.Update(tokens.Download(host_tokens.data(), host_tokens.size()));
  if (st.ok()) st.Update(logprobs.Download(host_logprobs.data(), host_logprobs.size()));
  std::vector<bw::TopLogprobEntry> host_top(top_n);
  if (st.ok()) st.Update(top.Download(host_top.data(), host_top.size()));
  if (!st.ok()) return st;
  return sampling::CollectResults(plan, host_outcomes, host_tokens, host_logprobs, host_top);
}

}  // namespace specd::kernels::cuda
