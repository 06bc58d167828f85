// The draft service's logic without the network: catch every sequence up on its committed
// tokens (reusing whatever KV still matches), then propose k tokens autoregressively, batched
// across sequences, each with the sparse q it was drawn from. Not thread-safe.
#ifndef SPECD_SERVICES_DRAFT_DRAFT_WORKER_H_
#define SPECD_SERVICES_DRAFT_DRAFT_WORKER_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "services/common/model_host.h"
#include "specd/internal/v1/draft.pb.h"

namespace specd::services {

inline constexpr int32_t kMaxDraftTokens = 16;

class DraftWorker {
 public:
  explicit DraftWorker(std::unique_ptr<ModelHost> host) : host_(std::move(host)) {}

  absl::StatusOr<specd::internal::v1::DraftStepResponse> Step(
      const specd::internal::v1::DraftStepRequest& request);
  specd::internal::v1::ReleaseResponse Release(const specd::internal::v1::ReleaseRequest& request);
  specd::internal::v1::ServiceInfo Info() const { return host_->Info(); }
  ModelHost& host() { return *host_; }

 private:
  std::unique_ptr<ModelHost> host_;
  std::vector<float> logits_;
};

}  // namespace specd::services

#endif  // SPECD_SERVICES_DRAFT_DRAFT_WORKER_H_
