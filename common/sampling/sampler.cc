#include "common/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/sampling/fast_exp.h"
#include "common/sampling/target_distribution.h"

namespace specd::sampling {

double LogNormalizerReference(absl::Span<const float> logits) {
  double max_logit = -std::numeric_limits<double>::infinity();
  for (float v : logits) max_logit = std::max(max_logit, static_cast<double>(v));
  double sum = 0.0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - max_logit);
  return max_logit + std::log(sum);
}

SPECD_ROW_PASS double LogNormalizer(absl::Span<const float> logits) {
  // Lanes of independent partial results so the loops vectorize (no reassociation needed).
  constexpr size_t kLanes = 16;
  const size_t n = logits.size(), body = n - n % kLanes;
  const float* x = logits.data();
  float lane_max[kLanes];
  for (size_t j = 0; j < kLanes; ++j) lane_max[j] = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < body; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lane_max[j] = x[i + j] > lane_max[j] ? x[i + j] : lane_max[j];
  }
  float max_logit = -std::numeric_limits<float>::infinity();
  for (size_t j = 0; j < kLanes; ++j) max_logit = std::max(max_logit, lane_max[j]);
  for (size_t i = body; i < n; ++i) max_logit = std::max(max_logit, x[i]);
  // exp(v - max) <= 1 in float (relative error < 4e-7 each), summed in double.
  double lane_sum[kLanes] = {};
  for (size_t i = 0; i < body; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lane_sum[j] += ExpNonPositive(x[i + j] - max_logit);
  }
  double sum = 0.0;
  for (size_t j = 0; j < kLanes; ++j) sum += lane_sum[j];
  for (size_t i = body; i < n; ++i) sum += ExpNonPositive(x[i] - max_logit);
  return static_cast<double>(max_logit) + std::log(sum);
}

SampledToken DescribeToken(absl::Span<const float> logits, int32_t token, int32_t num_logprobs) {
  const double log_z = LogNormalizer(logits);

  SampledToken out;
  out.token = token;
  out.logprob = static_cast<float>(static_cast<double>(logits[token]) - log_z);

  // Top-n by insertion into a small sorted list: n <= 20, one pass over the vocabulary.
  const size_t n = std::min<size_t>(std::max(num_logprobs, 0), logits.size());
  std::vector<int32_t> top;
  top.reserve(n + 1);
  auto better = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  for (int32_t i = 0; n > 0 && i < static_cast<int32_t>(logits.size()); ++i) {
    if (top.size() == n && !better(i, top.back())) continue;
    top.insert(std::upper_bound(top.begin(), top.end(), i, better), i);
    if (top.size() > n) top.pop_back();
  }
  out.top_logprobs.reserve(top.size());
  for (int32_t id : top) {
    out.top_logprobs.push_back({id, static_cast<float>(static_cast<double>(logits[id]) - log_z)});
  }
  return out;
}

absl::StatusOr<SampledToken> Sample(absl::Span<const float> logits, const PenaltyState& history,
                                    const SamplingParams& params, const CounterRng& rng,
                                    int64_t position) {
  if (absl::Status s = Validate(params, static_cast<int32_t>(logits.size())); !s.ok()) return s;
  int32_t token;
  if (IsGreedy(params)) {
    absl::StatusOr<int32_t> greedy = GreedyToken(logits, history, params);
    if (!greedy.ok()) return greedy.status();
    token = *greedy;
  } else {
    absl::StatusOr<TargetDistribution> p = BuildTargetDistribution(logits, history, params);
    if (!p.ok()) return p.status();
    token = p->Sample(rng.Uniform(position, RngPurpose::kSample));
  }
  return DescribeToken(logits, token, params.num_logprobs);
}

}  // namespace specd::sampling
