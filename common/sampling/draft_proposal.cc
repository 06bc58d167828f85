#include "common/sampling/draft_proposal.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/sampling/target_distribution.h"

namespace specd::sampling {
namespace {

double ProposalTotal(const SparseProposal& q) {
  double total = 0.0;
  for (float p : q.probs) total += p;
  return total;
}

}  // namespace

absl::Status ValidateProposal(const SparseProposal& q, int32_t vocab_size) {
  if (q.ids.size() != q.probs.size()) {
    return absl::InvalidArgumentError(absl::StrCat("proposal has ", q.ids.size(), " ids but ",
                                                   q.probs.size(), " probs"));
  }
  if (q.ids.empty()) return absl::InvalidArgumentError("proposal distribution is empty");
  if (q.token < 0 || q.token >= vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("proposal token ", q.token, " is outside the vocabulary [0, ", vocab_size,
                     ")"));
  }
  // Repeated ids: proposals are small (top-32), so sort a copy only when they are not.
  std::vector<int32_t> sorted;
  if (q.ids.size() > 64) {
    sorted = q.ids;
    std::sort(sorted.begin(), sorted.end());
  }
  for (size_t j = 0; j < q.ids.size(); ++j) {
    if (q.ids[j] < 0 || q.ids[j] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("proposal ids[", j, "] = ", q.ids[j],
                                                     " is outside the vocabulary"));
    }
    const bool repeated =
        sorted.empty()
            ? std::find(q.ids.begin(), q.ids.begin() + j, q.ids[j]) != q.ids.begin() + j
            : (j > 0 && sorted[j] == sorted[j - 1]);
    if (repeated) {
      const int32_t id = sorted.empty() ? q.ids[j] : sorted[j];
      return absl::InvalidArgumentError(absl::StrCat("proposal id ", id, " is repeated"));
    }
    if (!(q.probs[j] >= 0.0f) || !std::isfinite(q.probs[j])) {
      return absl::InvalidArgumentError(
          absl::StrCat("proposal probs[", j, "] = ", q.probs[j], " is not a probability"));
    }
  }
  const double total = ProposalTotal(q);
  if (!(std::fabs(total - 1.0) <= kProposalSumTolerance)) {
    return absl::InvalidArgumentError(
        absl::StrCat("proposal probs sum to ", total, ", not 1"));
  }
  return absl::OkStatus();
}

double ProposalProb(const SparseProposal& q, int32_t token) {
  for (size_t j = 0; j < q.ids.size(); ++j) {
    if (q.ids[j] == token) {
      const double total = ProposalTotal(q);
      return total > 0.0 ? q.probs[j] / total : 0.0;
    }
  }
  return 0.0;
}

int32_t SampleProposal(const SparseProposal& q, double u) {
  const double target = u * ProposalTotal(q);
  double cum = 0.0;
  int32_t last_positive = q.ids.empty() ? -1 : q.ids.front();
  for (size_t j = 0; j < q.ids.size(); ++j) {
    if (q.probs[j] <= 0.0f) continue;
    cum += q.probs[j];
    last_positive = q.ids[j];
    if (target < cum) return q.ids[j];
  }
  return last_positive;
}

absl::StatusOr<SparseProposal> MakeProposal(absl::Span<const float> logits,
                                            const PenaltyState& history,
                                            const SamplingParams& draft_params, int32_t top_n,
                                            const CounterRng& rng, int64_t position) {
  if (top_n < 1) {
    return absl::InvalidArgumentError(absl::StrCat("proposal top_n must be >= 1, got ", top_n));
  }
  if (absl::Status s = Validate(draft_params, static_cast<int32_t>(logits.size())); !s.ok()) {
    return s;
  }
  absl::StatusOr<TargetDistribution> p = BuildTargetDistribution(logits, history, draft_params);
  if (!p.ok()) return p.status();

  std::vector<std::pair<double, int32_t>> cand;  // (prob, id), positive probs only
  cand.reserve(p->size());
  for (size_t i = 0; i < p->size(); ++i) {
    if (p->prob(i) > 0.0) cand.push_back({p->prob(i), p->id(i)});
  }
  const size_t n = std::min<size_t>(top_n, cand.size());
  std::partial_sort(cand.begin(), cand.begin() + n, cand.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  double kept = 0.0;
  for (size_t j = 0; j < n; ++j) kept += cand[j].first;

  SparseProposal q;
  q.ids.resize(n);
  q.probs.resize(n);
  for (size_t j = 0; j < n; ++j) {
    q.ids[j] = cand[j].second;
    q.probs[j] = static_cast<float>(cand[j].first / kept);
  }
  // Sample from exactly the float q the verifier will read.
  q.token = SampleProposal(q, rng.Uniform(position, RngPurpose::kDraft));
  return q;
}

}  // namespace specd::sampling
