// THE model drafter: a transformer proposes d_1..d_k for a batch of sequences — catch each up on
// its committed tokens (reusing whatever KV still matches), then k batched autoregressive
// steps, every token with the sparse q it was drawn from. In one process it runs a separate
// draft model (a second GGUF with the target's vocabulary) or self-speculation (the target's
// first L layers + its final norm and head, sharing the target's mmap'd weights), owning that
// LlamaModel and its paged KV cache and sharing the target's backend (they never run at the
// same time). The draft service runs the same class over its ModelHost (CreateOnRunner).
#ifndef SPECD_SPECULATION_MODEL_DRAFTER_H_
#define SPECD_SPECULATION_MODEL_DRAFTER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/communicator.h"
#include "engine/llama_model.h"
#include "engine/model_runner.h"
#include "engine/paged_kv_cache.h"
#include "common/gguf/gguf_file.h"
#include "speculation/drafter.h"
#include "kernels/kernel_types.h"

namespace specd::spec {

// The draft length the product runs with (specd generate, specd-bench, the draft service;
// docs/PERFORMANCE.md): drop a position the chain is unlikely to reach (a verified row costs
// ~0.1 of a decode step on a CPU), and start another draft round (~0.15 of a step for the
// shipped draft) only while the chain is as likely as not to survive. ModelDrafterOptions
// itself defaults to always drafting k.
inline constexpr double kDefaultMinKeep = 0.1;
inline constexpr double kDefaultMinExtend = 0.5;

struct ModelDrafterOptions {
  int32_t kv_blocks = 512;  // draft KV capacity in blocks (size it like the target's)
  int32_t block_size = 16;
  kernels::KvDtype kv_dtype = kernels::KvDtype::kF16;
  int32_t max_batch_tokens = 256;  // tokens per draft forward (catch-up / prefill chunks)
  int32_t max_sequences = 64;      // most sequences one Propose call drafts for
  int32_t proposal_top_n = sampling::kDefaultProposalTopN;  // q = draft's p truncated to top-n
  // Draft length from the draft's own confidence (sampling::DraftConfidence, which tracks how
  // often a token is accepted): after d_j the chain's survival estimate is the product of
  // d_1..d_j's confidences. d_j is proposed only while that product is >= min_keep (a verified
  // row costs little), and another draft round runs only while it is >= min_extend (a round
  // costs a draft forward). 0 and 0: always draft k. Lossless at any values.
  double min_keep = 0.0;
  double min_extend = 0.0;
};

// What the drafter checks a separate draft model against.
struct TargetIdentity {
  std::string name;  // the target model's file, for error messages
  uint64_t vocab_fingerprint = 0;
  int32_t vocab_size = 0;
  // The target's file, which must outlive the drafter: tensors a distilled draft does not carry
  // (its token embeddings) come from here. nullptr = the draft must be self-contained.
  const gguf::GgufFile* file = nullptr;
};

class ModelDrafter final : public Drafter {
 public:
  // A separate draft model from `draft_path`. INVALID_ARGUMENT naming both model files when
  // its vocabulary (tokenizer fingerprint or size) differs from the target's.
  static absl::StatusOr<std::unique_ptr<ModelDrafter>> CreateFromFile(
      const std::string& draft_path, const TargetIdentity& target, engine::Backend* backend,
      const ModelDrafterOptions& options);

  // Self-speculation over the target's own file: its first `layers` layers. `target_file` and
  // `backend` must outlive the drafter. INVALID_ARGUMENT unless 1 <= layers < total layers.
  static absl::StatusOr<std::unique_ptr<ModelDrafter>> CreateSelf(
      const gguf::GgufFile& target_file, int32_t layers, engine::Backend* backend,
      const ModelDrafterOptions& options);

  // Over a model someone else loaded (the draft service's ModelHost); `runner` must outlive the
  // drafter. At most the model's max_logit_rows sequences per Propose.
  static absl::StatusOr<std::unique_ptr<ModelDrafter>> CreateOnRunner(
      engine::ModelRunner* runner, const ModelDrafterOptions& options, std::string name);

  std::string_view name() const override { return name_; }
  absl::Status Propose(absl::Span<const DraftInput> in, absl::Span<DraftOutput> out) override;
  absl::Status Commit(SeqId seq, absl::Span<const int32_t> committed) override;
  void Release(SeqId seq) override;
  // A feature-conditioned draft model (LlamaModel::feature_conditioned): the row at position t
  // is fed the target's hidden state at t - 1 while it is known (AddFeatures), and a drafted
  // row is fed the draft's own hidden state of the row before it. Rows fed drafted features
  // are recomputed from the target's once it has verified them.
  bool wants_features() const override { return model().feature_conditioned(); }
  int32_t feature_dim() const override {
    return wants_features() ? model().config().embedding_dim : 0;
  }
  void AddFeatures(SeqId seq, int32_t first_pos, absl::Span<const float> rows) override;
  bool runs_model() const override { return true; }
  uint64_t weight_bytes() const override { return model().weight_bytes(); }
  const engine::PagedKvCache* kv_cache() const override { return &runner_->kv(); }
  int64_t CachedLength(SeqId seq) const override;
  // The tokens whose KV the drafter holds for `seq` (null if unknown): committed tokens and
  // the drafts fed after them.
  const std::vector<int32_t>* Fed(SeqId seq) const;

  const engine::LlamaModel& model() const { return runner_->model(); }

 private:
  ModelDrafter() = default;
  static absl::StatusOr<std::unique_ptr<ModelDrafter>> Build(
      std::unique_ptr<gguf::GgufFile> owned, const gguf::GgufFile& file, int32_t layers,
      engine::Backend* backend, const ModelDrafterOptions& options, std::string name,
      const gguf::GgufFile* borrow_from = nullptr);
  // Runs `batch_` into logits_, or, with a plan (one sequence per logit row: the runner samples
  // on its device), into device_q_ (the rows' proposals, made where the logits are); on
  // failure rolls `fed` back to what the KV now holds.
  absl::Status RunForward(const sampling::BlockwisePlan* plan = nullptr);
  // Adds `seq`, taking what the runner's prefix cache holds of `tokens` (fed_ = those).
  absl::Status AddWithCachedPrefix(SeqId seq, absl::Span<const int32_t> tokens);

  // Propose's steps (model_drafter.cc): which sequences draft and where each one's catch-up
  // starts; the catch-up, whose last rows give d_1; then one batched round per position.
  struct Work;
  struct Call;
  absl::StatusOr<std::vector<Work>> PlanWork(const Call& call);
  absl::Status CatchUp(const Call& call, std::vector<Work>& work);
  void BatchCatchUp(const Call& call, absl::Span<Work* const> pending,
                    std::vector<Work*>& finishing, std::vector<Work*>& rest);
  void KeepCaughtUpFeatures(const Call& call, Work& w, size_t r);
  absl::Status DraftRounds(const Call& call, std::vector<Work>& work);
  std::vector<Work*> BatchDraftRound(const Call& call, std::vector<Work>& work, int32_t j);
  absl::Status ForwardRows(const Call& call, absl::Span<Work* const> rows,
                           absl::Span<const int64_t> positions);
  absl::Status ProposeRow(const Call& call, Work& w, size_t r, int64_t position);

  std::string name_;
  ModelDrafterOptions options_;
  std::unique_ptr<gguf::GgufFile> owned_file_;  // null for self-drafting
  engine::LocalCommunicator comm_;
  std::unique_ptr<engine::LlamaModel> model_;      // owned in-process models only
  std::unique_ptr<engine::PagedKvCache> kv_;       // ditto
  std::unique_ptr<engine::LocalModelRunner> local_;
  engine::ModelRunner* runner_ = nullptr;          // local_ or the caller's
  // Tokens whose KV the draft cache holds, per sequence: always a prefix of what was fed.
  absl::flat_hash_map<SeqId, std::vector<int32_t>> fed_;
  // A feature-conditioned draft's per-sequence features: the target's hidden states from
  // position `base` on (those its next catch-up rows need), and how many leading KV rows were
  // fed the target's own features (the rest were fed drafted ones and are recomputed).
  struct SeqFeatures {
    int64_t base = 0;
    std::vector<float> rows;  // [n, D]: positions base .. base + n - 1
    int64_t true_len = 0;
  };
  absl::flat_hash_map<SeqId, SeqFeatures> features_;
  // Whether the features of rows [from, to) of `seq` are known (row t: the target's hidden
  // state at t - 1; zeros at t = 0), and appending them to batch_.input_features.
  bool KnowsTargetFeatures(SeqId seq, int64_t from, int64_t to) const;
  void AppendTargetFeatures(SeqId seq, int64_t from, int64_t to);
  engine::ForwardBatch batch_;
  std::vector<float> logits_;  // [logit rows of the current batch, vocab]
  std::vector<sampling::BlockwiseProposal> device_q_;  // [logit rows], when sampled on device
  std::vector<float> hidden_;  // [hidden rows of the current batch, D]
};

}  // namespace specd::spec

#endif  // SPECD_SPECULATION_MODEL_DRAFTER_H_
