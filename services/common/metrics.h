// Every Prometheus metric of the cluster, defined in this one file so names stay consistent:
// specd_<component>_<what>_<unit>. Each process owns one Metrics object for its role and
// serves only that role's families over HTTP (a worker exports no specd_router_* family);
// components only touch the members they need.
#ifndef SPECD_SERVICES_COMMON_METRICS_H_
#define SPECD_SERVICES_COMMON_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace specd::services {

enum class MetricsRole { kRouter, kService };

class Metrics {
 private:
  // First: the metric references below point into families they own. Both exist in every
  // process (so any member can be touched); only the role's registry is served.
  std::shared_ptr<prometheus::Registry> router_registry_, service_registry_;

 public:
  explicit Metrics(MetricsRole role = MetricsRole::kRouter);
  // Serves /metrics on address:port (port 0: not served).
  absl::Status Serve(int port, const std::string& address = "0.0.0.0");
  // The text exposition of the role's families (what /metrics returns).
  std::string Text() const;

  // --- router ---
  prometheus::Family<prometheus::Counter>& router_requests;          // {code}
  prometheus::Histogram& router_request_latency;
  prometheus::Histogram& router_ttft;
  prometheus::Histogram& router_itl;
  prometheus::Histogram& router_queue_time;
  prometheus::Gauge& router_running;
  prometheus::Gauge& router_waiting;
  prometheus::Gauge& router_queue_limit;  // --max-queue: the alert rules' saturation ratio
  prometheus::Histogram& router_batch_size;
  prometheus::Histogram& router_step_tokens;
  // The cost model and the step bound (SchedulerConfig::step_seconds_while_decoding), observable:
  prometheus::Gauge& router_step_bound;               // --step-ms-while-decoding, seconds (0: none)
  prometheus::Histogram& router_mixed_step_seconds;   // steps with prompt tokens and decode rows
  prometheus::Family<prometheus::Histogram>& router_cost_ratio;  // measured / predicted {stage}
  prometheus::Histogram& router_target_cost_ratio;    // {stage="target"}: a target step
  prometheus::Histogram& router_draft_cost_ratio;     // {stage="draft"}: a step's draft rounds
  prometheus::Counter& router_prompt_tokens;
  prometheus::Counter& router_generated_tokens;
  prometheus::Counter& router_preemptions;
  prometheus::Family<prometheus::Counter>& router_draft_proposed;    // {position, mode}
  prometheus::Family<prometheus::Counter>& router_draft_accepted;    // {position, mode}
  // The same tokens by the size of the step that verified them (`batch`: StepBatchLabel of its
  // emitting sequences): whether drafts are verified in full steps, where they cost the most.
  prometheus::Family<prometheus::Counter>& router_batch_draft_proposed;  // {batch}
  prometheus::Family<prometheus::Counter>& router_batch_draft_accepted;  // {batch}
  prometheus::Histogram& router_accepted_length;
  prometheus::Histogram& router_chosen_k;
  prometheus::Family<prometheus::Histogram>& router_rpc_latency;     // {hop}
  prometheus::Family<prometheus::Counter>& router_rpc_errors;        // {hop, code}
  prometheus::Gauge& router_draft_available;
  prometheus::Family<prometheus::Gauge>& router_kv_blocks;           // {service, state}
  prometheus::Family<prometheus::Counter>& router_http_responses;    // {status}

  // --- draft and target services ({component}) ---
  prometheus::Family<prometheus::Counter>& service_requests;         // {component, method, code}
  prometheus::Family<prometheus::Histogram>& service_step_latency;   // {component}
  prometheus::Family<prometheus::Histogram>& service_step_tokens;    // {component}
  prometheus::Family<prometheus::Gauge>& service_kv_blocks;          // {component, state}
  prometheus::Family<prometheus::Counter>& service_prefix_lookups;   // {component}
  prometheus::Family<prometheus::Counter>& service_prefix_tokens;    // {component, kind}
  prometheus::Family<prometheus::Gauge>& service_prefix_hit_rate;    // {component}
  prometheus::Family<prometheus::Counter>& service_prefix_evictions; // {component}

 private:
  const std::shared_ptr<prometheus::Registry>& served() const {
    return role_ == MetricsRole::kRouter ? router_registry_ : service_registry_;
  }
  MetricsRole role_;
  std::unique_ptr<prometheus::Exposer> exposer_;
};

// The `batch` label of the router_batch_draft_* families: a step's emitting sequences,
// bucketed as "1", "2", "3-4", "5-8", "9-16", "17-32" and "33+" (0 counts as "1").
const char* StepBatchLabel(int64_t sequences);

// Latency buckets in seconds (100 us .. 60 s) and count buckets (1 .. 1024).
const prometheus::Histogram::BucketBoundaries& LatencyBuckets();
const prometheus::Histogram::BucketBoundaries& CountBuckets();
const prometheus::Histogram::BucketBoundaries& StepSecondsBuckets();  // finer about 0.1 s
const prometheus::Histogram::BucketBoundaries& RatioBuckets();        // about 1

}  // namespace specd::services

#endif  // SPECD_SERVICES_COMMON_METRICS_H_
