#include "tests/integration/cluster_harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "testing/free_port.h"
#include "testing/tiny_model.h"
#include "gtest/gtest.h"

namespace specd::testing {

Process::Process(std::vector<std::string> argv, std::string log_path) : log_(std::move(log_path)) {
  pid_ = fork();
  if (pid_ == 0) {
    const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    setenv("SPECD_MUTEX_DEADLOCK_CHECKS", "1", /*overwrite=*/0);  // tests keep the checks
    execv(args[0], args.data());
    _exit(127);
  }
}

Process::~Process() {
  if (running()) {
    Signal(SIGKILL);
    Wait(10);
  }
}

void Process::Signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

bool Process::running() {
  if (pid_ <= 0 || status_ != -1) return false;
  int st = 0;
  if (waitpid(pid_, &st, WNOHANG) == pid_) {
    status_ = st;
    return false;
  }
  return true;
}

int Process::Wait(double timeout_s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (running()) {
    if (std::chrono::steady_clock::now() > until) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return status_;
}

namespace {
std::string Bin(const std::string& name) {
  const char* b = std::getenv("SPECD_BINARY_DIR");
  return std::string(b != nullptr ? b : ".") + "/services/" + name;
}
}  // namespace

bool TestPki::Make() {
  std::filesystem::create_directories(dir);
  const std::string log = dir + "/openssl.log";
  auto run = [&](const std::string& cmd) {
    return std::system(("cd '" + dir + "' && " + cmd + " >>openssl.log 2>&1").c_str()) == 0;
  };
  auto key_and_csr = [&](const std::string& name, const std::string& cn) {
    return run("openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout " +
               name + ".key -out " + name + ".csr -subj /CN=" + cn);
  };
  auto ca = [&](const std::string& name) {
    return run("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout " +
               name + ".key -out " + name + ".pem -days 2 -subj /CN=" + name);
  };
  // days < 0 puts notAfter in the past: an expired certificate.
  auto sign = [&](const std::string& name, const std::string& by, int days, bool server) {
    const std::string ext = name + ".ext";
    std::ofstream(dir + "/" + ext)
        << (server ? "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
                   : "extendedKeyUsage=clientAuth\n");
    return run("openssl x509 -req -in " + name + ".csr -CA " + by + ".pem -CAkey " + by +
               ".key -CAcreateserial -days " + std::to_string(days) + " -extfile " + ext +
               " -out " + name + ".pem");
  };
  return ca("internal_ca") && ca("public_ca") && ca("stranger_ca") &&
         key_and_csr("service", "localhost") && sign("service", "internal_ca", 2, true) &&
         key_and_csr("router_client", "specd-router") &&
         sign("router_client", "internal_ca", 2, false) &&
         key_and_csr("router_server", "localhost") &&
         sign("router_server", "public_ca", 2, true) &&
         key_and_csr("stranger_client", "specd-router") &&
         sign("stranger_client", "stranger_ca", 2, false) &&
         key_and_csr("expired_client", "specd-router") &&
         sign("expired_client", "internal_ca", -1, false) &&
         key_and_csr("intruder_client", "intruder") &&
         sign("intruder_client", "internal_ca", 2, false);
}

std::string TestPki::Read(const std::string& path) const {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::shared_ptr<grpc::ChannelCredentials> TestPki::Credentials(const std::string& ca,
                                                               const std::string& client) const {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = Read(Pem(ca));
  if (!client.empty()) {
    o.pem_cert_chain = Read(Pem(client));
    o.pem_private_key = Read(Key(client));
  }
  return grpc::SslCredentials(o);
}

std::shared_ptr<grpc::Channel> Cluster::Channel(const std::string& address) {
  if (!options.mtls) return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("localhost");
  const bool internal = address != router_addr;
  return grpc::CreateCustomChannel(
      address,
      internal ? pki.Credentials("internal_ca", "router_client") : pki.Credentials("public_ca", ""),
      args);
}

std::vector<std::string> Cluster::ServerTlsFlags(const std::string& cert, bool mutual) const {
  if (!options.mtls) return {};
  std::vector<std::string> f = {"--tls-cert", pki.Pem(cert), "--tls-key", pki.Key(cert)};
  if (mutual) {
    f.push_back("--tls-client-ca");
    f.push_back(pki.Pem("internal_ca"));
    f.push_back("--tls-client-names");
    f.push_back("specd-router");
  }
  return f;
}

Cluster::Cluster(ClusterOptions o) : options(std::move(o)) {
  dir = std::filesystem::temp_directory_path() /
        ("specd_cluster_" + std::to_string(getpid()) + "_" + std::to_string(FreeTcpPort()));
  std::filesystem::create_directories(dir);
  if (options.mtls) {
    pki.dir = dir + "/pki";
    EXPECT_TRUE(pki.Make()) << "openssl failed: see " << pki.dir << "/openssl.log";
  }
  target_model = dir + "/target.gguf";
  draft_model = dir + "/draft.gguf";
  TinyModelSpec spec;
  spec.seed = 31;
  if (options.target_model_spec) options.target_model_spec(spec);
  EXPECT_TRUE(WriteTinyModel(spec, target_model).ok());
  spec.seed = 32;
  if (options.draft_model_spec) options.draft_model_spec(spec);
  EXPECT_TRUE(WriteTinyModel(spec, draft_model).ok());
  target_addr = "unix:" + dir + "/target.sock";
  draft_addr = "unix:" + dir + "/draft.sock";
  router_port = FreeTcpPort();
  router_metrics_port = FreeTcpPort();
  router_http_port = FreeTcpPort();
  target_metrics_port = FreeTcpPort();
  draft_metrics_port = FreeTcpPort();
  router_addr = "127.0.0.1:" + std::to_string(router_port);
  StartTarget();
  if (options.with_draft) StartDraft();
  EXPECT_TRUE(WaitHealthy(target_addr, 30));
  if (options.with_draft) {
    EXPECT_TRUE(WaitHealthy(draft_addr, 30));
  }
  StartRouter();
  EXPECT_TRUE(WaitHealthy(router_addr, 30));
  router_stub_ = specd::v1::Generation::NewStub(Channel(router_addr));
}

Cluster::~Cluster() {
  router_proc.reset();
  draft.reset();
  target.reset();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

void Cluster::StartTarget() {
  std::vector<std::string> argv = {Bin("specd-target"), "--listen", target_addr, "--model",
                                   target_model, "--threads", "1", "--kv-blocks",
                                   std::to_string(options.target_kv_blocks),
                                   "--max-batch-tokens", "256", "--metrics-port",
                                   std::to_string(target_metrics_port)};
  for (const std::string& f : ServerTlsFlags("service", true)) argv.push_back(f);
  argv.insert(argv.end(), options.target_flags.begin(), options.target_flags.end());
  target = std::make_unique<Process>(argv, dir + "/target.log");
}

void Cluster::StartDraft() {
  std::vector<std::string> argv = {Bin("specd-draft"), "--listen", draft_addr, "--model",
                                   draft_model, "--threads", "1", "--kv-blocks", "512",
                                   "--max-batch-tokens", "256", "--metrics-port",
                                   std::to_string(draft_metrics_port)};
  for (const std::string& f : ServerTlsFlags("service", true)) argv.push_back(f);
  draft = std::make_unique<Process>(argv, dir + "/draft.log");
}

void Cluster::StartRouter() {
  std::vector<std::string> argv = {Bin("specd-router"), "--listen", router_addr, "--target",
                                   target_addr, "--model", target_model, "--metrics-port",
                                   std::to_string(router_metrics_port), "--max-batch-tokens",
                                   "256", "--target-down-timeout-s", "20", "--http-port",
                                   std::to_string(router_http_port), "--http-address",
                                   "127.0.0.1"};
  if (options.with_draft) {
    argv.push_back("--draft");
    argv.push_back(draft_addr);
  }
  for (const std::string& f : ServerTlsFlags("router_server", false)) argv.push_back(f);
  if (options.mtls) {
    for (const std::string& f :
         {std::string("--upstream-tls-ca"), pki.Pem("internal_ca"),
          std::string("--upstream-tls-cert"), pki.Pem("router_client"),
          std::string("--upstream-tls-key"), pki.Key("router_client"),
          std::string("--upstream-tls-server-name"), std::string("localhost")}) {
      argv.push_back(f);
    }
  }
  argv.insert(argv.end(), options.router_flags.begin(), options.router_flags.end());
  router_proc = std::make_unique<Process>(argv, dir + "/router.log");
}

int Cluster::Health(const std::string& address) {
  auto stub = grpc::health::v1::Health::NewStub(Channel(address));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  grpc::health::v1::HealthCheckResponse resp;
  if (!stub->Check(&ctx, {}, &resp).ok()) return -1;
  return resp.status();
}

bool Cluster::WaitHealthy(const std::string& address, double timeout_s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < until) {
    if (Health(address) == grpc::health::v1::HealthCheckResponse::SERVING) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

specd::internal::v1::ServiceInfo Cluster::TargetInfo() {
  auto stub = specd::internal::v1::Target::NewStub(Channel(target_addr));
  grpc::ClientContext ctx;
  specd::internal::v1::ServiceInfo info;
  EXPECT_TRUE(stub->GetInfo(&ctx, {}, &info).ok());
  return info;
}

specd::internal::v1::ServiceInfo Cluster::DraftInfo() {
  auto stub = specd::internal::v1::Draft::NewStub(Channel(draft_addr));
  grpc::ClientContext ctx;
  specd::internal::v1::ServiceInfo info;
  EXPECT_TRUE(stub->GetInfo(&ctx, {}, &info).ok());
  return info;
}

std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
  close(fd);
  return out;
}

std::string Cluster::RouterMetrics() { return HttpGet(router_metrics_port, "/metrics"); }
std::string Cluster::TargetMetrics() { return HttpGet(target_metrics_port, "/metrics"); }
std::string Cluster::DraftMetrics() { return HttpGet(draft_metrics_port, "/metrics"); }

}  // namespace specd::testing
