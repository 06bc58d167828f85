// Plain (non-speculative) sampling of one token, and the logprobs reported with every token.
//
// Reported logprobs are the log-softmax of the RAW logits row (before penalties, temperature and
// truncation): the model's own belief, as OpenAI-style APIs report it, and independent of the
// sampling settings. A token the transforms made impossible still gets its raw logprob.
#ifndef SPECD_COMMON_SAMPLING_SAMPLER_H_
#define SPECD_COMMON_SAMPLING_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/sampling/penalty_state.h"
#include "common/sampling/philox.h"
#include "common/sampling/sampling_params.h"

namespace specd::sampling {

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

struct SampledToken {
  int32_t token = -1;
  float logprob = 0.0f;                    // raw log-softmax of `token`
  std::vector<TokenLogprob> top_logprobs;  // [num_logprobs] most likely by raw logit, ties -> id
};

// log sum_i exp(logits_i): the log-softmax's normalizer of a raw row (-inf entries add 0).
// logits: [vocab], no NaN or +inf, at least one finite entry. Fast: float exps summed in
// double (fast_exp.h); the reference twin: std::exp in double. They agree within ~1e-6.
double LogNormalizer(absl::Span<const float> logits);
double LogNormalizerReference(absl::Span<const float> logits);

// logits: [vocab] raw. Fills logprob and the top-n list for an already chosen token.
SampledToken DescribeToken(absl::Span<const float> logits, int32_t token, int32_t num_logprobs);

// Samples the token at absolute sequence `position` from the request's target distribution using
// rng.Uniform(position, kSample); greedy when IsGreedy(params). logits: [vocab] raw; history:
// the request's tokens so far. INVALID_ARGUMENT for invalid params or a malformed row.
absl::StatusOr<SampledToken> Sample(absl::Span<const float> logits, const PenaltyState& history,
                                    const SamplingParams& params, const CounterRng& rng,
                                    int64_t position);

}  // namespace specd::sampling

#endif  // SPECD_COMMON_SAMPLING_SAMPLER_H_
