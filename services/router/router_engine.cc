#include "services/router/router_engine.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/sampling/sampling_params.h"
#include "common/util/check.h"
#include "services/common/event_log.h"
#include "services/common/proto_convert.h"

namespace specd::router {

// A request as the router keeps it: the loop's record plus its client, stream and clocks.
struct RouterEngine::Request : spec::LoopSeq {
  Request(int64_t id, ValidatedRequest r)
      : spec::LoopSeq(id, r.prompt, r.params), req(std::move(r)) {
    max_new_tokens = req.max_new_tokens;
  }
  ValidatedRequest req;
  std::shared_ptr<RequestSink> sink;
  absl::Time deadline, t_submit, t_scheduled = absl::InfiniteFuture(),
                       t_first = absl::InfiniteFuture(), t_last;
  bool cancelled = false;  // guarded by mu_
  // Its deadline passed (loop thread). Wins over `cancelled`: a gRPC client's deadline also
  // cancels the call, and the request must count as DEADLINE_EXCEEDED, not CANCELLED.
  bool expired = false;
  std::unique_ptr<TextStream> text;
  specd::v1::FinishReason reason = specd::v1::FINISH_REASON_UNSPECIFIED;
  bool done = false;
};

// The router's side of the loop's Apply: the emitted tokens go to the request's stream.
class RouterEngine::Client final : public spec::LoopClient {
 public:
  // `batch`: the step's StepBatchLabel.
  Client(RouterEngine* e, const char* batch) : e_(e), batch_(batch) {}
  spec::Emission OnVerified(spec::LoopSeq& s, const sampling::VerifyResult& v,
                            int32_t drafted) override {
    // Every sequence in the router's loop is one of its Requests.
    return e_->EmitTokens(static_cast<Request&>(s), v, drafted, batch_);
  }

 private:
  RouterEngine* e_;
  const char* batch_;
};

namespace {

std::string CodeName(absl::StatusCode code) { return absl::StatusCodeToString(code); }

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// The router's n-gram lookup: suffixes of 1..3 tokens, most recent match.
std::unique_ptr<spec::NgramDrafter> MakeNgram() {
  spec::NgramDrafterOptions o;
  o.max_ngram = 3;
  absl::StatusOr<std::unique_ptr<spec::NgramDrafter>> d = spec::NgramDrafter::Create(o);
  SPECD_CHECK(d.ok(), "n-gram options: %s", d.status().ToString().c_str());
  return std::move(*d);
}

}  // namespace

RouterEngine::RouterEngine(const RouterOptions& options, std::unique_ptr<TargetBackend> target,
                           std::unique_ptr<DraftBackend> draft, const tok::Tokenizer& tokenizer,
                           services::Metrics* metrics)
    : options_(options),
      target_(std::move(target)),
      draft_(std::move(draft)),
      tokenizer_(tokenizer),
      metrics_(metrics),
      remote_target_(target_.get(), metrics),
      ngram_(MakeNgram()) {
  if (draft_ != nullptr) remote_draft_ = std::make_unique<RemoteDrafter>(draft_.get(), metrics);
  // The last step's tokens go to the clients while the next step is on the services (the
  // first call that goes out sends them): a client's write never delays the step.
  remote_target_.set_while_waiting([this] { SendUnsentChunks(); });
  if (remote_draft_ != nullptr) remote_draft_->set_while_waiting([this] { SendUnsentChunks(); });
  metrics_->router_queue_limit.Set(options_.scheduler.max_queue);
  metrics_->router_step_bound.Set(options_.scheduler.step_seconds_while_decoding);
}

RouterEngine::~RouterEngine() { Stop(); }

absl::Status RouterEngine::Start() {
  absl::StatusOr<iv1::ServiceInfo> info = target_->GetInfo();
  if (!info.ok()) {
    return absl::UnavailableError(absl::StrCat("target service: ", info.status().message()));
  }
  if (info->vocab_fingerprint() != tokenizer_.Fingerprint()) {
    return absl::FailedPreconditionError(
        "the target's vocabulary differs from the router's tokenizer model");
  }
  target_info_ = *info;
  // Both policies price verification with the target's curve; the n-gram drafts are free.
  spec::KPolicyOptions ko;
  ko.max_k = options_.max_k;
  ko.track_load = options_.track_load;
  ko.verify_cost =
      options_.verify_cost.empty() ? services::CostCurveFromProto(*info) : options_.verify_cost;
  std::vector<spec::LoopDrafter> drafters;
  if (remote_draft_ != nullptr) {
    spec::KPolicyOptions dko = ko;
    dko.pinned_draft_ratio = 0.5;  // until the draft reports its size
    dko.draft_cost = options_.draft_cost;
    draft_slot_ = static_cast<int32_t>(drafters.size());
    drafters.push_back(spec::LoopDrafter{remote_draft_.get(), spec::KPolicy(dko), false});
  }
  ko.pinned_draft_ratio = 0.0;  // n-gram drafts are free
  ngram_slot_ = static_cast<int32_t>(drafters.size());
  drafters.push_back(spec::LoopDrafter{ngram_.get(), spec::KPolicy(ko), true});
  spec::LoopOptions lo;
  lo.drafts_with_prompt = false;  // the first token comes from the prefill row
  // One position spare below the context: the draft service may hold a shorter one.
  lo.context_length = target_info_.context_length() - 1;
  lo.max_running = options_.scheduler.max_running;
  lo.draft_errors_fail_step = false;  // a failing draft service only means plain decoding
  lo.prefix_lookups = target_info_.prefix_caching();
  lo.lookup_min_match = options_.lookup_min_match;
  {
    absl::MutexLock l(&mu_);
    loop_ = std::make_unique<spec::SpecLoop>(lo, &remote_target_, std::move(drafters));
  }
  MaybeReconnectDraft();
  loop_thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void RouterEngine::SetDraftUp(bool up, absl::string_view why) {
  if (remote_draft_ == nullptr) return;
  remote_draft_->set_available(up);
  bool changed;
  {
    absl::MutexLock l(&mu_);
    changed = draft_up_ != up;
    draft_up_ = up;
    loop_->drafters()[draft_slot_].available = up;
  }
  metrics_->router_draft_available.Set(up ? 1 : 0);
  if (changed) {
    if (up) {
      services::LogEvent(services::LogLevel::kInfo, "draft_up");
    } else {
      services::LogEvent(services::LogLevel::kWarn, "draft_down",
                         {{"reason", why}, {"effect", "requests continue without drafts"}});
    }
  }
}

void RouterEngine::MaybeReconnectDraft() {
  if (draft_ == nullptr) return;
  absl::StatusOr<iv1::ServiceInfo> info = draft_->GetInfo();
  if (!info.ok()) {
    SetDraftUp(false, info.status().message());
    draft_retry_at_ = absl::Now() + options_.draft_retry;
    return;
  }
  if (info->vocab_fingerprint() != tokenizer_.Fingerprint()) {
    // A draft with another vocabulary can never propose usable tokens: never use it.
    services::LogEvent(services::LogLevel::kError, "draft_refused",
                       {{"reason", "its vocabulary differs from the target's"}});
    SetDraftUp(false, "vocabulary mismatch");
    draft_retry_at_ = absl::InfiniteFuture();
    return;
  }
  if (info->feature_conditioned() && info->embedding_dim() != target_info_.embedding_dim()) {
    // It drafts from the target's hidden states: another width can never be fed.
    services::LogEvent(services::LogLevel::kError, "draft_refused",
                       {{"reason", "it is feature-conditioned on another model width"},
                        {"draft_dim", info->embedding_dim()},
                        {"target_dim", target_info_.embedding_dim()}});
    SetDraftUp(false, "feature width mismatch");
    draft_retry_at_ = absl::InfiniteFuture();
    return;
  }
  remote_draft_->set_feature_dim(info->feature_conditioned() ? info->embedding_dim() : 0);
  spec::KPolicy* policy;
  {
    absl::MutexLock l(&mu_);
    policy = &loop_->drafters()[draft_slot_].policy;
    draft_blocks_ = info->kv_num_blocks();
    draft_kind_ = info->model() == target_info_.model() && info->num_layers() > 0 &&
                          info->num_layers() < info->model_layers()
                      ? DraftKind::kSelf
                      : DraftKind::kSeparate;
  }
  // The policy is the loop thread's (or, before it starts, Start's): no lock needed for it.
  if (options_.draft_cost.empty()) {
    // Without a calibrated draft the policy cannot price drafts: it then never drafts.
    spec::CostCurve draft = services::CostCurveFromProto(*info);
    policy->set_costs(draft.empty() ? spec::CostCurve() : policy->verify_cost(), draft);
  }
  remote_draft_->set_weight_bytes(info->weight_bytes());
  policy->set_pinned_draft_ratio(
      spec::NominalDraftRatio(info->weight_bytes(), target_info_.weight_bytes()));
  const spec::CostCurve& v = policy->verify_cost();
  const spec::CostCurve& d = policy->draft_cost();
  services::LogEvent(services::LogLevel::kInfo, "draft_priced",
                     {{"target_step_1_ms", v.Predict(1) * 1e3},
                      {"target_step_5_ms", v.Predict(5) * 1e3},
                      // Where a batch's extra verified rows are priced (k at concurrency 16).
                      {"target_step_16_ms", v.Predict(16) * 1e3},
                      {"target_step_32_ms", v.Predict(32) * 1e3},
                      // What 1k positions of context add to a step of 1 and of 5 rows.
                      {"target_context_1k_1_row_ms", v.depth().Seconds({1024, 1024}) * 1e3},
                      {"target_context_1k_5_rows_ms", v.depth().Seconds({1024, 5 * 1024}) * 1e3},
                      // What a prompt chunk's rows without logits save each.
                      {"target_logit_row_ms", v.logits().per_row * 1e3},
                      {"draft_round_ms", d.Predict(1) * 1e3},
                      {"pinned_draft_ratio", policy->options().pinned_draft_ratio},
                      {"adaptive", !d.empty()}});
  SetDraftUp(true, "");
}

ModelLimits RouterEngine::limits() const {
  ModelLimits l;
  l.vocab_size = target_info_.vocab_size();
  l.context_length = target_info_.context_length();
  l.max_new_tokens = options_.max_new_tokens_limit;
  l.draft_available = draft_available();
  return l;
}

bool RouterEngine::draft_available() const {
  absl::MutexLock l(&mu_);
  return draft_up_;
}

int64_t RouterEngine::running() const {
  absl::MutexLock l(&mu_);
  return loop_ == nullptr ? 0 : loop_->running().size();
}

int64_t RouterEngine::waiting() const {
  absl::MutexLock l(&mu_);
  return loop_ == nullptr ? 0 : loop_->waiting().size();
}

absl::StatusOr<int64_t> RouterEngine::Submit(ValidatedRequest request,
                                             std::shared_ptr<RequestSink> sink,
                                             absl::Time deadline) {
  // A request that cannot fit the target's KV cache even alone would wait forever.
  const int64_t need =
      target_info_.kv_block_size() <= 0
          ? 0
          : BlocksFor(static_cast<int64_t>(request.prompt.size()) + request.max_new_tokens + 1,
                      target_info_.kv_block_size());
  if (target_info_.kv_block_size() > 0 && need > target_info_.kv_num_blocks()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling.max_new_tokens: prompt (", request.prompt.size(), " tokens) + max_new_tokens (",
        request.max_new_tokens, ") exceed the target's KV capacity of ",
        int64_t{target_info_.kv_num_blocks()} * target_info_.kv_block_size(), " tokens"));
  }
  if (!request.seed_set) {
    static thread_local std::mt19937_64 gen{std::random_device{}()};
    request.params.seed = gen();
  }
  absl::MutexLock l(&mu_);
  if (draining_ || stop_ || loop_ == nullptr) {
    return absl::UnavailableError("the router is shutting down");
  }
  if (request.spec_mode == SpecMode::kSelf &&
      (draft_ == nullptr || draft_kind_ == DraftKind::kSeparate)) {
    // While the draft service is down its kind may be unknown: the request then runs
    // target-only until it is back, like DRAFT.
    return absl::FailedPreconditionError(
        "speculation.mode: SPECULATION_MODE_SELF needs a draft service running the target's "
        "first layers (specd-draft --model <target file> --layers N); this cluster's draft is " +
        std::string(draft_ == nullptr ? "not configured" : "a separate model") +
        " (use DRAFT, AUTO, NGRAM or OFF)");
  }
  if (!CanEnqueue(loop_->waiting().size(), options_.scheduler)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the queue is full (", options_.scheduler.max_queue, " requests waiting); retry later"));
  }
  auto r = std::make_shared<Request>(next_id_++, std::move(request));
  r->t_submit = absl::Now();
  r->deadline = deadline;
  r->text = std::make_unique<TextStream>(tokenizer_, r->req.stop);
  r->sink = std::move(sink);
  // Which drafter, and who decides k: a fixed k, or the drafter's policy.
  r->drafter = r->req.spec_mode == SpecMode::kOff     ? -1
               : r->req.spec_mode == SpecMode::kNgram ? ngram_slot_
                                                      : draft_slot_;
  // AUTO: the n-gram lookup first (free; text that repeats its context), the draft service for
  // the rest, and the lookup alone when there is no draft service.
  if (r->req.spec_mode == SpecMode::kAuto) r->lookup = ngram_slot_;
  r->fixed_k = r->req.fixed_k > 0 || options_.default_k > 0;
  // A seed the client chose must reproduce the text; one the router picked need not.
  r->seeded = r->req.seed_set;
  r->max_k = r->req.fixed_k > 0     ? r->req.fixed_k
             : options_.default_k > 0 ? options_.default_k
                                      : options_.max_k;
  by_id_[r->id] = r;
  loop_->Enqueue(r);
  metrics_->router_waiting.Set(loop_->waiting().size());
  return r->id;
}

void RouterEngine::Cancel(int64_t id) {
  absl::MutexLock l(&mu_);
  auto it = by_id_.find(id);
  if (it != by_id_.end()) it->second->cancelled = true;
}

void RouterEngine::BeginDrain() {
  absl::MutexLock l(&mu_);
  draining_ = true;
}

bool RouterEngine::draining() const {
  absl::MutexLock l(&mu_);
  return draining_ || stop_;
}

bool RouterEngine::WaitIdle(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return loop_ == nullptr || (loop_->waiting().empty() && loop_->running().empty());
  };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

void RouterEngine::Stop() {
  {
    absl::MutexLock l(&mu_);
    if (stop_ && !loop_thread_.joinable()) return;
    stop_ = true;
  }
  if (loop_thread_.joinable()) loop_thread_.join();
  FailAll(absl::UnavailableError("the router stopped"));
}

void RouterEngine::FailAll(const absl::Status& status) {
  std::vector<RequestPtr> all;
  std::vector<int64_t> ids;
  {
    absl::MutexLock l(&mu_);
    if (loop_ == nullptr) return;
    for (const spec::LoopSeqPtr& s : loop_->running()) {
      all.push_back(std::static_pointer_cast<Request>(s));
    }
    for (const spec::LoopSeqPtr& s : loop_->waiting()) {
      all.push_back(std::static_pointer_cast<Request>(s));
    }
    for (auto& r : all) {
      if (Remove(r)) ids.push_back(r->id);
    }
  }
  for (auto& r : all) Finish(r, status);
  loop_->Release(ids);
}

bool RouterEngine::Remove(const RequestPtr& r) {
  by_id_.erase(r->id);
  return loop_->Remove(*r);
}

void RouterEngine::SendUnsentChunks() {
  std::vector<UnsentChunk> chunks;
  chunks.swap(unsent_);
  for (UnsentChunk& c : chunks) c.sink->OnChunk(std::move(c.chunk));
}

void RouterEngine::Finish(const RequestPtr& r, absl::Status status) {
  SendUnsentChunks();  // a request's last chunks go before its end
  if (r->done) return;
  r->done = true;
  const absl::Time now = absl::Now();
  specd::v1::Completion c;
  c.set_finish_reason(r->reason);
  c.set_stop(r->text->matched_stop());
  c.mutable_usage()->set_prompt_tokens(r->num_prompt);
  const int32_t generated = r->generated();
  c.mutable_usage()->set_completion_tokens(generated);
  c.mutable_usage()->set_cached_prompt_tokens(r->cached_prompt_tokens);
  specd::v1::Timings* t = c.mutable_timings();
  if (r->t_scheduled != absl::InfiniteFuture()) {
    t->set_queue_ms(absl::ToDoubleMilliseconds(r->t_scheduled - r->t_submit));
  }
  if (r->t_first != absl::InfiniteFuture()) {
    t->set_ttft_ms(absl::ToDoubleMilliseconds(r->t_first - r->t_submit));
    if (generated > 1) {
      t->set_mean_itl_ms(absl::ToDoubleMilliseconds(r->t_last - r->t_first) / (generated - 1));
    }
  }
  t->set_total_ms(absl::ToDoubleMilliseconds(now - r->t_submit));
  specd::v1::SpeculationStats* sp = c.mutable_speculation();
  sp->set_target_steps(r->steps);
  sp->set_draft_tokens(r->drafted);
  sp->set_accepted_tokens(r->accepted);
  if (r->steps > 0) {
    // The end-of-generation token came out of a target step like any other; it is just not
    // returned. Counting it keeps a plain decode at exactly 1 token per step.
    const int32_t produced = generated + (r->reason == specd::v1::FINISH_REASON_EOS ? 1 : 0);
    sp->set_mean_accepted_length(static_cast<double>(produced) / r->steps);
  }
  c.set_seed(r->req.params.seed);
  c.set_request_id(r->req.request_id);
  metrics_->router_requests.Add({{"code", CodeName(status.code())}}).Increment();
  metrics_->router_request_latency.Observe(Seconds(now - r->t_submit));
  if (!status.ok()) {
    services::LogEvent(status.code() == absl::StatusCode::kCancelled ? services::LogLevel::kInfo
                                                                      : services::LogLevel::kWarn,
                       "request_failed",
                       {{"request_id", r->req.request_id},
                        {"seq", r->id},
                        {"code", CodeName(status.code())},
                        {"reason", status.message()},
                        {"generated", generated}});
  }
  r->sink->OnDone(std::move(status), std::move(c));
}

void RouterEngine::LogRequestEvent(services::LogLevel level, absl::string_view event,
                                   const Request& r, absl::string_view reason) {
  services::LogEvent(level, event,
                     {{"request_id", r.req.request_id},
                      {"seq", r.id},
                      {"reason", reason},
                      {"tokens", static_cast<int64_t>(r.tokens.size())}});
}

spec::SchedulerConfig RouterEngine::SchedulerFor(bool draft_up) const {
  spec::SchedulerConfig config = options_.scheduler;
  config.block_size = target_info_.kv_block_size();
  config.target_blocks = target_info_.kv_num_blocks();
  config.draft_blocks = draft_up ? draft_blocks_ : 0;
  config.drafts_with_prompt = false;
  return config;
}

void RouterEngine::Loop() {
  for (;;) {
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !loop_->waiting().empty() || !loop_->running().empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
    }
    Iterate();
  }
}

void RouterEngine::Iterate() {
  Iteration it;
  it.now = absl::Now();
  if (draft_ != nullptr && it.now >= draft_retry_at_ && !draft_available()) {
    SendUnsentChunks();  // the reconnect's GetInfo may wait out its deadline
    MaybeReconnectDraft();
  }
  LookupPrefixes(it);
  {
    absl::MutexLock l(&mu_);
    ExpireLocked(it);
    ScheduleLocked(it);
  }
  // Release first: once a client hears "cancelled", the KV is already free everywhere.
  // Its calls block: nothing held waits behind them.
  if (!it.step.release.empty()) SendUnsentChunks();
  loop_->Release(it.step.release);
  it.step.release.clear();
  for (const RequestPtr& r : it.ended) {
    Finish(r, r->expired ? absl::DeadlineExceededError("the request's deadline passed")
                         : absl::CancelledError("cancelled by the client"));
  }
  if (it.step.sched.plans.empty()) {
    SendUnsentChunks();
    absl::SleepFor(options_.retry_backoff);
    return;
  }
  RunDraftStep(it);
  const absl::Status st = loop_->Target(it.step);
  SendUnsentChunks();  // sent while the step ran, unless no step went out
  if (!st.ok()) {
    HandleTargetError(it, st);
    return;
  }
  if (target_down_since_ != absl::InfiniteFuture()) {
    services::LogEvent(services::LogLevel::kInfo, "target_recovered",
                       {{"down_ms", absl::ToDoubleMilliseconds(absl::Now() - target_down_since_)}});
  }
  target_down_since_ = absl::InfiniteFuture();
  ApplyResults(it);
}

void RouterEngine::LookupPrefixes(Iteration& it) {
  {
    absl::MutexLock l(&mu_);
    loop_->PlanLookups(SchedulerFor(draft_up_), it.step);
  }
  if (it.step.lookups.empty()) return;
  // Unlocked: the call. A failure leaves them to a full prefill (and the target step that
  // follows reports the target's state).
  if (absl::Status st = loop_->Lookup(it.step); !st.ok()) {
    services::LogEvent(services::LogLevel::kWarn, "prefix_lookup_failed",
                       {{"code", absl::StatusCodeToString(st.code())}, {"error", st.message()}});
  }
}

void RouterEngine::ExpireLocked(Iteration& it) {
  std::vector<RequestPtr> all;
  for (const spec::LoopSeqPtr& s : loop_->running()) {
    all.push_back(std::static_pointer_cast<Request>(s));
  }
  for (const spec::LoopSeqPtr& s : loop_->waiting()) {
    all.push_back(std::static_pointer_cast<Request>(s));
  }
  for (const RequestPtr& r : all) {
    r->expired = it.now > r->deadline;
    if (r->cancelled || r->expired) {
      if (Remove(r)) it.step.release.push_back(r->id);
      it.ended.push_back(r);
    }
  }
}

void RouterEngine::ScheduleLocked(Iteration& it) {
  const int64_t preempted_before = loop_->stats().preemptions;
  loop_->Schedule(SchedulerFor(draft_up_), it.step);
  for (int64_t id : it.step.sched.preempt) {
    auto r = by_id_.find(id);
    if (r != by_id_.end()) {
      LogRequestEvent(services::LogLevel::kInfo, "preempt", *r->second, "kv_pressure");
    }
  }
  metrics_->router_preemptions.Increment(
      static_cast<double>(loop_->stats().preemptions - preempted_before));
  for (int64_t id : it.step.sched.admit) {
    Request& r = *by_id_[id];
    if (r.t_scheduled == absl::InfiniteFuture()) {
      r.t_scheduled = it.now;
      metrics_->router_queue_time.Observe(Seconds(it.now - r.t_submit));
      metrics_->router_prompt_tokens.Increment(r.num_prompt);
    }
  }
  metrics_->router_running.Set(loop_->running().size());
  metrics_->router_waiting.Set(loop_->waiting().size());
}

void RouterEngine::RunDraftStep(Iteration& it) {
  // Never fails (draft_errors_fail_step is off): a failing service leaves its drafts out.
  (void)loop_->Draft(it.step);
  if (it.step.draft_error.ok() || it.step.draft_index != draft_slot_) return;
  SetDraftUp(false, it.step.draft_error.message());
  draft_retry_at_ = absl::Now() + options_.draft_retry;
}

void RouterEngine::HandleTargetError(Iteration& it, const absl::Status& status) {
  const absl::StatusCode code = status.code();
  const absl::Time t1 = absl::Now();
  if (code == absl::StatusCode::kResourceExhausted) {
    // Our KV estimate was off (e.g. the service holds stale sequences): preempt the youngest.
    std::vector<int64_t> ids;
    {
      absl::MutexLock l(&mu_);
      if (loop_->running().size() > 1) {
        const auto& victim = static_cast<const Request&>(*loop_->running().back());
        LogRequestEvent(services::LogLevel::kWarn, "preempt", victim, "target_kv_full");
        loop_->Preempt(loop_->running().back(), ids);
        metrics_->router_preemptions.Increment();
      }
    }
    loop_->Release(ids);
    absl::SleepFor(options_.retry_backoff);
    return;
  }
  if (code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kInternal) {
    // A router bug, not the client's: fail what was in the step, keep serving the rest.
    std::vector<int64_t> ids;
    for (const spec::LoopSeqPtr& s : it.step.seqs) {
      RequestPtr r = std::static_pointer_cast<Request>(s);
      {
        absl::MutexLock l(&mu_);
        if (Remove(r)) ids.push_back(r->id);
      }
      Finish(r, absl::InternalError(absl::StrCat("target step: ", status.message())));
    }
    loop_->Release(ids);
    return;
  }
  // Unavailable / deadline: the target is (re)starting. Keep the requests; re-prefill when
  // it is back (it answers needs_prefill for sequences it lost).
  if (target_down_since_ == absl::InfiniteFuture()) {
    target_down_since_ = t1;
    services::LogEvent(services::LogLevel::kWarn, "target_unreachable",
                       {{"code", absl::StatusCodeToString(code)},
                        {"error", status.message()},
                        {"effect", "requests wait for it and re-prefill when it is back"}});
  }
  if (t1 - target_down_since_ > options_.target_down_timeout) {
    target_down_since_ = absl::InfiniteFuture();
    services::LogEvent(services::LogLevel::kError, "target_down_timeout",
                       {{"timeout_s", absl::ToDoubleSeconds(options_.target_down_timeout)},
                        {"effect", "failing every request UNAVAILABLE"}});
    FailAll(absl::UnavailableError(
        absl::StrCat("the target service is unavailable: ", status.message())));
    return;
  }
  absl::SleepFor(options_.retry_backoff);
}

// What the scheduler's step bound and adaptive k priced the step at, against what it took.
void RouterEngine::ObserveStepCost(const spec::LoopStep& step) {
  if (step.target_predicted_seconds > 0) {
    metrics_->router_target_cost_ratio.Observe(step.target_seconds / step.target_predicted_seconds);
  }
  if (step.draft_predicted_seconds > 0) {
    metrics_->router_draft_cost_ratio.Observe(step.draft_priced_seconds /
                                              step.draft_predicted_seconds);
  }
  if (step.decode_rows > 0 && step.prefill_tokens > 0) {
    metrics_->router_mixed_step_seconds.Observe(step.target_seconds);
  }
}

void RouterEngine::ApplyResults(Iteration& it) {
  for (size_t p = 0; p < it.step.outcomes.size() && p < it.step.seqs.size(); ++p) {
    if (!it.step.outcomes[p].needs_prefill) continue;
    LogRequestEvent(services::LogLevel::kInfo, "re_prefill",
                    static_cast<const Request&>(*it.step.seqs[p]), "the target lost the sequence");
  }
  metrics_->router_batch_size.Observe(it.step.sched.plans.size());
  metrics_->router_step_tokens.Observe(static_cast<double>(it.step.step_tokens));
  ObserveStepCost(it.step);
  const int64_t emitting = std::count_if(it.step.sched.plans.begin(), it.step.sched.plans.end(),
                                         [](const spec::SeqPlan& p) { return p.emit; });
  Client client(this, services::StepBatchLabel(emitting));
  loop_->Apply(it.step, client);
  if (it.step.finished.empty()) return;
  SendUnsentChunks();  // a finished request's last chunks are out before it leaves the queues
  {
    absl::MutexLock l(&mu_);
    for (const spec::LoopSeqPtr& s : it.step.finished) by_id_.erase(s->id);
    loop_->Retire(it.step);
    metrics_->router_running.Set(loop_->running().size());
  }
  loop_->Release(it.step.release);
  for (size_t i = 0; i < it.step.finished.size(); ++i) {
    Finish(std::static_pointer_cast<Request>(it.step.finished[i]), it.step.finish_status[i]);
  }
}

spec::Emission RouterEngine::EmitTokens(Request& r, const sampling::VerifyResult& v,
                                        int32_t drafted, const char* batch) {
  const absl::Time now = absl::Now();
  specd::v1::GenerateStreamResponse chunk;
  bool finished = false;
  int32_t emitted = 0;
  const auto& stop_ids = r.req.params.stop_token_ids;
  for (size_t j = 0; j < v.tokens.size(); ++j) {
    const int32_t tok = v.tokens[j];
    if (!r.req.params.ignore_eos && tokenizer_.IsEndOfGeneration(tok)) {
      r.reason = specd::v1::FINISH_REASON_EOS;
      finished = true;
      break;
    }
    ++emitted;
    chunk.add_token_ids(tok);
    if (r.req.params.num_logprobs > 0) {
      specd::v1::TokenLogprobs* lp = chunk.add_logprobs();
      lp->set_token_id(tok);
      lp->set_logprob(v.logprobs[j]);
      if (j < v.top_logprobs.size()) {
        for (const sampling::TokenLogprob& t : v.top_logprobs[j]) {
          specd::v1::TokenLogprob* e = lp->add_top();
          e->set_token_id(t.token);
          e->set_logprob(t.logprob);
        }
      }
    }
    chunk.mutable_text()->append(r.text->Append(tok));
    const int32_t generated = r.generated() + emitted;
    if (r.text->stopped()) {
      r.reason = specd::v1::FINISH_REASON_STOP_STRING;
      finished = true;
    } else if (std::find(stop_ids.begin(), stop_ids.end(), tok) != stop_ids.end()) {
      r.reason = specd::v1::FINISH_REASON_STOP_TOKEN;
      finished = true;
    } else if (generated >= r.req.max_new_tokens ||
               r.n() + emitted >= target_info_.context_length()) {
      r.reason = specd::v1::FINISH_REASON_LENGTH;
      finished = true;
    }
    if (finished) break;
  }
  if (finished) chunk.mutable_text()->append(r.text->Finish());
  // Statistics.
  if (drafted > 0) {
    int32_t accepted = 0;
    for (int i = 0; i < drafted; ++i) {
      const std::string pos = std::to_string(i + 1);
      // Model drafts and n-gram drafts are different drafters: their acceptance apart (an
      // AUTO request's step was drafted by one or the other).
      const char* mode = r.step_drafter == ngram_slot_ ? "ngram" : "draft";
      metrics_->router_draft_proposed.Add({{"position", pos}, {"mode", mode}}).Increment();
      if (i < static_cast<int>(v.accepted.size()) && v.accepted[i]) {
        metrics_->router_draft_accepted.Add({{"position", pos}, {"mode", mode}}).Increment();
        ++accepted;
      }
    }
    metrics_->router_batch_draft_proposed.Add({{"batch", batch}}).Increment(drafted);
    metrics_->router_batch_draft_accepted.Add({{"batch", batch}}).Increment(accepted);
    metrics_->router_accepted_length.Observe(static_cast<double>(v.tokens.size()));
  }
  if (emitted > 0) {
    metrics_->router_generated_tokens.Increment(emitted);
    if (r.t_first == absl::InfiniteFuture()) {
      r.t_first = now;
      metrics_->router_ttft.Observe(Seconds(now - r.t_submit));
      for (int i = 1; i < emitted; ++i) metrics_->router_itl.Observe(0);
    } else {
      const double per = Seconds(now - r.t_last) / emitted;
      for (int i = 0; i < emitted; ++i) metrics_->router_itl.Observe(per);
    }
    r.t_last = now;
  }
  if (emitted > 0 || !chunk.text().empty()) {
    if (options_.overlap_client_writes) {
      unsent_.push_back(UnsentChunk{r.sink, std::move(chunk)});
    } else {
      r.sink->OnChunk(std::move(chunk));
    }
  }
  return spec::Emission{emitted, finished};
}

}  // namespace specd::router
