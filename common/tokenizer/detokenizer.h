// Incremental detokenization for streaming: emits text only in whole UTF-8 characters, so a
// character split across tokens (byte-fallback, byte-level BPE) is never sent half-done.
#ifndef SPECD_COMMON_TOKENIZER_DETOKENIZER_H_
#define SPECD_COMMON_TOKENIZER_DETOKENIZER_H_

#include <cstdint>
#include <string>

#include "common/tokenizer/tokenizer.h"

namespace specd::tok {

class StreamingDetokenizer {
 public:
  // `tokenizer` must outlive this object.
  explicit StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special = false)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}

  // Returns the newly completed text (valid UTF-8, possibly empty). Bytes that can never
  // become valid UTF-8 are emitted as U+FFFD at once; an incomplete tail is held back.
  // Out-of-range ids contribute nothing (as in Tokenizer::Decode).
  std::string Append(int32_t id);
  // Flushes the held-back tail, each ill-formed piece as U+FFFD; then resets to a fresh stream.
  std::string Finish();

  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  bool first_ = true;
  std::string pending_;
};

// Splits `bytes` into its longest prefix made of complete characters (ill-formed bytes replaced
// by U+FFFD) appended to `out`, and returns how many bytes at the end form a truncated but
// still completable sequence (0 when `final`, in which case those become U+FFFD too).
size_t AppendCompleteUtf8(std::string_view bytes, bool final, std::string& out);

}  // namespace specd::tok

#endif  // SPECD_COMMON_TOKENIZER_DETOKENIZER_H_
