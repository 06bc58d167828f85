// The router's backends in one process, over the draft and target workers: what tests drive
// the whole router with (no network, faults injected) and what `specd-loadtest
// --in-process-model` measures the network's cost against. Not linked into specd-router.
#ifndef SPECD_SERVICES_INPROC_LOCAL_BACKENDS_H_
#define SPECD_SERVICES_INPROC_LOCAL_BACKENDS_H_

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/draft_service/draft_worker.h"
#include "services/router/backends.h"
#include "services/target_service/target_worker.h"

namespace specd::router {

// In-process: calls the worker under a lock. set_down(true) makes every call UNAVAILABLE
// (a dead service); CrashAfterSteps(n) does the same by itself once n more steps have run, so a
// test can crash a service mid-request however fast the model is; Replace swaps in a fresh
// worker (a restarted service).
template <typename Worker, typename Base, typename StepReq, typename StepResp>
class LocalBackend : public Base {
 public:
  explicit LocalBackend(std::unique_ptr<Worker> worker) : worker_(std::move(worker)) {}
  absl::StatusOr<StepResp> Step(const StepReq& request) override {
    absl::MutexLock l(&mu_);
    if (crash_at_step_ >= 0 && steps_ >= crash_at_step_) {
      down_ = true;
      crash_at_step_ = -1;
    }
    if (down_) return absl::UnavailableError("service down (injected)");
    ++steps_;
    return worker_->Step(request);
  }
  absl::StatusOr<iv1::KvUsage> Release(const std::vector<int64_t>& ids) override {
    absl::MutexLock l(&mu_);
    if (down_) return absl::UnavailableError("service down (injected)");
    iv1::ReleaseRequest r;
    r.mutable_seq_ids()->Assign(ids.begin(), ids.end());
    return worker_->Release(r).kv();
  }
  absl::StatusOr<iv1::ServiceInfo> GetInfo() override {
    absl::MutexLock l(&mu_);
    if (down_) return absl::UnavailableError("service down (injected)");
    return worker_->Info();
  }
  void set_down(bool down) {
    absl::MutexLock l(&mu_);
    down_ = down;
  }
  void CrashAfterSteps(int64_t n) {
    absl::MutexLock l(&mu_);
    crash_at_step_ = steps_ + n;
  }
  bool down() {
    absl::MutexLock l(&mu_);
    return down_;
  }
  void Replace(std::unique_ptr<Worker> worker) {
    absl::MutexLock l(&mu_);
    worker_ = std::move(worker);
  }
  iv1::ServiceInfo Info() {
    absl::MutexLock l(&mu_);
    return worker_->Info();
  }
  int64_t steps() {
    absl::MutexLock l(&mu_);
    return steps_;
  }

 private:
  absl::Mutex mu_;
  std::unique_ptr<Worker> worker_ ABSL_GUARDED_BY(mu_);
  bool down_ ABSL_GUARDED_BY(mu_) = false;
  int64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t crash_at_step_ ABSL_GUARDED_BY(mu_) = -1;  // -1: no crash armed
};

using LocalTargetBackend = LocalBackend<services::TargetWorker, TargetBackend,
                                        iv1::TargetStepRequest, iv1::TargetStepResponse>;
using LocalDraftBackend = LocalBackend<services::DraftWorker, DraftBackend,
                                       iv1::DraftStepRequest, iv1::DraftStepResponse>;

}  // namespace specd::router

#endif  // SPECD_SERVICES_INPROC_LOCAL_BACKENDS_H_
