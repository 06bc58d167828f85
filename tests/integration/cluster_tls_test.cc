// TLS on every gRPC hop, with real processes and a PKI made in the test: the draft and target
// accept only clients holding a certificate from the internal CA that names the router, and
// refuse plaintext, no certificate, a certificate from another CA, an expired one and one
// with another name; the router's
// public API speaks TLS; speculation runs end to end over mutual TLS.
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace specd::testing {
namespace {

using grpc::health::v1::HealthCheckResponse;

// The health status `address` reports over `creds` (-1: the call failed).
int HealthOver(const std::string& address, std::shared_ptr<grpc::ChannelCredentials> creds) {
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("localhost");
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateCustomChannel(address, std::move(creds), args));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  HealthCheckResponse resp;
  if (!stub->Check(&ctx, {}, &resp).ok()) return -1;
  return resp.status();
}

std::string ReadLog(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(ClusterTlsTest, MutualTlsOnEveryHopRefusesStrangers) {
  ClusterOptions o;
  o.mtls = true;
  Cluster c(o);
  ASSERT_TRUE(c.WaitHealthy(c.router_addr, 30)) << ReadLog(c.dir + "/router.log");

  // End to end: the router drafts on the draft service and verifies on the target, over mTLS.
  specd::v1::GenerateRequest r;
  for (int i = 0; i < 10; ++i) r.mutable_tokens()->add_ids(3 + i * 7);
  r.mutable_sampling()->set_max_new_tokens(24);
  r.mutable_sampling()->set_ignore_eos(true);
  r.mutable_speculation()->set_mode(specd::v1::SPECULATION_MODE_DRAFT);
  r.mutable_speculation()->set_num_draft_tokens(3);
  grpc::ClientContext ctx;
  specd::v1::GenerateResponse resp;
  grpc::Status st = c.router().Generate(&ctx, r, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.token_ids_size(), 24);
  EXPECT_GT(resp.completion().speculation().draft_tokens(), 0) << "the draft hop was not used";

  const TestPki& pki = c.pki;
  for (const std::string& address : {c.target_addr, c.draft_addr}) {
    SCOPED_TRACE(address);
    EXPECT_EQ(HealthOver(address, grpc::InsecureChannelCredentials()), -1) << "plaintext";
    EXPECT_EQ(HealthOver(address, pki.Credentials("internal_ca", "")), -1) << "no certificate";
    EXPECT_EQ(HealthOver(address, pki.Credentials("internal_ca", "stranger_client")), -1)
        << "a client certificate from another CA";
    EXPECT_EQ(HealthOver(address, pki.Credentials("internal_ca", "expired_client")), -1)
        << "an expired client certificate";
    EXPECT_EQ(HealthOver(address, pki.Credentials("internal_ca", "intruder_client")), -1)
        << "a certificate from the right CA that does not name the router";
    EXPECT_EQ(HealthOver(address, pki.Credentials("internal_ca", "router_client")),
              HealthCheckResponse::SERVING)
        << "the router's certificate";
    // The client checks the service too: a service certificate the client's CA did not sign
    // is refused.
    EXPECT_EQ(HealthOver(address, pki.Credentials("stranger_ca", "router_client")), -1);
  }
  EXPECT_EQ(HealthOver(c.router_addr, grpc::InsecureChannelCredentials()), -1)
      << "the router's public API is TLS only";
  EXPECT_EQ(HealthOver(c.router_addr, pki.Credentials("public_ca", "")),
            HealthCheckResponse::SERVING);
  EXPECT_NE(ReadLog(c.dir + "/target.log").find("event=serving"), std::string::npos);
  EXPECT_NE(ReadLog(c.dir + "/target.log").find(" transport=mtls"), std::string::npos);
  EXPECT_NE(ReadLog(c.dir + "/draft.log").find(" transport=mtls"), std::string::npos);
  EXPECT_NE(ReadLog(c.dir + "/router.log").find(" transport=tls "), std::string::npos);
  EXPECT_NE(ReadLog(c.dir + "/router.log").find(" upstream_transport=mtls"), std::string::npos);
  // A service that speaks TLS takes no steps past it: no plaintext step socket.
  EXPECT_NE(ReadLog(c.dir + "/target.log").find(" step_socket=off"), std::string::npos);
  EXPECT_NE(ReadLog(c.dir + "/draft.log").find(" step_socket=off"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(c.target_addr.substr(5) + ".step"));
}

// `specd client health` over TLS: the Helm chart's probe when TLS is on (the kubelet's own
// gRPC probe cannot speak TLS). Exit 0 and SERVING with a certificate the service admits,
// non-zero with one it refuses or without TLS.
TEST(ClusterTlsTest, ClientHealthProbeSpeaksMutualTls) {
  ClusterOptions o;
  o.mtls = true;
  o.with_draft = false;
  Cluster c(o);
  ASSERT_TRUE(c.WaitHealthy(c.target_addr, 30)) << ReadLog(c.dir + "/target.log");
  const char* b = std::getenv("SPECD_BINARY_DIR");
  const std::string specd = std::string(b != nullptr ? b : ".") + "/tools/specd";
  const TestPki& pki = c.pki;
  auto probe = [&](const std::vector<std::string>& tls, const std::string& log) {
    std::vector<std::string> argv = {specd, "client", "health", "--server", c.target_addr,
                                     "--timeout", "5"};
    argv.insert(argv.end(), tls.begin(), tls.end());
    Process p(argv, c.dir + "/" + log);
    return p.Wait(30);
  };
  const int ok = probe({"--tls-ca", pki.Pem("internal_ca"), "--tls-cert",
                        pki.Pem("router_client"), "--tls-key", pki.Key("router_client"),
                        "--tls-server-name", "localhost"},
                       "probe_ok.log");
  EXPECT_TRUE(WIFEXITED(ok) && WEXITSTATUS(ok) == 0) << ReadLog(c.dir + "/probe_ok.log");
  EXPECT_NE(ReadLog(c.dir + "/probe_ok.log").find("SERVING"), std::string::npos);
  const int intruder = probe({"--tls-ca", pki.Pem("internal_ca"), "--tls-cert",
                              pki.Pem("intruder_client"), "--tls-key",
                              pki.Key("intruder_client"), "--tls-server-name", "localhost"},
                             "probe_intruder.log");
  EXPECT_TRUE(WIFEXITED(intruder) && WEXITSTATUS(intruder) != 0);
  const int plaintext = probe({}, "probe_plaintext.log");
  EXPECT_TRUE(WIFEXITED(plaintext) && WEXITSTATUS(plaintext) != 0);
  const int half = probe({"--tls-cert", pki.Pem("router_client")}, "probe_half.log");
  EXPECT_TRUE(WIFEXITED(half) && WEXITSTATUS(half) == 2);
  EXPECT_NE(ReadLog(c.dir + "/probe_half.log").find("--tls-ca"), std::string::npos);
}

// A half-configured TLS flag set is refused at start, naming the flag.
TEST(ClusterTlsTest, IncompleteTlsFlagsAreRefusedByName) {
  const std::string dir = ::testing::TempDir();
  const char* b = std::getenv("SPECD_BINARY_DIR");
  const std::string bin = std::string(b != nullptr ? b : ".") + "/services/";
  struct Case {
    std::vector<std::string> argv;
    std::string expect;
  };
  const std::string missing = dir + "/no_such_file.pem";
  const std::vector<Case> cases = {
      {{bin + "specd-target", "--tls-cert", missing}, "--tls-key"},
      {{bin + "specd-target", "--tls-client-names", "specd-router"}, "--tls-client-ca"},
      {{bin + "specd-draft", "--tls-cert", missing, "--tls-key", missing}, "--tls-cert"},
      {{bin + "specd-router", "--model", missing, "--upstream-tls-cert", missing,
        "--upstream-tls-key", missing},
       "--upstream-tls-cert"},
  };
  int i = 0;
  for (const Case& k : cases) {
    const std::string log = dir + "/tls_flags_" + std::to_string(i++) + ".log";
    Process p(k.argv, log);
    const int status = p.Wait(30);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << k.argv[0] << " " << status;
    EXPECT_NE(ReadLog(log).find(k.expect), std::string::npos) << ReadLog(log);
  }
}

}  // namespace
}  // namespace specd::testing
