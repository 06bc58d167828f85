// One ragged forward pass: the new tokens of many sequences, flattened.
#ifndef SPECD_ENGINE_FORWARD_BATCH_H_
#define SPECD_ENGINE_FORWARD_BATCH_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "engine/paged_kv_cache.h"

namespace specd::engine {

// `num_tokens` consecutive entries of ForwardBatch::tokens, at positions
// start_pos .. start_pos + num_tokens - 1 of sequence `seq`. The sequence's KV cache is cut
// back to start_pos first, so a verification row after a rejection simply restarts there.
struct SequenceSlice {
  SeqId seq = 0;
  int32_t start_pos = 0;
  int32_t num_tokens = 0;
};

// Prefill (whole or chunked prompt), decode (one token) and verification ([last, d1..dk],
// causal within the slice) are all the same thing: slices of a ForwardBatch.
struct ForwardBatch {
  std::vector<int32_t> tokens;         // [num_tokens], slices back to back
  std::vector<SequenceSlice> slices;   // each sequence at most once
  std::vector<int32_t> logit_rows;     // indices into `tokens` whose logits are returned
  // A feature-conditioned draft (LlamaModel::feature_conditioned()) reads, with every token, the
  // hidden state it is conditioned on: [num_tokens, embedding_dim], back to back like `tokens`.
  // Empty for every other model.
  std::vector<float> input_features;
  // Indices into `tokens` whose final hidden state (the last layer's output, before
  // output_norm) the forward also returns: what a feature-conditioned draft is fed with.
  std::vector<int32_t> hidden_rows;

  void Clear() {
    tokens.clear();
    slices.clear();
    logit_rows.clear();
    input_features.clear();
    hidden_rows.clear();
  }
  // A prompt chunk: its KV is written, nobody needs its logits.
  void AddPrompt(SeqId seq, int32_t start_pos, const int32_t* ids, int32_t n) {
    tokens.insert(tokens.end(), ids, ids + n);
    slices.push_back({seq, start_pos, n});
  }
  // A verification group: `context` = the committed tokens not yet computed, ending with the
  // last one x_n (usually x_n alone), then the drafts d_1..d_k; logits for the last k + 1 rows
  // (x_n, d_1..d_k), which give p_1..p_{k+1}. Returns the index of its first logit row.
  int32_t AddVerify(SeqId seq, int32_t start_pos, absl::Span<const int32_t> context,
                    absl::Span<const int32_t> drafts) {
    const int32_t base = static_cast<int32_t>(tokens.size());
    tokens.insert(tokens.end(), context.begin(), context.end());
    tokens.insert(tokens.end(), drafts.begin(), drafts.end());
    const int32_t n = static_cast<int32_t>(context.size() + drafts.size());
    slices.push_back({seq, start_pos, n});
    const int32_t first_row = static_cast<int32_t>(logit_rows.size());
    for (int32_t r = static_cast<int32_t>(context.size()) - 1; r < n; ++r) {
      logit_rows.push_back(base + r);
    }
    return first_row;
  }
  // Appends a slice; when `all_logits` every new token's row is requested, else only the last.
  void Add(SeqId seq, int32_t start_pos, const int32_t* ids, int32_t n, bool all_logits) {
    const int32_t base = static_cast<int32_t>(tokens.size());
    tokens.insert(tokens.end(), ids, ids + n);
    slices.push_back({seq, start_pos, n});
    if (all_logits) {
      for (int32_t i = 0; i < n; ++i) logit_rows.push_back(base + i);
    } else if (n > 0) {
      logit_rows.push_back(base + n - 1);
    }
  }
};

}  // namespace specd::engine

#endif  // SPECD_ENGINE_FORWARD_BATCH_H_
