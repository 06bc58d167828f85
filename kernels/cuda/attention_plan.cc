#include "kernels/cuda/attention_plan.h"

namespace specd::kernels::cuda {

CudaAttentionPlan PlanCudaAttention(const int32_t* positions, int64_t T, int32_t num_kv_heads,
                                    const CudaAttentionPlanOptions& options) {
  CudaAttentionPlan plan;
  const int64_t pairs = T * num_kv_heads;
  // Few pairs (decode of a few sequences) cannot fill the device one block per pair: their
  // long contexts split into one block per chunk. Splitting changes no bit (see the header).
  const bool split = pairs < options.fill_blocks;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t chunks = (positions[t] + kCudaAttnChunk) / kCudaAttnChunk;
    for (int32_t h = 0; h < num_kv_heads; ++h) {
      if (!split || chunks == 1) {
        plan.items.push_back(CudaAttnItem{static_cast<int32_t>(t), h, 0, chunks, -1});
        continue;
      }
      plan.merges.push_back(CudaAttnMerge{static_cast<int32_t>(t), h, plan.num_partials, chunks});
      for (int32_t c = 0; c < chunks; ++c) {
        plan.items.push_back(CudaAttnItem{static_cast<int32_t>(t), h, c, c + 1, plan.num_partials + c});
      }
      plan.num_partials += chunks;
    }
  }
  return plan;
}

}  // namespace specd::kernels::cuda
