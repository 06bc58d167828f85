// Unit tests for common/sampling: Philox known answers, parameter validation, each transform
// against a plain reference, the sampler, proposals, and the verifier's edge cases.
// The statistical losslessness tests live in sampling_lossless_test.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/sampling/draft_proposal.h"
#include "common/sampling/fast_exp.h"
#include "common/sampling/penalty_state.h"
#include "common/sampling/philox.h"
#include "common/sampling/sampler.h"
#include "common/sampling/sampling_params.h"
#include "common/sampling/speculative_verifier.h"
#include "common/sampling/target_distribution.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specd::sampling {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();

// Upper quantile of chi-square(df) at standard-normal z (Wilson-Hilferty approximation).
double ChiSquareQuantile(double df, double z) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}
constexpr double kZ1e6 = 4.7534;  // P(N(0,1) > z) = 1e-6

// Goodness of fit of observed counts to probabilities (all expected counts >= 5 here).
double ChiSquare(const std::vector<int64_t>& counts, const std::vector<double>& probs) {
  const double n = std::accumulate(counts.begin(), counts.end(), 0.0);
  double chi2 = 0.0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = n * probs[i];
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi2;
}

// ---------------------------------------------------------------------------------------------
// Philox

// Published known-answer vectors for philox4x32-10 (Random123 tests/kat_vectors):
// counter[4] key[2] -> output[4].
TEST(PhiloxTest, KnownAnswerVectors) {
  EXPECT_EQ(Philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(Philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
                          {0xffffffff, 0xffffffff}),
            (PhiloxCounter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(Philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
                          {0xa4093822, 0x299f31d0}),
            (PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(PhiloxTest, CounterLayout) {
  const CounterRng rng(0x299f31d0a4093822ull);
  EXPECT_EQ(rng.key(), (PhiloxKey{0xa4093822, 0x299f31d0}));
  const int64_t pos = (int64_t{7} << 32) | 5;
  EXPECT_EQ(rng.Bits(pos, RngPurpose::kResample, 9),
            Philox4x32_10({5, 7, static_cast<uint32_t>(RngPurpose::kResample), 9}, rng.key()));
}

TEST(PhiloxTest, UniformFromBitsRange) {
  EXPECT_EQ(UniformFromBits(0, 0), 0.0);
  EXPECT_LT(UniformFromBits(0xffffffff, 0xffffffff), 1.0);
  EXPECT_GT(UniformFromBits(0xffffffff, 0xffffffff), 1.0 - 1e-15);
  EXPECT_EQ(UniformFromBits(0x80000000, 0), 0.5);
}

TEST(PhiloxTest, UniformsAreUniform) {
  // 1M draws in 100 bins; chi-square(99) exceeds its 1e-6 quantile with probability 1e-6.
  constexpr int kBins = 100;
  constexpr int kDraws = 1'000'000;
  std::vector<int64_t> counts(kBins, 0);
  const CounterRng rng(12345);
  double sum = 0.0;
  for (int i = 0; i < kDraws; ++i) {
    const double u = rng.Uniform(i, static_cast<RngPurpose>(i % 4), static_cast<uint32_t>(i % 3));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    ++counts[static_cast<int>(u * kBins)];
  }
  EXPECT_LT(ChiSquare(counts, std::vector<double>(kBins, 1.0 / kBins)),
            ChiSquareQuantile(kBins - 1, kZ1e6));
  EXPECT_NEAR(sum / kDraws, 0.5, 5 * std::sqrt(1.0 / 12 / kDraws));
}

TEST(PhiloxTest, StreamsDiffer) {
  const CounterRng a(1), b(2);
  std::set<double> seen;
  for (int64_t pos : {0, 1, 1000}) {
    for (uint32_t purpose = 0; purpose < 4; ++purpose) {
      for (uint32_t lane : {0u, 1u}) {
        seen.insert(a.Uniform(pos, static_cast<RngPurpose>(purpose), lane));
        seen.insert(b.Uniform(pos, static_cast<RngPurpose>(purpose), lane));
      }
    }
  }
  EXPECT_EQ(seen.size(), 3u * 4u * 2u * 2u);
  EXPECT_EQ(a.Uniform(17, RngPurpose::kAccept), CounterRng(1).Uniform(17, RngPurpose::kAccept));
}

// ---------------------------------------------------------------------------------------------
// Validation

TEST(ValidateTest, DefaultsAreValid) {
  EXPECT_TRUE(Validate(SamplingParams{}, 10).ok());
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.top_p = 1.0f;
  greedy.min_p = 1.0f;
  greedy.num_logprobs = kMaxLogprobs;
  greedy.stop_token_ids = {0, 9};
  greedy.repetition_penalty = kMaxRepetitionPenalty;
  greedy.presence_penalty = -2.0f;
  greedy.frequency_penalty = 2.0f;
  EXPECT_TRUE(Validate(greedy, 10).ok());
}

TEST(ValidateTest, ErrorsNameTheField) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    std::function<void(SamplingParams&)> mutate;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](SamplingParams& p) { p.temperature = -0.1f; }, "temperature"},
      {[&](SamplingParams& p) { p.temperature = nan; }, "temperature"},
      {[](SamplingParams& p) { p.temperature = kInf; }, "temperature"},
      {[](SamplingParams& p) { p.top_k = -1; }, "top_k"},
      {[](SamplingParams& p) { p.top_p = 0.0f; }, "top_p"},
      {[](SamplingParams& p) { p.top_p = 1.5f; }, "top_p"},
      {[&](SamplingParams& p) { p.top_p = nan; }, "top_p"},
      {[](SamplingParams& p) { p.min_p = -0.01f; }, "min_p"},
      {[](SamplingParams& p) { p.min_p = 1.01f; }, "min_p"},
      {[&](SamplingParams& p) { p.min_p = nan; }, "min_p"},
      {[](SamplingParams& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty"},
      {[](SamplingParams& p) { p.repetition_penalty = 11.0f; }, "repetition_penalty"},
      {[&](SamplingParams& p) { p.repetition_penalty = nan; }, "repetition_penalty"},
      {[](SamplingParams& p) { p.presence_penalty = 2.5f; }, "presence_penalty"},
      {[&](SamplingParams& p) { p.presence_penalty = nan; }, "presence_penalty"},
      {[](SamplingParams& p) { p.frequency_penalty = -2.5f; }, "frequency_penalty"},
      {[&](SamplingParams& p) { p.frequency_penalty = nan; }, "frequency_penalty"},
      {[](SamplingParams& p) { p.num_logprobs = -1; }, "num_logprobs"},
      {[](SamplingParams& p) { p.num_logprobs = 21; }, "num_logprobs"},
      {[](SamplingParams& p) { p.stop_token_ids = {3, 10}; }, "stop_token_ids[1]"},
      {[](SamplingParams& p) { p.stop_token_ids = {-1}; }, "stop_token_ids[0]"},
  };
  for (const Case& c : cases) {
    SamplingParams p;
    c.mutate(p);
    const absl::Status s = Validate(p, 10);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(s.message(), HasSubstr(c.field));
  }
  EXPECT_THAT(Validate(SamplingParams{}, 0).message(), HasSubstr("vocab_size"));
}

TEST(ValidateTest, StopTokens) {
  SamplingParams p;
  p.stop_token_ids = {5};
  const std::vector<int32_t> eos = {2};
  EXPECT_TRUE(IsStopToken(p, eos, 5));
  EXPECT_TRUE(IsStopToken(p, eos, 2));
  EXPECT_FALSE(IsStopToken(p, eos, 3));
  p.ignore_eos = true;
  EXPECT_FALSE(IsStopToken(p, eos, 2));
  EXPECT_TRUE(IsStopToken(p, eos, 5));
}

// ---------------------------------------------------------------------------------------------
// Transforms against a plain reference

// Dense reference: the documented pipeline written out directly on normalized probabilities.
std::vector<double> ReferenceDistribution(const std::vector<float>& logits,
                                          const std::vector<int32_t>& prompt,
                                          const std::vector<int32_t>& generated,
                                          const SamplingParams& p) {
  const int v = static_cast<int>(logits.size());
  std::vector<double> x(logits.begin(), logits.end());
  std::vector<bool> seen(v, false);
  std::vector<int> count(v, 0);
  for (int32_t t : prompt) seen[t] = true;
  for (int32_t t : generated) {
    seen[t] = true;
    ++count[t];
  }
  for (int i = 0; i < v; ++i) {
    if (seen[i]) x[i] = x[i] > 0 ? x[i] / p.repetition_penalty : x[i] * p.repetition_penalty;
    if (count[i] > 0) x[i] -= static_cast<double>(p.presence_penalty) +
              static_cast<double>(p.frequency_penalty) * count[i];
  }
  std::vector<double> prob(v, 0.0);
  if (p.temperature == 0.0f) {
    prob[std::max_element(x.begin(), x.end()) - x.begin()] = 1.0;  // first max
    return prob;
  }
  double m = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < v; ++i) m = std::max(m, x[i] / p.temperature);
  for (int i = 0; i < v; ++i) prob[i] = std::exp(x[i] / p.temperature - m);
  auto renorm = [&] {
    const double z = std::accumulate(prob.begin(), prob.end(), 0.0);
    for (double& q : prob) q /= z;
  };
  renorm();
  std::vector<int> order(v);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return prob[a] > prob[b]; });
  if (p.top_k > 0) {
    for (int r = p.top_k; r < v; ++r) prob[order[r]] = 0.0;
    renorm();
  }
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    for (int r = 0; r < v; ++r) {
      if (cum >= p.top_p) {
        prob[order[r]] = 0.0;
      } else {
        cum += prob[order[r]];
      }
    }
    renorm();
  }
  if (p.min_p > 0.0f) {
    const double pmax = *std::max_element(prob.begin(), prob.end());
    for (double& q : prob) {
      if (q < p.min_p * pmax) q = 0.0;
    }
    renorm();
  }
  return prob;
}

std::vector<double> DenseOf(const TargetDistribution& d) {
  std::vector<double> out(d.vocab_size(), 0.0);
  for (size_t i = 0; i < d.size(); ++i) out[d.id(i)] = d.prob(i);
  return out;
}

TargetDistribution Build(const std::vector<float>& logits, const SamplingParams& p,
                         const std::vector<int32_t>& prompt = {},
                         const std::vector<int32_t>& generated = {}) {
  // The pipeline's rules, checked exactly on the plain twin; FastWeightsAgreeWithReference
  // holds the fast weights to it.
  absl::StatusOr<TargetDistribution> d =
      BuildTargetDistributionReference(logits, PenaltyState::FromTokens(prompt, generated), p);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : TargetDistribution();
}

std::vector<double> Softmax(const std::vector<double>& x) {
  std::vector<double> e(x.size());
  const double m = *std::max_element(x.begin(), x.end());
  double z = 0;
  for (size_t i = 0; i < x.size(); ++i) z += e[i] = std::exp(x[i] - m);
  for (double& v : e) v /= z;
  return e;
}

MATCHER_P(ProbsNear, expected, "") {
  const std::vector<double>& got = arg;
  if (got.size() != expected.size()) return false;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::fabs(got[i] - expected[i]) > 1e-12) {
      *result_listener << "index " << i << ": " << got[i] << " vs " << expected[i];
      return false;
    }
  }
  return true;
}

TEST(TransformTest, TemperatureHandChecked) {
  const std::vector<float> logits = {1, 2, 3, 4};
  SamplingParams p;
  TargetDistribution d = Build(logits, p);
  EXPECT_TRUE(d.is_dense());
  EXPECT_THAT(DenseOf(d), ProbsNear(Softmax({1, 2, 3, 4})));
  // logits {0, ln 2} at T = 0.5 -> weights {1, 4}.
  p.temperature = 0.5f;
  d = Build({0.0f, static_cast<float>(std::log(2.0))}, p);
  EXPECT_NEAR(d.Prob(0), 0.2, 1e-7);
  EXPECT_NEAR(d.Prob(1), 0.8, 1e-7);
}

TEST(TransformTest, TopKHandChecked) {
  SamplingParams p;
  p.top_k = 2;
  const TargetDistribution d = Build({1, 2, 3, 4}, p);
  EXPECT_FALSE(d.is_dense());
  EXPECT_EQ(d.size(), 2u);
  EXPECT_NEAR(d.Prob(2), 1 / (1 + std::exp(1.0)), 1e-12);
  EXPECT_NEAR(d.Prob(3), std::exp(1.0) / (1 + std::exp(1.0)), 1e-12);
  EXPECT_EQ(d.Prob(0), 0.0);
  // Ties at the cut: the lower id survives.
  const TargetDistribution tie = Build({5, 1, 5, 5}, p);
  EXPECT_THAT(DenseOf(tie), ProbsNear(std::vector<double>{0.5, 0, 0.5, 0}));
  // top_k >= vocab is off.
  p.top_k = 4;
  EXPECT_TRUE(Build({1, 2, 3, 4}, p).is_dense());
}

TEST(TransformTest, TopPHandChecked) {
  // softmax(1,2,3,4) = {0.0321, 0.0871, 0.2369, 0.6439}.
  SamplingParams p;
  p.top_p = 0.7f;  // 0.6439 < 0.7, so token 2 is needed too
  TargetDistribution d = Build({1, 2, 3, 4}, p);
  EXPECT_EQ(d.size(), 2u);
  EXPECT_NEAR(d.Prob(3), std::exp(1.0) / (1 + std::exp(1.0)), 1e-12);
  p.top_p = 0.6f;  // the top token alone holds 0.6439 >= 0.6
  d = Build({1, 2, 3, 4}, p);
  EXPECT_EQ(d.size(), 1u);
  EXPECT_EQ(d.Prob(3), 1.0);
  p.top_p = 0.01f;  // the top token is always kept
  EXPECT_EQ(Build({1, 2, 3, 4}, p).Prob(3), 1.0);
  // top-k first, then top-p renormalized over the survivors: top-2 = {0.269, 0.731}.
  p.top_k = 2;
  p.top_p = 0.72f;
  EXPECT_EQ(Build({1, 2, 3, 4}, p).Prob(3), 1.0);
  p.top_p = 0.74f;
  EXPECT_EQ(Build({1, 2, 3, 4}, p).size(), 2u);
}

TEST(TransformTest, MinPHandChecked) {
  // Relative weights e^-3, e^-2, e^-1, 1 = 0.050, 0.135, 0.368, 1.
  SamplingParams p;
  p.min_p = 0.3f;
  TargetDistribution d = Build({1, 2, 3, 4}, p);
  EXPECT_EQ(d.size(), 2u);
  EXPECT_NEAR(d.Prob(2), 1 / (1 + std::exp(1.0)), 1e-12);
  p.min_p = 0.1f;
  d = Build({1, 2, 3, 4}, p);
  EXPECT_EQ(d.size(), 3u);
  EXPECT_EQ(d.Prob(0), 0.0);
  p.min_p = 1.0f;
  EXPECT_EQ(Build({1, 2, 3, 4}, p).Prob(3), 1.0);
}

TEST(TransformTest, PenaltiesHandChecked) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  // Prompt {0} and generated {1} are both seen: {2, -2, 1, 0.5} -> {1, -4, 1, 0.5}.
  const TargetDistribution d = Build({2, -2, 1, 0.5}, p, {0}, {1});
  EXPECT_THAT(DenseOf(d), ProbsNear(Softmax({1, -4, 1, 0.5})));
  p.temperature = 0.0f;  // greedy sees the penalties too; the tie 0/2 goes to id 0
  EXPECT_EQ(Build({2, -2, 1.5, 0.5}, p, {0}, {1}).Argmax(), 2);
  EXPECT_EQ(Build({2, -2, 1, 0.5}, p, {0}, {1}).Argmax(), 0);

  SamplingParams q;
  q.presence_penalty = 0.5f;
  q.frequency_penalty = 0.25f;
  // Generated {0, 0, 1}: x0 = 1 - 0.5 - 0.5, x1 = 1 - 0.5 - 0.25; the prompt does not count.
  const TargetDistribution e = Build({1, 1, 1}, q, {2}, {0, 0, 1});
  EXPECT_THAT(DenseOf(e), ProbsNear(Softmax({0, 0.25, 1})));
}

TEST(TransformTest, GreedyTiesAndMasks) {
  SamplingParams p;
  p.temperature = 0.0f;
  const TargetDistribution g = Build({3, 5, 5, 1}, p);
  EXPECT_EQ(g.Argmax(), 1);
  EXPECT_EQ(g.Prob(1), 1.0);
  EXPECT_EQ(*GreedyToken(std::vector<float>{3, 5, 5, 1}, PenaltyState(), p), 1);
  // Tiny positive temperatures are greedy instead of overflowing logits / T.
  p.temperature = 1e-40f;
  EXPECT_EQ(Build({3, 5, 5, 1}, p).Prob(1), 1.0);
  p.temperature = 1e-4f;
  EXPECT_NEAR(Build({3, 5, 5.0001f, 1}, p).Prob(2), 1 / (1 + std::exp(-1.0)), 1e-3);

  SamplingParams t;
  EXPECT_THAT(DenseOf(Build({-kInf, 0, 0}, t)), ProbsNear(std::vector<double>{0, 0.5, 0.5}));
  t.top_p = 0.9f;  // the sparse path skips masked tokens
  EXPECT_THAT(DenseOf(Build({-kInf, 0, 0}, t)), ProbsNear(std::vector<double>{0, 0.5, 0.5}));

  const PenaltyState none;
  for (const std::vector<float>& bad : std::vector<std::vector<float>>{
           {-kInf, -kInf}, {0, std::numeric_limits<float>::quiet_NaN()}, {0, kInf}, {}}) {
    EXPECT_EQ(BuildTargetDistribution(bad, none, t).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(BuildTargetDistribution(bad, none, p).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(TransformTest, RandomizedAgainstReference) {
  const CounterRng rng(2024);
  int64_t c = 0;
  auto u = [&] { return rng.Uniform(c++, RngPurpose::kSample); };
  for (int trial = 0; trial < 2000; ++trial) {
    const int v = 2 + static_cast<int>(u() * 40);
    std::vector<float> logits(v);
    const bool ties = u() < 0.3;  // quantized logits exercise the tie rules
    for (float& l : logits) {
      const double g = 4 * (u() - 0.5) * (1 + u());
      l = static_cast<float>(ties ? std::round(g * 2) / 2 : g);
    }
    if (u() < 0.2) logits[static_cast<int>(u() * v)] = -kInf;
    SamplingParams p;
    p.temperature = u() < 0.1 ? 0.0f : static_cast<float>(0.2 + 2 * u());
    if (u() < 0.5) p.top_k = 1 + static_cast<int>(u() * (v + 2));
    if (u() < 0.5) p.top_p = static_cast<float>(0.05 + 0.95 * u());
    if (u() < 0.5) p.min_p = static_cast<float>(0.6 * u());
    if (u() < 0.5) p.repetition_penalty = static_cast<float>(0.5 + 2 * u());
    if (u() < 0.5) p.presence_penalty = static_cast<float>(4 * u() - 2);
    if (u() < 0.5) p.frequency_penalty = static_cast<float>(4 * u() - 2);
    std::vector<int32_t> prompt, generated;
    for (int i = 0, n = static_cast<int>(u() * 6); i < n; ++i) prompt.push_back(u() * v);
    for (int i = 0, n = static_cast<int>(u() * 6); i < n; ++i) generated.push_back(u() * v);
    ASSERT_TRUE(Validate(p, v).ok());

    const std::vector<double> want = ReferenceDistribution(logits, prompt, generated, p);
    const std::vector<double> got = DenseOf(Build(logits, p, prompt, generated));
    ASSERT_EQ(got.size(), want.size());
    for (int i = 0; i < v; ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-9) << "trial " << trial << " token " << i;
    }
  }
}

TEST(TransformTest, TopPLongTailBeyondSortedHead) {
  // 5000 near-equal tokens: the 256-token head holds ~5% of the mass, so top_p = 0.5 needs
  // the tail sort.
  std::vector<float> logits(5000);
  for (int i = 0; i < 5000; ++i) logits[i] = static_cast<float>(std::sin(i * 0.37) * 0.01);
  SamplingParams p;
  p.top_p = 0.5f;
  const std::vector<double> want = ReferenceDistribution(logits, {}, {}, p);
  const std::vector<double> got = DenseOf(Build(logits, p));
  for (int i = 0; i < 5000; ++i) ASSERT_NEAR(got[i], want[i], 1e-12) << i;
  const size_t kept = Build(logits, p).size();
  EXPECT_GT(kept, 1000u);  // far beyond the sorted head
  EXPECT_LT(kept, 4000u);
}

// ---------------------------------------------------------------------------------------------
// The fast row passes against their plain twins

TEST(FastExpTest, MatchesStdExpToFloatPrecision) {
  double worst = 0;
  float worst_at = 0;
  for (int i = 0; i <= 2000000; ++i) {
    const float x = -86.0f * static_cast<float>(i) / 2000000.0f;
    const double want = std::exp(static_cast<double>(x));
    const double rel = std::fabs(ExpNonPositive(x) - want) / want;
    if (rel > worst) {
      worst = rel;
      worst_at = x;
    }
  }
  EXPECT_LT(worst, 4e-7) << "at " << worst_at;
  EXPECT_EQ(ExpNonPositive(0.0f), 1.0f);
  EXPECT_EQ(ExpNonPositive(-0.0f), 1.0f);
  EXPECT_EQ(ExpNonPositive(-kInf), 0.0f);
  EXPECT_EQ(ExpNonPositive(-87.5f), 0.0f);
  EXPECT_EQ(ExpNonPositive(-1e30f), 0.0f);
  EXPECT_GT(ExpNonPositive(kExpFloor), 0.0f);
}

// Rows shaped like a model's: n logits ~ N(0, sigma), some masked (-inf), n not a multiple of
// the passes' 16 lanes.
std::vector<float> ModelLikeRow(std::mt19937& gen, int n, float sigma, double masked) {
  std::normal_distribution<float> logit(0.0f, sigma);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<float> row(n);
  for (float& l : row) l = u(gen) < masked ? -kInf : logit(gen);
  row[static_cast<size_t>(u(gen) * n)] = 4.0f * sigma;  // at least one finite
  return row;
}

TEST(FastRowTest, LogNormalizerAgreesWithReference) {
  std::mt19937 gen(11);
  for (int n : {1, 5, 16, 17, 1000, 49152, 49153}) {
    for (float sigma : {0.5f, 3.0f, 12.0f}) {
      for (double masked : {0.0, 0.3, 0.95}) {
        const std::vector<float> row = ModelLikeRow(gen, n, sigma, masked);
        EXPECT_NEAR(LogNormalizer(row), LogNormalizerReference(row), 2e-6)
            << n << " " << sigma << " " << masked;
      }
    }
  }
  const std::vector<float> one = {-kInf, 2.5f, -kInf};
  EXPECT_DOUBLE_EQ(LogNormalizer(one), 2.5);
}

TEST(FastRowTest, GreedyTokenEqualsReference) {
  std::mt19937 gen(12);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const PenaltyState none;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  for (int trial = 0; trial < 3000; ++trial) {
    const int n = 1 + static_cast<int>(u(gen) * (trial % 3 == 0 ? 49152 : 70));
    std::vector<float> row = ModelLikeRow(gen, n, 2.0f, u(gen) < 0.2 ? 0.5 : 0.0);
    if (u(gen) < 0.4) {  // quantized: ties between lanes and within one
      for (float& l : row) l = std::isinf(l) ? l : std::round(l);
    }
    const double what = u(gen);
    if (what < 0.05) row[static_cast<size_t>(u(gen) * n)] = std::nanf("");
    else if (what < 0.1) row[static_cast<size_t>(u(gen) * n)] = kInf;
    else if (what < 0.13) std::fill(row.begin(), row.end(), -kInf);
    const absl::StatusOr<int32_t> fast = GreedyToken(row, none, greedy);
    const absl::StatusOr<int32_t> ref = GreedyTokenReference(row, none, greedy);
    ASSERT_EQ(fast.ok(), ref.ok()) << trial;
    if (ref.ok()) {
      ASSERT_EQ(*fast, *ref) << trial;
    } else {
      ASSERT_EQ(fast.status(), ref.status()) << trial;
    }
  }
  EXPECT_FALSE(GreedyToken({}, none, greedy).ok());
}

// The same support and, per token, probabilities within the float exp's precision: the
// argument exp(s_i - max s) is rounded to float, so a token 20 nats down the row is off by up
// to ~20 * 6e-8 relative; such tokens weigh ~e^-20.
TEST(FastRowTest, FastWeightsAgreeWithReference) {
  std::mt19937 gen(13);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < 400; ++trial) {
    const int n = trial % 4 == 0 ? 49152 : 2 + static_cast<int>(u(gen) * 300);
    const std::vector<float> row = ModelLikeRow(gen, n, trial % 2 ? 3.0f : 8.0f, u(gen) * 0.5);
    SamplingParams p;
    p.temperature = static_cast<float>(0.2 + 1.5 * u(gen));
    if (u(gen) < 0.4) p.top_k = 1 + static_cast<int>(u(gen) * 100);
    if (u(gen) < 0.4) p.top_p = static_cast<float>(0.5 + 0.5 * u(gen));
    if (u(gen) < 0.3) p.min_p = static_cast<float>(0.2 * u(gen));
    if (u(gen) < 0.3) p.repetition_penalty = 1.3f;
    std::vector<int32_t> prompt;
    for (int i = 0; i < 20; ++i) prompt.push_back(static_cast<int32_t>(u(gen) * n));
    const PenaltyState history = PenaltyState::FromTokens(prompt, {});
    const absl::StatusOr<TargetDistribution> fast = BuildTargetDistribution(row, history, p);
    const absl::StatusOr<TargetDistribution> ref =
        BuildTargetDistributionReference(row, history, p);
    ASSERT_TRUE(fast.ok() && ref.ok()) << trial;
    ASSERT_EQ(fast->is_dense(), ref->is_dense()) << trial;
    // Token by token over the vocabulary: where the reference keeps weights below float's
    // range (< e^-87 of the top), the fast one has 0, and top-k may then keep other such
    // tokens: either way their probability is below 1e-30.
    const std::vector<double> f = DenseOf(*fast), r = DenseOf(*ref);
    for (int i = 0; i < n; ++i) {
      ASSERT_NEAR(f[i], r[i], 6e-6 * r[i] + 1e-30) << "trial " << trial << " token " << i;
    }
    const int32_t top = ref->Argmax();
    EXPECT_EQ(fast->Argmax(), top) << trial;
    EXPECT_GT(f[top], 0.0) << trial;
  }
}

// ---------------------------------------------------------------------------------------------
// Sampler

TEST(SamplerTest, DescribeTokenUsesRawLogSoftmax) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  const SampledToken t = DescribeToken(logits, 4, 3);
  double z = 0;
  for (float l : logits) z += std::exp(l);
  EXPECT_NEAR(t.logprob, 1.0 - std::log(z), 1e-6);
  ASSERT_EQ(t.top_logprobs.size(), 3u);
  EXPECT_EQ(t.top_logprobs[0].token, 1);  // tie 1/3 -> lower id first
  EXPECT_EQ(t.top_logprobs[1].token, 3);
  EXPECT_EQ(t.top_logprobs[2].token, 4);
  EXPECT_NEAR(t.top_logprobs[0].logprob, 2.0 - std::log(z), 1e-6);
  EXPECT_TRUE(DescribeToken(logits, 0, 0).top_logprobs.empty());
  EXPECT_EQ(DescribeToken(logits, 0, 20).top_logprobs.size(), 5u);
  // Penalties and temperature do not change the reported logprob.
  SamplingParams p;
  p.temperature = 0.3f;
  p.repetition_penalty = 3.0f;
  p.num_logprobs = 2;
  const absl::StatusOr<SampledToken> s =
      Sample(logits, PenaltyState::FromTokens({1, 3}, {}), p, CounterRng(1), 0);
  ASSERT_TRUE(s.ok());
  EXPECT_NEAR(s->logprob, logits[s->token] - std::log(z), 1e-6);
  EXPECT_EQ(s->top_logprobs.size(), 2u);
}

TEST(SamplerTest, FrequenciesMatchDistribution) {
  const std::vector<float> logits = {0.1f, 1.2f, -0.5f, 0.7f, 2.0f, -3.0f};
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 5;
  const std::vector<double> want = ReferenceDistribution(logits, {}, {}, p);
  std::vector<int64_t> counts(logits.size(), 0);
  const CounterRng rng(99);
  for (int pos = 0; pos < 200'000; ++pos) {
    ++counts[Sample(logits, PenaltyState(), p, rng, pos)->token];
  }
  EXPECT_EQ(counts[5], 0);  // cut by top-k
  std::vector<int64_t> kept(counts.begin(), counts.begin() + 5);
  std::vector<double> kept_p(want.begin(), want.begin() + 5);
  EXPECT_LT(ChiSquare(kept, kept_p), ChiSquareQuantile(4, kZ1e6));
}

TEST(SamplerTest, DeterministicRegardlessOfCallOrder) {
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = static_cast<float>(std::cos(i * 1.7) * 3);
  SamplingParams p;
  p.top_p = 0.9f;
  const PenaltyState none;
  auto token = [&](uint64_t seed, int64_t pos) {
    return Sample(logits, none, p, CounterRng(seed), pos)->token;
  };
  std::vector<int32_t> forward(200), backward(200), other(200);
  for (int i = 0; i < 200; ++i) forward[i] = token(7, i);
  for (int i = 199; i >= 0; --i) backward[i] = token(7, i);
  for (int i = 0; i < 200; ++i) other[i] = token(8, i);
  EXPECT_EQ(forward, backward);
  EXPECT_NE(forward, other);
}

TEST(SamplerTest, RejectsInvalidParams) {
  SamplingParams p;
  p.top_p = 0.0f;
  EXPECT_THAT(Sample(std::vector<float>{1, 2}, PenaltyState(), p, CounterRng(0), 0)
                  .status()
                  .message(),
              HasSubstr("top_p"));
}

// ---------------------------------------------------------------------------------------------
// Proposals

TEST(ProposalTest, TruncatesRenormalizesAndSamplesFromQ) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 3.0f, 0.5f, 2.5f};
  SamplingParams dp;
  const CounterRng rng(5);
  std::vector<int64_t> counts(6, 0);
  SparseProposal first;
  for (int pos = 0; pos < 100'000; ++pos) {
    absl::StatusOr<SparseProposal> q = MakeProposal(logits, PenaltyState(), dp, 3, rng, pos);
    ASSERT_TRUE(q.ok());
    if (pos == 0) first = *q;
    ++counts[q->token];
  }
  EXPECT_THAT(first.ids, ElementsAre(3, 5, 2));  // top-3 by probability
  EXPECT_TRUE(ValidateProposal(first, 6).ok());
  const double z = std::exp(3.0) + std::exp(2.5) + std::exp(2.0);
  EXPECT_NEAR(first.probs[0], std::exp(3.0) / z, 1e-6);
  EXPECT_EQ(counts[0] + counts[1] + counts[4], 0);
  const std::vector<int64_t> kept = {counts[3], counts[5], counts[2]};
  std::vector<double> q(first.probs.begin(), first.probs.end());
  EXPECT_LT(ChiSquare(kept, q), ChiSquareQuantile(2, kZ1e6));

  dp.temperature = 0.0f;
  const SparseProposal g = *MakeProposal(logits, PenaltyState(), dp, 32, rng, 0);
  EXPECT_EQ(g.token, 3);
  EXPECT_THAT(g.ids, ElementsAre(3));
  EXPECT_FALSE(MakeProposal(logits, PenaltyState(), dp, 0, rng, 0).ok());
}

// How sure the draft is at a position: greedy reads the argmax's temperature-1 softmax over
// the top_n logits (penalties applied), sampled reads q's largest probability.
TEST(ProposalTest, DraftConfidenceIsTheDraftsLargestProbability) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 3.0f, 0.5f, 2.5f};
  const CounterRng rng(5);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const SparseProposal g = *MakeProposal(logits, PenaltyState(), greedy, 32, rng, 0);
  // top_n 3: ids 3, 5, 2.
  EXPECT_NEAR(*DraftConfidence(logits, PenaltyState(), greedy, 3, g),
              std::exp(3.0) / (std::exp(3.0) + std::exp(2.5) + std::exp(2.0)), 1e-12);
  double whole = 0.0;
  for (float x : logits) whole += std::exp(x - 3.0);
  EXPECT_NEAR(*DraftConfidence(logits, PenaltyState(), greedy, 32, g), 1.0 / whole, 1e-12);
  // A flat row reads 1 / top_n.
  const std::vector<float> flat(1000, 0.25f);
  const SparseProposal f = *MakeProposal(flat, PenaltyState(), greedy, 32, rng, 0);
  EXPECT_NEAR(*DraftConfidence(flat, PenaltyState(), greedy, 32, f), 1.0 / 32, 1e-12);
  // Penalties move the argmax and the confidence with it: token 3 seen, its logit 3 / 10.
  greedy.repetition_penalty = 10.0f;
  PenaltyState seen;
  seen.AddGenerated(3);
  const SparseProposal pg = *MakeProposal(logits, seen, greedy, 32, rng, 0);
  EXPECT_EQ(pg.token, 5);
  double rest = 0.0;
  for (int i : {0, 1, 2, 4, 5}) rest += std::exp(logits[i] - 2.5);
  EXPECT_NEAR(*DraftConfidence(logits, seen, greedy, 32, pg), 1.0 / (rest + std::exp(0.3 - 2.5)),
              1e-6);
  // Sampled: q's largest probability, whichever token was drawn.
  SamplingParams sampled;
  std::set<int32_t> drawn;
  for (int pos = 0; pos < 50; ++pos) {
    const SparseProposal q = *MakeProposal(logits, PenaltyState(), sampled, 3, rng, pos);
    drawn.insert(q.token);
    EXPECT_DOUBLE_EQ(*DraftConfidence(logits, PenaltyState(), sampled, 3, q), ProposalProb(q, 3));
  }
  EXPECT_GT(drawn.size(), 1u);
  EXPECT_FALSE(DraftConfidence(logits, PenaltyState(), greedy, 0, g).ok());
}

// MakeProposal (one selection pass, exp on the candidates) against its plain twin over random
// rows and every transform: the same ids in the same order, probs within float rounding, the
// same drawn token, the same errors. Rows include ties, -inf masks (a truncated head), runs
// of equal logits at the cut, and penalties.
TEST(ProposalTest, FastEqualsReference) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  int compared = 0, truncated = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int vocab = 1 + static_cast<int>(rng() % 700);
    std::vector<float> logits(vocab);
    const float spread = trial % 3 == 0 ? 1.0f : 12.0f;
    for (float& l : logits) l = (unit(rng) - 0.5f) * spread;
    if (trial % 4 == 1) {  // a truncated head: most of the row is masked
      for (float& l : logits) {
        if (rng() % 5 != 0) l = -std::numeric_limits<float>::infinity();
      }
      logits[rng() % vocab] = 0.5f;  // not all -inf
    }
    if (trial % 5 == 2) {  // ties, a run of them at the cut
      const float v = logits[0];
      for (int i = 0; i < vocab; i += 1 + static_cast<int>(rng() % 3)) logits[i] = v;
    }
    SamplingParams p;
    p.temperature = trial % 7 == 0 ? 0.0f : 0.2f + 1.8f * unit(rng);
    if (rng() % 3 == 0) p.top_k = 1 + static_cast<int32_t>(rng() % 80);
    if (rng() % 3 == 0) p.top_p = 0.05f + 0.9f * unit(rng);
    if (rng() % 4 == 0) p.min_p = 0.3f * unit(rng);
    if (rng() % 3 == 0) {
      p.repetition_penalty = 0.5f + 1.5f * unit(rng);
      p.presence_penalty = unit(rng);
      p.frequency_penalty = unit(rng);
    }
    PenaltyState history;
    for (int i = 0, n = static_cast<int>(rng() % 30); i < n; ++i) {
      if (rng() % 2) {
        history.AddPrompt(static_cast<int32_t>(rng() % vocab));
      } else {
        history.AddGenerated(static_cast<int32_t>(rng() % vocab));
      }
    }
    const int32_t top_n = 1 + static_cast<int32_t>(rng() % 40);
    const CounterRng draw(trial);
    absl::StatusOr<SparseProposal> fast = MakeProposal(logits, history, p, top_n, draw, trial);
    absl::StatusOr<SparseProposal> ref =
        MakeProposalReference(logits, history, p, top_n, draw, trial);
    ASSERT_EQ(fast.ok(), ref.ok()) << trial << " " << fast.status() << " " << ref.status();
    if (!fast.ok()) {
      EXPECT_EQ(fast.status().code(), ref.status().code());
      continue;
    }
    ++compared;
    if (ref->ids.size() < static_cast<size_t>(std::min(top_n, vocab))) ++truncated;
    ASSERT_EQ(fast->ids, ref->ids) << "trial " << trial;
    ASSERT_EQ(fast->probs.size(), ref->probs.size());
    for (size_t j = 0; j < ref->probs.size(); ++j) {
      EXPECT_NEAR(fast->probs[j], ref->probs[j], 2e-7 + 1e-6 * ref->probs[j]) << trial;
    }
    EXPECT_EQ(fast->token, ref->token) << "trial " << trial;
    EXPECT_TRUE(ValidateProposal(*fast, vocab).ok());
  }
  EXPECT_GT(compared, 2500);
  EXPECT_GT(truncated, 200) << "the sweep should exercise top-k / top-p / min-p cuts";
}

TEST(ProposalTest, FastRejectsWhatTheReferenceRejects) {
  SamplingParams p;
  const CounterRng draw(1);
  const float inf = std::numeric_limits<float>::infinity();
  for (const std::vector<float>& row :
       {std::vector<float>{}, std::vector<float>{1.0f, std::nanf(""), 0.0f},
        std::vector<float>{0.0f, inf}, std::vector<float>{-inf, -inf}}) {
    EXPECT_EQ(MakeProposal(row, PenaltyState(), p, 4, draw, 0).ok(),
              MakeProposalReference(row, PenaltyState(), p, 4, draw, 0).ok());
    EXPECT_FALSE(MakeProposal(row, PenaltyState(), p, 4, draw, 0).ok());
  }
}

TEST(ProposalTest, ValidationErrors) {
  auto check = [](SparseProposal q, const std::string& what) {
    const absl::Status s = ValidateProposal(q, 4);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << what;
    EXPECT_THAT(s.message(), HasSubstr(what));
  };
  check({0, {0, 1}, {1.0f}}, "probs");
  check({0, {}, {}}, "empty");
  check({7, {0}, {1.0f}}, "token");
  check({0, {0, 4}, {0.5f, 0.5f}}, "outside");
  check({0, {1, 1}, {0.5f, 0.5f}}, "repeated");
  check({0, {0, 1}, {1.5f, -0.5f}}, "probs[1]");
  check({0, {0, 1}, {0.5f, 0.4f}}, "sum");
  EXPECT_TRUE(ValidateProposal({2, {0, 1}, {0.5f, 0.5f}}, 4).ok());  // d outside q is allowed
  EXPECT_EQ(ProposalProb({2, {0, 1}, {0.5f, 0.5f}}, 2), 0.0);
}

// ---------------------------------------------------------------------------------------------
// Verifier edge cases

TEST(VerifierTest, ResidualDistribution) {
  const TargetDistribution p = TargetDistribution::Dense({0.5, 0.5, 0.0});
  TargetDistribution r = ResidualDistribution(p, {0, {0}, {1.0f}});
  EXPECT_THAT(DenseOf(r), ProbsNear(std::vector<double>{0, 1, 0}));
  // p == q: no residual mass, fall back to p.
  r = ResidualDistribution(p, {0, {1, 0}, {0.5f, 0.5f}});
  EXPECT_THAT(DenseOf(r), ProbsNear(std::vector<double>{0.5, 0.5, 0}));
  // Sparse p; q mass outside supp(p) is irrelevant.
  const TargetDistribution sp = TargetDistribution::Sparse({1, 3}, {0.75, 0.25}, 5);
  r = ResidualDistribution(sp, {0, {4, 1, 0}, {0.25f, 0.5f, 0.25f}});
  EXPECT_THAT(DenseOf(r), ProbsNear(std::vector<double>{0, 0.5, 0, 0.5, 0}));
}

// Rows of 4-token logits, each strongly peaked on one token (p(peak) > 1 - 1e-12).
std::vector<float> PeakedRows(const std::vector<int>& peaks) {
  std::vector<float> rows(peaks.size() * 4, 0.0f);
  for (size_t i = 0; i < peaks.size(); ++i) rows[i * 4 + peaks[i]] = 30.0f;
  return rows;
}

SparseProposal Point(int32_t t) { return {t, {t}, {1.0f}}; }

TEST(VerifierTest, AcceptsAllAndAddsBonus) {
  const std::vector<float> rows = PeakedRows({1, 2, 3, 0});
  const std::vector<SparseProposal> q = {Point(1), Point(2), Point(3)};
  SamplingParams p;
  p.num_logprobs = 2;
  const absl::StatusOr<VerifyResult> r =
      VerifyDraft(p, CounterRng(3), {rows, 4, q, nullptr, 10, {}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->num_drafted, 3);
  EXPECT_EQ(r->num_accepted, 3);
  EXPECT_THAT(r->tokens, ElementsAre(1, 2, 3, 0));
  EXPECT_THAT(r->accepted, ElementsAre(true, true, true));
  EXPECT_FALSE(r->stopped);
  ASSERT_EQ(r->logprobs.size(), 4u);
  ASSERT_EQ(r->top_logprobs.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const SampledToken want =
        DescribeToken(absl::MakeConstSpan(rows).subspan(i * 4, 4), r->tokens[i], 2);
    EXPECT_EQ(r->logprobs[i], want.logprob);
    EXPECT_EQ(r->top_logprobs[i][0].token, want.top_logprobs[0].token);
  }
}

TEST(VerifierTest, StopTokenTruncatesAcceptedRun) {
  const std::vector<float> rows = PeakedRows({1, 2, 3, 0});
  const std::vector<SparseProposal> q = {Point(1), Point(2), Point(3)};
  SamplingParams p;
  p.stop_token_ids = {2};
  VerifyResult r = *VerifyDraft(p, CounterRng(3), {rows, 4, q, nullptr, 0, {}});
  EXPECT_THAT(r.tokens, ElementsAre(1, 2));
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.num_accepted, 2);
  EXPECT_THAT(r.accepted, ElementsAre(true, true, false));

  // EOS inside the run stops unless ignore_eos; EOS as the bonus token stops too.
  const std::vector<int32_t> eos = {3};
  p.stop_token_ids.clear();
  r = *VerifyDraft(p, CounterRng(3), {rows, 4, q, nullptr, 0, eos});
  EXPECT_THAT(r.tokens, ElementsAre(1, 2, 3));
  EXPECT_TRUE(r.stopped);
  p.ignore_eos = true;
  r = *VerifyDraft(p, CounterRng(3), {rows, 4, q, nullptr, 0, eos});
  EXPECT_THAT(r.tokens, ElementsAre(1, 2, 3, 0));
  EXPECT_FALSE(r.stopped);
  p.ignore_eos = false;
  r = *VerifyDraft(p, CounterRng(3), {rows, 4, q, nullptr, 0, std::vector<int32_t>{0}});
  EXPECT_THAT(r.tokens, ElementsAre(1, 2, 3, 0));
  EXPECT_TRUE(r.stopped);
  // Greedy takes the same path.
  p.temperature = 0.0f;
  p.stop_token_ids = {2};
  r = *VerifyDraft(p, CounterRng(3), {rows, 4, q, nullptr, 0, {}});
  EXPECT_THAT(r.tokens, ElementsAre(1, 2));
  EXPECT_TRUE(r.stopped);
}

TEST(VerifierTest, RejectionEmitsCorrectionFromResidual) {
  // Row 0 peaked on 1; the draft proposed 2 with certainty: p(2) ~ 0, so it is rejected and
  // the correction comes from norm(max(0, p - q)) ~ token 1.
  const std::vector<float> rows = PeakedRows({1, 3});
  const std::vector<SparseProposal> q = {Point(2)};
  const VerifyResult r = *VerifyDraft(SamplingParams{}, CounterRng(3), {rows, 4, q, nullptr, 0, {}});
  EXPECT_EQ(r.num_accepted, 0);
  EXPECT_THAT(r.tokens, ElementsAre(1));
  EXPECT_THAT(r.accepted, ElementsAre(false));
  EXPECT_FALSE(r.proposal_mismatch);
}

TEST(VerifierTest, DraftOutsideItsProposalFallsBackToTarget) {
  const std::vector<float> rows = PeakedRows({1, 2, 3});
  // d_2 = 3 is not in q_2 = {2}: stop there and sample position 2 from p_2 itself.
  const std::vector<SparseProposal> q = {Point(1), {3, {2}, {1.0f}}};
  const VerifyResult r = *VerifyDraft(SamplingParams{}, CounterRng(3), {rows, 4, q, nullptr, 0, {}});
  EXPECT_TRUE(r.proposal_mismatch);
  EXPECT_EQ(r.num_accepted, 1);
  EXPECT_THAT(r.tokens, ElementsAre(1, 2));
  EXPECT_THAT(r.accepted, ElementsAre(true, false));
}

TEST(VerifierTest, InputErrors) {
  const std::vector<float> rows = PeakedRows({1, 2});
  const std::vector<SparseProposal> one = {Point(1)};
  const std::vector<SparseProposal> two = {Point(1), Point(2)};
  const SamplingParams p;
  EXPECT_THAT(VerifyDraft(p, CounterRng(0), {rows, 4, two, nullptr, 0, {}}).status().message(),
              HasSubstr("target_logits"));
  const std::vector<SparseProposal> bad = {{1, {1, 2}, {0.5f, 0.2f}}};
  const absl::Status s = VerifyDraft(p, CounterRng(0), {rows, 4, bad, nullptr, 0, {}}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("proposals[0]"));
  SamplingParams bad_params;
  bad_params.temperature = -1.0f;
  EXPECT_THAT(
      VerifyDraft(bad_params, CounterRng(0), {rows, 4, one, nullptr, 0, {}}).status().message(),
      HasSubstr("temperature"));
  std::vector<float> nan_rows = rows;
  nan_rows[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(VerifyDraft(p, CounterRng(0), {nan_rows, 4, one, nullptr, 0, {}}).ok());
  // Greedy ignores q but still checks the token.
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const std::vector<SparseProposal> bare = {{1, {}, {}}};
  EXPECT_TRUE(VerifyDraft(greedy, CounterRng(0), {rows, 4, bare, nullptr, 0, {}}).ok());
  const std::vector<SparseProposal> oov = {{9, {}, {}}};
  EXPECT_FALSE(VerifyDraft(greedy, CounterRng(0), {rows, 4, oov, nullptr, 0, {}}).ok());
  // k = 0 is plain sampling of one token.
  const VerifyResult r =
      *VerifyDraft(p, CounterRng(0), {absl::MakeConstSpan(rows).subspan(0, 4), 4, {}, nullptr, 0, {}});
  EXPECT_THAT(r.tokens, ElementsAre(1));
}

TEST(VerifierTest, PenaltiesSeeEarlierDrafts) {
  // Row 1 prefers token 1 slightly over 2; after accepting d_1 = 1 a strong repetition penalty
  // must flip row 1's greedy choice to 2.
  const std::vector<float> rows = {0, 5, 0, 0,  0, 2, 1.5f, 0,  0, 0, 0, 0};
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 2.0f;
  const std::vector<SparseProposal> q = {Point(1), Point(1)};
  const VerifyResult r = *VerifyDraft(p, CounterRng(0), {rows, 4, q, nullptr, 0, {}});
  EXPECT_THAT(r.tokens, ElementsAre(1, 2));
  EXPECT_THAT(r.accepted, ElementsAre(true, false));
}

}  // namespace
}  // namespace specd::sampling
