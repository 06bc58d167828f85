// The router's core without the network: THE speculation loop (speculation/spec_loop.h, the
// in-process engine's too) over the draft and target services (remote_backends.h) and the
// router's own n-gram lookup, on a thread of its own; around it what only a server needs:
// requests from many threads, streaming output with stop strings, cancellation/deadlines, and
// fault handling (draft down -> plain decoding; target unknown sequence or restart -> re-prefill
// from the token history).
#ifndef SPECD_SERVICES_ROUTER_ROUTER_ENGINE_H_
#define SPECD_SERVICES_ROUTER_ROUTER_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "speculation/k_policy.h"
#include "speculation/ngram_drafter.h"
#include "speculation/scheduler.h"
#include "speculation/spec_loop.h"
#include "common/tokenizer/tokenizer.h"
#include "services/common/event_log.h"
#include "services/common/metrics.h"
#include "services/router/backends.h"
#include "services/router/remote_backends.h"
#include "services/router/request_validation.h"
#include "services/router/text_stream.h"
#include "specd/v1/generation.pb.h"

namespace specd::router {

using spec::BlocksFor;
using spec::CanEnqueue;
using spec::Schedule;
using spec::ScheduleIteration;
using spec::SchedulerConfig;
using spec::SchedulerState;
using spec::SeqPlan;
using spec::SeqView;

struct RouterOptions {
  // max_batch_tokens, max_running, max_queue are used as given; block size and capacities come
  // from the services' GetInfo.
  SchedulerConfig scheduler;
  int32_t max_k = 8;                     // adaptive k's upper bound
  int32_t default_k = 0;                 // 0: adaptive
  // Speculation auto: the n-gram lookup drafts only after a match of this many tokens; shorter
  // matches are the draft service's (spec::LoopOptions::lookup_min_match).
  int32_t lookup_min_match = spec::LoopOptions{}.lookup_min_match;
  // The adaptive-k policy's cost curves (spec::KPolicy). Empty: the services' own calibration
  // (GetInfo step_cost); a service that reports none gets no adaptive drafts.
  spec::CostCurve verify_cost, draft_cost;
  bool track_load = true;  // rescale the curves from measured step times
  int32_t max_new_tokens_limit = 4096;
  absl::Duration draft_retry = absl::Seconds(1);
  absl::Duration target_down_timeout = absl::Seconds(30);
  absl::Duration retry_backoff = absl::Milliseconds(20);
  // A step's tokens are written to the clients while the next step runs on the services
  // (false: before the next step is sent, as the step ends).
  bool overlap_client_writes = true;
};

// Receives one request's output, from the router loop thread (must not block for long).
class RequestSink {
 public:
  virtual ~RequestSink() = default;
  virtual void OnChunk(specd::v1::GenerateStreamResponse chunk) = 0;
  // Exactly once, after the last chunk.
  virtual void OnDone(absl::Status status, specd::v1::Completion completion) = 0;
};

class RouterEngine {
 public:
  // `draft` may be null (no draft service). `tokenizer` and `metrics` must outlive the engine.
  RouterEngine(const RouterOptions& options, std::unique_ptr<TargetBackend> target,
               std::unique_ptr<DraftBackend> draft, const tok::Tokenizer& tokenizer,
               services::Metrics* metrics);
  ~RouterEngine();

  // Reads the services' info (the target must answer; the draft may come later), checks
  // that vocabularies match the router's tokenizer, and starts the loop.
  absl::Status Start();
  // RESOURCE_EXHAUSTED at once when the queue is full; UNAVAILABLE while draining.
  absl::StatusOr<int64_t> Submit(ValidatedRequest request, std::shared_ptr<RequestSink> sink,
                                 absl::Time deadline = absl::InfiniteFuture());
  // The request ends with CANCELLED; its KV is released on both services next iteration.
  void Cancel(int64_t id);
  // New requests get UNAVAILABLE from now on; in-flight ones continue.
  void BeginDrain();
  bool draining() const;
  // True once nothing is queued or running (false on timeout).
  bool WaitIdle(absl::Duration timeout);
  // Ends the loop; whatever is left fails with UNAVAILABLE.
  void Stop();

  ModelLimits limits() const;
  bool draft_available() const;
  int64_t running() const;
  int64_t waiting() const;

 private:
  struct Request;
  using RequestPtr = std::shared_ptr<Request>;
  class Client;

  // One iteration of the loop, as named steps. What the steps hand each other.
  struct Iteration {
    absl::Time now;
    spec::LoopStep step;           // the loop's own record of the step
    std::vector<RequestPtr> ended;  // cancelled or expired
  };

  void Loop();
  void Iterate();
  // 0. The loop's prefix lookups (planned under the lock, the call without it).
  void LookupPrefixes(Iteration& it) ABSL_LOCKS_EXCLUDED(mu_);
  // 1. Cancelled / expired requests out of the queues (their KV is released first).
  void ExpireLocked(Iteration& it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // 2. The loop's Schedule (k per request, THE scheduler; admit and preempt) on the services'
  //    capacities.
  void ScheduleLocked(Iteration& it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // 3. The loop's Draft; a failing draft service is marked down (plain decoding until it is
  //    back).
  void RunDraftStep(Iteration& it);
  // 4. A failed target step: preempt, fail the step's requests, or wait for a restart.
  void HandleTargetError(Iteration& it, const absl::Status& status);
  // 5. The loop's Apply (tokens to the requests' streams: Client), then finished requests out.
  void ApplyResults(Iteration& it);
  void ObserveStepCost(const spec::LoopStep& step);
  void MaybeReconnectDraft();
  // `why` says what took it down (logged with the change).
  void SetDraftUp(bool up, absl::string_view why) ABSL_LOCKS_EXCLUDED(mu_);
  // One log line about a request: its client tag, router id, history length and `reason`.
  static void LogRequestEvent(services::LogLevel level, absl::string_view event,
                              const Request& r, absl::string_view reason);
  // Appends-to-be: the emitted tokens of one verification, streamed; how many are taken.
  // `batch`: the step's StepBatchLabel (services/common/metrics.h), for its draft counters.
  spec::Emission EmitTokens(Request& r, const sampling::VerifyResult& v, int32_t drafted,
                            const char* batch);
  // The chunks EmitTokens held back (RouterOptions::overlap_client_writes), to their sinks in
  // order. Runs while a step is awaited, and before anything that ends a request.
  void SendUnsentChunks();
  void Finish(const RequestPtr& r, absl::Status status);
  // Removes `r` from the queues; returns whether it held KV on the services.
  bool Remove(const RequestPtr& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailAll(const absl::Status& status);
  spec::SchedulerConfig SchedulerFor(bool draft_up) const;

  const RouterOptions options_;
  std::unique_ptr<TargetBackend> target_;
  std::unique_ptr<DraftBackend> draft_;
  const tok::Tokenizer& tokenizer_;
  services::Metrics* metrics_;
  iv1::ServiceInfo target_info_;
  // The loop's view of the services and the router's n-gram lookup; the drafters' slots in the
  // loop: the draft service's model (its cost curve from the draft's calibration) and the
  // n-gram lookup (free), each with its own KPolicy that learns its drafter's acceptance.
  RemoteTarget remote_target_;
  std::unique_ptr<RemoteDrafter> remote_draft_;
  std::unique_ptr<spec::NgramDrafter> ngram_;
  int32_t draft_slot_ = -1, ngram_slot_ = -1;

  mutable absl::Mutex mu_;
  // THE loop. Its queues are read by other threads (Submit, running()): the steps that change
  // them run under mu_, the service calls (Draft, Target, Apply, Release) without it.
  std::unique_ptr<spec::SpecLoop> loop_;
  absl::flat_hash_map<int64_t, RequestPtr> by_id_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool draft_up_ ABSL_GUARDED_BY(mu_) = false;
  int32_t draft_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  // What the draft service last said it is: SELF requests need the target's own first layers.
  enum class DraftKind { kUnknown, kSelf, kSeparate };
  DraftKind draft_kind_ ABSL_GUARDED_BY(mu_) = DraftKind::kUnknown;
  // Loop-thread state.
  struct UnsentChunk {
    std::shared_ptr<RequestSink> sink;
    specd::v1::GenerateStreamResponse chunk;
  };
  std::vector<UnsentChunk> unsent_;  // emitted, not yet handed to the sinks
  absl::Time draft_retry_at_ = absl::InfinitePast();
  absl::Time target_down_since_ = absl::InfiniteFuture();
  std::thread loop_thread_;
};

}  // namespace specd::router

#endif  // SPECD_SERVICES_ROUTER_ROUTER_ENGINE_H_
