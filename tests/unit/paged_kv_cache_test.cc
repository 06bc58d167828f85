#include "engine/paged_kv_cache.h"

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace specd::engine {
namespace {

KvCacheConfig SmallConfig(int32_t blocks) {
  KvCacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.block_size = 16;
  c.num_blocks = blocks;
  c.max_blocks_per_seq = 8;
  return c;
}

TEST(PagedKvCacheTest, ReserveAllocatesWholeBlocksAndTruncateFreesThem) {
  auto cache = PagedKvCache::Create(SmallConfig(10));
  ASSERT_TRUE(cache.ok()) << cache.status();
  PagedKvCache& kv = **cache;
  ASSERT_TRUE(kv.AddSequence(7).ok());
  EXPECT_EQ(kv.AddSequence(7).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(kv.Reserve(7, 1).ok());
  EXPECT_EQ(kv.num_used_blocks(), 1);
  ASSERT_TRUE(kv.Reserve(7, 16).ok());
  EXPECT_EQ(kv.num_used_blocks(), 1);
  ASSERT_TRUE(kv.Reserve(7, 17).ok());
  EXPECT_EQ(kv.num_used_blocks(), 2);
  ASSERT_TRUE(kv.Reserve(7, 33).ok());
  EXPECT_EQ(kv.NumBlocksOf(7), 3);
  EXPECT_EQ(*kv.Length(7), 33);
  // Rollback to 17 keeps blocks 0 and 1, frees block 2.
  ASSERT_TRUE(kv.Truncate(7, 17).ok());
  EXPECT_EQ(kv.NumBlocksOf(7), 2);
  EXPECT_EQ(kv.num_free_blocks(), 8);
  ASSERT_TRUE(kv.Truncate(7, 16).ok());
  EXPECT_EQ(kv.NumBlocksOf(7), 1);
  ASSERT_TRUE(kv.Truncate(7, 0).ok());
  EXPECT_EQ(kv.NumBlocksOf(7), 0);
  EXPECT_EQ(kv.Truncate(7, 5).code(), absl::StatusCode::kOutOfRange);
  kv.FreeSequence(7);
  EXPECT_EQ(kv.num_free_blocks(), 10);
  EXPECT_FALSE(kv.HasSequence(7));
}

TEST(PagedKvCacheTest, OutOfBlocksIsResourceExhaustedAndChangesNothing) {
  auto cache = PagedKvCache::Create(SmallConfig(3));
  ASSERT_TRUE(cache.ok());
  PagedKvCache& kv = **cache;
  ASSERT_TRUE(kv.AddSequence(1).ok());
  ASSERT_TRUE(kv.AddSequence(2).ok());
  ASSERT_TRUE(kv.Reserve(1, 32).ok());
  absl::Status st = kv.Reserve(2, 20);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_EQ(kv.NumBlocksOf(2), 0);
  EXPECT_EQ(*kv.Length(2), 0);
  EXPECT_EQ(kv.num_free_blocks(), 1);
  EXPECT_EQ(kv.BlocksNeeded(2, 20), 2);
  EXPECT_EQ(kv.BlocksNeeded(1, 30), 0);
}

TEST(PagedKvCacheTest, PerSequenceLimitIsOutOfRange) {
  auto cache = PagedKvCache::Create(SmallConfig(100));
  ASSERT_TRUE(cache.ok());
  ASSERT_TRUE((*cache)->AddSequence(1).ok());
  EXPECT_EQ((*cache)->Reserve(1, 8 * 16 + 1).code(), absl::StatusCode::kOutOfRange);
}

TEST(PagedKvCacheTest, SlotsFollowTheBlockTable) {
  auto cache = PagedKvCache::Create(SmallConfig(10));
  ASSERT_TRUE(cache.ok());
  PagedKvCache& kv = **cache;
  ASSERT_TRUE(kv.AddSequence(1).ok());
  ASSERT_TRUE(kv.AddSequence(2).ok());
  ASSERT_TRUE(kv.Reserve(1, 16).ok());
  ASSERT_TRUE(kv.Reserve(2, 16).ok());
  ASSERT_TRUE(kv.Reserve(1, 20).ok());
  const int32_t* table = kv.BlockTable(1);
  EXPECT_EQ(kv.Slot(1, 0), int64_t{table[0]} * 16);
  EXPECT_EQ(kv.Slot(1, 19), int64_t{table[1]} * 16 + 3);
  EXPECT_NE(table[1], kv.BlockTable(2)[0]);
}

TEST(PagedKvCacheTest, BadConfigIsInvalidArgument) {
  KvCacheConfig c = SmallConfig(0);
  EXPECT_EQ(PagedKvCache::Create(c).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specd::engine
