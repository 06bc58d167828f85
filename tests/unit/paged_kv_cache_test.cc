#include "engine/paged_kv_cache.h"

#include <map>
#include <set>
#include <memory>
#include <random>
#include <vector>

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

// ---- prefix caching ------------------------------------------------------------------------

namespace prefix {

// What a real KV row depends on: every token up to and including its position. Rows are
// written as this value (per layer, head and dim) so that a shared block that was written by
// the wrong sequence, or overwritten, shows up as a mismatch.
float RowValue(const std::vector<int32_t>& tokens, int64_t pos, int32_t layer, int32_t head,
               int32_t dim) {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (int64_t i = 0; i <= pos; ++i) h = (h ^ static_cast<uint64_t>(tokens[i])) * 0x100000001b3ull;
  h ^= static_cast<uint64_t>(layer * 131 + head * 17 + dim);
  return static_cast<float>(h % 1000003) * 0.001f;
}

KvCacheConfig CachingConfig(int32_t blocks, int32_t block_size = 4) {
  KvCacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 2;
  c.head_dim = 3;
  c.block_size = block_size;
  c.num_blocks = blocks;
  c.max_blocks_per_seq = 64;
  c.dtype = kernels::KvDtype::kF32;
  c.prefix_caching = true;
  c.cache_salt = 7;
  return c;
}

void WriteRows(PagedKvCache& kv, SeqId seq, const std::vector<int32_t>& tokens, int64_t from,
               int64_t to) {
  for (int32_t l = 0; l < kv.config().num_layers; ++l) {
    kernels::PagedKvLayer layer = kv.Layer(l);
    for (int64_t p = from; p < to; ++p) {
      const int64_t slot = kv.Slot(seq, p);
      for (int32_t h = 0; h < layer.num_kv_heads; ++h) {
        for (int32_t d = 0; d < layer.head_dim; ++d) {
          static_cast<float*>(layer.k)[layer.KIndex(slot, h, d)] = RowValue(tokens, p, l, h, d);
          static_cast<float*>(layer.v)[layer.VIndex(slot, h) + d] = -RowValue(tokens, p, l, h, d);
        }
      }
    }
  }
}

// The first position in [0, to) whose row does not hold what `tokens` imply, or -1.
int64_t FirstBadRow(PagedKvCache& kv, SeqId seq, const std::vector<int32_t>& tokens, int64_t to) {
  for (int32_t l = 0; l < kv.config().num_layers; ++l) {
    kernels::PagedKvLayer layer = kv.Layer(l);
    for (int64_t p = 0; p < to; ++p) {
      const int64_t slot = kv.Slot(seq, p);
      for (int32_t h = 0; h < layer.num_kv_heads; ++h) {
        for (int32_t d = 0; d < layer.head_dim; ++d) {
          const float want = RowValue(tokens, p, l, h, d);
          if (static_cast<float*>(layer.k)[layer.KIndex(slot, h, d)] != want ||
              static_cast<float*>(layer.v)[layer.VIndex(slot, h) + d] != -want) {
            return p;
          }
        }
      }
    }
  }
  return -1;
}

// Every block is free (or only cached) or referenced by a sequence, nothing lost.
void ExpectAccounted(const PagedKvCache& kv) {
  ASSERT_EQ(kv.num_free_blocks() + kv.num_used_blocks(), kv.num_blocks());
  ASSERT_LE(kv.num_evictable_blocks(), kv.num_cached_blocks());
}

TEST(PrefixCacheTest, AdoptsLeadingFullBlocksAndKeepsTheLastTokenToCompute) {
  std::unique_ptr<PagedKvCache> kv_owner = *PagedKvCache::Create(CachingConfig(32));
  PagedKvCache& kv = *kv_owner;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 13; ++i) prompt.push_back(100 + i);  // 3 full blocks of 4, then 1
  ASSERT_TRUE(kv.AddSequence(1).ok());
  EXPECT_EQ(*kv.AdoptPrefix(1, prompt), 0) << "nothing cached yet";
  ASSERT_TRUE(kv.Reserve(1, 13).ok());
  WriteRows(kv, 1, prompt, 0, 13);
  ASSERT_TRUE(kv.Publish(1, prompt).ok());
  EXPECT_EQ(kv.num_cached_blocks(), 3);
  const std::vector<int32_t> shared(kv.BlockTable(1), kv.BlockTable(1) + 3);

  // The same prompt: all 3 full blocks, the very same ones.
  ASSERT_TRUE(kv.AddSequence(2).ok());
  EXPECT_EQ(*kv.AdoptPrefix(2, prompt), 12);
  EXPECT_EQ(*kv.Length(2), 12);
  EXPECT_EQ(std::vector<int32_t>(kv.BlockTable(2), kv.BlockTable(2) + 3), shared);
  EXPECT_EQ(FirstBadRow(kv, 2, prompt, 12), -1);
  // Exactly 12 tokens: the last one must still be computed, so only 2 blocks.
  ASSERT_TRUE(kv.AddSequence(3).ok());
  EXPECT_EQ(*kv.AdoptPrefix(3, absl::MakeSpan(prompt).subspan(0, 12)), 8);
  // One token off inside block 2: blocks 0 and 1 only. Off at the boundary (token 8): same.
  for (int at : {9, 8}) {
    std::vector<int32_t> other = prompt;
    other[at] = 5;
    ASSERT_TRUE(kv.AddSequence(10 + at).ok());
    EXPECT_EQ(*kv.AdoptPrefix(10 + at, other), 8) << "differs at " << at;
  }
  // Another salt (another model or shard) shares nothing.
  KvCacheConfig c = CachingConfig(32);
  c.cache_salt = 8;
  std::unique_ptr<PagedKvCache> other_model_owner = *PagedKvCache::Create(c);
  PagedKvCache& other_model = *other_model_owner;
  ASSERT_TRUE(other_model.AddSequence(1).ok());
  ASSERT_TRUE(other_model.Reserve(1, 13).ok());
  ASSERT_TRUE(other_model.Publish(1, prompt).ok());
  EXPECT_EQ(kv.prefix_stats().lookups, 5);
  EXPECT_EQ(kv.prefix_stats().hit_tokens, 12 + 8 + 8 + 8);
  ExpectAccounted(kv);
}

TEST(PrefixCacheTest, UnusedBlocksStayCachedThenAreEvictedLeastRecentlyUsed) {
  std::unique_ptr<PagedKvCache> kv_owner = *PagedKvCache::Create(CachingConfig(6));
  PagedKvCache& kv = *kv_owner;
  auto run = [&](SeqId seq, int32_t base) {
    std::vector<int32_t> p = {base, base + 1, base + 2, base + 3, base + 4};  // 1 full block
    EXPECT_TRUE(kv.AddSequence(seq).ok());
    const int64_t adopted = *kv.AdoptPrefix(seq, p);
    EXPECT_TRUE(kv.Reserve(seq, 5).ok());
    WriteRows(kv, seq, p, adopted, 5);
    EXPECT_TRUE(kv.Publish(seq, p).ok());
    EXPECT_EQ(FirstBadRow(kv, seq, p, 5), -1);
    kv.FreeSequence(seq);
    return adopted;
  };
  EXPECT_EQ(run(1, 10), 0);
  EXPECT_EQ(run(2, 20), 0);
  EXPECT_EQ(run(3, 30), 0);
  EXPECT_EQ(kv.num_cached_blocks(), 3);
  EXPECT_EQ(kv.num_evictable_blocks(), 3);
  EXPECT_EQ(kv.num_free_blocks(), 6) << "cached blocks can be handed out";
  EXPECT_EQ(run(1, 10), 4) << "prompt 10 is cached: its block is reused";
  // Take 5 of the 6: two cached blocks must go, the least recently used first (20, then 30).
  ASSERT_TRUE(kv.AddSequence(9).ok());
  ASSERT_TRUE(kv.Reserve(9, 20).ok());
  EXPECT_EQ(kv.prefix_stats().evictions, 2);
  ExpectAccounted(kv);
  kv.FreeSequence(9);
  EXPECT_EQ(run(1, 10), 4) << "the most recently used survived";
  EXPECT_EQ(run(2, 20), 0) << "the least recently used was evicted";
  kv.DropCache();
  EXPECT_EQ(kv.num_cached_blocks(), 0);
  EXPECT_EQ(kv.num_free_blocks(), 6);
  EXPECT_EQ(kv.num_used_blocks(), 0);
}

TEST(PrefixCacheTest, TruncatingIntoASharedBlockCopiesItFirst) {
  std::unique_ptr<PagedKvCache> kv_owner = *PagedKvCache::Create(CachingConfig(16));
  PagedKvCache& kv = *kv_owner;
  std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  ASSERT_TRUE(kv.AddSequence(1).ok());
  ASSERT_TRUE(kv.Reserve(1, 9).ok());
  WriteRows(kv, 1, prompt, 0, 9);
  ASSERT_TRUE(kv.Publish(1, prompt).ok());
  ASSERT_TRUE(kv.AddSequence(2).ok());
  ASSERT_EQ(*kv.AdoptPrefix(2, prompt), 8);
  const int32_t shared = kv.BlockTable(2)[1];
  // Sequence 2 goes back to 6 tokens (a re-prefill) and writes another continuation.
  ASSERT_TRUE(kv.Truncate(2, 6).ok());
  EXPECT_NE(kv.BlockTable(2)[1], shared) << "the kept half of the shared block was copied";
  std::vector<int32_t> other = {1, 2, 3, 4, 5, 6, 70, 80, 90};
  ASSERT_TRUE(kv.Reserve(2, 9).ok());
  WriteRows(kv, 2, other, 6, 9);
  EXPECT_EQ(FirstBadRow(kv, 2, other, 9), -1);
  EXPECT_EQ(FirstBadRow(kv, 1, prompt, 9), -1) << "the shared block was not written";
  ExpectAccounted(kv);
}

// int8 KV: copy-on-write carries each kept row's codes and its scales (K and V).
TEST(PrefixCacheTest, Int8CopyOnWriteCarriesCodesAndScales) {
  KvCacheConfig c = CachingConfig(16);
  c.dtype = kernels::KvDtype::kInt8;
  std::unique_ptr<PagedKvCache> kv_owner = *PagedKvCache::Create(c);
  PagedKvCache& kv = *kv_owner;
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  // A row's code and scale, from its position, layer, head (and dim for the code).
  auto code = [](int64_t p, int32_t l, int32_t h, int32_t d) {
    return static_cast<int8_t>((p * 37 + l * 11 + h * 5 + d) % 255 - 127);
  };
  auto scale = [](int64_t p, int32_t l, int32_t h, bool is_k) {
    return 0.01f * static_cast<float>(p + 1) + 0.1f * l + 0.001f * h + (is_k ? 0.0f : 0.5f);
  };
  auto write = [&](SeqId seq, int64_t from, int64_t to) {
    for (int32_t l = 0; l < c.num_layers; ++l) {
      kernels::PagedKvLayer layer = kv.Layer(l);
      for (int64_t p = from; p < to; ++p) {
        const int64_t slot = kv.Slot(seq, p);
        for (int32_t h = 0; h < c.num_kv_heads; ++h) {
          layer.k_scale[layer.SIndex(slot, h)] = scale(p, l, h, true);
          layer.v_scale[layer.SIndex(slot, h)] = scale(p, l, h, false);
          for (int32_t d = 0; d < c.head_dim; ++d) {
            static_cast<int8_t*>(layer.k)[layer.KIndex(slot, h, d)] = code(p, l, h, d);
            static_cast<int8_t*>(layer.v)[layer.VIndex(slot, h) + d] = code(p, l, h, d + 1);
          }
        }
      }
    }
  };
  auto intact = [&](SeqId seq, int64_t to) {
    for (int32_t l = 0; l < c.num_layers; ++l) {
      kernels::PagedKvLayer layer = kv.Layer(l);
      for (int64_t p = 0; p < to; ++p) {
        const int64_t slot = kv.Slot(seq, p);
        for (int32_t h = 0; h < c.num_kv_heads; ++h) {
          if (layer.k_scale[layer.SIndex(slot, h)] != scale(p, l, h, true) ||
              layer.v_scale[layer.SIndex(slot, h)] != scale(p, l, h, false)) {
            return false;
          }
          for (int32_t d = 0; d < c.head_dim; ++d) {
            if (static_cast<int8_t*>(layer.k)[layer.KIndex(slot, h, d)] != code(p, l, h, d) ||
                static_cast<int8_t*>(layer.v)[layer.VIndex(slot, h) + d] != code(p, l, h, d + 1)) {
              return false;
            }
          }
        }
      }
    }
    return true;
  };
  ASSERT_TRUE(kv.AddSequence(1).ok());
  ASSERT_TRUE(kv.Reserve(1, 9).ok());
  write(1, 0, 9);
  ASSERT_TRUE(kv.Publish(1, prompt).ok());
  ASSERT_TRUE(kv.AddSequence(2).ok());
  ASSERT_EQ(*kv.AdoptPrefix(2, prompt), 8);
  const int32_t shared = kv.BlockTable(2)[1];
  ASSERT_TRUE(kv.Truncate(2, 6).ok());
  ASSERT_NE(kv.BlockTable(2)[1], shared);
  EXPECT_TRUE(intact(2, 6)) << "the copy lost codes or scales";
  EXPECT_TRUE(intact(1, 9));
  ExpectAccounted(kv);
}

// Thousands of random request streams against the cache's own truth: shared prefixes at and
// off block boundaries, speculation (reserve k drafts, write, roll back to the accepted),
// preemption (truncate, recompute), cancels (free), drops, and KV pressure. After every step
// each live sequence's rows hold exactly what its tokens imply, and every block is accounted
// for; at the end everything is free again.
TEST(PrefixCacheTest, RandomStreamsKeepEveryRowAndEveryBlock) {
  std::mt19937 rng(5);
  std::unique_ptr<PagedKvCache> kv_owner = *PagedKvCache::Create(CachingConfig(48));
  PagedKvCache& kv = *kv_owner;
  const int32_t bs = kv.config().block_size;
  std::vector<std::vector<int32_t>> bases;
  for (int b = 0; b < 4; ++b) {
    std::vector<int32_t> p;
    for (int i = 0; i < 24; ++i) p.push_back(1000 * b + static_cast<int32_t>(rng() % 3));
    bases.push_back(p);
  }
  struct Live {
    std::vector<int32_t> tokens;  // committed
    int64_t adopted_blocks = 0;   // leading blocks it took from the cache (and still holds)
  };
  std::map<SeqId, Live> live;
  SeqId next_id = 1;
  int64_t adopted_total = 0;
  for (int step = 0; step < 4000; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op <= 2 || live.empty()) {  // a new request
      const auto& base = bases[rng() % bases.size()];
      std::vector<int32_t> prompt(base.begin(), base.begin() + 1 + rng() % base.size());
      if (rng() % 3 == 0) prompt.push_back(static_cast<int32_t>(rng() % 50));  // its own tail
      const SeqId id = next_id++;
      ASSERT_TRUE(kv.AddSequence(id).ok());
      const int64_t a = *kv.AdoptPrefix(id, prompt);
      ASSERT_EQ(a % bs, 0);
      ASSERT_LT(a, static_cast<int64_t>(prompt.size()));
      adopted_total += a;
      ASSERT_EQ(FirstBadRow(kv, id, prompt, a), -1) << "adopted rows of " << id;
      if (!kv.Reserve(id, prompt.size()).ok()) {
        kv.FreeSequence(id);  // no room: refused
        continue;
      }
      WriteRows(kv, id, prompt, a, prompt.size());
      ASSERT_TRUE(kv.Publish(id, prompt).ok());
      live[id].tokens = prompt;
      live[id].adopted_blocks = a / bs;
    } else if (op <= 6) {  // a speculative step: k drafts, some accepted, one correction
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      Live& s = it->second;
      const int64_t n = s.tokens.size();
      const int32_t k = static_cast<int32_t>(rng() % 5);
      std::vector<int32_t> drafted = s.tokens;
      for (int32_t j = 0; j <= k; ++j) drafted.push_back(static_cast<int32_t>(rng() % 50));
      if (!kv.Reserve(it->first, n + k + 1).ok()) continue;
      WriteRows(kv, it->first, drafted, n, n + k + 1);
      const int32_t accepted = static_cast<int32_t>(rng() % (k + 1));
      ASSERT_TRUE(kv.Truncate(it->first, n + accepted + 1).ok());
      s.tokens.assign(drafted.begin(), drafted.begin() + n + accepted + 1);
      ASSERT_TRUE(kv.Publish(it->first, s.tokens).ok());
    } else if (op == 7) {  // preemption by recompute, or a re-prefill from a point
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      const int64_t to = rng() % (it->second.tokens.size() + 1);
      if (!kv.Truncate(it->first, to).ok()) continue;  // no block for the copy: unchanged
      it->second.tokens.resize(to);
      it->second.adopted_blocks = std::min<int64_t>(it->second.adopted_blocks, to / bs);
      if (to == 0) {
        kv.FreeSequence(it->first);
        live.erase(it);
      }
    } else if (op == 8) {  // finished or cancelled
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      kv.FreeSequence(it->first);
      live.erase(it);
    } else if (rng() % 20 == 0) {
      kv.DropCache();
    }
    ExpectAccounted(kv);
    std::set<int32_t> adopted;  // what sequences share rather than own, each block once
    for (const auto& [id, s] : live) {
      adopted.insert(kv.BlockTable(id), kv.BlockTable(id) + s.adopted_blocks);
    }
    ASSERT_EQ(kv.num_adopted_blocks(), static_cast<int32_t>(adopted.size())) << "step " << step;
    for (const auto& [id, s] : live) {
      ASSERT_EQ(*kv.Length(id), static_cast<int64_t>(s.tokens.size())) << "step " << step;
      ASSERT_EQ(FirstBadRow(kv, id, s.tokens, s.tokens.size()), -1)
          << "sequence " << id << " at step " << step;
    }
  }
  EXPECT_GT(adopted_total, 1000) << "the streams should share prefixes";
  EXPECT_GT(kv.prefix_stats().evictions, 0) << "the streams should put the cache under pressure";
  for (const auto& [id, s] : live) kv.FreeSequence(id);
  kv.DropCache();
  EXPECT_EQ(kv.num_used_blocks(), 0);
  EXPECT_EQ(kv.num_adopted_blocks(), 0);
  EXPECT_EQ(kv.num_cached_blocks(), 0);
  EXPECT_EQ(kv.num_free_blocks(), kv.num_blocks());
}

}  // namespace prefix

}  // namespace
}  // namespace specd::engine
