// The router's core without the network: request queue, the iteration loop that runs the
// scheduler and drives one draft Step + one target Step per iteration, streaming output with
// stop conditions, cancellation/deadlines, preemption and fault handling (draft down -> plain
// decoding; target unknown sequence or restart -> re-prefill from the token history).
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
#include "common/tokenizer/tokenizer.h"
#include "services/common/metrics.h"
#include "services/router/backends.h"
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
  // The adaptive-k policy's cost curves (spec::KPolicy). Empty: the services' own calibration
  // (GetInfo step_cost); a service that reports none gets no adaptive drafts.
  spec::CostCurve verify_cost, draft_cost;
  bool track_load = true;  // rescale the curves from measured step times
  int32_t max_new_tokens_limit = 4096;
  absl::Duration draft_retry = absl::Seconds(1);
  absl::Duration target_down_timeout = absl::Seconds(30);
  absl::Duration retry_backoff = absl::Milliseconds(20);
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

  // One iteration of the loop, as named steps. What the steps hand each other.
  struct Iteration {
    absl::Time now;
    bool draft_up = false;
    Schedule sched;
    absl::flat_hash_map<int64_t, RequestPtr> req_of;  // every planned request
    std::vector<RequestPtr> ended;                    // cancelled or expired
    std::vector<int64_t> release;                     // to release on the services first
    // The draft service's answers for this step (none when it failed or was not asked).
    iv1::DraftStepResponse draft_response;
    absl::flat_hash_map<int64_t, const iv1::DraftSequenceResult*> drafts;
    int32_t step_tokens = 0;
  };

  void Loop();
  void Iterate();
  // 1. Cancelled / expired requests out of the queues (their KV is released first).
  void ExpireLocked(Iteration& it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // 2. k per decoding request, then the scheduler on a snapshot; admit and preempt.
  void ScheduleLocked(Iteration& it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<int32_t> DecideKLocked(bool draft_up) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The one preemption routine: back to the head of the queue, KV dropped everywhere.
  void PreemptLocked(const RequestPtr& r, std::vector<int64_t>* release)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // 3. Draft service Step for the decode rows that want model drafts.
  void RunDraftStep(Iteration& it);
  // 4. The target Step: prompt chunks and [last, d1..dk] rows (n-gram drafts made here).
  iv1::TargetStepRequest BuildTargetStep(Iteration& it);
  // 5. A failed target step: preempt, fail the step's requests, or wait for a restart.
  void HandleTargetError(Iteration& it, const absl::Status& status, absl::Time t1);
  // 6. Emitted tokens to the requests, policy bookkeeping, finished requests out.
  void ApplyResults(Iteration& it, const iv1::TargetStepResponse& response);
  void MaybeReconnectDraft();
  spec::KPolicy& PolicyFor(const Request& r);
  int32_t KCap(const Request& r) const;
  // Appends the emitted tokens; returns true when the request finished.
  bool EmitTokens(Request& r, const iv1::TargetSequenceResult& result, int32_t drafted);
  void Finish(const RequestPtr& r, absl::Status status);
  void ReleaseOnServices(const std::vector<int64_t>& ids);
  // Removes `r` from running/waiting; returns whether it held KV on the services.
  bool Remove(const RequestPtr& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailAll(const absl::Status& status);

  const RouterOptions options_;
  std::unique_ptr<TargetBackend> target_;
  std::unique_ptr<DraftBackend> draft_;
  const tok::Tokenizer& tokenizer_;
  services::Metrics* metrics_;
  iv1::ServiceInfo target_info_;

  mutable absl::Mutex mu_;
  std::deque<RequestPtr> waiting_ ABSL_GUARDED_BY(mu_);
  std::vector<RequestPtr> running_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int64_t, RequestPtr> by_id_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool draft_up_ ABSL_GUARDED_BY(mu_) = false;
  int32_t draft_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  int32_t draft_context_ ABSL_GUARDED_BY(mu_) = 0;
  // What the draft service last said it is: SELF requests need the target's own first layers.
  enum class DraftKind { kUnknown, kSelf, kSeparate };
  DraftKind draft_kind_ ABSL_GUARDED_BY(mu_) = DraftKind::kUnknown;
  // Loop-thread state.
  // THE adaptive-k policy (speculation/k_policy.h), one instance per kind of drafter: the draft
  // service's model (its cost curve from the draft's calibration) and the router's own n-gram
  // lookup (free). Each learns its drafter's acceptance; a new unpinned request starts from it.
  spec::KPolicy draft_policy_, ngram_policy_;
  std::unique_ptr<spec::NgramDrafter> ngram_;
  absl::Time draft_retry_at_ = absl::InfinitePast();
  absl::Time target_down_since_ = absl::InfiniteFuture();
  std::thread loop_;
};

}  // namespace specd::router

#endif  // SPECD_SERVICES_ROUTER_ROUTER_ENGINE_H_
