// N-gram / prompt-lookup drafting: find the longest recent suffix of the sequence (prompt +
// output) that occurred earlier in it, and propose the tokens that followed that occurrence.
// q is a point mass on each proposed token (the draft is deterministic, so "d is drawn from q"
// holds), which keeps verification lossless for any sampling settings. No model, no KV.
#ifndef SPECD_SPECULATION_NGRAM_DRAFTER_H_
#define SPECD_SPECULATION_NGRAM_DRAFTER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "speculation/drafter.h"

namespace specd::spec {

struct NgramDrafterOptions {
  int32_t max_ngram = 4;        // longest suffix tried first
  int32_t min_ngram = 1;        // shortest suffix accepted as a match
  int32_t max_lookback = 4096;  // only the last this-many tokens are searched
};

class NgramDrafter final : public Drafter {
 public:
  // INVALID_ARGUMENT naming the field for bad options.
  static absl::StatusOr<std::unique_ptr<NgramDrafter>> Create(const NgramDrafterOptions& options);

  std::string_view name() const override { return "ngram"; }
  absl::Status Propose(absl::Span<const DraftInput> in, absl::Span<DraftOutput> out) override;
  absl::Status Commit(SeqId, absl::Span<const int32_t>) override { return absl::OkStatus(); }
  void Release(SeqId) override {}
  bool runs_model() const override { return false; }
  // Lookup(tokens, k) is non-empty and follows a suffix of at least `min_match` tokens: asked
  // every step before Propose, so one scan of the shortest such suffix only (any longer match
  // contains an earlier occurrence of it). False when min_match > max_ngram.
  bool HasProposal(absl::Span<const int32_t> tokens, int32_t min_match) const override;

  // The continuation (at most k tokens) after the most recent earlier occurrence of the longest
  // matching suffix of `tokens`; empty when nothing matches.
  std::vector<int32_t> Lookup(absl::Span<const int32_t> tokens, int32_t k) const;

 private:
  explicit NgramDrafter(const NgramDrafterOptions& o) : options_(o) {}
  // The last max_lookback tokens: what Lookup searches.
  absl::Span<const int32_t> Window(absl::Span<const int32_t> all) const;
  NgramDrafterOptions options_;
};

}  // namespace specd::spec

#endif  // SPECD_SPECULATION_NGRAM_DRAFTER_H_
