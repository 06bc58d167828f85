// SpecEngine: speculative decoding with continuous batching, in one process.
//
// Admit() queues a request; each Step() runs one iteration, as named steps:
//   1. FinishCancelled;
//   2. ScheduleStep: k_i per decoding sequence (THE policy, k_policy.h), then THE scheduler
//      (scheduler.h, shared with the router): admission, preemption by recompute, the token
//      budget, prompt chunks;
//   3. DraftStep: the drafter proposes d_1..d_{k_i} with q for all of them at once (it first
//      catches up on what was committed since it last saw the sequence);
//   4. TargetForward: ONE batched forward over every sequence's [x_n, d_1..d_k] rows plus prompt
//      chunks of sequences still prefilling (a prompt's last chunk emits its first token);
//   5. ApplyResults: VerifyDraft (docs/DESIGN.md §2) per emitting sequence, commit, then KV
//      rollback on both models: the target keeps x_1..x_n, d_1..d_a; the drafter drops what
//      disagrees with the commit.
// Randomness is the request's CounterRng (seed) at absolute positions, and the CPU kernels are
// batch-invariant, so a request's tokens do not depend on what it was batched with, on k, or on
// preemption (which frees a sequence's KV and recomputes it later).
#ifndef SPECD_SPECULATION_SPEC_ENGINE_H_
#define SPECD_SPECULATION_SPEC_ENGINE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/llama_model.h"
#include "engine/paged_kv_cache.h"
#include "common/sampling/penalty_state.h"
#include "common/sampling/philox.h"
#include "common/sampling/sampling_params.h"
#include "common/sampling/speculative_verifier.h"
#include "speculation/adaptive_k.h"
#include "speculation/drafter.h"
#include "speculation/k_policy.h"
#include "speculation/scheduler.h"
#include "speculation/spec_stats.h"

namespace specd::spec {

using RequestId = int64_t;

enum class FinishReason { kNone, kLength, kStop, kCancelled, kError };
const char* FinishReasonName(FinishReason r);

struct SpecRequest {
  std::vector<int32_t> prompt;  // token ids, non-empty
  sampling::SamplingParams params;
  int32_t max_new_tokens = 128;
  int32_t k = -1;  // -1: the engine's policy; 0: no speculation; > 0: at most this many drafts
};

struct SpecResult {
  std::vector<int32_t> tokens;  // generated tokens (a stop token is included)
  std::vector<float> logprobs;  // [tokens.size()] raw log-softmax
  FinishReason finish = FinishReason::kNone;
  absl::Status status;  // why, for kError
  int32_t steps = 0;    // target steps that emitted tokens for this request
  int32_t drafted = 0, accepted = 0;
};

struct SpecEngineOptions {
  int32_t max_batch_tokens = 256;  // target tokens per step; <= the model's max_batch_tokens
  int32_t max_running = 16;        // sequences decoding at once
  int32_t max_waiting = 1024;      // queue bound; Admit answers RESOURCE_EXHAUSTED beyond it
  int32_t kv_blocks = 1024;        // target KV cache blocks
  int32_t block_size = 16;
  kernels::KvDtype kv_dtype = kernels::KvDtype::kF16;
  int32_t k = 4;  // drafts per step (fixed mode) / upper bound (adaptive)
  bool adaptive_k = false;
  // Adaptive mode: measure target and draft costs at Create (a few forwards). Without it
  // the curves start from `verify_cost` / `draft_cost` (must be set then).
  bool calibrate = true;
  CostCurve verify_cost, draft_cost;
  // Rescale the curves online from measured step times (a shared machine drifts). Off: the
  // curves are used exactly as given (tests; k choices that do not depend on timing).
  bool track_load = true;
  std::vector<int32_t> eos_token_ids;  // end-of-generation ids (stop unless ignore_eos)
  // Tests only: replaces sampling::VerifyDraft (e.g. a deliberately wrong verifier, to show the
  // losslessness test can fail). Null = VerifyDraft.
  std::function<absl::StatusOr<sampling::VerifyResult>(
      const sampling::SamplingParams&, const sampling::CounterRng&, const sampling::VerifyInput&)>
      verifier;
};

class SpecEngine {
 public:
  // tokens: the request's new tokens; finish != kNone on its last call.
  using StreamCallback =
      std::function<void(RequestId, absl::Span<const int32_t> tokens, FinishReason finish)>;

  // `target` and `drafter` (may be null: plain decoding) must outlive the engine.
  // INVALID_ARGUMENT naming the bad option.
  static absl::StatusOr<std::unique_ptr<SpecEngine>> Create(engine::LlamaModel* target,
                                                            Drafter* drafter,
                                                            const SpecEngineOptions& options);
  ~SpecEngine();

  // INVALID_ARGUMENT naming the field (prompt, params.*, max_new_tokens, k);
  // RESOURCE_EXHAUSTED when the queue is full.
  absl::StatusOr<RequestId> Admit(SpecRequest request);
  // Finishes the request with kCancelled and frees its KV on both models at the next Step (or
  // now, if it is still queued). NOT_FOUND for an unknown or already finished id.
  absl::Status Cancel(RequestId id);
  // One iteration for all running sequences. Errors only for engine-level failures (a target
  // forward failing); a request-level failure finishes that request with kError.
  absl::Status Step();
  // Steps until nothing is queued or running.
  absl::Status RunToCompletion();

  bool HasWork() const { return !waiting_.empty() || !running_.empty(); }
  bool IsFinished(RequestId id) const { return finished_.contains(id); }
  // Hands over (and forgets) a finished request's result. NOT_FOUND if unknown,
  // FAILED_PRECONDITION while it runs.
  absl::StatusOr<SpecResult> TakeResult(RequestId id);

  void SetStreamCallback(StreamCallback cb) { stream_ = std::move(cb); }
  const SpecStats& stats() const { return stats_; }
  void ResetStats();
  const SpecEngineOptions& options() const { return options_; }
  const engine::PagedKvCache& kv_cache() const { return *kv_; }
  Drafter* drafter() const { return drafter_; }
  const CostCurve& verify_cost() const { return policy_.verify_cost(); }
  const CostCurve& draft_cost() const { return policy_.draft_cost(); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  // Committed length (prompt + generated) of a running request; -1 otherwise. For tests.
  int64_t CommittedLength(RequestId id) const;

 private:
  struct Sequence;
  SpecEngine() = default;
  absl::Status Calibrate();
  // The steps of Step(), in order; `plans` is the scheduler's output for this iteration.
  void FinishCancelled();
  absl::StatusOr<Schedule> ScheduleStep();
  // `seqs[p]` is the sequence of plans[p] (looked up once per step).
  absl::Status DraftStep(std::vector<SeqPlan>& plans, absl::Span<Sequence* const> seqs,
                         std::vector<DraftOutput>& drafts);
  absl::Status TargetForward(const std::vector<SeqPlan>& plans, absl::Span<Sequence* const> seqs,
                             const std::vector<DraftOutput>& drafts, std::vector<int32_t>& row_of);
  void ApplyResults(const std::vector<SeqPlan>& plans, absl::Span<Sequence* const> seqs,
                    const std::vector<DraftOutput>& drafts, const std::vector<int32_t>& row_of);
  void Commit(Sequence& s, const sampling::VerifyResult& v);
  void Finish(Sequence& s, FinishReason reason, absl::Status status = absl::OkStatus());
  void Preempt(size_t running_index);
  int32_t KCap(const Sequence& s) const;
  // A sampled sequence's k schedule must not depend on the batch: see spec_engine.cc.
  static bool PinnedK(const Sequence& s);

  engine::LlamaModel* target_ = nullptr;
  Drafter* drafter_ = nullptr;
  SpecEngineOptions options_;
  std::unique_ptr<engine::PagedKvCache> kv_;
  KPolicy policy_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  absl::flat_hash_map<RequestId, SpecResult> finished_;
  RequestId next_id_ = 1;
  StreamCallback stream_;
  SpecStats stats_;
  engine::ForwardBatch batch_;
  std::vector<float> logits_;  // [model max_logit_rows, vocab]
};

}  // namespace specd::spec

#endif  // SPECD_SPECULATION_SPEC_ENGINE_H_
