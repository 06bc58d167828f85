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
#include <thread>

#include "testing/tiny_model.h"
#include "gtest/gtest.h"

namespace specd::testing {

int FreeTcpPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  close(fd);
  return port;
}

Process::Process(std::vector<std::string> argv, std::string log_path) : log_(std::move(log_path)) {
  pid_ = fork();
  if (pid_ == 0) {
    const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
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

Cluster::Cluster(ClusterOptions o) : options(std::move(o)) {
  dir = std::filesystem::temp_directory_path() /
        ("specd_cluster_" + std::to_string(getpid()) + "_" + std::to_string(FreeTcpPort()));
  std::filesystem::create_directories(dir);
  target_model = dir + "/target.gguf";
  draft_model = dir + "/draft.gguf";
  TinyModelSpec spec;
  spec.seed = 31;
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
  router_stub_ = specd::v1::Generation::NewStub(
      grpc::CreateChannel(router_addr, grpc::InsecureChannelCredentials()));
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
  argv.insert(argv.end(), options.target_flags.begin(), options.target_flags.end());
  target = std::make_unique<Process>(argv, dir + "/target.log");
}

void Cluster::StartDraft() {
  draft = std::make_unique<Process>(
      std::vector<std::string>{Bin("specd-draft"), "--listen", draft_addr, "--model", draft_model,
                               "--threads", "1", "--kv-blocks", "512", "--max-batch-tokens",
                               "256", "--metrics-port", std::to_string(draft_metrics_port)},
      dir + "/draft.log");
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
  argv.insert(argv.end(), options.router_flags.begin(), options.router_flags.end());
  router_proc = std::make_unique<Process>(argv, dir + "/router.log");
}

int Cluster::Health(const std::string& address) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
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
  auto stub = specd::internal::v1::Target::NewStub(
      grpc::CreateChannel(target_addr, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  specd::internal::v1::ServiceInfo info;
  EXPECT_TRUE(stub->GetInfo(&ctx, {}, &info).ok());
  return info;
}

specd::internal::v1::ServiceInfo Cluster::DraftInfo() {
  auto stub = specd::internal::v1::Draft::NewStub(
      grpc::CreateChannel(draft_addr, grpc::InsecureChannelCredentials()));
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
