// SentencePiece-style BPE (tokenizer.ggml.model = "llama"): spaces become U+2581 "▁", the text
// starts as one symbol per code point, and the adjacent pair whose concatenation is a vocabulary
// piece with the highest score is merged (leftmost on ties). Symbols left without a piece fall
// back to <0xXX> byte tokens, or to the unknown token when the vocabulary has none.
#ifndef SPECD_COMMON_TOKENIZER_SPM_H_
#define SPECD_COMMON_TOKENIZER_SPM_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/vocab.h"

namespace specd::tok {

inline constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581

class SpmModel {
 public:
  // `vocab` must outlive the model.
  static absl::StatusOr<std::unique_ptr<SpmModel>> Create(const Vocab& vocab);

  // Appends the ids of one raw-text fragment; `add_prefix` prepends the dummy "▁".
  void Encode(std::string_view text, bool add_prefix, std::vector<int32_t>& out) const;

 private:
  SpmModel() = default;
  void EmitPiece(std::string_view piece, std::vector<int32_t>& out) const;

  // Mergeable pieces: normal and user-defined tokens (control, unknown and byte tokens are not).
  // Keys view the Vocab the model was created from, which must outlive it.
  absl::flat_hash_map<std::string_view, int32_t> pieces_;
  std::vector<float> scores_;
  std::array<int32_t, 256> byte_ids_{};  // <0xXX> tokens, -1 when absent
  int32_t unk_id_ = -1;
};

}  // namespace specd::tok

#endif  // SPECD_COMMON_TOKENIZER_SPM_H_
