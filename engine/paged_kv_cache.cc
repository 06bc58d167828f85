#include "engine/paged_kv_cache.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "common/util/check.h"
#include "absl/strings/str_format.h"

namespace specd::engine {

size_t KvDtypeBytes(kernels::KvDtype dtype) {
  return static_cast<size_t>(kernels::KvDtypeSize(dtype));
}

absl::StatusOr<kernels::KvDtype> ParseKvDtype(std::string_view name) {
  for (kernels::KvDtype d : {kernels::KvDtype::kF16, kernels::KvDtype::kBF16,
                             kernels::KvDtype::kF32, kernels::KvDtype::kInt8}) {
    if (name == KvDtypeName(d)) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("kv dtype \"%s\" is not one of f16, bf16, f32, int8", name));
}

const char* KvDtypeName(kernels::KvDtype dtype) {
  switch (dtype) {
    case kernels::KvDtype::kF16: return "f16";
    case kernels::KvDtype::kBF16: return "bf16";
    case kernels::KvDtype::kF32: return "f32";
    case kernels::KvDtype::kInt8: return "int8";
  }
  return "?";
}

namespace {
std::atomic<uint64_t> next_cache_id{1};
}  // namespace

PagedKvCache::PagedKvCache(const KvCacheConfig& config)
    : config_(config), id_(next_cache_id.fetch_add(1)), allocator_(config.num_blocks) {
  if (config.prefix_caching) {
    block_hash_.assign(config.num_blocks, 0);
    block_cached_.assign(config.num_blocks, false);
    block_tokens_.assign(static_cast<size_t>(config.num_blocks) * config.block_size, -1);
    last_use_.assign(config.num_blocks, 0);
    adopt_refs_.assign(config.num_blocks, 0);
  }
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
  cache->memory_ = c.memory != nullptr ? c.memory : &HostMemory();
  const uint64_t layer_bytes = static_cast<uint64_t>(c.num_blocks) * c.block_size *
                               c.num_kv_heads * c.head_dim * KvDtypeBytes(c.dtype);
  // int8: one float scale per (token, kv head) for K and for V.
  const uint64_t scale_bytes = c.dtype == kernels::KvDtype::kInt8
                                   ? static_cast<uint64_t>(c.num_blocks) * c.block_size *
                                         c.num_kv_heads * sizeof(float)
                                   : 0;
  // Zeroed and 64-byte aligned (DeviceMemory::Allocate), so SIMD loads of a head never
  // straddle a cache line start.
  auto allocate = [&](uint64_t bytes, const char* what, int32_t l,
                      std::vector<DeviceBuffer>& into) -> absl::Status {
    absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(*cache->memory_, bytes);
    if (!b.ok()) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "kv cache: cannot allocate %d bytes of %s for layer %d: %s", bytes, what, l,
          b.status().message()));
    }
    into.push_back(*std::move(b));
    return absl::OkStatus();
  };
  for (int32_t l = 0; l < c.num_layers; ++l) {
    absl::Status st = allocate(layer_bytes, "keys", l, cache->k_pools_);
    if (st.ok()) st = allocate(layer_bytes, "values", l, cache->v_pools_);
    if (st.ok() && scale_bytes > 0) st = allocate(scale_bytes, "int8 key scales", l, cache->k_scales_);
    if (st.ok() && scale_bytes > 0) st = allocate(scale_bytes, "int8 value scales", l, cache->v_scales_);
    if (!st.ok()) return st;
  }
  cache->pool_bytes_ = 2 * (layer_bytes + scale_bytes) * c.num_layers;
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
  Unadopt(it->second, 0);
  for (int32_t b : it->second.blocks) ReleaseBlock(b);
  seqs_.erase(it);
}

// ---- prefix cache ------------------------------------------------------------------------

uint64_t PagedKvCache::BlockHash(uint64_t prev, absl::Span<const int32_t> tokens) const {
  // FNV-1a over the previous block's hash and this block's ids, then a final avalanche
  // (splitmix64). 64 bits; a match is confirmed against the stored tokens as well.
  uint64_t h = 1469598103934665603ull ^ prev;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(prev);
  for (int32_t t : tokens) mix(static_cast<uint32_t>(t));
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

void PagedKvCache::ReleaseBlock(int32_t block) {
  allocator_.Release(block);
  if (config_.prefix_caching && block_cached_[block] && allocator_.ref_count(block) == 1) {
    last_use_[block] = ++tick_;
    lru_.insert({last_use_[block], block});  // only the cache holds it now
  }
}

void PagedKvCache::Unadopt(Sequence& s, int32_t from) {
  for (int32_t i = from; i < s.adopted; ++i) {
    if (--adopt_refs_[s.blocks[i]] == 0) --num_adopted_;
  }
  s.adopted = std::min(s.adopted, from);
}

void PagedKvCache::EvictOne() {
  const auto [use, block] = *lru_.begin();
  lru_.erase(lru_.begin());
  by_hash_.erase(block_hash_[block]);
  block_cached_[block] = false;
  ++stats_.evictions;
  allocator_.Release(block);  // the cache's own reference: the block is free
}

absl::Status PagedKvCache::AllocateBlocks(int32_t count, std::vector<int32_t>* out) {
  if (count > allocator_.num_free() + num_evictable_blocks()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "KV cache out of blocks: need %d, %d of %d free", count, num_free_blocks(),
        allocator_.num_blocks()));
  }
  while (allocator_.num_free() < count) EvictOne();
  return allocator_.Allocate(count, out);
}

int32_t PagedKvCache::MatchPrefix(absl::Span<const int32_t> prompt,
                                  std::vector<std::pair<int32_t, uint64_t>>* found) const {
  if (!config_.prefix_caching || prompt.empty()) return 0;
  const int32_t bs = config_.block_size;
  // Keep the last prompt token to compute: its logits give the first output.
  const int64_t candidates = std::min<int64_t>((static_cast<int64_t>(prompt.size()) - 1) / bs,
                                               config_.max_blocks_per_seq);
  uint64_t chain = config_.cache_salt;
  int32_t matched = 0;
  for (; matched < candidates; ++matched) {
    const absl::Span<const int32_t> ids = prompt.subspan(static_cast<int64_t>(matched) * bs, bs);
    const uint64_t h = BlockHash(chain, ids);
    auto it = by_hash_.find(h);
    if (it == by_hash_.end() ||
        !std::equal(ids.begin(), ids.end(),
                    block_tokens_.begin() + static_cast<int64_t>(it->second) * bs)) {
      break;  // not cached, or a 64-bit collision: a miss either way
    }
    if (found != nullptr) found->emplace_back(it->second, h);
    chain = h;
  }
  return matched;
}

int64_t PagedKvCache::CachedPrefixLength(absl::Span<const int32_t> prompt) const {
  return static_cast<int64_t>(MatchPrefix(prompt, nullptr)) * config_.block_size;
}

absl::StatusOr<int64_t> PagedKvCache::AdoptPrefix(SeqId seq, absl::Span<const int32_t> prompt) {
  if (!config_.prefix_caching) return 0;
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrFormat("unknown sequence %d", seq));
  Sequence& s = it->second;
  if (s.length != 0 || !s.blocks.empty()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("sequence %d: AdoptPrefix needs an empty sequence", seq));
  }
  const int32_t bs = config_.block_size;
  ++stats_.lookups;
  stats_.queried_tokens += prompt.empty() ? 0 : (static_cast<int64_t>(prompt.size()) - 1) / bs * bs;
  std::vector<std::pair<int32_t, uint64_t>> found;
  MatchPrefix(prompt, &found);
  for (const auto& [b, h] : found) {
    if (allocator_.ref_count(b) == 1) lru_.erase({last_use_[b], b});  // in use again
    allocator_.Retain(b);
    last_use_[b] = ++tick_;
    if (adopt_refs_[b]++ == 0) ++num_adopted_;
    s.blocks.push_back(b);
    s.hashes.push_back(h);
  }
  s.adopted = static_cast<int32_t>(s.blocks.size());
  s.length = static_cast<int64_t>(s.blocks.size()) * bs;
  stats_.hit_tokens += s.length;
  return s.length;
}

absl::Status PagedKvCache::Publish(SeqId seq, absl::Span<const int32_t> committed) {
  if (!config_.prefix_caching) return absl::OkStatus();
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrFormat("unknown sequence %d", seq));
  Sequence& s = it->second;
  if (static_cast<int64_t>(committed.size()) > s.length) {
    return absl::OutOfRangeError(absl::StrFormat(
        "sequence %d: %d committed tokens, but its KV holds %d", seq, committed.size(), s.length));
  }
  const int32_t bs = config_.block_size;
  const int32_t full = static_cast<int32_t>(committed.size() / bs);
  for (int32_t i = static_cast<int32_t>(s.hashes.size()); i < full; ++i) {
    const absl::Span<const int32_t> ids = committed.subspan(static_cast<int64_t>(i) * bs, bs);
    const uint64_t h = BlockHash(s.hashes.empty() ? config_.cache_salt : s.hashes.back(), ids);
    const int32_t b = s.blocks[i];
    if (!by_hash_.contains(h) && !block_cached_[b] && allocator_.ref_count(b) == 1) {
      // The cache keeps its own reference, so the block outlives the sequence.
      by_hash_[h] = b;
      block_hash_[b] = h;
      block_cached_[b] = true;
      std::copy(ids.begin(), ids.end(), block_tokens_.begin() + static_cast<int64_t>(b) * bs);
      allocator_.Retain(b);
      last_use_[b] = ++tick_;
      ++stats_.published;
    }
    // Otherwise the same content is cached already (another sequence computed it too): this
    // copy stays private. Either way the block is committed and never written again.
    s.hashes.push_back(h);
  }
  return absl::OkStatus();
}

void PagedKvCache::DropCache() {
  while (!lru_.empty()) EvictOne();
}

absl::Status PagedKvCache::CopyRows(int32_t from, int32_t to, int32_t rows) {
  // A block is [kv_heads][block_size][head_dim] per layer for V, and for K each head's slab
  // is transposed to [head_dim][block_size] (kernels::PagedKvLayer::VIndex, KIndex): the V
  // rows are one run per head, the K rows one run per (head, dim).
  const size_t es = KvDtypeBytes(config_.dtype);
  const size_t row = static_cast<size_t>(config_.head_dim) * es;
  const size_t head = static_cast<size_t>(config_.block_size) * row;
  const size_t block = static_cast<size_t>(config_.num_kv_heads) * head;
  const size_t key_dim = static_cast<size_t>(config_.block_size) * es;  // one dim of a K slab
  DeviceMemory& mem = *memory_;
  absl::Status st;
  for (int32_t l = 0; l < config_.num_layers && st.ok(); ++l) {
    uint8_t* k = k_pools_[l].as<uint8_t>();
    uint8_t* v = v_pools_[l].as<uint8_t>();
    st.Update(mem.Copy2D(v + to * block, head, v + from * block, head, rows * row,
                         config_.num_kv_heads));
    st.Update(mem.Copy2D(k + to * block, key_dim, k + from * block, key_dim, rows * es,
                         static_cast<size_t>(config_.num_kv_heads) * config_.head_dim));
    if (config_.dtype == kernels::KvDtype::kInt8) {  // the rows' scales: [blocks][heads][bs]
      const size_t pitch = static_cast<size_t>(config_.block_size) * sizeof(float);
      const size_t at_to = static_cast<size_t>(to) * config_.num_kv_heads * pitch;
      const size_t at_from = static_cast<size_t>(from) * config_.num_kv_heads * pitch;
      for (std::vector<DeviceBuffer>* scales : {&k_scales_, &v_scales_}) {
        uint8_t* base = (*scales)[l].as<uint8_t>();
        st.Update(mem.Copy2D(base + at_to, pitch, base + at_from, pitch, rows * sizeof(float),
                             config_.num_kv_heads));
      }
    }
  }
  return st;
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
    absl::Status st = AllocateBlocks(need - have, &s.blocks);
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
  const int32_t bs = config_.block_size;
  const int32_t full = static_cast<int32_t>(length / bs);
  // The kept part of a committed block will be written again: never in a shared one. Copy
  // it to a private block first (before anything changes, so a failure changes nothing).
  if (static_cast<int32_t>(s.hashes.size()) > full && full < keep) {
    const int32_t b = s.blocks[full];
    if (block_cached_.empty() ? false : (block_cached_[b] || allocator_.ref_count(b) > 1)) {
      std::vector<int32_t> fresh;
      absl::Status st = AllocateBlocks(1, &fresh);
      if (!st.ok()) return st;
      st = CopyRows(b, fresh[0], static_cast<int32_t>(length % bs));
      if (!st.ok()) {
        ReleaseBlock(fresh[0]);
        return st;
      }
      Unadopt(s, std::min(s.adopted, full));
      ReleaseBlock(b);
      s.blocks[full] = fresh[0];
    }
  }
  Unadopt(s, std::min(s.adopted, full));
  while (static_cast<int32_t>(s.blocks.size()) > keep) {
    ReleaseBlock(s.blocks.back());
    s.blocks.pop_back();
  }
  if (static_cast<int32_t>(s.hashes.size()) > full) s.hashes.resize(full);
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
  l.k = k_pools_[layer].data();
  l.v = v_pools_[layer].data();
  l.num_blocks = config_.num_blocks;
  l.block_size = config_.block_size;
  l.num_kv_heads = config_.num_kv_heads;
  l.head_dim = config_.head_dim;
  if (config_.dtype == kernels::KvDtype::kInt8) {
    l.k_scale = k_scales_[layer].as<float>();
    l.v_scale = v_scales_[layer].as<float>();
  }
  return l;
}

}  // namespace specd::engine
