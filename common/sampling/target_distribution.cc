#include "common/sampling/target_distribution.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/sampling/fast_exp.h"

namespace specd::sampling {
namespace {

// Top-p sorts only this many candidates first; the rest is sorted only if the head does not
// already hold top_p of the mass (rare: real distributions are peaked).
constexpr size_t kTopPHead = 256;

struct Candidate {
  double w;  // unnormalized probability exp(s - max s)
  int32_t id;
};

// Strict total order: more likely first, ties -> lower id. A functor so sorts inline it.
struct MoreLikelyT {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.w > b.w || (a.w == b.w && a.id < b.id);
  }
};
constexpr MoreLikelyT MoreLikely;

// -inf is a legitimate mask; NaN or +inf means the model broke: the first such entry is
// named. One branch-free pass (it vectorizes), a second only to name a bad entry.
SPECD_ROW_PASS absl::Status CheckRow(absl::Span<const float> logits) {
  if (logits.empty()) return absl::InvalidArgumentError("logits row is empty");
  constexpr float kInf = std::numeric_limits<float>::infinity();
  bool bad = false;
  for (float v : logits) bad |= !(v < kInf);  // NaN or +inf
  if (!bad) return absl::OkStatus();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!(logits[i] < kInf)) {
      return absl::InvalidArgumentError(absl::StrCat("logits[", i, "] is ", logits[i]));
    }
  }
  return absl::OkStatus();
}

// x: [vocab] = penalized logits as double, or an error for a malformed row.
absl::StatusOr<std::vector<double>> PenalizedLogits(absl::Span<const float> logits,
                                                    const PenaltyState& history,
                                                    const SamplingParams& params) {
  if (absl::Status st = CheckRow(logits); !st.ok()) return st;
  std::vector<double> x(logits.begin(), logits.end());
  history.Apply(params, absl::MakeSpan(x));
  return x;
}

absl::StatusOr<int32_t> ArgmaxOf(absl::Span<const double> x) {
  size_t best = 0;
  for (size_t i = 1; i < x.size(); ++i) {
    if (x[i] > x[best]) best = i;  // strict: ties keep the lowest id
  }
  if (x[best] == -std::numeric_limits<double>::infinity()) {
    return absl::InvalidArgumentError("every logit is -inf");
  }
  return static_cast<int32_t>(best);
}

}  // namespace

TargetDistribution TargetDistribution::PointMass(int32_t token, int32_t vocab_size) {
  TargetDistribution d;
  d.vocab_size_ = vocab_size;
  d.ids_ = {token};
  d.probs_ = {1.0};
  return d;
}

TargetDistribution TargetDistribution::Dense(std::vector<double> probs) {
  TargetDistribution d;
  d.vocab_size_ = static_cast<int32_t>(probs.size());
  d.probs_ = std::move(probs);
  d.Normalize();
  return d;
}

TargetDistribution TargetDistribution::Sparse(std::vector<int32_t> ids, std::vector<double> probs,
                                              int32_t vocab_size) {
  TargetDistribution d;
  d.vocab_size_ = vocab_size;
  d.ids_ = std::move(ids);
  d.probs_ = std::move(probs);
  d.Normalize();
  return d;
}

void TargetDistribution::Normalize() {
  double total = 0.0;
  for (double p : probs_) total += p;
  if (total > 0.0) {
    for (double& p : probs_) p /= total;
  }
}

double TargetDistribution::Prob(int32_t token) const {
  if (token < 0 || token >= vocab_size_) return 0.0;
  if (is_dense()) return probs_[token];
  auto it = std::lower_bound(ids_.begin(), ids_.end(), token);
  if (it == ids_.end() || *it != token) return 0.0;
  return probs_[it - ids_.begin()];
}

int32_t TargetDistribution::Argmax() const {
  size_t best = 0;
  for (size_t i = 1; i < probs_.size(); ++i) {
    if (probs_[i] > probs_[best]) best = i;
  }
  return id(best);
}

int32_t TargetDistribution::Sample(double u) const {
  double cum = 0.0;
  size_t last_positive = 0;
  for (size_t i = 0; i < probs_.size(); ++i) {
    if (probs_[i] <= 0.0) continue;
    cum += probs_[i];
    last_positive = i;
    if (u < cum) return id(i);
  }
  // Rounding left the total a hair below u.
  return id(last_positive);
}

namespace {

// GreedyToken without penalties: the argmax of the raw row, the same answer and errors as
// PenalizedLogits + ArgmaxOf (float -> double is exact and keeps the order) without the
// double copy. Lanes of independent maxima so the loops vectorize.
SPECD_ROW_PASS absl::StatusOr<int32_t> RawArgmax(absl::Span<const float> logits) {
  if (absl::Status st = CheckRow(logits); !st.ok()) return st;
  constexpr size_t kLanes = 16;
  const size_t n = logits.size(), body = n - n % kLanes;
  const float* x = logits.data();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  float lane_max[kLanes];
  int32_t lane_id[kLanes];
  for (size_t j = 0; j < kLanes; ++j) {
    lane_max[j] = -kInf;
    lane_id[j] = static_cast<int32_t>(j);
  }
  for (size_t i = 0; i < body; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      const bool better = x[i + j] > lane_max[j];  // strict: a lane keeps its lowest id
      lane_max[j] = better ? x[i + j] : lane_max[j];
      lane_id[j] = better ? static_cast<int32_t>(i + j) : lane_id[j];
    }
  }
  float best_v = -kInf;
  int32_t best = 0;
  for (size_t j = 0; j < kLanes && j < n; ++j) {
    if (lane_max[j] > best_v || (lane_max[j] == best_v && lane_id[j] < best)) {
      best_v = lane_max[j];
      best = lane_id[j];
    }
  }
  for (size_t i = body; i < n; ++i) {
    if (x[i] > best_v) {
      best_v = x[i];
      best = static_cast<int32_t>(i);
    }
  }
  if (best_v == -kInf) return absl::InvalidArgumentError("every logit is -inf");
  return best;
}

}  // namespace

absl::StatusOr<int32_t> GreedyToken(absl::Span<const float> logits, const PenaltyState& history,
                                    const SamplingParams& params) {
  if (!HasPenalties(params)) return RawArgmax(logits);
  return GreedyTokenReference(logits, history, params);
}

absl::StatusOr<int32_t> GreedyTokenReference(absl::Span<const float> logits,
                                             const PenaltyState& history,
                                             const SamplingParams& params) {
  absl::StatusOr<std::vector<double>> x = PenalizedLogits(logits, history, params);
  if (!x.ok()) return x.status();
  return ArgmaxOf(*x);
}

namespace {

// x: [vocab] penalized logits -> w_i = exp(x_i / T - max_s) in place (exp(-inf) = 0).
using WeightsFn = void (*)(absl::Span<double> x, double temperature, double max_s);

void WeightsReference(absl::Span<double> x, double temperature, double max_s) {
  for (double& v : x) v = std::exp(v / temperature - max_s);
}

// The same argument, its exp at float precision (fast_exp.h): the plain loop vectorizes.
SPECD_ROW_PASS void WeightsFast(absl::Span<double> x, double temperature, double max_s) {
  for (double& v : x) v = ExpNonPositive(static_cast<float>(v / temperature - max_s));
}

absl::StatusOr<TargetDistribution> Build(absl::Span<const float> logits,
                                         const PenaltyState& history,
                                         const SamplingParams& params, WeightsFn weights) {
  absl::StatusOr<std::vector<double>> penalized = PenalizedLogits(logits, history, params);
  if (!penalized.ok()) return penalized.status();
  std::vector<double>& x = *penalized;
  const int32_t vocab = static_cast<int32_t>(x.size());
  absl::StatusOr<int32_t> best = ArgmaxOf(x);
  if (!best.ok()) return best.status();
  if (IsGreedy(params)) return TargetDistribution::PointMass(*best, vocab);

  const double temperature = params.temperature;
  const double max_s = x[*best] / temperature;
  const bool use_top_k = params.top_k > 0 && params.top_k < vocab;
  const bool use_top_p = params.top_p < 1.0f;
  const bool use_min_p = params.min_p > 0.0f;

  if (!use_top_k && !use_top_p && !use_min_p) {
    weights(absl::MakeSpan(x), temperature, max_s);
    return TargetDistribution::Dense(std::move(x));
  }

  std::vector<Candidate> c;
  c.reserve(vocab);
  for (int32_t i = 0; i < vocab; ++i) {
    if (x[i] != -std::numeric_limits<double>::infinity()) c.push_back({x[i], i});
  }
  {
    // The survivors' logits -> their weights, in one pass.
    std::vector<double> w(c.size());
    for (size_t i = 0; i < c.size(); ++i) w[i] = c[i].w;
    weights(absl::MakeSpan(w), temperature, max_s);
    for (size_t i = 0; i < c.size(); ++i) c[i].w = w[i];
  }

  if (use_top_k && static_cast<size_t>(params.top_k) < c.size()) {
    std::nth_element(c.begin(), c.begin() + (params.top_k - 1), c.end(), MoreLikely);
    c.resize(params.top_k);
  }

  if (use_top_p) {
    double total = 0.0;
    for (const Candidate& cand : c) total += cand.w;
    const double target = static_cast<double>(params.top_p) * total;
    size_t sorted = std::min(c.size(), kTopPHead);
    std::partial_sort(c.begin(), c.begin() + sorted, c.end(), MoreLikely);
    double cum = 0.0;
    size_t keep = 0;
    while (keep < c.size()) {
      if (keep == sorted) {
        // The head did not reach top_p: everything after it is less likely, sort the tail.
        std::sort(c.begin() + sorted, c.end(), MoreLikely);
        sorted = c.size();
      }
      if (cum >= target) break;  // cum = 0 < target at first: the top token is always kept
      cum += c[keep].w;
      ++keep;
    }
    c.resize(keep);
  }

  if (use_min_p) {
    // The argmax survives top-k and top-p and has w = exp(0) = 1, so max w is 1.
    const double threshold = params.min_p;
    std::erase_if(c, [threshold](const Candidate& cand) { return cand.w < threshold; });
  }

  std::sort(c.begin(), c.end(),
            [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
  std::vector<int32_t> ids(c.size());
  std::vector<double> probs(c.size());
  for (size_t i = 0; i < c.size(); ++i) {
    ids[i] = c[i].id;
    probs[i] = c[i].w;
  }
  return TargetDistribution::Sparse(std::move(ids), std::move(probs), vocab);
}

}  // namespace

absl::StatusOr<TargetDistribution> BuildTargetDistribution(absl::Span<const float> logits,
                                                           const PenaltyState& history,
                                                           const SamplingParams& params) {
  return Build(logits, history, params, WeightsFast);
}

absl::StatusOr<TargetDistribution> BuildTargetDistributionReference(
    absl::Span<const float> logits, const PenaltyState& history, const SamplingParams& params) {
  return Build(logits, history, params, WeightsReference);
}

}  // namespace specd::sampling
