#include "services/common/metrics.h"

#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"

namespace specd::services {

namespace {
using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
}  // namespace

const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
      0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};
  return *b;
}

const prometheus::Histogram::BucketBoundaries& CountBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512, 1024};
  return *b;
}

// One target step: the step bound is tens of milliseconds.
const prometheus::Histogram::BucketBoundaries& StepSecondsBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.125, 0.15, 0.2, 0.3, 0.5, 1, 2.5};
  return *b;
}

const prometheus::Histogram::BucketBoundaries& RatioBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      0.25, 0.5, 0.67, 0.8, 0.9, 1, 1.1, 1.25, 1.5, 2, 4};
  return *b;
}

const char* StepBatchLabel(int64_t sequences) {
  if (sequences <= 1) return "1";
  if (sequences == 2) return "2";
  if (sequences <= 4) return "3-4";
  if (sequences <= 8) return "5-8";
  if (sequences <= 16) return "9-16";
  if (sequences <= 32) return "17-32";
  return "33+";
}

#define reg router_registry_
#define SPECD_HIST(name, help, buckets) \
  BuildHistogram().Name(name).Help(help).Register(*reg).Add({}, buckets)
#define SPECD_COUNTER(name, help) BuildCounter().Name(name).Help(help).Register(*reg).Add({})
#define SPECD_GAUGE(name, help) BuildGauge().Name(name).Help(help).Register(*reg).Add({})
Metrics::Metrics(MetricsRole role)
    : router_registry_(std::make_shared<prometheus::Registry>()),
      service_registry_(std::make_shared<prometheus::Registry>()),
      router_requests(BuildCounter()
                          .Name("specd_router_requests_total")
                          .Help("Finished public requests by gRPC status code")
                          .Register(*reg)),
      router_request_latency(SPECD_HIST("specd_router_request_latency_seconds",
                                        "Request accepted to finished", LatencyBuckets())),
      router_ttft(SPECD_HIST("specd_router_time_to_first_token_seconds",
                             "Request accepted to first token sent", LatencyBuckets())),
      router_itl(SPECD_HIST("specd_router_inter_token_latency_seconds",
                            "Time between tokens of one request", LatencyBuckets())),
      router_queue_time(SPECD_HIST("specd_router_queue_time_seconds",
                                   "Request accepted to first scheduled", LatencyBuckets())),
      router_running(SPECD_GAUGE("specd_router_running_sequences", "Sequences running")),
      router_waiting(SPECD_GAUGE("specd_router_waiting_requests", "Requests queued")),
      router_queue_limit(SPECD_GAUGE("specd_router_queue_limit",
                                     "Most requests that may wait (--max-queue)")),
      router_batch_size(SPECD_HIST("specd_router_batch_size_sequences",
                                   "Sequences in one target step", CountBuckets())),
      router_step_tokens(SPECD_HIST("specd_router_step_tokens", "Tokens in one target step",
                                    CountBuckets())),
      router_step_bound(SPECD_GAUGE("specd_router_step_bound_seconds",
                                    "Most predicted seconds of a target step that carries decoding "
                                    "sequences (--step-ms-while-decoding; 0: no bound)")),
      router_mixed_step_seconds(SPECD_HIST(
          "specd_router_mixed_step_seconds",
          "Target steps carrying prompt tokens and decoding sequences, as the router timed them "
          "(what --step-ms-while-decoding bounds)",
          StepSecondsBuckets())),
      router_cost_ratio(BuildHistogram()
                            .Name("specd_router_step_cost_ratio")
                            .Help("Seconds measured over the cost model's prediction, by stage "
                                  "(target: a target step; draft: a step's draft rounds). "
                                  "Adaptive k and the step bound decide on these predictions")
                            .Register(*reg)),
      router_target_cost_ratio(router_cost_ratio.Add({{"stage", "target"}}, RatioBuckets())),
      router_draft_cost_ratio(router_cost_ratio.Add({{"stage", "draft"}}, RatioBuckets())),
      router_prompt_tokens(SPECD_COUNTER("specd_router_prompt_tokens_total", "Prompt tokens")),
      router_generated_tokens(
          SPECD_COUNTER("specd_router_generated_tokens_total", "Generated tokens")),
      router_preemptions(
          SPECD_COUNTER("specd_router_preemptions_total", "Sequences preempted (recompute)")),
      router_draft_proposed(BuildCounter()
                                .Name("specd_router_draft_proposed_tokens_total")
                                .Help("Draft tokens proposed, by draft position and drafter (mode: draft, ngram)")
                                .Register(*reg)),
      router_draft_accepted(BuildCounter()
                                .Name("specd_router_draft_accepted_tokens_total")
                                .Help("Draft tokens accepted, by draft position")
                                .Register(*reg)),
      router_batch_draft_proposed(
          BuildCounter()
              .Name("specd_router_batch_draft_proposed_tokens_total")
              .Help("Draft tokens proposed, by the sequences emitting in their step (batch)")
              .Register(*reg)),
      router_batch_draft_accepted(
          BuildCounter()
              .Name("specd_router_batch_draft_accepted_tokens_total")
              .Help("Draft tokens accepted, by the sequences emitting in their step (batch)")
              .Register(*reg)),
      router_accepted_length(SPECD_HIST("specd_router_accepted_length_tokens",
                                        "Tokens emitted per verification step",
                                        CountBuckets())),
      router_chosen_k(SPECD_HIST("specd_router_chosen_k_tokens",
                                 "Draft tokens requested per sequence step", CountBuckets())),
      router_rpc_latency(BuildHistogram()
                             .Name("specd_router_rpc_latency_seconds")
                             .Help("Router to service RPC latency, by hop")
                             .Register(*reg)),
      router_rpc_errors(BuildCounter()
                            .Name("specd_router_rpc_errors_total")
                            .Help("Failed router to service RPCs, by hop and code")
                            .Register(*reg)),
      router_draft_available(
          SPECD_GAUGE("specd_router_draft_available", "1 while the draft service answers")),
      router_kv_blocks(BuildGauge()
                           .Name("specd_router_kv_blocks")
                           .Help("KV blocks as last reported by the services")
                           .Register(*reg)),
      router_http_responses(BuildCounter()
                                .Name("specd_router_http_responses_total")
                                .Help("OpenAI HTTP API answers, by HTTP status")
                                .Register(*reg)),
      service_requests(BuildCounter()
                           .Name("specd_service_requests_total")
                           .Help("Internal RPCs served, by component, method and code")
                           .Register(*service_registry_)),
      service_step_latency(BuildHistogram()
                               .Name("specd_service_step_latency_seconds")
                               .Help("Step execution time, by component")
                               .Register(*service_registry_)),
      service_step_tokens(BuildHistogram()
                              .Name("specd_service_step_tokens")
                              .Help("Tokens forwarded per step, by component")
                              .Register(*service_registry_)),
      service_kv_blocks(BuildGauge()
                            .Name("specd_service_kv_blocks")
                            .Help("KV cache blocks by component and state: used (by "
                                  "sequences), free (incl. evictable), cached (in the prefix "
                                  "cache), evictable (cached, unused), shared (adopted from it)")
                            .Register(*service_registry_)),
      service_prefix_lookups(BuildCounter()
                                 .Name("specd_service_prefix_cache_lookups_total")
                                 .Help("Sequences looked up in the prefix cache, by component")
                                 .Register(*service_registry_)),
      service_prefix_tokens(BuildCounter()
                                .Name("specd_service_prefix_cache_tokens_total")
                                .Help("Prompt tokens the lookups could have found (kind=queried, "
                                      "whole blocks) and found (kind=hit), by component")
                                .Register(*service_registry_)),
      service_prefix_hit_rate(BuildGauge()
                                  .Name("specd_service_prefix_cache_hit_rate")
                                  .Help("Hit tokens / queried tokens since start, by component")
                                  .Register(*service_registry_)),
      service_prefix_evictions(BuildCounter()
                                   .Name("specd_service_prefix_cache_evictions_total")
                                   .Help("Cached blocks evicted for new ones, by component")
                                   .Register(*service_registry_)),
      role_(role) {}
#undef reg
#undef SPECD_HIST
#undef SPECD_COUNTER
#undef SPECD_GAUGE

absl::Status Metrics::Serve(int port, const std::string& address) {
  if (port <= 0) return absl::OkStatus();
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(absl::StrCat(address, ":", port));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics on ", address, ":", port, ": ", e.what()));
  }
  exposer_->RegisterCollectable(served());
  return absl::OkStatus();
}

std::string Metrics::Text() const {
  prometheus::TextSerializer s;
  return s.Serialize(served()->Collect());
}

}  // namespace specd::services
