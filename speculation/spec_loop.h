// THE speculative-decoding iteration loop, for the in-process engine (SpecEngine: a drafter and a
// model in this process) and the cluster's router (RouterEngine: the draft and target services
// over gRPC, and its own n-gram lookup) alike. One iteration, as named steps:
//   0. Lookup:   (with a target prefix cache) how much of the sequences about to be
//                (re)prefilled the target has cached: their prefill starts past it and their
//                first step takes it (TargetCall::cached_prefix); planned under the lock
//                (PlanLookups), called without it (Lookup), applied by Schedule;
//   1. Schedule: k per sequence that may verify (THE policy, k_policy.h, one KPolicy per
//      drafter), then THE scheduler (scheduler.h) on a snapshot; preempt and admit;
//   2. Draft:    each drafter proposes d_1..d_k with q for its sequences, all at once;
//   3. Target:   ONE target step (target_step.h) over prompt chunks and [x_n, d_1..d_k] rows;
//   4. Apply:    the emitted tokens to the sequences (the owner decides how many it takes and
//                whether the sequence ends: stop strings are the router's), the policy's
//                bookkeeping, the drafters' rollback;
//   5. Retire:   finished sequences out of the queues;
//   6. Release:  KV of preempted, removed and finished sequences freed on the target and the
//                drafters.
// Steps 1, 5 and Enqueue/Remove change the queues; 2, 3, 4 and 6 only the planned sequences, so an
// owner whose queues other threads read (the router) locks around the former and runs the
// latter — the remote calls — unlocked. RunStep runs them all in order.
#ifndef SPECD_SPECULATION_SPEC_LOOP_H_
#define SPECD_SPECULATION_SPEC_LOOP_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/sampling/penalty_state.h"
#include "common/sampling/philox.h"
#include "common/sampling/sampling_params.h"
#include "speculation/drafter.h"
#include "speculation/k_policy.h"
#include "speculation/scheduler.h"
#include "speculation/spec_stats.h"
#include "speculation/target_step.h"

namespace specd::spec {

// One request as the loop keeps it. Owners derive their own record from it (the router's
// request, the engine's result) and get it back in the callbacks.
struct LoopSeq {
  LoopSeq(SeqId id, std::vector<int32_t> prompt, sampling::SamplingParams params);
  virtual ~LoopSeq() = default;

  const SeqId id;
  const sampling::SamplingParams params;
  const int32_t num_prompt;
  int32_t max_new_tokens = 128;
  int32_t drafter = -1;   // index of its drafter in the loop (-1: no speculation)
  // A free lookup drafter (n-gram) tried first each step, -1: none. Where it has a match and its
  // policy drafts, it drafts this step; otherwise `drafter` does (speculation "auto": text that
  // repeats its context is drafted for free, the rest by the draft model). Its policy keeps its
  // own acceptance in lookup_spec. Never for a fixed k (that is the draft model's k).
  int32_t lookup = -1;
  SpecSeqState lookup_spec;
  int32_t step_drafter = -1;  // who drafts this step (Schedule sets it; -1: no one)
  int32_t max_k = 0;      // most drafts per step
  bool fixed_k = false;   // always draft max_k (capped), no policy
  // The request chose its seed. A sampled sequence's text then must follow from the seed
  // alone, so its k is pinned (scheduler.h "Pinned k"). Without a chosen seed nothing can
  // replay it: its k follows the step's measured costs and load like a greedy sequence's —
  // the same distribution, and no drafting where verifying rows does not pay (a batch).
  bool seeded = true;

  std::vector<int32_t> tokens;     // committed x_1..x_n: prompt + generated
  sampling::PenaltyState history;  // penalty history of `tokens`
  int32_t target_pos = 0;          // committed tokens whose KV the target holds
  int32_t target_cached = 0;       // of those, taken from the target's prefix cache
  bool prefix_looked_up = false;   // since it last lost its target KV (LoopOptions::prefix_lookups)
  bool adopt_pending = false;      // target_pos counts cached tokens its next step takes
  int32_t cached_prompt_tokens = 0;  // prompt tokens the first lookup found (for usage)
  bool on_backends = false;        // may hold KV on the target or a drafter
  SpecSeqState spec;               // what the adaptive-k policy knows of it
  int32_t steps = 0, drafted = 0, accepted = 0;  // verify steps, drafts verified / accepted

  int32_t n() const { return static_cast<int32_t>(tokens.size()); }
  int32_t generated() const { return n() - num_prompt; }
  // A sampled sequence's realized tokens depend on its k schedule (scheduler.h "Pinned k"):
  // pinned when its seed must reproduce them.
  bool pinned() const { return seeded && !sampling::IsGreedy(params); }
};
using LoopSeqPtr = std::shared_ptr<LoopSeq>;

// What the owner takes of a verification's emitted tokens.
struct Emission {
  int32_t take = 0;       // the first `take` emitted tokens are committed
  bool finished = false;  // the sequence ends with them
};

// The owner's side of Apply, called from the loop's thread.
class LoopClient {
 public:
  virtual ~LoopClient() = default;
  // Sequence `s` (tokens not yet appended) verified `drafted` drafts and emitted v.tokens.
  virtual Emission OnVerified(LoopSeq& s, const sampling::VerifyResult& v, int32_t drafted) = 0;
};

struct LoopDrafter {
  Drafter* drafter = nullptr;  // must outlive the loop
  KPolicy policy;
  bool available = true;       // false: its sequences decode without drafts
};

struct LoopOptions {
  // A prompt's last chunk verifies drafts too (scheduler.h): the in-process engine.
  bool drafts_with_prompt = false;
  int32_t context_length = 0;  // k never reaches past it
  int32_t max_running = 16;    // for the queue head the scheduler sees
  // Drafter failures other than RESOURCE_EXHAUSTED end the step (true) or only drop its drafts
  // (false: the router marks the draft service down and carries on).
  bool draft_errors_fail_step = true;
  // The target has a prefix cache: sequences about to be (re)prefilled are looked up in it
  // first (step 0), so their prefill starts past what it holds.
  bool prefix_lookups = false;
  // A lookup in front of a sequence's own drafter takes the step only where its match follows
  // at least this many tokens; shorter matches are the drafter's (a lookup alone takes any).
  // On the held-out prompts' greedy responses the lookup's first draft after a 1-token match
  // was right 0.22 of the time, where the distilled draft was right 0.43 at the same positions;
  // after 2- and 3-token matches the lookup was right 0.50 and 0.68, after longer ones 0.71-0.98
  // (docs/PERFORMANCE.md, "The lookup leaves 1-token matches to the draft").
  int32_t lookup_min_match = 2;
};

// What one iteration's steps hand each other.
struct LoopStep {
  std::vector<LoopSeqPtr> lookups;    // step 0: offered to the target's prefix cache
  std::vector<int32_t> lookup_cached;  // [lookups]: tokens it held of each
  Schedule sched;
  std::vector<LoopSeqPtr> seqs;       // [plans]: the planned sequences
  std::vector<DraftOutput> drafts;    // [plans]
  std::vector<TargetOutcome> outcomes;  // [plans]
  std::vector<SeqId> release;         // KV to free on the backends (step 6)
  std::vector<LoopSeqPtr> finished;   // ended in Apply; out of the queues after Retire
  std::vector<absl::Status> finish_status;  // [finished]: OK, or why it failed
  absl::Status draft_error;           // a drafter's failure this step (not RESOURCE_EXHAUSTED)
  int32_t draft_index = -1;           // whose
  int64_t step_tokens = 0;            // tokens through the target
  int64_t prefill_tokens = 0;         // of which prompt (or recomputed history) tokens
  int32_t decode_rows = 0;            // plans that only verify: sequences past their prefill
  double draft_seconds = 0, target_seconds = 0;
  // The target step's price before it ran (StepCost, the scheduler's time bound prices steps
  // with it); 0 when no curve is known. target_seconds / this is the cost model's error.
  double target_predicted_seconds = 0;
  // The same for the model drafters' rounds that their draft curves priced (not a sequence's
  // catch-up): what those rounds took, and what the curves predicted (0: none priced).
  double draft_priced_seconds = 0, draft_predicted_seconds = 0;
};

class SpecLoop {
 public:
  // `target` and the drafters must outlive the loop.
  SpecLoop(LoopOptions options, TargetExecutor* target, std::vector<LoopDrafter> drafters);

  // Queues: a new request at the tail; removal from anywhere (returns whether it may hold KV
  // on the backends: then free it with Release).
  void Enqueue(LoopSeqPtr s);
  bool Remove(LoopSeq& s);
  // Back to the head of the queue, its KV to be freed (step.release); recomputed when re-admitted.
  void Preempt(const LoopSeqPtr& s, std::vector<SeqId>& release);
  const std::vector<LoopSeqPtr>& running() const { return running_; }
  const std::deque<LoopSeqPtr>& waiting() const { return waiting_; }
  LoopSeq* Find(SeqId id) const;

  // The steps, in order (see the top of this file).
  void PlanLookups(const SchedulerConfig& config, LoopStep& step);
  absl::Status Lookup(LoopStep& step);
  void Schedule(const SchedulerConfig& config, LoopStep& step);
  absl::Status Draft(LoopStep& step);
  absl::Status Target(LoopStep& step);
  void Apply(LoopStep& step, LoopClient& client);
  void Retire(LoopStep& step);
  void Release(absl::Span<const SeqId> seqs);
  // All six for a single-threaded owner; an error of Draft or Target ends the step there.
  absl::Status RunStep(const SchedulerConfig& config, LoopClient& client, LoopStep& step);

  // The most drafts `s` may get this step: its max_k, never past its last token or the context.
  int32_t KCap(const LoopSeq& s) const;
  // Tokens `s` may still generate: its budget, never past the context (KRequest::tokens_left).
  int32_t TokensLeft(const LoopSeq& s) const;
  std::vector<LoopDrafter>& drafters() { return drafters_; }
  const SpecStats& stats() const { return stats_; }
  SpecStats& mutable_stats() { return stats_; }

 private:
  // Step 1's parts: k per sequence that may verify this step (running, then the admissible
  // head of the queue), from the fixed k's and each drafter's policy.
  std::vector<int32_t> DecideK(const SchedulerConfig& config, size_t admissible);
  // The target's step cost the scheduler bounds steps with (null: none known).
  const CostCurve* StepCost() const;
  SchedulerState Snapshot(absl::Span<const int32_t> k, size_t admissible,
                          int32_t block_size) const;
  bool Drafts(const LoopSeq& s) const;  // its drafter exists and is available
  bool Available(int32_t d) const;      // drafter d exists and is available
  // The lookup drafter drafts `s` this step, if its policy chooses a k: it has a match.
  bool LookupCanDraft(const LoopSeq& s) const;
  // The policy state of `s` that drafter d decides on (lookup_spec for its lookup drafter).
  static SpecSeqState& StateFor(LoopSeq& s, int32_t d);
  void Commit(LoopStep& step, size_t p, LoopClient& client);
  // Its drafter drafts from the target's hidden states (Drafter::wants_features).
  bool WantsFeatures(const LoopSeq& s) const;
  void ApplyLookups(LoopStep& step);  // step 0's results, at the start of Schedule
  // Where `s`'s prefill ends (scheduler.cc PrefillEnd): what a lookup may offer.
  static int32_t PrefillEnd(const LoopSeq& s);

  LoopOptions options_;
  TargetExecutor* target_;
  std::vector<LoopDrafter> drafters_;
  std::deque<LoopSeqPtr> waiting_;
  std::vector<LoopSeqPtr> running_;
  absl::flat_hash_map<SeqId, LoopSeq*> by_id_;
  SpecStats stats_;
};

}  // namespace specd::spec

#endif  // SPECD_SPECULATION_SPEC_LOOP_H_
