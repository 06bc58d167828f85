// The draft's per-token proposal cost: sampling::MakeProposal against its plain twin
// MakeProposalReference on rows shaped like the default model's (49,152 logits), dense and as
// a distilled draft's truncated head leaves them (8,192 finite, the rest -inf), at T 0.8 and
// with top-p. The ratio of the two in one run is the figure (docs/PERFORMANCE.md).
//   build/tools/proposal_bench [--benchmark_filter=...]
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/sampling/draft_proposal.h"
#include "common/sampling/penalty_state.h"
#include "common/sampling/philox.h"
#include "common/sampling/sampling_params.h"

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

}  // namespace

BENCHMARK_MAIN();
