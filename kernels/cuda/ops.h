// CUDA kernels of the model's ops, each the twin of the kernels/ref function of the same name
// (same shapes, same meaning) and checked against it by tests/kernels/cuda_ops_test.cc (label
// gpu). These entry points take and return host memory: each uploads its inputs, runs the
// launcher of launch.h that the device-resident forward (engine/cuda_backend.cc) calls, and
// downloads the result. They are the harness's view of the kernels, not a fast path.
#ifndef SPECD_KERNELS_CUDA_OPS_H_
#define SPECD_KERNELS_CUDA_OPS_H_

#include <cstdint>

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/sampling/blockwise_verify_host.h"
#include "kernels/cuda/launch.h"
#include "kernels/kernel_types.h"

namespace specd::kernels::cuda {

// y[t, n] = sum_k W[n, k] x[t, k]: float weights (F32, F16, BF16) on float x; Q8_0, Q4_0, Q4_1
// on int8 activation blocks (kernels/act_quant.h). x: [T, w.cols]; y: [T, w.rows]. Other
// types: Unimplemented. kReference: ref::MatMul's exact arithmetic, so bitwise its result;
// kWarpPerRow: the forward's kernel (launch.h), within rounding of it and batch invariant.
absl::Status MatMulHost(const WeightMatrix& w, const float* x, int64_t T, float* y,
                        CudaMatMulKernel kernel = CudaMatMulKernel::kReference,
                        ActQuant act = ActQuant::kAuto);

// The forward's q/k/v (gate/up) products of one input x ([T, ws[0].cols]) in one launch of
// the warp kernel (LaunchMatMulsOnBlocks), n in 1..4 quantized weights of one type and width:
// ys[i]: [T, ws[i].rows], bitwise MatMulHost(ws[i], x, T, ys[i], kWarpPerRow). act: where x's
// activation blocks are made (launch.h).
absl::Status MatMulSharedHost(const WeightMatrix* ws, int n, const float* x, int64_t T, float* const* ys,
                              ActQuant act = ActQuant::kAuto);

// x: [T, num_heads, head_dim], in place. The angles come from ref::RopeInvFreq (planned on the
// host, in double as the reference), cos and sin in double on the device.
absl::Status RopeHost(float* x, int64_t T, int32_t num_heads, int32_t head_dim,
                      const int32_t* positions, const RopeParams& p);
// q: [T, q_heads, head_dim] and k: [T, k_heads, head_dim] in one launch, both in place.
absl::Status RopeQKHost(float* q, int32_t q_heads, float* k, int32_t k_heads, int64_t T,
                        int32_t head_dim, const int32_t* positions, const RopeParams& p);

// out = silu(gate) * up.  gate, up, out: [T, F].
absl::Status SwiGluHost(const float* gate, const float* up, int64_t T, int64_t F, float* out);

// x[i] += y[i], i < n.
absl::Status AddInPlaceHost(float* x, const float* y, int64_t n);

// x[t, :] += b.  x: [T, N]; b: [N].
absl::Status AddBiasHost(float* x, int64_t T, int64_t N, const float* b);

// out[t, :] = dequantized row ids[t] of table (F32, F16, BF16, Q8_0, Q4_0, Q4_1), bitwise the
// reference's values.  out: [T, table.cols].  Ids outside [0, table.rows) are an error.
absl::Status EmbeddingLookupHost(const WeightMatrix& table, const int32_t* ids, int64_t T,
                                 float* out);

// out[r, :] = x[rows[r], :].  x: [rows_of_x, D]; rows: [R] (each in [0, rows_of_x)); out: [R, D].
absl::Status GatherRowsHost(const float* x, int64_t rows_of_x, const int32_t* rows, int64_t R,
                            int64_t D, float* out);

// Stores k[t], v[t] ([num_kv_heads, head_dim]) into slot slots[t] of the pool kv (host
// memory: uploaded, written on the device, downloaded), converted as ref::WriteKv does
// (f32, f16, bf16 attention's rounding, int8 with kernels/kv_int8.h's scale). The slots must
// be distinct (the tokens write in parallel): a repeated slot is an error; a negative slot is
// a padding row, not stored.
absl::Status WriteKvHost(const float* k, const float* v, int64_t T, const int64_t* slots,
                         const PagedKvLayer& kv);

// Causal paged attention (ref::PagedAttention's contract) in the FlashAttention style: one
// thread block per planned item (kernels/cuda/attention_plan.h), each 64-key chunk of K, then
// of V, staged in shared memory, scores only for the chunk (never a [T, keys] matrix), chunk
// partials folded in order; a merge pass folds split pairs. q, out: [T, num_q_heads,
// head_dim]; the pool (any KvDtype) and block tables are host memory.
// fill_blocks: the plan's split threshold (0: the default).
absl::Status PagedAttentionHost(const float* q, int64_t T, int32_t num_q_heads,
                                const int32_t* positions, const int32_t* const* block_tables,
                                const PagedKvLayer& kv, float scale, float* out,
                                int64_t fill_blocks = 0);

// A verification step on the device: the plan and logits (host: [logits_rows, vocab]) uploaded,
// LaunchBlockwiseVerify, the outcomes collected as VerifyDraft's results. The twin it is held
// against: sampling::VerifyDraft (tests/kernels/cuda_sampling_test.cc, label gpu).
absl::StatusOr<std::vector<sampling::VerifyResult>> VerifyBlockwiseHost(
    const sampling::BlockwisePlan& plan, const float* logits, int64_t logits_rows);

// Draft proposals on the device for a plan of drafted rows (host logits [logits_rows, vocab]),
// held against sampling::MakeProposalReference (tests/kernels/cuda_sampling_test.cc).
absl::StatusOr<std::vector<sampling::BlockwiseProposal>> ProposeBlockwiseHost(
    const sampling::BlockwisePlan& plan, const float* logits, int64_t logits_rows,
    int32_t top_n);

}  // namespace specd::kernels::cuda

#endif  // SPECD_KERNELS_CUDA_OPS_H_
