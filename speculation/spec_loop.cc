#include "speculation/spec_loop.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "common/util/check.h"

namespace specd::spec {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

template <typename T>
void Bump(std::vector<T>& counts, size_t i) {
  if (i < counts.size()) ++counts[i];
}

// The committed tokens drafter `d` feeds before it drafts for `s`, by what it holds
// (Drafter::CachedLength): 1 in a plain round (x_n again), 2 after all its drafts were accepted,
// more after steps it did not draft; 0 for a drafter without a model.
int32_t CatchUpRows(const LoopSeq& s, const Drafter& d) {
  if (!d.runs_model()) return 0;
  return static_cast<int32_t>(s.n() - std::max<int64_t>(d.CachedLength(s.id), 0));
}

}  // namespace

LoopSeq::LoopSeq(SeqId i, std::vector<int32_t> prompt, sampling::SamplingParams p)
    : id(i),
      params(std::move(p)),
      num_prompt(static_cast<int32_t>(prompt.size())),
      tokens(std::move(prompt)),
      history(sampling::PenaltyState::FromTokens(tokens, {})) {}

SpecLoop::SpecLoop(LoopOptions options, TargetExecutor* target, std::vector<LoopDrafter> drafters)
    : options_(std::move(options)), target_(target), drafters_(std::move(drafters)) {}

void SpecLoop::Enqueue(LoopSeqPtr s) {
  by_id_[s->id] = s.get();
  waiting_.push_back(std::move(s));
}

bool SpecLoop::Remove(LoopSeq& s) {
  auto rit = std::find_if(running_.begin(), running_.end(),
                          [&](const LoopSeqPtr& r) { return r.get() == &s; });
  if (rit != running_.end()) running_.erase(rit);
  auto wit = std::find_if(waiting_.begin(), waiting_.end(),
                          [&](const LoopSeqPtr& r) { return r.get() == &s; });
  if (wit != waiting_.end()) waiting_.erase(wit);
  by_id_.erase(s.id);
  const bool held = s.on_backends;
  s.on_backends = false;
  return held;
}

void SpecLoop::Preempt(const LoopSeqPtr& s, std::vector<SeqId>& release) {
  running_.erase(std::find(running_.begin(), running_.end(), s));
  waiting_.push_front(s);
  if (s->on_backends) release.push_back(s->id);
  s->on_backends = false;
  s->target_pos = 0;  // recomputed from its tokens when re-admitted
  s->target_cached = 0;
  s->prefix_looked_up = false;
  s->adopt_pending = false;
  ++stats_.preemptions;
}

LoopSeq* SpecLoop::Find(SeqId id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

bool SpecLoop::Available(int32_t d) const {
  return d >= 0 && static_cast<size_t>(d) < drafters_.size() && drafters_[d].available;
}

bool SpecLoop::Drafts(const LoopSeq& s) const { return Available(s.drafter); }

bool SpecLoop::LookupCanDraft(const LoopSeq& s) const {
  if (s.fixed_k || s.lookup == s.drafter || !Available(s.lookup) ||
      drafters_[s.lookup].drafter->runs_model()) {
    return false;
  }
  // Short matches are left to the sequence's own drafter while it has one (LoopOptions).
  const int32_t min_match = Drafts(s) ? options_.lookup_min_match : 1;
  return drafters_[s.lookup].drafter->HasProposal(s.tokens, min_match);
}

SpecSeqState& SpecLoop::StateFor(LoopSeq& s, int32_t d) {
  return d == s.lookup && d != s.drafter ? s.lookup_spec : s.spec;
}

int32_t SpecLoop::KCap(const LoopSeq& s) const {
  int64_t k = s.max_k;
  // Verify rows sit at positions n-1 .. n-1+k < context; drafts past the last token are waste.
  k = std::min<int64_t>(k, int64_t{options_.context_length} - s.n());
  k = std::min<int64_t>(k, int64_t{s.max_new_tokens} - s.generated() - 1);
  return static_cast<int32_t>(std::max<int64_t>(k, 0));
}

int32_t SpecLoop::TokensLeft(const LoopSeq& s) const {
  const int64_t left = std::min<int64_t>(int64_t{s.max_new_tokens} - s.generated(),
                                         int64_t{options_.context_length} - s.n());
  return static_cast<int32_t>(std::max<int64_t>(left, 0));
}

// ---- 0. Lookup -----------------------------------------------------------------------------

int32_t SpecLoop::PrefillEnd(const LoopSeq& s) {
  return s.pinned() && s.generated() > 0 ? s.n() - 1 : s.n();
}

bool SpecLoop::WantsFeatures(const LoopSeq& s) const {
  return s.drafter >= 0 && static_cast<size_t>(s.drafter) < drafters_.size() &&
         drafters_[s.drafter].drafter->wants_features();
}

void SpecLoop::PlanLookups(const SchedulerConfig& config, LoopStep& step) {
  step.lookups.clear();
  if (!options_.prefix_lookups) return;
  // Sequences the target holds nothing of that may prefill now: running ones it lost, and
  // the head of the queue that could be admitted. Only a prefill longer than a block can
  // find anything (the last token is always computed).
  auto offer = [&](const LoopSeqPtr& s) {
    if (s->prefix_looked_up || s->target_pos != 0 || PrefillEnd(*s) <= config.block_size) return;
    // A feature-conditioned drafter needs the target's hidden state at every prompt position,
    // which a cached prefix skips computing.
    if (WantsFeatures(*s)) return;
    step.lookups.push_back(s);
  };
  for (const LoopSeqPtr& s : running_) offer(s);
  const size_t free_slots = static_cast<size_t>(
      std::max<int64_t>(0, options_.max_running - static_cast<int64_t>(running_.size())));
  for (size_t i = 0; i < waiting_.size() && i < free_slots; ++i) offer(waiting_[i]);
}

absl::Status SpecLoop::Lookup(LoopStep& step) {
  step.lookup_cached.assign(step.lookups.size(), 0);
  if (step.lookups.empty()) return absl::OkStatus();
  std::vector<PrefixLookup> lookups;
  for (const LoopSeqPtr& s : step.lookups) {
    lookups.push_back({s->id, absl::MakeConstSpan(s->tokens.data(), PrefillEnd(*s))});
  }
  std::vector<int32_t> cached;
  absl::Status st = target_->LookupPrefixes(lookups, cached);
  if (!st.ok() || cached.size() != lookups.size()) {
    step.lookups.clear();  // not looked up: tried again next step, prefilled in full meanwhile
    step.lookup_cached.clear();
    return st.ok() ? absl::InternalError("prefix lookup: answer for another number of sequences")
                   : st;
  }
  step.lookup_cached = std::move(cached);
  return absl::OkStatus();
}

void SpecLoop::ApplyLookups(LoopStep& step) {
  for (size_t i = 0; i < step.lookups.size() && i < step.lookup_cached.size(); ++i) {
    LoopSeq& s = *step.lookups[i];
    // Removed since, or already changed: skip.
    if (Find(s.id) != &s || s.target_pos != 0) continue;
    s.prefix_looked_up = true;
    s.target_pos = std::clamp(step.lookup_cached[i], 0, PrefillEnd(s) - 1);
    s.target_cached = s.target_pos;
    s.adopt_pending = s.target_pos > 0;
    if (s.steps == 0 && s.generated() == 0) {
      s.cached_prompt_tokens = std::min(s.target_pos, s.num_prompt);
    }
  }
  step.lookups.clear();
  step.lookup_cached.clear();
}

// ---- 1. Schedule ---------------------------------------------------------------------------

std::vector<int32_t> SpecLoop::DecideK(const SchedulerConfig& config, size_t admissible) {
  // Who may verify this step: decode rows (with drafts_with_prompt, every running sequence and
  // the admissible head of the queue: a prompt's last chunk verifies drafts). Each gets a
  // fixed k or a drafter's policy's choice: its lookup drafter's where that has a match and
  // drafts, else its own drafter's. The rest of the step (prompt chunks, the other groups' rows
  // and drafts) is what a policy sees riding along.
  const size_t total = running_.size() + admissible;
  auto seq = [&](size_t i) -> LoopSeq& {
    return i < running_.size() ? *running_[i] : *waiting_[i - running_.size()];
  };
  std::vector<int32_t> k(total, 0);
  std::vector<size_t> decided;  // by a policy
  int64_t pending = 0, rows = 0, fixed_drafts = 0;
  for (size_t i = 0; i < total; ++i) {
    LoopSeq& s = seq(i);
    s.step_drafter = -1;
    const int64_t uncomputed = s.n() - s.target_pos;
    // Rows that may verify: decode rows (scheduler.cc Decoding), or every last row.
    if (!options_.drafts_with_prompt && (uncomputed != 1 || s.generated() == 0)) {
      pending += uncomputed;
      continue;
    }
    pending += uncomputed - 1;
    ++rows;
    if (s.fixed_k) {
      if (!Drafts(s)) continue;
      s.step_drafter = s.drafter;
      k[i] = KCap(s);
      fixed_drafts += k[i];
      continue;
    }
    if (LookupCanDraft(s)) {
      s.step_drafter = s.lookup;
    } else if (Drafts(s)) {
      s.step_drafter = s.drafter;
    } else {
      continue;
    }
    decided.push_back(i);
  }
  const int64_t prefill =
      std::min<int64_t>(pending, std::max<int64_t>(0, config.max_batch_tokens - rows));
  int64_t other_drafts = fixed_drafts;
  auto by_lookup = [](const LoopSeq& s) {
    return s.step_drafter == s.lookup && s.lookup != s.drafter;
  };
  // One policy choice per drafter over its group (`lookups`: the lookup drafters' groups).
  auto choose = [&](bool lookups) {
    std::vector<std::vector<KRequest>> group(drafters_.size());
    std::vector<std::vector<size_t>> index(drafters_.size());
    for (size_t i : decided) {
      LoopSeq& s = seq(i);
      if (s.step_drafter < 0 || by_lookup(s) != lookups) continue;
      const Drafter& d = *drafters_[s.step_drafter].drafter;
      // A sampled sequence's k follows its own history only, never the batch (k_policy.h).
      // What the drafter must catch up on first: a pinned sequence's from its own history.
      const int32_t behind = s.pinned() && d.runs_model()
                                 ? s.n() - StateFor(s, s.step_drafter).seen_through
                                 : CatchUpRows(s, d);
      group[s.step_drafter].push_back({&StateFor(s, s.step_drafter), KCap(s), s.pinned(), behind,
                                       TokensLeft(s), /*context=*/std::max(0, s.n() - 1)});
      index[s.step_drafter].push_back(i);
    }
    for (size_t g = 0; g < drafters_.size(); ++g) {
      if (group[g].empty()) continue;
      const int64_t fixed =
          prefill + rows - static_cast<int64_t>(group[g].size()) + other_drafts;
      const std::vector<int32_t> chosen = drafters_[g].policy.Choose(
          group[g], static_cast<int32_t>(std::min<int64_t>(fixed, INT32_MAX)),
          static_cast<size_t>(rows));
      for (size_t j = 0; j < chosen.size(); ++j) {
        k[index[g][j]] = chosen[j];
        other_drafts += chosen[j];
      }
    }
  };
  choose(/*lookups=*/true);
  // Where a lookup's policy declined its match, the sequence's own drafter decides. The lookup
  // policy hears that it drafted nothing, so its probes still come round.
  for (size_t i : decided) {
    LoopSeq& s = seq(i);
    if (!by_lookup(s) || k[i] > 0) continue;
    drafters_[s.lookup].policy.AfterDraft(s.lookup_spec, 0);
    s.step_drafter = Drafts(s) ? s.drafter : -1;
  }
  choose(/*lookups=*/false);
  return k;
}

SchedulerState SpecLoop::Snapshot(absl::Span<const int32_t> k, size_t admissible,
                                  int32_t block_size) const {
  auto view = [&](const LoopSeq& s, int32_t want) {
    // Sequences no policy decided for this step (prefills) are seen with their own drafter.
    const int32_t d = s.step_drafter >= 0 ? s.step_drafter : (Drafts(s) ? s.drafter : -1);
    const bool local = d >= 0 && !drafters_[d].drafter->runs_model();
    SeqView v{s.id, s.n(), s.target_pos, want, local, s.pinned(), s.generated() > 0};
    v.cached_blocks = s.target_cached / std::max(1, block_size);
    return v;
  };
  SchedulerState state;
  for (size_t i = 0; i < running_.size(); ++i) state.running.push_back(view(*running_[i], k[i]));
  // Only the head of the queue can be admitted (FCFS, at most max_running at once): the
  // scheduler needs no more of it, however long it is.
  const size_t head = std::min(waiting_.size(), static_cast<size_t>(options_.max_running));
  for (size_t i = 0; i < head; ++i) {
    state.waiting.push_back(view(*waiting_[i], i < admissible ? k[running_.size() + i] : 0));
  }
  return state;
}

// Every policy prices the same target steps and observes each one (Target); the first that
// has a curve (a drafter's may be empty: it never drafts) prices the scheduler's steps too.
const CostCurve* SpecLoop::StepCost() const {
  for (const LoopDrafter& d : drafters_) {
    if (!d.policy.verify_cost().empty()) return &d.policy.verify_cost();
  }
  return nullptr;
}

void SpecLoop::Schedule(const SchedulerConfig& config, LoopStep& step) {
  ApplyLookups(step);
  const size_t admissible =
      options_.drafts_with_prompt
          ? std::min(waiting_.size(),
                     static_cast<size_t>(std::max<int64_t>(
                         0, options_.max_running - static_cast<int64_t>(running_.size()))))
          : 0;
  const std::vector<int32_t> k = DecideK(config, admissible);
  SchedulerConfig with_cache = config;
  with_cache.target_adopted_blocks = options_.prefix_lookups ? target_->adopted_blocks() : 0;
  with_cache.target_evictable_blocks = options_.prefix_lookups ? target_->evictable_blocks() : 0;
  with_cache.step_cost = StepCost();
  step.sched = ScheduleIteration(Snapshot(k, admissible, config.block_size), with_cache);
  for (int64_t id : step.sched.preempt) {
    auto it = std::find_if(running_.begin(), running_.end(),
                           [&](const LoopSeqPtr& s) { return s->id == id; });
    SPECD_CHECK(it != running_.end(), "scheduler preempted a sequence that does not run");
    Preempt(LoopSeqPtr(*it), step.release);
  }
  for (int64_t id : step.sched.admit) {
    SPECD_CHECK(!waiting_.empty() && waiting_.front()->id == id, "scheduler admitted out of order");
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  absl::flat_hash_map<SeqId, const LoopSeqPtr*> run;
  for (const LoopSeqPtr& s : running_) run[s->id] = &s;
  step.seqs.clear();
  for (const SeqPlan& p : step.sched.plans) step.seqs.push_back(*run.at(p.id));
}

// ---- 2. Draft ------------------------------------------------------------------------------

absl::Status SpecLoop::Draft(LoopStep& step) {
  std::vector<SeqPlan>& plans = step.sched.plans;
  step.drafts.assign(plans.size(), DraftOutput{});
  for (size_t d = 0; d < drafters_.size(); ++d) {
    LoopDrafter& ld = drafters_[d];
    std::vector<DraftInput> in;
    std::vector<sampling::CounterRng> rngs;
    rngs.reserve(plans.size());
    std::vector<size_t> which;       // in[j] -> plans index
    std::vector<KRequest> drafting;  // for the policy's cost observation
    std::vector<int32_t> ks;
    for (size_t p = 0; p < plans.size(); ++p) {
      LoopSeq& s = *step.seqs[p];
      if (!plans[p].emit || plans[p].k <= 0 || s.step_drafter != static_cast<int32_t>(d)) {
        continue;
      }
      rngs.emplace_back(s.params.seed);
      in.push_back(DraftInput{s.id, s.tokens, &s.params, &s.history, &rngs.back(), plans[p].k,
                              s.num_prompt});
      which.push_back(p);
      // The rows it feeds in round 1 (before Propose changes what the drafter holds), over the
      // positions it attends: what the draft curve prices.
      drafting.push_back({&StateFor(s, s.step_drafter), plans[p].k, s.pinned(),
                          CatchUpRows(s, *ld.drafter), INT32_MAX, std::max(0, s.n() - 1)});
      ks.push_back(plans[p].k);
      s.on_backends = true;
    }
    if (in.empty() || !ld.available) continue;
    std::vector<DraftOutput> out(in.size());
    const auto t0 = Clock::now();
    const absl::Status st = ld.drafter->Propose(in, absl::MakeSpan(out));
    const double secs = Since(t0);
    step.draft_seconds += secs;
    stats_.draft_seconds += secs;
    if (st.ok()) {
      if (ld.drafter->runs_model()) {
        const double predicted = ld.policy.PredictDraft(drafting, ks);  // before it observes
        if (predicted > 0) {
          step.draft_predicted_seconds += predicted;
          step.draft_priced_seconds += secs;
        }
        ld.policy.ObserveDraft(drafting, ks, secs);
      }
      for (size_t j = 0; j < which.size(); ++j) {
        out[j].proposals.resize(std::min<size_t>(out[j].proposals.size(), plans[which[j]].k));
        step.drafts[which[j]] = std::move(out[j]);
      }
      continue;
    }
    ++stats_.draft_failures;  // these sequences decode without drafts this step
    if (absl::IsResourceExhausted(st)) continue;
    step.draft_error = st;
    step.draft_index = static_cast<int32_t>(d);
    if (options_.draft_errors_fail_step) return st;
  }
  // What each emitting sequence really drafts this step (a drafter may propose fewer).
  stats_.last_k.clear();
  for (size_t p = 0; p < plans.size(); ++p) {
    if (!plans[p].emit) continue;
    LoopSeq& s = *step.seqs[p];
    plans[p].k = static_cast<int32_t>(step.drafts[p].proposals.size());
    const int32_t d = s.step_drafter >= 0 ? s.step_drafter : s.drafter;
    if (d >= 0) drafters_[d].policy.AfterDraft(StateFor(s, d), plans[p].k);
    Bump(stats_.k_chosen, plans[p].k);
    stats_.last_k.push_back(plans[p].k);
  }
  return absl::OkStatus();
}

// ---- 3. Target -----------------------------------------------------------------------------

absl::Status SpecLoop::Target(LoopStep& step) {
  const std::vector<SeqPlan>& plans = step.sched.plans;
  std::vector<TargetCall> calls(plans.size());
  step.step_tokens = 0;
  step.prefill_tokens = 0;
  step.decode_rows = 0;
  StepContext context;  // what the step's rows attend over, for the policy's cost observation
  for (size_t p = 0; p < plans.size(); ++p) {
    const SeqPlan& plan = plans[p];
    LoopSeq& s = *step.seqs[p];
    TargetCall& c = calls[p];
    c.seq = s.id;
    c.start = plan.start;
    c.tokens = absl::MakeConstSpan(s.tokens).subspan(plan.start, plan.end - plan.start);
    c.emit = plan.emit;
    if (plan.emit) c.proposals = step.drafts[p].proposals;
    c.params = &s.params;
    c.history = &s.history;
    c.num_prompt = s.num_prompt;
    if (s.adopt_pending) c.cached_prefix = absl::MakeConstSpan(s.tokens).subspan(0, plan.start);
    c.want_features = WantsFeatures(s);
    step.step_tokens += plan.tokens();
    plan.AddTo(context);
    const int32_t prefill = plan.end - plan.start - (plan.emit ? 1 : 0);
    step.prefill_tokens += prefill;
    if (plan.emit && prefill == 0) ++step.decode_rows;
    s.on_backends = true;
  }
  // Priced before the policies observe it (the observation moves their load factor).
  const CostCurve* cost = StepCost();
  step.target_predicted_seconds =
      cost != nullptr ? cost->Predict(static_cast<double>(step.step_tokens), context) : 0.0;
  const auto t0 = Clock::now();
  const absl::Status st = target_->Run(calls, step.outcomes);
  step.target_seconds = Since(t0);
  if (!st.ok()) return st;
  SPECD_CHECK(step.outcomes.size() == calls.size(), "target step: %zu outcomes for %zu calls",
              step.outcomes.size(), calls.size());
  for (LoopDrafter& d : drafters_) {
    d.policy.ObserveVerify(static_cast<double>(step.step_tokens), step.target_seconds, context);
  }
  ++stats_.steps;
  stats_.verify_seconds += step.target_seconds;
  stats_.target_tokens += step.step_tokens;
  stats_.prefill_tokens += step.prefill_tokens;
  return absl::OkStatus();
}

// ---- 4. Apply ------------------------------------------------------------------------------

void SpecLoop::Apply(LoopStep& step, LoopClient& client) {
  const std::vector<SeqPlan>& plans = step.sched.plans;
  for (size_t p = 0; p < plans.size(); ++p) {
    LoopSeq& s = *step.seqs[p];
    s.adopt_pending = false;  // the target took its cached prefix, or lost it (below)
    if (step.outcomes[p].needs_prefill) {
      s.target_pos = 0;  // the target restarted or lost it: recompute from the history
      s.target_cached = 0;
      s.prefix_looked_up = false;  // looked up again, in what the target holds now
      continue;
    }
    if (!step.outcomes[p].features.empty() && WantsFeatures(s)) {
      drafters_[s.drafter].drafter->AddFeatures(s.id, plans[p].start, step.outcomes[p].features);
    }
    if (!plans[p].emit) {
      s.target_pos = plans[p].end;
      continue;
    }
    Commit(step, p, client);
  }
}

// Appends what the owner takes of the emitted tokens, updates the statistics and the policy,
// then ends the sequence or rolls its drafter back to what was committed (the target rolled
// back in its step: it keeps x_1..x_n and the accepted drafts).
void SpecLoop::Commit(LoopStep& step, size_t p, LoopClient& client) {
  LoopSeq& s = *step.seqs[p];
  const sampling::VerifyResult& v = step.outcomes[p].verified;
  const int32_t drafted = step.sched.plans[p].k;
  const int32_t d = s.step_drafter >= 0 ? s.step_drafter : s.drafter;
  if (d >= 0) drafters_[d].policy.AfterVerify(StateFor(s, d), drafted, v.num_accepted);
  const Emission e = client.OnVerified(s, v, drafted);
  const int32_t take = std::clamp<int32_t>(e.take, 0, static_cast<int32_t>(v.tokens.size()));
  for (int32_t j = 0; j < take; ++j) {
    s.tokens.push_back(v.tokens[j]);
    s.history.AddGenerated(v.tokens[j]);
  }
  // The drafter saw the committed tokens and its accepted drafts; not the last emitted token.
  if (d >= 0 && drafted > 0) StateFor(s, d).seen_through = s.n() - 1;
  ++s.steps;
  s.drafted += drafted;
  s.accepted += v.num_accepted;
  ++stats_.seq_steps;
  stats_.emitted += take;
  stats_.drafted += drafted;
  stats_.accepted += v.num_accepted;
  for (int32_t j = 0; j < drafted && j <= v.num_accepted; ++j) {
    if (j >= static_cast<int32_t>(stats_.drafted_at.size())) break;
    ++stats_.drafted_at[j];
    if (j < static_cast<int32_t>(v.accepted.size()) && v.accepted[j]) ++stats_.accepted_at[j];
  }
  if (e.finished) {
    step.finished.push_back(step.seqs[p]);
    step.finish_status.push_back(absl::OkStatus());
    return;
  }
  s.target_pos = s.n() - 1;
  // Both drafters that may draft it roll back (the lookup drafter too, though the n-gram one
  // keeps no state).
  for (const int32_t d : {s.drafter, s.lookup == s.drafter ? -1 : s.lookup}) {
    if (d < 0) continue;
    if (absl::Status st = drafters_[d].drafter->Commit(s.id, s.tokens); !st.ok()) {
      step.finished.push_back(step.seqs[p]);
      step.finish_status.push_back(st);
      return;
    }
  }
}

// ---- 5. Retire, 6. Release -----------------------------------------------------------------

void SpecLoop::Retire(LoopStep& step) {
  for (const LoopSeqPtr& s : step.finished) {
    if (Remove(*s)) step.release.push_back(s->id);
  }
}

void SpecLoop::Release(absl::Span<const SeqId> seqs) {
  if (seqs.empty()) return;
  target_->Release(seqs);
  for (LoopDrafter& d : drafters_) d.drafter->ReleaseMany(seqs);
}

absl::Status SpecLoop::RunStep(const SchedulerConfig& config, LoopClient& client,
                               LoopStep& step) {
  PlanLookups(config, step);
  // A failed lookup only means full prefills this step (the target step reports the error).
  (void)Lookup(step);
  Schedule(config, step);
  Release(step.release);
  step.release.clear();
  if (step.sched.plans.empty()) return absl::OkStatus();
  if (absl::Status st = Draft(step); !st.ok()) return st;
  if (absl::Status st = Target(step); !st.ok()) return st;
  Apply(step, client);
  Retire(step);
  Release(step.release);
  step.release.clear();
  return absl::OkStatus();
}

}  // namespace specd::spec
