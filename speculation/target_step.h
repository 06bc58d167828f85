// One target step as the speculation loop (spec_loop.h) hands it to whatever runs the target: a
// model in this process (verify_step.h LocalTarget, and the target service, which runs the
// same code behind gRPC) or the target service seen from the router (services/router
// remote_backends.h). Model-free: the router links it.
#ifndef SPECD_SPECULATION_TARGET_STEP_H_
#define SPECD_SPECULATION_TARGET_STEP_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/sampling/draft_proposal.h"
#include "common/sampling/penalty_state.h"
#include "common/sampling/sampling_params.h"
#include "common/sampling/speculative_verifier.h"
#include "speculation/drafter.h"

namespace specd::spec {

// One sequence's work in a target step: its committed tokens [start, start + tokens.size()),
// and with `emit` (tokens end at x_n) the verification of `proposals` d_1..d_k.
struct TargetCall {
  SeqId seq = 0;
  int32_t start = 0;
  absl::Span<const int32_t> tokens;
  bool emit = false;
  absl::Span<const sampling::SparseProposal> proposals;
  const sampling::SamplingParams* params = nullptr;
  // Penalty history of x_1..x_n (only with emit); runners that keep their own history (the
  // target service) rebuild it from `num_prompt`.
  const sampling::PenaltyState* history = nullptr;
  int32_t num_prompt = 0;  // prompt tokens among x_1..x_n
  // Prefix caching: x_1..x_start, which the runner takes from its prefix cache (the sequence
  // starts over holding them) rather than holding them already. Empty: it holds them.
  absl::Span<const int32_t> cached_prefix;
  // The sequence's drafter is feature-conditioned: return the final hidden state of every row
  // the target keeps (TargetOutcome::features).
  bool want_features = false;
};

// What came of one TargetCall.
struct TargetOutcome {
  // The runner no longer holds the tokens before `start` (a restart, a release): nothing ran;
  // the loop recomputes the sequence from its history.
  bool needs_prefill = false;
  sampling::VerifyResult verified;  // with emit: the emitted tokens (accepted drafts + one)
  // With want_features: the target's final hidden state (before output_norm) at positions
  // start, start + 1, ... of every row it kept (the call's tokens, then the accepted drafts):
  // [rows, embedding_dim].
  std::vector<float> features;
};

// A sequence about to be (re)prefilled, looked up in the target's prefix cache: `tokens` are
// its committed tokens up to where its prefill ends.
struct PrefixLookup {
  SeqId seq = 0;
  absl::Span<const int32_t> tokens;
};

// Runs target steps. Not thread-safe: the loop calls it from one thread.
class TargetExecutor {
 public:
  virtual ~TargetExecutor() = default;
  // out: [calls.size()]. RESOURCE_EXHAUSTED before any KV is written when the step does not fit;
  // UNAVAILABLE when a remote target is down; INVALID_ARGUMENT / INTERNAL for a bad step.
  virtual absl::Status Run(absl::Span<const TargetCall> calls,
                           std::vector<TargetOutcome>& out) = 0;
  // Frees the sequences' KV (finished, cancelled, preempted).
  virtual void Release(absl::Span<const SeqId> seqs) = 0;
  // Prefix caching: how many leading tokens of each lookup's tokens the target's cache holds
  // now (a whole number of blocks, fewer than tokens.size()); nothing changes. cached:
  // [lookups.size()]. Without a cache: all 0.
  virtual absl::Status LookupPrefixes(absl::Span<const PrefixLookup> lookups,
                                     std::vector<int32_t>& cached) {
    cached.assign(lookups.size(), 0);
    return absl::OkStatus();
  }
  // The target's prefix cache as last reported: distinct blocks its sequences share from it
  // (the scheduler takes them from the capacity once instead of charging every sequence) and
  // cached blocks no sequence uses (counted as free: a prefix found among them costs memory).
  virtual int32_t adopted_blocks() const { return 0; }
  virtual int32_t evictable_blocks() const { return 0; }
};

}  // namespace specd::spec

#endif  // SPECD_SPECULATION_TARGET_STEP_H_
