// gRPC plumbing shared by the three services: server/channel settings (message size,
// keepalive, concurrent streams), health + reflection, and SIGTERM/SIGINT handling.
#ifndef SPECD_SERVICES_COMMON_GRPC_SERVER_H_
#define SPECD_SERVICES_COMMON_GRPC_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "services/common/flags.h"

namespace specd::services {

struct GrpcSettings {
  int32_t max_message_bytes = 64 << 20;
  int32_t keepalive_time_ms = 20000;
  int32_t keepalive_timeout_ms = 10000;
  int32_t max_concurrent_streams = 1024;
  void AddFlags(FlagSet& flags);
};

// Builds and starts a server on `address` (host:port, or unix:/path) with the standard
// health service (serving) and server reflection. `bound_port` gets the TCP port (for :0).
absl::StatusOr<std::unique_ptr<grpc::Server>> StartServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    const GrpcSettings& settings, int* bound_port = nullptr);

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const GrpcSettings& settings);

// Blocks SIGTERM/SIGINT in the calling thread and every thread it starts later; call first
// thing in main. WaitForTermination then returns the signal that arrived.
void BlockTerminationSignals();
int WaitForTermination();

absl::Status ToAbsl(const grpc::Status& s);
grpc::Status ToGrpc(const absl::Status& s);

}  // namespace specd::services

#endif  // SPECD_SERVICES_COMMON_GRPC_SERVER_H_
