// Counters of the speculative engine: what it chose (k per step), what the drafts achieved
// (acceptance per draft position, mean accepted length) and where the time went.
#ifndef SPECD_SPECULATION_SPEC_STATS_H_
#define SPECD_SPECULATION_SPEC_STATS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace specd::spec {

struct SpecStats {
  int64_t steps = 0;          // Step() calls that ran a target forward
  int64_t target_tokens = 0;  // tokens through the target (prefill + verify rows)
  int64_t prefill_tokens = 0;
  int64_t seq_steps = 0;             // (sequence, step) pairs that verified and emitted
  int64_t emitted = 0;               // tokens emitted by those
  int64_t drafted = 0;               // draft tokens verified
  int64_t accepted = 0;              // of which accepted
  std::vector<int64_t> drafted_at;   // [max_k]: drafts verified at position i+1
  std::vector<int64_t> accepted_at;  // [max_k]: of which accepted
  std::vector<int64_t> k_chosen;     // [max_k+1]: how often each k was chosen for a sequence
  double draft_seconds = 0.0;        // inside Drafter::Propose
  double verify_seconds = 0.0;       // target forwards (verify rows + prefill chunks)
  double step_seconds = 0.0;         // whole Step() calls
  int64_t preemptions = 0;           // sequences sent back to the queue to free KV (recomputed)
  int64_t draft_failures = 0;        // steps run without drafts because the drafter failed
  std::vector<int32_t> last_k;       // k chosen per decoding sequence in the last step

  // Emitted tokens per (sequence, step): 1 + accepted drafts, the speculation gain.
  double MeanAcceptedLength() const { return seq_steps ? double(emitted) / seq_steps : 0.0; }
  double AcceptanceRate() const { return drafted ? double(accepted) / drafted : 0.0; }
  double MeanK() const;
  std::string ToString() const;  // one human-readable block
};

}  // namespace specd::spec

#endif  // SPECD_SPECULATION_SPEC_STATS_H_
