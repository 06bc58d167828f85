// main() of a worker service (specd-target, specd-draft): flags/env, model load, gRPC server
// with health + reflection, metrics, and SIGTERM handling (health NOT_SERVING, then in-flight
// calls get a grace period).
#ifndef SPECD_SERVICES_COMMON_WORKER_MAIN_H_
#define SPECD_SERVICES_COMMON_WORKER_MAIN_H_

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "engine/paged_kv_cache.h"
#include "services/common/event_log.h"
#include "services/common/flags.h"
#include "services/common/grpc_server.h"
#include "services/common/metrics.h"
#include "services/common/model_host.h"
#include "services/common/worker_service.h"

namespace specd::services {

template <typename Worker, typename Base, typename StepReq, typename StepResp>
int WorkerMain(int argc, char** argv, const std::string& component, const std::string& env) {
  BlockTerminationSignals();
  PreferPollEngine();
  SkipMutexDeadlockChecks();
  SetLogService(component);
  std::string listen = component == "target" ? "0.0.0.0:50052" : "0.0.0.0:50053";
  ModelHostOptions mo;
  int32_t metrics_port = 0;
  std::string metrics_address = "0.0.0.0";
  double grace_s = 10;
  bool calibrate = true;
  GrpcSettings grpc_settings;
  FlagSet flags("specd-" + component);
  flags.Add("listen", env + "_LISTEN", &listen, "address to serve on: host:port or unix:/path");
  flags.Add("model", env + "_MODEL", &mo.model_path, "GGUF model file");
  flags.Add("threads", env + "_THREADS", &mo.threads, "CPU threads (0 = all cores)");
  flags.Add("kv-blocks", env + "_KV_BLOCKS", &mo.kv_blocks, "KV cache blocks");
  flags.Add("kv-block-size", env + "_KV_BLOCK_SIZE", &mo.kv_block_size, "tokens per KV block");
  std::string kv_dtype = "f16";
  flags.Add("kv-dtype", env + "_KV_DTYPE", &kv_dtype,
            "KV cache storage: f16, bf16, f32 or int8 (half f16's bytes: twice the tokens in "
            "--kv-blocks' memory, a per-row scale, logits within the goldens' int8 tolerance); "
            "bf16 is bf16 attention (q, K, V and p rounded to bf16, AVX-512 BF16 dot products "
            "where the CPU has them): faster long-prompt prefill");
  flags.Add("max-batch-tokens", env + "_MAX_BATCH_TOKENS", &mo.max_batch_tokens,
            "most tokens one forward pass carries");
  flags.Add("borrow-from", env + "_BORROW_FROM", &mo.borrow_path,
            "a GGUF (the target) that supplies tensors the model file lacks: a distilled draft "
            "shares its target's token embeddings; the vocabularies must match");
  flags.Add("layers", env + "_LAYERS", &mo.num_layers,
            "run only the first N layers (self-speculation drafts); 0 = all");
  flags.Add("prefix-caching", env + "_PREFIX_CACHING", &mo.prefix_caching,
            "share the KV of repeated prompt prefixes between sequences (whole blocks, "
            "ref-counted, evicted least recently used when memory is needed)");
  flags.Add("world-size", env + "_WORLD_SIZE", &mo.world_size,
            "tensor-parallel ranks: threads of this process (--threads are split among them), "
            "or with --rendezvous one process per rank");
  flags.Add("rank", env + "_RANK", &mo.rank,
            "with --rendezvous: this process's rank; 0 serves gRPC and drives ranks 1..N-1, "
            "which only compute (no gRPC)");
  flags.Add("rendezvous", env + "_RENDEZVOUS", &mo.rendezvous,
            "host:port where rank 0 serves the rank processes' rendezvous (empty: thread ranks)");
  flags.Add("tp-bind-address", env + "_TP_BIND_ADDRESS", &mo.tp_bind_address,
            "address this rank's tensor-parallel connections bind, reachable by the other "
            "ranks (127.0.0.1 when they share a host or pod; else this pod's IP)");
  flags.Add("tp-timeout-s", env + "_TP_TIMEOUT_S", &mo.tp_timeout_s,
            "a collective slower than this breaks the group (the process exits non-zero)");
  flags.Add("device", env + "_DEVICE", &mo.device,
            "where the model runs: cpu, or cuda / cuda:N (a GPU: weights, KV cache and "
            "activations in its memory; needs a build with the CUDA toolkit)");
  flags.Add("metrics-port", env + "_METRICS_PORT", &metrics_port,
            "Prometheus /metrics HTTP port (0 = off)");
  flags.Add("metrics-address", env + "_METRICS_ADDRESS", &metrics_address,
            "address /metrics binds (127.0.0.1: this machine only)");
  flags.Add("drain-grace-s", env + "_DRAIN_GRACE_S", &grace_s,
            "seconds in-flight calls get after SIGTERM");
  flags.Add("calibrate", env + "_CALIBRATE", &calibrate,
            "time forwards at start-up and report the cost curve the router's adaptive k "
            "starts from (off: the router drafts only for requests with a fixed k)");
  std::string step_socket = "auto";
  flags.Add("step-socket", env + "_STEP_SOCKET", &step_socket,
            "unix socket a router on this host sends steps to instead of gRPC, past gRPC's thread "
            "hand-offs (no TLS: the file's permissions guard it): auto = the --listen path + "
            "\".step\" when --listen is unix:PATH and TLS is off; off = none");
  grpc_settings.AddFlags(flags);
  // A worker with settings of its own (the draft service's draft length) declares them.
  typename Worker::Options worker_options;
  Worker::Options::AddFlags(flags, env, &worker_options);
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) {
    if (s.code() == absl::StatusCode::kCancelled) return 0;
    std::fprintf(stderr, "specd-%s: %s\n%s", component.c_str(), std::string(s.message()).c_str(),
                 flags.Usage().c_str());
    return 2;
  }
  if (absl::Status s = worker_options.Check(); !s.ok()) {
    std::fprintf(stderr, "specd-%s: %s\n", component.c_str(), std::string(s.message()).c_str());
    return 2;
  }
  if (absl::StatusOr<kernels::KvDtype> dt = engine::ParseKvDtype(kv_dtype); dt.ok()) {
    mo.kv_dtype = *dt;
  } else {
    std::fprintf(stderr, "specd-%s: --kv-dtype: %s\n", component.c_str(),
                 std::string(dt.status().message()).c_str());
    return 2;
  }
  if (absl::Status s = grpc_settings.LoadTls(); !s.ok()) {
    std::fprintf(stderr, "specd-%s: %s\n", component.c_str(), std::string(s.message()).c_str());
    return 2;
  }
  // A group cannot go on without a rank: exit loudly, so that the pod restarts and the router
  // re-prefills on the new target (as for any target restart).
  mo.on_group_broken = [component](const std::string& reason) {
    LogEvent(LogLevel::kError, "group_broken", {{"reason", reason}});
    std::fprintf(stderr, "specd-%s: %s; exiting\n", component.c_str(), reason.c_str());
    std::fflush(stderr);
    std::_Exit(3);
  };
  if (mo.rank > 0) {
    LogEvent(LogLevel::kInfo, "rank_start",
             {{"rank", mo.rank}, {"world_size", mo.world_size}, {"rendezvous", mo.rendezvous}});
    if (absl::Status s = ModelHost::ServeRank(mo); !s.ok()) {
      std::fprintf(stderr, "specd-%s: rank %d: %s\n", component.c_str(), mo.rank,
                   s.ToString().c_str());
      return 1;
    }
    LogEvent(LogLevel::kInfo, "rank_stop", {{"rank", mo.rank}});
    return 0;
  }
  auto host = ModelHost::Load(mo);
  if (!host.ok()) {
    std::fprintf(stderr, "specd-%s: %s\n", component.c_str(), host.status().ToString().c_str());
    return 1;
  }
  auto worker = std::make_unique<Worker>(std::move(*host), worker_options);
  if (calibrate) {
    const auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = worker->Calibrate(); !s.ok()) {
      std::fprintf(stderr, "specd-%s: calibration: %s\n", component.c_str(), s.ToString().c_str());
      return 1;
    }
    LogEvent(LogLevel::kInfo, "calibrated",
             {{"seconds",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}});
  }
  Metrics metrics(MetricsRole::kService);
  if (absl::Status s = metrics.Serve(metrics_port, metrics_address); !s.ok()) {
    std::fprintf(stderr, "specd-%s: %s\n", component.c_str(), s.ToString().c_str());
    return 1;
  }
  WorkerService<Worker, Base, StepReq, StepResp> service(
      component, std::move(worker), &metrics);
  // The step socket before gRPC: a router's first GetInfo already finds it.
  std::unique_ptr<StepSocketServer> step_server;
  const bool tls = std::string(TransportName(grpc_settings)) != "plaintext";
  if (const std::string path = StepSocketPath(step_socket, listen, tls); !path.empty()) {
    auto started = StepSocketServer::Listen(
        path, grpc_settings.max_message_bytes,
        [&service](absl::string_view request) { return service.StepFromBytes(request); });
    if (started.ok()) {
      step_server = std::move(*started);
      service.SetStepSocket(path);
    } else {  // the steps still come over gRPC
      LogEvent(LogLevel::kWarn, "step_socket_unavailable",
               {{"reason", started.status().ToString()}});
    }
  }
  int port = 0;
  auto server = StartServer(listen, {&service}, grpc_settings, &port);
  if (!server.ok()) {
    std::fprintf(stderr, "specd-%s: %s\n", component.c_str(), server.status().ToString().c_str());
    return 1;
  }
  LogEvent(LogLevel::kInfo, "serving",
           {{"model", mo.model_path},
            {"listen", listen},
            {"port", port},
            {"transport", TransportName(grpc_settings)},
            {"step_socket", step_server ? step_server->path() : std::string("off")}});
  const int sig = WaitForTermination();
  LogEvent(LogLevel::kInfo, "drain_start", {{"signal", sig}, {"grace_s", grace_s}});
  (*server)->GetHealthCheckService()->SetServingStatus(false);
  // The step socket's connections end after their current step; then the gRPC streams.
  if (step_server) step_server->Stop();
  service.EndStreams();  // the router's stream would hold Shutdown for its whole grace
  (*server)->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000)));
  LogEvent(LogLevel::kInfo, "drain_end");
  return 0;
}

}  // namespace specd::services

#endif  // SPECD_SERVICES_COMMON_WORKER_MAIN_H_
