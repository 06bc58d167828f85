// The drafter interface of the speculative engine (docs/DESIGN.md §2 step 1): for a whole batch of
// sequences at once, propose up to k_i tokens each, every token with the sparse proposal
// distribution q it was drawn from.
//
// Drafters keep their own per-sequence state (a KV cache for model drafters). They are told the
// committed tokens each time, so they can catch up on what they never saw (the correction or
// bonus token, a re-prefilled sequence) and roll back what was rejected.
#ifndef SPECD_SPECULATION_DRAFTER_H_
#define SPECD_SPECULATION_DRAFTER_H_

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/sampling/draft_proposal.h"
#include "common/sampling/penalty_state.h"
#include "common/sampling/philox.h"
#include "common/sampling/sampling_params.h"

namespace specd::engine {
class PagedKvCache;
}  // namespace specd::engine

namespace specd::spec {

using SeqId = int64_t;  // = engine::SeqId; this layer does not depend on the engine

// One sequence's request to the drafter for this step.
struct DraftInput {
  SeqId seq = 0;
  absl::Span<const int32_t> tokens;                  // committed x_1..x_n (prompt + generated)
  const sampling::SamplingParams* params = nullptr;  // the request's transforms (draft mimics them)
  const sampling::PenaltyState* history = nullptr;   // penalty history of `tokens`
  const sampling::CounterRng* rng = nullptr;         // the request's counter RNG (kDraft stream)
  int32_t max_tokens = 0;                            // k_i: propose at most this many
  int32_t num_prompt = 0;                            // prompt tokens among `tokens`
};

// proposals[j] is d_{j+1} (at absolute position n + j) with its q. Fewer than max_tokens (even
// none) is allowed: the verifier then checks only what came.
struct DraftOutput {
  std::vector<sampling::SparseProposal> proposals;
};

// How many leading tokens a and b share: what a drafter that was fed `a` keeps of the committed
// tokens `b` when it rolls back (ModelDrafter, and the router's mirror of a draft service).
inline size_t CommonPrefix(absl::Span<const int32_t> a, absl::Span<const int32_t> b) {
  const size_t n = a.size() < b.size() ? a.size() : b.size();
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::string_view name() const = 0;

  // in: [B] distinct sequences; out: [B]. Sequences never seen are added (and prefilled) on the
  // fly. RESOURCE_EXHAUSTED when the drafter's own KV cache is full: then `out` is empty
  // and the drafter's state stays consistent (the caller may decode without drafts).
  virtual absl::Status Propose(absl::Span<const DraftInput> in, absl::Span<DraftOutput> out) = 0;

  // After verification: `committed` is the sequence now (x_1..x_n, accepted drafts,
  // correction/bonus). The drafter drops state past the longest prefix it agrees with (Propose
  // would do so too: Commit frees the KV early).
  virtual absl::Status Commit(SeqId seq, absl::Span<const int32_t> committed) = 0;

  // Forget a sequence (finished, cancelled or preempted); frees its KV at once.
  virtual void Release(SeqId seq) = 0;
  // Many at once (a remote drafter makes it one call).
  virtual void ReleaseMany(absl::Span<const SeqId> seqs) {
    for (SeqId s : seqs) Release(s);
  }

  // A feature-conditioned drafter (EAGLE style) drafts from the target's final hidden states:
  // the loop asks the target for them (TargetCall::want_features) and hands over every row the
  // target keeps. AddFeatures: `rows` [n, dim] are the target's hidden states at positions
  // first_pos .. first_pos + n - 1 of `seq` (re-sent positions overwrite). A sequence whose
  // features the drafter lacks simply gets no drafts.
  virtual bool wants_features() const { return false; }
  virtual int32_t feature_dim() const { return 0; }  // D of the rows AddFeatures takes
  virtual void AddFeatures(SeqId seq, int32_t first_pos, absl::Span<const float> rows) {}

  // Whether Propose would propose anything for `tokens` (committed x_1..x_n) that follows at
  // least their last `min_match` tokens, asked before the step is planned. Only a drafter that
  // proposes from the tokens alone can know it ahead (the n-gram lookup: a match of at least
  // `min_match` tokens); the rest answer true (a model drafter conditions on all of them).
  virtual bool HasProposal(absl::Span<const int32_t> tokens, int32_t min_match) const {
    return true;
  }

  // True when drafting costs a model forward per token (the adaptive-k cost model needs it).
  virtual bool runs_model() const = 0;
  // Bytes of weights one draft token reads (0: no model): the nominal cost of pinned k.
  virtual uint64_t weight_bytes() const { return 0; }

  // The drafter's KV cache and a sequence's cached length, for tests and metrics (null / -1 for
  // drafters without one).
  virtual const engine::PagedKvCache* kv_cache() const { return nullptr; }
  virtual int64_t CachedLength(SeqId seq) const { return -1; }
};

}  // namespace specd::spec

#endif  // SPECD_SPECULATION_DRAFTER_H_
