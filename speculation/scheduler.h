// THE iteration-level scheduler (continuous batching, Orca-style) of both the cluster's router
// and the in-process SpecEngine, as a pure function of state: the loop hands it what every
// request looks like now (with the k the policy wants, k_policy.h) and gets back what to do
// this iteration. No clocks, no I/O, so it is tested as timelines.
//
// Policy:
//  * FCFS: waiting requests are admitted strictly in order (the head blocks the rest), while
//    running < max_running, the token budget has room and both services have KV room for the
//    whole committed history (+1 token).
//  * Token budget per iteration (the target's max batch tokens): running decode rows first
//    ([last, d1..dk] = 1 + k tokens; k shrinks before a row is left out), then prompt chunks
//    (chunked prefill) of running and newly admitted sequences, mixed in the same step; with
//    decode rows in the step, prompt chunks get at most prefill_tokens_while_decoding of it,
//    and (step_seconds_while_decoding) at most what keeps the step's predicted seconds within
//    that bound, priced by the target's cost curve at each row's context.
//  * KV: a sequence is charged for committed + k tokens on the target (and on the draft when it
//    drafts), less the blocks it took from the target's prefix cache (those are shared: they
//    come out of the capacity once). A prefill starts at target_pos, past a cached prefix. Over target capacity, drafts are dropped first, then the most recently admitted
//    running sequence is preempted (recompute: released everywhere, back to the head of the
//    queue with its history, re-prefilled later). Over draft capacity, only drafts are dropped.
//  * Pinned k: a sampled request's realized tokens depend on its k schedule (the distribution
//    does not), so for the same seed to give the same text in any batch its k is never changed
//    by other requests: over budget or draft KV it sits the iteration out instead, and target
//    KV preempts rather than drop its drafts. Only a request that cannot fit with its drafts
//    even alone, or a draft service that is down, changes a pinned k. Re-prefilled after a
//    preemption, it stops one token short so its next token comes from a decode row with its
//    drafts, as it would have without the preemption.
#ifndef SPECD_SPECULATION_SCHEDULER_H_
#define SPECD_SPECULATION_SCHEDULER_H_

#include <cstdint>
#include <vector>

#include "speculation/adaptive_k.h"

namespace specd::spec {

struct SchedulerConfig {
  int32_t max_batch_tokens = 512;  // target tokens per iteration
  int32_t max_running = 64;
  int32_t max_queue = 256;         // waiting requests beyond this are refused at once
  int32_t block_size = 16;
  int32_t target_blocks = 1024;
  // Blocks the target's sequences share from its prefix cache: out of target_blocks once;
  // each sequence is charged only for the blocks beyond its cached ones (SeqView).
  int32_t target_adopted_blocks = 0;
  // Cached blocks no sequence uses (free, but holding prefixes): a waiting sequence's cached
  // blocks may be among them, so admission charges its cached blocks up to this many.
  int32_t target_evictable_blocks = 0;
  int32_t draft_blocks = 0;        // 0: no draft service
  int32_t max_logit_rows = 0;      // logit rows per iteration (0: as many as tokens)
  // A prompt's last chunk also verifies its drafts (want_k of a prefilling or waiting
  // sequence), so the first token can come with speculation — at the price of the draft's
  // prefill before the first token. Off (the router): the first token comes from the prefill
  // row alone, and drafting starts with the second.
  bool drafts_with_prompt = false;
  // Prompt tokens per iteration while the iteration also carries decode rows (0: the rest of
  // max_batch_tokens). A long prompt's chunk holds up every decoding sequence for that step,
  // so this bounds their inter-token latency, at the price of more steps (TTFT) for the prompt.
  int32_t prefill_tokens_while_decoding = 0;
  // The same bound in time (0: none): with decode rows in the step, prompt chunks are cut so
  // step_cost predicts the whole step within this many seconds. A chunk at depth costs more
  // than one near position 0, so it gets fewer tokens; a chunk gets at least one KV block
  // (block_size tokens), so a prompt advances even when the decode rows alone exceed it.
  double step_seconds_while_decoding = 0.0;
  // The target's step seconds by tokens and context (the policy's verify curve, load factor
  // included); no bound in time without one.
  const CostCurve* step_cost = nullptr;
};

// One request as the scheduler sees it.
struct SeqView {
  int64_t id = 0;
  int32_t committed = 0;   // prompt + generated tokens
  int32_t target_pos = 0;  // committed tokens whose KV the target holds
  int32_t want_k = 0;      // drafts wanted this step (0 = none); only for decode rows
  bool local_drafts = false;  // drafts come from the router itself (n-gram): no draft KV
  bool pinned_k = false;      // want_k must not be reduced for load (see Pinned k above)
  bool has_output = false;    // generated at least one token (a re-prefill after preemption)
  int32_t cached_blocks = 0;  // leading target blocks taken from its prefix cache (shared)
};

struct SchedulerState {
  std::vector<SeqView> running;  // admission order (oldest first)
  std::vector<SeqView> waiting;  // FCFS order
};

// Target work for one sequence: tokens [start, end) of its committed history, and with `emit`
// (end == committed) the verification of k drafts.
struct SeqPlan {
  int64_t id = 0;
  int32_t start = 0;
  int32_t end = 0;
  bool emit = false;
  int32_t k = 0;
  int32_t tokens() const { return end - start + k; }
  // What the plan adds to its step's price: its rows over the positions before them, and its
  // logit rows (1 + k when it emits, else none). The loop's Target observes steps so and the
  // scheduler's time bound predicts them so.
  void AddTo(StepContext& context) const {
    context.Add(start, tokens());
    context.AddLogitRows(emit ? 1 + k : 0);
  }
};

struct Schedule {
  std::vector<int64_t> preempt;  // running -> head of waiting (in this order), KV released
  std::vector<int64_t> admit;    // waiting -> running (in this order)
  std::vector<SeqPlan> plans;    // this iteration's target step
};

int32_t BlocksFor(int64_t tokens, int32_t block_size);

Schedule ScheduleIteration(const SchedulerState& state, const SchedulerConfig& config);

// Whether a new request may join a queue of `waiting` requests.
inline bool CanEnqueue(int64_t waiting, const SchedulerConfig& config) {
  return waiting < config.max_queue;
}

}  // namespace specd::spec

#endif  // SPECD_SPECULATION_SCHEDULER_H_
