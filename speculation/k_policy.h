// THE adaptive-k policy: how many tokens each sequence drafts in a step. Used by the in-process
// engine (SpecEngine) and by the cluster's router alike.
//
// Per sequence, an acceptance estimate (AcceptanceEstimate); per policy, the cost curves of a
// target forward (by tokens) and of a draft round (by sequences drafting), calibrated by
// timing (calibration.h) and rescaled online from measured steps. KPolicy::Choose maximises the
// expected tokens per second of the whole step (adaptive_k.h ChooseK), so k falls to 0 where
// drafting does not pay: a draft that is rarely accepted, a target that is compute-bound.
//
// Pinned sequences (a sampled request: its realized tokens depend on its k schedule) choose
// from their own history alone — their own acceptance with the fixed prior, no batch, and a
// nominal cost model fixed by the model files (never a timing) — so a seed gives the same text
// in any batch, on any machine, after any restart.
#ifndef SPECD_SPECULATION_K_POLICY_H_
#define SPECD_SPECULATION_K_POLICY_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "speculation/adaptive_k.h"

namespace specd::spec {

// What the policy remembers of one sequence; owned by the caller's sequence record.
struct SpecSeqState {
  static constexpr int32_t kProbeEvery = 16;  // steps at k = 0 before a k = 1 probe
  static constexpr int32_t kMaxProbeEvery = 16 * kProbeEvery;
  AcceptanceEstimate acceptance;
  int32_t steps = 0;                 // steps that decoded (with or without drafts)
  int32_t steps_without_drafts = 0;  // since the last step that drafted
  // Doubles each time a probe leaves k at 0 (drafting still does not pay: the probes' draft
  // catch-up is pure cost then), back to kProbeEvery once the choice itself drafts.
  int32_t probe_every = kProbeEvery;
  bool probed = false;      // this step's k = 1 is a probe
  bool last_probe = false;  // the last step that drafted was a probe
  bool seen = false;        // the policy has decided for it before
  // The sequence's length, less its last token, after the last step this drafter drafted for
  // it (0: never): what the drafter has seen, by the sequence's own history. A pinned
  // sequence prices its catch-up from this, not from the draft's cache, which other
  // sequences' KV pressure can evict.
  int32_t seen_through = 0;
};

struct KPolicyOptions {
  int32_t max_k = 4;     // most drafts per sequence and step
  bool adaptive = true;  // false: every sequence drafts its cap
  // Rescale the curves online from measured step times (a shared machine drifts). Off: the
  // curves are used exactly as given (tests; choices that do not depend on timing).
  bool track_load = true;
  CostCurve verify_cost;  // seconds of a target forward by tokens; empty + adaptive: k = 0
  CostCurve draft_cost;   // seconds of one draft round by sequences; empty = free (n-gram)
  // The nominal costs pinned sequences decide on, in target decode steps: a draft round (the
  // draft's weight bytes over the target's: decoding is memory-bound; 0 = free drafts), and
  // each verified token beyond the first. A pinned k cannot follow load, so a verified row is
  // priced between an idle service (~0.1 of a step at batch 1) and a loaded CPU one (0.4–0.7
  // at batch 8–16 on 2 cores): at 0.1, seeded sampled traffic at concurrency 16 drafted its
  // 23 %-accepted lookups and ran at 0.79x of speculation off (docs/PERFORMANCE.md).
  double pinned_draft_ratio = 0.5;
  double pinned_verify_token = 0.3;
};

// The nominal draft-round cost of a drafter reading `draft_bytes` of weights per token against
// a target reading `target_bytes`: their ratio, or `fallback` when either is unknown (0).
double NominalDraftRatio(uint64_t draft_bytes, uint64_t target_bytes, double fallback = 0.5);

// One decoding sequence of a step.
struct KRequest {
  SpecSeqState* state = nullptr;
  int32_t cap = 0;      // most drafts allowed (request k, context, tokens left)
  bool pinned = false;  // k may depend only on this sequence's own history
  // Committed tokens the drafter has not seen (it catches up on them before drafting): the
  // whole prompt for a sequence that never drafted, the tokens since its last draft after
  // a pause. A sequence starts drafting only if the expected saving over the next
  // kCatchUpHorizon steps pays for that catch-up (a pinned one: on the nominal costs, with
  // `behind` from its own history, SpecSeqState::seen_through).
  int32_t behind = 0;
  // Tokens the request may still generate (its budget, the context): a probe is exploration,
  // taken only with enough of them left to use what it finds (KPolicy::kProbePayback,
  // kPinnedProbePayback).
  int32_t tokens_left = INT32_MAX;
  // KV positions before this step's rows (the sequence's length less its last token): the
  // depth its verified rows attend over, priced by the verify curve's DepthCost. Pinned
  // sequences' nominal costs have no depth term.
  int32_t context = 0;
};

class KPolicy {
 public:
  // Steps a resumed draft is expected to run: a pinned sequence's (on its nominal costs); an
  // unpinned one's are the steps its request has left at the expected tokens a step, within
  // [kCatchUpHorizon, kMaxCatchUpHorizon]. At a flat 8 the draft's catch-up on a 60-token
  // prompt kept a draft accepted 0.42 off every new request on this project's CPU, where k = 1
  // gave 1.07-1.10x (KPolicyTest.NearTheBestFixedK, its "cpu 12-05" profile).
  static constexpr int32_t kCatchUpHorizon = 8;
  static constexpr int32_t kMaxCatchUpHorizon = 32;
  // Exploration for unpinned sequences (probes, the hopeful prior) only in steps of at most
  // this many sequences, where it costs little (the comment in AddProbes has the figures).
  static constexpr size_t kExploreMaxBatch = 2;
  // How optimistic the prior of a new unpinned sequence is (new_sequence_prior): this many
  // standard deviations of the policy-wide estimate, with the prior counted as
  // kPriorSpreadTokens tried drafts (no evidence: 0.5 + 0.125). In KPolicyTest's timelines a
  // spread over the estimate's own prior weight (4) made the first request of a never-right
  // draft draft twice as much, for the same speed elsewhere.
  static constexpr double kPriorOptimism = 1.0;
  static constexpr double kPriorSpreadTokens = 16.0;
  // A k = 1 probe costs the draft's catch-up on `behind`, a draft and a verified row; it is
  // taken only when the request has at least this many times that cost (in target decode
  // steps) left in tokens. A probe gains only if the drafter proves good, and drafting then
  // saves ~0.1-0.3 of a step per token on a CPU, more on a GPU. 32 cost the H200 timeline's
  // 32-token requests at acceptance 0.30 their drafting (NearTheBestFixedK: 1.00x, 1.08x
  // with 16).
  static constexpr double kProbePayback = 16.0;
  // A pinned sequence's probe is priced on the nominal costs, which cannot see that at batch 8
  // a catch-up costs ~2.5x what it costs alone, so it explores half as much: at 16, seeded
  // 64-token requests at batch 8 with short prompts still probed (0.95-0.96x of plain; 32:
  // 1.01-1.03x).
  static constexpr double kPinnedProbePayback = 32.0;
  // Until the policy-wide estimate has this many tested drafts of evidence, an unpinned
  // sequence in a step of <= kExploreMaxBatch sequences probes every kProbeEvery steps,
  // whatever earlier probes found and without its request's payback, and once it has drafted
  // (its catch-up paid) goes on with k = 1: what it learns seeds every later request
  // (new_sequence_prior), and requests too short to repay a probe would otherwise leave a
  // drafter untried for good (32-token requests with the Q4_1 file drafting for its F16
  // re-encoding, accepted 0.95: k auto never drafted, k 4 gave 1.12x;
  // KPolicyTest.AnExpensiveDrafterIsTriedOnShortRequests).
  // A useless drafter costs one catch-up and this many drafts, once.
  static constexpr double kExploreTokens = 16.0;
  // The longest catch-up whose draft step the policy prices and learns the draft's load from;
  // a longer one (a first draft on a prompt, a draft after a long pause) is a prefill.
  static constexpr int32_t kMaxPricedCatchUp = 16;
  // A step that drafts nothing keeps this much of the draft load factor's distance from the
  // calibration (half of it in ~140 steps). The factor only moves while the draft runs, so a
  // slow start (a draft service sharing its cores, cold caches) could otherwise keep a good
  // draft off for a whole run: 16 rounds at 4x left it at 2.3x and the draft never ran again.
  static constexpr double kIdleDraftLoadKeep = 0.995;

  KPolicy() = default;
  explicit KPolicy(KPolicyOptions options) : options_(std::move(options)) {}

  // THE function that decides k: for the decoding sequences of one step that also carries
  // `fixed_tokens` other tokens (prompt chunks), k_i in [0, cap_i]. Marks probes in the states.
  // `step_sequences`: the step's decoding sequences in all (other drafters' groups and
  // fixed-k sequences too; 0: `seqs` alone). Exploration (kExploreMaxBatch) looks at the step,
  // not at this drafter's share of it: in a step of 16, the lookup's one match is no small step.
  std::vector<int32_t> Choose(absl::Span<const KRequest> seqs, int32_t fixed_tokens,
                              size_t step_sequences = 0);

  // After the drafter ran, before AfterDraft: a draft step that proposed for `k` (one entry per
  // sequence of `seqs`, whose `behind` says the rows each fed in round 1: the drafter's own
  // count, Drafter::CachedLength) took `seconds`. Ignored when a sequence caught up on more
  // than kMaxPricedCatchUp tokens (a first draft, a draft after a long pause): that is a
  // prefill's cost, not a draft round's.
  void ObserveDraft(absl::Span<const KRequest> seqs, absl::Span<const int32_t> k, double seconds);
  // What the draft curve predicts such a round takes (its load factor included); 0 when it does
  // not price the round: no curve, or a long catch-up (as ObserveDraft ignores).
  double PredictDraft(absl::Span<const KRequest> seqs, absl::Span<const int32_t> k) const;
  // A target forward over `tokens` tokens whose rows attended over `context` took `seconds`.
  void ObserveVerify(double tokens, double seconds, const StepContext& context = {});

  // The k the sequence really drafted this step (the drafter may propose fewer than asked).
  void AfterDraft(SpecSeqState& s, int32_t k);
  // Its verification: `accepted` of `drafted` drafts were accepted.
  void AfterVerify(SpecSeqState& s, int32_t drafted, int32_t accepted);

  const KPolicyOptions& options() const { return options_; }
  const CostCurve& verify_cost() const { return options_.verify_cost; }
  const CostCurve& draft_cost() const { return options_.draft_cost; }
  void set_costs(CostCurve verify, CostCurve draft);
  void set_pinned_draft_ratio(double ratio) { options_.pinned_draft_ratio = ratio; }
  // The prior of a new unpinned sequence in a step of `batch` sequences: the acceptance over
  // every sequence, plus (batch <= kExploreMaxBatch) kPriorOptimism standard deviations of
  // that estimate (a binomial's, over its evidence and kPriorSpreadTokens). The estimate only
  // moves while something drafts, and drafting stops when it falls under break-even, so a
  // plain estimate that an unlucky stretch pushed under break-even stayed there for good: two
  // rejected first drafts kept a drafter accepted 0.8 off for the whole process. Optimism
  // shrinks with evidence: a drafter that is rarely accepted costs a few drafts once; one near
  // break-even is measured until the estimate is sure.
  double new_sequence_prior(size_t batch) const;
  // Where a new unpinned sequence's probe interval starts: doubled each time a probe (of any
  // sequence) fails to lead to drafting, halved when a sequence drafts on its merits. A probe
  // makes the draft catch up on everything since it last saw the sequence — for a new one the
  // whole prompt — so probing a drafter that keeps failing must become rare.
  int32_t probe_start() const { return probe_start_; }

 private:
  // What Choose's steps hand each other: each sequence's k, and the k a drafter that is never
  // wrong would get (where probing could pay).
  struct Choice {
    std::vector<int32_t> k, perfect;
  };
  // A pinned sequence's cost model, in target decode steps (KPolicyOptions::pinned_*).
  struct NominalCosts {
    CostCurve verify, draft;
  };
  // Choose, as its steps: start new sequences' probe intervals; pinned sequences alone
  // (returns the step's tokens so far: `fixed_tokens` plus theirs); unpinned ones as a batch
  // on the measured costs; then the probes.
  void MarkSeen(absl::Span<const KRequest> seqs) const;
  NominalCosts PinnedCosts() const;
  int64_t ChoosePinned(absl::Span<const KRequest> seqs, const NominalCosts& nominal,
                       int32_t fixed_tokens, Choice& c) const;
  void ChooseUnpinned(absl::Span<const KRequest> seqs, int64_t fixed, size_t step_sequences,
                      Choice& c) const;
  void AddProbes(absl::Span<const KRequest> seqs, const NominalCosts& nominal,
                 size_t step_sequences, Choice& c) const;
  // After a step that drafts nothing (k all 0): the draft load factor fades toward 1.
  void RelaxIdleDraftLoad(absl::Span<const int32_t> k);
  // The draft curve prices this step: no sequence catches up on more than kMaxPricedCatchUp
  // tokens (its rows join round 1).
  static bool IsDraftRound(absl::Span<const KRequest> seqs, absl::Span<const int32_t> k);
  static std::vector<int32_t> Contexts(absl::Span<const KRequest> seqs);
  // A draft step's price: its rounds, and each drafting sequence's catch-up (CatchUpCost).
  double DraftStepCost(absl::Span<const KRequest> seqs, absl::Span<const int32_t> k,
                       bool shape_only) const;

  KPolicyOptions options_;
  AcceptanceEstimate global_{AcceptanceEstimate::kGlobalDecay};
  int32_t probe_start_ = SpecSeqState::kProbeEvery;
};

}  // namespace specd::spec

#endif  // SPECD_SPECULATION_K_POLICY_H_
