// The CUDA attention's host-side plan (kernels/cuda/attention_plan.h), checked on every machine:
// every (token, kv head) pair's chunks are computed exactly once and in the shape the merge
// expects, splitting happens only when the pairs cannot fill the device, and the shared
// memory a block asks for fits the device for the shapes we serve.
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/attention_plan.h"

namespace specd::kernels::cuda {
namespace {

// Checks that plan covers every pair of positions x kv heads: either one item over all its
// chunks (writing the output), or one single-chunk item per chunk whose partials are the
// merge's consecutive range, in chunk order. Returns the number of split pairs.
int CheckCoverage(const CudaAttentionPlan& plan, const std::vector<int32_t>& pos, int32_t hkv) {
  std::set<std::tuple<int32_t, int32_t>> whole, merged;
  std::vector<int> partial_seen(static_cast<size_t>(plan.num_partials), 0);
  std::vector<std::vector<int32_t>> chunk_of_partial(static_cast<size_t>(plan.num_partials));
  for (const CudaAttnItem& it : plan.items) {
    const int32_t chunks = (pos[it.t] + kCudaAttnChunk) / kCudaAttnChunk;
    EXPECT_GE(it.c0, 0);
    EXPECT_LT(it.c0, it.c1);
    EXPECT_LE(it.c1, chunks);
    if (it.partial < 0) {
      EXPECT_EQ(it.c0, 0);
      EXPECT_EQ(it.c1, chunks);
      EXPECT_TRUE(whole.insert({it.t, it.h}).second) << "pair computed twice";
    } else {
      EXPECT_EQ(it.c1, it.c0 + 1) << "a stored partial is one chunk";
      EXPECT_LT(it.partial, plan.num_partials);
      ++partial_seen[it.partial];
      chunk_of_partial[it.partial] = {it.t, it.h, it.c0};
    }
  }
  for (int seen : partial_seen) EXPECT_EQ(seen, 1) << "every partial written exactly once";
  for (const CudaAttnMerge& m : plan.merges) {
    const int32_t chunks = (pos[m.t] + kCudaAttnChunk) / kCudaAttnChunk;
    EXPECT_EQ(m.count, chunks);
    EXPECT_TRUE(merged.insert({m.t, m.h}).second);
    EXPECT_FALSE(whole.count({m.t, m.h})) << "a pair both whole and merged";
    for (int32_t c = 0; c < m.count; ++c) {
      EXPECT_EQ(chunk_of_partial[m.first + c], (std::vector<int32_t>{m.t, m.h, c})) << "merge order";
    }
  }
  EXPECT_EQ(whole.size() + merged.size(), pos.size() * static_cast<size_t>(hkv));
  return static_cast<int>(merged.size());
}

TEST(CudaAttentionPlanTest, EveryChunkOnceInFoldOrder) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> p(0, 9000);
  for (int64_t T : {1, 2, 5, 40, 300}) {
    std::vector<int32_t> pos(static_cast<size_t>(T));
    for (auto& x : pos) x = p(rng);
    pos[0] = 0;  // one key
    if (T > 1) pos[1] = 63;
    if (T > 2) pos[2] = 64;  // two chunks
    for (int32_t hkv : {1, 3, 8}) CheckCoverage(PlanCudaAttention(pos.data(), T, hkv), pos, hkv);
  }
}

TEST(CudaAttentionPlanTest, SplitsOnlyWhenThePairsCannotFillTheDevice) {
  // A single decode at depth 8,000 on 3 kv heads: 3 pairs < 264 blocks, so each of its 125
  // chunks gets its own block and a merge per pair.
  std::vector<int32_t> one = {7999};
  CudaAttentionPlan plan = PlanCudaAttention(one.data(), 1, 3);
  EXPECT_EQ(CheckCoverage(plan, one, 3), 3);
  EXPECT_EQ(plan.items.size(), 3u * 125);
  EXPECT_EQ(plan.num_partials, 3 * 125);
  // A short sequence has nothing to split.
  std::vector<int32_t> short_one = {40};
  EXPECT_EQ(CheckCoverage(PlanCudaAttention(short_one.data(), 1, 3), short_one, 3), 0);
  // A 512-token prefill chunk: 1,536 pairs fill the device; no split, no partials.
  std::vector<int32_t> prefill(512);
  for (int32_t i = 0; i < 512; ++i) prefill[i] = 3000 + i;
  plan = PlanCudaAttention(prefill.data(), 512, 3);
  EXPECT_EQ(CheckCoverage(plan, prefill, 3), 0);
  EXPECT_EQ(plan.num_partials, 0);
  // The threshold is an option.
  CudaAttentionPlanOptions o;
  o.fill_blocks = 1;
  EXPECT_EQ(CheckCoverage(PlanCudaAttention(one.data(), 1, 3, o), one, 3), 0);
}

TEST(CudaAttentionPlanTest, SharedMemoryFitsTheDevice) {
  // The default model (9 query heads on 3 kv heads of 64) and Llama-3-8B (32 on 8, of 128)
  // fit the default 48 KiB; the largest shape the kernel accepts (32 per kv head, 256) fits
  // an H100/H200's 227 KiB opt-in.
  EXPECT_LE(CudaAttnSharedBytes(3, 64), 48u * 1024);
  EXPECT_LE(CudaAttnSharedBytes(4, 128), 48u * 1024);
  EXPECT_LE(CudaAttnSharedBytes(32, 256), 227u * 1024);
  EXPECT_EQ(CudaAttnPartialFloats(3, 64), 3 * 66);
}

}  // namespace
}  // namespace specd::kernels::cuda
