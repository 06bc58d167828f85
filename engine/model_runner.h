// A model with its paged KV cache as one thing that runs forwards: what drafters and the
// calibration drive. In one process it is a LlamaModel and a PagedKvCache (LocalModelRunner);
// in a service it is the ModelHost, which runs every call on all tensor-parallel ranks.
#ifndef SPECD_ENGINE_MODEL_RUNNER_H_
#define SPECD_ENGINE_MODEL_RUNNER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/forward_batch.h"
#include "engine/llama_model.h"
#include "engine/paged_kv_cache.h"

namespace specd::engine {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // One ragged forward; logits: [batch.logit_rows.size(), vocab]; hidden (may be null when
  // batch.hidden_rows is empty): [batch.hidden_rows.size(), embedding_dim]. RESOURCE_EXHAUSTED
  // (KV full) before any KV is written.
  virtual absl::Status Forward(const ForwardBatch& batch, float* logits, float* hidden) = 0;
  // Sampling where the logits are: one forward that keeps its logits in the backend's memory,
  // then the backend verifies a target's rows (Backend::VerifyBlockwise: only tokens come back)
  // or proposes a draft's (Backend::ProposeBlockwise: only q comes back). The plan's rows are
  // batch.logit_rows'. Only where samples_on_device(); UNIMPLEMENTED otherwise.
  virtual bool samples_on_device() const { return false; }
  virtual absl::StatusOr<std::vector<sampling::VerifyResult>> ForwardAndVerify(
      const ForwardBatch& batch, const sampling::BlockwisePlan& plan, float* hidden) {
    return absl::UnimplementedError("this model runner samples on the host");
  }
  virtual absl::StatusOr<std::vector<sampling::BlockwiseProposal>> ForwardAndPropose(
      const ForwardBatch& batch, const sampling::BlockwisePlan& plan, int32_t top_n,
      float* hidden) {
    return absl::UnimplementedError("this model runner samples on the host");
  }
  virtual absl::Status AddSequence(SeqId seq) = 0;  // ALREADY_EXISTS if present
  virtual void FreeSequence(SeqId seq) = 0;         // no-op if absent
  // Rollback: keeps the first `length` tokens' KV, frees blocks past them.
  virtual absl::Status Truncate(SeqId seq, int64_t length) = 0;
  // Prefix caching (PagedKvCache): a sequence just added takes the cached KV of `prompt`'s
  // leading full blocks (returns the tokens adopted; 0 with caching off), and a sequence's
  // committed full blocks are offered to the cache once their KV is written.
  virtual absl::StatusOr<int64_t> AdoptPrefix(SeqId seq, absl::Span<const int32_t> prompt) = 0;
  virtual absl::Status Publish(SeqId seq, absl::Span<const int32_t> committed) = 0;
  virtual void DropPrefixCache() = 0;  // evicts every cached block no sequence holds
  virtual const PagedKvCache& kv() const = 0;  // this rank's (rank 0's) cache
  virtual const LlamaModel& model() const = 0;
};

// A model and a cache in this process; both must outlive the runner.
class LocalModelRunner final : public ModelRunner {
 public:
  LocalModelRunner(LlamaModel* model, PagedKvCache* kv) : model_(model), kv_(kv) {}
  absl::Status Forward(const ForwardBatch& batch, float* logits, float* hidden) override {
    return model_->Forward(batch, *kv_, logits, hidden);
  }
  bool samples_on_device() const override { return model_->keeps_logits_on_backend(); }
  absl::StatusOr<std::vector<sampling::VerifyResult>> ForwardAndVerify(
      const ForwardBatch& batch, const sampling::BlockwisePlan& plan, float* hidden) override {
    if (absl::Status st = model_->Forward(batch, *kv_, nullptr, hidden); !st.ok()) return st;
    return model_->backend()->VerifyBlockwise(plan, model_->step_logits(),
                                              static_cast<int64_t>(batch.logit_rows.size()));
  }
  absl::StatusOr<std::vector<sampling::BlockwiseProposal>> ForwardAndPropose(
      const ForwardBatch& batch, const sampling::BlockwisePlan& plan, int32_t top_n,
      float* hidden) override {
    if (absl::Status st = model_->Forward(batch, *kv_, nullptr, hidden); !st.ok()) return st;
    return model_->backend()->ProposeBlockwise(
        plan, model_->step_logits(), static_cast<int64_t>(batch.logit_rows.size()), top_n);
  }
  absl::Status AddSequence(SeqId seq) override { return kv_->AddSequence(seq); }
  void FreeSequence(SeqId seq) override { kv_->FreeSequence(seq); }
  absl::Status Truncate(SeqId seq, int64_t length) override { return kv_->Truncate(seq, length); }
  absl::StatusOr<int64_t> AdoptPrefix(SeqId seq, absl::Span<const int32_t> prompt) override {
    return kv_->AdoptPrefix(seq, prompt);
  }
  absl::Status Publish(SeqId seq, absl::Span<const int32_t> committed) override {
    return kv_->Publish(seq, committed);
  }
  void DropPrefixCache() override { kv_->DropCache(); }
  const PagedKvCache& kv() const override { return *kv_; }
  const LlamaModel& model() const override { return *model_; }

 private:
  LlamaModel* model_;
  PagedKvCache* kv_;
};

}  // namespace specd::engine

#endif  // SPECD_ENGINE_MODEL_RUNNER_H_
