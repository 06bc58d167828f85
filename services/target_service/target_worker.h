// The target service's logic without the network: one Step is one ragged forward pass over
// prompt chunks and verification rows, then lossless verification (docs/DESIGN.md §2) per emitting
// sequence. Not thread-safe: the service serializes calls.
#ifndef SPECD_SERVICES_TARGET_SERVICE_TARGET_WORKER_H_
#define SPECD_SERVICES_TARGET_SERVICE_TARGET_WORKER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "speculation/adaptive_k.h"
#include "speculation/verify_step.h"
#include "services/common/flags.h"
#include "services/common/model_host.h"
#include "specd/internal/v1/target.pb.h"

namespace specd::services {

// The target service's own flags (WorkerMain declares them).
struct TargetWorkerOptions {
  // Context positions the calibration prices a step's rows at (spec::CalibrateVerify's
  // depth_keys; 0: the router's adaptive k does not price context).
  int32_t calibrate_depth = 1024;
  static void AddFlags(FlagSet& flags, const std::string& env, TargetWorkerOptions* o) {
    flags.Add("calibrate-depth", env + "_CALIBRATE_DEPTH", &o->calibrate_depth,
              "KV positions the start-up calibration times rows at, so that the router's "
              "adaptive k prices what context adds to a step (0: not priced)");
  }
  absl::Status Check() const {  // INVALID_ARGUMENT naming the flag
    if (calibrate_depth < 0) return absl::InvalidArgumentError("--calibrate-depth must be >= 0");
    return absl::OkStatus();
  }
};

class TargetWorker {
 public:
  using Options = TargetWorkerOptions;
  explicit TargetWorker(std::unique_ptr<ModelHost> host, Options options = {})
      : host_(std::move(host)), options_(options) {
    verify_options_.eos_token_ids.assign(host_->eos_ids().begin(), host_->eos_ids().end());
  }

  // INVALID_ARGUMENT for a malformed request (a router bug; nothing is changed),
  // RESOURCE_EXHAUSTED when the KV cache cannot hold the step (nothing is written).
  // A sequence whose tokens before start_pos this service does not hold comes back with
  // needs_prefill and is otherwise skipped.
  absl::StatusOr<specd::internal::v1::TargetStepResponse> Step(
      const specd::internal::v1::TargetStepRequest& request);
  specd::internal::v1::ReleaseResponse Release(const specd::internal::v1::ReleaseRequest& request);
  // The host's info plus the forward cost curve once Calibrate ran.
  specd::internal::v1::ServiceInfo Info() const;
  // Times forwards (spec::CalibrateVerify) for Info's step_cost.
  absl::Status Calibrate();
  ModelHost& host() { return *host_; }

 private:
  absl::Status Validate(const specd::internal::v1::TargetStepRequest& request) const;
  // The request's prefix lookups: how much of each the cache holds (nothing changes).
  void AnswerLookups(const specd::internal::v1::TargetStepRequest& request,
                     specd::internal::v1::TargetStepResponse& response) const;
  // A step's sequence with cached_prefix: (re)created holding it from the cache; false (and
  // nothing held) when the cache no longer has all of it; an error when a rank fails.
  absl::StatusOr<bool> TakeCachedPrefix(const specd::internal::v1::TargetSequenceStep& s);
  // Offers `seq`'s committed full blocks to the prefix cache after a step.
  absl::Status PublishCommitted(int64_t seq, absl::Span<const int32_t> history);
  // Step's parts (target_worker.cc): which sequences run, their calls, the results committed.
  struct StepCalls;
  absl::Status FindRunnable(const specd::internal::v1::TargetStepRequest& request,
                            specd::internal::v1::TargetStepResponse& response,
                            std::vector<int>& run);
  void BuildCalls(const specd::internal::v1::TargetStepRequest& request, StepCalls& step) const;
  absl::Status CommitResults(const specd::internal::v1::TargetStepRequest& request,
                             StepCalls& step, const std::vector<spec::TargetOutcome>& outcomes,
                             specd::internal::v1::TargetStepResponse& response);
  static void AddVerified(const sampling::VerifyResult& v,
                          specd::internal::v1::TargetSequenceResult& r);

  std::unique_ptr<ModelHost> host_;
  Options options_;
  spec::VerifyStepOptions verify_options_;
  spec::VerifyStepBuffers buffers_;  // THE verification path's batch and logits
  spec::CostCurve cost_;
};

}  // namespace specd::services

#endif  // SPECD_SERVICES_TARGET_SERVICE_TARGET_WORKER_H_
