#include "speculation/spec_engine.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/model_runner.h"
#include "common/sampling/speculative_verifier.h"
#include "speculation/calibration.h"
#include "common/util/check.h"

namespace specd::spec {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "?";
}

struct SpecEngine::Sequence {
  Sequence(RequestId i, SpecRequest r)
      : id(i),
        req(std::move(r)),
        rng(req.params.seed),
        history(sampling::PenaltyState::FromTokens(req.prompt, {})),
        tokens(req.prompt) {}

  RequestId id;
  SpecRequest req;
  sampling::CounterRng rng;
  sampling::PenaltyState history;  // prompt + generated, for the penalties
  std::vector<int32_t> tokens;     // x_1..x_n: prompt + generated
  int64_t kv_len = 0;              // the target KV holds tokens[0, kv_len)
  SpecSeqState spec;               // what the adaptive-k policy knows of it
  SpecResult result;
  bool cancelled = false;
  bool done = false;  // finished this step; erased from running_ at its end

  int64_t n() const { return static_cast<int64_t>(tokens.size()); }
  int32_t generated() const { return static_cast<int32_t>(result.tokens.size()); }
};

SpecEngine::~SpecEngine() = default;

absl::StatusOr<std::unique_ptr<SpecEngine>> SpecEngine::Create(engine::LlamaModel* target,
                                                               Drafter* drafter,
                                                               const SpecEngineOptions& o) {
  if (target == nullptr) return absl::InvalidArgumentError("target model is null");
  const engine::ModelOptions& mo = target->options();
  if (o.max_batch_tokens < 1 || o.max_batch_tokens > mo.max_batch_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_batch_tokens must be in [1, %d] (the target's max_batch_tokens), got %d",
        mo.max_batch_tokens, o.max_batch_tokens));
  }
  const int32_t max_running = std::min(o.max_batch_tokens, mo.max_logit_rows);
  if (o.max_running < 1 || o.max_running > max_running) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_running must be in [1, %d] (max_batch_tokens and the target's max_logit_rows), "
        "got %d",
        max_running, o.max_running));
  }
  if (o.max_waiting < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_waiting must be >= 0, got %d", o.max_waiting));
  }
  if (o.k < 0 || o.k > 32) {
    return absl::InvalidArgumentError(absl::StrFormat("k must be in [0, 32], got %d", o.k));
  }
  if (o.kv_blocks < 1 || o.block_size < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "kv_blocks (%d) and block_size (%d) must be >= 1", o.kv_blocks, o.block_size));
  }
  if (o.adaptive_k && !o.calibrate && o.verify_cost.empty()) {
    return absl::InvalidArgumentError(
        "verify_cost must be given when adaptive_k is on and calibrate is off");
  }
  std::unique_ptr<SpecEngine> e(new SpecEngine());
  e->target_ = target;
  e->drafter_ = drafter;
  e->options_ = o;
  absl::StatusOr<std::unique_ptr<engine::PagedKvCache>> kv = engine::PagedKvCache::Create(
      target->MakeKvCacheConfig(o.kv_blocks, o.block_size, o.kv_dtype));
  if (!kv.ok()) return kv.status();
  e->kv_ = std::move(*kv);
  e->logits_.resize(static_cast<size_t>(mo.max_logit_rows) * target->vocab_size());
  KPolicyOptions ko;
  ko.max_k = o.k;
  ko.adaptive = o.adaptive_k;
  ko.track_load = o.track_load;
  ko.verify_cost = o.verify_cost;
  ko.draft_cost = drafter != nullptr && drafter->runs_model() ? o.draft_cost : CostCurve();
  ko.pinned_draft_ratio =
      drafter == nullptr ? 0.0 : NominalDraftRatio(drafter->weight_bytes(), target->weight_bytes(),
                                                   drafter->runs_model() ? 0.5 : 0.0);
  e->policy_ = KPolicy(std::move(ko));
  e->ResetStats();
  if (o.adaptive_k && o.calibrate) {
    absl::Status st = e->Calibrate();
    if (!st.ok()) return st;
  }
  return e;
}

void SpecEngine::ResetStats() {
  stats_ = SpecStats();
  stats_.drafted_at.assign(options_.k, 0);
  stats_.accepted_at.assign(options_.k, 0);
  stats_.k_chosen.assign(options_.k + 1, 0);
}

// The policy's curves from timed runs (calibration.h); their scale keeps tracking the measured
// steps.
absl::Status SpecEngine::Calibrate() {
  engine::LocalModelRunner runner(target_, kv_.get());
  constexpr SeqId kProbe = -1;
  absl::StatusOr<CostCurve> verify = CalibrateVerify(runner, options_.max_batch_tokens,
                                                     target_->options().max_logit_rows, kProbe);
  if (!verify.ok()) return verify.status();
  if (drafter_ == nullptr || !drafter_->runs_model()) {
    policy_.set_costs(std::move(*verify), CostCurve());
    return absl::OkStatus();
  }
  absl::StatusOr<CostCurve> draft =
      CalibrateDraft(*drafter_, target_->vocab_size(), options_.max_running);
  if (!draft.ok()) return draft.status();
  std::vector<std::pair<double, double>> points = verify->points();
  std::vector<std::pair<double, double>> dpoints = draft->points();

  // The batch-1 decision rests on the ratio draft(1) / verify(1), and the two were timed at
  // different moments: a burst of other load during one of them skews it for the whole run
  // (a draft cost measured 2x too high keeps k at 0, and then no draft step corrects it).
  // Refine both with alternating runs, keeping the minimum of each.
  const int32_t vocab = target_->vocab_size();
  std::vector<int32_t> prompt(8);
  for (int32_t i = 0; i < 8; ++i) prompt[i] = 1 + (i * 7919) % (vocab - 1);
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  const sampling::PenaltyState none;
  const sampling::CounterRng rng(0);
  absl::Status st = kv_->AddSequence(kProbe);
  if (!st.ok()) return st;
  std::vector<DraftInput> in1{DraftInput{-1, prompt, &greedy, &none, &rng, 2}};
  std::vector<DraftOutput> out1(1);
  for (int rep = 0; rep < 5 && st.ok(); ++rep) {
    batch_.Clear();
    batch_.Add(kProbe, 0, prompt.data(), 1, /*all_logits=*/false);
    auto t0 = Clock::now();
    st = target_->Forward(batch_, *kv_, logits_.data());
    if (!st.ok()) break;
    points.front().second = std::min(points.front().second, Since(t0));
    t0 = Clock::now();
    st = drafter_->Propose(in1, absl::MakeSpan(out1));
    if (rep > 0) dpoints.front().second = std::min(dpoints.front().second, Since(t0) / 2);
  }
  drafter_->Release(-1);
  kv_->FreeSequence(kProbe);
  if (!st.ok()) return st;
  policy_.set_costs(CostCurve(std::move(points)), CostCurve(std::move(dpoints)));
  return absl::OkStatus();
}

absl::StatusOr<RequestId> SpecEngine::Admit(SpecRequest r) {
  const int32_t vocab = target_->vocab_size();
  if (r.prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    if (r.prompt[i] < 0 || r.prompt[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "prompt[%d] = %d is outside the vocabulary [0, %d)", i, r.prompt[i], vocab));
    }
  }
  if (r.max_new_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_new_tokens must be >= 1, got %d", r.max_new_tokens));
  }
  const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens;
  if (total > target_->config().context_length) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_new_tokens: prompt (%d tokens) + max_new_tokens (%d) exceeds the context length %d",
        r.prompt.size(), r.max_new_tokens, target_->config().context_length));
  }
  if (kv_->BlocksFor(total) > kv_->num_blocks()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_new_tokens: prompt + max_new_tokens = %d tokens needs %d KV blocks, the cache has "
        "%d",
        total, kv_->BlocksFor(total), kv_->num_blocks()));
  }
  if (absl::Status st = sampling::Validate(r.params, vocab); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("params: ", st.message()));
  }
  if (r.k < -1 || r.k > options_.k) {
    return absl::InvalidArgumentError(
        absl::StrFormat("k must be in [-1, %d] (-1 = engine policy), got %d", options_.k, r.k));
  }
  if (waiting_.size() >= static_cast<size_t>(options_.max_waiting)) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("request queue is full (%d waiting)", waiting_.size()));
  }
  const RequestId id = next_id_++;
  waiting_.push_back(std::make_unique<Sequence>(id, std::move(r)));
  return id;
}

absl::Status SpecEngine::Cancel(RequestId id) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if ((*it)->id != id) continue;
    std::unique_ptr<Sequence> s = std::move(*it);
    waiting_.erase(it);
    Finish(*s, FinishReason::kCancelled);
    return absl::OkStatus();
  }
  for (auto& s : running_) {
    if (s->id == id && !s->done) {
      s->cancelled = true;
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(absl::StrCat("no running or queued request ", id));
}

absl::StatusOr<SpecResult> SpecEngine::TakeResult(RequestId id) {
  auto it = finished_.find(id);
  if (it == finished_.end()) {
    for (const auto& s : running_) {
      if (s->id == id) return absl::FailedPreconditionError(absl::StrCat("request ", id, " runs"));
    }
    for (const auto& s : waiting_) {
      if (s->id == id) {
        return absl::FailedPreconditionError(absl::StrCat("request ", id, " is queued"));
      }
    }
    return absl::NotFoundError(absl::StrCat("unknown request ", id));
  }
  SpecResult r = std::move(it->second);
  finished_.erase(it);
  return r;
}

int64_t SpecEngine::CommittedLength(RequestId id) const {
  for (const auto& s : running_) {
    if (s->id == id) return s->n();
  }
  return -1;
}

void SpecEngine::Finish(Sequence& s, FinishReason reason, absl::Status status) {
  s.done = true;
  kv_->FreeSequence(s.id);
  if (drafter_ != nullptr) drafter_->Release(s.id);
  s.result.finish = reason;
  s.result.status = std::move(status);
  finished_[s.id] = std::move(s.result);
  s.result = SpecResult();
  if (stream_ && (reason == FinishReason::kCancelled || reason == FinishReason::kError)) {
    stream_(s.id, {}, reason);
  }
}

void SpecEngine::Preempt(size_t i) {
  std::unique_ptr<Sequence> s = std::move(running_[i]);
  running_.erase(running_.begin() + i);
  kv_->FreeSequence(s->id);
  if (drafter_ != nullptr) drafter_->Release(s->id);
  s->kv_len = 0;  // recomputed from its tokens when re-admitted
  ++stats_.preemptions;
  waiting_.push_front(std::move(s));
}

int32_t SpecEngine::KCap(const Sequence& s) const {
  if (drafter_ == nullptr) return 0;
  int64_t k = s.req.k >= 0 ? s.req.k : options_.k;
  // Verify rows sit at positions n-1 .. n-1+k < context; more drafts than tokens left are waste.
  k = std::min<int64_t>(k, target_->config().context_length - s.n());
  k = std::min<int64_t>(k, s.req.max_new_tokens - s.generated() - 1);
  return static_cast<int32_t>(std::max<int64_t>(k, 0));
}

// The rejection scheme of docs/DESIGN.md §2 keeps the *distribution* of every token whatever k is,
// but the realized sample at a position depends on whether it was drafted (accept/resample
// draws) or was a bonus/plain token (one draw from p). So a seeded sampled sequence gets a k
// schedule that is a function of its own state only — its cap, never the batch's adaptive
// choice, token budget or KV pressure — and the same seed gives the same text however it is
// batched. Greedy output is independent of k, so greedy sequences adapt freely.
bool SpecEngine::PinnedK(const Sequence& s) { return !sampling::IsGreedy(s.req.params); }

absl::Status SpecEngine::Step() {
  const auto t_step = Clock::now();
  FinishCancelled();
  absl::StatusOr<Schedule> sched = ScheduleStep();
  if (!sched.ok()) return sched.status();
  std::vector<SeqPlan>& plans = sched->plans;
  if (plans.empty()) {
    if (!running_.empty() && sched->preempt.empty()) {
      // Nothing can run (the scheduler found no room even for the oldest): fail it rather
      // than spin. Admit() rules this out for a request alone.
      Finish(*running_.front(), FinishReason::kError,
             absl::ResourceExhaustedError("KV cache cannot hold the request"));
      std::erase_if(running_, [](const std::unique_ptr<Sequence>& s) { return s->done; });
    }
    return absl::OkStatus();
  }
  absl::flat_hash_map<RequestId, Sequence*> by_id;
  for (auto& s : running_) by_id[s->id] = s.get();
  std::vector<Sequence*> seqs;
  for (const SeqPlan& p : plans) seqs.push_back(by_id.at(p.id));
  std::vector<DraftOutput> drafts;
  if (absl::Status st = DraftStep(plans, seqs, drafts); !st.ok()) return st;
  std::vector<int32_t> row_of;
  if (absl::Status st = TargetForward(plans, seqs, drafts, row_of); !st.ok()) return st;
  ApplyResults(plans, seqs, drafts, row_of);
  stats_.step_seconds += Since(t_step);
  return absl::OkStatus();
}

void SpecEngine::FinishCancelled() {
  for (auto& s : running_) {
    if (s->cancelled && !s->done) Finish(*s, FinishReason::kCancelled);
  }
  std::erase_if(running_, [](const std::unique_ptr<Sequence>& s) { return s->done; });
}

absl::StatusOr<Schedule> SpecEngine::ScheduleStep() {
  // k for every sequence that may verify this step: the decoding ones, and — the scheduler's
  // drafts_with_prompt — those whose prompt may end this step, the waiting ones that may be
  // admitted included (their first token can then come with drafts).
  const size_t admissible = std::min(
      waiting_.size(),
      static_cast<size_t>(std::max<int64_t>(0, options_.max_running -
                                                   static_cast<int64_t>(running_.size()))));
  std::vector<Sequence*> candidates;
  for (auto& s : running_) candidates.push_back(s.get());
  for (size_t i = 0; i < admissible; ++i) candidates.push_back(waiting_[i].get());
  std::vector<KRequest> requests;
  int64_t pending = 0, rows = 0;
  for (Sequence* s : candidates) {
    const int64_t uncomputed = s->n() - s->kv_len;
    pending += uncomputed - 1;
    ++rows;
    const int64_t held = drafter_ != nullptr ? drafter_->CachedLength(s->id) : -1;
    const int32_t behind = static_cast<int32_t>(s->n() - std::max<int64_t>(held, 0));
    requests.push_back({&s->spec, KCap(*s), PinnedK(*s), behind});
  }
  const int64_t prefill = std::min<int64_t>(
      pending, std::max<int64_t>(0, options_.max_batch_tokens - rows));
  const std::vector<int32_t> k = policy_.Choose(requests, static_cast<int32_t>(prefill));
  std::vector<int32_t> want_k(k.begin(), k.begin() + running_.size());

  SchedulerState state;
  const bool local_drafts = drafter_ != nullptr && !drafter_->runs_model();
  for (size_t i = 0; i < running_.size(); ++i) {
    const Sequence& s = *running_[i];
    state.running.push_back({s.id, static_cast<int32_t>(s.n()), static_cast<int32_t>(s.kv_len),
                             want_k[i], local_drafts, PinnedK(s), s.generated() > 0});
  }
  // Only the head of the queue can be admitted (FCFS, at most max_running at once): the
  // scheduler needs no more of it, however long it is.
  const size_t head = std::min(waiting_.size(), static_cast<size_t>(options_.max_running));
  for (size_t i = 0; i < head; ++i) {
    const Sequence& s = *waiting_[i];
    const int32_t want = i < admissible ? k[running_.size() + i] : 0;
    state.waiting.push_back({s.id, static_cast<int32_t>(s.n()), 0, want, local_drafts,
                             PinnedK(s), s.generated() > 0});
  }
  SchedulerConfig config;
  config.max_batch_tokens = options_.max_batch_tokens;
  config.max_running = options_.max_running;
  config.max_queue = options_.max_waiting;
  config.block_size = options_.block_size;
  config.target_blocks = kv_->num_blocks();
  const engine::PagedKvCache* draft_kv = drafter_ != nullptr ? drafter_->kv_cache() : nullptr;
  config.draft_blocks = draft_kv != nullptr ? draft_kv->num_blocks() : 0;
  config.max_logit_rows = target_->options().max_logit_rows;
  config.drafts_with_prompt = true;
  Schedule sched = ScheduleIteration(state, config);

  for (int64_t id : sched.preempt) {
    for (size_t i = 0; i < running_.size(); ++i) {
      if (running_[i]->id == id) {
        Preempt(i);
        break;
      }
    }
  }
  for (int64_t id : sched.admit) {
    SPECD_CHECK(!waiting_.empty() && waiting_.front()->id == id, "scheduler admitted out of order");
    if (absl::Status st = kv_->AddSequence(id); !st.ok()) return st;
    waiting_.front()->kv_len = 0;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  return sched;
}

absl::Status SpecEngine::DraftStep(std::vector<SeqPlan>& plans, absl::Span<Sequence* const> seqs,
                                   std::vector<DraftOutput>& drafts) {
  drafts.assign(plans.size(), DraftOutput{});
  std::vector<DraftInput> in;
  std::vector<size_t> which;       // in[j] -> plans index
  std::vector<KRequest> drafting;  // for the policy's cost observation
  std::vector<int32_t> ks;
  for (size_t p = 0; p < plans.size(); ++p) {
    if (!plans[p].emit || plans[p].k <= 0) continue;
    Sequence& s = *seqs[p];
    in.push_back(DraftInput{s.id, s.tokens, &s.req.params, &s.history, &s.rng, plans[p].k});
    which.push_back(p);
    drafting.push_back({&s.spec, plans[p].k, PinnedK(s)});
    ks.push_back(plans[p].k);
  }
  if (!in.empty()) {
    std::vector<DraftOutput> out(in.size());
    const auto t0 = Clock::now();
    absl::Status st = drafter_->Propose(in, absl::MakeSpan(out));
    const double secs = Since(t0);
    stats_.draft_seconds += secs;
    if (st.ok()) {
      if (drafter_->runs_model()) policy_.ObserveDraft(drafting, ks, secs);
      for (size_t j = 0; j < which.size(); ++j) {
        out[j].proposals.resize(std::min<size_t>(out[j].proposals.size(), plans[which[j]].k));
        drafts[which[j]] = std::move(out[j]);
      }
    } else if (absl::IsResourceExhausted(st)) {
      ++stats_.draft_failures;  // decode without drafts this step
    } else {
      return st;
    }
  }
  // What each emitting sequence really drafts this step (the drafter may propose fewer).
  stats_.last_k.clear();
  for (size_t p = 0; p < plans.size(); ++p) {
    if (!plans[p].emit) continue;
    plans[p].k = static_cast<int32_t>(drafts[p].proposals.size());
    policy_.AfterDraft(seqs[p]->spec, plans[p].k);
    if (static_cast<size_t>(plans[p].k) < stats_.k_chosen.size()) ++stats_.k_chosen[plans[p].k];
    stats_.last_k.push_back(plans[p].k);
  }
  return absl::OkStatus();
}

absl::Status SpecEngine::TargetForward(const std::vector<SeqPlan>& plans,
                                       absl::Span<Sequence* const> seqs,
                                       const std::vector<DraftOutput>& drafts,
                                       std::vector<int32_t>& row_of) {
  // tokens[start, end) per plan: a prompt chunk, or with `emit` the tail ending in x_n (usually
  // just x_n) followed by d_1..d_k, whose last k + 1 rows give p_1..p_{k+1}.
  batch_.Clear();
  row_of.assign(plans.size(), -1);
  std::vector<int32_t> draft_ids;
  int64_t prefill_tokens = 0;
  for (size_t p = 0; p < plans.size(); ++p) {
    const SeqPlan& plan = plans[p];
    const Sequence& s = *seqs[p];
    const absl::Span<const int32_t> tokens =
        absl::MakeConstSpan(s.tokens).subspan(plan.start, plan.end - plan.start);
    if (plan.emit) {
      draft_ids.clear();
      for (const auto& q : drafts[p].proposals) draft_ids.push_back(q.token);
      row_of[p] = batch_.AddVerify(s.id, plan.start, tokens, draft_ids);
      prefill_tokens += static_cast<int64_t>(tokens.size()) - 1;
    } else {
      batch_.AddPrompt(s.id, plan.start, tokens.data(), static_cast<int32_t>(tokens.size()));
      prefill_tokens += static_cast<int64_t>(tokens.size());
    }
  }
  const int64_t T = static_cast<int64_t>(batch_.tokens.size());
  const auto t0 = Clock::now();
  absl::Status st = target_->Forward(batch_, *kv_, logits_.data());
  const double secs = Since(t0);
  if (!st.ok()) return st;
  stats_.verify_seconds += secs;
  policy_.ObserveVerify(static_cast<double>(T), secs);
  ++stats_.steps;
  stats_.target_tokens += T;
  stats_.prefill_tokens += prefill_tokens;
  return absl::OkStatus();
}

void SpecEngine::ApplyResults(const std::vector<SeqPlan>& plans,
                              absl::Span<Sequence* const> seqs,
                              const std::vector<DraftOutput>& drafts,
                              const std::vector<int32_t>& row_of) {
  const int32_t vocab = target_->vocab_size();
  for (size_t p = 0; p < plans.size(); ++p) {
    Sequence& s = *seqs[p];
    if (!plans[p].emit) {
      s.kv_len = plans[p].end;
      continue;
    }
    sampling::VerifyInput vin;
    vin.target_logits =
        absl::Span<const float>(logits_.data() + static_cast<size_t>(row_of[p]) * vocab,
                                static_cast<size_t>(plans[p].k + 1) * vocab);
    vin.vocab_size = vocab;
    vin.proposals = drafts[p].proposals;
    vin.history = &s.history;
    vin.position = s.n();
    vin.eos_token_ids = options_.eos_token_ids;
    absl::StatusOr<sampling::VerifyResult> v =
        options_.verifier ? options_.verifier(s.req.params, s.rng, vin)
                          : sampling::VerifyDraft(s.req.params, s.rng, vin);
    if (!v.ok()) {
      Finish(s, FinishReason::kError, v.status());
      continue;
    }
    Commit(s, *v);
  }
  std::erase_if(running_, [](const std::unique_ptr<Sequence>& s) { return s->done; });
}

// Appends what verification emitted, updates the statistics and the policy, then finishes
// the sequence or rolls both models back to what was committed.
void SpecEngine::Commit(Sequence& s, const sampling::VerifyResult& v) {
  const int64_t n = s.n();
  const int32_t room = s.req.max_new_tokens - s.generated();
  const int32_t take = std::min<int32_t>(room, static_cast<int32_t>(v.tokens.size()));
  for (int32_t j = 0; j < take; ++j) {
    s.tokens.push_back(v.tokens[j]);
    s.history.AddGenerated(v.tokens[j]);
    s.result.tokens.push_back(v.tokens[j]);
    s.result.logprobs.push_back(v.logprobs[j]);
  }
  ++s.result.steps;
  s.result.drafted += v.num_drafted;
  s.result.accepted += v.num_accepted;
  policy_.AfterVerify(s.spec, v.num_drafted, v.num_accepted);
  ++stats_.seq_steps;
  stats_.emitted += take;
  stats_.drafted += v.num_drafted;
  stats_.accepted += v.num_accepted;
  for (int32_t j = 0; j < v.num_drafted && j <= v.num_accepted; ++j) {
    if (j >= static_cast<int32_t>(stats_.drafted_at.size())) break;
    ++stats_.drafted_at[j];
    if (v.accepted[j]) ++stats_.accepted_at[j];
  }
  FinishReason reason = FinishReason::kNone;
  if (v.stopped && take == static_cast<int32_t>(v.tokens.size())) {
    reason = FinishReason::kStop;
  } else if (s.generated() >= s.req.max_new_tokens) {
    reason = FinishReason::kLength;
  }
  const std::vector<int32_t> fresh(s.tokens.begin() + n, s.tokens.end());
  if (reason != FinishReason::kNone) {
    Finish(s, reason);
    if (stream_) stream_(s.id, fresh, reason);
    return;
  }
  // Rollback: the target keeps x_1..x_n and the accepted drafts; the emitted correction/bonus
  // is fed with the next step's verify row.
  s.kv_len = n + v.num_accepted;
  SPECD_CHECK(s.kv_len == s.n() - 1, "kv_len %lld vs committed %lld",
              static_cast<long long>(s.kv_len), static_cast<long long>(s.n()));
  absl::Status st = kv_->Truncate(s.id, s.kv_len);
  if (st.ok() && drafter_ != nullptr) st = drafter_->Commit(s.id, s.tokens);
  if (!st.ok()) {
    if (stream_) stream_(s.id, fresh, FinishReason::kNone);
    Finish(s, FinishReason::kError, st);  // streams the kError end
    return;
  }
  if (stream_) stream_(s.id, fresh, reason);
}

absl::Status SpecEngine::RunToCompletion() {
  while (HasWork()) {
    absl::Status st = Step();
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace specd::spec
