#include "common/sampling/penalty_state.h"

#include <algorithm>

#include "common/sampling/penalty_formula.h"

namespace specd::sampling {

PenaltyState PenaltyState::FromTokens(absl::Span<const int32_t> prompt,
                                      absl::Span<const int32_t> generated) {
  PenaltyState state;
  for (int32_t t : prompt) state.AddPrompt(t);
  for (int32_t t : generated) state.AddGenerated(t);
  return state;
}

namespace {
struct ByToken {
  template <typename Entry>
  bool operator()(const Entry& e, int32_t token) const { return e.first < token; }
};
}  // namespace

PenaltyState::Seen& PenaltyState::Find(int32_t token) {
  auto it = std::lower_bound(seen_.begin(), seen_.end(), token, ByToken());
  if (it == seen_.end() || it->first != token) it = seen_.insert(it, {token, Seen()});
  return it->second;
}

const PenaltyState::Seen* PenaltyState::Lookup(int32_t token) const {
  auto it = std::lower_bound(seen_.begin(), seen_.end(), token, ByToken());
  return it == seen_.end() || it->first != token ? nullptr : &it->second;
}

int32_t PenaltyState::GeneratedCount(int32_t token) const {
  const Seen* s = Lookup(token);
  return s == nullptr ? 0 : s->generated_count;
}

bool PenaltyState::InPrompt(int32_t token) const {
  const Seen* s = Lookup(token);
  return s != nullptr && s->in_prompt;
}

double PenaltyState::Penalize(const SamplingParams& params, const Seen& seen, double l) {
  return PenalizeLogit(FactorsOf(params), seen.generated_count, l);
}

void PenaltyState::Apply(const SamplingParams& params, absl::Span<double> logits) const {
  if (!HasPenalties(params)) return;
  const int64_t vocab = static_cast<int64_t>(logits.size());
  for (const auto& [token, seen] : seen_) {
    if (token < 0 || token >= vocab) continue;
    logits[token] = Penalize(params, seen, logits[token]);
  }
}

void PenaltyState::PenalizedEntries(const SamplingParams& params, absl::Span<const float> logits,
                                    std::vector<std::pair<int32_t, double>>* out) const {
  out->clear();
  if (!HasPenalties(params)) return;
  const int64_t vocab = static_cast<int64_t>(logits.size());
  for (const auto& [token, seen] : seen_) {
    if (token < 0 || token >= vocab) continue;
    out->push_back({token, Penalize(params, seen, logits[token])});
  }
}

}  // namespace specd::sampling
