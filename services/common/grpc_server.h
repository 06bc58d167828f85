// gRPC plumbing shared by the three services: server/channel settings (message size,
// keepalive, concurrent streams), health + reflection, and SIGTERM/SIGINT handling.
#ifndef SPECD_SERVICES_COMMON_GRPC_SERVER_H_
#define SPECD_SERVICES_COMMON_GRPC_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/message.h"
#include "grpcpp/grpcpp.h"
#include "services/common/flags.h"

namespace specd::services {

// Certificate files (PEM) for one side of a TLS connection.
struct TlsFiles {
  std::string cert, key;  // this side's identity (both or neither)
  std::string ca;         // certificates the peer's must chain to
};

struct GrpcSettings {
  int32_t max_message_bytes = 64 << 20;
  int32_t keepalive_time_ms = 20000;
  int32_t keepalive_timeout_ms = 10000;
  int32_t max_concurrent_streams = 1024;
  // The server this process runs: with cert + key it speaks TLS only; with ca as well it
  // demands a client certificate that CA signed (mutual TLS). Nothing set: plaintext.
  TlsFiles server_tls;
  // With server_tls.ca: the client certificate must also carry one of these names (subject CN
  // or a SAN), comma-separated; empty: any certificate the CA signed.
  std::string tls_client_names;
  // Channels this process opens (the router's to the draft and target): with ca they speak
  // TLS and verify the service against it; cert + key are the client certificate mTLS asks
  // for. `upstream_server_name` is the name the services' certificates carry when it differs
  // from the address (a unix socket, an IP).
  TlsFiles upstream_tls;
  std::string upstream_server_name;

  // --tls-cert/--tls-key/--tls-client-ca (every service).
  void AddFlags(FlagSet& flags);
  // --upstream-tls-* (processes that call other services: the router).
  void AddUpstreamFlags(FlagSet& flags);
  // Reads the certificate files once, after flag parsing: INVALID_ARGUMENT naming the flag
  // when a file is missing or a pair is incomplete. StartServer and MakeChannel use what it read.
  absl::Status LoadTls();

  // What LoadTls read (empty: plaintext).
  struct Pem {
    std::string cert, key, ca;
  };
  Pem server_pem, upstream_pem;
};

// Builds and starts a server on `address` (host:port, or unix:/path) with the standard
// health service (serving) and server reflection, over TLS when `settings` has a server
// certificate. `bound_port` gets the TCP port (for :0).
absl::StatusOr<std::unique_ptr<grpc::Server>> StartServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    const GrpcSettings& settings, int* bound_port = nullptr);

// "plaintext", "tls" or "mtls": what StartServer listens with, and what MakeChannel dials.
const char* TransportName(const GrpcSettings& settings);
const char* UpstreamTransportName(const GrpcSettings& settings);

// A channel to another service: TLS (and the client certificate) per `upstream_tls`.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const GrpcSettings& settings);

// Blocks SIGTERM/SIGINT in the calling thread and every thread it starts later; call first
// thing in main. WaitForTermination then returns the signal that arrived.
void BlockTerminationSignals();

// Chooses gRPC's poll-based I/O engine unless GRPC_POLL_STRATEGY is set; call first thing in
// main, before anything starts gRPC. With the default epoll1 engine one thread at a time polls
// every connection of the process and hands each event to the thread waiting on that call's
// completion queue: the router's stepping thread, waiting on its step stream, was woken by a
// poller thread that had been woken by the target's answer (two sleeps per step where one
// does). With poll, the waiting thread polls its own connection (docs/DESIGN.md, the router
// hop). poll() scans a pollset's connections on every call: cheap for the services (one per
// router); for a router with thousands of client connections it is not measured yet, and
// GRPC_POLL_STRATEGY=epoll1 restores the default.
void PreferPollEngine();
// Turns off absl::Mutex's deadlock detection, which this absl build leaves on: every Lock
// records lock order in one process-wide graph under one process-wide lock (in a router's
// profile, GraphCycles was its costliest user-space function). SPECD_MUTEX_DEADLOCK_CHECKS=1
// keeps it (a service that hangs: it aborts with both lock orders); scripts/test.sh and the
// cluster test harness set it, so the services tests start keep the checks. Call first thing
// in main.
void SkipMutexDeadlockChecks();
int WaitForTermination();

// Raw (ByteBuffer) handlers, which parse requests themselves so a malformed payload gets
// INVALID_ARGUMENT naming the field (services/common/wire_parse.h) instead of gRPC's refusal.
absl::Status ParseByteBuffer(const grpc::ByteBuffer& buffer, google::protobuf::Message* message);
grpc::ByteBuffer SerializeToByteBuffer(const google::protobuf::Message& message);

absl::Status ToAbsl(const grpc::Status& s);
grpc::Status ToGrpc(const absl::Status& s);

}  // namespace specd::services

#endif  // SPECD_SERVICES_COMMON_GRPC_SERVER_H_
