// Hyper-parameters of a Llama-family model, read from GGUF metadata.
#ifndef SPECD_ENGINE_MODEL_CONFIG_H_
#define SPECD_ENGINE_MODEL_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/gguf/gguf_file.h"
#include "kernels/kernel_types.h"

namespace specd::engine {

struct ModelConfig {
  std::string architecture;  // "llama", "qwen2", ...
  std::string name;
  int32_t context_length = 0;
  int32_t embedding_dim = 0;      // D
  int32_t num_layers = 0;
  int32_t ffn_dim = 0;            // F
  int32_t num_heads = 0;          // Hq
  int32_t num_kv_heads = 0;       // Hkv
  int32_t head_dim = 0;           // d
  int32_t vocab_size = 0;
  float rms_eps = 1e-5f;
  kernels::RopeParams rope;
  bool qkv_bias = false;          // Qwen2
  bool tied_output = false;       // no output.weight: the head reuses token_embd
};

// INVALID_ARGUMENT / NOT_FOUND naming the key for missing or inconsistent metadata;
// UNIMPLEMENTED naming the architecture for families we do not run.
absl::StatusOr<ModelConfig> ReadModelConfig(const gguf::GgufFile& file);

}  // namespace specd::engine

#endif  // SPECD_ENGINE_MODEL_CONFIG_H_
