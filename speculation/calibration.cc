#include "speculation/calibration.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "common/sampling/penalty_state.h"
#include "common/sampling/philox.h"
#include "common/sampling/sampling_params.h"

namespace specd::spec {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Token ids spread over the vocabulary (any ids do: only the time is measured).
std::vector<int32_t> ProbeTokens(int32_t n, int32_t vocab) {
  std::vector<int32_t> ids(n);
  for (int32_t i = 0; i < n; ++i) ids[i] = 1 + (i * 7919) % std::max(1, vocab - 1);
  return ids;
}

}  // namespace

absl::StatusOr<CostCurve> CalibrateVerify(engine::ModelRunner& runner, int32_t max_tokens,
                                          int32_t max_rows, engine::SeqId probe) {
  const int32_t vocab = runner.model().vocab_size();
  const engine::PagedKvCache& kv = runner.kv();
  max_tokens = static_cast<int32_t>(std::min<int64_t>(
      {max_tokens, int64_t{kv.num_free_blocks()} * kv.config().block_size,
       runner.model().options().max_batch_tokens}));
  max_rows = std::max(1, std::min(max_rows, runner.model().options().max_logit_rows));
  if (max_tokens < 1) return absl::ResourceExhaustedError("no KV room to calibrate");
  std::vector<int32_t> sizes;
  for (int32_t x = 1; x < max_tokens; x *= 2) sizes.push_back(x);
  sizes.push_back(max_tokens);
  const std::vector<int32_t> ids = ProbeTokens(max_tokens, vocab);
  std::vector<float> logits(static_cast<size_t>(std::min(max_tokens, max_rows)) * vocab);
  if (absl::Status st = runner.AddSequence(probe); !st.ok()) return st;
  std::vector<std::pair<double, double>> points;
  engine::ForwardBatch batch;
  absl::Status st;
  for (size_t si = 0; si <= sizes.size() && st.ok(); ++si) {
    const bool warmup = si == 0;
    const int32_t x = warmup ? 1 : sizes[si - 1];
    batch.Clear();
    batch.AddPrompt(probe, 0, ids.data(), x);
    const int32_t rows = std::min(x, max_rows);
    for (int32_t r = x - rows; r < x; ++r) batch.logit_rows.push_back(r);
    double best = 1e30;
    for (int rep = 0; rep < (x <= 8 ? 5 : 2) && st.ok(); ++rep) {
      const auto t0 = Clock::now();
      st = runner.Forward(batch, logits.data(), nullptr);
      best = std::min(best, Since(t0));
    }
    if (st.ok() && !warmup) points.push_back({double(x), best});
  }
  runner.FreeSequence(probe);
  if (!st.ok()) return st;
  return CostCurve(std::move(points));
}

void AddProbeFeatures(Drafter& drafter, SeqId seq, size_t num_tokens) {
  if (!drafter.wants_features() || num_tokens < 2) return;
  const std::vector<float> zeros((num_tokens - 1) * drafter.feature_dim(), 0.0f);
  drafter.AddFeatures(seq, 0, zeros);
}

absl::StatusOr<CostCurve> CalibrateDraft(Drafter& drafter, int32_t vocab, int32_t max_sequences) {
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  const sampling::PenaltyState none;
  const sampling::CounterRng rng(0);
  const std::vector<int32_t> prompt = ProbeTokens(8, vocab);
  std::vector<std::pair<double, double>> points;
  for (int32_t b : {1, 4, 16}) {
    const int32_t B = std::max(1, std::min(b, max_sequences));
    std::vector<DraftInput> in(B);
    std::vector<DraftOutput> out(B);
    for (int32_t i = 0; i < B; ++i) in[i] = DraftInput{-1 - i, prompt, &greedy, &none, &rng, 1};
    for (int32_t i = 0; i < B; ++i) AddProbeFeatures(drafter, -1 - i, prompt.size());
    // Rep 0 prefills; then best of several. A draft cost measured too high would keep k at 0,
    // and then no draft step ever corrects it. A Propose of k = 1 runs exactly one draft round
    // (the re-fed x_n gives d_1), however sure the draft is: a chain cut by the draft's
    // confidence (ModelDrafterOptions::min_extend) would stop a k = 2 probe after one round
    // and halve the measured cost.
    double best = 1e30;
    absl::Status st;
    for (int rep = 0; rep < (B == 1 ? 6 : 3) && st.ok(); ++rep) {
      const auto t0 = Clock::now();
      st = drafter.Propose(in, absl::MakeSpan(out));
      if (rep > 0) best = std::min(best, Since(t0));
    }
    for (int32_t i = 0; i < B; ++i) drafter.Release(-1 - i);
    if (!st.ok()) return st;
    if (points.empty() || points.back().first != B) points.push_back({double(B), best});
  }
  return CostCurve(std::move(points));
}

}  // namespace specd::spec
