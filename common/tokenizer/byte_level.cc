#include "common/tokenizer/byte_level.h"

#include <array>

#include "common/tokenizer/utf8.h"

namespace specd::tok {
namespace {

bool IsDirect(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Tables {
  std::array<char32_t, 256> to_cp{};
  std::array<std::string, 256> to_utf8;
  std::array<int16_t, 324> from_cp{};  // every image is < 0x100 + 68
  Tables() {
    from_cp.fill(-1);
    int next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = IsDirect(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(next++);
      to_cp[b] = cp;
      to_utf8[b] = EncodeUtf8(cp);
      from_cp[cp] = static_cast<int16_t>(b);
    }
  }
};

const Tables& GetTables() {
  static const Tables* const t = new Tables();
  return *t;
}

}  // namespace

char32_t ByteToCodePoint(uint8_t b) { return GetTables().to_cp[b]; }

int CodePointToByte(char32_t cp) {
  const Tables& t = GetTables();
  return cp < t.from_cp.size() ? t.from_cp[cp] : -1;
}

std::string ByteLevelEncode(std::string_view bytes) {
  const Tables& t = GetTables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += t.to_utf8[static_cast<uint8_t>(c)];
  return out;
}

std::string ByteLevelDecode(std::string_view mapped) {
  std::string out;
  out.reserve(mapped.size());
  size_t pos = 0;
  while (pos < mapped.size()) {
    const size_t start = pos;
    const int len = Utf8SequenceLength(mapped, pos);
    if (len <= 0) {  // not UTF-8: keep the raw byte
      out.push_back(mapped[pos++]);
      continue;
    }
    const char32_t cp = DecodeUtf8(mapped, pos);
    const int b = CodePointToByte(cp);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      out.append(mapped.substr(start, pos - start));
    }
  }
  return out;
}

}  // namespace specd::tok
