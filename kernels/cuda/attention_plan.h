// Host-side plan of the CUDA paged attention (plan on the host, run on the device): which
// thread block computes which (query token, kv head, key chunks), and which partials a merge
// pass folds. Plain C++ (no CUDA), so it is built and tested on every machine.
//
// The arithmetic follows kernels/cpu's: a pair's keys split into fixed chunks of
// kCudaAttnChunk keys; each chunk gives a raw partial (o from zero, its max m, its exp-sum l);
// the pair's output is the left fold of its chunks' partials in chunk order. A work item
// folds all chunks of its pair, or (split) computes exactly one chunk and stores its raw
// partial for the merge pass, which folds them in the same order. So splitting never changes
// a bit, and neither does which other tokens share the launch: a row's output depends only on
// its own query, position and keys (batch invariance, as on the CPU).
#ifndef SPECD_KERNELS_CUDA_ATTENTION_PLAN_H_
#define SPECD_KERNELS_CUDA_ATTENTION_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace specd::kernels::cuda {

inline constexpr int32_t kCudaAttnChunk = 64;

// One thread block: chunks [c0, c1) of the pair (token t, kv head h), all `group` query heads
// of that kv head. partial < 0: fold them and write the output rows; otherwise c1 == c0 + 1
// and the raw partial goes to partials + partial * CudaAttnPartialFloats(group, d).
struct CudaAttnItem {
  int32_t t;
  int32_t h;
  int32_t c0;
  int32_t c1;
  int64_t partial;
};

// Folds partials first .. first + count - 1 (chunk order) of the pair (t, h) into its output.
struct CudaAttnMerge {
  int32_t t;
  int32_t h;
  int64_t first;
  int32_t count;
};

struct CudaAttentionPlan {
  std::vector<CudaAttnItem> items;
  std::vector<CudaAttnMerge> merges;
  int64_t num_partials = 0;
};

struct CudaAttentionPlanOptions {
  // Blocks that fill the device: fewer pairs than this split their chunks (one item each).
  int64_t fill_blocks = 2 * 132;  // two blocks on each of an H100/H200's 132 SMs
};

// positions: [T] (each >= 0); every token's pair with each of num_kv_heads kv heads.
CudaAttentionPlan PlanCudaAttention(const int32_t* positions, int64_t T, int32_t num_kv_heads,
                                    const CudaAttentionPlanOptions& options = {});

// Floats of one stored partial: o [group][d], m [group], l [group].
inline int64_t CudaAttnPartialFloats(int32_t group, int32_t head_dim) {
  return static_cast<int64_t>(group) * (head_dim + 2);
}

// Dynamic shared memory of one attention block: q [group][d], one chunk of K or V
// [kCudaAttnChunk][d + 1] (padded against bank conflicts), scores [group][kCudaAttnChunk],
// the chunk's partial and the fold state [group][d] each, and 7 floats per row.
inline size_t CudaAttnSharedBytes(int32_t group, int32_t head_dim) {
  const int64_t g = group, d = head_dim;
  return sizeof(float) * static_cast<size_t>(g * d + kCudaAttnChunk * (d + 1) + g * kCudaAttnChunk +
                                             2 * g * d + 7 * g);
}

}  // namespace specd::kernels::cuda

#endif  // SPECD_KERNELS_CUDA_ATTENTION_PLAN_H_
