#include "speculation/verify_step.h"

#include "absl/strings/str_cat.h"
#include "common/sampling/philox.h"

namespace specd::spec {
namespace {

// The step's batch: a prompt chunk per non-emitting call, a [tail.., x_n, d_1..d_k] group per
// emitting one. first_row[i]: call i's first logit row (-1 without emit); first_hidden[i]: its
// first hidden row (-1 unless it wants features: then every row of its slice).
void BuildBatch(absl::Span<const TargetCall> calls, engine::ForwardBatch& batch,
                std::vector<int32_t>& first_row, std::vector<int32_t>& first_hidden) {
  batch.Clear();
  first_row.assign(calls.size(), -1);
  first_hidden.assign(calls.size(), -1);
  std::vector<int32_t> drafts;
  for (size_t i = 0; i < calls.size(); ++i) {
    const TargetCall& c = calls[i];
    const int32_t base = static_cast<int32_t>(batch.tokens.size());
    if (!c.emit) {
      batch.AddPrompt(c.seq, c.start, c.tokens.data(), static_cast<int32_t>(c.tokens.size()));
    } else {
      drafts.clear();
      for (const sampling::SparseProposal& q : c.proposals) drafts.push_back(q.token);
      first_row[i] = batch.AddVerify(c.seq, c.start, c.tokens, drafts);
    }
    if (c.want_features) {
      first_hidden[i] = static_cast<int32_t>(batch.hidden_rows.size());
      for (int32_t t = base; t < static_cast<int32_t>(batch.tokens.size()); ++t) {
        batch.hidden_rows.push_back(t);
      }
    }
  }
}

// The hidden rows of call `c` that the target keeps: its tokens and the accepted drafts.
void KeepFeatures(const TargetCall& c, int32_t first_hidden, int32_t accepted, int64_t dim,
                  const std::vector<float>& hidden, TargetOutcome& out) {
  if (first_hidden < 0) return;
  const size_t rows = c.tokens.size() + static_cast<size_t>(accepted);
  const float* from = hidden.data() + static_cast<size_t>(first_hidden) * dim;
  out.features.assign(from, from + rows * dim);
}

// VerifyDraft on call `c`'s k + 1 logit rows starting at `first_row`.
absl::StatusOr<sampling::VerifyResult> Verify(const TargetCall& c, const float* logits,
                                              int32_t vocab, const VerifyStepOptions& options) {
  sampling::VerifyInput in;
  const size_t rows = c.proposals.size() + 1;
  in.target_logits = absl::MakeConstSpan(logits, rows * vocab);
  in.vocab_size = vocab;
  in.proposals = c.proposals;
  in.history = c.history;
  in.position = int64_t{c.start} + static_cast<int64_t>(c.tokens.size());
  in.eos_token_ids = options.eos_token_ids;
  const sampling::CounterRng rng(c.params->seed);
  return options.verifier ? options.verifier(*c.params, rng, in)
                          : sampling::VerifyDraft(*c.params, rng, in);
}


// The logits leave the runner and each sequence is verified on the host (VerifyDraft).
// Each emitting sequence's verification is its own (its rows, history and counters), so they
// run on the backend's threads: a batch's sampled rows each build p over the whole vocabulary.
// The results do not depend on which thread ran them.
absl::Status ForwardThenVerifyOnHost(engine::ModelRunner& runner,
                                     absl::Span<const TargetCall> calls,
                                     absl::Span<const int32_t> first_row,
                                     const VerifyStepOptions& options, VerifyStepBuffers& buffers,
                                     std::vector<absl::StatusOr<sampling::VerifyResult>>& verified) {
  const int32_t vocab = runner.model().vocab_size();
  buffers.logits.resize(buffers.batch.logit_rows.size() * static_cast<size_t>(vocab));
  if (absl::Status st =
          runner.Forward(buffers.batch, buffers.logits.data(), buffers.hidden.data());
      !st.ok()) {
    return st;
  }
  runner.model().backend()->ParallelFor(
      static_cast<int64_t>(calls.size()), [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          if (!calls[i].emit) continue;
          verified[i] = Verify(calls[i],
                               buffers.logits.data() + static_cast<size_t>(first_row[i]) * vocab,
                               vocab, options);
        }
      });
  return absl::OkStatus();
}

// Where the runner can: the logits stay on its backend and are verified there
// (common/sampling/blockwise_verify.h); only tokens and the requested logprobs come back. Not
// for tests' own verifiers.
bool VerifiesOnDevice(const engine::ModelRunner& runner, const VerifyStepOptions& options) {
  return !options.verifier && runner.samples_on_device();
}

absl::Status ForwardAndVerifyOnDevice(engine::ModelRunner& runner,
                                      absl::Span<const TargetCall> calls,
                                      absl::Span<const int32_t> first_row,
                                      const VerifyStepOptions& options,
                                      VerifyStepBuffers& buffers,
                                      std::vector<absl::StatusOr<sampling::VerifyResult>>& verified) {
  std::vector<sampling::SequenceToVerify> seqs;
  std::vector<size_t> call_of;
  for (size_t i = 0; i < calls.size(); ++i) {
    const TargetCall& c = calls[i];
    if (!c.emit) continue;
    sampling::SequenceToVerify s;
    s.params = c.params;
    s.history = c.history;
    s.proposals = c.proposals;
    s.position = int64_t{c.start} + static_cast<int64_t>(c.tokens.size());
    s.eos_token_ids = options.eos_token_ids;
    s.first_logits_row = first_row[i];
    s.name = static_cast<int64_t>(c.seq);
    seqs.push_back(s);
    call_of.push_back(i);
  }
  // A malformed request is named before the forward runs (no KV written for it).
  absl::StatusOr<sampling::BlockwisePlan> plan =
      sampling::BlockwisePlan::Build(runner.model().vocab_size(), seqs);
  if (!plan.ok()) return plan.status();
  absl::StatusOr<std::vector<sampling::VerifyResult>> results =
      runner.ForwardAndVerify(buffers.batch, *plan, buffers.hidden.data());
  if (!results.ok()) return results.status();
  for (size_t j = 0; j < call_of.size(); ++j) verified[call_of[j]] = std::move((*results)[j]);
  return absl::OkStatus();
}

}  // namespace

absl::Status RunVerifyStep(engine::ModelRunner& runner, absl::Span<const TargetCall> calls,
                           const VerifyStepOptions& options, VerifyStepBuffers& buffers,
                           std::vector<TargetOutcome>& out) {
  out.assign(calls.size(), TargetOutcome{});
  if (calls.empty()) return absl::OkStatus();
  const int64_t dim = runner.model().config().embedding_dim;
  std::vector<int32_t> first_row, first_hidden;
  BuildBatch(calls, buffers.batch, first_row, first_hidden);
  buffers.hidden.resize(buffers.batch.hidden_rows.size() * static_cast<size_t>(dim));
  std::vector<absl::StatusOr<sampling::VerifyResult>> verified(
      calls.size(), absl::StatusOr<sampling::VerifyResult>(sampling::VerifyResult{}));
  absl::Status st =
      VerifiesOnDevice(runner, options)
          ? ForwardAndVerifyOnDevice(runner, calls, first_row, options, buffers, verified)
          : ForwardThenVerifyOnHost(runner, calls, first_row, options, buffers, verified);
  if (!st.ok()) return st;
  // Then, in order, the rollbacks (the KV cache is not shared between threads).
  for (size_t i = 0; i < calls.size(); ++i) {
    const TargetCall& c = calls[i];
    if (!c.emit) {
      KeepFeatures(c, first_hidden[i], 0, dim, buffers.hidden, out[i]);
      continue;
    }
    absl::StatusOr<sampling::VerifyResult>& v = verified[i];
    if (!v.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", c.seq, ": ", v.status().message()));
    }
    // Rollback: keep x_1..x_n and the accepted drafts; rejected drafts' KV goes now.
    const int64_t kept = int64_t{c.start} + static_cast<int64_t>(c.tokens.size()) +
                         v->num_accepted;
    if (absl::Status st = runner.Truncate(c.seq, kept); !st.ok()) return st;
    KeepFeatures(c, first_hidden[i], v->num_accepted, dim, buffers.hidden, out[i]);
    out[i].verified = std::move(*v);
  }
  return absl::OkStatus();
}

absl::Status LocalTarget::Run(absl::Span<const TargetCall> calls,
                              std::vector<TargetOutcome>& out) {
  for (const TargetCall& c : calls) {
    if (held_.contains(c.seq)) continue;
    if (absl::Status st = runner_->AddSequence(c.seq); !st.ok()) return st;
    held_.insert(c.seq);
  }
  return RunVerifyStep(*runner_, calls, options_, buffers_, out);
}

void LocalTarget::Release(absl::Span<const SeqId> seqs) {
  for (SeqId s : seqs) {
    if (held_.erase(s) > 0) runner_->FreeSequence(s);
  }
}

}  // namespace specd::spec
