#include "services/router/ngram_proposer.h"

#include <algorithm>

namespace specd::router {

std::vector<int32_t> NgramPropose(absl::Span<const int32_t> h, int32_t k, int32_t max_n,
                                  int32_t min_n) {
  const int64_t len = static_cast<int64_t>(h.size());
  for (int32_t n = std::min<int64_t>(max_n, len - 1); n >= min_n; --n) {
    // Most recent earlier match of the suffix h[len-n, len).
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(h.begin() + start, h.begin() + start + n, h.end() - n)) continue;
      const int64_t from = start + n;
      const int64_t to = std::min<int64_t>(from + k, len);
      return std::vector<int32_t>(h.begin() + from, h.begin() + to);
    }
  }
  return {};
}

}  // namespace specd::router
