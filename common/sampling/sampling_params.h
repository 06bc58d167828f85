// Per-request sampling parameters, their validation, and the order the transforms run in.
//
// Transform order (the same everywhere: plain sampling, drafting, verification):
//   1. penalties on the raw logits: repetition (llama/HF style, over prompt + generated tokens),
//      then presence and frequency (OpenAI style, over generated tokens only);
//   2. temperature (0, or below 1e-5 = greedy: point mass on the argmax of the penalized logits, ties -> lowest
//      id; steps 3-5 are skipped);
//   3. top-k;
//   4. top-p over the top-k survivors, renormalized;
//   5. min-p relative to the most likely survivor;
// then renormalize. See target_distribution.h for the exact rules.
#ifndef SPECD_COMMON_SAMPLING_SAMPLING_PARAMS_H_
#define SPECD_COMMON_SAMPLING_SAMPLING_PARAMS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace specd::sampling {

inline constexpr int32_t kMaxLogprobs = 20;
inline constexpr float kMaxRepetitionPenalty = 10.0f;
inline constexpr float kMaxPresenceFrequencyPenalty = 2.0f;  // OpenAI's range is [-2, 2]

struct SamplingParams {
  float temperature = 1.0f;         // 0 (< 1e-5) = greedy; otherwise logits / temperature
  int32_t top_k = 0;                // 0 = off; >= vocab is also off
  float top_p = 1.0f;               // (0, 1]; 1 = off
  float min_p = 0.0f;               // [0, 1]; 0 = off
  float repetition_penalty = 1.0f;  // (0, 10]; 1 = off. seen token: logit>0 ? l/r : l*r
  float presence_penalty = 0.0f;    // [-2, 2]; subtracted once from each generated token's logit
  float frequency_penalty = 0.0f;   // [-2, 2]; subtracted once per occurrence in generated tokens
  uint64_t seed = 0;                // keys the request's CounterRng; the router picks one if unset
  int32_t num_logprobs = 0;         // top-n raw logprobs returned per emitted token, [0, 20]
  std::vector<int32_t> stop_token_ids;  // stop after emitting any of these
  bool ignore_eos = false;              // if true the model's EOS ids do not stop the request
};

// INVALID_ARGUMENT naming the offending field, e.g. "top_p must be in (0, 1], got 0".
absl::Status Validate(const SamplingParams& params, int32_t vocab_size);

// Temperatures below this sample greedily: logits / T would overflow long before T reaches 0,
// and the distribution is already a point mass to double precision.
inline constexpr float kGreedyTemperature = 1e-5f;

// The one test for "greedy", used by every path (sampler, drafter, verifier).
inline bool IsGreedy(const SamplingParams& params) {
  return params.temperature < kGreedyTemperature;
}

inline bool HasPenalties(const SamplingParams& params) {
  return params.repetition_penalty != 1.0f || params.presence_penalty != 0.0f ||
         params.frequency_penalty != 0.0f;
}

// True if emitting `token` ends the request: a stop token id, or an EOS id unless ignore_eos.
bool IsStopToken(const SamplingParams& params, absl::Span<const int32_t> eos_token_ids,
                 int32_t token);

}  // namespace specd::sampling

#endif  // SPECD_COMMON_SAMPLING_SAMPLING_PARAMS_H_
