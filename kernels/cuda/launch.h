// The CUDA kernels on device memory: what a device-resident forward (engine/cuda_backend.cc)
// calls, and what ops.h's host entry points wrap (upload, launch, download) for the harness.
// Plain C++: no CUDA types, so .cc files include it. Every pointer is device memory except
// where a comment says host; `stream` is a cudaStream_t (nullptr: the legacy default stream).
// A launch is asynchronous: the status is the launch's own (bad configuration, a kernel that
// cannot start); an error inside a kernel surfaces at the caller's next synchronisation.
#ifndef SPECD_KERNELS_CUDA_LAUNCH_H_
#define SPECD_KERNELS_CUDA_LAUNCH_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/sampling/blockwise_propose.h"
#include "common/sampling/blockwise_verify.h"
#include "kernels/cuda/attention_plan.h"
#include "kernels/kernel_types.h"

namespace specd::kernels::cuda {

// x, out: [T, D]; w: [D]
absl::Status LaunchRmsNorm(const float* x, int64_t T, int64_t D, const float* w, float eps,
                           float* out, void* stream);
// x += y, then out = RmsNorm(x): bitwise LaunchAddInPlace then LaunchRmsNorm, one launch.
// x, y, out: [T, D]; w: [D]
absl::Status LaunchAddRmsNorm(float* x, const float* y, int64_t T, int64_t D, const float* w,
                              float eps, float* out, void* stream);
// x: [T, num_heads, head_dim] in place; inv_freq: [rope_dim / 2] doubles (ref::RopeInvFreq,
// planned on the host and uploaded once).
absl::Status LaunchRope(float* x, int64_t T, int32_t num_heads, int32_t head_dim,
                        int32_t rope_dim, bool neox, const int32_t* positions,
                        const double* inv_freq, void* stream);
// q: [T, q_heads, head_dim] and k: [T, k_heads, head_dim] at the same positions, one launch:
// each bitwise its own LaunchRope.
absl::Status LaunchRopeQK(float* q, int32_t q_heads, float* k, int32_t k_heads, int64_t T,
                          int32_t head_dim, int32_t rope_dim, bool neox,
                          const int32_t* positions, const double* inv_freq, void* stream);
absl::Status LaunchSwiGlu(const float* gate, const float* up, int64_t n, float* out,
                          void* stream);
absl::Status LaunchAddInPlace(float* x, const float* y, int64_t n, void* stream);
absl::Status LaunchAddBias(float* x, int64_t T, int64_t N, const float* b, void* stream);
// table.data in device memory; ids must be in [0, table.rows) (the model validated them).
absl::Status LaunchEmbeddingLookup(const WeightMatrix& table, const int32_t* ids, int64_t T,
                                   float* out, void* stream);
// out[r, :] = x[rows[r], :].  x: [*, D]; rows: [R]; out: [R, D]
absl::Status LaunchGatherRows(const float* x, const int32_t* rows, int64_t R, int64_t D,
                              float* out, void* stream);
// The pool (kv.k, kv.v, scales) in device memory; slots distinct.
absl::Status LaunchWriteKv(const float* k, const float* v, int64_t T, const int64_t* slots,
                           const PagedKvLayer& kv, void* stream);
// Which MatMul kernel: a warp per weight row reading it once for up to 8 tokens (the default:
// decode and verification), or one thread per (row, token) with the reference's exact steps
// (bitwise ref::MatMul; slow). Both batch invariant.
enum class CudaMatMulKernel { kWarpPerRow, kReference };
// Where a quantized product's int8 activation blocks are made: kAuto, inside the warp kernel's
// own thread blocks (shared memory, one launch) when T's blocks fit 32 KiB, else by a launch of
// their own before it; kSeparateLaunch always the latter. The same blocks either way, so the
// same bits.
enum class ActQuant { kAuto, kSeparateLaunch };

// Bytes of activation blocks MatMul needs for T tokens of `cols` inputs (quantized weights).
int64_t MatMulScratchBytes(int64_t T, int64_t cols);
// y: [T, w.rows] = x: [T, w.cols] W^T (quantized weights on int8 activation blocks, as
// ref::MatMul). scratch: MatMulScratchBytes(T, w.cols) bytes of device memory.
absl::Status LaunchMatMul(const WeightMatrix& w, const float* x, int64_t T, float* y,
                          void* scratch, void* stream,
                          CudaMatMulKernel kernel = CudaMatMulKernel::kWarpPerRow,
                          ActQuant act = ActQuant::kAuto);

// MatMul's two steps, for several products of one input (q, k, v; gate, up): x's int8
// activation blocks once (scratch: MatMulScratchBytes(T, cols)), then each quantized weight's
// product on them. LaunchMatMul of a quantized weight is exactly these two.
absl::Status LaunchQuantizeAct(const float* x, int64_t T, int64_t cols, void* scratch, void* stream);
absl::Status LaunchMatMulOnBlocks(const WeightMatrix& w, const void* act_blocks, int64_t T, float* y,
                                  void* stream,
                                  CudaMatMulKernel kernel = CudaMatMulKernel::kWarpPerRow);
// LaunchMatMulOnBlocks for n weights of one input (q, k, v; gate, up) into ys[i]: one launch
// when the warp kernel runs and they share a quantized type and width (every row's bits the
// same as its own launch's), else one launch each.
absl::Status LaunchMatMulsOnBlocks(const WeightMatrix* ws, int n, const void* act_blocks, int64_t T,
                                   float* const* ys, void* stream,
                                   CudaMatMulKernel kernel = CudaMatMulKernel::kWarpPerRow);
// n products of one float input x: [T, ws[0].cols] (all quantized, one type and width): one
// launch of the warp kernel that also quantizes x (ActQuant::kAuto, T's blocks fitting), else
// LaunchQuantizeAct into scratch then LaunchMatMulsOnBlocks.
absl::Status LaunchMatMuls(const WeightMatrix* ws, int n, const float* x, int64_t T, float* const* ys,
                           void* scratch, void* stream,
                           CudaMatMulKernel kernel = CudaMatMulKernel::kWarpPerRow,
                           ActQuant act = ActQuant::kAuto);

// One step's attention plan in device memory (PlanCudaAttention's items and merges, every
// token's block table flattened), used by every layer of the step.
struct DeviceAttentionPlan {
  int64_t T = 0;
  const int32_t* positions = nullptr;       // [T]
  const int32_t* tables = nullptr;          // the tables, concatenated
  const int64_t* table_offsets = nullptr;   // [T]: where token t's table starts
  const CudaAttnItem* items = nullptr;
  int64_t num_items = 0;
  const CudaAttnMerge* merges = nullptr;
  int64_t num_merges = 0;
  float* partials = nullptr;                // num_partials * CudaAttnPartialFloats(group, d)
  // For a recorded step (a CUDA graph, replayed at every step of its shape): counts is device
  // [num_items, num_merges] of the step being run, and the kernels launch item_grid and
  // merge_grid blocks (the plan buffers' capacities), the ones past the counts doing nothing.
  // null: the grids are num_items and num_merges.
  const int64_t* counts = nullptr;
  int64_t item_grid = 0;
  int64_t merge_grid = 0;
};
// q, out: [plan.T, num_q_heads, head_dim].
absl::Status LaunchPagedAttention(const float* q, int32_t num_q_heads, const PagedKvLayer& kv,
                                  float scale, float* out, const DeviceAttentionPlan& plan,
                                  void* stream);

// Speculative verification of a step on the device (common/sampling/blockwise_verify.h): the
// plan's arrays (BlockwisePlan, uploaded), the step's logits and the outputs, all device memory.
// Only tokens, logprobs (top ones where asked) and outcomes need to leave the device.
struct DeviceVerifyBuffers {
  sampling::blockwise::PlanView plan;          // its arrays in device memory
  const float* logits = nullptr;               // [*, plan.vocab]: every row the plan names
  float* weights = nullptr;                    // [plan.num_rows, plan.vocab] scratch
  sampling::blockwise::RowSummary* summaries = nullptr;  // [plan.num_rows]
  sampling::blockwise::SeqOutcome* outcomes = nullptr;   // [plan.num_seqs]
  int32_t* tokens = nullptr;                   // [plan.num_rows]
  float* logprobs = nullptr;                   // [plan.num_rows]
  sampling::blockwise::TopLogprobEntry* top = nullptr;  // [plan.num_rows, kMaxLogprobsValue]
};
// Two launches: one block per verify row, then one per sequence.
absl::Status LaunchBlockwiseVerify(const DeviceVerifyBuffers& buffers, void* stream);

// A draft's proposals where its logits are (common/sampling/blockwise_propose.h): one block
// per drafted row; q's ids and probs [rows, top_n] in rank order and each row's ProposalOut.
struct DeviceProposeBuffers {
  sampling::blockwise::PlanView plan;  // its arrays in device memory; one sequence per row
  const float* logits = nullptr;       // [*, plan.vocab]
  float* weights = nullptr;            // [plan.num_rows, plan.vocab] scratch
  int32_t top_n = 0;                   // [1, kMaxBlockwiseTopN]
  int32_t* ids = nullptr;              // [plan.num_rows, top_n]
  float* probs = nullptr;              // [plan.num_rows, top_n]
  float* scratch = nullptr;            // [plan.num_rows, top_n]
  sampling::blockwise::ProposalOut* outs = nullptr;  // [plan.num_rows]
};
absl::Status LaunchBlockwisePropose(const DeviceProposeBuffers& buffers, void* stream);

}  // namespace specd::kernels::cuda

#endif  // SPECD_KERNELS_CUDA_LAUNCH_H_
