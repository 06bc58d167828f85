// Lossless verification of a speculative draft (docs/DESIGN.md §2; Leviathan et al. 2023, Chen et al.
// 2023).
//
// Given target rows p_1..p_{k+1} (row i conditioned on the committed tokens + d_1..d_{i-1}, and
// made into a distribution with the request's transforms, penalties counting d_1..d_{i-1}) and
// drafts d_i ~ q_i: for i = 1..k accept d_i iff u_i < p_i(d_i) / q_i(d_i) (u_i = rng(position of
// d_i, kAccept)), i.e. with probability min(1, p_i(d_i)/q_i(d_i)); on the first rejection emit a
// correction drawn from norm(max(0, p_i - q_i)) (rng kResample) and stop; if all k are accepted
// emit a bonus token from p_{k+1} (rng kSample). Every emitted token then has exactly the
// target's distribution.
//
// Greedy (IsGreedy: temperature < 1e-5): accept while d_i == argmax p_i, then emit that argmax; q is ignored.
//
// Edge cases:
//  * q_i(d_i) == 0 (d_i missing from q_i): the drafter broke its contract, so d_i carries no
//    usable information. Verification stops there and the token at that position is sampled
//    from p_i itself (rng kSample) — still exactly lossless — and proposal_mismatch is set so the
//    caller can count it. A malformed q (ValidateProposal) is INVALID_ARGUMENT instead.
//  * max(0, p_i - q_i) has (numerically) no mass: then p_i ≈ q_i and a rejection has probability
//    ≈ 0; the correction is drawn from p_i.
//  * Stop tokens (stop_token_ids; EOS unless ignore_eos): the emitted run ends at the first stop
//    token, which is included in `tokens`, and `stopped` is set. Drafts after it are not
//    verified.
#ifndef SPECD_COMMON_SAMPLING_SPECULATIVE_VERIFIER_H_
#define SPECD_COMMON_SAMPLING_SPECULATIVE_VERIFIER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/sampling/draft_proposal.h"
#include "common/sampling/penalty_state.h"
#include "common/sampling/philox.h"
#include "common/sampling/sampler.h"
#include "common/sampling/sampling_params.h"
#include "common/sampling/target_distribution.h"

namespace specd::sampling {

// Residual mass at or below this is treated as "p - q has no positive part".
inline constexpr double kResidualEpsilon = 1e-9;

struct VerifyInput {
  absl::Span<const float> target_logits;       // [(k+1) * vocab] raw rows for [x_n, d_1..d_k]
  int32_t vocab_size = 0;
  absl::Span<const SparseProposal> proposals;  // [k]: d_i = proposals[i].token and its q_i
  const PenaltyState* history = nullptr;       // committed tokens before d_1; nullptr = none
  int64_t position = 0;                        // absolute position of d_1 (= committed length)
  absl::Span<const int32_t> eos_token_ids;     // the model's EOS ids
};

struct VerifyResult {
  int32_t num_drafted = 0;   // k
  int32_t num_accepted = 0;  // accepted drafts, all emitted (KV stays valid up to these)
  std::vector<int32_t> tokens;  // emitted: accepted prefix + correction/bonus, cut at a stop
  std::vector<float> logprobs;  // [tokens.size()] raw log-softmax (see sampler.h)
  std::vector<std::vector<TokenLogprob>> top_logprobs;  // [tokens.size()] if num_logprobs > 0
  std::vector<bool> accepted;   // [k] d_i accepted; false after the first rejection or a stop
  bool stopped = false;         // tokens.back() is a stop token
  bool proposal_mismatch = false;  // some d_i had q_i(d_i) == 0
};

// norm(max(0, p - q)), or p when that has at most kResidualEpsilon mass. Keeps p's layout.
TargetDistribution ResidualDistribution(const TargetDistribution& p, const SparseProposal& q);

// INVALID_ARGUMENT for invalid params, a logits size other than (k+1) * vocab, a malformed q
// (unless greedy) or a malformed logits row.
absl::StatusOr<VerifyResult> VerifyDraft(const SamplingParams& params, const CounterRng& rng,
                                         const VerifyInput& input);

}  // namespace specd::sampling

#endif  // SPECD_COMMON_SAMPLING_SPECULATIVE_VERIFIER_H_
