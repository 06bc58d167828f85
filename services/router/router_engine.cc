#include "services/router/router_engine.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/sampling/sampling_params.h"
#include "common/util/check.h"
#include "services/common/proto_convert.h"

namespace specd::router {

struct RouterEngine::Request {
  int64_t id = 0;
  ValidatedRequest req;
  std::shared_ptr<RequestSink> sink;
  absl::Time deadline, t_submit, t_scheduled = absl::InfiniteFuture(),
                       t_first = absl::InfiniteFuture(), t_last;
  std::vector<int32_t> tokens;  // committed: prompt + generated
  int32_t n_prompt = 0;
  int32_t target_pos = 0;       // committed tokens the target holds
  int32_t draft_pos = 0;        // committed tokens the draft surely holds
  bool cancelled = false;       // guarded by mu_
  bool on_services = false;     // may hold KV on the services (loop thread)
  spec::SpecSeqState spec;      // what the adaptive-k policy knows of it (loop thread)
  std::unique_ptr<TextStream> text;
  specd::v1::FinishReason reason = specd::v1::FINISH_REASON_UNSPECIFIED;
  int32_t target_steps = 0, drafted = 0, accepted = 0;
  bool done = false;
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
      ngram_(MakeNgram()) {}

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
  ko.verify_cost = options_.verify_cost.empty() ? services::CostCurveFromProto(*info) : options_.verify_cost;
  ko.pinned_draft_ratio = 0.0;  // n-gram drafts are free
  ngram_policy_ = spec::KPolicy(ko);
  ko.pinned_draft_ratio = 0.5;  // until the draft reports its size
  ko.draft_cost = options_.draft_cost;
  draft_policy_ = spec::KPolicy(ko);
  MaybeReconnectDraft();
  loop_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void RouterEngine::MaybeReconnectDraft() {
  if (draft_ == nullptr) return;
  absl::StatusOr<iv1::ServiceInfo> info = draft_->GetInfo();
  absl::MutexLock l(&mu_);
  if (!info.ok()) {
    draft_up_ = false;
    draft_retry_at_ = absl::Now() + options_.draft_retry;
  } else if (info->vocab_fingerprint() != tokenizer_.Fingerprint()) {
    // A draft with another vocabulary can never propose usable tokens: never use it.
    std::fprintf(stderr, "specd-router: draft vocabulary differs from the target's; ignoring it\n");
    draft_up_ = false;
    draft_retry_at_ = absl::InfiniteFuture();
  } else {
    draft_up_ = true;
    if (options_.draft_cost.empty()) {
      // Without a calibrated draft the policy cannot price drafts: it then never drafts.
      spec::CostCurve draft = services::CostCurveFromProto(*info);
      draft_policy_.set_costs(draft.empty() ? spec::CostCurve() : draft_policy_.verify_cost(),
                              draft);
    }
    draft_policy_.set_pinned_draft_ratio(
        spec::NominalDraftRatio(info->weight_bytes(), target_info_.weight_bytes()));
    const spec::CostCurve& v = draft_policy_.verify_cost();
    const spec::CostCurve& d = draft_policy_.draft_cost();
    std::fprintf(stderr,
                 "specd-router: adaptive k prices a target step at %.2f ms (1 token) / %.2f ms "
                 "(5 tokens) and a draft round at %.2f ms (1 sequence)%s\n",
                 v.Predict(1) * 1e3, v.Predict(5) * 1e3, d.Predict(1) * 1e3,
                 d.empty() ? ": the draft reported no cost, so it drafts only for a fixed k" : "");
    draft_blocks_ = info->kv_num_blocks();
    draft_context_ = info->context_length();
    draft_kind_ = info->model() == target_info_.model() && info->num_layers() > 0 &&
                          info->num_layers() < info->model_layers()
                      ? DraftKind::kSelf
                      : DraftKind::kSeparate;
  }
  metrics_->router_draft_available.Set(draft_up_ ? 1 : 0);
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
  return running_.size();
}

int64_t RouterEngine::waiting() const {
  absl::MutexLock l(&mu_);
  return waiting_.size();
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
  auto r = std::make_shared<Request>();
  r->t_submit = absl::Now();
  r->deadline = deadline;
  if (!request.seed_set) {
    static thread_local std::mt19937_64 gen{std::random_device{}()};
    request.params.seed = gen();
  }
  r->n_prompt = static_cast<int32_t>(request.prompt.size());
  r->tokens = request.prompt;
  r->text = std::make_unique<TextStream>(tokenizer_, request.stop);
  r->req = std::move(request);
  r->sink = std::move(sink);
  absl::MutexLock l(&mu_);
  if (draining_ || stop_) return absl::UnavailableError("the router is shutting down");
  if (r->req.spec_mode == SpecMode::kSelf &&
      (draft_ == nullptr || draft_kind_ == DraftKind::kSeparate)) {
    // While the draft service is down its kind may be unknown: the request then runs
    // target-only until it is back, like DRAFT.
    return absl::FailedPreconditionError(
        "speculation.mode: SPECULATION_MODE_SELF needs a draft service running the target's "
        "first layers (specd-draft --model <target file> --layers N); this cluster's draft is " +
        std::string(draft_ == nullptr ? "not configured" : "a separate model") +
        " (use DRAFT, AUTO, NGRAM or OFF)");
  }
  if (!CanEnqueue(waiting_.size(), options_.scheduler)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the queue is full (", options_.scheduler.max_queue, " requests waiting); retry later"));
  }
  r->id = next_id_++;
  waiting_.push_back(r);
  by_id_[r->id] = r;
  metrics_->router_waiting.Set(waiting_.size());
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

bool RouterEngine::WaitIdle(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return waiting_.empty() && running_.empty();
  };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

void RouterEngine::Stop() {
  {
    absl::MutexLock l(&mu_);
    if (stop_ && !loop_.joinable()) return;
    stop_ = true;
  }
  if (loop_.joinable()) loop_.join();
  FailAll(absl::UnavailableError("the router stopped"));
}

void RouterEngine::FailAll(const absl::Status& status) {
  std::vector<RequestPtr> all;
  std::vector<int64_t> ids;
  {
    absl::MutexLock l(&mu_);
    for (auto& r : running_) all.push_back(r);
    for (auto& r : waiting_) all.push_back(r);
    for (auto& r : all) {
      if (Remove(r)) ids.push_back(r->id);
    }
  }
  for (auto& r : all) Finish(r, status);
  if (!ids.empty()) ReleaseOnServices(ids);
}

bool RouterEngine::Remove(const RequestPtr& r) {
  auto rit = std::find(running_.begin(), running_.end(), r);
  if (rit != running_.end()) running_.erase(rit);
  auto wit = std::find(waiting_.begin(), waiting_.end(), r);
  if (wit != waiting_.end()) waiting_.erase(wit);
  by_id_.erase(r->id);
  const bool held = r->on_services;
  r->on_services = false;
  return held;
}

void RouterEngine::ReleaseOnServices(const std::vector<int64_t>& ids) {
  const absl::Time t0 = absl::Now();
  if (absl::Status s = target_->Release(ids); !s.ok()) {
    metrics_->router_rpc_errors.Add({{"hop", "target"}, {"code", CodeName(s.code())}}).Increment();
  }
  metrics_->router_rpc_latency.Add({{"hop", "target_release"}}, services::LatencyBuckets())
      .Observe(Seconds(absl::Now() - t0));
  if (draft_ != nullptr && draft_available()) {
    if (absl::Status s = draft_->Release(ids); !s.ok()) {
      metrics_->router_rpc_errors.Add({{"hop", "draft"}, {"code", CodeName(s.code())}}).Increment();
    }
  }
}

void RouterEngine::Finish(const RequestPtr& r, absl::Status status) {
  if (r->done) return;
  r->done = true;
  const absl::Time now = absl::Now();
  specd::v1::Completion c;
  c.set_finish_reason(r->reason);
  c.set_stop(r->text->matched_stop());
  c.mutable_usage()->set_prompt_tokens(r->n_prompt);
  const int32_t generated = static_cast<int32_t>(r->tokens.size()) - r->n_prompt;
  c.mutable_usage()->set_completion_tokens(generated);
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
  sp->set_target_steps(r->target_steps);
  sp->set_draft_tokens(r->drafted);
  sp->set_accepted_tokens(r->accepted);
  if (r->target_steps > 0) {
    sp->set_mean_accepted_length(static_cast<double>(generated) / r->target_steps);
  }
  c.set_seed(r->req.params.seed);
  c.set_request_id(r->req.request_id);
  metrics_->router_requests.Add({{"code", CodeName(status.code())}}).Increment();
  metrics_->router_request_latency.Observe(Seconds(now - r->t_submit));
  r->sink->OnDone(std::move(status), std::move(c));
}

spec::KPolicy& RouterEngine::PolicyFor(const Request& r) {
  return r.req.spec_mode == SpecMode::kNgram ? ngram_policy_ : draft_policy_;
}

// The most drafts a request may get this step: its fixed k or the policy's bound, never past
// the last token it may emit or the context.
int32_t RouterEngine::KCap(const Request& r) const {
  const int32_t n = static_cast<int32_t>(r.tokens.size());
  int32_t k = r.req.fixed_k > 0 ? r.req.fixed_k
              : options_.default_k > 0 ? options_.default_k
                                       : options_.max_k;
  k = std::min(k, r.req.max_new_tokens - (n - r.n_prompt) - 1);
  k = std::min<int32_t>(k, target_info_.context_length() - n - 1);
  return std::max(k, 0);
}

void RouterEngine::Loop() {
  for (;;) {
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !waiting_.empty() || !running_.empty();
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
  if (draft_ != nullptr && it.now >= draft_retry_at_ && !draft_available()) MaybeReconnectDraft();
  {
    absl::MutexLock l(&mu_);
    ExpireLocked(it);
    ScheduleLocked(it);
  }
  // Release first: once a client hears "cancelled", the KV is already free everywhere.
  if (!it.release.empty()) ReleaseOnServices(it.release);
  for (const RequestPtr& r : it.ended) {
    Finish(r, r->cancelled ? absl::CancelledError("cancelled by the client")
                           : absl::DeadlineExceededError("the request's deadline passed"));
  }
  if (it.sched.plans.empty()) {
    absl::SleepFor(options_.retry_backoff);
    return;
  }
  RunDraftStep(it);
  const iv1::TargetStepRequest request = BuildTargetStep(it);
  const absl::Time t0 = absl::Now();
  absl::StatusOr<iv1::TargetStepResponse> response = target_->Step(request);
  const absl::Time t1 = absl::Now();
  metrics_->router_rpc_latency.Add({{"hop", "target"}}, services::LatencyBuckets())
      .Observe(Seconds(t1 - t0));
  if (!response.ok()) {
    HandleTargetError(it, response.status(), t1);
    return;
  }
  target_down_since_ = absl::InfiniteFuture();
  draft_policy_.ObserveVerify(it.step_tokens, Seconds(t1 - t0));
  ngram_policy_.ObserveVerify(it.step_tokens, Seconds(t1 - t0));
  ApplyResults(it, *response);
}

void RouterEngine::ExpireLocked(Iteration& it) {
  std::vector<RequestPtr> all(running_.begin(), running_.end());
  all.insert(all.end(), waiting_.begin(), waiting_.end());
  for (const RequestPtr& r : all) {
    if (r->cancelled || it.now > r->deadline) {
      if (Remove(r)) it.release.push_back(r->id);
      it.ended.push_back(r);
    }
  }
}

std::vector<int32_t> RouterEngine::DecideKLocked(bool draft_up) {
  // Which running requests decode this step, and who decides their k: a fixed k, or one of
  // the two policies (model drafts, n-gram drafts) for the adaptive ones.
  std::vector<int32_t> k(running_.size(), 0);
  std::vector<spec::KRequest> by_policy[2];  // [0] draft model, [1] n-gram
  std::vector<size_t> index[2];
  int64_t pending = 0, rows = 0, fixed_drafts = 0;
  for (size_t i = 0; i < running_.size(); ++i) {
    Request& r = *running_[i];
    const int64_t uncomputed = static_cast<int64_t>(r.tokens.size()) - r.target_pos;
    if (uncomputed != 1) {
      pending += uncomputed;
      continue;
    }
    ++rows;
    const bool ngram = r.req.spec_mode == SpecMode::kNgram;
    if (r.req.spec_mode == SpecMode::kOff || (!draft_up && !ngram)) continue;
    if (r.req.fixed_k > 0 || options_.default_k > 0) {
      k[i] = KCap(r);
      fixed_drafts += k[i];
      continue;
    }
    // A sampled request's k follows its own history only, never the batch (scheduler.h,
    // "Pinned k"), so its seed reproduces its text in any batch.
    const int32_t behind = ngram ? 0 : static_cast<int32_t>(r.tokens.size()) - r.draft_pos;
    by_policy[ngram].push_back({&r.spec, KCap(r), !sampling::IsGreedy(r.req.params), behind});
    index[ngram].push_back(i);
  }
  // Tokens riding along with each group's rows: prompt chunks (what the budget leaves) and the
  // other decode rows with their drafts.
  const int64_t prefill =
      std::min<int64_t>(pending, std::max<int64_t>(0, options_.scheduler.max_batch_tokens - rows));
  int64_t other_drafts = fixed_drafts;
  for (int g = 0; g < 2; ++g) {
    if (by_policy[g].empty()) continue;
    spec::KPolicy& policy = g == 1 ? ngram_policy_ : draft_policy_;
    const int64_t fixed = prefill + rows - static_cast<int64_t>(by_policy[g].size()) + other_drafts;
    const std::vector<int32_t> chosen =
        policy.Choose(by_policy[g], static_cast<int32_t>(std::min<int64_t>(fixed, INT32_MAX)));
    for (size_t j = 0; j < chosen.size(); ++j) {
      k[index[g][j]] = chosen[j];
      other_drafts += chosen[j];
    }
  }
  return k;
}

void RouterEngine::PreemptLocked(const RequestPtr& r, std::vector<int64_t>* release) {
  running_.erase(std::find(running_.begin(), running_.end(), r));
  waiting_.push_front(r);
  if (r->on_services) release->push_back(r->id);
  r->on_services = false;
  r->target_pos = 0;
  r->draft_pos = 0;
  metrics_->router_preemptions.Increment();
}

void RouterEngine::ScheduleLocked(Iteration& it) {
  it.draft_up = draft_up_;
  const std::vector<int32_t> want_k = DecideKLocked(it.draft_up);
  SchedulerState st;
  for (size_t i = 0; i < running_.size(); ++i) {
    const Request& r = *running_[i];
    st.running.push_back({r.id, static_cast<int32_t>(r.tokens.size()), r.target_pos, want_k[i],
                          r.req.spec_mode == SpecMode::kNgram, !sampling::IsGreedy(r.req.params),
                          static_cast<int32_t>(r.tokens.size()) > r.n_prompt});
  }
  for (const RequestPtr& r : waiting_) {
    st.waiting.push_back({r->id, static_cast<int32_t>(r->tokens.size()), 0, 0, false,
                          !sampling::IsGreedy(r->req.params),
                          static_cast<int32_t>(r->tokens.size()) > r->n_prompt});
  }
  SchedulerConfig config = options_.scheduler;
  config.block_size = target_info_.kv_block_size();
  config.target_blocks = target_info_.kv_num_blocks();
  config.draft_blocks = it.draft_up ? draft_blocks_ : 0;
  it.sched = ScheduleIteration(st, config);
  for (int64_t id : it.sched.preempt) PreemptLocked(by_id_[id], &it.release);
  for (int64_t id : it.sched.admit) {
    RequestPtr r = waiting_.front();
    SPECD_CHECK(r->id == id, "scheduler admitted out of order");
    waiting_.pop_front();
    running_.push_back(r);
    if (r->t_scheduled == absl::InfiniteFuture()) {
      r->t_scheduled = it.now;
      metrics_->router_queue_time.Observe(Seconds(it.now - r->t_submit));
      metrics_->router_prompt_tokens.Increment(r->n_prompt);
    }
  }
  for (const SeqPlan& p : it.sched.plans) it.req_of[p.id] = by_id_[p.id];
  metrics_->router_running.Set(running_.size());
  metrics_->router_waiting.Set(waiting_.size());
}

void RouterEngine::RunDraftStep(Iteration& it) {
  iv1::DraftStepRequest dreq;
  std::vector<spec::KRequest> drafting;  // for the policy's cost observation
  std::vector<int32_t> ks;
  for (const SeqPlan& p : it.sched.plans) {
    if (!p.emit || p.k == 0) continue;
    Request& r = *it.req_of[p.id];
    if (r.req.spec_mode == SpecMode::kNgram) continue;  // drafted by the router itself
    iv1::DraftSequenceStep* d = dreq.add_sequences();
    d->set_seq_id(p.id);
    d->set_start_pos(r.draft_pos);
    d->mutable_tokens()->Assign(r.tokens.begin() + r.draft_pos, r.tokens.end());
    d->set_num_draft_tokens(p.k);
    d->set_num_prompt_tokens(r.n_prompt);
    services::ToProto(r.req.params, d->mutable_sampling());
    metrics_->router_chosen_k.Observe(p.k);
    drafting.push_back({&r.spec, p.k, false});
    ks.push_back(p.k);
  }
  if (dreq.sequences_size() == 0) return;
  const absl::Time t0 = absl::Now();
  absl::StatusOr<iv1::DraftStepResponse> resp = draft_->Step(dreq);
  const double secs = Seconds(absl::Now() - t0);
  metrics_->router_rpc_latency.Add({{"hop", "draft"}}, services::LatencyBuckets()).Observe(secs);
  if (!resp.ok()) {
    metrics_->router_rpc_errors.Add({{"hop", "draft"}, {"code", CodeName(resp.status().code())}})
        .Increment();
    {
      absl::MutexLock l(&mu_);
      draft_up_ = false;
    }
    draft_retry_at_ = absl::Now() + options_.draft_retry;
    metrics_->router_draft_available.Set(0);
    return;
  }
  it.draft_response = std::move(*resp);
  for (const iv1::DraftSequenceResult& d : it.draft_response.sequences()) it.drafts[d.seq_id()] = &d;
  metrics_->router_kv_blocks.Add({{"service", "draft"}, {"state", "used"}})
      .Set(it.draft_response.kv().used_blocks());
  // What a draft round costs, seen from here (the hop included).
  draft_policy_.ObserveDraft(drafting, ks, secs);
}

iv1::TargetStepRequest RouterEngine::BuildTargetStep(Iteration& it) {
  iv1::TargetStepRequest treq;
  it.step_tokens = 0;
  for (SeqPlan& p : it.sched.plans) {
    Request& r = *it.req_of[p.id];
    iv1::TargetSequenceStep* t = treq.add_sequences();
    t->set_seq_id(p.id);
    t->set_start_pos(p.start);
    t->mutable_tokens()->Assign(r.tokens.begin() + p.start, r.tokens.begin() + p.end);
    t->set_emit(p.emit);
    t->set_num_prompt_tokens(r.n_prompt);
    services::ToProto(r.req.params, t->mutable_sampling());
    auto d = it.drafts.find(p.id);
    if (p.k > 0 && r.req.spec_mode == SpecMode::kNgram) {
      for (int32_t tok : ngram_->Lookup(r.tokens, p.k)) {
        iv1::Proposal* q = t->add_proposals();  // a point mass: the lookup is deterministic
        q->set_token(tok);
        q->add_ids(tok);
        q->add_probs(1.0f);
      }
    } else if (p.k > 0 && d != it.drafts.end() && !d->second->needs_prefill()) {
      *t->mutable_proposals() = d->second->proposals();
    } else if (p.k > 0 && d != it.drafts.end()) {
      r.draft_pos = 0;  // the draft lost it: resend everything next time
    }
    p.k = t->proposals_size();
    it.step_tokens += p.tokens();
    r.on_services = true;
  }
  return treq;
}

void RouterEngine::HandleTargetError(Iteration& it, const absl::Status& status, absl::Time t1) {
  const absl::StatusCode code = status.code();
  metrics_->router_rpc_errors.Add({{"hop", "target"}, {"code", CodeName(code)}}).Increment();
  if (code == absl::StatusCode::kResourceExhausted) {
    // Our KV estimate was off (e.g. the service holds stale sequences): preempt the youngest.
    std::vector<int64_t> ids;
    {
      absl::MutexLock l(&mu_);
      if (running_.size() > 1) PreemptLocked(running_.back(), &ids);
    }
    if (!ids.empty()) ReleaseOnServices(ids);
    absl::SleepFor(options_.retry_backoff);
    return;
  }
  if (code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kInternal) {
    // A router bug, not the client's: fail what was in the step, keep serving the rest.
    for (auto& [id, r] : it.req_of) {
      {
        absl::MutexLock l(&mu_);
        Remove(r);
      }
      Finish(r, absl::InternalError(absl::StrCat("target step: ", status.message())));
    }
    return;
  }
  // Unavailable / deadline: the target is (re)starting. Keep the requests; re-prefill when
  // it is back (it answers needs_prefill for sequences it lost).
  if (target_down_since_ == absl::InfiniteFuture()) target_down_since_ = t1;
  if (t1 - target_down_since_ > options_.target_down_timeout) {
    target_down_since_ = absl::InfiniteFuture();
    FailAll(absl::UnavailableError(
        absl::StrCat("the target service is unavailable: ", status.message())));
    return;
  }
  absl::SleepFor(options_.retry_backoff);
}

void RouterEngine::ApplyResults(Iteration& it, const iv1::TargetStepResponse& resp) {
  if (resp.instance_id() != target_info_.instance_id()) {
    target_info_.set_instance_id(resp.instance_id());
  }
  metrics_->router_batch_size.Observe(it.sched.plans.size());
  metrics_->router_step_tokens.Observe(it.step_tokens);
  metrics_->router_kv_blocks.Add({{"service", "target"}, {"state", "used"}})
      .Set(resp.kv().used_blocks());
  metrics_->router_kv_blocks.Add({{"service", "target"}, {"state", "free"}})
      .Set(resp.kv().free_blocks());
  absl::flat_hash_map<int64_t, const SeqPlan*> plan_of;
  for (const SeqPlan& p : it.sched.plans) plan_of[p.id] = &p;
  std::vector<RequestPtr> finished;
  for (const iv1::TargetSequenceResult& res : resp.sequences()) {
    auto rit = it.req_of.find(res.seq_id());
    auto pit = plan_of.find(res.seq_id());
    if (rit == it.req_of.end() || pit == plan_of.end()) continue;
    Request& r = *rit->second;
    const SeqPlan& plan = *pit->second;
    if (res.needs_prefill()) {
      r.target_pos = 0;  // the target restarted or lost it: recompute from the history
      continue;
    }
    if (!plan.emit) {
      r.target_pos = plan.end;
      continue;
    }
    if (plan.k > 0) r.draft_pos = static_cast<int32_t>(r.tokens.size());
    spec::KPolicy& policy = PolicyFor(r);
    policy.AfterDraft(r.spec, plan.k);
    policy.AfterVerify(r.spec, plan.k, res.num_accepted());
    if (EmitTokens(r, res, plan.k)) finished.push_back(rit->second);
    r.target_pos = static_cast<int32_t>(r.tokens.size()) - 1;
  }
  if (finished.empty()) return;
  std::vector<int64_t> ids;
  {
    absl::MutexLock l(&mu_);
    for (const RequestPtr& r : finished) {
      if (Remove(r)) ids.push_back(r->id);
    }
    metrics_->router_running.Set(running_.size());
  }
  ReleaseOnServices(ids);
  for (const RequestPtr& r : finished) Finish(r, absl::OkStatus());
}

bool RouterEngine::EmitTokens(Request& r, const iv1::TargetSequenceResult& res, int32_t drafted) {
  const absl::Time now = absl::Now();
  specd::v1::GenerateStreamResponse chunk;
  bool finished = false;
  int32_t emitted = 0;
  const auto& stop_ids = r.req.params.stop_token_ids;
  for (const iv1::TokenResult& t : res.tokens()) {
    const int32_t tok = t.token();
    if (!r.req.params.ignore_eos && tokenizer_.IsEndOfGeneration(tok)) {
      r.reason = specd::v1::FINISH_REASON_EOS;
      finished = true;
      break;
    }
    r.tokens.push_back(tok);
    ++emitted;
    chunk.add_token_ids(tok);
    if (r.req.params.num_logprobs > 0) {
      specd::v1::TokenLogprobs* lp = chunk.add_logprobs();
      lp->set_token_id(tok);
      lp->set_logprob(t.logprob());
      for (int j = 0; j < t.top_ids_size(); ++j) {
        specd::v1::TokenLogprob* e = lp->add_top();
        e->set_token_id(t.top_ids(j));
        e->set_logprob(t.top_logprobs(j));
      }
    }
    chunk.mutable_text()->append(r.text->Append(tok));
    const int32_t generated = static_cast<int32_t>(r.tokens.size()) - r.n_prompt;
    if (r.text->stopped()) {
      r.reason = specd::v1::FINISH_REASON_STOP_STRING;
      finished = true;
    } else if (std::find(stop_ids.begin(), stop_ids.end(), tok) != stop_ids.end()) {
      r.reason = specd::v1::FINISH_REASON_STOP_TOKEN;
      finished = true;
    } else if (generated >= r.req.max_new_tokens ||
               static_cast<int32_t>(r.tokens.size()) >= target_info_.context_length()) {
      r.reason = specd::v1::FINISH_REASON_LENGTH;
      finished = true;
    }
    if (finished) break;
  }
  if (finished) chunk.mutable_text()->append(r.text->Finish());
  // Statistics.
  ++r.target_steps;
  if (drafted > 0) {
    r.drafted += drafted;
    r.accepted += res.num_accepted();
    for (int i = 0; i < drafted; ++i) {
      const std::string pos = std::to_string(i + 1);
      metrics_->router_draft_proposed.Add({{"position", pos}}).Increment();
      if (i < res.accepted_size() && res.accepted(i)) {
        metrics_->router_draft_accepted.Add({{"position", pos}}).Increment();
      }
    }
    metrics_->router_accepted_length.Observe(res.tokens_size());
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
  if (emitted > 0 || !chunk.text().empty()) r.sink->OnChunk(std::move(chunk));
  return finished;
}

}  // namespace specd::router
