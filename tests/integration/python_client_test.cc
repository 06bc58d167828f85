// Runs clients/python/test_client.py against a real cluster: proof that another language can
// call the public API, and that every service (router, target, draft) answers gRPC server
// reflection. The interpreter is $SPECD_PYTHON (scripts/test.sh points it at a venv with
// grpcio + grpcio-tools + grpcio-reflection); when that variable is set the test fails rather
// than skips if the packages are missing, so CI cannot pass without running it.
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace specd::testing {
namespace {

TEST(PythonClientTest, GenerateStreamTokenizeErrorsAndReflection) {
  const char* env_python = std::getenv("SPECD_PYTHON");
  const std::string python = env_python != nullptr ? env_python : "python3";
  const std::string probe =
      python + " -c 'import grpc, grpc_tools, grpc_reflection' >/dev/null 2>&1";
  if (std::system(probe.c_str()) != 0) {
    if (env_python != nullptr) {
      FAIL() << "SPECD_PYTHON=" << python << " lacks grpcio / grpcio-tools / grpcio-reflection";
    }
    GTEST_SKIP() << "NOT RUN: python3 has no grpcio / grpcio-tools / grpcio-reflection "
                    "(scripts/test.sh sets SPECD_PYTHON to a venv that has them)";
  }
  Cluster c;
  const char* src = std::getenv("SPECD_SOURCE_DIR");
  const std::string dir = std::string(src != nullptr ? src : "..") + "/clients/python";
  const std::string cmd = "cd " + dir + " && " + python + " test_client.py " + c.router_addr +
                          " --target " + c.target_addr + " --draft " + c.draft_addr;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

}  // namespace
}  // namespace specd::testing
