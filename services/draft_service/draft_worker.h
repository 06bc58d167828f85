// The draft service's logic without the network: a thin adapter from DraftStep protos to
// spec::ModelDrafter (THE model drafter, speculation/model_drafter.h) running on this
// service's ModelHost. Not thread-safe.
#ifndef SPECD_SERVICES_DRAFT_SERVICE_DRAFT_WORKER_H_
#define SPECD_SERVICES_DRAFT_SERVICE_DRAFT_WORKER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "speculation/adaptive_k.h"
#include "speculation/model_drafter.h"
#include "services/common/flags.h"
#include "services/common/model_host.h"
#include "specd/internal/v1/draft.pb.h"

namespace specd::services {

inline constexpr int32_t kMaxDraftTokens = 16;

// The draft service's own flags (WorkerMain declares them).
struct DraftWorkerOptions {
  // The draft length from the draft's confidence (spec::ModelDrafterOptions).
  double min_keep = spec::kDefaultMinKeep;
  double min_extend = spec::kDefaultMinExtend;
  // Context positions the calibration times a draft round at (spec::CalibrateDraft's
  // depth_keys; 0: the router's adaptive k does not price the draft's context).
  int32_t calibrate_depth = 1024;
  static void AddFlags(FlagSet& flags, const std::string& env, DraftWorkerOptions* o);
  absl::Status Check() const;  // INVALID_ARGUMENT naming the flag
};

class DraftWorker {
 public:
  using Options = DraftWorkerOptions;
  explicit DraftWorker(std::unique_ptr<ModelHost> host, Options options = {});

  absl::StatusOr<specd::internal::v1::DraftStepResponse> Step(
      const specd::internal::v1::DraftStepRequest& request);
  specd::internal::v1::ReleaseResponse Release(const specd::internal::v1::ReleaseRequest& request);
  // The host's info plus the draft-round cost curve once Calibrate ran.
  specd::internal::v1::ServiceInfo Info() const;
  // Times draft rounds (spec::CalibrateDraft) for Info's step_cost.
  absl::Status Calibrate();
  ModelHost& host() { return *host_; }
  const Options& options() const { return options_; }

 private:
  absl::Status Validate(const specd::internal::v1::DraftStepRequest& request) const;

  std::unique_ptr<ModelHost> host_;
  Options options_;
  std::unique_ptr<spec::ModelDrafter> drafter_;
  spec::CostCurve cost_;
};

}  // namespace specd::services

#endif  // SPECD_SERVICES_DRAFT_SERVICE_DRAFT_WORKER_H_
