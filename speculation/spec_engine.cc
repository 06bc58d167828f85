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

// A request as the engine keeps it: the loop's record plus its result so far.
struct SpecEngine::Sequence : LoopSeq {
  Sequence(RequestId i, SpecRequest r) : LoopSeq(i, r.prompt, r.params), req(std::move(r)) {
    max_new_tokens = req.max_new_tokens;
    seeded = req.seeded;
  }
  SpecRequest req;
  SpecResult result;
  FinishReason reason = FinishReason::kNone;  // decided when it emitted its last tokens
  bool cancelled = false;
};

// The engine's side of the loop's Apply: takes what fits in max_new_tokens, ends the request at
// a stop token or its length, streams the new tokens.
class SpecEngine::Client final : public LoopClient {
 public:
  explicit Client(SpecEngine* e) : e_(e) {}
  Emission OnVerified(LoopSeq& seq, const sampling::VerifyResult& v, int32_t) override {
    // Every sequence in the engine's loop is one of its Sequences.
    Sequence& s = static_cast<Sequence&>(seq);
    const int32_t room = s.req.max_new_tokens - s.generated();
    Emission e;
    e.take = std::min<int32_t>(room, static_cast<int32_t>(v.tokens.size()));
    for (int32_t j = 0; j < e.take; ++j) {
      s.result.tokens.push_back(v.tokens[j]);
      s.result.logprobs.push_back(v.logprobs[j]);
    }
    ++s.result.steps;
    s.result.drafted += v.num_drafted;
    s.result.accepted += v.num_accepted;
    if (v.stopped && e.take == static_cast<int32_t>(v.tokens.size())) {
      s.reason = FinishReason::kStop;
    } else if (s.generated() + e.take >= s.req.max_new_tokens) {
      s.reason = FinishReason::kLength;
    }
    e.finished = s.reason != FinishReason::kNone;
    if (e_->stream_) {
      e_->stream_(s.id, absl::MakeConstSpan(v.tokens.data(), e.take), s.reason);
    }
    return e;
  }

 private:
  SpecEngine* e_;
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
  if (o.lookup != nullptr && (!o.adaptive_k || o.lookup->runs_model())) {
    return absl::InvalidArgumentError(
        "lookup must be a drafter without a model (n-gram), with adaptive_k on");
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
  e->runner_ = std::make_unique<engine::LocalModelRunner>(target, e->kv_.get());
  e->local_target_ = std::make_unique<LocalTarget>(
      e->runner_.get(), VerifyStepOptions{o.eos_token_ids, o.verifier});
  KPolicyOptions ko;
  ko.max_k = o.k;
  ko.adaptive = o.adaptive_k;
  ko.track_load = o.track_load;
  ko.verify_cost = o.verify_cost;
  ko.draft_cost = drafter != nullptr && drafter->runs_model() ? o.draft_cost : CostCurve();
  ko.pinned_draft_ratio =
      drafter == nullptr ? 0.0 : NominalDraftRatio(drafter->weight_bytes(), target->weight_bytes(),
                                                   drafter->runs_model() ? 0.5 : 0.0);
  KPolicyOptions lookup_ko = ko;  // free drafts
  lookup_ko.draft_cost = CostCurve();
  lookup_ko.pinned_draft_ratio = 0.0;
  std::vector<LoopDrafter> drafters;
  if (drafter != nullptr) drafters.push_back(LoopDrafter{drafter, KPolicy(std::move(ko))});
  if (o.lookup != nullptr) {
    e->lookup_index_ = static_cast<int32_t>(drafters.size());
    drafters.push_back(LoopDrafter{o.lookup, KPolicy(std::move(lookup_ko))});
  }
  LoopOptions lo;
  lo.drafts_with_prompt = true;
  lo.context_length = target->config().context_length;
  lo.max_running = o.max_running;
  lo.draft_errors_fail_step = true;
  e->loop_ = std::make_unique<SpecLoop>(lo, e->local_target_.get(), std::move(drafters));
  e->verify_cost_ = o.verify_cost;
  e->ResetStats();
  if (o.adaptive_k && o.calibrate) {
    absl::Status st = e->Calibrate();
    if (!st.ok()) return st;
  }
  return e;
}

void SpecEngine::ResetStats() {
  SpecStats& stats = loop_->mutable_stats();
  stats = SpecStats();
  stats.drafted_at.assign(options_.k, 0);
  stats.accepted_at.assign(options_.k, 0);
  stats.k_chosen.assign(options_.k + 1, 0);
}

const CostCurve& SpecEngine::verify_cost() const {
  return loop_->drafters().empty() ? verify_cost_ : loop_->drafters()[0].policy.verify_cost();
}

const CostCurve& SpecEngine::draft_cost() const {
  return loop_->drafters().empty() ? draft_cost_ : loop_->drafters()[0].policy.draft_cost();
}

// The policy's curves from timed runs (calibration.h); their scale keeps tracking the measured
// steps.
absl::Status SpecEngine::Calibrate() {
  engine::LocalModelRunner runner(target_, kv_.get());
  constexpr SeqId kProbe = -1;
  absl::StatusOr<CostCurve> verify =
      CalibrateVerify(runner, options_.max_batch_tokens, target_->options().max_logit_rows,
                      kProbe, options_.calibrate_depth_keys);
  if (!verify.ok()) return verify.status();
  if (lookup_index_ >= 0) loop_->drafters()[lookup_index_].policy.set_costs(*verify, CostCurve());
  if (drafter_ == nullptr) {
    verify_cost_ = std::move(*verify);
    return absl::OkStatus();
  }
  KPolicy& policy = loop_->drafters()[0].policy;
  if (!drafter_->runs_model()) {
    policy.set_costs(std::move(*verify), CostCurve());
    return absl::OkStatus();
  }
  absl::StatusOr<CostCurve> draft =
      CalibrateDraft(*drafter_, target_->vocab_size(), options_.max_running,
                     std::max(0, std::min(options_.calibrate_depth_keys,
                                          target_->config().context_length -
                                              kDepthCalibrationRows)));
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
  AddProbeFeatures(*drafter_, -1, prompt.size());
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
  // The refinement times position 0 with every row's logits: both curves keep their depth
  // costs, the verify curve its logit rows' price and the draft curve its catch-up rows'.
  CostCurve refined(std::move(points)), refined_draft(std::move(dpoints));
  refined.set_depth(verify->depth());
  refined.set_logits(verify->logits());
  refined_draft.set_depth(draft->depth());
  refined_draft.set_catch_up_row(draft->catch_up_row());
  policy.set_costs(std::move(refined), std::move(refined_draft));
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
  if (loop_->waiting().size() >= static_cast<size_t>(options_.max_waiting)) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("request queue is full (%d waiting)", loop_->waiting().size()));
  }
  const RequestId id = next_id_++;
  auto s = std::make_shared<Sequence>(id, std::move(r));
  s->drafter = drafter_ != nullptr ? 0 : -1;
  s->lookup = lookup_index_;
  s->max_k = s->req.k >= 0 ? s->req.k : options_.k;
  s->fixed_k = !options_.adaptive_k;
  loop_->Enqueue(std::move(s));
  return id;
}

absl::Status SpecEngine::Cancel(RequestId id) {
  // Every sequence in the engine's loop is one of its Sequences.
  auto* s = static_cast<Sequence*>(loop_->Find(id));
  if (s == nullptr || s->cancelled) {
    return absl::NotFoundError(absl::StrCat("no running or queued request ", id));
  }
  s->cancelled = true;
  // Still queued: it holds no KV (a preempted sequence released it), so it ends now.
  for (const LoopSeqPtr& w : loop_->waiting()) {
    if (w->id != id) continue;
    LoopSeqPtr keep = w;
    loop_->Remove(*keep);
    Finish(*s, FinishReason::kCancelled);
    break;
  }
  return absl::OkStatus();
}

absl::StatusOr<SpecResult> SpecEngine::TakeResult(RequestId id) {
  auto it = finished_.find(id);
  if (it == finished_.end()) {
    if (LoopSeq* s = loop_->Find(id); s != nullptr) {
      const bool queued = std::any_of(loop_->waiting().begin(), loop_->waiting().end(),
                                      [&](const LoopSeqPtr& w) { return w->id == id; });
      return absl::FailedPreconditionError(
          absl::StrCat("request ", id, queued ? " is queued" : " runs"));
    }
    return absl::NotFoundError(absl::StrCat("unknown request ", id));
  }
  SpecResult r = std::move(it->second);
  finished_.erase(it);
  return r;
}

int64_t SpecEngine::CommittedLength(RequestId id) const {
  for (const LoopSeqPtr& s : loop_->running()) {
    if (s->id == id) return s->n();
  }
  return -1;
}

// Records the result; the sequence is out of the loop and its KV freed already.
void SpecEngine::Finish(Sequence& s, FinishReason reason, absl::Status status) {
  s.result.finish = reason;
  s.result.status = std::move(status);
  finished_[s.id] = std::move(s.result);
  s.result = SpecResult();
  if (stream_ && (reason == FinishReason::kCancelled || reason == FinishReason::kError)) {
    stream_(s.id, {}, reason);
  }
}

SchedulerConfig SpecEngine::SchedulerFor() const {
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
  return config;
}

absl::Status SpecEngine::Step() {
  const auto t_step = Clock::now();
  FinishCancelled();
  LoopStep step;
  Client client(this);
  const absl::Status st = loop_->RunStep(SchedulerFor(), client, step);
  if (!st.ok()) return st;
  if (step.sched.plans.empty()) {
    FailStuck(step);
    return absl::OkStatus();
  }
  Collect(step);
  loop_->mutable_stats().step_seconds += Since(t_step);
  return absl::OkStatus();
}

void SpecEngine::FinishCancelled() {
  std::vector<LoopSeqPtr> cancelled;
  for (const LoopSeqPtr& s : loop_->running()) {
    if (static_cast<Sequence&>(*s).cancelled) cancelled.push_back(s);
  }
  std::vector<SeqId> release;
  for (const LoopSeqPtr& s : cancelled) {
    if (loop_->Remove(*s)) release.push_back(s->id);
  }
  loop_->Release(release);
  for (const LoopSeqPtr& s : cancelled) Finish(static_cast<Sequence&>(*s), FinishReason::kCancelled);
}

void SpecEngine::FailStuck(const LoopStep& step) {
  if (loop_->running().empty() || !step.sched.preempt.empty()) return;
  // Nothing can run (the scheduler found no room even for the oldest): fail it rather than
  // spin. Admit() rules this out for a request alone.
  LoopSeqPtr s = loop_->running().front();
  if (loop_->Remove(*s)) loop_->Release({s->id});
  Finish(static_cast<Sequence&>(*s), FinishReason::kError,
         absl::ResourceExhaustedError("KV cache cannot hold the request"));
}

void SpecEngine::Collect(LoopStep& step) {
  for (size_t i = 0; i < step.finished.size(); ++i) {
    Sequence& s = static_cast<Sequence&>(*step.finished[i]);
    if (step.finish_status[i].ok()) {
      Finish(s, s.reason);
    } else {
      Finish(s, FinishReason::kError, step.finish_status[i]);  // streams the kError end
    }
  }
}

absl::Status SpecEngine::RunToCompletion() {
  while (HasWork()) {
    absl::Status st = Step();
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace specd::spec
