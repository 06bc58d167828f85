// Byte-level BPE (GPT-2 style): a pre-tokenized word's bytes start as one symbol each and the
// adjacent pair with the lowest merge rank is merged (leftmost first on ties) until no listed
// merge applies.
#ifndef SPECD_COMMON_TOKENIZER_BPE_H_
#define SPECD_COMMON_TOKENIZER_BPE_H_

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

class BpeModel {
 public:
  // ignore_merges: emit a word that is itself a vocabulary entry as that token without merging
  // (Llama 3 sets this). `vocab` must outlive the model.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(const Vocab& vocab, bool ignore_merges);

  // Appends the ids for one pre-tokenized word given as raw bytes.
  void EncodeWord(std::string_view word, std::vector<int32_t>& out) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t id;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  // Words up to this many bytes take the allocation-free quadratic path.
  static constexpr int kSmallWord = 48;

  BpeModel() = default;
  void EncodeSmallWord(std::string_view word, std::vector<int32_t>& out) const;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  absl::flat_hash_map<std::string_view, int32_t> normal_ids_;  // mapped text -> id (ignore_merges)
  std::array<int32_t, 256> byte_ids_{};                   // -1: byte not in the vocabulary
  int32_t unk_id_ = -1;  // only a token of type kUnknown; else unmappable bytes are dropped
  bool ignore_merges_ = false;
};

}  // namespace specd::tok

#endif  // SPECD_COMMON_TOKENIZER_BPE_H_
