#include "services/common/grpc_server.h"

#include <pthread.h>
#include <signal.h>

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace specd::services {

void GrpcSettings::AddFlags(FlagSet& f) {
  f.Add("max-message-bytes", "SPECD_MAX_MESSAGE_BYTES", &max_message_bytes,
        "largest gRPC message sent or received");
  f.Add("keepalive-time-ms", "SPECD_KEEPALIVE_TIME_MS", &keepalive_time_ms,
        "HTTP/2 keepalive ping interval");
  f.Add("keepalive-timeout-ms", "SPECD_KEEPALIVE_TIMEOUT_MS", &keepalive_timeout_ms,
        "keepalive ping ack timeout");
  f.Add("max-concurrent-streams", "SPECD_MAX_CONCURRENT_STREAMS", &max_concurrent_streams,
        "HTTP/2 streams per connection");
}

absl::StatusOr<std::unique_ptr<grpc::Server>> StartServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    const GrpcSettings& s, int* bound_port) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder b;
  b.AddListeningPort(address, grpc::InsecureServerCredentials(), bound_port);
  for (grpc::Service* svc : services) b.RegisterService(svc);
  b.SetMaxReceiveMessageSize(s.max_message_bytes);
  b.SetMaxSendMessageSize(s.max_message_bytes);
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, s.keepalive_time_ms);
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, s.keepalive_timeout_ms);
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  b.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                       s.keepalive_time_ms / 2);
  b.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  b.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, s.max_concurrent_streams);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  if (server == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  return server;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const GrpcSettings& s) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(s.max_message_bytes);
  args.SetMaxSendMessageSize(s.max_message_bytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, s.keepalive_time_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, s.keepalive_timeout_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Reconnect quickly after a service restart (the default backoff grows to minutes).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForTermination() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int sig = 0;
  sigwait(&set, &sig);
  return sig;
}

absl::Status ToAbsl(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace specd::services
