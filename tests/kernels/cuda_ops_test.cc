// CUDA kernels against their reference twins. Needs a GPU: without one it prints NOT RUN and
// ctest reports it as skipped (label gpu), never as passed.
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/ref/ops.h"
#include "tests/kernels/kv_pool.h"

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

#define SKIP_WITHOUT_DEVICE() \
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "NOT RUN: no CUDA device"

std::vector<float> Rand(std::mt19937& rng, int64_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

bool AllFinite(const std::vector<float>& v) {
  for (float x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

// A layer's residual add and the next norm in one launch: x and the normed rows bitwise
// AddInPlace's and RmsNorm's own launches, at widths that leave threads idle or loop.
TEST(CudaOpsTest, AddRmsNormIsBitwiseItsTwoLaunches) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(31);
  for (int64_t T : {1, 3, 17}) {
    for (int64_t D : {1, 15, 256, 576, 4097}) {
      const std::vector<float> x = Rand(rng, T * D, -4.0f, 4.0f), y = Rand(rng, T * D, -4.0f, 4.0f),
                               w = Rand(rng, D, -2.0f, 2.0f);
      std::vector<float> want_x = x, want_out(T * D), got_x = x, got_out(T * D, -1.0f);
      ASSERT_TRUE(cuda::AddInPlaceHost(want_x.data(), y.data(), T * D).ok());
      ASSERT_TRUE(cuda::RmsNormHost(want_x.data(), T, D, w.data(), 1e-5f, want_out.data()).ok());
      ASSERT_TRUE(cuda::AddRmsNormHost(got_x.data(), y.data(), T, D, w.data(), 1e-5f, got_out.data()).ok());
      ASSERT_TRUE(AllFinite(got_out));
      EXPECT_EQ(std::memcmp(want_x.data(), got_x.data(), want_x.size() * 4), 0) << "T " << T << " D " << D;
      EXPECT_EQ(std::memcmp(want_out.data(), got_out.data(), want_out.size() * 4), 0) << "T " << T << " D " << D;
    }
  }
}

// q and k rotated in one launch: each bitwise its own launch, with head counts and rope widths
// that leave a block's threads idle, both layouts, partial rotary dims.
TEST(CudaOpsTest, RopeOfQAndKInOneLaunchIsBitwiseTheirOwnLaunches) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(41);
  for (RopeLayout layout : {RopeLayout::kNormal, RopeLayout::kNeox}) {
    for (int32_t rope_dim : {64, 32}) {
      RopeParams p{};
      p.rope_dim = rope_dim;
      p.freq_base = 10000.0f;
      p.layout = layout;
      for (int64_t T : {1, 7, 33}) {
        const int32_t Hq = 9, Hk = 3, d = 64;
        std::vector<int32_t> pos(T);
        for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>((t * 977) % 8192);
        const std::vector<float> q = Rand(rng, T * Hq * d, -3.0f, 3.0f), k = Rand(rng, T * Hk * d, -3.0f, 3.0f);
        std::vector<float> want_q = q, want_k = k, got_q = q, got_k = k;
        ASSERT_TRUE(cuda::RopeHost(want_q.data(), T, Hq, d, pos.data(), p).ok());
        ASSERT_TRUE(cuda::RopeHost(want_k.data(), T, Hk, d, pos.data(), p).ok());
        ASSERT_TRUE(cuda::RopeQKHost(got_q.data(), Hq, got_k.data(), Hk, T, d, pos.data(), p).ok());
        EXPECT_EQ(std::memcmp(want_q.data(), got_q.data(), want_q.size() * 4), 0) << "T " << T << " rope " << rope_dim;
        EXPECT_EQ(std::memcmp(want_k.data(), got_k.data(), want_k.size() * 4), 0) << "T " << T << " rope " << rope_dim;
      }
    }
  }
}

TEST(CudaOpsTest, GatherRowsCopiesTheRequestedRows) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(3);
  for (int64_t D : {1, 63, 576}) {
    const int64_t rows_of_x = 37;
    const std::vector<float> x = Rand(rng, rows_of_x * D);
    const std::vector<int32_t> rows = {36, 0, 5, 5, 17};  // repeats and the last row
    std::vector<float> out(rows.size() * D, -1.0f);
    ASSERT_TRUE(cuda::GatherRowsHost(x.data(), rows_of_x, rows.data(), static_cast<int64_t>(rows.size()), D,
                                     out.data())
                    .ok());
    for (size_t r = 0; r < rows.size(); ++r) {
      for (int64_t i = 0; i < D; ++i) ASSERT_EQ(out[r * D + i], x[rows[r] * D + i]) << "D " << D << " row " << r;
    }
  }
  const int32_t bad = 37;
  std::vector<float> x(37), out(1);
  EXPECT_EQ(cuda::GatherRowsHost(x.data(), 37, &bad, 1, 1, out.data()).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaOpsTest, RopeMatchesReference) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(4);
  for (RopeLayout layout : {RopeLayout::kNormal, RopeLayout::kNeox}) {
    for (bool llama3 : {false, true}) {
      RopeParams p{64, 500000.0f, layout};
      p.llama3_scaling = llama3;
      p.factor = 8;
      const int64_t T = 5;
      const int32_t H = 3, hd = 72;  // rope_dim 64 of 72: the last 8 dims pass through
      const std::vector<int32_t> pos = {0, 1, 63, 4095, 8191};
      std::vector<float> x = Rand(rng, T * H * hd, -4.0f, 4.0f), want = x, got = x;
      ref::Rope(want.data(), T, H, hd, pos.data(), p);
      ASSERT_TRUE(cuda::RopeHost(got.data(), T, H, hd, pos.data(), p).ok());
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-6f * (1.0f + std::fabs(want[i]))) << "i=" << i;
      }
    }
  }
}

TEST(CudaOpsTest, ElementwiseOpsMatchReference) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(6);
  for (int64_t n : {1, 3, 255, 257, 1536 * 5}) {
    const std::vector<float> g = Rand(rng, n, -20.0f, 20.0f), u = Rand(rng, n);
    std::vector<float> want(n), got(n);
    ref::SwiGlu(g.data(), u.data(), 1, n, want.data());
    ASSERT_TRUE(cuda::SwiGluHost(g.data(), u.data(), 1, n, got.data()).ok());
    ASSERT_TRUE(AllFinite(got));
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(got[i], want[i], 2e-6f * std::fabs(want[i]) + 1e-7f);
    std::vector<float> a = Rand(rng, n), b = a;  // add and bias: exact
    ref::AddInPlace(a.data(), u.data(), n);
    ASSERT_TRUE(cuda::AddInPlaceHost(b.data(), u.data(), n).ok());
    ASSERT_EQ(a, b);
    ref::AddBias(a.data(), 1, n, u.data());
    ASSERT_TRUE(cuda::AddBiasHost(b.data(), 1, n, u.data()).ok());
    ASSERT_EQ(a, b);
  }
}

struct TypeInfo {
  gguf::GgmlType type;
  int block, bytes;
};
constexpr TypeInfo kCudaTypes[] = {{gguf::GgmlType::kF32, 1, 4},   {gguf::GgmlType::kF16, 1, 2},
                                   {gguf::GgmlType::kBF16, 1, 2},  {gguf::GgmlType::kQ8_0, 32, 34},
                                   {gguf::GgmlType::kQ4_0, 32, 18}, {gguf::GgmlType::kQ4_1, 32, 20}};

// A random but valid matrix of `ty` (finite f16 scales and mins), rows x cols, in `data`.
WeightMatrix MakeMatrix(std::mt19937& rng, TypeInfo ty, int64_t rows, int64_t cols, std::vector<uint8_t>* data) {
  const uint64_t row_bytes = static_cast<uint64_t>(cols / ty.block * ty.bytes);
  data->assign(rows * row_bytes, 0);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : *data) b = static_cast<uint8_t>(byte(rng));
  const std::vector<float> vals = Rand(rng, rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = data->data() + r * row_bytes;
    for (int64_t k = 0; k < cols; ++k) {
      const float f = vals[r * cols + k];
      uint16_t h = 0;
      switch (ty.type) {
        case gguf::GgmlType::kF32: std::memcpy(row + 4 * k, &f, 4); break;
        case gguf::GgmlType::kF16: h = ref::F32ToF16(f); std::memcpy(row + 2 * k, &h, 2); break;
        case gguf::GgmlType::kBF16: h = ref::F32ToBF16(f); std::memcpy(row + 2 * k, &h, 2); break;
        default:
          if (k % 32 == 0) {  // the block's f16 scale (and min)
            uint8_t* blk = row + (k / 32) * ty.bytes;
            h = ref::F32ToF16(0.01f * (0.5f + std::fabs(f)));
            std::memcpy(blk, &h, 2);
            if (ty.type == gguf::GgmlType::kQ4_1) {
              h = ref::F32ToF16(-0.02f * f);
              std::memcpy(blk + 2, &h, 2);
            }
          }
      }
    }
  }
  return WeightMatrix{ty.type, data->data(), rows, cols, row_bytes};
}

// Every type the CUDA lookup reads, against the reference's dequantization bit for bit; an id
// out of range is an error, not a crash.
TEST(CudaOpsTest, EmbeddingLookupIsBitwiseTheReference) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(7);
  for (TypeInfo ty : kCudaTypes) {
    std::vector<uint8_t> data;
    const WeightMatrix table = MakeMatrix(rng, ty, 40, 96, &data);
    const std::vector<int32_t> ids = {0, 39, 7, 7, 20};
    std::vector<float> want(ids.size() * 96), got(want.size());
    ref::EmbeddingLookup(table, ids.data(), static_cast<int64_t>(ids.size()), want.data());
    ASSERT_TRUE(cuda::EmbeddingLookupHost(table, ids.data(), static_cast<int64_t>(ids.size()), got.data()).ok());
    ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0) << static_cast<int>(ty.type);
    const int32_t bad = 40;
    EXPECT_FALSE(cuda::EmbeddingLookupHost(table, &bad, 1, got.data()).ok());
  }
}

// MatMul with the reference's arithmetic: bitwise its output for every type, odd row counts
// and token counts (each (row, token) alone: batch invariant by construction), and a clear
// error for the types not ported yet.
TEST(CudaOpsTest, MatMulIsBitwiseTheReference) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(10);
  for (TypeInfo ty : kCudaTypes) {
    for (int64_t rows : {1, 7, 33, 576}) {
      for (int64_t cols : {32, 96, 576}) {
        std::vector<uint8_t> data;
        const WeightMatrix w = MakeMatrix(rng, ty, rows, cols, &data);
        for (int64_t T : {1, 3, 5}) {
          const std::vector<float> x = Rand(rng, T * cols, -2.0f, 2.0f);
          std::vector<float> want(T * rows), got(T * rows, -1.0f);
          ref::MatMul(w, x.data(), T, want.data());
          ASSERT_TRUE(cuda::MatMulHost(w, x.data(), T, got.data()).ok());
          ASSERT_TRUE(AllFinite(got));
          ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0)
              << static_cast<int>(ty.type) << " rows " << rows << " cols " << cols << " T " << T;
        }
      }
    }
  }
  std::vector<uint8_t> q4k(144 * 2, 0);
  const WeightMatrix k_quant{gguf::GgmlType::kQ4_K, q4k.data(), 2, 256, 144};
  std::vector<float> x(256), y(2);
  EXPECT_EQ(cuda::MatMulHost(k_quant, x.data(), 1, y.data()).code(), absl::StatusCode::kUnimplemented);
}

// The forward's MatMul (a warp per row): within rounding of the reference, every token's row
// bitwise the same alone as in any batch (T past the 8 tokens of one pass included), odd
// row counts and lengths that leave lanes idle.
TEST(CudaOpsTest, WarpPerRowMatMulMatchesReferenceAndIsBatchInvariant) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(12);
  for (TypeInfo ty : kCudaTypes) {
    for (int64_t rows : {1, 5, 33, 576}) {
      for (int64_t cols : {32, 96, 1536}) {
        std::vector<uint8_t> data;
        const WeightMatrix w = MakeMatrix(rng, ty, rows, cols, &data);
        for (int64_t T : {1, 5, 9, 17}) {
          const std::vector<float> x = Rand(rng, T * cols, -2.0f, 2.0f);
          std::vector<float> want(T * rows), got(T * rows, -1.0f);
          ref::MatMul(w, x.data(), T, want.data());
          ASSERT_TRUE(cuda::MatMulHost(w, x.data(), T, got.data(), cuda::CudaMatMulKernel::kWarpPerRow).ok());
          ASSERT_TRUE(AllFinite(got));
          for (size_t i = 0; i < want.size(); ++i) {
            ASSERT_NEAR(got[i], want[i], 1e-3f * (1.0f + std::fabs(want[i])))
                << static_cast<int>(ty.type) << " rows " << rows << " cols " << cols << " T " << T << " i " << i;
          }
          for (int64_t t = 0; t < T; t += 4) {  // token t alone: bitwise its row of the batch
            std::vector<float> one(rows);
            ASSERT_TRUE(cuda::MatMulHost(w, x.data() + t * cols, 1, one.data(), cuda::CudaMatMulKernel::kWarpPerRow)
                            .ok());
            ASSERT_EQ(std::memcmp(one.data(), got.data() + t * rows, rows * 4), 0)
                << static_cast<int>(ty.type) << " rows " << rows << " cols " << cols << " T " << T << " t " << t;
          }
        }
      }
    }
  }
}

// q, k, v (gate, up) in one launch: every matrix's rows bitwise its own warp-kernel launch,
// with row counts that leave a thread block's warps idle and T past one 8-token pass.
TEST(CudaOpsTest, SharedMatMulsInOneLaunchAreBitwiseTheirOwnLaunches) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(21);
  for (TypeInfo ty : kCudaTypes) {
    if (ty.type != gguf::GgmlType::kQ8_0 && ty.type != gguf::GgmlType::kQ4_0 && ty.type != gguf::GgmlType::kQ4_1) {
      continue;
    }
    const int64_t cols = 576;
    const std::vector<int64_t> rows = {576, 193, 5, 64};
    std::vector<std::vector<uint8_t>> data(rows.size());
    std::vector<WeightMatrix> ws;
    for (size_t i = 0; i < rows.size(); ++i) ws.push_back(MakeMatrix(rng, ty, rows[i], cols, &data[i]));
    for (int n : {1, 3, 4}) {
      for (int64_t T : {1, 5, 9, 17}) {
        const std::vector<float> x = Rand(rng, T * cols, -2.0f, 2.0f);
        std::vector<std::vector<float>> got(n);
        std::vector<float*> ys;
        for (int i = 0; i < n; ++i) {
          got[i].assign(T * rows[i], -1.0f);
          ys.push_back(got[i].data());
        }
        ASSERT_TRUE(cuda::MatMulSharedHost(ws.data(), n, x.data(), T, ys.data()).ok());
        for (int i = 0; i < n; ++i) {
          std::vector<float> want(T * rows[i]);
          ASSERT_TRUE(cuda::MatMulHost(ws[i], x.data(), T, want.data(), cuda::CudaMatMulKernel::kWarpPerRow).ok());
          ASSERT_EQ(std::memcmp(want.data(), got[i].data(), want.size() * 4), 0)
              << static_cast<int>(ty.type) << " n " << n << " matrix " << i << " T " << T;
        }
      }
    }
    // Widths that differ are refused, not mixed up.
    std::vector<uint8_t> other;
    const WeightMatrix narrow = MakeMatrix(rng, ty, 8, 64, &other);
    const WeightMatrix pair[2] = {ws[0], narrow};
    std::vector<float> x(cols), y0(rows[0]), y1(8);
    float* ys[2] = {y0.data(), y1.data()};
    EXPECT_EQ(cuda::MatMulSharedHost(pair, 2, x.data(), 1, ys).code(), absl::StatusCode::kInvalidArgument);
  }
}

// The warp kernels that quantize x themselves (decode and verification steps: one launch per
// product) against the activation blocks of a launch of their own: bitwise, single and shared
// (q/k/v) products, T up to and past what fits their shared memory, widths whose block count
// leaves threads idle.
TEST(CudaOpsTest, ActivationsQuantizedInTheMatMulAreBitwiseTheirOwnLaunch) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(51);
  for (TypeInfo ty : kCudaTypes) {
    if (ty.type != gguf::GgmlType::kQ8_0 && ty.type != gguf::GgmlType::kQ4_0 && ty.type != gguf::GgmlType::kQ4_1) {
      continue;
    }
    for (int64_t cols : {32, 576, 1536}) {
      const std::vector<int64_t> rows = {193, 64, 5};
      std::vector<std::vector<uint8_t>> data(rows.size());
      std::vector<WeightMatrix> ws;
      for (size_t i = 0; i < rows.size(); ++i) ws.push_back(MakeMatrix(rng, ty, rows[i], cols, &data[i]));
      // 1536 columns: 48 blocks a token, 40 bytes each; 17 tokens pass the 32 KiB of shared memory.
      for (int64_t T : {1, 5, 8, 17}) {
        const std::vector<float> x = Rand(rng, T * cols, -2.0f, 2.0f);
        std::vector<float> fused(T * rows[0]), separate(T * rows[0], -1.0f);
        ASSERT_TRUE(cuda::MatMulHost(ws[0], x.data(), T, fused.data(), cuda::CudaMatMulKernel::kWarpPerRow).ok());
        ASSERT_TRUE(cuda::MatMulHost(ws[0], x.data(), T, separate.data(), cuda::CudaMatMulKernel::kWarpPerRow,
                                     cuda::ActQuant::kSeparateLaunch)
                        .ok());
        ASSERT_TRUE(AllFinite(fused));
        EXPECT_EQ(std::memcmp(fused.data(), separate.data(), fused.size() * 4), 0)
            << static_cast<int>(ty.type) << " cols " << cols << " T " << T;
        std::vector<std::vector<float>> a(rows.size()), b(rows.size());
        std::vector<float*> ya, yb;
        for (size_t i = 0; i < rows.size(); ++i) {
          a[i].assign(T * rows[i], -1.0f);
          b[i].assign(T * rows[i], -2.0f);
          ya.push_back(a[i].data());
          yb.push_back(b[i].data());
        }
        ASSERT_TRUE(cuda::MatMulSharedHost(ws.data(), 3, x.data(), T, ya.data()).ok());
        ASSERT_TRUE(cuda::MatMulSharedHost(ws.data(), 3, x.data(), T, yb.data(), cuda::ActQuant::kSeparateLaunch).ok());
        for (size_t i = 0; i < rows.size(); ++i) {
          EXPECT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4), 0)
              << static_cast<int>(ty.type) << " cols " << cols << " T " << T << " matrix " << i;
        }
      }
    }
  }
}

constexpr KvDtype kAllKv[] = {KvDtype::kF16, KvDtype::kBF16, KvDtype::kF32, KvDtype::kInt8};

TEST(CudaOpsTest, WriteKvIsBitwiseTheReference) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(8);
  for (KvDtype dt : kAllKv) {
    KvPool a(dt, 4, 16, 3, 64), b(dt, 4, 16, 3, 64);
    const int64_t T = 5;
    std::vector<float> k = Rand(rng, T * 3 * 64, -70000.0f, 70000.0f), v = Rand(rng, T * 3 * 64);
    k[1] = 1e-6f;  // an f16 subnormal
    k[2] = 1e-12f;  // below bf16 attention's flush
    const std::vector<int64_t> slots = {0, 17, 63, 5, 30};
    ref::WriteKv(k.data(), v.data(), T, slots.data(), a.layer);
    ASSERT_TRUE(cuda::WriteKvHost(k.data(), v.data(), T, slots.data(), b.layer).ok());
    EXPECT_EQ(a.k, b.k) << static_cast<int>(dt);
    EXPECT_EQ(a.v, b.v);
    EXPECT_EQ(a.k_scale, b.k_scale);
    EXPECT_EQ(a.v_scale, b.v_scale);
    const std::vector<int64_t> twice = {3, 9, 3, 1, 2};
    EXPECT_FALSE(cuda::WriteKvHost(k.data(), v.data(), T, twice.data(), b.layer).ok()) << "a slot written twice";
    // Padding rows of a bucketed step (slot -1) store nothing, as in the reference.
    KvPool c(dt, 4, 16, 3, 64), d(dt, 4, 16, 3, 64);
    const std::vector<int64_t> padded = {-1, 9, -1, 40, -1};
    ref::WriteKv(k.data(), v.data(), T, padded.data(), c.layer);
    ASSERT_TRUE(cuda::WriteKvHost(k.data(), v.data(), T, padded.data(), d.layer).ok());
    EXPECT_EQ(c.k, d.k);
    EXPECT_EQ(c.v, d.v);
    EXPECT_EQ(c.k_scale, d.k_scale);
  }
}

// Paged attention against the reference on awkward shapes (odd head counts, head dims 64, 72,
// 80, 128; lengths around the block and chunk sizes, up to 4,096 keys), every KV dtype; no
// NaN; every query alone bitwise the batch; and the plan's split (one block per chunk, then a
// merge) bitwise the unsplit fold.
TEST(CudaOpsTest, PagedAttentionMatchesReferenceBatchAndSplitInvariant) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(9);
  struct Heads {
    int32_t hq, hkv, d;
  };
  for (Heads hs : {Heads{9, 3, 64}, Heads{7, 1, 128}, Heads{6, 2, 72}, Heads{8, 8, 80}}) {
    for (KvDtype dt : kAllKv) {
      const int32_t bs = 16;
      const std::vector<int64_t> lens = {1, 15, 16, 17, 63, 64, 65, 129, 1000, 4096};
      int64_t total_blocks = 0;
      for (int64_t L : lens) total_blocks += (L + bs - 1) / bs;
      KvPool pool(dt, total_blocks + 3, bs, hs.hkv, hs.d);
      std::vector<int32_t> free_blocks(pool.layer.num_blocks);
      std::iota(free_blocks.begin(), free_blocks.end(), 0);
      std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
      std::vector<std::vector<int32_t>> tables;
      std::vector<int32_t> pos;
      std::vector<const int32_t*> bt;
      size_t next = 0;
      const int64_t kvrow = static_cast<int64_t>(hs.hkv) * hs.d;
      for (int64_t L : lens) {
        std::vector<int32_t> table((L + bs - 1) / bs);
        for (auto& b : table) b = free_blocks.at(next++);
        const std::vector<float> k = Rand(rng, L * kvrow), v = Rand(rng, L * kvrow);
        std::vector<int64_t> slots(L);
        for (int64_t j = 0; j < L; ++j) slots[j] = static_cast<int64_t>(table[j / bs]) * bs + j % bs;
        ref::WriteKv(k.data(), v.data(), L, slots.data(), pool.layer);
        tables.push_back(std::move(table));
      }
      for (size_t s = 0; s < lens.size(); ++s) {  // each sequence's last 1 or 5 positions
        const int64_t nq = std::min<int64_t>(lens[s], s % 2 == 0 ? 1 : 5);
        for (int64_t i = lens[s] - nq; i < lens[s]; ++i) {
          pos.push_back(static_cast<int32_t>(i));
          bt.push_back(tables[s].data());
        }
      }
      const int64_t T = static_cast<int64_t>(pos.size()), row = static_cast<int64_t>(hs.hq) * hs.d;
      const std::vector<float> q = Rand(rng, T * row, -3.0f, 3.0f);
      const float scale = 1.0f / std::sqrt(static_cast<float>(hs.d));
      std::vector<float> want(q.size()), whole(q.size()), split(q.size());
      ref::PagedAttention(q.data(), T, hs.hq, pos.data(), bt.data(), pool.layer, scale, want.data());
      ASSERT_TRUE(cuda::PagedAttentionHost(q.data(), T, hs.hq, pos.data(), bt.data(), pool.layer, scale,
                                           whole.data(), /*fill_blocks=*/1).ok());
      ASSERT_TRUE(cuda::PagedAttentionHost(q.data(), T, hs.hq, pos.data(), bt.data(), pool.layer, scale,
                                           split.data(), /*fill_blocks=*/int64_t{1} << 40).ok());
      ASSERT_TRUE(AllFinite(whole));
      // |v| <= 1, as on the CPU. int8 KV: the scores as the reference's (the codes' exact sums),
      // p V in f32 as the reference's (the CPU rounds p times V's scale to bf16; this does not).
      const double tol = dt == KvDtype::kBF16 ? 0x1p-8 : 2e-5;
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(whole[i], want[i], tol) << "i=" << i << " d=" << hs.d << " kv " << static_cast<int>(dt);
      }
      ASSERT_EQ(std::memcmp(whole.data(), split.data(), whole.size() * 4), 0) << "split changed bits";
      for (int64_t t = 0; t < T; ++t) {
        std::vector<float> one(row);
        ASSERT_TRUE(cuda::PagedAttentionHost(q.data() + t * row, 1, hs.hq, &pos[t], &bt[t], pool.layer, scale,
                                             one.data()).ok());
        ASSERT_EQ(std::memcmp(one.data(), whole.data() + t * row, row * 4), 0) << "t=" << t << " alone";
      }
    }
  }
}

TEST(CudaOpsTest, PagedAttentionRejectsBadShapes) {
  SKIP_WITHOUT_DEVICE();
  KvPool pool(KvDtype::kF16, 2, 16, 3, 64);
  std::vector<int32_t> table = {0, 1};
  const int32_t* bt[1] = {table.data()};
  std::vector<float> q(8 * 64), out(q.size());
  const int32_t pos = 3;
  EXPECT_FALSE(cuda::PagedAttentionHost(q.data(), 1, 8, &pos, bt, pool.layer, 0.125f, out.data()).ok());
  const int32_t neg = -1;
  EXPECT_FALSE(cuda::PagedAttentionHost(q.data(), 1, 6, &neg, bt, pool.layer, 0.125f, out.data()).ok());
}

}  // namespace
}  // namespace specd::kernels
