// The draft and target services as the speculation loop (speculation/spec_loop.h) sees them: a
// spec::Drafter over the draft service's Step/Release and a spec::TargetExecutor over the target
// service's. Thin proto adapters with the router's RPC metrics; all logic stays in the loop.
#ifndef SPECD_SERVICES_ROUTER_REMOTE_BACKENDS_H_
#define SPECD_SERVICES_ROUTER_REMOTE_BACKENDS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "services/common/metrics.h"
#include "services/router/backends.h"
#include "speculation/drafter.h"
#include "speculation/target_step.h"

namespace specd::router {

// The RPC series a backend updates every step, looked up once: a step's bookkeeping is a few
// updates, not label maps built and hashed between an answer and the next request.
struct HopSeries {
  HopSeries(services::Metrics& m, const char* hop, const char* service);
  prometheus::Histogram& latency;
  prometheus::Gauge& kv_used;
  prometheus::Gauge& kv_free;
};

// The draft service. Remembers per sequence how many committed tokens the service surely holds
// (it was fed them in its last Step), so a Step sends only what is new; a service that lost a
// sequence answers needs_prefill and gets the whole history next time. It also mirrors the
// drafts the service fed after them, so CachedLength is what the service keeps once it rolls
// back to the committed tokens, as an in-process ModelDrafter's KV after its Commit: the
// adaptive-k policy prices the draft's catch-up from it. Loop thread only, but `available` may
// be read anywhere.
class RemoteDrafter final : public spec::Drafter {
 public:
  // Both must outlive this.
  RemoteDrafter(DraftBackend* backend, services::Metrics* metrics)
      : backend_(backend), metrics_(metrics), series_(*metrics, "draft", "draft") {}

  std::string_view name() const override { return "draft-service"; }
  // Any failure of the call comes back as is (the router then marks the service down).
  absl::Status Propose(absl::Span<const spec::DraftInput> in,
                       absl::Span<spec::DraftOutput> out) override;
  // The service rolls back itself at its next Step (start_pos says what is committed); here
  // only the mirror of what it will keep moves.
  absl::Status Commit(spec::SeqId seq, absl::Span<const int32_t> committed) override;
  void Release(spec::SeqId seq) override { ReleaseMany({seq}); }
  void ReleaseMany(absl::Span<const spec::SeqId> seqs) override;
  bool runs_model() const override { return true; }
  uint64_t weight_bytes() const override { return weight_bytes_; }
  int64_t CachedLength(spec::SeqId seq) const override;
  // A feature-conditioned draft service: the target's hidden states are kept here until the
  // sequence's next draft step carries them (DraftSequenceStep.features).
  bool wants_features() const override { return feature_dim_ > 0; }
  int32_t feature_dim() const override { return feature_dim_; }
  void AddFeatures(spec::SeqId seq, int32_t first_pos, absl::Span<const float> rows) override;

  void set_weight_bytes(uint64_t bytes) { weight_bytes_ = bytes; }
  void set_feature_dim(int32_t dim) { feature_dim_ = dim; }
  // While unavailable nothing is sent (Release included: a restarted service holds nothing).
  void set_available(bool up) { available_ = up; }
  // Work to run while a Step's answer is awaited (DraftBackend::StepOverlapping).
  void set_while_waiting(std::function<void()> hook) {
    while_waiting_ = hook ? std::move(hook) : [] {};
  }
  bool available() const { return available_; }

 private:
  DraftBackend* backend_;
  services::Metrics* metrics_;
  HopSeries series_;
  std::function<void()> while_waiting_ = [] {};
  uint64_t weight_bytes_ = 0;
  std::atomic<bool> available_{false};
  // Per sequence, what the service holds since its last Step.
  struct Held {
    int32_t committed = 0;         // the committed tokens it was fed (the next Step starts there)
    std::vector<int32_t> drafted;  // the drafts it fed after them: all proposals but the last
    int32_t kept = 0;              // the committed tokens it keeps: `committed`, then the drafts
                                   // the last Commit accepted
  };
  absl::flat_hash_map<spec::SeqId, Held> held_;
  std::atomic<int32_t> feature_dim_{0};
  struct PendingFeatures {
    int32_t start = 0;        // position of the first row
    std::vector<float> rows;  // [n, feature_dim]
  };
  absl::flat_hash_map<spec::SeqId, PendingFeatures> pending_features_;  // not yet sent
};

// The target service: one Step per loop iteration, verification on the service (dense logits
// never cross the wire).
class RemoteTarget final : public spec::TargetExecutor {
 public:
  // Both must outlive this.
  RemoteTarget(TargetBackend* backend, services::Metrics* metrics)
      : backend_(backend),
        metrics_(metrics),
        series_(*metrics, "target", "target"),
        lookup_latency_(metrics->router_rpc_latency.Add({{"hop", "target_lookup"}},
                                                        services::LatencyBuckets())),
        release_latency_(metrics->router_rpc_latency.Add({{"hop", "target_release"}},
                                                         services::LatencyBuckets())) {}
  absl::Status Run(absl::Span<const spec::TargetCall> calls,
                   std::vector<spec::TargetOutcome>& out) override;
  void Release(absl::Span<const spec::SeqId> seqs) override;
  // One step that carries only the lookups (TargetStepRequest.prefix_lookups).
  absl::Status LookupPrefixes(absl::Span<const spec::PrefixLookup> lookups,
                             std::vector<int32_t>& cached) override;
  int32_t adopted_blocks() const override { return adopted_blocks_.load(); }
  int32_t evictable_blocks() const override { return evictable_blocks_.load(); }
  // Work to run while a Step's answer is awaited (TargetBackend::StepOverlapping).
  void set_while_waiting(std::function<void()> hook) {
    while_waiting_ = hook ? std::move(hook) : [] {};
  }

 private:
  // One Target.Step: its latency under `hop`, errors counted, the KV usage recorded.
  absl::StatusOr<iv1::TargetStepResponse> CallStep(const iv1::TargetStepRequest& request,
                                                   prometheus::Histogram& latency);
  void Record(const iv1::KvUsage& kv);  // the router's gauges and the cache counts

  TargetBackend* backend_;
  services::Metrics* metrics_;
  HopSeries series_;
  prometheus::Histogram& lookup_latency_;
  prometheus::Histogram& release_latency_;
  std::function<void()> while_waiting_ = [] {};
  std::atomic<int32_t> adopted_blocks_{0};  // from the target's last answer
  std::atomic<int32_t> evictable_blocks_{0};
};

}  // namespace specd::router

#endif  // SPECD_SERVICES_ROUTER_REMOTE_BACKENDS_H_
