#include "speculation/k_policy.h"

#include <algorithm>
#include <cmath>

namespace specd::spec {

namespace {

// The draft model's catch-up on `behind` committed tokens it has not seen. They are rows of the
// forward that drafts d_1 (ModelDrafter::CatchUp), which a draft round's price already counts
// once: priced as the rows past that one, at the draft's calibrated price a row
// (CostCurve::catch_up_row), or where it has none (a curve from an older service) by the
// target's curve scaled to the draft's one-row cost. 0 for a free drafter or nothing to catch
// up on; with `shape_only`, without the draft curve's load factor.
double CatchUpCost(int32_t behind, const CostCurve& verify, const CostCurve& draft,
                   bool shape_only = false) {
  if (behind <= 1 || draft.empty()) return 0.0;
  const double scale = shape_only ? 1.0 : draft.load_factor();
  // Timed by the draft's calibration: what each of those rows costs the draft itself.
  if (draft.catch_up_row() > 0) return scale * draft.catch_up_row() * (behind - 1);
  // Else the target's curve for the shape, scaled to the draft's one-row cost. A draft small
  // enough to stay in cache prices rows by their arithmetic while the target's first rows ride
  // on its weight reads: this priced 15 rows of the shipped draft at ~0.5 of their time.
  const double t1 = verify.Shape(1);
  if (t1 <= 0) return 0.0;
  return scale * draft.Shape(1) * (verify.Shape(behind) - t1) / t1;
}

// One sequence's step of `rows` rows over `context` KV positions.
StepContext OneSequence(int32_t context, int32_t rows) {
  StepContext c;
  c.Add(context, rows);
  return c;
}

// Starting (or resuming) drafts makes the draft model catch up on `behind` tokens first: that
// catch-up against the expected saving of drafting k for the next `horizon` steps, at the
// sequence's `context` (a deep sequence's extra rows cost more).
bool CatchUpPays(double alpha, int32_t k, int32_t behind, const CostCurve& verify,
                 const CostCurve& draft, double horizon, int32_t context) {
  const double t1 = verify.Predict(1, OneSequence(context, 1));
  const double with_k = verify.Predict(1 + k, OneSequence(context, 1 + k)) +
                        k * draft.Predict(1, OneSequence(context, 1));
  const double saving = ExpectedTokens(alpha, k) * t1 - with_k;
  return horizon * saving > CatchUpCost(behind, verify, draft);
}

// The steps an unpinned sequence's resumed draft is expected to run: what its request has
// left at the expected tokens a step, within the policy's bounds.
double UnpinnedCatchUpHorizon(double alpha, int32_t k, int32_t tokens_left) {
  const double steps = static_cast<double>(tokens_left) / ExpectedTokens(alpha, k);
  return std::clamp(steps, static_cast<double>(KPolicy::kCatchUpHorizon),
                    static_cast<double>(KPolicy::kMaxCatchUpHorizon));
}

// What a k = 1 probe costs, in target decode steps at the sequence's `context`: the catch-up,
// one draft, one more verified row.
double ProbeCostInSteps(int32_t behind, const CostCurve& verify, const CostCurve& draft,
                        int32_t context) {
  const double t1 = verify.Predict(1, OneSequence(context, 1));
  if (t1 <= 0) return 0.0;
  const double one_draft = draft.empty() ? 0.0 : draft.Predict(1, OneSequence(context, 1));
  const double t2 = verify.Predict(2, OneSequence(context, 2));
  return (CatchUpCost(behind, verify, draft) + one_draft + t2 - t1) / t1;
}

}  // namespace

double NominalDraftRatio(uint64_t draft_bytes, uint64_t target_bytes, double fallback) {
  if (draft_bytes == 0 || target_bytes == 0) return fallback;
  return static_cast<double>(draft_bytes) / static_cast<double>(target_bytes);
}

double KPolicy::new_sequence_prior(size_t batch) const {
  const double a = global_.alpha(AcceptanceEstimate::kPrior);
  if (batch > kExploreMaxBatch) return a;
  const double spread = std::sqrt(a * (1.0 - a) / (global_.tried() + kPriorSpreadTokens));
  return std::min(1.0, a + kPriorOptimism * spread);
}

void KPolicy::set_costs(CostCurve verify, CostCurve draft) {
  options_.verify_cost = std::move(verify);
  options_.draft_cost = std::move(draft);
}

std::vector<int32_t> KPolicy::Choose(absl::Span<const KRequest> seqs, int32_t fixed_tokens,
                                     size_t step_sequences) {
  Choice c{std::vector<int32_t>(seqs.size(), 0), std::vector<int32_t>(seqs.size(), 0)};
  for (const KRequest& r : seqs) r.state->probed = false;
  if (!options_.adaptive) {
    for (size_t i = 0; i < seqs.size(); ++i) c.k[i] = std::max(0, seqs[i].cap);
    return c.k;
  }
  if (options_.verify_cost.empty()) return c.k;  // nothing to price drafts with: none
  MarkSeen(seqs);
  const NominalCosts nominal = PinnedCosts();
  const int64_t fixed = ChoosePinned(seqs, nominal, fixed_tokens, c);
  const size_t step = std::max(step_sequences, seqs.size());  // what exploration looks at
  ChooseUnpinned(seqs, fixed, step, c);
  AddProbes(seqs, nominal, step, c);
  RelaxIdleDraftLoad(c.k);
  return c.k;
}

void KPolicy::RelaxIdleDraftLoad(absl::Span<const int32_t> k) {
  if (!options_.track_load) return;
  if (std::any_of(k.begin(), k.end(), [](int32_t x) { return x > 0; })) return;
  options_.draft_cost.Relax(kIdleDraftLoadKeep);
}

void KPolicy::MarkSeen(absl::Span<const KRequest> seqs) const {
  for (const KRequest& r : seqs) {
    SpecSeqState& s = *r.state;
    // Pinned sequences keep the fixed schedule: their k depends on their own history only.
    if (!s.seen && !r.pinned) s.probe_every = probe_start_;
    s.seen = true;
  }
}

KPolicy::NominalCosts KPolicy::PinnedCosts() const {
  NominalCosts n;
  n.verify = CostCurve({{1, 1.0}, {2, 1.0 + options_.pinned_verify_token}});
  if (!options_.draft_cost.empty() && options_.pinned_draft_ratio > 0) {
    n.draft = CostCurve({{1, options_.pinned_draft_ratio}, {2, 2 * options_.pinned_draft_ratio}});
  }
  return n;
}

int64_t KPolicy::ChoosePinned(absl::Span<const KRequest> seqs, const NominalCosts& n,
                              int32_t fixed_tokens, Choice& c) const {
  // Pinned: alone, own acceptance with the fixed prior, the nominal costs (which have no depth
  // term: a measured one would make k depend on the machine).
  int64_t fixed = fixed_tokens;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (!seqs[i].pinned) continue;
    const KCandidate own{seqs[i].state->acceptance.alpha(), seqs[i].cap};
    c.k[i] = ChooseK({&own, 1}, 0, options_.max_k, n.verify, n.draft)[0];
    // The draft model's catch-up (a fresh sequence: its whole prompt), on the nominal costs.
    if (c.k[i] > 0 && seqs[i].behind > 1 && !n.draft.empty() &&
        !CatchUpPays(own.alpha, c.k[i], seqs[i].behind, n.verify, n.draft, kCatchUpHorizon,
                     /*context=*/0)) {
      c.k[i] = 0;
    }
    const KCandidate best{1.0, seqs[i].cap};
    c.perfect[i] = ChooseK({&best, 1}, 0, options_.max_k, n.verify, n.draft)[0];
    fixed += 1 + c.k[i];
  }
  return fixed;
}

void KPolicy::ChooseUnpinned(absl::Span<const KRequest> seqs, int64_t fixed, size_t step_sequences,
                             Choice& c) const {
  // One choice for the batch, each from its own record toward the new-sequence prior.
  std::vector<KCandidate> cand, best;
  std::vector<size_t> which;
  const double prior = new_sequence_prior(step_sequences);
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (seqs[i].pinned) continue;
    cand.push_back({seqs[i].state->acceptance.alpha(prior), seqs[i].cap, seqs[i].context});
    best.push_back({1.0, seqs[i].cap, seqs[i].context});
    which.push_back(i);
  }
  if (which.empty()) return;
  const int32_t f = static_cast<int32_t>(std::min<int64_t>(fixed, INT32_MAX));
  const std::vector<int32_t> kc =
      ChooseK(cand, f, options_.max_k, options_.verify_cost, options_.draft_cost);
  const std::vector<int32_t> kb =
      ChooseK(best, f, options_.max_k, options_.verify_cost, options_.draft_cost);
  for (size_t j = 0; j < which.size(); ++j) {
    const size_t i = which[j];
    c.k[i] = kc[j];
    c.perfect[i] = kb[j];
    // The same catch-up as a pinned sequence's, on the measured costs and its steps left.
    if (!options_.draft_cost.empty() && c.k[i] > 0 && seqs[i].behind > 1 &&
        !CatchUpPays(cand[j].alpha, c.k[i], seqs[i].behind, options_.verify_cost,
                     options_.draft_cost,
                     UnpinnedCatchUpHorizon(cand[j].alpha, c.k[i], seqs[i].tokens_left),
                     seqs[i].context)) {
      c.k[i] = 0;
    }
  }
}

void KPolicy::AddProbes(absl::Span<const KRequest> seqs, const NominalCosts& n,
                        size_t step_sequences, Choice& c) const {
  // At k = 0 the acceptance estimate never moves: without a probe now and then a pessimistic
  // prior would keep a good drafter off for good. Only where drafting clearly could pay (a
  // perfect drafter would go >= 2 deep) and, for unpinned sequences, the batch is small: a
  // probe makes the draft model catch up on every token since its last draft, a cost the k
  // model does not see (at batch 8 on 2 cores probing made the F16/Q4_1 pair 0.74x plain in
  // specd-bench --spec, while at batch 1 it takes it from 1.0x to 1.3x). And only with tokens
  // left to repay it (kProbePayback, kPinnedProbePayback): at batch 8, seeded 64-token
  // requests probing a draft accepted 0.35 ran at 0.90-0.92x of plain, 0.99-1.03x without.
  // The probe's cost, times the payback, is what must fit in the tokens left, except for the
  // policy's first evidence (kExploreTokens), which every later request uses:
  const size_t B = seqs.size();
  const bool small_step = step_sequences <= kExploreMaxBatch;
  const bool policy_untried = global_.tried() < kExploreTokens;
  for (size_t i = 0; i < B; ++i) {
    SpecSeqState& s = *seqs[i].state;
    // The policy's first evidence (kExploreTokens): probed on every request, failed probes or
    // not, and a sequence that drafted last step (its catch-up paid) goes on drafting one.
    const bool exploring = policy_untried && !seqs[i].pinned;
    const int32_t every = exploring ? SpecSeqState::kProbeEvery : s.probe_every;  // its floor
    const bool drafted_last = s.steps > 0 && s.steps_without_drafts == 0;
    const bool due = s.steps_without_drafts >= every || (exploring && drafted_last);
    if (c.k[i] != 0 || c.perfect[i] < 2 || !due || !(seqs[i].pinned || small_step) ||
        seqs[i].cap <= 0) {
      continue;
    }
    const double repaid_over =
        seqs[i].pinned
            ? kPinnedProbePayback * ProbeCostInSteps(seqs[i].behind, n.verify, n.draft, 0)
            : kProbePayback * ProbeCostInSteps(seqs[i].behind, options_.verify_cost,
                                               options_.draft_cost, seqs[i].context);
    if (repaid_over > seqs[i].tokens_left && !exploring) continue;
    c.k[i] = 1;
    s.probed = true;
  }
}

bool KPolicy::IsDraftRound(absl::Span<const KRequest> seqs, absl::Span<const int32_t> k) {
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (k[i] > 0 && seqs[i].behind > kMaxPricedCatchUp) return false;  // a prefill's cost
  }
  return true;
}

std::vector<int32_t> KPolicy::Contexts(absl::Span<const KRequest> seqs) {
  std::vector<int32_t> contexts(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) contexts[i] = seqs[i].context;
  return contexts;
}

double KPolicy::DraftStepCost(absl::Span<const KRequest> seqs, absl::Span<const int32_t> k,
                              bool shape_only) const {
  double seconds = DraftRoundsCost(options_.draft_cost, k, Contexts(seqs), shape_only);
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (k[i] > 0) {
      seconds += CatchUpCost(seqs[i].behind, options_.verify_cost, options_.draft_cost, shape_only);
    }
  }
  return seconds;
}

void KPolicy::ObserveDraft(absl::Span<const KRequest> seqs, absl::Span<const int32_t> k,
                           double seconds) {
  if (!options_.track_load || options_.draft_cost.empty() || !IsDraftRound(seqs, k)) return;
  options_.draft_cost.ObserveTotal(DraftStepCost(seqs, k, /*shape_only=*/true), seconds);
}

double KPolicy::PredictDraft(absl::Span<const KRequest> seqs, absl::Span<const int32_t> k) const {
  if (options_.draft_cost.empty() || !IsDraftRound(seqs, k)) return 0.0;
  return DraftStepCost(seqs, k, /*shape_only=*/false);
}

void KPolicy::ObserveVerify(double tokens, double seconds, const StepContext& context) {
  if (options_.track_load) options_.verify_cost.Observe(tokens, seconds, context);
}

void KPolicy::AfterDraft(SpecSeqState& s, int32_t k) {
  if (k > 0 && !s.probed) {
    s.probe_every = SpecSeqState::kProbeEvery;  // chosen on its merits
    if (s.last_probe) {  // after a probe: it paid
      probe_start_ = std::max(SpecSeqState::kProbeEvery, probe_start_ / 2);
    }
  } else if (k == 0 && s.steps_without_drafts == 0 && s.steps > 0) {
    // The last step drafted and now k is 0 again: drafting (a probe, or a run on a prior that
    // proved too hopeful) did not pay.
    s.probe_every = std::min(s.probe_every * 2, SpecSeqState::kMaxProbeEvery);
    if (s.last_probe) {
      probe_start_ = std::min(probe_start_ * 2, 4 * SpecSeqState::kMaxProbeEvery);
    }
  }
  s.last_probe = k > 0 && s.probed;
  s.probed = false;
  s.steps_without_drafts = k > 0 ? 0 : s.steps_without_drafts + 1;
  ++s.steps;
}

void KPolicy::AfterVerify(SpecSeqState& s, int32_t drafted, int32_t accepted) {
  s.acceptance.Update(drafted, accepted);
  global_.Update(drafted, accepted);
}

}  // namespace specd::spec
