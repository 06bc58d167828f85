// Text <-> token ids for the vocabularies GGUF files carry: byte-level BPE ("gpt2") with the
// pre-tokenizer named by tokenizer.ggml.pre, and SentencePiece BPE ("llama").
//
// Special tokens: control tokens (type 3) are matched in the input text only when
// `parse_special` is set; user-defined tokens (type 4) are always matched (like non-special
// added tokens in HF tokenizers). Matching is leftmost, longest first.
//
// SentencePiece dummy prefix: with add_space_prefix, a raw-text fragment that starts the input
// or directly follows a matched control token gets a leading "▁". Decode removes one leading
// space from the first decoded token when add_space_prefix is set, so Decode(Encode(s)) == s.
#ifndef SPECD_COMMON_TOKENIZER_TOKENIZER_H_
#define SPECD_COMMON_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/gguf/gguf_file.h"
#include "common/tokenizer/vocab.h"

namespace specd::tok {

class BpeModel;
class SpmModel;
class PreTokenizer;

class Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const gguf::GgufFile& file);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromVocab(Vocab vocab);
  ~Tokenizer();

  // add_special: prepend BOS / append EOS as the vocabulary's add_bos / add_eos say.
  // Invalid UTF-8 is INVALID_ARGUMENT naming the byte offset. Thread-safe.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special,
                                              bool parse_special) const;

  // Out-of-range ids decode to nothing; skip_special drops control tokens.
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special = false) const;
  // Like Decode, but an out-of-range id is INVALID_ARGUMENT naming its index and value.
  absl::StatusOr<std::string> DecodeChecked(absl::Span<const int32_t> ids,
                                            bool skip_special = false) const;

  // The bytes this token decodes to (control tokens: their text; out of range: empty).
  const std::string& TokenBytes(int32_t id) const;
  // The vocabulary entry as stored (byte-level tokens in their mapped form).
  const std::string& TokenText(int32_t id) const;
  // -1 when the text is not exactly one vocabulary entry.
  int32_t TokenId(std::string_view text) const;

  int32_t vocab_size() const { return vocab_.size(); }
  int32_t bos_id() const { return vocab_.bos_id; }
  int32_t eos_id() const { return vocab_.eos_id; }
  int32_t eot_id() const { return eot_id_; }  // from metadata or a known end-of-turn token
  int32_t pad_id() const { return vocab_.pad_id; }
  bool IsValidId(int32_t id) const { return id >= 0 && id < vocab_.size(); }
  bool IsControl(int32_t id) const {
    return IsValidId(id) && vocab_.type(id) == TokenType::kControl;
  }
  // eos, eot and the known end-of-turn/end-of-text control tokens (<|im_end|>, <|eot_id|>, ...).
  bool IsEndOfGeneration(int32_t id) const { return eog_ids_.contains(id); }
  // Stable across runs and machines: FNV-1a over model kind, tokens, types and merges.
  uint64_t Fingerprint() const { return fingerprint_; }
  const Vocab& vocab() const { return vocab_; }

  // Whether Decode drops one leading space of the first token (SentencePiece dummy prefix).
  bool strips_leading_space() const {
    return vocab_.model == ModelKind::kSentencePieceBpe && vocab_.add_space_prefix;
  }

 private:
  struct Special {
    std::string text;
    int32_t id;
    bool control;
  };
  struct WordCache;
  explicit Tokenizer(Vocab vocab);
  absl::Status Init();
  void EncodeFragment(std::string_view text, bool after_control_or_start, WordCache& cache,
                      std::vector<int32_t>& out) const;
  // Finds the leftmost (then longest) special token in text[from..]; npos when none.
  size_t FindSpecial(std::string_view text, size_t from, bool parse_special,
                     const Special** found) const;

  Vocab vocab_;
  std::vector<std::string> token_bytes_;
  absl::flat_hash_map<std::string_view, int32_t> text_to_id_;  // views into vocab_
  std::vector<Special> specials_;                       // longest first
  std::vector<std::vector<uint32_t>> specials_by_byte_; // first byte -> indices into specials_
  absl::flat_hash_set<int32_t> eog_ids_;
  int32_t eot_id_ = -1;
  uint64_t fingerprint_ = 0;
  std::unique_ptr<PreTokenizer> pre_;
  std::unique_ptr<BpeModel> bpe_;
  std::unique_ptr<SpmModel> spm_;
};

}  // namespace specd::tok

#endif  // SPECD_COMMON_TOKENIZER_TOKENIZER_H_
