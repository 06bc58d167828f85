// A draft token together with the proposal distribution q it was drawn from, as it crosses the
// wire from the drafter to the verifier (docs/DESIGN.md §2): a sparse (token id, prob) list.
#ifndef SPECD_COMMON_SAMPLING_DRAFT_PROPOSAL_H_
#define SPECD_COMMON_SAMPLING_DRAFT_PROPOSAL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/sampling/penalty_state.h"
#include "common/sampling/philox.h"
#include "common/sampling/sampling_params.h"

namespace specd::sampling {

inline constexpr int32_t kDefaultProposalTopN = 32;
// q may be off 1 by float rounding; anything further is a drafter bug.
inline constexpr double kProposalSumTolerance = 1e-3;

struct SparseProposal {
  int32_t token = -1;          // the draft token d, drawn from q
  std::vector<int32_t> ids;    // [n] distinct token ids (any order)
  std::vector<float> probs;    // [n] q(ids[j]) >= 0, summing to 1 within kProposalSumTolerance
};

// INVALID_ARGUMENT for a malformed q: size mismatch, empty, ids out of [0, vocab) or repeated,
// probs negative or not finite, sum off 1. (d outside supp(q) is NOT an error here: the
// verifier handles it, see speculative_verifier.h.)
absl::Status ValidateProposal(const SparseProposal& proposal, int32_t vocab_size);

// q(token) as the verifier reads it: probs normalized by their sum; 0 if absent.
double ProposalProb(const SparseProposal& proposal, int32_t token);

// Draws a token from q by inverse CDF in stored order, with the same normalization as
// ProposalProb. u: [0, 1).
int32_t SampleProposal(const SparseProposal& proposal, double u);

// Builds q from the draft model's logits row (logits: [vocab]) as the draft's own transformed
// distribution (BuildTargetDistribution with draft_params) truncated to its `top_n` most likely
// tokens (ties -> lower id) and renormalized, then draws d from q with
// rng.Uniform(position, kDraft). `position` is the absolute index of the drafted token. So
// "d is drawn from q" holds by construction. Greedy draft_params give a point mass.
//
// Fast: one pass over the row selects the top_n (+ a few) penalized logits, and exp() runs on
// those only — except top-p without top-k, whose denominator is the whole row's mass. Same
// q as MakeProposalReference (ids and order exact, probs within float rounding).
// confidence: if not null, receives DraftConfidence's value for this row and q, from the same
// pass over the row (a drafter that cuts its chain needs it for every draft token).
absl::StatusOr<SparseProposal> MakeProposal(absl::Span<const float> logits,
                                            const PenaltyState& history,
                                            const SamplingParams& draft_params, int32_t top_n,
                                            const CounterRng& rng, int64_t position,
                                            double* confidence = nullptr);

// How sure the draft is at a position, in [0, 1]: the largest probability of its distribution
// there — q's largest for sampled params; for greedy params (q is a point mass) the argmax's
// probability under the draft's temperature-1 distribution of its penalized logits truncated
// to their top_n (a flat row reads about 1 / top_n). It tracks how often the position's draft
// is accepted. It never looks at which token was drawn: a drafter that drops a drawn token
// because of its own q(d) would verify d against q while drafting from q restricted to the
// kept tokens, and the output would no longer follow p (the lossless test's confidence case
// fails that way: z 67). logits: [vocab], the row q was built from.
absl::StatusOr<double> DraftConfidence(absl::Span<const float> logits, const PenaltyState& history,
                                       const SamplingParams& draft_params, int32_t top_n,
                                       const SparseProposal& q);

// The plain twin: BuildTargetDistribution over the whole row, then the top_n. The tests hold
// MakeProposal against it.
absl::StatusOr<SparseProposal> MakeProposalReference(absl::Span<const float> logits,
                                                     const PenaltyState& history,
                                                     const SamplingParams& draft_params,
                                                     int32_t top_n, const CounterRng& rng,
                                                     int64_t position);

}  // namespace specd::sampling

#endif  // SPECD_COMMON_SAMPLING_DRAFT_PROPOSAL_H_
