#include "engine/backend.h"

#include <cstring>
#include <vector>

#include "common/gguf/ggml_type.h"

namespace specd::engine {

absl::Status CopyWeightTo(DeviceMemory& memory, kernels::WeightMatrix* w, WeightStorage* keep) {
  absl::StatusOr<uint64_t> row_bytes = gguf::RowBytes(w->type, w->cols);
  if (!row_bytes.ok()) return row_bytes.status();
  // Staged on the host so a column slice (a tensor-parallel shard: rows shorter than their
  // stride) lands compact.
  std::vector<uint8_t> staged(static_cast<size_t>(*row_bytes * w->rows));
  for (int64_t r = 0; r < w->rows; ++r) {
    std::memcpy(staged.data() + r * *row_bytes, w->data + r * w->row_bytes, *row_bytes);
  }
  absl::StatusOr<DeviceBuffer> buf = DeviceBuffer::Allocate(memory, staged.size());
  if (!buf.ok()) return buf.status();
  absl::Status st = memory.Upload(buf->data(), staged.data(), staged.size());
  if (!st.ok()) return st;
  w->data = buf->as<const uint8_t>();
  w->row_bytes = *row_bytes;
  w->packed = nullptr;
  keep->device.push_back(*std::move(buf));
  return absl::OkStatus();
}

absl::Status CopyVectorTo(DeviceMemory& memory, const float** v, int64_t n, WeightStorage* keep) {
  if (*v == nullptr) return absl::OkStatus();
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  absl::StatusOr<DeviceBuffer> buf = DeviceBuffer::Allocate(memory, bytes);
  if (!buf.ok()) return buf.status();
  absl::Status st = memory.Upload(buf->data(), *v, bytes);
  if (!st.ok()) return st;
  *v = buf->as<const float>();
  keep->device.push_back(*std::move(buf));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<sampling::VerifyResult>> Backend::VerifyBlockwise(
    const sampling::BlockwisePlan& plan, const float* logits, int64_t rows) {
  // One thread per block: the blocks (rows, then sequences) are small beside a forward.
  return sampling::VerifyBlockwiseOnHost(
      plan, absl::MakeConstSpan(logits, static_cast<size_t>(rows) * plan.vocab()), 1);
}

absl::StatusOr<std::vector<sampling::BlockwiseProposal>> Backend::ProposeBlockwise(
    const sampling::BlockwisePlan& plan, const float* logits, int64_t rows, int32_t top_n) {
  return sampling::ProposeBlockwiseOnHost(
      plan, absl::MakeConstSpan(logits, static_cast<size_t>(rows) * plan.vocab()), top_n, 1);
}

}  // namespace specd::engine
