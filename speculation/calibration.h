// Measures the cost curves the adaptive-k policy (k_policy.h) starts from: a target forward by
// tokens, and a draft round by sequences. The in-process engine calibrates at Create; in the
// cluster each service calibrates at start-up and reports its curve in GetInfo, and the
// router's policy starts from those.
#ifndef SPECD_SPECULATION_CALIBRATION_H_
#define SPECD_SPECULATION_CALIBRATION_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/model_runner.h"
#include "speculation/adaptive_k.h"
#include "speculation/drafter.h"

namespace specd::spec {

// Target forwards of every size 1 .. kDenseCalibrationTokens, then 16, 32, ..., max_tokens
// tokens, each asking for logits of its last min(tokens, max_rows) rows (verification asks for
// every decode row's): best of several runs per size, so one slow run on a shared core does not
// make decode-sized steps look dear (sizes up to kRoundRobinCalibrationTokens round-robin). The
// curve never falls as tokens grow (a larger forward does a superset of the work: a lower time
// is noise). Its LogitCost: the largest round-robin size of at most max_rows tokens timed again
// with one logit row, in the same passes. Then its DepthCost (CalibrateDepth below) at up to
// `depth_keys` positions, as
// deep as the KV cache's free room allows (0, or room for fewer than kMinDepthCalibrationKeys:
// none). Uses (and frees) the sequence ids `probe` and `probe - 1`.
absl::StatusOr<CostCurve> CalibrateVerify(engine::ModelRunner& runner, int32_t max_tokens,
                                          int32_t max_rows, engine::SeqId probe = -1,
                                          int32_t depth_keys = 1024);

// What context costs a forward: rows 1 and kDepthCalibrationRows at position `depth` of a
// sequence against the same rows at position 0 of another, timed round-robin (best of several),
// and the DepthCost through the two differences: e(r) = depth * (per_key + r * per_row_key).
// A verification's rows share the sequence's KV reads, so the two terms differ (at 2k positions
// on a 2-core CPU: ~1.3 us a position, ~0.5 us more a row). Prefills `deep` to `depth` in
// forwards of at most `chunk` tokens first. Leaves both sequences allocated.
absl::StatusOr<DepthCost> CalibrateDepth(engine::ModelRunner& runner, int32_t depth,
                                         int32_t chunk, engine::SeqId shallow, engine::SeqId deep);
inline constexpr int32_t kDepthCalibrationRows = 5;  // 1 + max_k at the default k ceiling
inline constexpr int32_t kMinDepthCalibrationKeys = 256;

// A batch-1 verification of up to 8 drafts has 1..9 rows, and its cost is not a line between
// powers of two: the CPU MatMul takes tokens in passes of up to 8 (AVX-512) or 4 (AVX2), each
// pass unpacking the weights once, so 9 rows cost a pass more than 8 (docs/PERFORMANCE.md,
// "Verification at depth"). Every size a batch-1 step can ask for is measured.
inline constexpr int32_t kDenseCalibrationTokens = 9;

// Batch-sized forwards up to this many tokens are timed round-robin with the dense ones, best of
// as many passes: a step of 16 sequences prices its drafts on the slope from 16 to 32 tokens,
// and at best of 2, timed one size after the other, that slope read 0.47-1.89x the mean cost
// of a token at 16 across calibrations of one machine (a row looking half price drafted the
// n-gram lookup's 38 %-accepted matches at concurrency 16: 0.76x of speculation off,
// docs/PERFORMANCE.md).
inline constexpr int32_t kRoundRobinCalibrationTokens = 64;

// Drafter::Propose for 1, 4 and 16 sequences (at most max_sequences) at k = 1 (one round),
// after a prefill; seconds per draft round. Then the price of a catch-up row
// (CostCurve::catch_up_row): one sequence's round after kCatchUpCalibrationRows committed tokens
// it had not seen, against a round of one row (none where the drafter has no room for them).
// (The shipped draft on a 2-core CPU: ~25 us a row at 1 and at 16 sequences alike, where its
// one-row round costs ~0.15 ms; the target's curve shape, which priced it before, read ~half
// of that.) Then, with depth_keys > 0, its DepthCost: a round of
// one sequence at depth_keys positions against one at 8, round-robin (a round has one row per
// sequence, so one term: per_key). A drafter that has no room for the deep sequence
// (RESOURCE_EXHAUSTED) leaves the curve without one; the caller keeps depth_keys within the
// drafter's context (past it a round drafts nothing, and times nothing). A round may propose
// nothing and still count: the draft's confidence cut stops a chain after its round ran.
// Uses (and releases) ids -1 .. -max_sequences (and -2 for the deep sequence).
absl::StatusOr<CostCurve> CalibrateDraft(Drafter& drafter, int32_t vocab, int32_t max_sequences,
                                         int32_t depth_keys = 0);
// The longest catch-up the policy prices (KPolicy::kMaxPricedCatchUp).
inline constexpr int32_t kCatchUpCalibrationRows = 16;

// A feature-conditioned drafter drafts nothing without the target's hidden states: a probe
// sequence of `num_tokens` tokens gets zeros for them (a timing needs the work, not the values).
// No-op for other drafters.
void AddProbeFeatures(Drafter& drafter, SeqId seq, size_t num_tokens);

}  // namespace specd::spec

#endif  // SPECD_SPECULATION_CALIBRATION_H_
