#include "speculation/ngram_drafter.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_format.h"
#include "common/util/check.h"

namespace specd::spec {

absl::StatusOr<std::unique_ptr<NgramDrafter>> NgramDrafter::Create(const NgramDrafterOptions& o) {
  if (o.min_ngram < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ngram min_ngram must be >= 1, got %d", o.min_ngram));
  }
  if (o.max_ngram < o.min_ngram) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ngram max_ngram (%d) must be >= min_ngram (%d)", o.max_ngram, o.min_ngram));
  }
  if (o.max_lookback < 2) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ngram max_lookback must be >= 2, got %d", o.max_lookback));
  }
  return std::unique_ptr<NgramDrafter>(new NgramDrafter(o));
}

absl::Span<const int32_t> NgramDrafter::Window(absl::Span<const int32_t> all) const {
  return all.size() > static_cast<size_t>(options_.max_lookback)
             ? all.subspan(all.size() - options_.max_lookback)
             : all;
}

bool NgramDrafter::HasProposal(absl::Span<const int32_t> all, int32_t min_match) const {
  const absl::Span<const int32_t> t = Window(all);
  const int64_t n = static_cast<int64_t>(t.size());
  const int64_t len = std::max(options_.min_ngram, min_match);
  if (len > options_.max_ngram || n - 1 < len) return false;
  const int32_t* suffix = t.data() + n - len;
  for (int64_t j = n - len - 1; j >= 0; --j) {
    if (std::equal(suffix, suffix + len, t.data() + j)) return true;
  }
  return false;
}

std::vector<int32_t> NgramDrafter::Lookup(absl::Span<const int32_t> all, int32_t k) const {
  std::vector<int32_t> cont;
  if (k <= 0) return cont;
  const absl::Span<const int32_t> t = Window(all);
  const int64_t n = static_cast<int64_t>(t.size());
  for (int64_t len = std::min<int64_t>(options_.max_ngram, n - 1); len >= options_.min_ngram;
       --len) {
    const int32_t* suffix = t.data() + n - len;
    // Most recent earlier occurrence t[j, j+len) with at least one token after it.
    for (int64_t j = n - len - 1; j >= 0; --j) {
      if (!std::equal(suffix, suffix + len, t.data() + j)) continue;
      for (int64_t c = j + len; c < n && static_cast<int32_t>(cont.size()) < k; ++c) {
        cont.push_back(t[c]);
      }
      return cont;
    }
  }
  return cont;
}

absl::Status NgramDrafter::Propose(absl::Span<const DraftInput> in, absl::Span<DraftOutput> out) {
  SPECD_CHECK(in.size() == out.size(), "Propose: %zu inputs, %zu outputs", in.size(), out.size());
  for (size_t i = 0; i < in.size(); ++i) {
    out[i].proposals.clear();
    for (int32_t tok : Lookup(in[i].tokens, in[i].max_tokens)) {
      sampling::SparseProposal q;
      q.token = tok;
      q.ids = {tok};
      q.probs = {1.0f};
      out[i].proposals.push_back(std::move(q));
    }
  }
  return absl::OkStatus();
}

}  // namespace specd::spec
