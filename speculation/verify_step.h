// THE verification path: one ragged target forward over prompt chunks and [x_n, d_1..d_k] row
// groups, then sampling::VerifyDraft (docs/DESIGN.md §2) per emitting sequence, then the KV
// rollback to what was accepted. Where the runner's logits can stay on its backend (a device
// whose memory the host cannot address) they are verified there by the same rule
// (common/sampling/blockwise_verify.h) and only tokens and the requested logprobs come back;
// tests' own verifiers take the host path. The in-process engine runs it through LocalTarget; the target
// service runs it behind gRPC (services/target_service/target_worker.cc).
#ifndef SPECD_SPECULATION_VERIFY_STEP_H_
#define SPECD_SPECULATION_VERIFY_STEP_H_

#include <functional>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "engine/forward_batch.h"
#include "engine/model_runner.h"
#include "speculation/target_step.h"

namespace specd::spec {

using Verifier = std::function<absl::StatusOr<sampling::VerifyResult>(
    const sampling::SamplingParams&, const sampling::CounterRng&, const sampling::VerifyInput&)>;

struct VerifyStepOptions {
  std::vector<int32_t> eos_token_ids;  // end-of-generation ids (stop unless ignore_eos)
  // Tests only: replaces sampling::VerifyDraft (a deliberately wrong verifier shows the
  // losslessness test can fail). Null = VerifyDraft.
  Verifier verifier;
};

// Reusable buffers of RunVerifyStep (one per caller, not shared between threads).
struct VerifyStepBuffers {
  engine::ForwardBatch batch;
  std::vector<float> logits;  // [logit rows, vocab]
  std::vector<float> hidden;  // [hidden rows, D]: the rows of calls that want features
};

// Runs `calls` on `runner` (every sequence must already be added). out: [calls.size()], each
// with needs_prefill false. Errors: the forward's (RESOURCE_EXHAUSTED before any KV is written),
// or INVALID_ARGUMENT "sequence <id>: ..." from verification. After it, an emitting sequence's KV holds
// x_1..x_n and the accepted drafts (the emitted correction/bonus is fed with its next step).
absl::Status RunVerifyStep(engine::ModelRunner& runner, absl::Span<const TargetCall> calls,
                           const VerifyStepOptions& options, VerifyStepBuffers& buffers,
                           std::vector<TargetOutcome>& out);

// A target model in this process, for the in-process engine: sequences are added on their
// first step and freed on Release.
class LocalTarget final : public TargetExecutor {
 public:
  // `runner` must outlive this.
  LocalTarget(engine::ModelRunner* runner, VerifyStepOptions options)
      : runner_(runner), options_(std::move(options)) {}
  absl::Status Run(absl::Span<const TargetCall> calls, std::vector<TargetOutcome>& out) override;
  void Release(absl::Span<const SeqId> seqs) override;

 private:
  engine::ModelRunner* runner_;
  VerifyStepOptions options_;
  VerifyStepBuffers buffers_;
  absl::flat_hash_set<SeqId> held_;
};

}  // namespace specd::spec

#endif  // SPECD_SPECULATION_VERIFY_STEP_H_
