#include "speculation/scheduler.h"

#include <algorithm>
#include <cstdint>

namespace specd::spec {

int32_t BlocksFor(int64_t tokens, int32_t block_size) {
  return static_cast<int32_t>((tokens + block_size - 1) / block_size);
}

// Where a sequence's prefill stops: its last committed token, whose logits row emits; or, for
// a pinned sequence re-prefilled after a preemption, one short (the next row decodes).
static int32_t PrefillEnd(const SeqView& s) {
  return s.pinned_k && s.has_output ? s.committed - 1 : s.committed;
}

// A decode row: one token left to compute after a token came out (or any last row, when
// prompts verify drafts). A prompt's first token always comes from a prompt chunk's row,
// wherever the prompt was cut (by the budget or by a cached prefix), so a pinned k schedule
// depends on neither.
static bool Decoding(const SeqView& s, const SchedulerConfig& config) {
  return s.committed - s.target_pos == 1 && (s.has_output || config.drafts_with_prompt);
}

// The step's predicted seconds while prompt chunks join decode rows, and the chunk that keeps
// them within config.step_seconds_while_decoding. Inactive (chunks unbounded in time) without
// that bound, a cost curve, or decode rows in the step.
class StepTime {
 public:
  StepTime(const SchedulerConfig& config, const std::vector<SeqPlan>& decode_rows)
      : config_(config),
        active_(config.step_seconds_while_decoding > 0 && config.step_cost != nullptr &&
                !config.step_cost->empty() && !decode_rows.empty()) {
    for (const SeqPlan& p : decode_rows) Add(p);
  }

  // The rows a target step gets for `p`.
  void Add(const SeqPlan& p) {
    tokens_ += p.tokens();
    p.AddTo(context_);
  }

  // Of a chunk of at most n_max prompt tokens from position `start`: how many fit in time
  // (the seconds grow with the tokens), and at least one block.
  int32_t ChunkTokens(int32_t start, int32_t n_max) const {
    if (!active_ || Fits(start, n_max)) return n_max;
    int32_t lo = std::min(n_max, config_.block_size);  // taken even when it does not fit
    int32_t hi = n_max;                                // does not fit
    while (hi - lo > 1) {
      const int32_t mid = lo + (hi - lo) / 2;
      if (Fits(start, mid)) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    return lo;
  }

 private:
  bool Fits(int32_t start, int32_t n) const {
    StepContext c = context_;
    c.Add(start, n);
    c.AddLogitRows(1);  // the chunk's last row, if it ends the prompt (priced either way)
    return config_.step_cost->Predict(static_cast<double>(tokens_ + n), c) <=
           config_.step_seconds_while_decoding;
  }

  const SchedulerConfig& config_;
  const bool active_;
  int64_t tokens_ = 0;
  StepContext context_;
};

Schedule ScheduleIteration(const SchedulerState& state, const SchedulerConfig& config) {
  Schedule out;
  const int32_t bs = config.block_size;
  std::vector<SeqView> running = state.running;
  std::vector<int32_t> k(running.size(), 0);
  for (size_t i = 0; i < running.size(); ++i) {
    k[i] = Decoding(running[i], config) || config.drafts_with_prompt
               ? std::max(0, running[i].want_k)
               : 0;
  }
  auto target_blocks = [&](size_t i) {
    return BlocksFor(running[i].committed + k[i], bs) - running[i].cached_blocks;
  };
  const int64_t target_capacity =
      static_cast<int64_t>(config.target_blocks) - config.target_adopted_blocks;

  // Target KV: drop drafts, then preempt the youngest, until the running set fits.
  auto target_used = [&]() {
    int64_t used = 0;
    for (size_t i = 0; i < running.size(); ++i) used += target_blocks(i);
    return used;
  };
  if (target_used() > target_capacity) {
    for (size_t i = 0; i < running.size(); ++i) {
      if (!running[i].pinned_k) k[i] = 0;
    }
  }
  while (running.size() > 1 && target_used() > target_capacity) {
    out.preempt.push_back(running.back().id);
    running.pop_back();
    k.pop_back();
  }
  if (!running.empty() && target_used() > target_capacity) {
    k[0] = 0;  // alone and still too big with drafts
    if (target_used() > target_capacity) {
      out.preempt.push_back(running.back().id);
      running.pop_back();
      k.pop_back();
    }
  }
  std::vector<bool> sit_out(running.size(), false);  // pinned rows that wait this iteration
  // Draft KV: only drafts are at stake.
  if (config.draft_blocks > 0) {
    int64_t used = 0;
    for (size_t i = 0; i < running.size(); ++i) {
      if (k[i] == 0 || running[i].local_drafts) continue;
      const int32_t b = BlocksFor(running[i].committed + k[i], bs);
      if (used + b <= config.draft_blocks) {
        used += b;
      } else if (running[i].pinned_k && b <= config.draft_blocks) {
        sit_out[i] = true;  // fits once others finish
      } else {
        k[i] = 0;
      }
    }
  } else {
    for (size_t i = 0; i < running.size(); ++i) {
      if (!running[i].local_drafts) k[i] = 0;
    }
  }

  // Decode rows first (oldest first), shrinking k to fit the budget and the logit rows.
  int32_t budget = config.max_batch_tokens;
  const int32_t max_rows = config.max_logit_rows > 0 ? config.max_logit_rows : INT32_MAX;
  int32_t rows = max_rows;
  std::vector<bool> planned(running.size(), false);
  for (size_t i = 0; i < running.size() && budget > 0 && rows > 0; ++i) {
    const SeqView& s = running[i];
    if (!Decoding(s, config) || sit_out[i]) continue;
    if (s.pinned_k && ((k[i] + 1 > budget && budget < config.max_batch_tokens) ||
                       (k[i] + 1 > rows && rows < max_rows))) {
      continue;
    }
    const int32_t kk = std::min({k[i], budget - 1, rows - 1});
    out.plans.push_back({s.id, s.target_pos, s.committed, true, kk});
    budget -= 1 + kk;
    rows -= 1 + kk;
    planned[i] = true;
  }
  // Decoding sequences wait for this step's prompt chunks: bound what those may take.
  if (config.prefill_tokens_while_decoding > 0 && !out.plans.empty()) {
    budget = std::min(budget, config.prefill_tokens_while_decoding);
  }
  StepTime step_time(config, out.plans);
  // A prompt chunk [target_pos, end) within the budget; its last row emits (one logit row)
  // when it reaches the end of the committed tokens and a row is left. With
  // drafts_with_prompt that last chunk also verifies `ki` drafts (fewer for an unpinned
  // sequence short of budget); a pinned one whose drafts do not fit, or must wait (`hold`),
  // stops one short instead, so its first token still comes with its own k.
  auto chunk = [&](const SeqView& s, int32_t ki, bool hold) {
    int32_t end = std::min(PrefillEnd(s), s.target_pos + budget);
    end = s.target_pos + step_time.ChunkTokens(s.target_pos, end - s.target_pos);
    int32_t kk = 0;
    if (end == s.committed && (ki > 0 || hold)) {
      const int32_t room = std::min(budget - (end - s.target_pos), rows - 1);
      if (!hold && (room >= ki || (!s.pinned_k && room > 0))) {
        kk = std::min(ki, room);
      } else if (s.pinned_k) {
        end = s.committed - 1;
      }
    }
    if (end == s.committed && rows < 1) --end;
    if (end <= s.target_pos) return;
    const bool emit = end == s.committed;
    out.plans.push_back({s.id, s.target_pos, end, emit, kk});
    step_time.Add(out.plans.back());
    budget -= end - s.target_pos + kk;
    rows -= emit ? 1 + kk : 0;
  };
  // Prompt chunks of running sequences (oldest first).
  for (size_t i = 0; i < running.size() && budget > 0; ++i) {
    const SeqView& s = running[i];
    if (planned[i] || s.committed <= s.target_pos || Decoding(s, config)) continue;
    chunk(s, k[i], sit_out[i]);
  }
  // Admission, strictly FCFS. A preempted sequence waits at least one iteration (it heads the
  // queue next time), so this iteration's preemptions do not bounce straight back.
  int64_t target_free = target_capacity - target_used();
  int64_t draft_free = config.draft_blocks;
  if (config.draft_blocks > 0) {
    for (size_t i = 0; i < running.size(); ++i) {
      if (k[i] > 0 && !running[i].local_drafts) {
        draft_free -= BlocksFor(running[i].committed + k[i], bs);
      }
    }
  }
  size_t n_running = running.size();
  int32_t evictable_left = config.target_evictable_blocks;
  if (out.preempt.empty()) {
    for (const SeqView& s : state.waiting) {
      if (budget <= 0 || n_running >= static_cast<size_t>(config.max_running)) break;
      int32_t ki = config.drafts_with_prompt ? std::max(0, s.want_k) : 0;
      const int32_t from_evictable = std::min(s.cached_blocks, evictable_left);
      const int32_t need =
          BlocksFor(s.committed + std::max(1, ki), bs) - s.cached_blocks + from_evictable;
      if (need > target_free) break;
      evictable_left -= from_evictable;
      // The draft's room only decides whether this sequence drafts, never whether it runs.
      bool hold = false;
      const int32_t draft_need = BlocksFor(s.committed + std::max(1, ki), bs);  // its own cache
      if (config.draft_blocks > 0 && draft_need <= draft_free) {
        draft_free -= draft_need;
      } else if (ki > 0 && !s.local_drafts) {
        hold = s.pinned_k && config.draft_blocks > 0;
        ki = 0;
      }
      target_free -= need;
      out.admit.push_back(s.id);
      ++n_running;
      chunk(s, ki, hold);
    }
  }
  return out;
}

}  // namespace specd::spec
