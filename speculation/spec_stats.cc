#include "speculation/spec_stats.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace specd::spec {

double SpecStats::MeanK() const {
  int64_t n = 0, sum = 0;
  for (size_t k = 0; k < k_chosen.size(); ++k) {
    n += k_chosen[k];
    sum += static_cast<int64_t>(k) * k_chosen[k];
  }
  return n ? double(sum) / n : 0.0;
}

std::string SpecStats::ToString() const {
  std::string s = absl::StrFormat(
      "steps %d, target tokens %d (prefill %d), emitted %d in %d sequence-steps: mean accepted "
      "length %.3f, draft acceptance %.3f (%d/%d), mean k %.2f\n",
      steps, target_tokens, prefill_tokens, emitted, seq_steps, MeanAcceptedLength(),
      AcceptanceRate(), accepted, drafted, MeanK());
  absl::StrAppend(&s, "acceptance by draft position:");
  for (size_t i = 0; i < drafted_at.size(); ++i) {
    if (drafted_at[i] == 0) continue;
    absl::StrAppendFormat(&s, " %d:%.2f", i + 1, double(accepted_at[i]) / drafted_at[i]);
  }
  absl::StrAppend(&s, "\nk chosen:");
  for (size_t k = 0; k < k_chosen.size(); ++k) {
    if (k_chosen[k]) absl::StrAppendFormat(&s, " k=%d:%d", k, k_chosen[k]);
  }
  absl::StrAppendFormat(
      &s,
      "\ntime: draft %.3f s (%.2f ms/step), verify %.3f s (%.2f ms/step), step %.3f s; "
      "preemptions %d, draft failures %d",
      draft_seconds, steps ? 1e3 * draft_seconds / steps : 0.0, verify_seconds,
      steps ? 1e3 * verify_seconds / steps : 0.0, step_seconds, preemptions, draft_failures);
  return s;
}

}  // namespace specd::spec
