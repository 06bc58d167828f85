// SpecEngine: speculative decoding with continuous batching, in one process.
//
// Admit() queues a request; each Step() runs one iteration of THE loop (spec_loop.h, the same
// one the cluster's router runs) over this process's drafter and target (verify_step.h
// LocalTarget: the target service's verification code):
//   1. cancelled requests out (their KV freed at once);
//   2. Schedule: k_i per sequence that may verify (THE policy, k_policy.h), then THE scheduler
//      (scheduler.h): admission, preemption by recompute, the token budget, prompt chunks (a
//      prompt's last chunk verifies drafts too: the first token comes with speculation);
//   3. Draft: the drafter proposes d_1..d_{k_i} with q for all of them at once;
//   4. Target: ONE batched forward over every sequence's [x_n, d_1..d_k] rows plus prompt
//      chunks, VerifyDraft (docs/DESIGN.md §2) per emitting sequence, target KV rollback;
//   5. Apply: commit, the drafter drops what disagrees with the commit, finished requests out.
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
#include "engine/model_runner.h"
#include "engine/paged_kv_cache.h"
#include "common/sampling/penalty_state.h"
#include "common/sampling/philox.h"
#include "common/sampling/sampling_params.h"
#include "common/sampling/speculative_verifier.h"
#include "speculation/adaptive_k.h"
#include "speculation/drafter.h"
#include "speculation/k_policy.h"
#include "speculation/scheduler.h"
#include "speculation/spec_loop.h"
#include "speculation/spec_stats.h"
#include "speculation/verify_step.h"

namespace specd::spec {

using RequestId = int64_t;

enum class FinishReason { kNone, kLength, kStop, kCancelled, kError };
const char* FinishReasonName(FinishReason r);

struct SpecRequest {
  std::vector<int32_t> prompt;  // token ids, non-empty
  sampling::SamplingParams params;
  int32_t max_new_tokens = 128;
  int32_t k = -1;  // -1: the engine's policy; 0: no speculation; > 0: at most this many drafts
  // Sampled requests: true, the seed alone gives the text (k pinned); false, k follows load
  // like a greedy request's (faster in a batch, same distribution). LoopSeq::seeded.
  bool seeded = true;
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
  // Adaptive k only: a free lookup drafter (the n-gram one) tried first each step, on its own
  // policy; the engine's drafter drafts the steps it does not (the router's speculation
  // "auto"). Must outlive the engine; null: none.
  Drafter* lookup = nullptr;
  // Adaptive mode: measure target and draft costs at Create (a few forwards). Without it
  // the curves start from `verify_cost` / `draft_cost` (must be set then).
  bool calibrate = true;
  // The context the calibration prices verification at (CalibrateVerify's depth_keys): what
  // each KV position a sequence's rows attend over adds to a step. 0: context is not priced.
  int32_t calibrate_depth_keys = 1024;
  CostCurve verify_cost, draft_cost;
  // Rescale the curves online from measured step times (a shared machine drifts). Off: the
  // curves are used exactly as given (tests; k choices that do not depend on timing).
  bool track_load = true;
  std::vector<int32_t> eos_token_ids;  // end-of-generation ids (stop unless ignore_eos)
  // Tests only: replaces sampling::VerifyDraft (e.g. a deliberately wrong verifier, to show the
  // losslessness test can fail). Null = VerifyDraft.
  Verifier verifier;
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

  bool HasWork() const { return !loop_->waiting().empty() || !loop_->running().empty(); }
  bool IsFinished(RequestId id) const { return finished_.contains(id); }
  // Hands over (and forgets) a finished request's result. NOT_FOUND if unknown,
  // FAILED_PRECONDITION while it runs.
  absl::StatusOr<SpecResult> TakeResult(RequestId id);

  void SetStreamCallback(StreamCallback cb) { stream_ = std::move(cb); }
  const SpecStats& stats() const { return loop_->stats(); }
  void ResetStats();
  const SpecEngineOptions& options() const { return options_; }
  const engine::PagedKvCache& kv_cache() const { return *kv_; }
  Drafter* drafter() const { return drafter_; }
  const CostCurve& verify_cost() const;
  const CostCurve& draft_cost() const;
  int64_t num_running() const { return static_cast<int64_t>(loop_->running().size()); }
  int64_t num_waiting() const { return static_cast<int64_t>(loop_->waiting().size()); }
  // Committed length (prompt + generated) of a running request; -1 otherwise. For tests.
  int64_t CommittedLength(RequestId id) const;

 private:
  struct Sequence;
  class Client;
  SpecEngine() = default;
  absl::Status Calibrate();
  void FinishCancelled();
  // Nothing could be scheduled although sequences run: the oldest cannot fit at all.
  void FailStuck(const LoopStep& step);
  // Finished sequences' results to finished_ (their KV is already freed).
  void Collect(LoopStep& step);
  void Finish(Sequence& s, FinishReason reason, absl::Status status = absl::OkStatus());
  SchedulerConfig SchedulerFor() const;

  engine::LlamaModel* target_ = nullptr;
  Drafter* drafter_ = nullptr;
  SpecEngineOptions options_;
  std::unique_ptr<engine::PagedKvCache> kv_;
  std::unique_ptr<engine::LocalModelRunner> runner_;
  std::unique_ptr<LocalTarget> local_target_;
  std::unique_ptr<SpecLoop> loop_;       // THE loop; its drafter 0 is drafter_ (if any)
  int32_t lookup_index_ = -1;            // options_.lookup's index in the loop (-1: none)
  CostCurve verify_cost_, draft_cost_;  // the curves when there is no drafter (no policy)
  absl::flat_hash_map<RequestId, SpecResult> finished_;
  RequestId next_id_ = 1;
  StreamCallback stream_;
  // Calibration's own forwards (the probe sequence).
  engine::ForwardBatch batch_;
  std::vector<float> logits_;  // [model max_logit_rows, vocab]
};

}  // namespace specd::spec

#endif  // SPECD_SPECULATION_SPEC_ENGINE_H_
