#include "engine/paged_kv_cache.h"

#include <cstdlib>
#include <cstring>

#include "common/util/check.h"
#include "absl/strings/str_format.h"

namespace specd::engine {

size_t KvDtypeBytes(kernels::KvDtype dtype) {
  return dtype == kernels::KvDtype::kF32 ? 4 : 2;
}

PagedKvCache::PagedKvCache(const KvCacheConfig& config)
    : config_(config), allocator_(config.num_blocks) {}

PagedKvCache::~PagedKvCache() {
  for (uint8_t* p : k_pools_) std::free(p);
  for (uint8_t* p : v_pools_) std::free(p);
}

absl::StatusOr<std::unique_ptr<PagedKvCache>> PagedKvCache::Create(const KvCacheConfig& c) {
  if (c.num_layers <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0 || c.block_size <= 0 ||
      c.num_blocks <= 0 || c.max_blocks_per_seq <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "kv cache config: layers=%d kv_heads=%d head_dim=%d block_size=%d num_blocks=%d "
        "max_blocks_per_seq=%d must all be > 0",
        c.num_layers, c.num_kv_heads, c.head_dim, c.block_size, c.num_blocks,
        c.max_blocks_per_seq));
  }
  std::unique_ptr<PagedKvCache> cache(new PagedKvCache(c));
  const uint64_t layer_bytes = static_cast<uint64_t>(c.num_blocks) * c.block_size *
                               c.num_kv_heads * c.head_dim * KvDtypeBytes(c.dtype);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    // 64-byte aligned so SIMD loads of a head never straddle a cache line start.
    auto* k = static_cast<uint8_t*>(std::aligned_alloc(64, (layer_bytes + 63) / 64 * 64));
    auto* v = static_cast<uint8_t*>(std::aligned_alloc(64, (layer_bytes + 63) / 64 * 64));
    if (k == nullptr || v == nullptr) {
      std::free(k);
      std::free(v);
      return absl::ResourceExhaustedError(
          absl::StrFormat("kv cache: cannot allocate %d bytes for layer %d", layer_bytes, l));
    }
    std::memset(k, 0, layer_bytes);
    std::memset(v, 0, layer_bytes);
    cache->k_pools_.push_back(k);
    cache->v_pools_.push_back(v);
  }
  cache->pool_bytes_ = 2 * layer_bytes * c.num_layers;
  return cache;
}

absl::Status PagedKvCache::AddSequence(SeqId seq) {
  auto [it, inserted] = seqs_.try_emplace(seq);
  if (!inserted) return absl::AlreadyExistsError(absl::StrFormat("sequence %d exists", seq));
  it->second.blocks.reserve(config_.max_blocks_per_seq);
  return absl::OkStatus();
}

void PagedKvCache::FreeSequence(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (int32_t b : it->second.blocks) allocator_.Release(b);
  seqs_.erase(it);
}

int32_t PagedKvCache::BlocksNeeded(SeqId seq, int64_t length) const {
  auto it = seqs_.find(seq);
  const int32_t have = it == seqs_.end() ? 0 : static_cast<int32_t>(it->second.blocks.size());
  const int32_t need = BlocksFor(length);
  return need > have ? need - have : 0;
}

absl::Status PagedKvCache::Reserve(SeqId seq, int64_t length) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrFormat("unknown sequence %d", seq));
  Sequence& s = it->second;
  const int32_t need = BlocksFor(length);
  if (need > config_.max_blocks_per_seq) {
    return absl::OutOfRangeError(absl::StrFormat(
        "sequence %d: length %d exceeds the per-sequence maximum of %d tokens", seq, length,
        static_cast<int64_t>(config_.max_blocks_per_seq) * config_.block_size));
  }
  const int32_t have = static_cast<int32_t>(s.blocks.size());
  if (need > have) {
    absl::Status st = allocator_.Allocate(need - have, &s.blocks);
    if (!st.ok()) return st;
  }
  if (length > s.length) s.length = length;
  return absl::OkStatus();
}

absl::Status PagedKvCache::Truncate(SeqId seq, int64_t length) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrFormat("unknown sequence %d", seq));
  Sequence& s = it->second;
  if (length < 0 || length > s.length) {
    return absl::OutOfRangeError(absl::StrFormat(
        "sequence %d: cannot truncate to %d (length %d)", seq, length, s.length));
  }
  const int32_t keep = BlocksFor(length);
  while (static_cast<int32_t>(s.blocks.size()) > keep) {
    allocator_.Release(s.blocks.back());
    s.blocks.pop_back();
  }
  s.length = length;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> PagedKvCache::Length(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrFormat("unknown sequence %d", seq));
  return it->second.length;
}

const int32_t* PagedKvCache::BlockTable(SeqId seq) const {
  auto it = seqs_.find(seq);
  SPECD_CHECK(it != seqs_.end(), "unknown sequence %lld", static_cast<long long>(seq));
  return it->second.blocks.data();
}

int32_t PagedKvCache::NumBlocksOf(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : static_cast<int32_t>(it->second.blocks.size());
}

int64_t PagedKvCache::Slot(SeqId seq, int64_t pos) const {
  const Sequence& s = seqs_.at(seq);
  const int64_t block = pos / config_.block_size;
  SPECD_CHECK(block < static_cast<int64_t>(s.blocks.size()), "position %lld beyond reserved blocks", static_cast<long long>(pos));
  return static_cast<int64_t>(s.blocks[block]) * config_.block_size + pos % config_.block_size;
}

kernels::PagedKvLayer PagedKvCache::Layer(int32_t layer) {
  kernels::PagedKvLayer l;
  l.dtype = config_.dtype;
  l.k = k_pools_[layer];
  l.v = v_pools_[layer];
  l.num_blocks = config_.num_blocks;
  l.block_size = config_.block_size;
  l.num_kv_heads = config_.num_kv_heads;
  l.head_dim = config_.head_dim;
  return l;
}

}  // namespace specd::engine
