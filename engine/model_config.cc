#include "engine/model_config.h"

#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace specd::engine {
namespace {

absl::StatusOr<int32_t> RequiredInt(const gguf::GgufFile& f, const std::string& key) {
  absl::StatusOr<int64_t> v = f.GetInt(key);
  if (!v.ok()) return v.status();
  if (*v <= 0 || *v > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrFormat("metadata %s = %d is out of range", key, *v));
  }
  return static_cast<int32_t>(*v);
}

int32_t OptionalInt(const gguf::GgufFile& f, const std::string& key, int32_t fallback) {
  absl::StatusOr<int64_t> v = f.GetInt(key);
  return v.ok() ? static_cast<int32_t>(*v) : fallback;
}

float OptionalFloat(const gguf::GgufFile& f, const std::string& key, float fallback) {
  absl::StatusOr<double> v = f.GetFloat(key);
  return v.ok() ? static_cast<float>(*v) : fallback;
}

}  // namespace

absl::StatusOr<ModelConfig> ReadModelConfig(const gguf::GgufFile& f) {
  ModelConfig c;
  absl::StatusOr<std::string> arch = f.GetString("general.architecture");
  if (!arch.ok()) return arch.status();
  c.architecture = *arch;
  const bool is_llama = c.architecture == "llama" || c.architecture == "mistral";
  const bool is_qwen2 = c.architecture == "qwen2";
  if (!is_llama && !is_qwen2) {
    return absl::UnimplementedError(absl::StrFormat(
        "general.architecture = \"%s\" is not supported (supported: llama, mistral, qwen2)",
        c.architecture));
  }
  c.name = f.GetString("general.name").value_or("");
  const std::string p = c.architecture + ".";

  absl::StatusOr<int32_t> v;
  if (!(v = RequiredInt(f, p + "embedding_length")).ok()) return v.status();
  c.embedding_dim = *v;
  if (!(v = RequiredInt(f, p + "block_count")).ok()) return v.status();
  c.num_layers = *v;
  if (!(v = RequiredInt(f, p + "feed_forward_length")).ok()) return v.status();
  c.ffn_dim = *v;
  if (!(v = RequiredInt(f, p + "attention.head_count")).ok()) return v.status();
  c.num_heads = *v;
  c.num_kv_heads = OptionalInt(f, p + "attention.head_count_kv", c.num_heads);
  c.context_length = OptionalInt(f, p + "context_length", 2048);
  c.head_dim = OptionalInt(f, p + "attention.key_length", c.embedding_dim / c.num_heads);
  c.rms_eps = OptionalFloat(f, p + "attention.layer_norm_rms_epsilon", 1e-5f);

  if (c.num_kv_heads <= 0 || c.num_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "metadata %sattention.head_count_kv = %d must divide head_count = %d", p,
        c.num_kv_heads, c.num_heads));
  }
  if (c.head_dim <= 0 || c.head_dim % 2 != 0 || c.head_dim > 512) {
    return absl::InvalidArgumentError(
        absl::StrFormat("head dimension %d (from %sattention.key_length or embedding/heads) "
                        "must be even and <= 512", c.head_dim, p));
  }

  // Vocabulary: explicit key, else the tokenizer's token list, else the embedding table.
  c.vocab_size = OptionalInt(f, p + "vocab_size", 0);
  if (c.vocab_size <= 0) {
    if (const gguf::TensorInfo* t = f.FindTensor("token_embd.weight"); t && t->dims.size() == 2) {
      c.vocab_size = static_cast<int32_t>(t->dims[1]);
    }
  }
  if (c.vocab_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot determine the vocabulary size: no ", p,
                     "vocab_size and no 2-D token_embd.weight"));
  }

  c.rope.rope_dim = OptionalInt(f, p + "rope.dimension_count", c.head_dim);
  c.rope.freq_base = OptionalFloat(f, p + "rope.freq_base", 10000.0f);
  c.rope.layout = is_qwen2 ? kernels::RopeLayout::kNeox : kernels::RopeLayout::kNormal;
  if (c.rope.rope_dim <= 0 || c.rope.rope_dim > c.head_dim || c.rope.rope_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "metadata %srope.dimension_count = %d must be even and <= head dim %d", p,
        c.rope.rope_dim, c.head_dim));
  }
  const std::string scaling = f.GetString(p + "rope.scaling.type").value_or("none");
  if (scaling == "linear") {
    c.rope.linear_scale = OptionalFloat(f, p + "rope.scaling.factor", 1.0f);
  } else if (scaling == "llama3") {
    c.rope.llama3_scaling = true;
    c.rope.factor = OptionalFloat(f, p + "rope.scaling.factor", 8.0f);
    c.rope.low_freq_factor = OptionalFloat(f, p + "rope.scaling.low_freq_factor", 1.0f);
    c.rope.high_freq_factor = OptionalFloat(f, p + "rope.scaling.high_freq_factor", 4.0f);
    c.rope.original_context =
        OptionalInt(f, p + "rope.scaling.original_context_length", 8192);
  } else if (scaling != "none") {
    return absl::UnimplementedError(
        absl::StrFormat("metadata %srope.scaling.type = \"%s\" is not supported", p, scaling));
  }

  c.qkv_bias = f.FindTensor("blk.0.attn_q.bias") != nullptr;
  c.tied_output = f.FindTensor("output.weight") == nullptr;
  return c;
}

}  // namespace specd::engine
