#include "services/router/api_keys.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace specd::router {
namespace {

// Equal bytes, without an early exit that would tell an attacker how much of a key matched.
bool SameKey(std::string_view a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < b.size(); ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    diff |= x ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

}  // namespace

absl::StatusOr<ApiKeys> ApiKeys::FromText(std::string_view text, const std::string& where) {
  ApiKeys k;
  int line_no = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    if (const size_t hash = line.find('#'); hash != std::string_view::npos) {
      line = line.substr(0, hash);
    }
    line = Trim(line);
    if (line.empty()) continue;
    if (line.find_first_of(" \t") != std::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": line ", line_no, " holds more than one word (one key a line)"));
    }
    k.keys_.emplace_back(line);
  }
  if (k.keys_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": no API key in the file"));
  }
  return k;
}

absl::StatusOr<ApiKeys> ApiKeys::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("api keys file ", path, ": cannot read"));
  std::stringstream ss;
  ss << in.rdbuf();
  return FromText(ss.str(), absl::StrCat("api keys file ", path));
}

absl::Status ApiKeys::Check(std::string_view authorization) const {
  if (keys_.empty()) return absl::OkStatus();
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.substr(0, kBearer.size()) != kBearer) {
    return absl::UnauthenticatedError(
        "an API key is required: send the header \"authorization: Bearer <key>\"");
  }
  const std::string_view key = Trim(authorization.substr(kBearer.size()));
  bool ok = false;
  for (const std::string& k : keys_) ok |= SameKey(key, k);  // every key, every time
  if (!ok) return absl::UnauthenticatedError("the API key is not valid");
  return absl::OkStatus();
}

}  // namespace specd::router
