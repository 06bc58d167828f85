// UTF-8 helpers shared by the tokenizer: validation, code point iteration and encoding.
#ifndef SPECD_COMMON_TOKENIZER_UTF8_H_
#define SPECD_COMMON_TOKENIZER_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace specd::tok {

// OK, or INVALID_ARGUMENT naming the byte offset of the first ill-formed sequence.
absl::Status ValidateUtf8(std::string_view s);

// Length of the well-formed sequence starting at s[pos], 0 if ill-formed, or -1 if the
// bytes present are a valid but truncated prefix (more bytes could complete it).
int Utf8SequenceLength(std::string_view s, size_t pos);

// Decodes the code point at s[pos] (assumed well formed) and advances pos.
char32_t DecodeUtf8(std::string_view s, size_t& pos);

void AppendUtf8(char32_t cp, std::string& out);
std::string EncodeUtf8(char32_t cp);

// Python's str.isspace(): the whitespace set that jinja's trim / str.strip() use.
bool IsPythonSpace(char32_t cp);
// Strips IsPythonSpace code points from both ends of valid UTF-8.
std::string_view StripPythonSpace(std::string_view s);

// Parses a SentencePiece byte token "<0xAB>"; -1 when `text` is not one.
int ParseByteToken(std::string_view text);

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace specd::tok

#endif  // SPECD_COMMON_TOKENIZER_UTF8_H_
