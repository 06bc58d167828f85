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

// CalibrateDepth at up to `depth_keys` positions on `probe` (the shallow sequence; it holds the
// curve's last forward, `chunk` tokens, and is truncated by the first shallow one) and
// `probe - 1` (added and freed here), within what the KV cache and the model's context allow;
// no depth cost where that is under kMinDepthCalibrationKeys.
absl::StatusOr<DepthCost> CalibrateDepthIfRoom(engine::ModelRunner& runner, int32_t depth_keys,
                                               int32_t chunk, engine::SeqId probe) {
  const engine::PagedKvCache& kv = runner.kv();
  const int64_t block = kv.config().block_size;
  const int64_t shallow_blocks = (kDepthCalibrationRows + block - 1) / block;
  const int64_t held_blocks = (int64_t{chunk} + block - 1) / block;
  const int64_t room = (int64_t{kv.num_free_blocks()} + held_blocks - shallow_blocks - 1) * block;
  const int64_t context = runner.model().config().context_length;
  const int64_t depth = std::min<int64_t>({int64_t{depth_keys}, room - kDepthCalibrationRows,
                                           context - kDepthCalibrationRows});
  if (depth < kMinDepthCalibrationKeys) return DepthCost{};
  if (absl::Status st = runner.AddSequence(probe - 1); !st.ok()) return st;
  absl::StatusOr<DepthCost> cost =
      CalibrateDepth(runner, static_cast<int32_t>(depth), chunk, probe, probe - 1);
  runner.FreeSequence(probe - 1);
  return cost;
}

}  // namespace

absl::StatusOr<DepthCost> CalibrateDepth(engine::ModelRunner& runner, int32_t depth,
                                         int32_t chunk, engine::SeqId shallow, engine::SeqId deep) {
  constexpr int32_t R = kDepthCalibrationRows;
  const int32_t vocab = runner.model().vocab_size();
  if (depth < 1 || chunk < 1) return absl::InvalidArgumentError("depth calibration: no depth");
  const std::vector<int32_t> ids = ProbeTokens(depth + R, vocab);
  std::vector<float> logits(static_cast<size_t>(R) * vocab);
  engine::ForwardBatch batch;
  // `rows` tokens of `seq` from `start`, logits for each: a verification's shape.
  const auto forward = [&](engine::SeqId seq, int32_t start, int32_t rows, double* best) {
    batch.Clear();
    batch.AddPrompt(seq, start, ids.data() + start, rows);
    for (int32_t r = std::max(0, rows - R); r < rows; ++r) batch.logit_rows.push_back(r);
    const auto t0 = Clock::now();
    absl::Status st = runner.Forward(batch, logits.data(), nullptr);
    if (best != nullptr) *best = std::min(*best, Since(t0));
    return st;
  };
  absl::Status st;
  for (int32_t at = 0; at < depth && st.ok(); at += chunk) {
    st = forward(deep, at, std::min(chunk, depth - at), nullptr);
  }
  // [0]: 1 row, [1]: R rows; shallow and deep. Round-robin with an untimed first pass, as for
  // the curve (a slow spell falls on every shape alike).
  constexpr int kTimedPasses = 5;
  double t_shallow[2] = {1e30, 1e30}, t_deep[2] = {1e30, 1e30};
  for (int pass = 0; pass <= kTimedPasses && st.ok(); ++pass) {
    for (int i = 0; i < 2 && st.ok(); ++i) {
      const int32_t rows = i == 0 ? 1 : R;
      st = forward(shallow, 0, rows, pass == 0 ? nullptr : &t_shallow[i]);
      if (st.ok()) st = forward(deep, depth, rows, pass == 0 ? nullptr : &t_deep[i]);
    }
  }
  if (!st.ok()) return st;
  // Below 0 is noise: context never makes a forward cheaper.
  const double e1 = std::max(0.0, t_deep[0] - t_shallow[0]);
  const double eR = std::max(0.0, t_deep[1] - t_shallow[1]);
  DepthCost d;
  d.per_row_key = std::max(0.0, (eR - e1) / (double{R - 1} * depth));
  d.per_key = std::max(0.0, e1 / depth - d.per_row_key);
  return d;
}

absl::StatusOr<CostCurve> CalibrateVerify(engine::ModelRunner& runner, int32_t max_tokens,
                                          int32_t max_rows, engine::SeqId probe,
                                          int32_t depth_keys) {
  const int32_t vocab = runner.model().vocab_size();
  const engine::PagedKvCache& kv = runner.kv();
  max_tokens = static_cast<int32_t>(std::min<int64_t>(
      {max_tokens, int64_t{kv.num_free_blocks()} * kv.config().block_size,
       runner.model().options().max_batch_tokens}));
  max_rows = std::max(1, std::min(max_rows, runner.model().options().max_logit_rows));
  if (max_tokens < 1) return absl::ResourceExhaustedError("no KV room to calibrate");
  // `rounds`: the sizes timed round-robin, best of kTimedPasses; `large`: the rest.
  std::vector<int32_t> rounds, large;
  for (int32_t x = 1; x <= std::min(max_tokens, kDenseCalibrationTokens); ++x) rounds.push_back(x);
  for (int32_t x = 16; x < max_tokens; x *= 2) (x <= kRoundRobinCalibrationTokens ? rounds : large).push_back(x);
  if (max_tokens > kDenseCalibrationTokens) {
    (max_tokens <= kRoundRobinCalibrationTokens ? rounds : large).push_back(max_tokens);
  }
  const std::vector<int32_t> ids = ProbeTokens(max_tokens, vocab);
  std::vector<float> logits(static_cast<size_t>(std::min(max_tokens, max_rows)) * vocab);
  if (absl::Status st = runner.AddSequence(probe); !st.ok()) return st;
  engine::ForwardBatch batch;
  // One forward of the probe's first x tokens, with the logits of its last `rows` rows; keeps
  // the least seconds in *best (nullptr: untimed).
  const auto forward = [&](int32_t x, int32_t rows, double* best) {
    batch.Clear();
    batch.AddPrompt(probe, 0, ids.data(), x);
    for (int32_t r = x - std::min(x, rows); r < x; ++r) batch.logit_rows.push_back(r);
    const auto t0 = Clock::now();
    absl::Status st = runner.Forward(batch, logits.data(), nullptr);
    if (best != nullptr) *best = std::min(*best, Since(t0));
    return st;
  };
  // The decode- and batch-sized forwards go round-robin: one untimed pass (a size's first
  // forward touches buffers and pages no later one does; right after a load it read verify(5)
  // 1.58x verify(1) where the next calibration read 1.39x), then kTimedPasses passes whose best
  // per size is kept, so a slow spell of a shared machine falls on every size alike and is
  // left out.
  constexpr int kTimedPasses = 5;
  std::vector<double> best(rounds.size() + large.size(), 1e30);
  // What logit rows cost (LogitCost): the largest round-robin size whose rows all compute
  // logits, timed again in the same passes with its last row's alone (a prompt chunk's shape).
  size_t logit_i = rounds.size();
  for (size_t i = 0; i < rounds.size(); ++i) {
    if (rounds[i] >= 2 && rounds[i] <= max_rows) logit_i = i;
  }
  double best_one_logit_row = 1e30;
  absl::Status st;
  for (int pass = 0; pass <= kTimedPasses && st.ok(); ++pass) {
    for (size_t i = 0; i < rounds.size() && st.ok(); ++i) {
      st = forward(rounds[i], max_rows, pass == 0 ? nullptr : &best[i]);
    }
    if (st.ok() && logit_i < rounds.size()) {
      st = forward(rounds[logit_i], 1, pass == 0 ? nullptr : &best_one_logit_row);
    }
  }
  // The prefill-sized ones: best of 2 each (one slow run is a small part of a long forward).
  for (size_t i = 0; i < large.size() && st.ok(); ++i) {
    for (int rep = 0; rep < 2 && st.ok(); ++rep) {
      st = forward(large[i], max_rows, &best[rounds.size() + i]);
    }
  }
  absl::StatusOr<DepthCost> depth = DepthCost{};
  if (st.ok()) depth = CalibrateDepthIfRoom(runner, depth_keys, max_tokens, probe);
  runner.FreeSequence(probe);
  if (!st.ok()) return st;
  if (!depth.ok()) return depth.status();
  std::vector<std::pair<double, double>> points;
  for (size_t i = 0; i < best.size(); ++i) {
    const double x = i < rounds.size() ? rounds[i] : large[i - rounds.size()];
    // Never below a smaller size's time: a larger forward does a superset of the work.
    points.push_back({x, points.empty() ? best[i] : std::max(best[i], points.back().second)});
  }
  CostCurve curve(std::move(points));
  curve.set_depth(*depth);
  if (logit_i < rounds.size()) {
    // Below 0 is noise: computing logits never makes a forward cheaper.
    const double per_row = std::max(0.0, (best[logit_i] - best_one_logit_row) /
                                             static_cast<double>(rounds[logit_i] - 1));
    curve.set_logits(LogitCost{per_row, max_rows});
  }
  return curve;
}

void AddProbeFeatures(Drafter& drafter, SeqId seq, size_t num_tokens) {
  if (!drafter.wants_features() || num_tokens < 2) return;
  const std::vector<float> zeros((num_tokens - 1) * drafter.feature_dim(), 0.0f);
  drafter.AddFeatures(seq, 0, zeros);
}

namespace {

// What the draft calibration's probe rounds sample with: greedy, no penalties, a fixed RNG.
struct GreedyProbe {
  GreedyProbe() { greedy.temperature = 0.0f; }
  GreedyProbe(const GreedyProbe&) = delete;  // its inputs point into it
  // A k = 1 round of `seq` on `tokens` (which must outlive the input).
  DraftInput Round(SeqId seq, absl::Span<const int32_t> tokens) const {
    return DraftInput{seq, tokens, &greedy, &none, &rng, 1};
  }
  sampling::SamplingParams greedy;
  const sampling::PenaltyState none;
  const sampling::CounterRng rng{0};
};

// CalibrateDraft's depth term (see calibration.h).
absl::StatusOr<DepthCost> CalibrateDraftDepth(Drafter& drafter, int32_t vocab, int32_t depth) {
  const GreedyProbe probe;
  const std::vector<int32_t> shallow_prompt = ProbeTokens(8, vocab);
  const std::vector<int32_t> deep_prompt = ProbeTokens(depth, vocab);
  constexpr SeqId kShallow = -1, kDeep = -2;
  std::vector<DraftInput> shallow{probe.Round(kShallow, shallow_prompt)};
  std::vector<DraftInput> deep{probe.Round(kDeep, deep_prompt)};
  AddProbeFeatures(drafter, kShallow, shallow_prompt.size());
  AddProbeFeatures(drafter, kDeep, deep_prompt.size());
  std::vector<DraftOutput> out(1);
  // Pass 0 prefills both (untimed); then one round each, alternating, best of 5.
  constexpr int kTimedPasses = 5;
  double t_shallow = 1e30, t_deep = 1e30;
  absl::Status st;
  for (int pass = 0; pass <= kTimedPasses && st.ok(); ++pass) {
    auto t0 = Clock::now();
    st = drafter.Propose(shallow, absl::MakeSpan(out));
    if (pass > 0) t_shallow = std::min(t_shallow, Since(t0));
    if (!st.ok()) break;
    t0 = Clock::now();
    st = drafter.Propose(deep, absl::MakeSpan(out));
    if (pass > 0) t_deep = std::min(t_deep, Since(t0));
  }
  drafter.Release(kShallow);
  drafter.Release(kDeep);
  // No room for the deep sequence: the curve stays depth-free (the drafter's KV is its own).
  if (absl::IsResourceExhausted(st)) return DepthCost{};
  if (!st.ok()) return st;
  return DepthCost{std::max(0.0, (t_deep - t_shallow) / depth), 0.0};
}

// CalibrateDraft's catch-up price (see calibration.h): a round of one sequence that feeds
// kCatchUpCalibrationRows committed tokens before its drafting row, against one that feeds
// that row alone, alternating, best of 5; seconds per extra row.
absl::StatusOr<double> CalibrateDraftCatchUp(Drafter& drafter, int32_t vocab) {
  const GreedyProbe probe;
  constexpr SeqId kSeq = -1;
  const std::vector<int32_t> held = ProbeTokens(8, vocab);
  // [0]: one unseen token (the drafting row alone); [1]: the catch-up.
  const std::vector<int32_t> fed[2] = {ProbeTokens(8 + 1, vocab),
                                       ProbeTokens(8 + kCatchUpCalibrationRows, vocab)};
  std::vector<DraftOutput> out(1);
  constexpr int kTimedPasses = 5;
  double best[2] = {1e30, 1e30};
  for (int pass = 0; pass <= kTimedPasses; ++pass) {
    for (int which = 0; which < 2; ++which) {
      AddProbeFeatures(drafter, kSeq, fed[which].size());
      // The drafter first holds `held` (untimed), then catches up on the rest of `fed`.
      const std::vector<DraftInput> first{probe.Round(kSeq, held)};
      const std::vector<DraftInput> then{probe.Round(kSeq, fed[which])};
      absl::Status st = drafter.Propose(first, absl::MakeSpan(out));
      const auto t0 = Clock::now();
      if (st.ok()) st = drafter.Propose(then, absl::MakeSpan(out));
      const double secs = Since(t0);
      drafter.Release(kSeq);
      // No room for 24 tokens: the curve stays without the price (the catch-up then takes the
      // target's shape), as a drafter without room for the depth probe stays without a depth.
      if (absl::IsResourceExhausted(st)) return 0.0;
      if (!st.ok()) return st;
      if (pass > 0) best[which] = std::min(best[which], secs);  // pass 0 warms both shapes
    }
  }
  return std::max(0.0, (best[1] - best[0]) / (kCatchUpCalibrationRows - 1));
}

}  // namespace

absl::StatusOr<CostCurve> CalibrateDraft(Drafter& drafter, int32_t vocab, int32_t max_sequences,
                                         int32_t depth_keys) {
  const GreedyProbe probe;
  const std::vector<int32_t> prompt = ProbeTokens(8, vocab);
  std::vector<std::pair<double, double>> points;
  for (int32_t b : {1, 4, 16}) {
    const int32_t B = std::max(1, std::min(b, max_sequences));
    std::vector<DraftInput> in(B);
    std::vector<DraftOutput> out(B);
    for (int32_t i = 0; i < B; ++i) in[i] = probe.Round(-1 - i, prompt);
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
  CostCurve curve(std::move(points));
  absl::StatusOr<double> catch_up = CalibrateDraftCatchUp(drafter, vocab);
  if (!catch_up.ok()) return catch_up.status();
  curve.set_catch_up_row(*catch_up);
  if (depth_keys >= kMinDepthCalibrationKeys) {
    absl::StatusOr<DepthCost> depth = CalibrateDraftDepth(drafter, vocab, depth_keys);
    if (!depth.ok()) return depth.status();
    curve.set_depth(*depth);
  }
  return curve;
}

}  // namespace specd::spec
