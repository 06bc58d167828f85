// Runs clients/python/test_client.py against a real cluster (skipped when the Python grpcio /
// grpcio-tools packages are missing).
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace specd::testing {
namespace {

TEST(PythonClientTest, GenerateStreamTokenizeAndErrors) {
  if (std::system("python3 -c 'import grpc, grpc_tools' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 grpcio / grpcio-tools not installed (pip install grpcio grpcio-tools)";
  }
  Cluster c;
  const char* src = std::getenv("SPECD_SOURCE_DIR");
  const std::string dir = std::string(src != nullptr ? src : "..") + "/clients/python";
  const std::string cmd = "cd " + dir + " && python3 test_client.py " + c.router_addr;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

}  // namespace
}  // namespace specd::testing
