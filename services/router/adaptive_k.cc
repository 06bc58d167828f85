#include "services/router/adaptive_k.h"

#include <algorithm>
#include <cmath>

namespace specd::router {

int32_t ChooseK(double a, int32_t running, const AdaptiveKConfig& c) {
  a = std::clamp(a, 0.0, 0.999);
  int32_t best_k = 0;
  double best = 1.0;  // k = 0: one token per unit cost
  for (int32_t k = 1; k <= c.max_k; ++k) {
    const double tokens = (1.0 - std::pow(a, k + 1)) / (1.0 - a);
    const double cost = 1.0 + c.draft_cost * k + c.verify_cost * std::max(0, running - 1) * k;
    if (tokens / cost > best * 1.0001) {
      best = tokens / cost;
      best_k = k;
    }
  }
  return best_k;
}

int32_t AdaptiveK::Want(int32_t running) const {
  const int32_t k = ChooseK(acceptance_, running, config_);
  // Without drafting there is no new evidence: probe now and then.
  if (k == 0 && idle_steps_ >= config_.probe_every) return 1;
  return k;
}

void AdaptiveK::Observe(int32_t drafted, int32_t accepted) {
  if (drafted <= 0) {
    ++idle_steps_;
    return;
  }
  idle_steps_ = 0;
  // Per-token acceptance estimate from this step: accepted of drafted positions tried; a
  // rejection ends the run, so positions after it are not evidence.
  const int32_t tried = std::min(drafted, accepted + 1);
  const double step = static_cast<double>(accepted) / tried;
  acceptance_ = (1.0 - config_.ema) * acceptance_ + config_.ema * step;
}

}  // namespace specd::router
