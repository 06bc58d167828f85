// Exact-activation MatMul: fast CPU twin vs the double-precision reference, bitwise batch
// invariance, and the fast dequantizers bitwise equal to the reference dequantizer.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/gguf/ggml_type.h"
#include "common/gguf/quants.h"
#include "gtest/gtest.h"
#include "kernels/cpu/matmul_exact.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/ref/matmul_exact.h"
#include "kernels/ref/ops.h"

namespace specd::kernels {
namespace {

using gguf::GgmlType;

struct Weights {
  std::vector<uint8_t> bytes;
  WeightMatrix w;
};

Weights RandomWeights(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  Weights out;
  const uint64_t row_bytes = *gguf::RowBytes(type, cols);
  out.bytes.resize(row_bytes * rows);
  std::vector<float> row(cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = nd(rng);
    EXPECT_TRUE(gguf::QuantizeRow(type, row.data(), out.bytes.data() + r * row_bytes, cols).ok());
  }
  out.w = {type, out.bytes.data(), rows, cols, row_bytes};
  return out;
}

class MatMulExactTest : public ::testing::TestWithParam<GgmlType> {};

TEST_P(MatMulExactTest, FastMatchesReferenceAndIsBatchInvariant) {
  const GgmlType type = GetParam();
  cpu::ThreadPool pool(3);
  for (int64_t cols : {32, 96, 576}) {
    for (int64_t rows : {1, 3, 17, 64}) {
      Weights wt = RandomWeights(type, rows, cols, static_cast<uint32_t>(rows * 1000 + cols));
      const int64_t T = 5;
      std::vector<float> x(T * cols);
      std::mt19937 rng(7);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      for (float& v : x) v = nd(rng);
      std::vector<float> ref(T * rows), fast(T * rows);
      ref::MatMulExact(wt.w, x.data(), T, ref.data());
      cpu::MatMulExact(pool, wt.w, x.data(), T, fast.data());
      for (int64_t i = 0; i < T * rows; ++i) {
        ASSERT_TRUE(std::isfinite(fast[i]));
        // float32 accumulation vs double: bounded by n * eps * sum|w x|; 1e-4 relative is ample.
        EXPECT_NEAR(fast[i], ref[i], 1e-4 * (1.0 + std::fabs(ref[i]))) << "cols " << cols;
      }
      for (int64_t t = 0; t < T; ++t) {
        std::vector<float> one(rows);
        cpu::MatMulExact(pool, wt.w, x.data() + t * cols, 1, one.data());
        for (int64_t n = 0; n < rows; ++n) ASSERT_EQ(one[n], fast[t * rows + n]);
      }
    }
  }
}

// With x = a unit vector every dot product is a single exact term, so y[n] = W[n, k]: the fast
// dequantizers must reproduce the reference dequantization bit for bit.
TEST_P(MatMulExactTest, DequantizationIsBitwiseTheReference) {
  const GgmlType type = GetParam();
  cpu::ThreadPool pool(2);
  const int64_t rows = 8, cols = 64;
  Weights wt = RandomWeights(type, rows, cols, 99);
  std::vector<float> deq(cols);
  for (int64_t k : {0, 5, 16, 31, 32, 47, 63}) {
    std::vector<float> x(cols, 0.0f), y(rows);
    x[k] = 1.0f;
    cpu::MatMulExact(pool, wt.w, x.data(), 1, y.data());
    for (int64_t n = 0; n < rows; ++n) {
      ASSERT_TRUE(ref::DequantizeRow(type, wt.bytes.data() + n * wt.w.row_bytes, cols,
                                     deq.data()));
      ASSERT_EQ(y[n], deq[k]) << "row " << n << " col " << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, MatMulExactTest,
                         ::testing::Values(GgmlType::kQ4_1, GgmlType::kQ8_0, GgmlType::kQ4_0,
                                           GgmlType::kF16, GgmlType::kBF16, GgmlType::kF32));

}  // namespace
}  // namespace specd::kernels
