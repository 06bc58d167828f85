// The thin gRPC face of a worker (draft or target): Step, Release and GetInfo on the callback
// API, serialized by one mutex (a step is one forward pass; the router sends one at a time).
#ifndef SPECD_SERVICES_COMMON_WORKER_SERVICE_H_
#define SPECD_SERVICES_COMMON_WORKER_SERVICE_H_

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "services/common/grpc_server.h"
#include "services/common/metrics.h"
#include "specd/internal/v1/common.pb.h"

namespace specd::services {

template <typename Worker, typename Base, typename StepReq, typename StepResp>
class WorkerService final : public Base {
 public:
  WorkerService(std::string component, std::unique_ptr<Worker> worker, Metrics* metrics)
      : component_(std::move(component)), worker_(std::move(worker)), metrics_(metrics) {}

  grpc::ServerUnaryReactor* Step(grpc::CallbackServerContext* ctx, const StepReq* req,
                                 StepResp* resp) override {
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status st;
    int64_t tokens = 0;
    for (const auto& s : req->sequences()) tokens += s.tokens_size();
    {
      absl::MutexLock l(&mu_);
      auto r = worker_->Step(*req);
      if (r.ok()) {
        *resp = std::move(*r);
        Kv(resp->kv());
      }
      st = r.status();
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    metrics_->service_step_latency.Add({{"component", component_}}, LatencyBuckets()).Observe(secs);
    metrics_->service_step_tokens.Add({{"component", component_}}, CountBuckets()).Observe(tokens);
    return Done(ctx, "Step", st);
  }

  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx,
                                    const specd::internal::v1::ReleaseRequest* req,
                                    specd::internal::v1::ReleaseResponse* resp) override {
    {
      absl::MutexLock l(&mu_);
      *resp = worker_->Release(*req);
      Kv(resp->kv());
    }
    return Done(ctx, "Release", absl::OkStatus());
  }

  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* ctx,
                                    const specd::internal::v1::GetInfoRequest*,
                                    specd::internal::v1::ServiceInfo* resp) override {
    {
      absl::MutexLock l(&mu_);
      *resp = worker_->Info();
    }
    return Done(ctx, "GetInfo", absl::OkStatus());
  }

 private:
  grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const char* method,
                                 const absl::Status& st) {
    metrics_->service_requests
        .Add({{"component", component_},
              {"method", method},
              {"code", absl::StatusCodeToString(st.code())}})
        .Increment();
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(ToGrpc(st));
    return r;
  }
  void Kv(const specd::internal::v1::KvUsage& kv) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto blocks = [&](const char* state, int32_t n) {
      metrics_->service_kv_blocks.Add({{"component", component_}, {"state", state}}).Set(n);
    };
    blocks("used", kv.used_blocks());
    blocks("free", kv.free_blocks());
    blocks("cached", kv.cached_blocks());
    blocks("evictable", kv.evictable_blocks());
    blocks("shared", kv.adopted_blocks());
    // The worker reports running totals; the counters move by what changed since the last.
    auto advance = [](prometheus::Counter& c, int64_t total, int64_t& seen) {
      if (total > seen) c.Increment(static_cast<double>(total - seen));
      seen = std::max(seen, total);
    };
    advance(metrics_->service_prefix_lookups.Add({{"component", component_}}), kv.prefix_lookups(),
            seen_.lookups);
    advance(metrics_->service_prefix_tokens.Add({{"component", component_}, {"kind", "queried"}}),
            kv.prefix_queried_tokens(), seen_.queried_tokens);
    advance(metrics_->service_prefix_tokens.Add({{"component", component_}, {"kind", "hit"}}),
            kv.prefix_hit_tokens(), seen_.hit_tokens);
    advance(metrics_->service_prefix_evictions.Add({{"component", component_}}),
            kv.prefix_evictions(), seen_.evictions);
    if (kv.prefix_queried_tokens() > 0) {
      metrics_->service_prefix_hit_rate.Add({{"component", component_}})
          .Set(static_cast<double>(kv.prefix_hit_tokens()) / kv.prefix_queried_tokens());
    }
  }
  struct PrefixTotals {
    int64_t lookups = 0, queried_tokens = 0, hit_tokens = 0, evictions = 0;
  };

  const std::string component_;
  absl::Mutex mu_;
  std::unique_ptr<Worker> worker_ ABSL_GUARDED_BY(mu_);
  PrefixTotals seen_ ABSL_GUARDED_BY(mu_);  // the worker's totals the counters have counted
  Metrics* metrics_;
};

}  // namespace specd::services

#endif  // SPECD_SERVICES_COMMON_WORKER_SERVICE_H_
