// The tokenizer's vocabulary as GGUF stores it (tokenizer.ggml.* metadata).
#ifndef SPECD_COMMON_TOKENIZER_VOCAB_H_
#define SPECD_COMMON_TOKENIZER_VOCAB_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/gguf/gguf_file.h"

namespace specd::tok {

// tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece BPE).
enum class ModelKind { kByteLevelBpe, kSentencePieceBpe };

// tokenizer.ggml.token_type values (on-disk ids; never renumber).
enum class TokenType : int32_t {
  kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5,
  kByte = 6,
};

struct Vocab {
  ModelKind model = ModelKind::kByteLevelBpe;
  std::string pre = "default";             // tokenizer.ggml.pre (byte-level BPE only)
  std::vector<std::string> tokens;         // id -> token text (byte-level: mapped chars)
  std::vector<float> scores;               // empty or one per token (SentencePiece merges)
  std::vector<TokenType> types;            // empty (all normal) or one per token
  std::vector<std::string> merges;         // "left right", rank order (byte-level BPE)
  int32_t bos_id = -1, eos_id = -1, eot_id = -1, unk_id = -1, pad_id = -1;
  bool add_bos = false, add_eos = false;
  bool add_space_prefix = false;           // SentencePiece dummy prefix "▁"

  TokenType type(int32_t id) const {
    return types.empty() ? TokenType::kNormal : types[id];
  }
  int32_t size() const { return static_cast<int32_t>(tokens.size()); }

  // Checks sizes and ids; errors name the offending key.
  absl::Status Validate() const;
};

// Reads tokenizer.ggml.* from a GGUF file. Missing required keys give an error naming the key.
// Defaults when absent: add_bos = true for "llama" and false for "gpt2"; add_space_prefix =
// true for "llama"; pre = "default".
absl::StatusOr<Vocab> LoadVocab(const gguf::GgufFile& file);

}  // namespace specd::tok

#endif  // SPECD_COMMON_TOKENIZER_VOCAB_H_
