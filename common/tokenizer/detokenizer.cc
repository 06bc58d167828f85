#include "common/tokenizer/detokenizer.h"

#include "common/tokenizer/utf8.h"

namespace specd::tok {

size_t AppendCompleteUtf8(std::string_view bytes, bool final, std::string& out) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    const int len = Utf8SequenceLength(bytes, pos);
    if (len > 0) {
      out.append(bytes.substr(pos, len));
      pos += len;
    } else if (len < 0 && !final) {
      return bytes.size() - pos;  // a valid prefix cut by the end: wait for more bytes
    } else {
      // One U+FFFD per maximal ill-formed subpart: the lead byte plus the continuation bytes
      // that were still acceptable (the Unicode "substitution of maximal subparts" practice).
      size_t n = 1;
      while (pos + n < bytes.size() && n < 4 &&
             Utf8SequenceLength(bytes.substr(0, pos + n + 1), pos) < 0 &&
             (static_cast<uint8_t>(bytes[pos + n]) & 0xC0) == 0x80) {
        ++n;
      }
      out.append(kReplacementChar);
      pos += n;
    }
  }
  return 0;
}

std::string StreamingDetokenizer::Append(int32_t id) {
  if (!tokenizer_.IsValidId(id)) return {};
  if (skip_special_ && tokenizer_.IsControl(id)) return {};
  std::string_view bytes = tokenizer_.TokenBytes(id);
  if (first_ && tokenizer_.strips_leading_space() && !tokenizer_.IsControl(id) &&
      bytes.starts_with(' ')) {
    bytes.remove_prefix(1);
  }
  first_ = false;
  pending_.append(bytes);
  std::string out;
  const size_t keep = AppendCompleteUtf8(pending_, /*final=*/false, out);
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string StreamingDetokenizer::Finish() {
  std::string out;
  AppendCompleteUtf8(pending_, /*final=*/true, out);
  pending_.clear();
  first_ = true;
  return out;
}

}  // namespace specd::tok
