// Adaptive speculation length. Per sequence, an EWMA of draft-token acceptance gives the
// expected tokens a step emits for each k; per batch, measured cost curves of the target
// forward (by batch tokens) and of a draft step (by sequences drafting) give what each k
// costs. ChooseK picks the k_i that maximise expected tokens per second for the whole step —
// so when the batch grows and the target stops being memory-bound (verify cost rises with
// tokens), k shrinks, down to 0 = plain decoding.
#ifndef SPECD_SPECULATION_ADAPTIVE_K_H_
#define SPECD_SPECULATION_ADAPTIVE_K_H_

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/types/span.h"

namespace specd::spec {

// The context a target forward's rows attend over, beyond the positions of the forward itself:
// each sequence's KV before its first row of the step (`context`) is read once for all its rows
// (`keys`), and every row does its arithmetic against each of those positions (`row_keys`).
struct StepContext {
  double keys = 0.0;      // sum over sequences of context
  double row_keys = 0.0;  // sum over sequences of rows * context
  // Rows that compute logits; < 0: not known, priced as the calibration ran (every row up to
  // its LogitCost::calibrated_rows). A prompt chunk computes one, a verification every row.
  double logit_rows = -1.0;
  void Add(int64_t context, int64_t rows) {
    keys += static_cast<double>(context);
    row_keys += static_cast<double>(rows) * static_cast<double>(context);
  }
  void AddLogitRows(int64_t rows) {
    logit_rows = std::max(0.0, logit_rows) + static_cast<double>(rows);
  }
};

// What a forward's context adds to its seconds: per KV position read, and per (row, position)
// pair. A calibration near position 0 does not see it; at 2k positions verify(5) cost
// 1.7-2.1x verify(1) against 1.4x at depth 32 (docs/PERFORMANCE.md, "Verification at depth").
struct DepthCost {
  double per_key = 0.0;
  double per_row_key = 0.0;
  double Seconds(const StepContext& c) const { return per_key * c.keys + per_row_key * c.row_keys; }
  bool empty() const { return per_key == 0.0 && per_row_key == 0.0; }
};

// What a row's logits add to a forward (the output head over the vocabulary: on the default
// model ~0.2 of a decode step's weights). The calibration computed them for every row of its
// forwards up to calibrated_rows, so a step with fewer logit rows (a prompt chunk has one) costs
// per_row less for each row short of that.
struct LogitCost {
  double per_row = 0.0;
  int32_t calibrated_rows = 0;
  // Seconds the calibrated curve over-prices a step of `tokens` rows with `logit_rows` of them
  // computing logits (none when logit_rows < 0: not known).
  double Saving(double tokens, double logit_rows) const {
    if (per_row <= 0.0 || logit_rows < 0.0) return 0.0;
    const double calibrated = std::min(tokens, static_cast<double>(calibrated_rows));
    return per_row * std::max(0.0, calibrated - logit_rows);
  }
  bool empty() const { return per_row == 0.0; }
};

// Seconds as a function of a size x: piecewise linear through calibration points (linear
// extrapolation past the last), plus what the forward's context adds (DepthCost; none for a
// draft round), times a load factor tracked online from observed runs (the machine may be
// shared, so absolute times drift while the shape holds).
class CostCurve {
 public:
  CostCurve() = default;
  // points: (x, seconds), any order, at least one. A single point means cost ∝ x.
  explicit CostCurve(std::vector<std::pair<double, double>> points);

  bool empty() const { return points_.empty(); }
  double Predict(double x, const StepContext& context = {}) const;  // 0 when empty
  // A run of size x took `seconds`: moves the load factor toward seconds / shape(x).
  void Observe(double x, double seconds, const StepContext& context = {});
  // Same, for a prediction that summed several shape evaluations (e.g. draft steps).
  void ObserveTotal(double predicted_shape_seconds, double seconds);
  // A step without a run to observe: the load factor keeps `keep` of its distance (in log
  // space) from the calibration, so an old reading fades instead of ruling for good. After
  // kFreshAfterIdle such steps, the next observation replaces the factor outright: the faded
  // value is a guess, and one reading is what the machine says now.
  void Relax(double keep);
  static constexpr int32_t kFreshAfterIdle = 32;
  // The calibrated curve without the load factor (0 when empty).
  double Shape(double x, const StepContext& context = {}) const;
  double load_factor() const { return scale_; }
  // The same calibration with the load factor reset to 1: what a pinned sequence decides on
  // (its k must not depend on how loaded the machine was when it ran).
  CostCurve Unscaled() const {
    CostCurve c(points_);
    c.depth_ = depth_;
    c.logits_ = logits_;
    c.catch_up_row_ = catch_up_row_;
    return c;
  }
  const std::vector<std::pair<double, double>>& points() const { return points_; }
  const DepthCost& depth() const { return depth_; }
  void set_depth(DepthCost depth) { depth_ = depth; }
  const LogitCost& logits() const { return logits_; }
  void set_logits(LogitCost logits) { logits_ = logits; }
  // A draft round's curve: seconds each committed token a sequence feeds before its drafting
  // row adds to the round (the draft's catch-up), without the load factor; 0 = not measured.
  // Linear in the tokens and alike at every batch on a 2-core CPU (calibration.h).
  double catch_up_row() const { return catch_up_row_; }
  void set_catch_up_row(double seconds) { catch_up_row_ = seconds; }

 private:
  std::vector<std::pair<double, double>> points_;  // sorted by x
  DepthCost depth_;
  LogitCost logits_;
  double catch_up_row_ = 0.0;
  double scale_ = 1.0;
  int32_t idle_steps_ = 0;  // Relax calls since the last observation
};

// Per-sequence acceptance estimate: decayed counts of accepted / tried draft tokens, kept at
// two speeds.
// - alpha(): the pinned record (a seeded sampled sequence decides on its own history alone,
//   k_policy.h): a memory of ~3 steps and a prior worth one token, so a few steps move it.
// - alpha(prior): an unpinned sequence's, toward the policy-wide prior: a memory of ~10 steps
//   and a prior worth 4 tokens. At ~3 steps one rejected step stopped drafting until the next
//   probe (KPolicyTest.NearTheBestFixedK: 1.10x where the best fixed k gave 1.26x on an H200).
class AcceptanceEstimate {
 public:
  static constexpr double kPrior = 0.5;              // before any evidence
  static constexpr double kPinnedPriorWeight = 1.0;  // in draft tokens
  static constexpr double kPinnedDecay = 0.7;        // per step
  static constexpr double kPriorWeight = 4.0;
  static constexpr double kDecay = 0.9;
  // The policy-wide estimate (the prior of new sequences): every sequence's steps update it,
  // so it keeps a longer memory than one sequence's: ~100 drafted tokens, so that its
  // uncertainty (KPolicy::new_sequence_prior) shrinks as evidence comes in. At ~33 tokens an
  // unlucky stretch left it under break-even with too little evidence to trust.
  static constexpr double kGlobalDecay = 0.99;

  AcceptanceEstimate() = default;
  explicit AcceptanceEstimate(double decay) : decay_(decay) {}

  // A step drafted `drafted` tokens and `accepted` of them were accepted. Tokens after the
  // first rejection were never tested, so they are not evidence.
  void Update(int32_t drafted, int32_t accepted);
  // The pinned record, toward the fixed prior.
  double alpha() const {
    return (pinned_accepted_ + kPrior * kPinnedPriorWeight) / (pinned_tried_ + kPinnedPriorWeight);
  }
  // With another prior mean, e.g. the engine-wide acceptance: a new sequence starts from how
  // well the drafter has been doing rather than from a fixed guess.
  double alpha(double prior) const {
    return (accepted_ + prior * kPriorWeight) / (tried_ + kPriorWeight);
  }
  // The (decayed) draft tokens alpha(prior) has seen tested: its evidence, beside the prior's
  // kPriorWeight.
  double tried() const { return tried_; }

 private:
  double decay_ = kDecay;
  double accepted_ = 0.0, tried_ = 0.0;
  double pinned_accepted_ = 0.0, pinned_tried_ = 0.0;
};

struct KCandidate {
  double alpha = 0.0;  // per-token acceptance estimate
  int32_t cap = 0;     // most drafts allowed (request k, context, tokens left, budget)
  // KV positions before the step's rows of this sequence: what each of its 1 + k rows attends
  // over (priced by the verify curve's DepthCost).
  int32_t context = 0;
};

// Expected tokens emitted by a step with k drafts at per-token acceptance alpha:
// 1 + alpha + ... + alpha^k (accepted prefix plus the correction or bonus).
double ExpectedTokens(double alpha, int32_t k);

// Seconds of the draft rounds of a step in which sequence i drafts k[i]: round j runs the
// sequences with k_i >= j, one row each over its `context[i]` positions (empty: all 0). With
// `shape_only`, the calibrated curve without the load factor.
double DraftRoundsCost(const CostCurve& draft, absl::Span<const int32_t> k,
                       absl::Span<const int32_t> context = {}, bool shape_only = false);

// Chooses k_i for each sequence of a step that also carries `prefill_tokens` prompt tokens,
// maximising sum_i ExpectedTokens(alpha_i, k_i) / (verify(prefill + sum(1 + k_i), context) -
// verify(prefill) + sum_{j=1..max k} draft(#{i : k_i >= j})): expected tokens per second of
// what the decode rows add to the step, `context` being the candidates' (StepContext::Add(
// context_i, 1 + k_i)). `draft` empty = free drafting (n-gram).
std::vector<int32_t> ChooseK(absl::Span<const KCandidate> seqs, int32_t prefill_tokens,
                             int32_t max_k, const CostCurve& verify, const CostCurve& draft);

// The cost model: what speculation at per-token acceptance alpha buys a batch of `batch`
// sequences under these costs, with the k ChooseK picks (every sequence alike, k <= max_k).
struct SpeedupEstimate {
  double mean_k = 0.0;           // drafts per sequence per step
  double tokens_per_step = 0.0;  // per sequence: ExpectedTokens(alpha, k)
  double step_seconds = 0.0;     // verify(batch * (1 + k)) + the draft rounds
  double speedup = 0.0;          // tokens per second against plain decoding's batch / verify(batch)
};
// `context`: every sequence's KV positions before the step (plain decoding pays for them too).
SpeedupEstimate EstimateSpeedup(double alpha, int32_t batch, int32_t max_k, const CostCurve& verify,
                                const CostCurve& draft, int32_t context = 0);

}  // namespace specd::spec

#endif  // SPECD_SPECULATION_ADAPTIVE_K_H_
