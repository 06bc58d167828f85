#include "services/router/text_stream.h"

#include <algorithm>

namespace specd::router {

std::string TextStream::Append(int32_t token) {
  if (stopped_) return {};
  held_ += detok_.Append(token);
  return Release(false);
}

std::string TextStream::Finish() {
  if (stopped_) return {};
  held_ += detok_.Finish();
  return Release(true);
}

std::string TextStream::Release(bool final) {
  // Earliest complete stop string wins.
  size_t best = std::string::npos;
  for (const std::string& s : stop_) {
    const size_t at = held_.find(s);
    if (at != std::string::npos && at < best) {
      best = at;
      matched_ = s;
    }
  }
  if (best != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, best);
    held_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  if (!final) {
    for (const std::string& s : stop_) {
      for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
        if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
          keep = n;
          break;
        }
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

}  // namespace specd::router
