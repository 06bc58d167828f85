// Paged KV cache: one preallocated K and V pool per layer, split into fixed-size blocks;
// each sequence owns a block table. Rollback (Truncate) frees whole blocks.
#ifndef SPECD_ENGINE_PAGED_KV_CACHE_H_
#define SPECD_ENGINE_PAGED_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/block_allocator.h"
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
};

size_t KvDtypeBytes(kernels::KvDtype dtype);

class PagedKvCache {
 public:
  static absl::StatusOr<std::unique_ptr<PagedKvCache>> Create(const KvCacheConfig& config);
  ~PagedKvCache();

  const KvCacheConfig& config() const { return config_; }
  // Bytes held by the K and V pools of all layers.
  uint64_t pool_bytes() const { return pool_bytes_; }

  absl::Status AddSequence(SeqId seq);  // ALREADY_EXISTS if present
  bool HasSequence(SeqId seq) const { return seqs_.contains(seq); }
  void FreeSequence(SeqId seq);         // no-op if absent
  // Makes room for `length` tokens (allocating blocks); RESOURCE_EXHAUSTED leaves it unchanged.
  absl::Status Reserve(SeqId seq, int64_t length);
  // Shortens to `length` tokens, releasing blocks no longer needed.
  absl::Status Truncate(SeqId seq, int64_t length);

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
  int32_t num_free_blocks() const { return allocator_.num_free(); }
  int32_t num_used_blocks() const { return allocator_.num_used(); }
  int32_t num_blocks() const { return allocator_.num_blocks(); }
  int64_t num_sequences() const { return static_cast<int64_t>(seqs_.size()); }

  // Slot index (block * block_size + offset) of token `pos` of `seq`; the block must exist.
  int64_t Slot(SeqId seq, int64_t pos) const;
  kernels::PagedKvLayer Layer(int32_t layer);

 private:
  struct Sequence {
    int64_t length = 0;
    std::vector<int32_t> blocks;
  };
  explicit PagedKvCache(const KvCacheConfig& config);

  KvCacheConfig config_;
  BlockAllocator allocator_;
  uint64_t pool_bytes_ = 0;
  // per layer, each [num_blocks, kv_heads, block_size, head_dim] (kernels::PagedKvLayer)
  std::vector<uint8_t*> k_pools_, v_pools_;
  absl::flat_hash_map<SeqId, Sequence> seqs_;
};

}  // namespace specd::engine

#endif  // SPECD_ENGINE_PAGED_KV_CACHE_H_
