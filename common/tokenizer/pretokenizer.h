// Regex pre-tokenizer for byte-level BPE: splits text into words before BPE merging.
//
// A pre-tokenizer is a sequence of regex steps. Each step splits every current piece into the
// regex matches and the text between them (HF tokenizers' Split with behaviour "isolated"), so
// the pieces always cover the input exactly. Regexes run on PCRE2 with UTF + UCP (JIT when
// available).
#ifndef SPECD_COMMON_TOKENIZER_PRETOKENIZER_H_
#define SPECD_COMMON_TOKENIZER_PRETOKENIZER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace specd::tok {

// The regexes by family (public specification-level patterns).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kIsolateDigitsPattern = R"(\p{N})";

class PreTokenizer {
 public:
  // By tokenizer.ggml.pre name: "default"/"gpt2", "smollm"/"starcoder" (each digit isolated,
  // then GPT-2), "llama3"/"llama-bpe"/"llama-v3", "qwen2". Unknown names are an
  // INVALID_ARGUMENT error listing the supported ones (no silent fallback).
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> ForName(std::string_view name);
  // Explicit steps, applied in order.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> FromPatterns(
      const std::vector<std::string>& patterns);

  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Appends the pieces of `text` (valid UTF-8, not re-checked) to `out` as views into `text`.
  void Split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  struct Step;
  struct MatchData;
  PreTokenizer() = default;
  void SplitStep(const Step& step, std::string_view piece, MatchData& md,
                 std::vector<std::string_view>& out) const;

  std::vector<std::unique_ptr<Step>> steps_;
};

}  // namespace specd::tok

#endif  // SPECD_COMMON_TOKENIZER_PRETOKENIZER_H_
