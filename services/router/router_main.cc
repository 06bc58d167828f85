// specd-router: the public Generation API in front of specd-target and (optionally)
// specd-draft, and (with --http-port) the OpenAI-compatible HTTP API beside it. Configured by
// flags or SPECD_ROUTER_* variables.
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "google/protobuf/stubs/logging.h"
#include "common/gguf/gguf_file.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "services/common/event_log.h"
#include "services/common/flags.h"
#include "services/common/grpc_server.h"
#include "services/common/metrics.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "services/router/grpc_backends.h"
#include "services/router/http/http_server.h"
#include "services/router/http/openai_service.h"
#include "services/router/router_engine.h"
#include "services/router/router_service.h"

namespace specd::router {
namespace {

// Up to the hard limit: the default 1024 descriptors would cap concurrent HTTP clients.
void RaiseFileLimit() {
  rlimit l{};
  if (getrlimit(RLIMIT_NOFILE, &l) != 0 || l.rlim_cur >= l.rlim_max) return;
  l.rlim_cur = l.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &l) != 0) {
    std::fprintf(stderr, "specd-router: cannot raise the open-file limit\n");
  }
}

// The router is SERVING only while its target is: it probes the target's health every 500 ms
// and sets its own (every service name) to match, logging each change. Stops at drain: from
// then on the router is NOT_SERVING whatever the target says.
class TargetWatch {
 public:
  TargetWatch(std::shared_ptr<grpc::Channel> target, grpc::HealthCheckServiceInterface* health)
      : stub_(grpc::health::v1::Health::NewStub(std::move(target))), health_(health) {
    thread_ = std::thread([this] { Run(); });
  }
  ~TargetWatch() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  bool target_up() const { return up_; }

 private:
  void Run() {
    while (!stop_) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
      grpc::health::v1::HealthCheckResponse resp;
      const bool up = stub_->Check(&ctx, {}, &resp).ok() &&
                      resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
      if (up != up_ && !stop_) {
        up_ = up;
        health_->SetServingStatus(up);
        services::LogEvent(up ? services::LogLevel::kInfo : services::LogLevel::kWarn,
                           up ? "target_up" : "target_down",
                           {{"health", up ? "SERVING" : "NOT_SERVING"}});
      }
      for (int i = 0; i < 5 && !stop_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  std::unique_ptr<grpc::health::v1::Health::Stub> stub_;
  grpc::HealthCheckServiceInterface* health_;
  std::atomic<bool> up_{true}, stop_{false};
  std::thread thread_;
};

int Main(int argc, char** argv) {
  services::BlockTerminationSignals();
  services::PreferPollEngine();
  services::SkipMutexDeadlockChecks();
  services::SetLogService("router");
  // protobuf would log each invalid-UTF-8 payload on its own line; the refusal (with the
  // field) is logged as an event instead.
  google::protobuf::SetLogHandler(nullptr);
  std::string listen = "0.0.0.0:50051", target = "localhost:50052", draft, model;
  RouterOptions o;
  // 128 prompt tokens beside decode rows: on the 2-core CPU a 1,700-token prompt arriving
  // while 2 requests decode moved their ITL p99 from 293 to 127 ms for +6 % TTFT
  // (loadtest/long_prompt_ttft.sh, docs/PERFORMANCE.md).
  o.scheduler.prefill_tokens_while_decoding = 128;
  // And 100 ms a step by the target's cost curve: a token costs more the deeper its prompt
  // sits, so at 1,700 positions the 128-token cap alone let steps reach an ITL p99 of 125-143
  // ms; with both bounds it read 100-106 ms for the same TTFT (docs/PERFORMANCE.md).
  double step_ms_while_decoding = 100;
  int32_t metrics_port = 0, http_port = 0, http_threads = 2;
  std::string http_address = "0.0.0.0", served_model_name, api_keys_file,
              metrics_address = "0.0.0.0";
  int32_t http_max_body_bytes = 4 << 20;
  double step_timeout_s = 60, target_down_timeout_s = 30, drain_grace_s = 30, drain_linger_s = 5,
         startup_timeout_s = 300;
  bool step_streams = true;
  bool step_sockets = true;
  services::GrpcSettings gs;
  services::FlagSet f("specd-router");
  f.Add("listen", "SPECD_ROUTER_LISTEN", &listen, "address to serve on: host:port or unix:/path");
  f.Add("target", "SPECD_ROUTER_TARGET", &target, "specd-target address");
  f.Add("draft", "SPECD_ROUTER_DRAFT", &draft, "specd-draft address (empty: no draft)");
  f.Add("model", "SPECD_ROUTER_MODEL", &model,
        "GGUF file the tokenizer comes from (the target's model)");
  f.Add("max-batch-tokens", "SPECD_ROUTER_MAX_BATCH_TOKENS", &o.scheduler.max_batch_tokens,
        "target tokens per iteration (at most the target's --max-batch-tokens)");
  f.Add("prefill-tokens-while-decoding", "SPECD_ROUTER_PREFILL_TOKENS_WHILE_DECODING",
        &o.scheduler.prefill_tokens_while_decoding,
        "prompt tokens per iteration while other requests decode (0 = the whole budget): "
        "bounds their inter-token latency while a long prompt prefills");
  f.Add("step-ms-while-decoding", "SPECD_ROUTER_STEP_MS_WHILE_DECODING", &step_ms_while_decoding,
        "most milliseconds a step that carries decode rows should take by the target's cost "
        "curve (priced at each row's context): prompt chunks are cut to fit, at least one KV "
        "block a step (0 = no bound in time; the token bound above holds either way)");
  f.Add("max-running", "SPECD_ROUTER_MAX_RUNNING", &o.scheduler.max_running,
        "most sequences running at once");
  f.Add("max-queue", "SPECD_ROUTER_MAX_QUEUE", &o.scheduler.max_queue,
        "most requests waiting; beyond it RESOURCE_EXHAUSTED");
  f.Add("max-new-tokens-limit", "SPECD_ROUTER_MAX_NEW_TOKENS_LIMIT", &o.max_new_tokens_limit,
        "largest max_new_tokens accepted");
  f.Add("num-draft-tokens", "SPECD_ROUTER_NUM_DRAFT_TOKENS", &o.default_k,
        "draft tokens per step when the request does not say (0 = adaptive)");
  f.Add("lookup-min-match", "SPECD_ROUTER_LOOKUP_MIN_MATCH", &o.lookup_min_match,
        "speculation auto: the n-gram lookup drafts after matches of at least this many tokens, "
        "the draft model after shorter ones (>= 1)");
  f.Add("step-timeout-s", "SPECD_ROUTER_STEP_TIMEOUT_S", &step_timeout_s,
        "deadline of one step");
  f.Add("step-streams", "SPECD_ROUTER_STEP_STREAMS", &step_streams,
        "send steps over one long-lived stream per service (false: one unary call per step)");
  f.Add("step-sockets", "SPECD_ROUTER_STEP_SOCKETS", &step_sockets,
        "send steps over a service's unix step socket when it offers one (a service on this "
        "host; false: gRPC only)");
  f.Add("overlap-client-writes", "SPECD_ROUTER_OVERLAP_CLIENT_WRITES", &o.overlap_client_writes,
        "write a step's tokens to the clients while the next step runs (false: before it is "
        "sent)");
  f.Add("target-down-timeout-s", "SPECD_ROUTER_TARGET_DOWN_TIMEOUT_S", &target_down_timeout_s,
        "how long requests wait for an unavailable target before failing UNAVAILABLE");
  f.Add("drain-grace-s", "SPECD_ROUTER_DRAIN_GRACE_S", &drain_grace_s,
        "after SIGTERM, how long in-flight requests may finish");
  f.Add("drain-linger-s", "SPECD_ROUTER_DRAIN_LINGER_S", &drain_linger_s,
        "after the in-flight requests, how long the router keeps answering new calls "
        "UNAVAILABLE while they still come (it closes after 300 ms without one)");
  f.Add("startup-timeout-s", "SPECD_ROUTER_STARTUP_TIMEOUT_S", &startup_timeout_s,
        "how long to wait for the target at start");
  f.Add("metrics-port", "SPECD_ROUTER_METRICS_PORT", &metrics_port,
        "Prometheus /metrics HTTP port (0 = off)");
  f.Add("metrics-address", "SPECD_ROUTER_METRICS_ADDRESS", &metrics_address,
        "address /metrics binds (127.0.0.1: this machine only)");
  f.Add("http-port", "SPECD_ROUTER_HTTP_PORT", &http_port,
        "OpenAI-compatible HTTP API port (0 = off)");
  f.Add("http-address", "SPECD_ROUTER_HTTP_ADDRESS", &http_address, "address the HTTP API binds");
  f.Add("http-threads", "SPECD_ROUTER_HTTP_THREADS", &http_threads,
        "threads serving every HTTP connection (asynchronous: not one per connection)");
  f.Add("http-max-body-bytes", "SPECD_ROUTER_HTTP_MAX_BODY_BYTES", &http_max_body_bytes,
        "largest HTTP request body; larger is 413");
  f.Add("served-model-name", "SPECD_ROUTER_SERVED_MODEL_NAME", &served_model_name,
        "the model's name in the HTTP API (default: the model file's name without .gguf)");
  f.Add("api-keys-file", "SPECD_ROUTER_API_KEYS_FILE", &api_keys_file,
        "file of API keys, one a line: the public API (gRPC and HTTP) then needs "
        "'authorization: Bearer <key>' (empty: no keys)");
  gs.AddFlags(f);
  gs.AddUpstreamFlags(f);
  if (absl::Status s = f.Parse(argc, argv); !s.ok()) {
    if (s.code() == absl::StatusCode::kCancelled) return 0;
    std::fprintf(stderr, "specd-router: %s\n%s", std::string(s.message()).c_str(),
                 f.Usage().c_str());
    return 2;
  }
  if (absl::Status s = gs.LoadTls(); !s.ok()) {
    std::fprintf(stderr, "specd-router: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (model.empty()) {
    std::fprintf(stderr, "specd-router: --model (the target's GGUF, for the tokenizer) is required\n");
    return 2;
  }
  if (o.lookup_min_match < 1) {
    std::fprintf(stderr, "specd-router: --lookup-min-match must be >= 1, got %d\n",
                 o.lookup_min_match);
    return 2;
  }
  if (!(step_ms_while_decoding >= 0) || !std::isfinite(step_ms_while_decoding)) {
    std::fprintf(stderr, "specd-router: --step-ms-while-decoding must be >= 0 and finite, got %g\n",
                 step_ms_while_decoding);
    return 2;
  }
  o.scheduler.step_seconds_while_decoding = step_ms_while_decoding * 1e-3;
  o.target_down_timeout = absl::Seconds(target_down_timeout_s);
  ApiKeys keys;
  if (!api_keys_file.empty()) {
    absl::StatusOr<ApiKeys> k = ApiKeys::FromFile(api_keys_file);
    if (!k.ok()) {
      std::fprintf(stderr, "specd-router: %s\n", k.status().ToString().c_str());
      return 2;
    }
    keys = std::move(*k);
  }
  auto file = gguf::GgufFile::Open(model);
  if (!file.ok()) {
    std::fprintf(stderr, "specd-router: %s\n", file.status().ToString().c_str());
    return 1;
  }
  auto tokenizer = tok::Tokenizer::FromGguf(**file);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "specd-router: %s\n", tokenizer.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<tok::ChatTemplate> chat = tok::ChatTemplate::FromGguf(**file);
  services::Metrics metrics;
  if (absl::Status s = metrics.Serve(metrics_port, metrics_address); !s.ok()) {
    std::fprintf(stderr, "specd-router: %s\n", s.ToString().c_str());
    return 1;
  }
  const absl::Duration step_timeout = absl::Seconds(step_timeout_s);
  std::unique_ptr<DraftBackend> draft_backend;
  if (!draft.empty()) {
    draft_backend = std::make_unique<GrpcDraftBackend>(
        services::MakeChannel(draft, gs), step_timeout, step_streams, step_sockets,
        gs.max_message_bytes);
  }
  RouterEngine engine(o,
                      std::make_unique<GrpcTargetBackend>(services::MakeChannel(target, gs),
                                                          step_timeout, step_streams, step_sockets,
                                                          gs.max_message_bytes),
                      std::move(draft_backend), **tokenizer, &metrics);
  const absl::Time give_up = absl::Now() + absl::Seconds(startup_timeout_s);
  for (;;) {
    absl::Status s = engine.Start();
    if (s.ok()) break;
    if (s.code() != absl::StatusCode::kUnavailable || absl::Now() > give_up) {
      std::fprintf(stderr, "specd-router: %s\n", s.ToString().c_str());
      return 1;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  GenerationService service(&engine, tokenizer->get(), chat.ok() ? &*chat : nullptr,
                            std::filesystem::path(model).filename().string(), draft, &metrics);
  service.set_api_keys(&keys);
  int port = 0;
  auto server = services::StartServer(listen, {&service}, gs, &port);
  if (!server.ok()) {
    std::fprintf(stderr, "specd-router: %s\n", server.status().ToString().c_str());
    return 1;
  }
  services::LogEvent(services::LogLevel::kInfo, "serving",
                     {{"listen", listen},
                      {"port", port},
                      {"transport", services::TransportName(gs)},
                      {"target", target},
                      {"draft", draft.empty() ? "none" : draft},
                      {"upstream_transport", services::UpstreamTransportName(gs)},
                      {"api_keys", keys.enabled()}});
  TargetWatch watch(services::MakeChannel(target, gs), (*server)->GetHealthCheckService());
  if (served_model_name.empty()) served_model_name = std::filesystem::path(model).stem().string();
  http::OpenAiService openai(&engine, tokenizer->get(), chat.ok() ? &*chat : nullptr,
                             served_model_name, &metrics);
  openai.set_ready([&watch] { return watch.target_up(); });
  openai.set_api_keys(&keys);
  std::unique_ptr<http::HttpServer> http_server;
  if (http_port > 0) {
    RaiseFileLimit();  // every HTTP client holds a descriptor
    http::HttpServerOptions ho;
    ho.address = http_address;
    ho.port = http_port;
    ho.threads = http_threads;
    ho.max_body_bytes = http_max_body_bytes;
    absl::StatusOr<std::unique_ptr<http::HttpServer>> hs = http::HttpServer::Start(ho, &openai);
    if (!hs.ok()) {
      std::fprintf(stderr, "specd-router: %s\n", hs.status().ToString().c_str());
      return 1;
    }
    http_server = std::move(*hs);
    services::LogEvent(services::LogLevel::kInfo, "http_serving",
                       {{"address", http_address},
                        {"port", http_server->port()},
                        {"model", served_model_name}});
  }
  const int sig = services::WaitForTermination();
  services::LogEvent(services::LogLevel::kInfo, "drain_start",
                     {{"signal", sig}, {"grace_s", drain_grace_s}});
  // Refuse first (UNAVAILABLE from this instant), then stop probing the target, which may
  // take a probe's deadline.
  engine.BeginDrain();
  (*server)->GetHealthCheckService()->SetServingStatus(false);
  watch.Stop();
  (*server)->GetHealthCheckService()->SetServingStatus(false);  // a probe in flight may have
                                                                // set it back
  const bool idle = engine.WaitIdle(absl::Seconds(drain_grace_s));
  services::LogEvent(idle ? services::LogLevel::kInfo : services::LogLevel::kWarn, "drain_end",
                     {{"in_flight_finished", idle}});
  // Close only once calls have stopped coming, on gRPC and HTTP (each got UNAVAILABLE or 503
  // meanwhile), up to --drain-linger-s: a call that arrives as the listener closes is cut, not
  // answered.
  const absl::Time linger_until = absl::Now() + absl::Seconds(drain_linger_s);
  auto last_call = [&] {
    return http_server != nullptr ? std::max(service.last_call(), openai.last_request())
                                  : service.last_call();
  };
  while (absl::Now() < linger_until && absl::Now() - last_call() < absl::Milliseconds(300)) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  (*server)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (http_server != nullptr && !http_server->Drain(5)) {
    services::LogEvent(services::LogLevel::kWarn, "http_drain_incomplete",
                       {{"reason", "answers still unwritten after 5 s"}});
  }
  http_server.reset();
  engine.Stop();
  return 0;
}

}  // namespace
}  // namespace specd::router

int main(int argc, char** argv) { return specd::router::Main(argc, argv); }
