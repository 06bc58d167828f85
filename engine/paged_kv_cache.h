// Paged KV cache: one preallocated K and V pool per layer, split into fixed-size blocks;
// each sequence owns a block table. Rollback (Truncate) frees whole blocks.
//
// Prefix caching (config.prefix_caching, off by default): a full block of committed tokens
// can be published under the hash chain of the token ids up to and including it (salted by
// the model / tensor-parallel shard). A new sequence adopts every leading published block of
// its prompt (shared, read-only, ref-counted) and computes only the rest. Published blocks no
// sequence uses stay cached until a Reserve needs their memory, then are evicted least
// recently used. Writes never reach a shared block: drafts and a partial last block live in
// private blocks, and a Truncate into a shared block copies the kept rows to a private one
// first (copy-on-write). Every block is free, cached-only (evictable) or used by sequences:
// num_free_blocks() + num_evictable_blocks() + num_referenced_blocks() == num_blocks().
#ifndef SPECD_ENGINE_PAGED_KV_CACHE_H_
#define SPECD_ENGINE_PAGED_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/block_allocator.h"
#include "engine/device_memory.h"
#include "kernels/kernel_types.h"

namespace specd::engine {

using SeqId = int64_t;

struct KvCacheConfig {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;  // heads held by this rank
  int32_t head_dim = 0;
  int32_t block_size = 16;
  int32_t num_blocks = 0;
  int32_t max_blocks_per_seq = 0;  // block tables are reserved up front: no hot-path allocation
  kernels::KvDtype dtype = kernels::KvDtype::kF16;
  bool prefix_caching = false;
  uint64_t cache_salt = 0;  // model / shard identity, mixed into every block hash
  // Where the pools live: the model's backend memory (LlamaModel::MakeKvCacheConfig sets it).
  // nullptr: host memory.
  DeviceMemory* memory = nullptr;
};

struct PrefixCacheStats {
  int64_t lookups = 0;         // AdoptPrefix calls
  int64_t queried_tokens = 0;  // tokens those calls could have adopted (full blocks)
  int64_t hit_tokens = 0;      // tokens adopted
  int64_t evictions = 0;       // cached blocks reclaimed for new allocations
  int64_t published = 0;       // blocks entered into the cache
};

size_t KvDtypeBytes(kernels::KvDtype dtype);
// "f16" | "bf16" | "f32" | "int8" (the flags' spelling) and back.
absl::StatusOr<kernels::KvDtype> ParseKvDtype(std::string_view name);
const char* KvDtypeName(kernels::KvDtype dtype);

class PagedKvCache {
 public:
  static absl::StatusOr<std::unique_ptr<PagedKvCache>> Create(const KvCacheConfig& config);
  ~PagedKvCache() = default;

  const KvCacheConfig& config() const { return config_; }
  // Unique in the process, never reused (unlike the address): what a recorded step that names
  // this cache's pools (engine::LlamaModel) checks it still runs on.
  uint64_t id() const { return id_; }
  // Bytes held by the K and V pools of all layers.
  uint64_t pool_bytes() const { return pool_bytes_; }
  // The memory the pools are in.
  DeviceMemory& memory() const { return *memory_; }

  absl::Status AddSequence(SeqId seq);  // ALREADY_EXISTS if present
  bool HasSequence(SeqId seq) const { return seqs_.contains(seq); }
  void FreeSequence(SeqId seq);         // no-op if absent
  // Makes room for `length` tokens (allocating blocks); RESOURCE_EXHAUSTED leaves it unchanged.
  absl::Status Reserve(SeqId seq, int64_t length);
  // Shortens to `length` tokens, releasing blocks no longer needed (a kept shared block is
  // first copied to a private one).
  absl::Status Truncate(SeqId seq, int64_t length);

  // --- prefix caching (no-ops returning 0 when config.prefix_caching is off) ---
  // For a sequence just added (length 0): attaches the longest run of published blocks that
  // match `prompt`'s leading full blocks, keeping at least the last prompt token to compute
  // (its logits are needed). Returns the tokens adopted (a multiple of block_size); the
  // sequence's length is then that.
  absl::StatusOr<int64_t> AdoptPrefix(SeqId seq, absl::Span<const int32_t> prompt);
  // How many tokens AdoptPrefix would adopt for `prompt` now; changes nothing (0 when off).
  int64_t CachedPrefixLength(absl::Span<const int32_t> prompt) const;
  // Publishes the sequence's full blocks of `committed` tokens (its KV already written for
  // them; committed.size() <= length) that are not published yet.
  absl::Status Publish(SeqId seq, absl::Span<const int32_t> committed);
  // Evicts every cached block no sequence uses (the admin "drop the cache" path).
  void DropCache();
  int32_t num_evictable_blocks() const { return static_cast<int32_t>(lru_.size()); }
  int32_t num_cached_blocks() const { return static_cast<int32_t>(by_hash_.size()); }
  // Distinct blocks that some sequence adopted (and still holds): memory that sequences share
  // rather than own. A scheduler charges each sequence for its private blocks only and takes
  // these from its capacity once.
  int32_t num_adopted_blocks() const { return num_adopted_; }
  // Blocks some sequence references (shared ones once).
  int32_t num_referenced_blocks() const {
    return allocator_.num_used() - num_evictable_blocks();
  }
  const PrefixCacheStats& prefix_stats() const { return stats_; }
  // Leading blocks of `seq` that are committed (published or adopted); 0 if unknown.
  int32_t num_committed_blocks(SeqId seq) const {
    auto it = seqs_.find(seq);
    return it == seqs_.end() ? 0 : static_cast<int32_t>(it->second.hashes.size());
  }

  absl::StatusOr<int64_t> Length(SeqId seq) const;
  // Only valid while the sequence lives and is not resized.
  const int32_t* BlockTable(SeqId seq) const;
  int32_t NumBlocksOf(SeqId seq) const;

  // Blocks that Reserve(seq, length) would newly allocate (0 if it already fits); a sequence
  // not yet added counts from zero.
  int32_t BlocksNeeded(SeqId seq, int64_t length) const;
  int32_t BlocksFor(int64_t length) const {
    return static_cast<int32_t>((length + config_.block_size - 1) / config_.block_size);
  }
  // Blocks Reserve can hand out: free ones, plus cached ones it may evict.
  int32_t num_free_blocks() const { return allocator_.num_free() + num_evictable_blocks(); }
  // Blocks sequences reference (cached-only blocks count as free: see num_free_blocks).
  int32_t num_used_blocks() const { return num_referenced_blocks(); }
  int32_t num_blocks() const { return allocator_.num_blocks(); }
  int64_t num_sequences() const { return static_cast<int64_t>(seqs_.size()); }

  // Slot index (block * block_size + offset) of token `pos` of `seq`; the block must exist.
  int64_t Slot(SeqId seq, int64_t pos) const;
  kernels::PagedKvLayer Layer(int32_t layer);

 private:
  struct Sequence {
    int64_t length = 0;
    std::vector<int32_t> blocks;
    // The chain hashes of the leading blocks whose content is committed (published or
    // adopted): they are never written again.
    std::vector<uint64_t> hashes;
    int32_t adopted = 0;  // leading blocks taken from the cache by AdoptPrefix
  };
  explicit PagedKvCache(const KvCacheConfig& config);

  uint64_t BlockHash(uint64_t prev, absl::Span<const int32_t> tokens) const;
  // THE lookup: how many of `prompt`'s leading full blocks (never the one with its last token)
  // are published, with each one's block and chain hash appended to `found` (if not null).
  int32_t MatchPrefix(absl::Span<const int32_t> prompt,
                      std::vector<std::pair<int32_t, uint64_t>>* found) const;
  // Allocates `count` blocks into `out`, evicting cached ones when the free list is short.
  absl::Status AllocateBlocks(int32_t count, std::vector<int32_t>* out);
  // A sequence lets go of `block`: a cached block left to the cache alone becomes evictable.
  void ReleaseBlock(int32_t block);
  void EvictOne();
  // `s` stops counting its adopted blocks from index `from` on.
  void Unadopt(Sequence& s, int32_t from);
  // Copies rows [0, rows) of block `from` into `to`, every layer, K and V.
  absl::Status CopyRows(int32_t from, int32_t to, int32_t rows);

  // Prefix cache: hash -> block; per block its hash (cached ones), the tokens it holds (to
  // confirm a hash match) and its place in the LRU of evictable blocks (by last use).
  absl::flat_hash_map<uint64_t, int32_t> by_hash_;
  std::vector<uint64_t> block_hash_;
  std::vector<bool> block_cached_;
  std::vector<int32_t> block_tokens_;  // [num_blocks][block_size]
  std::vector<uint64_t> last_use_;
  absl::btree_set<std::pair<uint64_t, int32_t>> lru_;  // (last use, block), evictable only
  std::vector<int32_t> adopt_refs_;  // per block: sequences holding it as adopted
  int32_t num_adopted_ = 0;          // blocks with adopt_refs_ > 0
  uint64_t tick_ = 0;
  PrefixCacheStats stats_;

  KvCacheConfig config_;
  uint64_t id_;
  BlockAllocator allocator_;
  uint64_t pool_bytes_ = 0;
  // per layer, each [num_blocks, kv_heads, block_size, head_dim], K slabs transposed
  // (kernels::PagedKvLayer)
  DeviceMemory* memory_ = nullptr;
  std::vector<DeviceBuffer> k_pools_, v_pools_;
  std::vector<DeviceBuffer> k_scales_, v_scales_;  // kInt8: per layer, [blocks][kv_heads][block_size]
  absl::flat_hash_map<SeqId, Sequence> seqs_;
};

}  // namespace specd::engine

#endif  // SPECD_ENGINE_PAGED_KV_CACHE_H_
