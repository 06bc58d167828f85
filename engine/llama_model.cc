#include "engine/llama_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "common/gguf/ggml_type.h"
#include "common/gguf/quants.h"

namespace specd::engine {
namespace {

using kernels::WeightMatrix;

absl::StatusOr<const gguf::TensorInfo*> RequireTensor(const gguf::GgufFile& f,
                                                      const std::string& name) {
  const gguf::TensorInfo* t = f.FindTensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("missing tensor ", name));
  return t;
}

// A 2-D weight [rows, cols] (ggml dims {cols, rows}).
absl::StatusOr<WeightMatrix> Matrix(const gguf::GgufFile& f, const std::string& name,
                                    int64_t rows, int64_t cols) {
  absl::StatusOr<const gguf::TensorInfo*> t = RequireTensor(f, name);
  if (!t.ok()) return t.status();
  const gguf::TensorInfo& ti = **t;
  if (ti.dims.size() != 2 || ti.dims[0] != cols || ti.dims[1] != rows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor %s has dims [%s], expected [%d, %d]", name,
        absl::StrJoin(ti.dims, ", "), cols, rows));
  }
  absl::StatusOr<uint64_t> row_bytes = gguf::RowBytes(ti.type, cols);
  if (!row_bytes.ok()) return row_bytes.status();
  WeightMatrix w;
  w.type = ti.type;
  w.data = ti.data;
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = *row_bytes;
  return w;
}

absl::StatusOr<const float*> Vector(const gguf::GgufFile& f, const std::string& name,
                                    int64_t n) {
  absl::StatusOr<const gguf::TensorInfo*> t = RequireTensor(f, name);
  if (!t.ok()) return t.status();
  const gguf::TensorInfo& ti = **t;
  if (ti.type != gguf::GgmlType::kF32 || ti.num_elements != n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor %s must be F32 with %d elements (is %s with %d)", name, n,
        gguf::GgmlTypeName(ti.type), ti.num_elements));
  }
  return reinterpret_cast<const float*>(ti.data);
}

// Rows [begin, begin + n) of w: a column-parallel shard.
WeightMatrix RowSlice(const WeightMatrix& w, int64_t begin, int64_t n) {
  WeightMatrix s = w;
  s.data = w.data + begin * w.row_bytes;
  s.rows = n;
  return s;
}

// Columns [begin, begin + n) of w: a row-parallel shard. Quantized blocks cannot be split.
absl::StatusOr<WeightMatrix> ColSlice(const WeightMatrix& w, const std::string& name,
                                      int64_t begin, int64_t n) {
  if (begin == 0 && n == w.cols) return w;
  absl::StatusOr<gguf::GgmlTypeTraits> traits = gguf::GetTypeTraits(w.type);
  if (!traits.ok()) return traits.status();
  if (begin % traits->block_size != 0 || n % traits->block_size != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor %s: shard columns [%d, %d) do not align to %s blocks of %d", name, begin,
        begin + n, traits->name, traits->block_size));
  }
  WeightMatrix s = w;
  s.data = w.data + begin / traits->block_size * traits->type_size;
  s.cols = n;
  return s;
}

uint64_t Bytes(const WeightMatrix& w) { return w.row_bytes * w.rows; }

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const gguf::GgufFile& file,
                                                             Backend* backend,
                                                             Communicator* comm,
                                                             const ModelOptions& options) {
  if (options.max_batch_tokens <= 0 || options.max_logit_rows <= 0) {
    return absl::InvalidArgumentError("max_batch_tokens and max_logit_rows must be > 0");
  }
  std::unique_ptr<LlamaModel> m(new LlamaModel());
  absl::StatusOr<ModelConfig> config = ReadModelConfig(file);
  if (!config.ok()) return config.status();
  m->config_ = *config;
  if (file.FindTensor("rope_freqs.weight") != nullptr) {
    // Llama 3.1+ as converted by llama.cpp: the scaled frequencies ship as a tensor.
    absl::StatusOr<const float*> factors =
        Vector(file, "rope_freqs.weight", m->config_.rope.rope_dim / 2);
    if (!factors.ok()) return factors.status();
    for (int32_t i = 0; i < m->config_.rope.rope_dim / 2; ++i) {
      if (!((*factors)[i] > 0.0f) || !std::isfinite((*factors)[i])) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "tensor rope_freqs.weight[%d] = %g: frequency factors must be finite and > 0", i,
            (*factors)[i]));
      }
    }
    m->config_.rope.freq_factors = *factors;
  }
  m->options_ = options;
  m->backend_ = backend;
  m->comm_ = comm;
  absl::Status st = m->LoadWeights(file, comm->rank(), comm->world_size());
  if (!st.ok()) return st;
  if (options.reencode_weights.has_value()) {
    st = m->ReencodeWeights(*options.reencode_weights);
    if (!st.ok()) return st;
  }
  st = m->PlaceWeights();
  if (!st.ok()) return st;
  st = m->AllocateWorkspace();
  if (!st.ok()) return st;
  return m;
}

absl::Status LlamaModel::AllocateWorkspace() {
  DeviceMemory& mem = backend_->memory();
  if (!mem.host_addressable() && !comm_->reduces_device_memory()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "backend %s keeps activations in device memory, which this communicator (%d ranks) "
        "cannot reduce: tensor parallelism on a device backend needs NCCL",
        backend_->name(), comm_->world_size()));
  }
  const int64_t T = options_.max_batch_tokens, R = options_.max_logit_rows;
  const int64_t D = config_.embedding_dim, d = config_.head_dim;
  const int64_t f = sizeof(float);
  absl::Status st;
  auto alloc = [&](DeviceBuffer& b, int64_t bytes) {
    if (!st.ok() || bytes == 0) return;
    absl::StatusOr<DeviceBuffer> r = DeviceBuffer::Allocate(mem, static_cast<size_t>(bytes));
    if (r.ok()) {
      b = *std::move(r);
    } else {
      st = absl::ResourceExhaustedError(
          absl::StrCat("model workspace (max_batch_tokens ", T, "): ", r.status().message()));
    }
  };
  alloc(ws_.x, T * D * f);
  alloc(ws_.h, T * D * f);
  alloc(ws_.o, T * D * f);
  alloc(ws_.q, T * local_heads_ * d * f);
  alloc(ws_.attn, T * local_heads_ * d * f);
  alloc(ws_.k, T * local_kv_heads_ * d * f);
  alloc(ws_.v, T * local_kv_heads_ * d * f);
  alloc(ws_.gate, T * local_ffn_ * f);
  alloc(ws_.up, T * local_ffn_ * f);
  alloc(ws_.act, T * local_ffn_ * f);
  alloc(ws_.head_in, R * D * f);
  if (feature_conditioned()) {
    alloc(ws_.features, T * D * f);
    alloc(ws_.fused, T * 2 * D * f);
  }
  if (weights_.head_token_ids != nullptr) {
    alloc(ws_.head_out, R * weights_.output.rows * f);
    head_out_host_.resize(static_cast<size_t>(R * weights_.output.rows));
  } else if (!mem.host_addressable() || backend_->replays_steps()) {
    alloc(ws_.logits, R * config_.vocab_size * f);
  }
  if (!mem.host_addressable() || backend_->replays_steps()) alloc(ws_.hidden, T * D * f);
  alloc(ws_.tokens, T * sizeof(int32_t));
  alloc(ws_.positions, T * sizeof(int32_t));
  alloc(ws_.slots, T * sizeof(int64_t));
  alloc(ws_.logit_rows, R * sizeof(int32_t));
  alloc(ws_.hidden_rows, T * sizeof(int32_t));
  positions_.resize(T);
  slots_.resize(T);
  block_tables_.resize(T);
  return st;
}

absl::Status LlamaModel::LoadHeadTokenIds(const gguf::GgufFile& f) {
  const gguf::TensorInfo* t = f.FindTensor("output_token_ids");
  if (t == nullptr) return absl::OkStatus();
  if (t->type != gguf::GgmlType::kI32 || t->dims.size() != 1 || t->num_elements < 1 ||
      t->num_elements > config_.vocab_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor output_token_ids must be I32 with 1..%d elements (is %s with %d)",
        config_.vocab_size, gguf::GgmlTypeName(t->type), t->num_elements));
  }
  const int32_t* ids = reinterpret_cast<const int32_t*>(t->data);
  for (int64_t i = 0; i < t->num_elements; ++i) {
    if (ids[i] < 0 || ids[i] >= config_.vocab_size || (i > 0 && ids[i] <= ids[i - 1])) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tensor output_token_ids[%d] = %d: ids must be strictly increasing and in [0, %d)", i,
          ids[i], config_.vocab_size));
    }
  }
  weights_.head_token_ids = ids;
  return absl::OkStatus();
}

absl::Status LlamaModel::LoadWeights(const gguf::GgufFile& f, int rank, int world) {
  const ModelConfig& c = config_;
  if (world <= 0 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(absl::StrFormat("bad shard %d of %d", rank, world));
  }
  if (c.num_heads % world != 0 || c.num_kv_heads % world != 0 || c.ffn_dim % world != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot split %d heads / %d kv heads / ffn %d over %d ranks", c.num_heads,
        c.num_kv_heads, c.ffn_dim, world));
  }
  local_heads_ = c.num_heads / world;
  local_kv_heads_ = c.num_kv_heads / world;
  local_ffn_ = c.ffn_dim / world;
  const int64_t D = c.embedding_dim, d = c.head_dim;
  const int64_t q_rows = static_cast<int64_t>(c.num_heads) * d;
  const int64_t kv_rows = static_cast<int64_t>(c.num_kv_heads) * d;
  const int64_t q0 = rank * local_heads_ * d, kv0 = rank * local_kv_heads_ * d;
  const int64_t f0 = static_cast<int64_t>(rank) * local_ffn_;

  absl::StatusOr<WeightMatrix> m = absl::NotFoundError("");
  if (f.FindTensor("token_embd.weight") == nullptr && options_.borrow_from != nullptr) {
    m = Matrix(*options_.borrow_from, "token_embd.weight", c.vocab_size, D);
    if (!m.ok()) {
      return absl::Status(m.status().code(),
                          absl::StrCat("borrowing token_embd.weight from the target model: ",
                                       m.status().message()));
    }
  } else {
    m = Matrix(f, "token_embd.weight", c.vocab_size, D);
    if (!m.ok() && f.FindTensor("token_embd.weight") == nullptr) {
      return absl::NotFoundError(
          "missing tensor token_embd.weight (a distilled draft borrows it from its target "
          "model: specd-draft --borrow-from TARGET.gguf; specd generate --draft passes the "
          "target)");
    }
  }
  if (!m.ok()) return m.status();
  weights_.token_embd = *m;
  absl::StatusOr<const float*> vec = Vector(f, "output_norm.weight", D);
  if (!vec.ok()) return vec.status();
  weights_.output_norm = *vec;
  if (c.tied_output) {
    weights_.output = weights_.token_embd;
  } else {
    absl::Status st = LoadHeadTokenIds(f);
    if (!st.ok()) return st;
    const int64_t head_rows = weights_.head_token_ids != nullptr
                                  ? f.FindTensor("output_token_ids")->num_elements
                                  : c.vocab_size;
    m = Matrix(f, "output.weight", head_rows, D);
    if (!m.ok()) return m.status();
    weights_.output = *m;
  }
  weight_bytes_ = Bytes(weights_.output);

  const int32_t layers =
      options_.num_layers > 0 ? std::min(options_.num_layers, c.num_layers) : c.num_layers;
  weights_.layers.resize(layers);
  for (int32_t l = 0; l < layers; ++l) {
    LayerWeights& w = weights_.layers[l];
    const std::string p = absl::StrCat("blk.", l, ".");
#define SPECD_TRY_ASSIGN(lhs, expr)     \
  do {                                  \
    auto _r = (expr);                   \
    if (!_r.ok()) return _r.status();   \
    lhs = *_r;                          \
  } while (0)
    SPECD_TRY_ASSIGN(w.attn_norm, Vector(f, p + "attn_norm.weight", D));
    SPECD_TRY_ASSIGN(w.ffn_norm, Vector(f, p + "ffn_norm.weight", D));
    WeightMatrix full;
    SPECD_TRY_ASSIGN(full, Matrix(f, p + "attn_q.weight", q_rows, D));
    w.wq = RowSlice(full, q0, local_heads_ * d);
    SPECD_TRY_ASSIGN(full, Matrix(f, p + "attn_k.weight", kv_rows, D));
    w.wk = RowSlice(full, kv0, local_kv_heads_ * d);
    SPECD_TRY_ASSIGN(full, Matrix(f, p + "attn_v.weight", kv_rows, D));
    w.wv = RowSlice(full, kv0, local_kv_heads_ * d);
    SPECD_TRY_ASSIGN(full, Matrix(f, p + "attn_output.weight", D, q_rows));
    SPECD_TRY_ASSIGN(w.wo, ColSlice(full, p + "attn_output.weight", q0, local_heads_ * d));
    SPECD_TRY_ASSIGN(full, Matrix(f, p + "ffn_gate.weight", c.ffn_dim, D));
    w.w_gate = RowSlice(full, f0, local_ffn_);
    SPECD_TRY_ASSIGN(full, Matrix(f, p + "ffn_up.weight", c.ffn_dim, D));
    w.w_up = RowSlice(full, f0, local_ffn_);
    SPECD_TRY_ASSIGN(full, Matrix(f, p + "ffn_down.weight", D, c.ffn_dim));
    SPECD_TRY_ASSIGN(w.w_down, ColSlice(full, p + "ffn_down.weight", f0, local_ffn_));
    if (c.qkv_bias) {
      const float* b;
      SPECD_TRY_ASSIGN(b, Vector(f, p + "attn_q.bias", q_rows));
      w.bq = b + q0;
      SPECD_TRY_ASSIGN(b, Vector(f, p + "attn_k.bias", kv_rows));
      w.bk = b + kv0;
      SPECD_TRY_ASSIGN(b, Vector(f, p + "attn_v.bias", kv_rows));
      w.bv = b + kv0;
    }
#undef SPECD_TRY_ASSIGN
    weight_bytes_ += Bytes(w.wq) + Bytes(w.wk) + Bytes(w.wv) + Bytes(w.wo) +
                     Bytes(w.w_gate) + Bytes(w.w_up) + Bytes(w.w_down);
  }
  return LoadInputFc(f, world);
}

absl::Status LlamaModel::LoadInputFc(const gguf::GgufFile& f, int world) {
  if (f.FindTensor("eagle.fc.weight") == nullptr) return absl::OkStatus();
  const int64_t D = config_.embedding_dim;
  if (world != 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a feature-conditioned draft (tensor eagle.fc.weight) runs on one rank, not %d", world));
  }
  absl::StatusOr<WeightMatrix> fc = Matrix(f, "eagle.fc.weight", D, 2 * D);
  if (!fc.ok()) return fc.status();
  absl::StatusOr<const float*> tok = Vector(f, "eagle.tok_norm.weight", D);
  if (!tok.ok()) return tok.status();
  absl::StatusOr<const float*> feat = Vector(f, "eagle.feat_norm.weight", D);
  if (!feat.ok()) return feat.status();
  weights_.input_fc = *fc;
  weights_.input_tok_norm = *tok;
  weights_.input_feat_norm = *feat;
  weight_bytes_ += Bytes(*fc);
  return absl::OkStatus();
}

absl::Status LlamaModel::ReencodeWeights(gguf::GgmlType type) {
  // Row by row through f32, into one owned buffer per matrix; tied embeddings stay shared.
  std::vector<float> row;
  auto reencode = [&](WeightMatrix& w) -> absl::Status {
    if (w.type == type) return absl::OkStatus();
    absl::StatusOr<uint64_t> out_row = gguf::RowBytes(type, w.cols);
    if (!out_row.ok()) return out_row.status();
    auto buf = std::make_unique<uint8_t[]>(*out_row * w.rows);
    row.resize(w.cols);
    for (int64_t r = 0; r < w.rows; ++r) {
      absl::Status st = gguf::DequantizeRow(w.type, w.data + r * w.row_bytes, row.data(), w.cols);
      if (st.ok()) st = gguf::QuantizeRow(type, row.data(), buf.get() + r * *out_row, w.cols);
      if (!st.ok()) return st;
    }
    w.type = type;
    w.data = buf.get();
    w.row_bytes = *out_row;
    weight_storage_.host.push_back(std::move(buf));
    return absl::OkStatus();
  };
  const bool tied = weights_.output.data == weights_.token_embd.data;
  absl::Status st = reencode(weights_.token_embd);
  if (st.ok() && tied) weights_.output = weights_.token_embd;
  if (st.ok() && !tied) st = reencode(weights_.output);
  weight_bytes_ = Bytes(weights_.output);
  for (LayerWeights& w : weights_.layers) {
    for (WeightMatrix* m : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down}) {
      if (st.ok()) st = reencode(*m);
      weight_bytes_ += Bytes(*m);
    }
  }
  if (st.ok() && feature_conditioned()) {
    st = reencode(weights_.input_fc);
    weight_bytes_ += Bytes(weights_.input_fc);
  }
  return st;
}

absl::Status LlamaModel::PlaceWeights() {
  Backend& be = *backend_;
  WeightStorage* keep = &weight_storage_;
  const WeightUse matmul =
      options_.exact_activations ? WeightUse::kMatMulExact : WeightUse::kMatMul;
  const bool tied = weights_.output.data == weights_.token_embd.data;
  const WeightUse table_use = !tied                        ? WeightUse::kTable
                              : options_.exact_activations ? WeightUse::kTableAndMatMulExact
                                                           : WeightUse::kTableAndMatMul;
  absl::Status st = be.PlaceWeight(&weights_.token_embd, table_use, keep);
  if (st.ok() && tied) {
    weights_.output = weights_.token_embd;
  } else if (st.ok()) {
    st = be.PlaceWeight(&weights_.output, matmul, keep);
  }
  const int64_t D = config_.embedding_dim, d = config_.head_dim;
  if (st.ok()) st = be.PlaceVector(&weights_.output_norm, D, keep);
  for (LayerWeights& w : weights_.layers) {
    for (kernels::WeightMatrix* m : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down}) {
      if (st.ok()) st = be.PlaceWeight(m, matmul, keep);
    }
    if (st.ok()) st = be.PlaceVector(&w.attn_norm, D, keep);
    if (st.ok()) st = be.PlaceVector(&w.ffn_norm, D, keep);
    if (st.ok() && w.bq != nullptr) st = be.PlaceVector(&w.bq, local_heads_ * d, keep);
    if (st.ok() && w.bk != nullptr) st = be.PlaceVector(&w.bk, local_kv_heads_ * d, keep);
    if (st.ok() && w.bv != nullptr) st = be.PlaceVector(&w.bv, local_kv_heads_ * d, keep);
  }
  if (st.ok() && feature_conditioned()) {
    st = be.PlaceWeight(&weights_.input_fc, matmul, keep);
    if (st.ok()) st = be.PlaceVector(&weights_.input_tok_norm, D, keep);
    if (st.ok()) st = be.PlaceVector(&weights_.input_feat_norm, D, keep);
  }
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat("placing the weights on backend ", std::string(be.name()),
                                                ": ", st.message()));
  }
  return absl::OkStatus();
}

KvCacheConfig LlamaModel::MakeKvCacheConfig(int32_t num_blocks, int32_t block_size,
                                            kernels::KvDtype dtype) const {
  KvCacheConfig kc;
  kc.num_layers = num_layers();
  kc.num_kv_heads = local_kv_heads_;
  kc.head_dim = config_.head_dim;
  kc.block_size = block_size;
  kc.num_blocks = num_blocks;
  kc.max_blocks_per_seq = (config_.context_length + block_size - 1) / block_size;
  kc.dtype = dtype;
  kc.memory = &backend_->memory();
  return kc;
}

absl::Status LlamaModel::Validate(const ForwardBatch& b, const PagedKvCache& kv) const {
  const int64_t T = static_cast<int64_t>(b.tokens.size());
  if (T == 0) return absl::InvalidArgumentError("batch.tokens is empty");
  if (T > options_.max_batch_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "batch.tokens has %d tokens, more than max_batch_tokens = %d", T,
        options_.max_batch_tokens));
  }
  for (int64_t t = 0; t < T; ++t) {
    if (b.tokens[t] < 0 || b.tokens[t] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "batch.tokens[%d] = %d is outside the vocabulary [0, %d)", t, b.tokens[t],
          config_.vocab_size));
    }
  }
  int64_t covered = 0;
  for (size_t i = 0; i < b.slices.size(); ++i) {
    const SequenceSlice& s = b.slices[i];
    absl::StatusOr<int64_t> len = kv.Length(s.seq);
    if (!len.ok()) {
      return absl::NotFoundError(absl::StrFormat("batch.slices[%d].seq = %d has no KV cache", i,
                                                 s.seq));
    }
    if (s.num_tokens <= 0 || s.start_pos < 0 || s.start_pos > *len) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "batch.slices[%d]: start_pos %d / num_tokens %d invalid for sequence %d of length %d",
          i, s.start_pos, s.num_tokens, s.seq, *len));
    }
    if (int64_t{s.start_pos} + s.num_tokens > config_.context_length) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "batch.slices[%d]: positions up to %d exceed the context length %d", i,
          int64_t{s.start_pos} + s.num_tokens, config_.context_length));
    }
    for (size_t j = 0; j < i; ++j) {
      if (b.slices[j].seq == s.seq) {
        return absl::InvalidArgumentError(
            absl::StrFormat("batch.slices[%d]: sequence %d appears twice", i, s.seq));
      }
    }
    covered += s.num_tokens;
  }
  if (covered != T) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "batch.slices cover %d tokens but batch.tokens has %d", covered, T));
  }
  if (b.logit_rows.size() > static_cast<size_t>(options_.max_logit_rows)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "batch.logit_rows has %d rows, more than max_logit_rows = %d", b.logit_rows.size(),
        options_.max_logit_rows));
  }
  for (size_t i = 0; i < b.logit_rows.size(); ++i) {
    if (b.logit_rows[i] < 0 || b.logit_rows[i] >= T) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "batch.logit_rows[%d] = %d is outside [0, %d)", i, b.logit_rows[i], T));
    }
  }
  for (size_t i = 0; i < b.hidden_rows.size(); ++i) {
    if (b.hidden_rows[i] < 0 || b.hidden_rows[i] >= T) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "batch.hidden_rows[%d] = %d is outside [0, %d)", i, b.hidden_rows[i], T));
    }
  }
  const size_t features = feature_conditioned() ? T * config_.embedding_dim : 0;
  if (b.input_features.size() != features) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "batch.input_features has %d values; this %s needs %d (%d tokens x %d)",
        b.input_features.size(),
        feature_conditioned() ? "feature-conditioned draft" : "model (not feature-conditioned)",
        features, T, feature_conditioned() ? config_.embedding_dim : 0));
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::Forward(const ForwardBatch& batch, PagedKvCache& kv, float* logits,
                                 float* hidden) {
  absl::Status st = Validate(batch, kv);
  if (!st.ok()) return st;
  if (hidden == nullptr && !batch.hidden_rows.empty()) {
    return absl::InvalidArgumentError("batch.hidden_rows is set but no hidden output was given");
  }
  if (logits == nullptr && !batch.logit_rows.empty() && !keeps_logits_on_backend()) {
    return absl::InvalidArgumentError(
        "logits: no buffer was given, and this model's logits cannot stay on its backend "
        "(host memory, or a truncated output head)");
  }
  if (&kv.memory() != &backend_->memory()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "kv: the cache's pools are not in backend %s's memory (make its config with "
        "LlamaModel::MakeKvCacheConfig)", backend_->name()));
  }
  const StepShape shape = ShapeStep(batch);
  if (shape.recorded && kv.id() != recorded_kv_id_) {
    // The recordings name the previous cache's pools (maybe freed by now): record anew.
    backend_->ForgetSteps(this);
    recorded_kv_id_ = kv.id();
  }
  st = PrepareStep(batch, kv);
  if (st.ok()) st = UploadStep(batch, kv, shape);
  if (!st.ok()) return st;
  // Ops may write the caller's buffers directly when the host can read what they write and no
  // recording will replay them (a recording names the workspace, never a caller's buffer).
  const bool direct = backend_->memory().host_addressable() && !shape.recorded;
  const bool logits_direct = direct && weights_.head_token_ids == nullptr;
  float* logits_out = logits_direct ? logits : ws_.logits.as<float>();
  float* hidden_out = direct ? hidden : ws_.hidden.as<float>();
  auto issue = [&] { return IssueStep(shape, kv, logits_out, hidden_out); };
  st = shape.recorded ? backend_->RunStep(shape.key, issue) : issue();
  if (st.ok()) st = CollectOutputs(batch, logits, hidden, !logits_direct, !direct);
  // No op of this step may still run when the caller reuses the buffers; a device
  // backend's late error surfaces here.
  absl::Status synced = backend_->Sync();
  return st.ok() ? synced : st;
}

LlamaModel::~LlamaModel() {
  if (backend_ != nullptr) backend_->ForgetSteps(this);
}

int64_t StepBucket(int64_t n, int64_t cap) {
  constexpr int64_t kGroup = 8;  // the CUDA MatMul's tokens per pass over a weight row
  int64_t b = 1;
  if (n <= kGroup) {
    while (b < n) b *= 2;
  } else {
    const int64_t step = n <= 8 * kGroup ? kGroup : 4 * kGroup;
    b = (n + step - 1) / step * step;
  }
  return std::min(b, cap);
}

LlamaModel::StepShape LlamaModel::ShapeStep(const ForwardBatch& batch) const {
  StepShape s;
  s.tokens = static_cast<int64_t>(batch.tokens.size());
  s.logit_rows = static_cast<int64_t>(batch.logit_rows.size());
  s.hidden_rows = static_cast<int64_t>(batch.hidden_rows.size());
  s.recorded = backend_->replays_steps() && comm_->works_in_step_graphs() &&
               s.tokens <= options_.step_graph_max_tokens;
  if (!s.recorded) return s;
  // Few shapes, so few recordings, and padding that stays inside the MatMul's token groups.
  s.tokens = StepBucket(s.tokens, options_.max_batch_tokens);
  if (s.logit_rows > 0) s.logit_rows = StepBucket(s.logit_rows, options_.max_logit_rows);
  if (s.hidden_rows > 0) s.hidden_rows = StepBucket(s.hidden_rows, options_.max_batch_tokens);
  s.key = StepGraphKey{this, s.tokens, s.logit_rows, s.hidden_rows};
  return s;
}

absl::Status LlamaModel::IssueStep(const StepShape& shape, PagedKvCache& kv, float* logits_out,
                                   float* hidden_out) {
  EmbedInputs(shape.tokens);  // x: [T, D]
  // h: [T, D], the first layer's normed input; each layer leaves the next one's.
  if (num_layers() > 0) {
    backend_->RmsNorm(ws_.x.as<float>(), weights_.layers[0].attn_norm, shape.tokens,
                      config_.embedding_dim, config_.rms_eps, ws_.h.as<float>());
  }
  absl::Status st;
  for (int32_t l = 0; l < num_layers() && st.ok(); ++l) st = RunLayer(l, shape.tokens, kv);
  if (st.ok()) IssueOutputs(shape, logits_out, hidden_out);
  return st;
}

absl::Status LlamaModel::PrepareStep(const ForwardBatch& batch, PagedKvCache& kv) {
  // Roll back to each slice's start, then check the whole batch fits before writing any KV.
  for (const SequenceSlice& s : batch.slices) {
    absl::Status st = kv.Truncate(s.seq, s.start_pos);
    if (!st.ok()) return st;
  }
  int64_t needed = 0;
  for (const SequenceSlice& s : batch.slices) {
    needed += kv.BlocksNeeded(s.seq, int64_t{s.start_pos} + s.num_tokens);
  }
  if (needed > kv.num_free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "KV cache out of blocks: batch needs %d, %d free", needed, kv.num_free_blocks()));
  }
  int64_t t = 0;
  for (const SequenceSlice& s : batch.slices) {
    absl::Status st = kv.Reserve(s.seq, int64_t{s.start_pos} + s.num_tokens);
    if (!st.ok()) return st;
    const int32_t* table = kv.BlockTable(s.seq);
    for (int32_t i = 0; i < s.num_tokens; ++i, ++t) {
      positions_[t] = s.start_pos + i;
      slots_[t] = kv.Slot(s.seq, s.start_pos + i);
      block_tables_[t] = table;
    }
  }
  return absl::OkStatus();
}

namespace {
// rows, then `fill` up to n entries, into *staged.
void Stage(const std::vector<int32_t>& rows, int64_t n, int32_t fill, std::vector<int32_t>* staged) {
  staged->assign(rows.begin(), rows.end());
  staged->resize(static_cast<size_t>(n), fill);
}
}  // namespace

absl::Status LlamaModel::UploadStep(const ForwardBatch& batch, const PagedKvCache& kv,
                                    const StepShape& shape) {
  DeviceMemory& mem = backend_->memory();
  const size_t T = batch.tokens.size(), padded = static_cast<size_t>(shape.tokens);
  std::fill(positions_.begin() + T, positions_.begin() + padded, 0);
  std::fill(slots_.begin() + T, slots_.begin() + padded, -1);  // padding: no KV stored
  Stage(batch.tokens, shape.tokens, 0, &staged_tokens_);
  Stage(batch.logit_rows, shape.logit_rows, 0, &staged_logit_rows_);
  Stage(batch.hidden_rows, shape.hidden_rows, 0, &staged_hidden_rows_);
  absl::Status st = mem.Upload(ws_.tokens.data(), staged_tokens_.data(), padded * sizeof(int32_t));
  st.Update(mem.Upload(ws_.positions.data(), positions_.data(), padded * sizeof(int32_t)));
  st.Update(mem.Upload(ws_.slots.data(), slots_.data(), padded * sizeof(int64_t)));
  st.Update(mem.Upload(ws_.logit_rows.data(), staged_logit_rows_.data(),
                       staged_logit_rows_.size() * sizeof(int32_t)));
  st.Update(mem.Upload(ws_.hidden_rows.data(), staged_hidden_rows_.data(),
                       staged_hidden_rows_.size() * sizeof(int32_t)));
  if (feature_conditioned()) {
    // Padding rows keep whatever features the workspace held: rows never mix, so they reach
    // no real row.
    st.Update(mem.Upload(ws_.features.data(), batch.input_features.data(),
                         batch.input_features.size() * sizeof(float)));
  }
  if (!st.ok()) return st;
  return backend_->PlanAttention(positions_.data(), block_tables_.data(),
                                 static_cast<int64_t>(T), local_kv_heads_,
                                 kv.config().block_size);
}

absl::Status LlamaModel::RunLayer(int32_t l, int64_t T, PagedKvCache& kv) {
  const int64_t D = config_.embedding_dim, d = config_.head_dim;
  const int64_t Hq = local_heads_, Hkv = local_kv_heads_, F = local_ffn_;
  const float eps = config_.rms_eps;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const LayerWeights& w = weights_.layers[l];
  const kernels::PagedKvLayer layer = kv.Layer(l);
  Backend& be = *backend_;
  float* x = ws_.x.as<float>();
  float* h = ws_.h.as<float>();
  float* o = ws_.o.as<float>();
  float* q = ws_.q.as<float>();
  float* k = ws_.k.as<float>();
  float* v = ws_.v.as<float>();
  float* attn = ws_.attn.as<float>();
  const int32_t* positions = ws_.positions.as<int32_t>();

  // h: RmsNorm(x, w.attn_norm), left by the step or the layer before.
  {  // q: [T, Hq, d], k, v: [T, Hkv, d]
    const kernels::WeightMatrix qkv[3] = {w.wq, w.wk, w.wv};
    float* const ys[3] = {q, k, v};
    MatMulShared(qkv, 3, h, T, ys);
  }
  if (w.bq != nullptr) {
    be.AddBias(q, w.bq, T, Hq * d);
    be.AddBias(k, w.bk, T, Hkv * d);
    be.AddBias(v, w.bv, T, Hkv * d);
  }
  be.RopeQK(q, Hq, k, Hkv, T, d, positions, config_.rope);
  be.WriteKv(k, v, ws_.slots.as<int64_t>(), T, layer);
  be.PagedAttention(q, Hq, layer, scale, attn);  // attn: [T, Hq, d]
  MatMul(w.wo, attn, T, o);  // o: [T, D] (partial sum on this shard)
  absl::Status st = comm_->AllReduceSum(o, T * D);
  if (!st.ok()) return st;
  be.AddRmsNorm(x, o, w.ffn_norm, T, D, eps, h);  // x += o; h = RmsNorm(x)
  float* gate = ws_.gate.as<float>();
  float* up = ws_.up.as<float>();
  float* act = ws_.act.as<float>();
  {  // gate, up: [T, F]
    const kernels::WeightMatrix gu[2] = {w.w_gate, w.w_up};
    float* const ys[2] = {gate, up};
    MatMulShared(gu, 2, h, T, ys);
  }
  be.SwiGlu(gate, up, T, F, act);
  MatMul(w.w_down, act, T, o);  // [T, D] partial
  st = comm_->AllReduceSum(o, T * D);
  if (!st.ok()) return st;
  if (l + 1 < num_layers()) {  // the residual add and the next layer's input norm, one op
    be.AddRmsNorm(x, o, weights_.layers[l + 1].attn_norm, T, D, eps, h);
  } else {
    be.AddInPlace(x, o, T * D);
  }
  return absl::OkStatus();
}

bool LlamaModel::keeps_logits_on_backend() const {
  return weights_.head_token_ids == nullptr && !backend_->memory().host_addressable();
}

void LlamaModel::IssueOutputs(const StepShape& shape, float* logits_out, float* hidden_out) {
  const int64_t D = config_.embedding_dim;
  Backend& be = *backend_;
  const float* x = ws_.x.as<float>();
  if (shape.hidden_rows > 0) {  // hidden: [H, D]
    be.GatherRows(x, ws_.hidden_rows.as<int32_t>(), shape.hidden_rows, D, hidden_out);
  }
  // Only the requested rows go through the final norm and the (large) output head.
  const int64_t R = shape.logit_rows;
  if (R == 0) return;
  float* head_in = ws_.head_in.as<float>();  // [R, D]
  float* h = ws_.h.as<float>();
  be.GatherRows(x, ws_.logit_rows.as<int32_t>(), R, D, head_in);
  be.RmsNorm(head_in, weights_.output_norm, R, D, config_.rms_eps, h);
  if (weights_.head_token_ids == nullptr) {
    MatMul(weights_.output, h, R, logits_out);  // logits: [R, vocab]
  } else {
    MatMul(weights_.output, h, R, ws_.head_out.as<float>());  // head_out: [R, N]
  }
}

absl::Status LlamaModel::CollectOutputs(const ForwardBatch& batch, float* logits, float* hidden,
                                        bool logits_in_workspace, bool hidden_in_workspace) {
  const int64_t D = config_.embedding_dim, V = config_.vocab_size;
  DeviceMemory& mem = backend_->memory();
  const int64_t H = static_cast<int64_t>(batch.hidden_rows.size());
  if (H > 0 && hidden_in_workspace) {
    absl::Status st = mem.Download(hidden, ws_.hidden.data(), static_cast<size_t>(H * D) * sizeof(float));
    if (!st.ok()) return st;
  }
  const int64_t R = static_cast<int64_t>(batch.logit_rows.size());
  if (R == 0) return absl::OkStatus();
  if (weights_.head_token_ids == nullptr) {
    // null: they stay in the workspace (step_logits), the batch's rows first.
    if (!logits_in_workspace || logits == nullptr) return absl::OkStatus();
    return mem.Download(logits, ws_.logits.data(), static_cast<size_t>(R * V) * sizeof(float));
  }
  // Truncated head: head_out: [R, N], scattered on the host into logits: [R, vocab] (-inf
  // elsewhere); only the N scored columns leave the backend's memory.
  const int64_t N = weights_.output.rows;
  absl::Status st = mem.Download(head_out_host_.data(), ws_.head_out.data(),
                                 static_cast<size_t>(R * N) * sizeof(float));
  if (!st.ok()) return st;
  for (int64_t r = 0; r < R; ++r) {
    float* row = logits + r * V;
    std::fill_n(row, V, -std::numeric_limits<float>::infinity());
    for (int64_t i = 0; i < N; ++i) row[weights_.head_token_ids[i]] = head_out_host_[r * N + i];
  }
  return absl::OkStatus();
}

void LlamaModel::EmbedInputs(int64_t T) {
  const int64_t D = config_.embedding_dim;
  Backend& be = *backend_;
  float* x = ws_.x.as<float>();
  be.EmbeddingLookup(weights_.token_embd, ws_.tokens.as<int32_t>(), T, x);  // [T, D]
  if (!feature_conditioned()) return;
  // fused: [T, 2D] = [rms(embedding) * tok_norm | rms(feature) * feat_norm], then x = fc(fused).
  const float eps = config_.rms_eps;
  float* h = ws_.h.as<float>();
  float* o = ws_.o.as<float>();
  float* fused = ws_.fused.as<float>();
  be.RmsNorm(x, weights_.input_tok_norm, T, D, eps, h);
  be.RmsNorm(ws_.features.as<float>(), weights_.input_feat_norm, T, D, eps, o);
  const size_t row = static_cast<size_t>(D) * sizeof(float);
  DeviceMemory& mem = be.memory();
  // Copies inside the backend's memory: they cannot fail on the host, and a device backend's
  // failure also fails the step's Sync, which Forward returns.
  static_cast<void>(mem.Copy2D(fused, 2 * row, h, row, row, static_cast<size_t>(T)));
  static_cast<void>(mem.Copy2D(fused + D, 2 * row, o, row, row, static_cast<size_t>(T)));
  MatMul(weights_.input_fc, fused, T, x);
}

}  // namespace specd::engine
