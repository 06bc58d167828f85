// The token history the penalties need: which ids occurred in the prompt, and how often each id
// occurred in the generated text (including speculative draft tokens being verified).
#ifndef SPECD_COMMON_SAMPLING_PENALTY_STATE_H_
#define SPECD_COMMON_SAMPLING_PENALTY_STATE_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "common/sampling/penalty_formula.h"
#include "common/sampling/sampling_params.h"

namespace specd::sampling {

inline PenaltyFactors FactorsOf(const SamplingParams& params) {
  return {params.repetition_penalty, params.presence_penalty, params.frequency_penalty};
}

class PenaltyState {
 public:
  PenaltyState() = default;
  static PenaltyState FromTokens(absl::Span<const int32_t> prompt,
                                 absl::Span<const int32_t> generated);

  void AddPrompt(int32_t token) { Find(token).in_prompt = true; }
  void AddGenerated(int32_t token) { ++Find(token).generated_count; }

  bool empty() const { return seen_.empty(); }
  // Every seen id, ascending, with its generated count (the device verifier's plan).
  template <class F>
  void ForEachSeen(F&& f) const {
    for (const auto& [token, seen] : seen_) f(token, seen.generated_count);
  }
  int32_t GeneratedCount(int32_t token) const;
  bool InPrompt(int32_t token) const;

  // logits: [vocab], adjusted in place. Repetition penalty for every id seen in prompt or
  // generated text (l > 0 ? l / r : l * r), then l -= presence * [count > 0] + frequency * count
  // over generated text. Ids outside [0, vocab) are ignored. No-op when the penalties are off.
  void Apply(const SamplingParams& params, absl::Span<double> logits) const;

  // What Apply would make of the ids it touches, without a full row: (id, penalized logit)
  // for every seen id in [0, vocab), ascending; empty when the penalties are off.
  // logits: [vocab].
  void PenalizedEntries(const SamplingParams& params, absl::Span<const float> logits,
                        std::vector<std::pair<int32_t, double>>* out) const;

 private:
  struct Seen {
    int32_t generated_count = 0;
    bool in_prompt = false;
  };
  Seen& Find(int32_t token);  // inserts if absent
  // THE penalty formula, for one seen token's logit.
  static double Penalize(const SamplingParams& params, const Seen& seen, double logit);
  const Seen* Lookup(int32_t token) const;

  // Sorted by token id: a copy (the verifier extends a private one per step) is one allocation,
  // and histories hold at most a few thousand distinct ids.
  std::vector<std::pair<int32_t, Seen>> seen_;
};

}  // namespace specd::sampling

#endif  // SPECD_COMMON_SAMPLING_PENALTY_STATE_H_
