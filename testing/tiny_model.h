// Writes small random-weight Llama-architecture GGUF files so tests run in seconds without the
// real model. The tokenizer is copied from another GGUF or synthesised (byte-level BPE with
// 256 byte tokens, a few dozen English merges and ChatML special tokens).
#ifndef SPECD_TESTING_TINY_MODEL_H_
#define SPECD_TESTING_TINY_MODEL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/gguf/ggml_type.h"

namespace specd::testing {

struct TinyModelSpec {
  std::string architecture = "llama";  // or "qwen2" (adds QKV biases, NeoX RoPE)
  int32_t num_layers = 2;
  int32_t embedding_dim = 64;   // multiple of 32 for quantized types
  int32_t ffn_dim = 128;        // multiple of 32
  int32_t num_heads = 4;
  int32_t num_kv_heads = 2;
  int32_t context_length = 512;
  float rope_base = 10000.0f;
  // Llama-3 RoPE scaling in metadata (rope.scaling.type = "llama3" and its parameters)...
  bool llama3_rope_scaling = false;
  float rope_scaling_factor = 8.0f, rope_low_freq_factor = 1.0f, rope_high_freq_factor = 4.0f;
  int32_t rope_original_context = 8192;
  // ... or per-pair frequency divisors as the tensor rope_freqs.weight (non-empty: written).
  std::vector<float> rope_freq_factors;
  gguf::GgmlType weight_type = gguf::GgmlType::kQ8_0;  // 2-D weights; norms stay F32
  gguf::GgmlType embedding_type = gguf::GgmlType::kQ8_0;
  bool tied_output = true;
  // Untied only, non-empty: a truncated output head (distilled drafts). output.weight keeps only
  // these rows of the full random head (the same draws), and the ids go in output_token_ids.
  std::vector<int32_t> head_token_ids;
  // Leave token_embd.weight out of the file (drawn all the same, so the other weights do not
  // change): a draft that borrows its target's embeddings.
  bool omit_token_embd = false;
  // A feature-conditioned draft (engine::ModelWeights::input_fc): adds eagle.fc.weight and the
  // two input norms.
  bool feature_conditioned = false;
  uint64_t seed = 1;
  float weight_scale = 0.08f;   // std-dev-like spread of the random weights
  // Fill each weight by repeating one block of 2^20 draws instead of drawing every value: a
  // model written only for its shapes (a Llama-3-8B-shaped benchmark target) in seconds, not
  // minutes. Timing does not depend on the values; numerics tests leave this off.
  bool tile_random = false;
  // Copy tokenizer.* metadata from this GGUF (its vocabulary size wins); empty = synthetic.
  std::string tokenizer_from;
  // Synthetic tokenizer only: pad the vocabulary with unused tokens up to this size
  // (0 = the ~300 tokens the synthetic tokenizer needs).
  int32_t vocab_size = 0;
  // Synthetic tokenizer only: the end-of-generation id (metadata only: the weights do not
  // change, so a test can make any token the model emits its EOS).
  int32_t eos_token_id = 2;
};

absl::Status WriteTinyModel(const TinyModelSpec& spec, const std::string& path);

}  // namespace specd::testing

#endif  // SPECD_TESTING_TINY_MODEL_H_
