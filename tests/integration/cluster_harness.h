// Starts real specd-target / specd-draft / specd-router processes on loopback (Unix sockets
// for the internal hops, a free TCP port for the router) over tiny generated models, for
// integration tests.
#ifndef SPECD_TESTS_INTEGRATION_CLUSTER_HARNESS_H_
#define SPECD_TESTS_INTEGRATION_CLUSTER_HARNESS_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "testing/free_port.h"
#include "testing/tiny_model.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "specd/internal/v1/draft.grpc.pb.h"
#include "specd/internal/v1/target.grpc.pb.h"
#include "specd/v1/generation.grpc.pb.h"

namespace specd::testing {


class Process {
 public:
  Process(std::vector<std::string> argv, std::string log_path);
  ~Process();
  pid_t pid() const { return pid_; }
  void Signal(int sig);
  // Exit status (as waitpid reports it) or -1 after `timeout_s`.
  int Wait(double timeout_s);
  bool running();
  const std::string& log_path() const { return log_; }

 private:
  pid_t pid_ = -1;
  int status_ = -1;
  std::string log_;
};

// A throwaway PKI made with the openssl command line in `dir`: an internal CA that signs the
// services' certificate (CN/SAN localhost) and the router's client certificate, a public CA
// for the router's own certificate, and for the refusal tests a stranger CA with a client
// certificate, plus from the internal CA an expired client certificate and a valid one named
// "intruder" (the services admit only the name specd-router). Files are
// <name>.pem / <name>.key.
struct TestPki {
  std::string dir;
  // False (with the openssl output in dir/openssl.log) when a command failed.
  bool Make();
  std::string Pem(const std::string& name) const { return dir + "/" + name + ".pem"; }
  std::string Key(const std::string& name) const { return dir + "/" + name + ".key"; }
  std::string Read(const std::string& path) const;
  // Channel credentials that trust `ca` and present `client` (empty: no client certificate).
  std::shared_ptr<grpc::ChannelCredentials> Credentials(const std::string& ca,
                                                        const std::string& client) const;
};

struct ClusterOptions {
  bool with_draft = true;
  // Every hop over TLS: the draft and target demand the router's client certificate (mutual
  // TLS), the router's public API speaks TLS. The harness's own channels present what each
  // hop needs (the router's client certificate for the internal services).
  bool mtls = false;
  std::vector<std::string> router_flags;   // extra flags
  std::vector<std::string> target_flags;
  int target_kv_blocks = 512;
  // Changes the draft's tiny model (otherwise the target's spec with another seed). Both
  // random models mostly repeat their input, so they agree almost always; e.g. a larger
  // weight_scale makes the draft's proposals get rejected part of the time.
  std::function<void(TinyModelSpec&)> draft_model_spec;
  // Changes the target's tiny model (the draft starts from the changed spec), e.g. a wider one
  // whose steps take long enough for a test to act while requests are in flight.
  std::function<void(TinyModelSpec&)> target_model_spec;
};

class Cluster {
 public:
  explicit Cluster(ClusterOptions options = {});
  ~Cluster();

  void StartTarget();
  void StartDraft();
  void StartRouter();
  // Waits until `address` answers health SERVING.
  bool WaitHealthy(const std::string& address, double timeout_s);
  // Health status of `address` (-1: no answer).
  int Health(const std::string& address);

  specd::v1::Generation::Stub& router() { return *router_stub_; }
  specd::internal::v1::ServiceInfo TargetInfo();
  specd::internal::v1::ServiceInfo DraftInfo();
  // GET /metrics of the router, the target and the draft.
  std::string RouterMetrics();
  std::string TargetMetrics();
  std::string DraftMetrics();

  std::string dir, target_model, draft_model, target_addr, draft_addr, router_addr;
  int router_port = 0, router_metrics_port = 0, target_metrics_port = 0, draft_metrics_port = 0;
  int router_http_port = 0;  // the router's OpenAI HTTP API (always on in tests)
  std::unique_ptr<Process> target, draft, router_proc;
  ClusterOptions options;
  TestPki pki;  // made when options.mtls

  // A channel to `address` as the harness talks to it (TLS where the cluster has it).
  std::shared_ptr<grpc::Channel> Channel(const std::string& address);

 private:
  std::vector<std::string> ServerTlsFlags(const std::string& cert, bool mutual) const;
  std::unique_ptr<specd::v1::Generation::Stub> router_stub_;
};

std::string HttpGet(int port, const std::string& path);

}  // namespace specd::testing

#endif  // SPECD_TESTS_INTEGRATION_CLUSTER_HARNESS_H_
