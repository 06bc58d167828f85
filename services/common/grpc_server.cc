#include "services/common/grpc_server.h"

#include <pthread.h>
#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "services/common/wire_parse.h"

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
  f.Add("tls-cert", "SPECD_TLS_CERT", &server_tls.cert,
        "PEM certificate this service presents (with --tls-key: TLS only, no plaintext)");
  f.Add("tls-key", "SPECD_TLS_KEY", &server_tls.key, "PEM private key of --tls-cert");
  f.Add("tls-client-ca", "SPECD_TLS_CLIENT_CA", &server_tls.ca,
        "PEM CA bundle: clients must present a certificate it signed (mutual TLS). Give the "
        "draft and target a CA that signs only the router's certificate");
  f.Add("tls-client-names", "SPECD_TLS_CLIENT_NAMES", &tls_client_names,
        "with --tls-client-ca: comma-separated names (CN or SAN) a client certificate must "
        "carry, e.g. specd-router (empty: any certificate the CA signed)");
}

void GrpcSettings::AddUpstreamFlags(FlagSet& f) {
  f.Add("upstream-tls-ca", "SPECD_UPSTREAM_TLS_CA", &upstream_tls.ca,
        "PEM CA bundle the draft's and target's certificates must chain to (set: TLS to them)");
  f.Add("upstream-tls-cert", "SPECD_UPSTREAM_TLS_CERT", &upstream_tls.cert,
        "PEM client certificate presented to the draft and target (mutual TLS)");
  f.Add("upstream-tls-key", "SPECD_UPSTREAM_TLS_KEY", &upstream_tls.key,
        "PEM private key of --upstream-tls-cert");
  f.Add("upstream-tls-server-name", "SPECD_UPSTREAM_TLS_SERVER_NAME", &upstream_server_name,
        "name the draft's and target's certificates carry, when it is not the address's host "
        "(unix sockets, IP addresses)");
}

namespace {

absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": cannot read ", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", path, " is not PEM"));
  }
  return text.str();
}

absl::Status LoadPair(const std::string& prefix, const TlsFiles& files, GrpcSettings::Pem* pem) {
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", prefix, "-cert and --", prefix,
                                                   "-key go together: set both or neither"));
  }
  if (!files.cert.empty()) {
    absl::StatusOr<std::string> cert = ReadPem(prefix + "-cert", files.cert);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPem(prefix + "-key", files.key);
    if (!key.ok()) return key.status();
    pem->cert = std::move(*cert);
    pem->key = std::move(*key);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status GrpcSettings::LoadTls() {
  server_pem = {};
  upstream_pem = {};
  if (absl::Status s = LoadPair("tls", server_tls, &server_pem); !s.ok()) return s;
  if (!server_tls.ca.empty()) {
    if (server_pem.cert.empty()) {
      return absl::InvalidArgumentError(
          "--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS first)");
    }
    absl::StatusOr<std::string> ca = ReadPem("tls-client-ca", server_tls.ca);
    if (!ca.ok()) return ca.status();
    server_pem.ca = std::move(*ca);
  } else if (!tls_client_names.empty()) {
    return absl::InvalidArgumentError("--tls-client-names needs --tls-client-ca");
  }
  if (absl::Status s = LoadPair("upstream-tls", upstream_tls, &upstream_pem); !s.ok()) return s;
  if (!upstream_tls.ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPem("upstream-tls-ca", upstream_tls.ca);
    if (!ca.ok()) return ca.status();
    upstream_pem.ca = std::move(*ca);
  } else if (!upstream_pem.cert.empty()) {
    return absl::InvalidArgumentError(
        "--upstream-tls-cert needs --upstream-tls-ca (the CA the services' certificates chain to)");
  }
  return absl::OkStatus();
}

namespace {

// Admits a call only when the (already verified) client certificate names an allowed client.
class ClientNameCheck final : public grpc::AuthMetadataProcessor {
 public:
  explicit ClientNameCheck(std::vector<std::string> names) : names_(std::move(names)) {}
  bool IsBlocking() const override { return false; }  // a few string compares
  grpc::Status Process(const InputMetadata&, grpc::AuthContext* context, OutputMetadata*,
                       OutputMetadata*) override {
    std::string seen;
    for (const char* property : {GRPC_X509_CN_PROPERTY_NAME, GRPC_X509_SAN_PROPERTY_NAME}) {
      for (const grpc::string_ref& value : context->FindPropertyValues(property)) {
        const std::string name(value.data(), value.size());
        for (const std::string& allowed : names_) {
          if (name == allowed) return grpc::Status::OK;
        }
        if (seen.empty()) seen = name;
      }
    }
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("client certificate \"", seen,
                                     "\" is not one this service admits (--tls-client-names)"));
  }

 private:
  std::vector<std::string> names_;
};

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const GrpcSettings::Pem& pem,
                                                           const std::string& client_names) {
  if (pem.cert.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions o(
      pem.ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                     : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = pem.ca;
  o.pem_key_cert_pairs.push_back({pem.key, pem.cert});
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::SslServerCredentials(o);
  if (!pem.ca.empty() && !client_names.empty()) {
    creds->SetAuthMetadataProcessor(std::make_shared<ClientNameCheck>(
        absl::StrSplit(client_names, ',', absl::SkipEmpty())));
  }
  return creds;
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const GrpcSettings::Pem& pem) {
  if (pem.ca.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = pem.ca;
  o.pem_private_key = pem.key;
  o.pem_cert_chain = pem.cert;
  return grpc::SslCredentials(o);
}

}  // namespace

absl::StatusOr<std::unique_ptr<grpc::Server>> StartServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    const GrpcSettings& s, int* bound_port) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder b;
  b.AddListeningPort(address, ServerCredentials(s.server_pem, s.tls_client_names), bound_port);
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

namespace {
// A side of a connection speaks TLS with `tls`, and presents or demands a client
// certificate with `mutual`.
const char* Transport(bool tls, bool mutual) {
  return !tls ? "plaintext" : mutual ? "mtls" : "tls";
}
}  // namespace

const char* TransportName(const GrpcSettings& s) {
  return Transport(!s.server_pem.cert.empty(), !s.server_pem.ca.empty());
}

const char* UpstreamTransportName(const GrpcSettings& s) {
  return Transport(!s.upstream_pem.ca.empty(), !s.upstream_pem.cert.empty());
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
  if (!s.upstream_server_name.empty()) {
    args.SetSslTargetNameOverride(s.upstream_server_name);
  }
  return grpc::CreateCustomChannel(address, ChannelCredentials(s.upstream_pem), args);
}

void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void PreferPollEngine() {
  // overwrite = 0: an operator's GRPC_POLL_STRATEGY wins.
  setenv("GRPC_POLL_STRATEGY", "poll", /*overwrite=*/0);
}

void SkipMutexDeadlockChecks() {
  const char* keep = std::getenv("SPECD_MUTEX_DEADLOCK_CHECKS");
  if (keep != nullptr && std::string(keep) == "1") return;
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
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

absl::Status ParseByteBuffer(const grpc::ByteBuffer& buffer, google::protobuf::Message* message) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (!buffer.Dump(&slices).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(message->GetDescriptor()->name(), ": unreadable payload"));
  }
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return ParseMessage(bytes, message);
}

grpc::ByteBuffer SerializeToByteBuffer(const google::protobuf::Message& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
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
