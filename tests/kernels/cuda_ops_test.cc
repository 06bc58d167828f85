// CUDA kernels against their reference twins. Needs a GPU: without one it prints NOT RUN and
// ctest reports it as skipped (label gpu), never as passed.
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/ref/ops.h"

namespace specd::kernels {
namespace {

TEST(CudaOpsTest, RmsNormMatchesReference) {
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "NOT RUN: no CUDA device";
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (int64_t T : {1, 3, 17}) {
    for (int64_t D : {1, 3, 15, 16, 17, 576, 4097}) {
      std::vector<float> x(T * D), w(D), ref_out(T * D), gpu_out(T * D);
      for (float& v : x) v = nd(rng);
      for (float& v : w) v = nd(rng);
      ref::RmsNorm(x.data(), T, D, w.data(), 1e-5f, ref_out.data());
      ASSERT_TRUE(cuda::RmsNormHost(x.data(), T, D, w.data(), 1e-5f, gpu_out.data()).ok());
      for (int64_t i = 0; i < T * D; ++i) {
        ASSERT_TRUE(std::isfinite(gpu_out[i]));
        EXPECT_NEAR(gpu_out[i], ref_out[i], 1e-4f * (1.0f + std::fabs(ref_out[i])));
      }
    }
  }
}

}  // namespace
}  // namespace specd::kernels
