// How the router reaches the draft and target services: an interface with a gRPC
// implementation (grpc_backends.h) and an in-process one over the workers
// (services/inproc/local_backends.h: tests and the load generator's no-network baseline).
#ifndef SPECD_SERVICES_ROUTER_BACKENDS_H_
#define SPECD_SERVICES_ROUTER_BACKENDS_H_

#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "specd/internal/v1/draft.pb.h"
#include "specd/internal/v1/target.pb.h"

namespace specd::router {

namespace iv1 = specd::internal::v1;

class TargetBackend {
 public:
  virtual ~TargetBackend() = default;
  virtual absl::StatusOr<iv1::TargetStepResponse> Step(const iv1::TargetStepRequest& request) = 0;
  // Step, running `while_waiting` once the request is on its way and before its answer is
  // awaited: work that overlaps the service's step (the router's writes to its clients). This
  // default runs it first, then the step (an in-process backend has no wait to fill).
  virtual absl::StatusOr<iv1::TargetStepResponse> StepOverlapping(
      const iv1::TargetStepRequest& request, absl::FunctionRef<void()> while_waiting) {
    while_waiting();
    return Step(request);
  }
  // The service's KV usage after the release (what the router's kv_blocks gauge shows).
  virtual absl::StatusOr<iv1::KvUsage> Release(const std::vector<int64_t>& ids) = 0;
  virtual absl::StatusOr<iv1::ServiceInfo> GetInfo() = 0;
};

class DraftBackend {
 public:
  virtual ~DraftBackend() = default;
  virtual absl::StatusOr<iv1::DraftStepResponse> Step(const iv1::DraftStepRequest& request) = 0;
  // Step, running `while_waiting` once the request is on its way and before its answer is
  // awaited: work that overlaps the service's step (the router's writes to its clients). This
  // default runs it first, then the step (an in-process backend has no wait to fill).
  virtual absl::StatusOr<iv1::DraftStepResponse> StepOverlapping(
      const iv1::DraftStepRequest& request, absl::FunctionRef<void()> while_waiting) {
    while_waiting();
    return Step(request);
  }
  // The service's KV usage after the release (what the router's kv_blocks gauge shows).
  virtual absl::StatusOr<iv1::KvUsage> Release(const std::vector<int64_t>& ids) = 0;
  virtual absl::StatusOr<iv1::ServiceInfo> GetInfo() = 0;
};

}  // namespace specd::router

#endif  // SPECD_SERVICES_ROUTER_BACKENDS_H_
