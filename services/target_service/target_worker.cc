#include "services/target_service/target_worker.h"

#include <chrono>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "engine/forward_batch.h"
#include "common/sampling/penalty_state.h"
#include "common/sampling/philox.h"
#include "common/sampling/speculative_verifier.h"
#include "speculation/calibration.h"
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
      spec::CalibrateVerify(*host_, host_->options().max_batch_tokens, /*max_rows=*/128);
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
  if (total_tokens > host_->options().max_batch_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("step has ", total_tokens,
                                                   " tokens; max_batch_tokens is ",
                                                   host_->options().max_batch_tokens));
  }
  return absl::OkStatus();
}

absl::StatusOr<iv1::TargetStepResponse> TargetWorker::Step(const iv1::TargetStepRequest& request) {
  if (absl::Status s = Validate(request); !s.ok()) return s;
  const auto t0 = std::chrono::steady_clock::now();
  const int32_t vocab = host_->vocab_size();
  iv1::TargetStepResponse response;
  response.set_instance_id(host_->instance_id());

  // Which sequences run; the rest need a re-prefill.
  std::vector<int> run;
  std::vector<int> results(request.sequences_size(), -1);
  for (int i = 0; i < request.sequences_size(); ++i) {
    const iv1::TargetSequenceStep& s = request.sequences(i);
    const std::vector<int32_t>* hist = host_->History(s.seq_id());
    const int64_t held = hist == nullptr ? 0 : static_cast<int64_t>(hist->size());
    results[i] = response.sequences_size();
    iv1::TargetSequenceResult* r = response.add_sequences();
    r->set_seq_id(s.seq_id());
    if (s.start_pos() > held) {
      if (hist != nullptr) host_->Release(s.seq_id());
      r->set_needs_prefill(true);
      continue;
    }
    run.push_back(i);
  }
  // LlamaModel::Forward answers RESOURCE_EXHAUSTED before writing any KV when blocks run out.

  engine::ForwardBatch batch;
  std::vector<int> first_row(request.sequences_size(), -1);
  for (int i : run) {
    const iv1::TargetSequenceStep& s = request.sequences(i);
    if (host_->History(s.seq_id()) == nullptr) {
      if (absl::Status st = host_->AddSequence(s.seq_id()); !st.ok()) return st;
    }
    if (s.emit()) {
      std::vector<int32_t> drafts;
      for (const iv1::Proposal& p : s.proposals()) drafts.push_back(p.token());
      first_row[i] = batch.AddVerify(s.seq_id(), s.start_pos(),
                                     absl::MakeConstSpan(s.tokens().data(), s.tokens_size()),
                                     drafts);
    } else {
      batch.AddPrompt(s.seq_id(), s.start_pos(), s.tokens().data(), s.tokens_size());
    }
  }
  logits_.resize(batch.logit_rows.size() * static_cast<size_t>(vocab));
  if (!batch.slices.empty()) {
    if (absl::Status st = host_->Forward(batch, logits_.data()); !st.ok()) {
      // Nothing was written, but the histories of new sequences must not claim tokens.
      return st;
    }
  }

  for (int i : run) {
    const iv1::TargetSequenceStep& s = request.sequences(i);
    std::vector<int32_t>& hist = *host_->History(s.seq_id());
    hist.resize(s.start_pos());
    hist.insert(hist.end(), s.tokens().begin(), s.tokens().end());
    if (!s.emit()) continue;
    const sampling::SamplingParams params = FromProto(s.sampling());
    const int32_t n_prompt = std::min<int32_t>(s.num_prompt_tokens(), hist.size());
    const sampling::PenaltyState history = sampling::PenaltyState::FromTokens(
        absl::MakeConstSpan(hist.data(), n_prompt),
        absl::MakeConstSpan(hist.data() + n_prompt, hist.size() - n_prompt));
    std::vector<sampling::SparseProposal> proposals;
    proposals.reserve(s.proposals_size());
    for (const iv1::Proposal& p : s.proposals()) proposals.push_back(FromProto(p));
    sampling::VerifyInput in;
    const size_t rows = proposals.size() + 1;
    in.target_logits = absl::MakeConstSpan(logits_.data() + first_row[i] * size_t(vocab),
                                           rows * vocab);
    in.vocab_size = vocab;
    in.proposals = proposals;
    in.history = &history;
    in.position = static_cast<int64_t>(hist.size());
    in.eos_token_ids = host_->eos_ids();
    absl::StatusOr<sampling::VerifyResult> v =
        sampling::VerifyDraft(params, sampling::CounterRng(params.seed), in);
    if (!v.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("sequences[", i, "]: ", v.status().message()));
    }
    iv1::TargetSequenceResult* r = response.mutable_sequences(results[i]);
    for (size_t j = 0; j < v->tokens.size(); ++j) {
      iv1::TokenResult* t = r->add_tokens();
      t->set_token(v->tokens[j]);
      t->set_logprob(v->logprobs[j]);
      if (j < v->top_logprobs.size()) {
        for (const sampling::TokenLogprob& tl : v->top_logprobs[j]) {
          t->add_top_ids(tl.token);
          t->add_top_logprobs(tl.logprob);
        }
      }
    }
    r->set_num_accepted(v->num_accepted);
    r->set_stopped(v->stopped);
    for (bool a : v->accepted) r->add_accepted(a);
    hist.insert(hist.end(), v->tokens.begin(), v->tokens.end());
  }
  *response.mutable_kv() = host_->Usage();
  response.set_forward_ms(
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  return response;
}

iv1::ReleaseResponse TargetWorker::Release(const iv1::ReleaseRequest& request) {
  for (int64_t id : request.seq_ids()) host_->Release(id);
  iv1::ReleaseResponse r;
  *r.mutable_kv() = host_->Usage();
  return r;
}

}  // namespace specd::services
