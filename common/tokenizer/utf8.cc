#include "common/tokenizer/utf8.h"

#include "absl/strings/str_format.h"

namespace specd::tok {

int Utf8SequenceLength(std::string_view s, size_t pos) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (b0 < 0x80) return 1;
  int len;
  // Allowed range of the second byte (excludes overlongs, surrogates, > U+10FFFF).
  uint8_t lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (int i = 1; i < len; ++i) {
    if (pos + i >= s.size()) return -1;
    const auto b = static_cast<uint8_t>(s[pos + i]);
    const uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) return 0;
  }
  return len;
}

absl::Status ValidateUtf8(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    if (static_cast<uint8_t>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const int len = Utf8SequenceLength(s, pos);
    if (len <= 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "text is not valid UTF-8: %s sequence at byte offset %d (byte 0x%02X)",
          len < 0 ? "truncated" : "ill-formed", pos, static_cast<uint8_t>(s[pos])));
    }
    pos += len;
  }
  return absl::OkStatus();
}

char32_t DecodeUtf8(std::string_view s, size_t& pos) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (b0 < 0x80) {
    ++pos;
    return b0;
  }
  int len = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
  char32_t cp = b0 & (0x7F >> len);
  for (int i = 1; i < len && pos + i < s.size(); ++i) {
    cp = (cp << 6) | (static_cast<uint8_t>(s[pos + i]) & 0x3F);
  }
  pos += len;
  return cp;
}

void AppendUtf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string EncodeUtf8(char32_t cp) {
  std::string s;
  AppendUtf8(cp, s);
  return s;
}

bool IsPythonSpace(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D:
    case 0x1C: case 0x1D: case 0x1E: case 0x1F: case 0x20:
    case 0x85: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::string_view StripPythonSpace(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    size_t next = begin;
    if (!IsPythonSpace(DecodeUtf8(s, next))) break;
    begin = next;
  }
  size_t end = begin;
  size_t pos = begin;
  while (pos < s.size()) {
    if (!IsPythonSpace(DecodeUtf8(s, pos))) end = pos;
  }
  return s.substr(begin, end - begin);
}

int ParseByteToken(std::string_view text) {
  if (text.size() != 6 || !text.starts_with("<0x") || text[5] != '>') return -1;
  int value = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = text[i];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return -1;
    }
    value = value * 16 + d;
  }
  return value;
}

}  // namespace specd::tok
