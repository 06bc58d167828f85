// TargetBackend / DraftBackend over gRPC, with a per-call deadline.
#ifndef SPECD_SERVICES_ROUTER_GRPC_BACKENDS_H_
#define SPECD_SERVICES_ROUTER_GRPC_BACKENDS_H_

#include <memory>
#include <string>

#include "services/common/grpc_server.h"
#include "services/router/backends.h"
#include "specd/internal/v1/draft.grpc.pb.h"
#include "specd/internal/v1/target.grpc.pb.h"

namespace specd::router {

template <typename Stub, typename Base, typename StepReq, typename StepResp>
class GrpcBackend final : public Base {
 public:
  GrpcBackend(std::shared_ptr<grpc::Channel> channel, absl::Duration timeout)
      : stub_(Stub::NewStub(channel)), timeout_(timeout) {}

  absl::StatusOr<StepResp> Step(const StepReq& request) override {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    StepResp resp;
    grpc::Status s = stub_->Step(&ctx, request, &resp);
    if (!s.ok()) return services::ToAbsl(s);
    return resp;
  }
  absl::StatusOr<iv1::KvUsage> Release(const std::vector<int64_t>& ids) override {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    iv1::ReleaseRequest req;
    req.mutable_seq_ids()->Assign(ids.begin(), ids.end());
    iv1::ReleaseResponse resp;
    grpc::Status s = stub_->Release(&ctx, req, &resp);
    if (!s.ok()) return services::ToAbsl(s);
    return resp.kv();
  }
  absl::StatusOr<iv1::ServiceInfo> GetInfo() override {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    iv1::ServiceInfo info;
    grpc::Status s = stub_->GetInfo(&ctx, iv1::GetInfoRequest(), &info);
    if (!s.ok()) return services::ToAbsl(s);
    return info;
  }

 private:
  void SetDeadline(grpc::ClientContext& ctx) {
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  }
  std::unique_ptr<typename Stub::Stub> stub_;
  absl::Duration timeout_;
};

using GrpcTargetBackend = GrpcBackend<iv1::Target, TargetBackend, iv1::TargetStepRequest,
                                      iv1::TargetStepResponse>;
using GrpcDraftBackend = GrpcBackend<iv1::Draft, DraftBackend, iv1::DraftStepRequest,
                                     iv1::DraftStepResponse>;

}  // namespace specd::router

#endif  // SPECD_SERVICES_ROUTER_GRPC_BACKENDS_H_
