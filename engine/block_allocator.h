// Fixed pool of KV-cache block ids with reference counts (prefix sharing later).
#ifndef SPECD_ENGINE_BLOCK_ALLOCATOR_H_
#define SPECD_ENGINE_BLOCK_ALLOCATOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace specd::engine {

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t num_blocks);

  // Appends `count` fresh blocks (ref count 1) to `out`; RESOURCE_EXHAUSTED (and no change)
  // when fewer than `count` are free.
  absl::Status Allocate(int32_t count, std::vector<int32_t>* out);
  void Retain(int32_t block);  // one more owner
  void Release(int32_t block); // frees the block when its last owner releases it

  int32_t num_blocks() const { return static_cast<int32_t>(ref_counts_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_used() const { return num_blocks() - num_free(); }
  int32_t ref_count(int32_t block) const { return ref_counts_[block]; }

 private:
  std::vector<int32_t> free_;  // stack of free ids; lowest ids handed out first
  std::vector<int32_t> ref_counts_;
};

}  // namespace specd::engine

#endif  // SPECD_ENGINE_BLOCK_ALLOCATOR_H_
