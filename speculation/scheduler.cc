#include "speculation/scheduler.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

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

namespace {

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

// One iteration's schedule, built by ScheduleIteration's steps in order. Each step reads what
// the ones before it decided: the running set after preemption, each sequence's k, the token
// budget and the logit rows left.
class IterationPlan {
 public:
  IterationPlan(const SchedulerState& state, const SchedulerConfig& config)
      : state_(state),
        config_(config),
        running_(state.running),
        target_capacity_(static_cast<int64_t>(config.target_blocks) - config.target_adopted_blocks),
        budget_(config.max_batch_tokens),
        max_rows_(config.max_logit_rows > 0 ? config.max_logit_rows : INT32_MAX),
        rows_(max_rows_) {
    for (const SeqView& s : running_) {
      k_.push_back(Decoding(s, config) || config.drafts_with_prompt ? std::max(0, s.want_k) : 0);
    }
  }

  // Target KV: drop drafts, then preempt the youngest, until the running set fits.
  void FitTargetKv() {
    if (TargetUsed() > target_capacity_) {
      for (size_t i = 0; i < running_.size(); ++i) {
        if (!running_[i].pinned_k) k_[i] = 0;
      }
    }
    while (running_.size() > 1 && TargetUsed() > target_capacity_) PreemptYoungest();
    if (!running_.empty() && TargetUsed() > target_capacity_) {
      k_[0] = 0;  // alone and still too big with drafts
      if (TargetUsed() > target_capacity_) PreemptYoungest();
    }
  }

  // Draft KV: only drafts are at stake. A pinned row whose drafts fit once others finish sits
  // the iteration out instead.
  void FitDraftKv() {
    sit_out_.assign(running_.size(), false);
    if (config_.draft_blocks <= 0) {
      for (size_t i = 0; i < running_.size(); ++i) {
        if (!running_[i].local_drafts) k_[i] = 0;
      }
      return;
    }
    int64_t used = 0;
    for (size_t i = 0; i < running_.size(); ++i) {
      if (k_[i] == 0 || running_[i].local_drafts) continue;
      const int32_t b = BlocksFor(running_[i].committed + k_[i], config_.block_size);
      if (used + b <= config_.draft_blocks) {
        used += b;
      } else if (running_[i].pinned_k && b <= config_.draft_blocks) {
        sit_out_[i] = true;
      } else {
        k_[i] = 0;
      }
    }
  }

  // Decode rows first (oldest first), shrinking k to fit the budget and the logit rows.
  void PlanDecodeRows() {
    planned_.assign(running_.size(), false);
    for (size_t i = 0; i < running_.size() && budget_ > 0 && rows_ > 0; ++i) {
      const SeqView& s = running_[i];
      if (!Decoding(s, config_) || sit_out_[i]) continue;
      if (s.pinned_k && ((k_[i] + 1 > budget_ && budget_ < config_.max_batch_tokens) ||
                         (k_[i] + 1 > rows_ && rows_ < max_rows_))) {
        continue;
      }
      const int32_t kk = std::min({k_[i], budget_ - 1, rows_ - 1});
      out_.plans.push_back({s.id, s.target_pos, s.committed, true, kk});
      budget_ -= 1 + kk;
      rows_ -= 1 + kk;
      planned_[i] = true;
    }
  }

  // Prompt chunks of running sequences (oldest first). Decoding sequences wait for this
  // step's prompt chunks: those are bounded in tokens and in time.
  void PlanRunningPrompts() {
    if (config_.prefill_tokens_while_decoding > 0 && !out_.plans.empty()) {
      budget_ = std::min(budget_, config_.prefill_tokens_while_decoding);
    }
    step_time_.emplace(config_, out_.plans);
    for (size_t i = 0; i < running_.size() && budget_ > 0; ++i) {
      const SeqView& s = running_[i];
      if (planned_[i] || s.committed <= s.target_pos || Decoding(s, config_)) continue;
      Chunk(s, k_[i], sit_out_[i]);
    }
  }

  // Admission, strictly FCFS. A preempted sequence waits at least one iteration (it heads the
  // queue next time), so this iteration's preemptions do not bounce straight back.
  void Admit() {
    if (!out_.preempt.empty()) return;
    int64_t target_free = target_capacity_ - TargetUsed();
    int64_t draft_free = DraftFree();
    size_t n_running = running_.size();
    int32_t evictable_left = config_.target_evictable_blocks;
    for (const SeqView& s : state_.waiting) {
      if (budget_ <= 0 || n_running >= static_cast<size_t>(config_.max_running)) break;
      int32_t ki = config_.drafts_with_prompt ? std::max(0, s.want_k) : 0;
      const int32_t from_evictable = std::min(s.cached_blocks, evictable_left);
      const int32_t need = BlocksFor(s.committed + std::max(1, ki), config_.block_size) -
                           s.cached_blocks + from_evictable;
      if (need > target_free) break;
      evictable_left -= from_evictable;
      // The draft's room only decides whether this sequence drafts, never whether it runs.
      bool hold = false;
      const int32_t draft_need =  // its own cache
          BlocksFor(s.committed + std::max(1, ki), config_.block_size);
      if (config_.draft_blocks > 0 && draft_need <= draft_free) {
        draft_free -= draft_need;
      } else if (ki > 0 && !s.local_drafts) {
        hold = s.pinned_k && config_.draft_blocks > 0;
        ki = 0;
      }
      target_free -= need;
      out_.admit.push_back(s.id);
      ++n_running;
      Chunk(s, ki, hold);
    }
  }

  Schedule Take() { return std::move(out_); }

 private:
  int32_t TargetBlocks(size_t i) const {
    return BlocksFor(running_[i].committed + k_[i], config_.block_size) - running_[i].cached_blocks;
  }
  int64_t TargetUsed() const {
    int64_t used = 0;
    for (size_t i = 0; i < running_.size(); ++i) used += TargetBlocks(i);
    return used;
  }
  // Draft blocks left after the running sequences' drafts.
  int64_t DraftFree() const {
    int64_t free = config_.draft_blocks;
    if (config_.draft_blocks <= 0) return free;
    for (size_t i = 0; i < running_.size(); ++i) {
      if (k_[i] > 0 && !running_[i].local_drafts) {
        free -= BlocksFor(running_[i].committed + k_[i], config_.block_size);
      }
    }
    return free;
  }
  void PreemptYoungest() {
    out_.preempt.push_back(running_.back().id);
    running_.pop_back();
    k_.pop_back();
  }

  // A prompt chunk [target_pos, end) within the budget; its last row emits (one logit row)
  // when it reaches the end of the committed tokens and a row is left. With
  // drafts_with_prompt that last chunk also verifies `ki` drafts (fewer for an unpinned
  // sequence short of budget); a pinned one whose drafts do not fit, or must wait (`hold`),
  // stops one short instead, so its first token still comes with its own k.
  void Chunk(const SeqView& s, int32_t ki, bool hold) {
    int32_t end = std::min(PrefillEnd(s), s.target_pos + budget_);
    end = s.target_pos + step_time_->ChunkTokens(s.target_pos, end - s.target_pos);
    int32_t kk = 0;
    if (end == s.committed && (ki > 0 || hold)) {
      const int32_t room = std::min(budget_ - (end - s.target_pos), rows_ - 1);
      if (!hold && (room >= ki || (!s.pinned_k && room > 0))) {
        kk = std::min(ki, room);
      } else if (s.pinned_k) {
        end = s.committed - 1;
      }
    }
    if (end == s.committed && rows_ < 1) --end;
    if (end <= s.target_pos) return;
    const bool emit = end == s.committed;
    out_.plans.push_back({s.id, s.target_pos, end, emit, kk});
    step_time_->Add(out_.plans.back());
    budget_ -= end - s.target_pos + kk;
    rows_ -= emit ? 1 + kk : 0;
  }

  const SchedulerState& state_;
  const SchedulerConfig& config_;
  Schedule out_;
  std::vector<SeqView> running_;  // after preemption
  std::vector<int32_t> k_;        // [running_]
  std::vector<bool> sit_out_;     // [running_]: pinned rows that wait this iteration
  std::vector<bool> planned_;     // [running_]: has a decode row
  const int64_t target_capacity_;
  int32_t budget_;  // tokens left in the step
  const int32_t max_rows_;
  int32_t rows_;                     // logit rows left
  std::optional<StepTime> step_time_;  // from the decode rows on
};

}  // namespace

Schedule ScheduleIteration(const SchedulerState& state, const SchedulerConfig& config) {
  IterationPlan plan(state, config);
  plan.FitTargetKv();
  plan.FitDraftKv();
  plan.PlanDecodeRows();
  plan.PlanRunningPrompts();
  plan.Admit();
  return plan.Take();
}

}  // namespace specd::spec
