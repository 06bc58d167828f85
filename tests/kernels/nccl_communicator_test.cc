// engine::NcclCommunicator at world size 1 on one GPU (the rank-process path of a GPU target:
// rendezvous, NCCL init through the store, collectives on device buffers, the liveness line).
// Needs a GPU: without one it prints NOT RUN and ctest reports it as skipped (label gpu).
// Bad options are refused by name before any GPU is touched, so that part runs everywhere.
#include "engine/nccl_communicator.h"

#include <cuda_runtime.h>

#include <vector>

#include "gtest/gtest.h"
#include "testing/free_port.h"

namespace specd::engine {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(NcclCommunicatorTest, BadOptionsAreRefusedByName) {
  NcclOptions o;
  o.world_size = 2;
  o.rank = 5;
  o.rendezvous = "127.0.0.1:1";
  EXPECT_EQ(NcclCommunicator::Connect(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.rank = 0;
  o.rendezvous = "nowhere";
  auto c = NcclCommunicator::Connect(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("host:port"), std::string::npos);
}

TEST(NcclCommunicatorTest, WorldSizeOneOnTheDevice) {
  if (!HaveGpu()) GTEST_SKIP() << "NOT RUN: no CUDA device";
  NcclOptions o;
  o.rendezvous = "127.0.0.1:" + std::to_string(testing::FreeTcpPort());
  auto c = NcclCommunicator::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  for (int64_t n : {1, 577, 1 << 20}) {
    std::vector<float> host(n), back(n);
    for (int64_t i = 0; i < n; ++i) host[i] = 0.5f * static_cast<float>(i % 97) - 3.0f;
    float* dev = nullptr;
    ASSERT_EQ(cudaMalloc(&dev, n * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dev, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_TRUE((*c)->AllReduceSum(dev, n).ok());
    ASSERT_TRUE((*c)->Broadcast(dev, n * static_cast<int64_t>(sizeof(float)), 0).ok());
    ASSERT_EQ(cudaMemcpy(back.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(back, host) << "one rank: the sum is the input, bit for bit";
    cudaFree(dev);
  }
  EXPECT_EQ((*c)->Broadcast(nullptr, 4, 1).code(), absl::StatusCode::kInvalidArgument);
  (*c)->Disarm();
}

}  // namespace
}  // namespace specd::engine
