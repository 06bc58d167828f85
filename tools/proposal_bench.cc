// The per-token sampling passes over a row shaped like the default model's (49,152 logits),
// each fast version against its plain twin; the ratio of the two in one run is the figure
// (docs/PERFORMANCE.md):
//  * the draft's proposal, sampling::MakeProposal against MakeProposalReference, dense and as
//    a distilled draft's truncated head leaves the row (8,192 finite, the rest -inf), at T 0.8
//    and with top-p;
//  * the target's side: the greedy token (GreedyToken / GreedyTokenReference), p at T 0.8
//    dense and with top-p 0.9 (BuildTargetDistribution / ...Reference), and the log-normalizer
//    every emitted token's logprob needs (LogNormalizer / LogNormalizerReference).
//   build/tools/proposal_bench [--benchmark_filter=...]
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/sampling/draft_proposal.h"
#include "common/sampling/penalty_state.h"
#include "common/sampling/philox.h"
#include "common/sampling/sampler.h"
#include "common/sampling/sampling_params.h"
#include "common/sampling/target_distribution.h"

namespace {

using specd::sampling::CounterRng;
using specd::sampling::PenaltyState;
using specd::sampling::SamplingParams;

constexpr int kVocab = 49152, kHead = 8192, kTopN = 32;

std::vector<float> Row(bool truncated_head) {
  std::mt19937 rng(3);
  std::normal_distribution<float> logit(0.0f, 3.0f);
  std::vector<float> row(kVocab, -std::numeric_limits<float>::infinity());
  for (int i = 0; i < kVocab; ++i) {
    if (!truncated_head || i % (kVocab / kHead) == 0) row[i] = logit(rng);
  }
  return row;
}

template <bool kFast>
void BM_Proposal(benchmark::State& state) {
  const std::vector<float> row = Row(state.range(0) != 0);
  SamplingParams p;
  p.temperature = 0.8f;
  if (state.range(1) != 0) p.top_p = 0.9f;
  PenaltyState history;
  for (int t = 0; t < 200; ++t) history.AddPrompt(t * 97 % kVocab);
  const CounterRng rng(1);
  int64_t position = 0;
  for (auto _ : state) {
    auto q = kFast ? specd::sampling::MakeProposal(row, history, p, kTopN, rng, position)
                   : specd::sampling::MakeProposalReference(row, history, p, kTopN, rng, position);
    benchmark::DoNotOptimize(q);
    ++position;
  }
  state.SetLabel(std::string(state.range(0) ? "head 8192" : "dense") +
                 (state.range(1) ? ", top-p 0.9" : ""));
}

BENCHMARK(BM_Proposal<false>)->Name("reference")->ArgsProduct({{0, 1}, {0, 1}});
BENCHMARK(BM_Proposal<true>)->Name("fast")->ArgsProduct({{0, 1}, {0, 1}});

template <bool kFast>
void BM_Greedy(benchmark::State& state) {
  const std::vector<float> row = Row(false);
  SamplingParams p;
  p.temperature = 0.0f;
  const PenaltyState none;
  for (auto _ : state) {
    auto t = kFast ? specd::sampling::GreedyToken(row, none, p)
                   : specd::sampling::GreedyTokenReference(row, none, p);
    benchmark::DoNotOptimize(t);
  }
}
BENCHMARK(BM_Greedy<false>)->Name("greedy_token/reference");
BENCHMARK(BM_Greedy<true>)->Name("greedy_token/fast");

template <bool kFast>
void BM_TargetP(benchmark::State& state) {
  const std::vector<float> row = Row(false);
  SamplingParams p;
  p.temperature = 0.8f;
  if (state.range(0) != 0) p.top_p = 0.9f;
  PenaltyState history;
  for (int t = 0; t < 200; ++t) history.AddPrompt(t * 97 % kVocab);
  for (auto _ : state) {
    auto d = kFast ? specd::sampling::BuildTargetDistribution(row, history, p)
                   : specd::sampling::BuildTargetDistributionReference(row, history, p);
    benchmark::DoNotOptimize(d);
  }
  state.SetLabel(state.range(0) ? "T 0.8, top-p 0.9" : "T 0.8, dense");
}
BENCHMARK(BM_TargetP<false>)->Name("target_p/reference")->Arg(0)->Arg(1);
BENCHMARK(BM_TargetP<true>)->Name("target_p/fast")->Arg(0)->Arg(1);

template <bool kFast>
void BM_LogNormalizer(benchmark::State& state) {
  const std::vector<float> row = Row(false);
  for (auto _ : state) {
    double z = kFast ? specd::sampling::LogNormalizer(row)
                     : specd::sampling::LogNormalizerReference(row);
    benchmark::DoNotOptimize(z);
  }
}
BENCHMARK(BM_LogNormalizer<false>)->Name("log_normalizer/reference");
BENCHMARK(BM_LogNormalizer<true>)->Name("log_normalizer/fast");

}  // namespace

BENCHMARK_MAIN();
