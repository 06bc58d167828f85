#include "services/target_service/target_worker.h"

#include <chrono>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "engine/forward_batch.h"
#include "common/sampling/penalty_state.h"
#include "common/sampling/philox.h"
#include "common/sampling/speculative_verifier.h"
#include "speculation/calibration.h"
#include "speculation/verify_step.h"
#include "services/common/proto_convert.h"

namespace specd::services {

namespace iv1 = specd::internal::v1;

iv1::ServiceInfo TargetWorker::Info() const {
  iv1::ServiceInfo info = host_->Info();
  ToProto(cost_, &info);
  return info;
}

absl::Status TargetWorker::Calibrate() {
  // Verification asks for every decode row's logits: up to 128 rows per step measured.
  absl::StatusOr<spec::CostCurve> c =
      spec::CalibrateVerify(*host_, host_->options().max_batch_tokens, /*max_rows=*/128,
                            /*probe=*/-1, options_.calibrate_depth);
  if (!c.ok()) return c.status();
  cost_ = std::move(*c);
  return absl::OkStatus();
}

absl::Status TargetWorker::Validate(const iv1::TargetStepRequest& request) const {
  const int32_t vocab = host_->vocab_size();
  const int64_t ctx = host_->context_length();
  absl::flat_hash_set<int64_t> seen;
  int64_t total_tokens = 0;
  for (int i = 0; i < request.sequences_size(); ++i) {
    const iv1::TargetSequenceStep& s = request.sequences(i);
    const std::string where = absl::StrCat("sequences[", i, "]");
    if (!seen.insert(s.seq_id()).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".seq_id ", s.seq_id(), " repeated"));
    }
    if (s.start_pos() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".start_pos must be >= 0"));
    }
    if (s.tokens_size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".tokens is empty"));
    }
    if (!s.emit() && s.proposals_size() > 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".proposals need emit"));
    }
    for (int32_t t : s.tokens()) {
      if (t < 0 || t >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat(where, ".tokens: id ", t, " out of range"));
      }
    }
    if (s.cached_prefix_size() > 0 && s.cached_prefix_size() != s.start_pos()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".cached_prefix must hold the start_pos tokens before start_pos"));
    }
    for (int32_t t : s.cached_prefix()) {
      if (t < 0 || t >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".cached_prefix: id ", t, " out of range"));
      }
    }
    for (const iv1::Proposal& p : s.proposals()) {
      if (p.token() < 0 || p.token() >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".proposals: token ", p.token(), " out of range"));
      }
    }
    const int64_t n = s.tokens_size() + s.proposals_size();
    if (s.start_pos() + n > ctx) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": start_pos + tokens exceeds the context length ", ctx));
    }
    if (absl::Status st = sampling::Validate(FromProto(s.sampling()), vocab); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".sampling: ", st.message()));
    }
    total_tokens += n;
  }
  for (int i = 0; i < request.prefix_lookups_size(); ++i) {
    const iv1::PrefixLookup& l = request.prefix_lookups(i);
    const std::string where = absl::StrCat("prefix_lookups[", i, "]");
    if (!seen.insert(l.seq_id()).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".seq_id ", l.seq_id(), " repeated"));
    }
    if (l.tokens_size() > ctx) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".tokens: more than the context length ", ctx));
    }
    for (int32_t t : l.tokens()) {
      if (t < 0 || t >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat(where, ".tokens: id ", t, " out of range"));
      }
    }
  }
  if (total_tokens > host_->options().max_batch_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("step has ", total_tokens,
                                                   " tokens; max_batch_tokens is ",
                                                   host_->options().max_batch_tokens));
  }
  return absl::OkStatus();
}

// The verification step's inputs for the sequences that run (THE verification path,
// speculation/verify_step.h): each with its committed history (what this service holds before
// start_pos, then the request's tokens), transforms and penalty history. The calls point into
// the vectors beside them, which are sized once, up front.
struct TargetWorker::StepCalls {
  std::vector<int> run;  // calls[j] answers request.sequences(run[j])
  std::vector<std::vector<int32_t>> committed;
  std::vector<sampling::SamplingParams> params;
  std::vector<sampling::PenaltyState> penalties;
  std::vector<std::vector<sampling::SparseProposal>> proposals;
  std::vector<spec::TargetCall> calls;
};

absl::StatusOr<iv1::TargetStepResponse> TargetWorker::Step(const iv1::TargetStepRequest& request) {
  if (absl::Status s = Validate(request); !s.ok()) return s;
  const auto t0 = std::chrono::steady_clock::now();
  iv1::TargetStepResponse response;
  response.set_instance_id(host_->instance_id());
  AnswerLookups(request, response);
  StepCalls step;
  if (absl::Status st = FindRunnable(request, response, step.run); !st.ok()) return st;
  BuildCalls(request, step);
  for (const spec::TargetCall& c : step.calls) {
    if (host_->History(c.seq) != nullptr) continue;
    if (absl::Status st = host_->AddSequence(c.seq); !st.ok()) return st;
  }
  // RESOURCE_EXHAUSTED before any KV is written when blocks run out; the histories are only
  // updated after success, so new sequences never claim tokens they do not hold.
  std::vector<spec::TargetOutcome> outcomes;
  if (!step.calls.empty()) {
    if (absl::Status st =
            spec::RunVerifyStep(*host_, step.calls, verify_options_, buffers_, outcomes);
        !st.ok()) {
      return st;
    }
  }
  if (absl::Status st = CommitResults(request, step, outcomes, response); !st.ok()) return st;
  *response.mutable_kv() = host_->Usage();
  response.set_forward_ms(
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  return response;
}

// Which sequences run (`run`, request order); the rest are answered needs_prefill.
absl::Status TargetWorker::FindRunnable(const iv1::TargetStepRequest& request,
                                        iv1::TargetStepResponse& response, std::vector<int>& run) {
  for (int i = 0; i < request.sequences_size(); ++i) {
    const iv1::TargetSequenceStep& s = request.sequences(i);
    iv1::TargetSequenceResult* r = response.add_sequences();
    r->set_seq_id(s.seq_id());
    if (s.cached_prefix_size() > 0) {
      absl::StatusOr<bool> taken = TakeCachedPrefix(s);
      if (!taken.ok()) return taken.status();
      if (!*taken) {
        r->set_needs_prefill(true);
        continue;
      }
    }
    const std::vector<int32_t>* hist = host_->History(s.seq_id());
    const int64_t held = hist == nullptr ? 0 : static_cast<int64_t>(hist->size());
    if (s.start_pos() > held) {
      if (hist != nullptr) host_->Release(s.seq_id());
      r->set_needs_prefill(true);
      continue;
    }
    run.push_back(i);
  }
  return absl::OkStatus();
}

void TargetWorker::BuildCalls(const iv1::TargetStepRequest& request, StepCalls& step) const {
  const size_t n = step.run.size();
  step.committed.resize(n);
  step.params.resize(n);
  step.penalties.resize(n);
  step.proposals.resize(n);
  step.calls.resize(n);
  for (size_t j = 0; j < n; ++j) {
    const iv1::TargetSequenceStep& s = request.sequences(step.run[j]);
    std::vector<int32_t>& committed = step.committed[j];
    const std::vector<int32_t>* hist = host_->History(s.seq_id());
    if (hist != nullptr) committed.assign(hist->begin(), hist->begin() + s.start_pos());
    committed.insert(committed.end(), s.tokens().begin(), s.tokens().end());
    step.params[j] = FromProto(s.sampling());
    const size_t n_prompt = std::min<size_t>(std::max(0, s.num_prompt_tokens()), committed.size());
    step.penalties[j] = sampling::PenaltyState::FromTokens(
        absl::MakeConstSpan(committed.data(), n_prompt),
        absl::MakeConstSpan(committed.data() + n_prompt, committed.size() - n_prompt));
    for (const iv1::Proposal& p : s.proposals()) step.proposals[j].push_back(FromProto(p));
    spec::TargetCall& c = step.calls[j];
    c.seq = s.seq_id();
    c.start = s.start_pos();
    c.tokens = absl::MakeConstSpan(s.tokens().data(), s.tokens_size());
    c.emit = s.emit();
    c.proposals = step.proposals[j];
    c.params = &step.params[j];
    c.history = &step.penalties[j];
    c.num_prompt = static_cast<int32_t>(n_prompt);
    c.want_features = s.want_features();
  }
}

// After a successful step: each running sequence's history becomes what it committed (and
// its full blocks go to the prefix cache), and its result gets the emitted tokens.
absl::Status TargetWorker::CommitResults(const iv1::TargetStepRequest& request, StepCalls& step,
                                         const std::vector<spec::TargetOutcome>& outcomes,
                                         iv1::TargetStepResponse& response) {
  for (size_t j = 0; j < step.run.size(); ++j) {
    const iv1::TargetSequenceStep& s = request.sequences(step.run[j]);
    std::vector<int32_t>& hist = *host_->History(s.seq_id());
    hist = std::move(step.committed[j]);
    if (absl::Status st = PublishCommitted(s.seq_id(), hist); !st.ok()) return st;
    iv1::TargetSequenceResult* r = response.mutable_sequences(step.run[j]);
    if (!outcomes[j].features.empty()) {
      r->set_features(FeaturesToBytes(outcomes[j].features));
      r->set_feature_dim(host_->model().config().embedding_dim);
    }
    if (!s.emit()) continue;
    const sampling::VerifyResult& v = outcomes[j].verified;
    AddVerified(v, *r);
    hist.insert(hist.end(), v.tokens.begin(), v.tokens.end());
  }
  return absl::OkStatus();
}

// The emitted tokens (with their logprobs and top alternatives) and which drafts were accepted.
void TargetWorker::AddVerified(const sampling::VerifyResult& v, iv1::TargetSequenceResult& r) {
  for (size_t t = 0; t < v.tokens.size(); ++t) {
    iv1::TokenResult* tr = r.add_tokens();
    tr->set_token(v.tokens[t]);
    tr->set_logprob(v.logprobs[t]);
    if (t < v.top_logprobs.size()) {
      for (const sampling::TokenLogprob& tl : v.top_logprobs[t]) {
        tr->add_top_ids(tl.token);
        tr->add_top_logprobs(tl.logprob);
      }
    }
  }
  r.set_num_accepted(v.num_accepted);
  r.set_stopped(v.stopped);
  for (bool a : v.accepted) r.add_accepted(a);
}

void TargetWorker::AnswerLookups(const iv1::TargetStepRequest& request,
                                 iv1::TargetStepResponse& response) const {
  for (const iv1::PrefixLookup& l : request.prefix_lookups()) {
    const absl::Span<const int32_t> tokens(l.tokens().data(), l.tokens_size());
    response.add_prefix_cached(static_cast<int32_t>(host_->kv().CachedPrefixLength(tokens)));
  }
}

absl::StatusOr<bool> TargetWorker::TakeCachedPrefix(const iv1::TargetSequenceStep& s) {
  // The sequence starts over: whatever this service held of it goes first.
  if (host_->History(s.seq_id()) != nullptr) host_->Release(s.seq_id());
  if (absl::Status st = host_->AddSequence(s.seq_id()); !st.ok()) return st;
  // With the first token after the prefix, so that every block of the prefix may be taken.
  std::vector<int32_t> lookup(s.cached_prefix().begin(), s.cached_prefix().end());
  lookup.push_back(s.tokens(0));
  absl::StatusOr<int64_t> adopted = host_->AdoptPrefix(s.seq_id(), lookup);
  if (!adopted.ok() || *adopted != s.start_pos()) {
    host_->Release(s.seq_id());
    if (!adopted.ok()) return adopted.status();  // a failing rank: the step fails with it
    return false;                                // evicted since the lookup
  }
  host_->History(s.seq_id())->assign(s.cached_prefix().begin(), s.cached_prefix().end());
  return true;
}

absl::Status TargetWorker::PublishCommitted(int64_t seq, absl::Span<const int32_t> history) {
  // The KV holds the committed tokens up to its length (the last emitted token is not in it
  // yet): those are the ones other sequences may share.
  absl::StatusOr<int64_t> held = host_->kv().Length(seq);
  if (!held.ok()) return held.status();
  return host_->Publish(seq, history.subspan(0, std::min<size_t>(*held, history.size())));
}

iv1::ReleaseResponse TargetWorker::Release(const iv1::ReleaseRequest& request) {
  for (int64_t id : request.seq_ids()) host_->Release(id);
  if (request.drop_prefix_cache()) host_->DropPrefixCache();
  iv1::ReleaseResponse r;
  *r.mutable_kv() = host_->Usage();
  return r;
}

}  // namespace specd::services
