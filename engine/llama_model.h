// A Llama-family transformer over GGUF weights (mmap'd, never dequantized wholesale) running
// ragged batches against a paged KV cache. Written for tensor parallelism: a shard holds
// heads [rank*Hq/N, (rank+1)*Hq/N) and FFN columns likewise (Megatron column/row split) and
// calls Communicator::AllReduceSum after the attention output and FFN down projections.
#ifndef SPECD_ENGINE_LLAMA_MODEL_H_
#define SPECD_ENGINE_LLAMA_MODEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/communicator.h"
#include "engine/forward_batch.h"
#include "engine/model_config.h"
#include "engine/paged_kv_cache.h"
#include "common/gguf/gguf_file.h"
#include "kernels/kernel_types.h"

namespace specd::engine {

struct LayerWeights {
  const float* attn_norm = nullptr;  // [D]
  kernels::WeightMatrix wq, wk, wv;  // [Hq_local*d, D], [Hkv_local*d, D] x2
  const float* bq = nullptr;         // optional biases (Qwen2), local slices
  const float* bk = nullptr;
  const float* bv = nullptr;
  kernels::WeightMatrix wo;          // [D, Hq_local*d] (column slice of the full matrix)
  const float* ffn_norm = nullptr;   // [D]
  kernels::WeightMatrix w_gate, w_up;  // [F_local, D]
  kernels::WeightMatrix w_down;        // [D, F_local]
};

struct ModelWeights {
  kernels::WeightMatrix token_embd;  // [vocab, D]
  const float* output_norm = nullptr;
  kernels::WeightMatrix output;      // [vocab, D]; token_embd when tied; [N, D] with head ids
  // A truncated output head (distilled drafts): output row i scores token head_token_ids[i]
  // (tensor `output_token_ids`, I32 [N], strictly increasing); every other token gets logit
  // -inf, so the row is still a distribution over the whole vocabulary. nullptr = full head.
  const int32_t* head_token_ids = nullptr;
  std::vector<LayerWeights> layers;
  // A feature-conditioned draft (tools/distill/eagle.py): the first layer's input is
  // fc([rms(token_embd[x]) * input_tok_norm ; rms(feature) * input_feat_norm]) instead of the
  // embedding alone, the feature being the target's final hidden state (ForwardBatch::
  // input_features). Tensors eagle.fc.weight [D, 2D], eagle.tok_norm.weight,
  // eagle.feat_norm.weight [D]. fc.data == nullptr: a plain model.
  kernels::WeightMatrix input_fc;
  const float* input_tok_norm = nullptr;
  const float* input_feat_norm = nullptr;
};

struct ModelOptions {
  int32_t max_batch_tokens = 512;  // most tokens one Forward may carry
  int32_t max_logit_rows = 512;    // most logit rows one Forward may return
  // Run only the first N layers (then the final norm and head): self-speculation drafts.
  // 0 = all layers.
  int32_t num_layers = 0;
  // Float activations in every matmul instead of int8 activation blocks: slower, but free of
  // activation rounding (which makes logits differ by tenths between any two implementations).
  bool exact_activations = false;
  // Re-encode every 2-D weight to this type at load (dequantize + quantize into owned memory),
  // e.g. kF16 to get a full-precision target from a quantized file. Unset = use the file's.
  std::optional<gguf::GgmlType> reencode_weights;
  // Where tensors this file does not have come from: a distilled draft carries no
  // token_embd.weight and shares its target's (same vocabulary and width). Must outlive the
  // model. nullptr = every tensor must be in the file.
  const gguf::GgufFile* borrow_from = nullptr;
  // On a backend that records steps (CUDA graphs: Backend::replays_steps), steps of up to this
  // many tokens are padded to a bucket (StepBucket) and run as recordings; longer ones
  // (prefill) are issued op by op. 0 = never record.
  int32_t step_graph_max_tokens = 256;
};

// The rows a recorded step of n rows (tokens, logit rows or hidden rows; 1 <= n <= cap) is
// padded to: powers of two up to 8, multiples of 8 up to 64, then multiples of 32; at most cap.
// The GPU's MatMul reads each weight row once per 8 tokens (kernels/cuda/matmul.cu
// kWarpTokens), so padding past the next multiple of 8 reads the weights again for rows that
// are thrown away: a batch of 32 sequences verifying 1-4 drafts each (33-160 rows) used to pad
// to 64, 128 or 256. Few enough shapes stay to record each once: 17 up to 256 rows.
int64_t StepBucket(int64_t n, int64_t cap);

class LlamaModel {
 public:
  ~LlamaModel();
  // `file`, `backend` and `comm` must outlive the model. The shard is comm->rank() of
  // comm->world_size().
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const gguf::GgufFile& file,
                                                          Backend* backend, Communicator* comm,
                                                          const ModelOptions& options);

  const ModelConfig& config() const { return config_; }
  Backend* backend() const { return backend_; }
  const ModelOptions& options() const { return options_; }
  int32_t num_layers() const { return static_cast<int32_t>(weights_.layers.size()); }
  int32_t local_heads() const { return local_heads_; }
  int32_t local_kv_heads() const { return local_kv_heads_; }
  int32_t vocab_size() const { return config_.vocab_size; }
  // True for a feature-conditioned draft: every Forward needs batch.input_features.
  bool feature_conditioned() const { return weights_.input_fc.data != nullptr; }
  // Bytes of weights one decode step reads (for roofline estimates).
  uint64_t weight_bytes() const { return weight_bytes_; }

  // A KV cache shaped for this model's shard.
  KvCacheConfig MakeKvCacheConfig(int32_t num_blocks, int32_t block_size,
                                  kernels::KvDtype dtype) const;

  // Runs `batch`, writing logits [batch.logit_rows.size(), vocab] row-major into `logits` and
  // the final hidden states of batch.hidden_rows, [hidden_rows.size(), D], into `hidden` (may
  // be null without hidden rows). Each sequence must already exist in `kv`; it is cut to its
  // slice's start_pos and grown to start_pos + num_tokens. Errors: INVALID_ARGUMENT naming the
  // bad field, RESOURCE_EXHAUSTED when KV blocks run out (then no KV is written).
  // logits null: they stay in the backend's memory, at step_logits() (a backend whose memory
  // the host cannot address, with the full output head: verification on the device).
  absl::Status Forward(const ForwardBatch& batch, PagedKvCache& kv, float* logits,
                       float* hidden = nullptr);
  // The last Forward's logits [batch.logit_rows.size(), vocab] in the backend's memory, when
  // it was given no logits buffer; valid until the next Forward.
  const float* step_logits() const { return ws_.logits.as<float>(); }
  // Whether Forward can keep its logits in the backend's memory (logits null).
  bool keeps_logits_on_backend() const;
  // What Forward checks before it runs anything (tensor-parallel ranks agree on it before any
  // of them enters a collective).
  absl::Status Validate(const ForwardBatch& batch, const PagedKvCache& kv) const;

 private:
  LlamaModel() = default;
  absl::Status LoadWeights(const gguf::GgufFile& file, int rank, int world);
  absl::Status ReencodeWeights(gguf::GgmlType type);  // options_.reencode_weights
  // Hands every weight to the backend (PlaceWeight, PlaceVector): its memory, its layout.
  absl::Status PlaceWeights();
  // The activation workspace and the step's index arrays, in the backend's memory.
  absl::Status AllocateWorkspace();
  // The sizes a step's ops run at: the batch's own, or padded to a bucket when the step
  // runs as a recording (then `key` names the recording).
  struct StepShape {
    int64_t tokens = 0, logit_rows = 0, hidden_rows = 0;
    bool recorded = false;
    StepGraphKey key;
  };
  StepShape ShapeStep(const ForwardBatch& batch) const;
  // The step's host indices (positions_, slots_, block_tables_) after KV is reserved.
  absl::Status PrepareStep(const ForwardBatch& batch, PagedKvCache& kv);
  // tokens, positions, slots, output rows and input features into the backend's memory, with
  // padding rows up to the shape (token 0 at position 0, no KV slot, output row 0); the
  // step's attention planned for the batch's own tokens.
  absl::Status UploadStep(const ForwardBatch& batch, const PagedKvCache& kv, const StepShape& shape);
  // Every op of the step at the shape's sizes, outputs into logits_out / hidden_out (the
  // caller's buffers, or the workspace's): no upload, no download, no host decision on data.
  absl::Status IssueStep(const StepShape& shape, PagedKvCache& kv, float* logits_out, float* hidden_out);
  absl::Status RunLayer(int32_t l, int64_t T, PagedKvCache& kv);
  // The hidden rows and the head's rows (IssueStep's last ops).
  void IssueOutputs(const StepShape& shape, float* logits_out, float* hidden_out);
  // The batch's own rows of what IssueStep left in the workspace, out to the caller's host
  // buffers (a truncated head's rows scattered over the vocabulary).
  absl::Status CollectOutputs(const ForwardBatch& batch, float* logits, float* hidden,
                              bool logits_in_workspace, bool hidden_in_workspace);
  absl::Status LoadHeadTokenIds(const gguf::GgufFile& file);  // output_token_ids, if present
  absl::Status LoadInputFc(const gguf::GgufFile& file, int world);  // eagle.*, if present
  // x_ = the first layer's input: token embeddings, or for a feature-conditioned draft the
  // fused (embedding, feature) rows.
  void EmbedInputs(int64_t T);
  void MatMul(const kernels::WeightMatrix& w, const float* x, int64_t T, float* y) {
    if (options_.exact_activations) {
      backend_->MatMulExact(w, x, T, y);
    } else {
      backend_->MatMul(w, x, T, y);
    }
  }
  // Several products of the same input (q/k/v, gate/up).
  void MatMulShared(const kernels::WeightMatrix* ws, int n, const float* x, int64_t T,
                    float* const* ys) {
    if (options_.exact_activations) {
      for (int i = 0; i < n; ++i) backend_->MatMulExact(ws[i], x, T, ys[i]);
    } else {
      backend_->MatMulShared(ws, n, x, T, ys);
    }
  }

  ModelConfig config_;
  ModelOptions options_;
  ModelWeights weights_;
  Backend* backend_ = nullptr;
  Communicator* comm_ = nullptr;
  int32_t local_heads_ = 0, local_kv_heads_ = 0, local_ffn_ = 0;
  uint64_t weight_bytes_ = 0;
  WeightStorage weight_storage_;  // re-encoded, packed and device copies of the weights

  // Workspace in the backend's memory, sized once for max_batch_tokens (T) and
  // max_logit_rows (R): no allocation on the hot path.
  struct Workspace {
    DeviceBuffer x, h, o;               // [T, D]
    DeviceBuffer q, attn;               // [T, Hq * d]
    DeviceBuffer k, v;                  // [T, Hkv * d]
    DeviceBuffer gate, up, act;         // [T, F]
    DeviceBuffer head_in;               // [R, D]
    DeviceBuffer features, fused;       // [T, D], [T, 2D]: a feature-conditioned draft's input
    DeviceBuffer head_out;              // [R, N]: a truncated head's rows before the scatter
    DeviceBuffer logits;                // [R, vocab]: memory the host cannot read only
    DeviceBuffer hidden;                // [T, D]: the same
    DeviceBuffer tokens, positions;     // [T] int32
    DeviceBuffer slots;                 // [T] int64
    DeviceBuffer logit_rows, hidden_rows;  // [R], [T] int32
  } ws_;
  // The KV cache (PagedKvCache::id) this model's recorded steps name; steps on another cache
  // first drop them.
  uint64_t recorded_kv_id_ = 0;
  // The step's host indices (positions_, slots_ and the staged rows padded to the shape).
  std::vector<int32_t> positions_;
  std::vector<int64_t> slots_;
  std::vector<const int32_t*> block_tables_;
  std::vector<int32_t> staged_tokens_, staged_logit_rows_, staged_hidden_rows_;
  std::vector<float> head_out_host_;  // [R, N]: a truncated head's rows, scattered on the host
};

}  // namespace specd::engine

#endif  // SPECD_ENGINE_LLAMA_MODEL_H_
