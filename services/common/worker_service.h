// The thin gRPC face of a worker (draft or target): Step, StepStream, Release and GetInfo on the
// callback API, serialized by one mutex (a step is one forward pass; the router sends one at a
// time). StepStream is the router's hot path: the same step per message of one long-lived
// stream, so an iteration costs no call set-up (docs/DESIGN.md, the router hop).
#ifndef SPECD_SERVICES_COMMON_WORKER_SERVICE_H_
#define SPECD_SERVICES_COMMON_WORKER_SERVICE_H_

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "absl/container/flat_hash_set.h"

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "services/common/grpc_server.h"
#include "services/common/metrics.h"
#include "services/common/step_socket.h"
#include "specd/internal/v1/common.pb.h"

namespace specd::services {

template <typename Worker, typename Base, typename StepReq, typename StepResp>
class WorkerService final : public Base {
 public:
  WorkerService(std::string component, std::unique_ptr<Worker> worker, Metrics* metrics)
      : component_(std::move(component)),
        worker_(std::move(worker)),
        metrics_(metrics),
        series_(*metrics, component_) {}

  grpc::ServerUnaryReactor* Step(grpc::CallbackServerContext* ctx, const StepReq* req,
                                 StepResp* resp) override {
    StepRecord rec;
    const absl::Status st = RunStep(*req, *resp, rec);
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(ToGrpc(st));
    RecordStep(rec);
    return r;
  }

  grpc::ServerBidiReactor<StepReq, StepResp>* StepStream(grpc::CallbackServerContext*) override {
    return new StepStreamReactor(this);
  }

  // Ends every open step stream once its current step is answered (the service is draining:
  // Server::Shutdown would otherwise wait out its grace for the router's idle stream). Streams
  // opened later are refused by the shutting-down server itself.
  void EndStreams() {
    absl::MutexLock l(&streams_mu_);
    draining_ = true;
    for (StepStreamReactor* s : streams_) s->End();
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
      resp->set_step_socket(step_socket_);
    }
    return Done(ctx, "GetInfo", absl::OkStatus());
  }

  // The step socket's handler (StepSocketServer): the same step as StepStream's, from and to
  // bytes; the metrics once the answer is written.
  StepSocketServer::Reply StepFromBytes(absl::string_view bytes) {
    StepSocketServer::Reply reply;
    StepReq req;
    if (!req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      reply.status = absl::InvalidArgumentError("StepRequest: the step socket's frame does not parse");
      Count("Step", reply.status);
      return reply;
    }
    StepResp resp;
    StepRecord rec;
    reply.status = RunStep(req, resp, rec);
    if (reply.status.ok()) resp.SerializeToString(&reply.response);
    reply.after = [this, rec] { RecordStep(rec); };
    return reply;
  }
  // Where GetInfo says the step socket is (empty: none).
  void SetStepSocket(std::string path) {
    absl::MutexLock l(&mu_);
    step_socket_ = std::move(path);
  }

 private:
  // What a step's histograms and request count record, once its response is on its way.
  struct StepRecord {
    double secs = 0;
    int64_t tokens = 0;
    absl::Status status;
  };

  // One step of either RPC: the worker under the lock, its KV gauges; `rec` for RecordStep.
  absl::Status RunStep(const StepReq& req, StepResp& resp, StepRecord& rec) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& s : req.sequences()) rec.tokens += s.tokens_size();
    {
      absl::MutexLock l(&mu_);
      auto r = worker_->Step(req);
      if (r.ok()) {
        resp = std::move(*r);
        Kv(resp.kv());
      }
      rec.status = r.status();
    }
    rec.secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return rec.status;
  }
  // After the response was handed to gRPC: the router's next step waits on that response, not
  // on this bookkeeping.
  void RecordStep(const StepRecord& rec) {
    series_.step_latency.Observe(rec.secs);
    series_.step_tokens.Observe(static_cast<double>(rec.tokens));
    if (rec.status.ok()) {
      series_.steps_ok.Increment();
    } else {
      Count("Step", rec.status);
    }
  }

  // Read a request, run the step, write its response, read the next: one at a time, in order.
  // A failed step finishes the stream with its status; the client's half-close finishes it OK.
  class StepStreamReactor final : public grpc::ServerBidiReactor<StepReq, StepResp> {
   public:
    explicit StepStreamReactor(WorkerService* service) : service_(service) {
      {
        absl::MutexLock l(&service_->streams_mu_);
        service_->streams_.insert(this);
        if (service_->draining_) ended_ = true;
      }
      if (ended_) {
        FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE, "service draining"));
        return;
      }
      this->StartRead(&request_);
    }
    void OnReadDone(bool ok) override {
      {
        absl::MutexLock l(&mu_);
        reading_ = false;
      }
      if (!ok) {  // the client closed its side, the stream broke, or End() finished it
        FinishOnce(grpc::Status::OK);
        return;
      }
      StepRecord rec;
      absl::Status st = service_->RunStep(request_, response_, rec);
      WorkerService* service = service_;  // this reactor may be gone once the write is started
      if (!st.ok()) {
        FinishOnce(ToGrpc(st));
        service->RecordStep(rec);
        return;
      }
      this->StartWrite(&response_);
      service->RecordStep(rec);
    }
    void OnWriteDone(bool ok) override {
      {
        absl::MutexLock l(&mu_);
        if (ok && !ended_) {
          reading_ = true;  // under mu_, so that End() sees either the read or ended_ first
          this->StartRead(&request_);
          return;
        }
      }
      FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              ok ? "service draining" : "step stream broken"));
    }
    void OnDone() override {
      {
        absl::MutexLock l(&service_->streams_mu_);
        service_->streams_.erase(this);
      }
      delete this;
    }
    // Draining: finish now if waiting for a request, else after this step's response.
    void End() {
      bool idle;
      {
        absl::MutexLock l(&mu_);
        ended_ = true;
        idle = reading_;
      }
      if (idle) FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE, "service draining"));
    }

   private:
    void FinishOnce(const grpc::Status& status) {
      {
        absl::MutexLock l(&mu_);
        if (finished_) return;
        finished_ = true;
        reading_ = false;
      }
      this->Finish(status);
    }

    WorkerService* service_;
    StepReq request_;
    StepResp response_;
    absl::Mutex mu_;
    bool reading_ ABSL_GUARDED_BY(mu_) = true;  // a read is outstanding (the stream is idle)
    bool ended_ ABSL_GUARDED_BY(mu_) = false;
    bool finished_ ABSL_GUARDED_BY(mu_) = false;
  };

  void Count(const char* method, const absl::Status& st) {
    metrics_->service_requests
        .Add({{"component", component_},
              {"method", method},
              {"code", absl::StatusCodeToString(st.code())}})
        .Increment();
  }

  grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const char* method,
                                 const absl::Status& st) {
    Count(method, st);
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(ToGrpc(st));
    return r;
  }
  void Kv(const specd::internal::v1::KvUsage& kv) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!kv_series_) kv_series_.emplace(*metrics_, component_);  // they appear with a value
    KvSeries& g = *kv_series_;
    g.used.Set(kv.used_blocks());
    g.free.Set(kv.free_blocks());
    g.cached.Set(kv.cached_blocks());
    g.evictable.Set(kv.evictable_blocks());
    g.shared.Set(kv.adopted_blocks());
    // The worker reports running totals; the counters move by what changed since the last.
    auto advance = [](prometheus::Counter& c, int64_t total, int64_t& seen) {
      if (total > seen) c.Increment(static_cast<double>(total - seen));
      seen = std::max(seen, total);
    };
    advance(g.prefix_lookups, kv.prefix_lookups(), seen_.lookups);
    advance(g.prefix_queried, kv.prefix_queried_tokens(), seen_.queried_tokens);
    advance(g.prefix_hit, kv.prefix_hit_tokens(), seen_.hit_tokens);
    advance(g.prefix_evictions, kv.prefix_evictions(), seen_.evictions);
    if (kv.prefix_queried_tokens() > 0) {
      if (hit_rate_ == nullptr) {  // the series appears once there is a rate to report
        hit_rate_ = &metrics_->service_prefix_hit_rate.Add({{"component", component_}});
      }
      hit_rate_->Set(static_cast<double>(kv.prefix_hit_tokens()) / kv.prefix_queried_tokens());
    }
  }
  // The series every step updates, looked up once: a step's bookkeeping is a few updates, not a
  // dozen label maps built and hashed on the way from the step to its response.
  struct StepSeries {
    StepSeries(Metrics& m, const std::string& c)
        : step_latency(m.service_step_latency.Add({{"component", c}}, LatencyBuckets())),
          step_tokens(m.service_step_tokens.Add({{"component", c}}, CountBuckets())),
          steps_ok(m.service_requests.Add({{"component", c}, {"method", "Step"}, {"code", "OK"}})) {}
    prometheus::Histogram& step_latency;
    prometheus::Histogram& step_tokens;
    prometheus::Counter& steps_ok;
  };
  struct KvSeries {
    KvSeries(Metrics& m, const std::string& c)
        : used(m.service_kv_blocks.Add({{"component", c}, {"state", "used"}})),
          free(m.service_kv_blocks.Add({{"component", c}, {"state", "free"}})),
          cached(m.service_kv_blocks.Add({{"component", c}, {"state", "cached"}})),
          evictable(m.service_kv_blocks.Add({{"component", c}, {"state", "evictable"}})),
          shared(m.service_kv_blocks.Add({{"component", c}, {"state", "shared"}})),
          prefix_lookups(m.service_prefix_lookups.Add({{"component", c}})),
          prefix_queried(m.service_prefix_tokens.Add({{"component", c}, {"kind", "queried"}})),
          prefix_hit(m.service_prefix_tokens.Add({{"component", c}, {"kind", "hit"}})),
          prefix_evictions(m.service_prefix_evictions.Add({{"component", c}})) {}
    prometheus::Gauge &used, &free, &cached, &evictable, &shared;
    prometheus::Counter &prefix_lookups, &prefix_queried, &prefix_hit, &prefix_evictions;
  };
  struct PrefixTotals {
    int64_t lookups = 0, queried_tokens = 0, hit_tokens = 0, evictions = 0;
  };

  const std::string component_;
  absl::Mutex mu_;
  std::unique_ptr<Worker> worker_ ABSL_GUARDED_BY(mu_);
  PrefixTotals seen_ ABSL_GUARDED_BY(mu_);  // the worker's totals the counters have counted
  std::string step_socket_ ABSL_GUARDED_BY(mu_);
  absl::Mutex streams_mu_;
  absl::flat_hash_set<StepStreamReactor*> streams_ ABSL_GUARDED_BY(streams_mu_);
  bool draining_ ABSL_GUARDED_BY(streams_mu_) = false;
  Metrics* metrics_;
  const StepSeries series_;
  std::optional<KvSeries> kv_series_ ABSL_GUARDED_BY(mu_);  // from the first KV report on
  prometheus::Gauge* hit_rate_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace specd::services

#endif  // SPECD_SERVICES_COMMON_WORKER_SERVICE_H_
