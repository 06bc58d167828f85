// The GPT-2 byte <-> printable code point mapping used by byte-level BPE vocabularies:
// printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100.. in byte order, so
// every token is a printable string (a space becomes "Ġ", a newline "Ċ").
#ifndef SPECD_COMMON_TOKENIZER_BYTE_LEVEL_H_
#define SPECD_COMMON_TOKENIZER_BYTE_LEVEL_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace specd::tok {

char32_t ByteToCodePoint(uint8_t b);
// -1 when the code point is not the image of any byte.
int CodePointToByte(char32_t cp);

// Bytes -> mapped UTF-8 text (what the vocabulary stores).
std::string ByteLevelEncode(std::string_view bytes);
// Mapped UTF-8 text -> bytes. Code points outside the mapping are kept as their UTF-8 (so a
// malformed vocabulary entry still decodes to something visible).
std::string ByteLevelDecode(std::string_view mapped);

}  // namespace specd::tok

#endif  // SPECD_COMMON_TOKENIZER_BYTE_LEVEL_H_
