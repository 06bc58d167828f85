// The sampling distribution p that a request's transforms make of one row of logits.
//
// BuildTargetDistribution applies, in order (see sampling_params.h):
//   x = logits (as double); penalties(x, history)
//   greedy (temperature < 1e-5): point mass on argmax x (ties -> lowest id)
//   s = x / temperature;  w_i = exp(s_i - max s)  (float precision, below)
//   top-k:  keep the k largest s (ties -> lower id)
//   top-p:  sort survivors by (w desc, id asc); keep token j while the mass strictly before it
//           is < top_p * (sum of survivors' w). The most likely token is always kept.
//   min-p:  keep survivors with w_i >= min_p * max w (max w = 1)
//   p_i = w_i / sum of kept w.
// Without truncation the result is dense (probs[vocab]); otherwise sparse (ascending ids).
#ifndef SPECD_COMMON_SAMPLING_TARGET_DISTRIBUTION_H_
#define SPECD_COMMON_SAMPLING_TARGET_DISTRIBUTION_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/sampling/penalty_state.h"
#include "common/sampling/sampling_params.h"

namespace specd::sampling {

class TargetDistribution {
 public:
  TargetDistribution() = default;
  static TargetDistribution PointMass(int32_t token, int32_t vocab_size);
  // probs: [vocab], non-negative, any positive total (normalized here).
  static TargetDistribution Dense(std::vector<double> probs);
  // ids: [n] strictly ascending in [0, vocab); probs: [n] non-negative, positive total.
  static TargetDistribution Sparse(std::vector<int32_t> ids, std::vector<double> probs,
                                   int32_t vocab_size);

  int32_t vocab_size() const { return vocab_size_; }
  bool is_dense() const { return ids_.empty(); }
  // Stored entries (all of the vocabulary when dense), in ascending id order.
  size_t size() const { return probs_.size(); }
  int32_t id(size_t i) const { return is_dense() ? static_cast<int32_t>(i) : ids_[i]; }
  double prob(size_t i) const { return probs_[i]; }
  absl::Span<const double> probs() const { return probs_; }

  // p(token); 0 for ids outside the support or the vocabulary.
  double Prob(int32_t token) const;
  // Most likely token, ties -> lowest id.
  int32_t Argmax() const;
  // Inverse CDF in ascending id order: the first token whose cumulative mass exceeds u.
  // u: [0, 1). Never returns a zero-probability token.
  int32_t Sample(double u) const;

 private:
  void Normalize();

  int32_t vocab_size_ = 0;
  std::vector<int32_t> ids_;  // empty when dense
  std::vector<double> probs_;
};

// logits: [vocab]. INVALID_ARGUMENT if the row is empty, has NaN or +inf, or every token is
// -inf after the transforms. `params` must already be valid (Validate).
// The weights exp(s_i - max s) are computed at float precision (fast_exp.h; 0 where
// s_i - max s < -87), stored and normalized in double.
absl::StatusOr<TargetDistribution> BuildTargetDistribution(absl::Span<const float> logits,
                                                           const PenaltyState& history,
                                                           const SamplingParams& params);
// The plain twin: every weight by std::exp in double. The tests hold the two within a relative
// 1e-6 per probability, with the same support.
absl::StatusOr<TargetDistribution> BuildTargetDistributionReference(
    absl::Span<const float> logits, const PenaltyState& history, const SamplingParams& params);

// The greedy token of a row: argmax of the penalized logits, ties -> lowest id. Same errors.
// Without penalties one pass over the floats; the plain twin converts the row to double first.
absl::StatusOr<int32_t> GreedyToken(absl::Span<const float> logits, const PenaltyState& history,
                                    const SamplingParams& params);
absl::StatusOr<int32_t> GreedyTokenReference(absl::Span<const float> logits,
                                             const PenaltyState& history,
                                             const SamplingParams& params);

}  // namespace specd::sampling

#endif  // SPECD_COMMON_SAMPLING_TARGET_DISTRIBUTION_H_
