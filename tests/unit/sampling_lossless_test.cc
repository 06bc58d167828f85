// Statistical proof-by-test that speculative verification is lossless, on a toy language model.
//
// Toy LM: vocab 12, logits = a fixed random table indexed by the last two tokens. The draft model
// is the target's table plus independent noise (so it agrees partly), proposing from its own
// distribution truncated to its top 6 (so q misses tokens p can emit and the residual matters).
// From the prompt {3, 7} we draw the first 3 tokens N = 100k times with plain sampling and with
// speculation (k = 1, 2, 3) and compare the joint distribution of (x1, x2, x3) — 1728 cells —
//   (a) to the exact joint computed from a plain reference of the transforms (one-sample
//       chi-square, cells with expected count < 5 pooled), and
//   (b) plain vs speculative samples (two-sample chi-square for equal sizes,
//       X^2 = sum (a-b)^2/(a+b), cells with a+b < 10 pooled).
// Threshold: the chi-square(df) quantile at upper tail 1e-6 (Wilson-Hilferty). With ~60
// comparisons the chance that a correct implementation fails is ~6e-5 for a random seed; the
// seeds are fixed, so the outcome is also reproducible. Deliberately wrong verifiers must exceed
// the same threshold (their bias is ~0.02-0.1 in total variation, while sampling noise at
// N = 100k is ~0.003 per cell scale, so they fail by orders of magnitude).
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "common/sampling/blockwise_verify_host.h"
#include "common/sampling/draft_proposal.h"
#include "common/sampling/penalty_state.h"
#include "common/sampling/philox.h"
#include "common/sampling/sampler.h"
#include "common/sampling/sampling_params.h"
#include "common/sampling/speculative_verifier.h"
#include "common/sampling/target_distribution.h"
#include "gtest/gtest.h"

namespace specd::sampling {
namespace {

constexpr int32_t kVocab = 12;
constexpr int kCells = kVocab * kVocab * kVocab;
constexpr int kSamples = 100'000;
constexpr int32_t kDraftTopN = 6;
const std::vector<int32_t> kPrompt = {3, 7};

double ChiSquareQuantile(double df, double z) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}
constexpr double kZ1e6 = 4.7534;  // P(N(0,1) > z) = 1e-6

// Logits indexed by the last two tokens.
class ToyLm {
 public:
  // logits = scale * N(0,1) from Philox(seed) [+ base's logits].
  ToyLm(uint64_t seed, double scale, const ToyLm* base = nullptr)
      : table_(kVocab * kVocab * kVocab) {
    const CounterRng rng(seed);
    for (size_t i = 0; i < table_.size(); ++i) {
      const double u1 = 1.0 - rng.Uniform(static_cast<int64_t>(i), RngPurpose::kSample);
      const double u2 = rng.Uniform(static_cast<int64_t>(i), RngPurpose::kDraft);
      const double normal = std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2);
      table_[i] = static_cast<float>(scale * normal + (base ? base->table_[i] : 0.0f));
    }
  }
  absl::Span<const float> Logits(int32_t prev2, int32_t prev1) const {
    return absl::MakeConstSpan(table_).subspan((prev2 * kVocab + prev1) * kVocab, kVocab);
  }

 private:
  std::vector<float> table_;
};

// Plain reference of the transforms (independent of the library's code paths).
std::vector<double> Reference(absl::Span<const float> logits, const std::vector<int32_t>& prompt,
                              const std::vector<int32_t>& generated, const SamplingParams& p) {
  std::vector<double> x(logits.begin(), logits.end());
  std::vector<int> count(kVocab, 0);
  std::vector<bool> seen(kVocab, false);
  for (int32_t t : prompt) seen[t] = true;
  for (int32_t t : generated) seen[t] = true, ++count[t];
  for (int i = 0; i < kVocab; ++i) {
    if (seen[i]) x[i] = x[i] > 0 ? x[i] / p.repetition_penalty : x[i] * p.repetition_penalty;
    if (count[i]) x[i] -= static_cast<double>(p.presence_penalty) +
              static_cast<double>(p.frequency_penalty) * count[i];
  }
  std::vector<double> prob(kVocab);
  double z = 0;
  for (int i = 0; i < kVocab; ++i) z += prob[i] = std::exp(x[i] / p.temperature);
  for (double& v : prob) v /= z;
  auto renorm = [&] {
    const double s = std::accumulate(prob.begin(), prob.end(), 0.0);
    for (double& v : prob) v /= s;
  };
  std::vector<int> order(kVocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return prob[a] > prob[b]; });
  if (p.top_k > 0) {
    for (int r = p.top_k; r < kVocab; ++r) prob[order[r]] = 0;
    renorm();
  }
  if (p.top_p < 1) {
    double cum = 0;
    for (int r = 0; r < kVocab; ++r) {
      if (cum >= p.top_p) prob[order[r]] = 0; else cum += prob[order[r]];
    }
    renorm();
  }
  if (p.min_p > 0) {
    const double pmax = prob[order[0]];
    for (double& v : prob) {
      if (v < p.min_p * pmax) v = 0;
    }
    renorm();
  }
  return prob;
}

std::vector<double> ExactJoint(const ToyLm& lm, const SamplingParams& p) {
  std::vector<double> joint(kCells);
  const std::vector<double> p1 = Reference(lm.Logits(kPrompt[0], kPrompt[1]), kPrompt, {}, p);
  for (int a = 0; a < kVocab; ++a) {
    const std::vector<double> p2 = Reference(lm.Logits(kPrompt[1], a), kPrompt, {a}, p);
    for (int b = 0; b < kVocab; ++b) {
      const std::vector<double> p3 = Reference(lm.Logits(a, b), kPrompt, {a, b}, p);
      for (int c = 0; c < kVocab; ++c) joint[(a * kVocab + b) * kVocab + c] = p1[a] * p2[b] * p3[c];
    }
  }
  return joint;
}

int Cell(const std::vector<int32_t>& seq) {
  const size_t n = kPrompt.size();
  return (seq[n] * kVocab + seq[n + 1]) * kVocab + seq[n + 2];
}

std::vector<int64_t> PlainCounts(const ToyLm& lm, const SamplingParams& p, uint64_t seed_base) {
  std::vector<int64_t> counts(kCells, 0);
  for (int s = 0; s < kSamples; ++s) {
    const CounterRng rng(seed_base + s);
    std::vector<int32_t> seq = kPrompt;
    PenaltyState state = PenaltyState::FromTokens(kPrompt, {});
    for (int j = 0; j < 3; ++j) {
      const int64_t n = static_cast<int64_t>(seq.size());
      const absl::StatusOr<SampledToken> t =
          Sample(lm.Logits(seq[n - 2], seq[n - 1]), state, p, rng, n);
      EXPECT_TRUE(t.ok()) << t.status();
      seq.push_back(t->token);
      state.AddGenerated(t->token);
    }
    ++counts[Cell(seq)];
  }
  return counts;
}

using Verifier = std::function<absl::StatusOr<VerifyResult>(
    const SamplingParams&, const CounterRng&, const VerifyInput&)>;

// Generates one sequence of >= 3 new tokens by speculation (draft k, verify, commit, repeat).
std::vector<int32_t> SpecSequence(const ToyLm& target, const ToyLm& draft, const SamplingParams& p,
                                  const SamplingParams& dp, int k, const CounterRng& rng,
                                  const Verifier& verify, int num_new, int64_t* accepted = nullptr,
                                  int64_t* drafted = nullptr) {
  std::vector<int32_t> seq = kPrompt;
  PenaltyState state = PenaltyState::FromTokens(kPrompt, {});
  std::vector<SparseProposal> proposals(k);
  std::vector<float> rows((k + 1) * kVocab);
  while (seq.size() < kPrompt.size() + num_new) {
    const int64_t n = static_cast<int64_t>(seq.size());
    std::vector<int32_t> ctx = seq;
    PenaltyState draft_state = state;
    for (int i = 0; i < k; ++i) {
      absl::StatusOr<SparseProposal> q = MakeProposal(
          draft.Logits(ctx[n + i - 2], ctx[n + i - 1]), draft_state, dp, kDraftTopN, rng, n + i);
      EXPECT_TRUE(q.ok()) << q.status();
      proposals[i] = std::move(*q);
      ctx.push_back(proposals[i].token);
      draft_state.AddGenerated(proposals[i].token);
    }
    for (int i = 0; i <= k; ++i) {
      absl::Span<const float> row = target.Logits(ctx[n + i - 2], ctx[n + i - 1]);
      std::copy(row.begin(), row.end(), rows.begin() + i * kVocab);
    }
    const absl::StatusOr<VerifyResult> r =
        verify(p, rng, {rows, kVocab, proposals, &state, n, {}});
    EXPECT_TRUE(r.ok()) << r.status();
    for (int32_t t : r->tokens) {
      seq.push_back(t);
      state.AddGenerated(t);
    }
    if (accepted) *accepted += r->num_accepted;
    if (drafted) *drafted += r->num_drafted;
  }
  return seq;
}

struct SpecStats {
  std::vector<int64_t> counts;
  double acceptance = 0;
};

SpecStats SpecCounts(const ToyLm& target, const ToyLm& draft, const SamplingParams& p, int k,
                     uint64_t seed_base, const Verifier& verify) {
  SamplingParams dp;  // the draft samples at temperature 1 from its own top-6
  SpecStats out;
  out.counts.assign(kCells, 0);
  int64_t accepted = 0, drafted = 0;
  for (int s = 0; s < kSamples; ++s) {
    const CounterRng rng(seed_base + s);
    ++out.counts[Cell(SpecSequence(target, draft, p, dp, k, rng, verify, 3, &accepted, &drafted))];
  }
  out.acceptance = static_cast<double>(accepted) / drafted;
  return out;
}

struct Fit {
  double chi2 = 0;
  int df = 0;
  double threshold = 0;
  double tv = 0;
  bool pass() const { return chi2 < threshold; }
};

Fit OneSample(const std::vector<int64_t>& counts, const std::vector<double>& probs) {
  const double n = std::accumulate(counts.begin(), counts.end(), 0.0);
  Fit f;
  double pooled_o = 0, pooled_e = 0;
  int bins = 0;
  for (int i = 0; i < kCells; ++i) {
    const double e = n * probs[i];
    f.tv += 0.5 * std::fabs(counts[i] / n - probs[i]);
    if (e < 5) {
      pooled_o += counts[i];
      pooled_e += e;
      if (e == 0 && counts[i] > 0) f.chi2 = std::numeric_limits<double>::infinity();
      continue;
    }
    f.chi2 += (counts[i] - e) * (counts[i] - e) / e;
    ++bins;
  }
  if (pooled_e > 0) {
    f.chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++bins;
  }
  f.df = bins - 1;
  f.threshold = ChiSquareQuantile(f.df, kZ1e6);
  return f;
}

Fit TwoSample(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  Fit f;
  double pa = 0, pb = 0;
  int bins = 0;
  for (int i = 0; i < kCells; ++i) {
    f.tv += 0.5 * std::fabs(static_cast<double>(a[i] - b[i])) / kSamples;
    if (a[i] + b[i] < 10) {
      pa += a[i];
      pb += b[i];
      continue;
    }
    f.chi2 += static_cast<double>((a[i] - b[i]) * (a[i] - b[i])) / (a[i] + b[i]);
    ++bins;
  }
  if (pa + pb > 0) {
    f.chi2 += (pa - pb) * (pa - pb) / (pa + pb);
    ++bins;
  }
  f.df = bins - 1;
  f.threshold = ChiSquareQuantile(f.df, kZ1e6);
  return f;
}

void Report(const std::string& what, const Fit& f) {
  std::printf("  %-34s chi2 = %9.1f  df = %4d  threshold(1e-6) = %6.1f  TV = %.4f  %s\n",
              what.c_str(), f.chi2, f.df, f.threshold, f.tv, f.pass() ? "same" : "DIFFERENT");
}

const ToyLm& Target() {
  static const ToyLm lm(101, 1.5);
  return lm;
}
const ToyLm& Draft() {
  static const ToyLm lm(202, 1.0, &Target());
  return lm;
}

Verifier Correct() { return VerifyDraft; }

struct Config {
  std::string name;
  SamplingParams params;
};

std::vector<Config> Configs() {
  std::vector<Config> c;
  SamplingParams p;
  p.temperature = 0.8f;
  c.push_back({"temperature", p});
  p = {};
  p.top_k = 4;
  c.push_back({"top_k", p});
  p = {};
  p.top_p = 0.75f;
  c.push_back({"top_p", p});
  p = {};
  p.min_p = 0.2f;
  c.push_back({"min_p", p});
  p = {};
  p.repetition_penalty = 1.8f;
  c.push_back({"repetition_penalty", p});
  p = {};
  p.presence_penalty = 0.8f;
  p.frequency_penalty = 0.6f;
  c.push_back({"presence_frequency", p});
  p = {};
  p.temperature = 0.9f;
  p.top_k = 8;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.3f;
  p.frequency_penalty = 0.2f;
  c.push_back({"combined", p});
  return c;
}

class LosslessTest : public ::testing::TestWithParam<Config> {};

TEST_P(LosslessTest, SpeculationMatchesTargetDistribution) {
  const Config& c = GetParam();
  const std::vector<double> exact = ExactJoint(Target(), c.params);
  const std::vector<int64_t> plain = PlainCounts(Target(), c.params, 1'000'000'000);
  std::printf("[%s]\n", c.name.c_str());
  const Fit plain_fit = OneSample(plain, exact);
  Report("plain vs exact", plain_fit);
  EXPECT_TRUE(plain_fit.pass());
  for (int k = 1; k <= 3; ++k) {
    const SpecStats spec =
        SpecCounts(Target(), Draft(), c.params, k, static_cast<uint64_t>(k) << 40, Correct());
    const Fit vs_exact = OneSample(spec.counts, exact);
    const Fit vs_plain = TwoSample(spec.counts, plain);
    Report("k=" + std::to_string(k) + " spec vs exact (accept " +
               std::to_string(spec.acceptance).substr(0, 5) + ")",
           vs_exact);
    Report("k=" + std::to_string(k) + " spec vs plain", vs_plain);
    EXPECT_TRUE(vs_exact.pass()) << c.name << " k=" << k;
    EXPECT_TRUE(vs_plain.pass()) << c.name << " k=" << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Transforms, LosslessTest, ::testing::ValuesIn(Configs()),
                         [](const auto& info) { return info.param.name; });

// The blockwise verifier (what the CUDA sampling kernels run, here on its host twin) through
// the same test: one block per row and per sequence, the request's seed from the rng's key.
Verifier Blockwise() {
  return [](const SamplingParams& p, const CounterRng& rng,
            const VerifyInput& in) -> absl::StatusOr<VerifyResult> {
    SamplingParams seeded = p;
    seeded.seed = rng.key()[0] | (static_cast<uint64_t>(rng.key()[1]) << 32);
    SequenceToVerify s;
    s.params = &seeded;
    s.history = in.history;
    s.proposals = in.proposals;
    s.position = in.position;
    s.eos_token_ids = in.eos_token_ids;
    absl::StatusOr<BlockwisePlan> plan = BlockwisePlan::Build(in.vocab_size, {&s, 1});
    if (!plan.ok()) return plan.status();
    absl::StatusOr<std::vector<VerifyResult>> r =
        VerifyBlockwiseOnHost(*plan, in.target_logits, /*threads_per_block=*/1);
    if (!r.ok()) return r.status();
    return std::move((*r)[0]);
  };
}

class BlockwiseLosslessTest : public ::testing::TestWithParam<Config> {};

TEST_P(BlockwiseLosslessTest, SpeculationMatchesTargetDistribution) {
  const Config& c = GetParam();
  const std::vector<double> exact = ExactJoint(Target(), c.params);
  const SpecStats spec = SpecCounts(Target(), Draft(), c.params, 2, 5ull << 40, Blockwise());
  const Fit fit = OneSample(spec.counts, exact);
  std::printf("[blockwise %s]\n", c.name.c_str());
  Report("k=2 blockwise spec vs exact (accept " + std::to_string(spec.acceptance).substr(0, 5) +
             ")",
         fit);
  EXPECT_TRUE(fit.pass()) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Transforms, BlockwiseLosslessTest, ::testing::ValuesIn(Configs()),
                         [](const auto& info) { return info.param.name; });

// --- Deliberately wrong verifiers: the same test must catch them. ---

enum class Bug {
  kAcceptWithP,       // accept d with probability p(d), ignoring q
  kResampleFromP,     // correction from p instead of norm(max(0, p - q))
  kStalePenalties,    // penalties for row i ignore d_1..d_{i-1}
};

Verifier Buggy(Bug bug) {
  return [bug](const SamplingParams& params, const CounterRng& rng,
               const VerifyInput& in) -> absl::StatusOr<VerifyResult> {
    VerifyResult out;
    out.num_drafted = static_cast<int32_t>(in.proposals.size());
    PenaltyState state = *in.history;
    const size_t k = in.proposals.size();
    auto dist = [&](size_t i) {
      return *BuildTargetDistribution(in.target_logits.subspan(i * kVocab, kVocab),
                                      bug == Bug::kStalePenalties ? *in.history : state, params);
    };
    for (size_t i = 0; i < k; ++i) {
      const int64_t pos = in.position + static_cast<int64_t>(i);
      const TargetDistribution p = dist(i);
      const SparseProposal& q = in.proposals[i];
      const double pd = p.Prob(q.token), qd = ProposalProb(q, q.token);
      const double u = rng.Uniform(pos, RngPurpose::kAccept);
      const bool accept = bug == Bug::kAcceptWithP ? u < pd : u * qd < pd;
      if (accept) {
        out.tokens.push_back(q.token);
        ++out.num_accepted;
        state.AddGenerated(q.token);
        continue;
      }
      const TargetDistribution r = bug == Bug::kResampleFromP ? p : ResidualDistribution(p, q);
      out.tokens.push_back(r.Sample(rng.Uniform(pos, RngPurpose::kResample)));
      return out;
    }
    out.tokens.push_back(dist(k).Sample(rng.Uniform(in.position + k, RngPurpose::kSample)));
    return out;
  };
}

struct BugCase {
  std::string name;
  Bug bug;
  int config;  // index into Configs()
  int k;
};

class WrongVerifierTest : public ::testing::TestWithParam<BugCase> {};

TEST_P(WrongVerifierTest, IsDetected) {
  const BugCase& b = GetParam();
  const Config c = Configs()[b.config];
  const std::vector<double> exact = ExactJoint(Target(), c.params);
  const SpecStats spec = SpecCounts(Target(), Draft(), c.params, b.k, 77ull << 40, Buggy(b.bug));
  const Fit fit = OneSample(spec.counts, exact);
  std::printf("[wrong verifier: %s, %s, k=%d]\n", b.name.c_str(), c.name.c_str(), b.k);
  Report("buggy spec vs exact", fit);
  EXPECT_FALSE(fit.pass()) << "the test failed to detect " << b.name;
}

INSTANTIATE_TEST_SUITE_P(
    Bugs, WrongVerifierTest,
    ::testing::Values(BugCase{"accept_with_p", Bug::kAcceptWithP, 0, 2},
                      BugCase{"resample_from_p", Bug::kResampleFromP, 0, 2},
                      BugCase{"stale_penalties", Bug::kStalePenalties, 4, 3}),
    [](const auto& info) { return info.param.name; });

// The buggy harness with the bug switched off must pass: the detection above is the bug's.
TEST(WrongVerifierTest, HarnessWithoutBugPasses) {
  Verifier fixed = [](const SamplingParams& p, const CounterRng& rng, const VerifyInput& in) {
    // kStalePenalties only differs when penalties are on; with them off it is the correct rule.
    SamplingParams no_pen = p;
    no_pen.repetition_penalty = 1.0f;
    return Buggy(Bug::kStalePenalties)(no_pen, rng, in);
  };
  SamplingParams plain_t;  // temperature 1, no transforms
  const std::vector<double> exact_t = ExactJoint(Target(), plain_t);
  const SpecStats spec = SpecCounts(Target(), Draft(), plain_t, 2, 88ull << 40, fixed);
  const Fit fit = OneSample(spec.counts, exact_t);
  Report("bug-free harness vs exact", fit);
  EXPECT_TRUE(fit.pass());
}

// --- Greedy: speculation == argmax decoding, token for token. ---

TEST(GreedyTest, SpeculationEqualsArgmaxDecoding) {
  for (float rep : {1.0f, 1.5f}) {
    SamplingParams p;
    p.temperature = 0.0f;
    p.repetition_penalty = rep;
    constexpr int kLen = 40;
    // Argmax decoding.
    std::vector<int32_t> want = kPrompt;
    PenaltyState state = PenaltyState::FromTokens(kPrompt, {});
    for (int j = 0; j < kLen; ++j) {
      const int64_t n = static_cast<int64_t>(want.size());
      const int32_t t =
          Sample(Target().Logits(want[n - 2], want[n - 1]), state, p, CounterRng(0), n)->token;
      want.push_back(t);
      state.AddGenerated(t);
    }
    for (int k = 1; k <= 4; ++k) {
      SamplingParams dp;
      dp.temperature = 0.0f;  // greedy draft
      int64_t accepted = 0, drafted = 0;
      std::vector<int32_t> got = SpecSequence(Target(), Draft(), p, dp, k, CounterRng(0),
                                              Correct(), kLen, &accepted, &drafted);
      got.resize(want.size());
      EXPECT_EQ(got, want) << "k=" << k << " rep=" << rep;
      EXPECT_GT(accepted, 0);
      EXPECT_LT(accepted, drafted);  // both paths (accept and reject) were exercised
      // A sampling draft changes nothing either: greedy verification ignores q.
      SamplingParams sampling_dp;
      got = SpecSequence(Target(), Draft(), p, sampling_dp, k, CounterRng(5), Correct(), kLen);
      got.resize(want.size());
      EXPECT_EQ(got, want) << "sampling draft, k=" << k << " rep=" << rep;
    }
  }
}

}  // namespace
}  // namespace specd::sampling
