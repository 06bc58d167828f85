// Per-sequence, per-step choice of the number of draft tokens k: from the sequence's recent
// acceptance and from batch load (speculation pays while the target is memory-bound; with
// many running sequences each extra verified token costs real compute, so k shrinks to 0).
#ifndef SPECD_SERVICES_ROUTER_ADAPTIVE_K_H_
#define SPECD_SERVICES_ROUTER_ADAPTIVE_K_H_

#include <cstdint>

namespace specd::router {

struct AdaptiveKConfig {
  int32_t max_k = 8;
  double draft_cost = 0.08;    // one draft token, relative to one target step
  double verify_cost = 0.01;   // one extra verified token per running sequence
  double prior = 0.6;          // acceptance assumed before any evidence
  double ema = 0.3;            // weight of the newest step
  int32_t probe_every = 16;    // steps at k = 0 before probing with k = 1 again
};

// Expected tokens per target step with k drafts at per-token acceptance a:
// (1 - a^(k+1)) / (1 - a). Returns the k in [0, max_k] maximizing it per unit cost
// 1 + draft_cost * k + verify_cost * running * k.
int32_t ChooseK(double acceptance, int32_t running, const AdaptiveKConfig& config);

// Per-request state. Want() is a pure function of what Observe() saw, so a request's k
// schedule depends only on its own steps (a pinned request passes running = 1).
class AdaptiveK {
 public:
  explicit AdaptiveK(const AdaptiveKConfig& config = {})
      : config_(config), acceptance_(config.prior) {}
  int32_t Want(int32_t running) const;
  // After every step that emitted tokens: `drafted` tokens verified (0 for a step without
  // drafts), `accepted` of them accepted.
  void Observe(int32_t drafted, int32_t accepted);
  double acceptance() const { return acceptance_; }

 private:
  AdaptiveKConfig config_;
  double acceptance_;
  int32_t idle_steps_ = 0;  // emitting steps since the last one with drafts
};

}  // namespace specd::router

#endif  // SPECD_SERVICES_ROUTER_ADAPTIVE_K_H_
