#include "speculation/adaptive_k.h"

#include <algorithm>
#include <cmath>

namespace specd::spec {

CostCurve::CostCurve(std::vector<std::pair<double, double>> points) : points_(std::move(points)) {
  std::sort(points_.begin(), points_.end());
}

double CostCurve::Shape(double x, const StepContext& context) const {
  if (points_.empty()) return 0.0;
  const double at_depth = depth_.Seconds(context);
  const double saving = logits_.Saving(x, context.logit_rows);
  if (points_.size() == 1) {
    const double at_zero =
        points_[0].first > 0 ? points_[0].second * x / points_[0].first : points_[0].second;
    return at_depth + std::max(0.0, at_zero - saving);
  }
  // Segment [i, i+1] containing x; the first / last segment extrapolates.
  size_t i = 0;
  while (i + 2 < points_.size() && x > points_[i + 1].first) ++i;
  const auto& [x0, y0] = points_[i];
  const auto& [x1, y1] = points_[i + 1];
  const double slope = x1 > x0 ? (y1 - y0) / (x1 - x0) : 0.0;
  return at_depth + std::max(0.0, y0 + slope * (x - x0) - saving);
}

double CostCurve::Predict(double x, const StepContext& context) const {
  return scale_ * Shape(x, context);
}

void CostCurve::Observe(double x, double seconds, const StepContext& context) {
  ObserveTotal(Shape(x, context), seconds);
}

void CostCurve::ObserveTotal(double shape_seconds, double seconds) {
  if (!(shape_seconds > 0.0) || !(seconds > 0.0)) return;
  // EWMA in log space: robust to the occasional stall of a shared machine.
  const double ratio = std::clamp(seconds / shape_seconds, 0.05, 20.0);
  const double weight = idle_steps_ >= kFreshAfterIdle ? 1.0 : 0.1;
  idle_steps_ = 0;
  scale_ = std::exp((1.0 - weight) * std::log(scale_) + weight * std::log(ratio));
}

void CostCurve::Relax(double keep) {
  scale_ = std::exp(keep * std::log(scale_));
  ++idle_steps_;
}

void AcceptanceEstimate::Update(int32_t drafted, int32_t accepted) {
  if (drafted <= 0) return;
  const int32_t tried = accepted + (accepted < drafted ? 1 : 0);
  accepted_ = decay_ * accepted_ + accepted;
  tried_ = decay_ * tried_ + tried;
  pinned_accepted_ = kPinnedDecay * pinned_accepted_ + accepted;
  pinned_tried_ = kPinnedDecay * pinned_tried_ + tried;
}

double ExpectedTokens(double alpha, int32_t k) {
  double e = 0.0, a = 1.0;
  for (int32_t j = 0; j <= k; ++j) {
    e += a;
    a *= alpha;
  }
  return e;
}

namespace {

// contexts[i]: sequence i's KV positions before the step (KCandidate::context).
double StepCost(absl::Span<const int32_t> contexts, absl::Span<const int32_t> k,
                int32_t prefill_tokens, const CostCurve& verify, const CostCurve& draft) {
  int32_t tokens = prefill_tokens, max_k = 0;
  StepContext context;
  for (size_t i = 0; i < k.size(); ++i) {
    tokens += 1 + k[i];
    max_k = std::max(max_k, k[i]);
    context.Add(contexts[i], 1 + k[i]);
  }
  // Charge the decode rows only what they add to the step: prompt chunks riding along are
  // paid for anyway, and once they make the step compute-bound every draft token costs its
  // full share.
  double cost = verify.Predict(tokens, context);
  if (prefill_tokens > 0) cost -= verify.Predict(prefill_tokens);
  if (!draft.empty() && max_k > 0) cost += DraftRoundsCost(draft, k, contexts);
  return cost;
}

}  // namespace

double DraftRoundsCost(const CostCurve& draft, absl::Span<const int32_t> k,
                       absl::Span<const int32_t> context, bool shape_only) {
  double seconds = 0.0;
  const int32_t max_k = k.empty() ? 0 : *std::max_element(k.begin(), k.end());
  for (int32_t j = 1; j <= max_k; ++j) {
    int32_t n = 0;
    StepContext round;  // the round's rows: one per drafting sequence
    for (size_t i = 0; i < k.size(); ++i) {
      if (k[i] < j) continue;
      ++n;
      if (!context.empty()) round.Add(context[i], 1);
    }
    seconds += shape_only ? draft.Shape(n, round) : draft.Predict(n, round);
  }
  return seconds;
}

std::vector<int32_t> ChooseK(absl::Span<const KCandidate> seqs, int32_t prefill_tokens,
                             int32_t max_k, const CostCurve& verify, const CostCurve& draft) {
  const size_t B = seqs.size();
  std::vector<int32_t> best(B, 0);
  if (B == 0 || max_k <= 0 || verify.empty()) return best;
  // The search below asks for alpha_i^k and ExpectedTokens(alpha_i, k) thousands of times at
  // batch 16: both once per (i, k <= max_k) here, the same values (a router at concurrency 16
  // spent a tenth of its CPU in pow()).
  const size_t J = static_cast<size_t>(max_k) + 1;
  std::vector<double> gain_of(B * J), expected_of(B * J);  // [B][max_k + 1]
  std::vector<int32_t> contexts(B);
  for (size_t i = 0; i < B; ++i) contexts[i] = seqs[i].context;
  for (size_t i = 0; i < B; ++i) {
    for (size_t j = 0; j < J; ++j) {
      gain_of[i * J + j] = std::pow(seqs[i].alpha, static_cast<int32_t>(j));
      expected_of[i * J + j] = ExpectedTokens(seqs[i].alpha, static_cast<int32_t>(j));
    }
  }
  auto rate = [&](const std::vector<int32_t>& k) {
    double e = 0.0;
    for (size_t i = 0; i < B; ++i) e += expected_of[i * J + k[i]];
    const double c = StepCost(contexts, k, prefill_tokens, verify, draft);
    return c > 0.0 ? e / c : 0.0;
  };
  double best_rate = rate(best);
  // For each ceiling K on the draft length: start with every sequence drafting min(K, cap),
  // then drop drafts with the smallest marginal expected token (alpha^k) while that raises
  // tokens per second. Pruning from the top (rather than growing from 0) keeps the draft
  // steps' fixed cost, which later tokens amortise, from stopping the search at k = 0.
  for (int32_t K = 1; K <= max_k; ++K) {
    std::vector<int32_t> k(B, 0);
    for (size_t i = 0; i < B; ++i) k[i] = std::max(0, std::min(K, seqs[i].cap));
    double cur = rate(k);
    // Walk back: drop trailing drafts that do not pay, from the lowest marginal gain.
    for (;;) {
      int32_t pick = -1;
      double gain = 2.0;
      for (size_t i = 0; i < B; ++i) {
        if (k[i] == 0) continue;
        const double g = gain_of[i * J + k[i]];
        if (g < gain) {
          gain = g;
          pick = static_cast<int32_t>(i);
        }
      }
      if (pick < 0) break;
      --k[pick];
      const double r = rate(k);
      if (r > cur) {
        cur = r;
      } else {
        ++k[pick];
        break;
      }
    }
    cur = rate(k);
    if (cur > best_rate * (1.0 + 1e-9)) {
      best_rate = cur;
      best = k;
    }
  }
  return best;
}

SpeedupEstimate EstimateSpeedup(double alpha, int32_t batch, int32_t max_k, const CostCurve& verify,
                                const CostCurve& draft, int32_t context) {
  SpeedupEstimate e;
  if (batch < 1 || verify.empty()) return e;
  const std::vector<KCandidate> seqs(static_cast<size_t>(batch), KCandidate{alpha, max_k, context});
  const std::vector<int32_t> k = ChooseK(seqs, 0, max_k, verify, draft);
  double tokens = 0.0, rows = 0.0;
  StepContext with_drafts, plain_context;
  for (int32_t ki : k) {
    tokens += ExpectedTokens(alpha, ki);
    rows += 1 + ki;
    with_drafts.Add(context, 1 + ki);
    plain_context.Add(context, 1);
  }
  e.mean_k = (rows - batch) / batch;
  e.tokens_per_step = tokens / batch;
  const std::vector<int32_t> contexts(static_cast<size_t>(batch), context);
  e.step_seconds = verify.Predict(rows, with_drafts) +
                   (draft.empty() ? 0.0 : DraftRoundsCost(draft, k, contexts));
  const double plain = batch / verify.Predict(batch, plain_context);
  e.speedup = e.step_seconds > 0.0 && plain > 0.0 ? tokens / e.step_seconds / plain : 0.0;
  return e;
}

}  // namespace specd::spec
