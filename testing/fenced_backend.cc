#include "testing/fenced_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include <functional>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace specd::testing {
namespace {

using engine::DeviceMemory;
using kernels::PagedKvLayer;
using kernels::WeightMatrix;

class Fenced;

// The arena: a bump allocator over one PROT_NONE reservation.
class FencedMemory final : public DeviceMemory {
 public:
  FencedMemory(Fenced* owner, size_t capacity) : owner_(owner), capacity_(capacity) {
    void* p = mmap(nullptr, capacity, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    base_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  ~FencedMemory() override {
    if (base_ != nullptr) munmap(base_, capacity_);
  }
  bool host_addressable() const override { return false; }
  absl::StatusOr<void*> Allocate(size_t bytes) override;
  // A bump arena (tests are short): freed bytes are never handed out again, but they stop
  // being live, so a recorded step replayed onto them is caught (Fenced::RunStep).
  void Free(void* p) override { live_.erase(static_cast<const uint8_t*>(p)); }
  absl::Status Upload(void* dst, const void* src, size_t bytes) override;
  absl::Status Download(void* dst, const void* src, size_t bytes) override;
  absl::Status Copy2D(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                      size_t width, size_t rows) override;

  bool Contains(const void* p, size_t bytes) const {
    const auto* b = static_cast<const uint8_t*>(p);
    return base_ != nullptr && b >= base_ && b + bytes <= base_ + used_;
  }
  // Whether [p, p + bytes) lies inside one allocation not yet freed.
  bool Live(const void* p, size_t bytes) const {
    const auto* b = static_cast<const uint8_t*>(p);
    auto it = live_.upper_bound(b);
    if (it == live_.begin()) return false;
    --it;
    return b + bytes <= it->first + it->second;
  }
  size_t used() const { return used_; }
  void Protect(bool open) {
    if (used_ == 0) return;
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    mprotect(base_, (used_ + page - 1) / page * page, open ? PROT_READ | PROT_WRITE : PROT_NONE);
  }

 private:
  Fenced* owner_;
  size_t capacity_;
  uint8_t* base_ = nullptr;
  size_t used_ = 0;
  absl::btree_map<const uint8_t*, size_t> live_;  // allocation start -> bytes
};

class Fenced final : public FencedBackend {
 public:
  Fenced(size_t capacity, bool replays_steps)
      : memory_(this, capacity), inner_(engine::MakeReferenceBackend()), replays_steps_(replays_steps) {}

  std::string_view name() const override { return "fenced"; }
  DeviceMemory& memory() override { return memory_; }
  std::vector<std::string> violations() const override { return violations_; }
  size_t used() const override { return memory_.used(); }
  int64_t blockwise_verifications() const override { return blockwise_verifications_; }
  int64_t blockwise_proposals() const override { return blockwise_proposals_; }

  absl::Status PlaceWeight(WeightMatrix* w, engine::WeightUse use,
                           engine::WeightStorage* keep) override {
    absl::Status st = engine::CopyWeightTo(memory_, w, keep);
    if (!st.ok()) return st;
    FenceOpening open(*this);
    return inner_->PlaceWeight(w, use, keep);
  }
  absl::Status PlaceVector(const float** v, int64_t n, engine::WeightStorage* keep) override {
    return engine::CopyVectorTo(memory_, v, n, keep);
  }

  void MatMul(const WeightMatrix& w, const float* x, int64_t T, float* y) override {
    Check("MatMul", w, "w");
    Check("MatMul", x, T * w.cols, "x");
    Check("MatMul", y, T * w.rows, "y");
    Issue([=, this] {
      FenceOpening open(*this);
      inner_->MatMul(w, x, T, y);
    });
  }
  void MatMulExact(const WeightMatrix& w, const float* x, int64_t T, float* y) override {
    Check("MatMulExact", w, "w");
    Check("MatMulExact", x, T * w.cols, "x");
    Check("MatMulExact", y, T * w.rows, "y");
    Issue([=, this] {
      FenceOpening open(*this);
      inner_->MatMulExact(w, x, T, y);
    });
  }
  void RmsNorm(const float* x, const float* w, int64_t T, int64_t D, float eps,
               float* out) override {
    Check("RmsNorm", x, T * D, "x");
    Check("RmsNorm", w, D, "w");
    Check("RmsNorm", out, T * D, "out");
    Issue([=, this] {
      FenceOpening open(*this);
      inner_->RmsNorm(x, w, T, D, eps, out);
    });
  }
  void Rope(float* x, int64_t T, int64_t H, int64_t head_dim, const int32_t* positions,
            const kernels::RopeParams& params) override {
    Check("Rope", x, T * H * head_dim, "x");
    Check("Rope", positions, T, "positions");
    Issue([=, this] {
      FenceOpening open(*this);
      inner_->Rope(x, T, H, head_dim, positions, params);
    });
  }
  void SwiGlu(const float* gate, const float* up, int64_t T, int64_t F, float* out) override {
    Check("SwiGlu", gate, T * F, "gate");
    Check("SwiGlu", up, T * F, "up");
    Check("SwiGlu", out, T * F, "out");
    Issue([=, this] {
      FenceOpening open(*this);
      inner_->SwiGlu(gate, up, T, F, out);
    });
  }
  absl::StatusOr<std::vector<sampling::VerifyResult>> VerifyBlockwise(
      const sampling::BlockwisePlan& plan, const float* logits, int64_t rows) override {
    if (absl::Status st = RefuseWhileRecording("VerifyBlockwise"); !st.ok()) return st;
    Check("VerifyBlockwise", logits, rows * plan.vocab(), "logits");
    ++blockwise_verifications_;
    FenceOpening open(*this);
    return Backend::VerifyBlockwise(plan, logits, rows);  // the host twin, inside the fence
  }
  absl::StatusOr<std::vector<sampling::BlockwiseProposal>> ProposeBlockwise(
      const sampling::BlockwisePlan& plan, const float* logits, int64_t rows,
      int32_t top_n) override {
    if (absl::Status st = RefuseWhileRecording("ProposeBlockwise"); !st.ok()) return st;
    Check("ProposeBlockwise", logits, rows * plan.vocab(), "logits");
    ++blockwise_proposals_;
    FenceOpening open(*this);
    return Backend::ProposeBlockwise(plan, logits, rows, top_n);
  }
  void AddInPlace(float* x, const float* y, int64_t n) override {
    Check("AddInPlace", x, n, "x");
    Check("AddInPlace", y, n, "y");
    Issue([=, this] {
      FenceOpening open(*this);
      inner_->AddInPlace(x, y, n);
    });
  }
  void AddBias(float* x, const float* b, int64_t T, int64_t N) override {
    Check("AddBias", x, T * N, "x");
    Check("AddBias", b, N, "b");
    Issue([=, this] {
      FenceOpening open(*this);
      inner_->AddBias(x, b, T, N);
    });
  }
  void EmbeddingLookup(const WeightMatrix& table, const int32_t* ids, int64_t T,
                       float* out) override {
    Check("EmbeddingLookup", table, "table");
    Check("EmbeddingLookup", ids, T, "ids");
    Check("EmbeddingLookup", out, T * table.cols, "out");
    Issue([=, this] {
      FenceOpening open(*this);
      inner_->EmbeddingLookup(table, ids, T, out);
    });
  }
  void GatherRows(const float* x, const int32_t* rows, int64_t R, int64_t D,
                  float* out) override {
    Check("GatherRows", x, D, "x");
    Check("GatherRows", rows, R, "rows");
    Check("GatherRows", out, R * D, "out");
    Issue([=, this] {
      FenceOpening open(*this);
      inner_->GatherRows(x, rows, R, D, out);
    });
  }
  void WriteKv(const float* k, const float* v, const int64_t* slots, int64_t T,
               const PagedKvLayer& layer) override {
    const int64_t row = static_cast<int64_t>(layer.num_kv_heads) * layer.head_dim;
    Check("WriteKv", k, T * row, "k");
    Check("WriteKv", v, T * row, "v");
    Check("WriteKv", slots, T, "slots");
    Check("WriteKv", layer);
    Issue([=, this] {
      FenceOpening open(*this);
      inner_->WriteKv(k, v, slots, T, layer);
    });
  }
  absl::Status PlanAttention(const int32_t* positions, const int32_t* const* block_tables,
                             int64_t T, int32_t num_kv_heads, int32_t block_size) override {
    if (absl::Status st = RefuseWhileRecording("PlanAttention"); !st.ok()) return st;
    // The plan is host work: its arrays are host memory.
    if (memory_.Contains(positions, 1) || memory_.Contains(block_tables, 1)) {
      violations_.push_back("PlanAttention: arrays in device memory (the host plans)");
    }
    T_ = T;
    return inner_->PlanAttention(positions, block_tables, T, num_kv_heads, block_size);
  }
  void PagedAttention(const float* q, int64_t Hq, const PagedKvLayer& layer, float scale,
                      float* out) override {
    Check("PagedAttention", q, T_ * Hq * layer.head_dim, "q");
    Check("PagedAttention", out, T_ * Hq * layer.head_dim, "out");
    Check("PagedAttention", layer);
    Issue([=, this] {
      FenceOpening open(*this);
      inner_->PagedAttention(q, Hq, layer, scale, out);
    });
  }

  bool replays_steps() const override { return replays_steps_; }
  absl::Status RunStep(const engine::StepGraphKey& key,
                       absl::FunctionRef<absl::Status()> ops) override;
  void ForgetSteps(const void* owner) override {
    absl::erase_if(recordings_, [&](const auto& kv) {
      if (kv.first.owner != owner) return false;
      ++stats_.discarded;
      return true;
    });
    absl::erase_if(seen_, [&](const engine::StepGraphKey& k) { return k.owner == owner; });
    absl::erase_if(unrecordable_, [&](const engine::StepGraphKey& k) { return k.owner == owner; });
  }
  engine::StepGraphStats step_graph_stats() const override { return stats_; }

  // While a step is being recorded, ops (and Copy2D) are kept for replay, not run.
  bool recording() const { return recording_ != nullptr; }
  // Runs op now, or keeps it for the recording being made (a device's stream capture).
  void Issue(std::function<void()> op) {
    if (recording()) {
      recording_->push_back(std::move(op));
    } else {
      op();
    }
  }
  // What a device's capture refuses: work that is not an op on device memory. It is not done,
  // and the recording is not kept (the step then runs as it is).
  absl::Status RefuseWhileRecording(const char* what) {
    if (!recording()) return absl::OkStatus();
    violations_.push_back(absl::StrCat(what, " while a step is recorded"));
    recording_broken_ = true;
    return absl::FailedPreconditionError(absl::StrCat(what, " while a step is recorded"));
  }

  void Open() override {
    if (depth_++ == 0) memory_.Protect(true);
  }
  void Close() override {
    if (--depth_ == 0) memory_.Protect(false);
  }

 private:
  // An op's argument [p, p + bytes): in the arena now, and remembered by the step being
  // recorded, whose replays check it is still live memory (a device graph keeps the pointer).
  void CheckRange(const char* op, const void* p, size_t bytes, const char* arg) {
    if (bytes == 0) return;
    if (!memory_.Contains(p, bytes)) violations_.push_back(absl::StrCat(op, ": ", arg));
    if (recording()) recording_ranges_->push_back(RecordedRange{p, bytes, absl::StrCat(op, ": ", arg)});
  }
  template <typename T>
  void Check(const char* op, const T* p, int64_t n, const char* arg) {
    if (n > 0) CheckRange(op, p, static_cast<size_t>(n) * sizeof(T), arg);
  }
  void Check(const char* op, const WeightMatrix& w, const char* arg) {
    CheckRange(op, w.data, static_cast<size_t>(w.rows * w.row_bytes), arg);
  }
  void Check(const char* op, const PagedKvLayer& l) {
    const size_t bytes = static_cast<size_t>(l.num_blocks) * l.block_size * l.num_kv_heads *
                         l.head_dim * kernels::KvDtypeSize(l.dtype);
    CheckRange(op, l.k, bytes, "the KV pool");
    CheckRange(op, l.v, bytes, "the KV pool");
    if (l.dtype == kernels::KvDtype::kInt8) {
      CheckRange(op, l.k_scale, 4, "the int8 KV scales");
      CheckRange(op, l.v_scale, 4, "the int8 KV scales");
    }
  }

  FencedMemory memory_;
  int64_t blockwise_verifications_ = 0;
  int64_t blockwise_proposals_ = 0;
  std::unique_ptr<engine::Backend> inner_;
  int depth_ = 0;
  int64_t T_ = 0;  // the planned step's tokens
  std::vector<std::string> violations_;
  // Step recordings, as the CUDA backend keeps graphs: a key's first step runs op by op, its
  // second is recorded (ops kept, not run) and then replayed, as every later one is.
  bool replays_steps_;
  struct RecordedRange {
    const void* p;
    size_t bytes;
    std::string what;
  };
  struct Recording {
    std::vector<std::function<void()>> ops;
    std::vector<RecordedRange> ranges;  // every argument the ops were checked with
  };
  std::vector<std::function<void()>>* recording_ = nullptr;
  std::vector<RecordedRange>* recording_ranges_ = nullptr;
  bool recording_broken_ = false;
  absl::flat_hash_map<engine::StepGraphKey, Recording> recordings_;
  absl::flat_hash_set<engine::StepGraphKey> seen_, unrecordable_;
  engine::StepGraphStats stats_;
};

absl::Status Fenced::RunStep(const engine::StepGraphKey& key, absl::FunctionRef<absl::Status()> ops) {
  auto it = recordings_.find(key);
  if (it == recordings_.end()) {
    // The first step of this shape, or one whose recording failed (its buffers never move
    // here, so it would fail again): as it is.
    if (seen_.insert(key).second || unrecordable_.contains(key)) {
      ++stats_.eager;
      return ops();
    }
    Recording recorded;
    recording_ = &recorded.ops;
    recording_ranges_ = &recorded.ranges;
    recording_broken_ = false;
    absl::Status st = ops();
    recording_ = nullptr;
    recording_ranges_ = nullptr;
    if (!st.ok() || recording_broken_) {  // as a failed capture: run it as it is
      unrecordable_.insert(key);
      ++stats_.eager;
      return ops();
    }
    ++stats_.captures;
    it = recordings_.emplace(key, std::move(recorded)).first;
  }
  ++stats_.replays;
  // What a device would do with a graph naming freed memory (an illegal address, or another
  // buffer's bytes): named here, and the replay not run.
  for (const RecordedRange& r : it->second.ranges) {
    if (!memory_.Live(r.p, r.bytes)) {
      violations_.push_back(absl::StrCat("replay reads freed memory: ", r.what));
      return absl::FailedPreconditionError(absl::StrCat("replay reads freed memory: ", r.what));
    }
  }
  for (const std::function<void()>& op : it->second.ops) op();
  return absl::OkStatus();
}

absl::StatusOr<void*> FencedMemory::Allocate(size_t bytes) {
  if (absl::Status st = owner_->RefuseWhileRecording("Allocate"); !st.ok()) return st;
  const size_t at = (used_ + 63) / 64 * 64;
  if (base_ == nullptr || at + bytes > capacity_) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("fenced arena: %d bytes do not fit (%d of %d used)", bytes, used_,
                        capacity_));
  }
  used_ = at + bytes;
  live_[base_ + at] = bytes;
  FenceOpening open(*owner_);  // the new pages take the arena's protection
  std::memset(base_ + at, 0, bytes);
  return static_cast<void*>(base_ + at);
}

absl::Status FencedMemory::Upload(void* dst, const void* src, size_t bytes) {
  if (absl::Status st = owner_->RefuseWhileRecording("Upload"); !st.ok()) return st;
  if (bytes == 0) return absl::OkStatus();
  if (!Contains(dst, bytes)) return absl::InvalidArgumentError("Upload: dst not in the arena");
  FenceOpening open(*owner_);
  std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status FencedMemory::Download(void* dst, const void* src, size_t bytes) {
  if (absl::Status st = owner_->RefuseWhileRecording("Download"); !st.ok()) return st;
  if (bytes == 0) return absl::OkStatus();
  if (!Contains(src, bytes)) return absl::InvalidArgumentError("Download: src not in the arena");
  FenceOpening open(*owner_);
  std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status FencedMemory::Copy2D(void* dst, size_t dst_pitch, const void* src,
                                  size_t src_pitch, size_t width, size_t rows) {
  if (rows == 0 || width == 0) return absl::OkStatus();
  const size_t dst_span = (rows - 1) * dst_pitch + width, src_span = (rows - 1) * src_pitch + width;
  if (!Contains(dst, dst_span) || !Contains(src, src_span)) {
    return absl::InvalidArgumentError("Copy2D: an end is not in the arena");
  }
  auto copy = [=, this] {
    FenceOpening open(*owner_);
    for (size_t r = 0; r < rows; ++r) {
      std::memcpy(static_cast<uint8_t*>(dst) + r * dst_pitch,
                  static_cast<const uint8_t*>(src) + r * src_pitch, width);
    }
  };
  owner_->Issue(copy);  // a device-to-device copy: part of a recorded step
  return absl::OkStatus();
}

}  // namespace

FenceOpening::FenceOpening(FencedBackend& backend) : backend_(backend) { backend_.Open(); }
FenceOpening::~FenceOpening() { backend_.Close(); }

std::unique_ptr<FencedBackend> MakeFencedBackend(size_t capacity, bool replays_steps) {
  return std::make_unique<Fenced>(capacity, replays_steps);
}

}  // namespace specd::testing
