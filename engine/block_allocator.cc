#include "engine/block_allocator.h"

#include "common/util/check.h"
#include "absl/strings/str_format.h"

namespace specd::engine {

BlockAllocator::BlockAllocator(int32_t num_blocks) : ref_counts_(num_blocks, 0) {
  free_.reserve(num_blocks);
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

absl::Status BlockAllocator::Allocate(int32_t count, std::vector<int32_t>* out) {
  if (count < 0) return absl::InvalidArgumentError("block count must be >= 0");
  if (count > num_free()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "KV cache out of blocks: need %d, %d of %d free", count, num_free(), num_blocks()));
  }
  for (int32_t i = 0; i < count; ++i) {
    const int32_t b = free_.back();
    free_.pop_back();
    ref_counts_[b] = 1;
    out->push_back(b);
  }
  return absl::OkStatus();
}

void BlockAllocator::Retain(int32_t block) {
  SPECD_CHECK(ref_counts_[block] > 0, "retain of free block %d", block);
  ++ref_counts_[block];
}

void BlockAllocator::Release(int32_t block) {
  SPECD_CHECK(ref_counts_[block] > 0, "double free of block %d", block);
  if (--ref_counts_[block] == 0) free_.push_back(block);
}

}  // namespace specd::engine
