// The router's scheduler as timelines: a small simulator applies each Schedule the way the
// router loop does (drafts always accepted) and checks the policy's promises every iteration.
#include <algorithm>
#include <map>
#include <vector>

#include "gtest/gtest.h"
#include "speculation/scheduler.h"

namespace specd::router {
namespace {

using namespace specd::spec;  // NOLINT: the scheduler's vocabulary

struct Sim {
  Sim() { config.draft_blocks = 1024; }
  SchedulerConfig config;
  SchedulerState state;
  std::map<int64_t, int32_t> goal;  // committed length at which a request finishes
  std::vector<int64_t> admitted_order, finished_order;
  int preemptions = 0;
  int iterations = 0;
  int pinned_rows = 0;  // decode rows of pinned sequences, each checked to keep its k

  void Submit(int64_t id, int32_t prompt, int32_t new_tokens, int32_t want_k = 0,
              bool pinned = false) {
    ASSERT_TRUE(CanEnqueue(state.waiting.size(), config));
    state.waiting.push_back({id, prompt, 0, want_k, false, pinned});
    goal[id] = prompt + new_tokens;
  }

  SeqView* Find(int64_t id) {
    for (SeqView& s : state.running) {
      if (s.id == id) return &s;
    }
    return nullptr;
  }

  Schedule Step() {
    ++iterations;
    Schedule s = ScheduleIteration(state, config);
    for (int64_t id : s.preempt) {
      auto it = std::find_if(state.running.begin(), state.running.end(),
                             [&](const SeqView& v) { return v.id == id; });
      EXPECT_NE(it, state.running.end());
      SeqView v = *it;
      v.target_pos = 0;
      v.cached_blocks = 0;
      state.running.erase(it);
      state.waiting.insert(state.waiting.begin(), v);
      ++preemptions;
    }
    for (int64_t id : s.admit) {
      EXPECT_FALSE(state.waiting.empty());
      EXPECT_EQ(state.waiting.front().id, id) << "admission must be FCFS";
      state.running.push_back(state.waiting.front());
      state.waiting.erase(state.waiting.begin());
      admitted_order.push_back(id);
    }
    // Promises of every iteration.
    int32_t tokens = 0;
    int64_t blocks = 0;
    for (const SeqPlan& p : s.plans) {
      tokens += p.tokens();
      EXPECT_NE(Find(p.id), nullptr) << "plan for a sequence that is not running";
    }
    EXPECT_LE(tokens, config.max_batch_tokens);
    if (config.prefill_tokens_while_decoding > 0) {  // prompt chunks beside decode rows
      int32_t prompt_tokens = 0;
      bool decode_rows = false;
      for (const SeqPlan& p : s.plans) {
        const SeqView* v = Find(p.id);
        const bool decode_row = p.emit && v != nullptr && p.start == v->committed - 1 && v->has_output;
        decode_rows |= decode_row;
        if (!decode_row) prompt_tokens += p.end - p.start;
      }
      if (decode_rows) {
        EXPECT_LE(prompt_tokens, config.prefill_tokens_while_decoding);
      }
    }
    EXPECT_LE(static_cast<int32_t>(state.running.size()), config.max_running);
    for (const SeqPlan& p : s.plans) {
      SeqView* v = Find(p.id);
      EXPECT_EQ(p.start, v->target_pos);
      blocks += BlocksFor(v->committed + p.k, config.block_size);
      if (p.emit && v->pinned_k && v->has_output && v->committed - v->target_pos == 1) {
        ++pinned_rows;
        EXPECT_EQ(p.k, v->want_k) << "pinned k changed for " << p.id << " at " << iterations;
      }
      if (p.emit) {
        v->committed += 1 + p.k;
        v->target_pos = v->committed - 1;
        v->has_output = true;
      } else {
        v->target_pos = p.end;
      }
    }
    EXPECT_LE(blocks, config.target_blocks + 1);  // +1: a row may grow into one new block
    for (auto it = state.running.begin(); it != state.running.end();) {
      if (it->committed >= goal[it->id]) {
        finished_order.push_back(it->id);
        it = state.running.erase(it);
      } else {
        ++it;
      }
    }
    return s;
  }

  void RunToEnd(int limit = 10000) {
    while ((!state.running.empty() || !state.waiting.empty()) && iterations < limit) Step();
    EXPECT_TRUE(state.running.empty() && state.waiting.empty()) << "starved after " << limit;
  }
};

TEST(SchedulerTest, AdmitsFcfsUpToMaxRunning) {
  Sim sim;
  sim.config.max_running = 2;
  for (int i = 1; i <= 4; ++i) sim.Submit(i, 10, 5);
  Schedule s = sim.Step();
  EXPECT_EQ(s.admit, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(sim.state.waiting.size(), 2u);
  sim.RunToEnd();
  EXPECT_EQ(sim.admitted_order, (std::vector<int64_t>{1, 2, 3, 4}));
}

TEST(SchedulerTest, BoundedQueueRefusesAtOnce) {
  SchedulerConfig c;
  c.max_queue = 3;
  EXPECT_TRUE(CanEnqueue(2, c));
  EXPECT_FALSE(CanEnqueue(3, c));
}

TEST(SchedulerTest, ChunkedPrefillMixesWithDecodeRows) {
  Sim sim;
  sim.config.max_batch_tokens = 16;
  sim.Submit(1, 4, 50, /*want_k=*/3);
  sim.Step();  // prefill of 1 (4 tokens) in one chunk
  sim.Step();  // 1 decodes
  sim.Submit(2, 40, 5);
  Schedule s = sim.Step();
  // 1's verification row (1 + 3) and a 12-token chunk of 2's prompt share the step.
  ASSERT_EQ(s.plans.size(), 2u);
  EXPECT_EQ(s.plans[0].id, 1);
  EXPECT_TRUE(s.plans[0].emit);
  EXPECT_EQ(s.plans[0].k, 3);
  EXPECT_EQ(s.plans[1].id, 2);
  EXPECT_EQ(s.plans[1].end - s.plans[1].start, 12);
  EXPECT_FALSE(s.plans[1].emit);
  s = sim.Step();
  EXPECT_EQ(s.plans[1].start, 12);
  EXPECT_EQ(s.plans[1].end, 24);
  sim.Step();
  s = sim.Step();  // last chunk: 36..40 emits the first token
  EXPECT_EQ(s.plans[1].end, 40);
  EXPECT_TRUE(s.plans[1].emit);
  sim.RunToEnd();
}

// While others decode, a long prompt goes in chunks of prefill_tokens_while_decoding (so
// their inter-token latency stays bounded); alone it takes the whole budget again.
TEST(SchedulerTest, PromptChunksShrinkWhileOthersDecode) {
  Sim sim;
  sim.config.max_batch_tokens = 64;
  sim.config.prefill_tokens_while_decoding = 8;
  sim.Submit(1, 4, 6, /*want_k=*/2);
  sim.Step();  // 1's prompt
  sim.Submit(2, 100, 3);
  Schedule s = sim.Step();  // 1 decodes: 2 gets 8 prompt tokens
  ASSERT_EQ(s.plans.size(), 2u);
  EXPECT_EQ(s.plans[0].id, 1);
  EXPECT_EQ(s.plans[0].k, 2);
  EXPECT_EQ(s.plans[1].id, 2);
  EXPECT_EQ(s.plans[1].end - s.plans[1].start, 8);
  while (sim.Find(1) != nullptr) {
    s = sim.Step();
    for (const SeqPlan& p : s.plans) {
      if (p.id == 2) {
        EXPECT_LE(p.end - p.start, 8);
      }
    }
  }
  // 1 finished: 2's prompt takes the whole budget.
  s = sim.Step();
  ASSERT_EQ(s.plans.size(), 1u);
  EXPECT_EQ(s.plans[0].id, 2);
  EXPECT_EQ(s.plans[0].end - s.plans[0].start, 64);
  sim.RunToEnd();
  EXPECT_EQ(sim.finished_order, (std::vector<int64_t>{1, 2}));
}

// The seconds `curve` predicts for a step's plans, priced as the scheduler and the loop's
// Target step price them (each plan at its start position).
double PredictedSeconds(const CostCurve& curve, const Schedule& s) {
  StepContext c;
  int64_t tokens = 0;
  for (const SeqPlan& p : s.plans) {
    tokens += p.tokens();
    p.AddTo(c);
  }
  return curve.Predict(static_cast<double>(tokens), c);
}

// While others decode, a long prompt's chunks are cut so the step's predicted seconds stay
// within step_seconds_while_decoding: deeper chunks cost more a token, so they get fewer
// tokens. Alone, the prompt takes the whole budget again.
TEST(SchedulerTest, PromptChunksFitTheStepTimeBoundAndShrinkWithDepth) {
  // 4 ms a step plus 0.5 ms a token; context: 1 us a position, 0.5 us a (row, position).
  CostCurve curve({{1, 0.0045}, {512, 0.26}});
  curve.set_depth({1e-6, 0.5e-6});
  Sim sim;
  sim.config.max_batch_tokens = 512;
  sim.config.step_seconds_while_decoding = 0.040;
  sim.config.step_cost = &curve;
  sim.Submit(1, 4, 400);
  sim.Step();  // 1's prompt, alone
  sim.Submit(2, 1500, 3);
  std::vector<int32_t> chunks;
  while (sim.Find(1) != nullptr && (sim.Find(2) == nullptr || sim.Find(2)->has_output == false)) {
    const Schedule s = sim.Step();
    int32_t chunk = 0;
    for (const SeqPlan& p : s.plans) {
      if (p.id == 2) chunk = p.end - p.start;
    }
    if (chunk == 0) continue;
    chunks.push_back(chunk);
    if (chunk > sim.config.block_size) {
      EXPECT_LE(PredictedSeconds(curve, s), 0.040) << "chunk of " << chunk;
      // The largest that fits: one more token would not.
      Schedule more = s;
      for (SeqPlan& p : more.plans) p.end += p.id == 2 ? 1 : 0;
      if (sim.Find(2) == nullptr || sim.Find(2)->target_pos < 1500) {
        EXPECT_GT(PredictedSeconds(curve, more), 0.040) << "chunk of " << chunk;
      }
    }
  }
  ASSERT_GE(chunks.size(), 3u);
  // 0.040 s less the decode row's ~4.5 ms leaves ~70 tokens near position 0.
  EXPECT_GE(chunks.front(), 60);
  EXPECT_LE(chunks.front(), 72);
  EXPECT_LT(chunks[chunks.size() - 2], chunks.front()) << "deeper chunks must be smaller";
  EXPECT_TRUE(sim.Find(2) == nullptr || sim.Find(2)->has_output) << "2's prompt never finished";
  sim.RunToEnd();
}

// A curve calibrated with every row's logits over-prices a prompt chunk, which computes one:
// priced with its logit rows (LogitCost), the chunk that fits the same bound is larger.
TEST(SchedulerTest, APromptChunkIsPricedWithItsOneLogitRow) {
  const auto first_chunk = [](const CostCurve& curve) {
    Sim sim;
    sim.config.max_batch_tokens = 512;
    sim.config.step_seconds_while_decoding = 0.040;
    sim.config.step_cost = &curve;
    sim.Submit(1, 4, 50);
    sim.Step();
    sim.Submit(2, 1000, 3);
    const Schedule s = sim.Step();
    EXPECT_EQ(s.plans.size(), 2u);
    return s.plans.size() == 2 ? s.plans[1].end - s.plans[1].start : 0;
  };
  CostCurve plain({{1, 0.0045}, {512, 0.26}});
  CostCurve priced = plain;
  priced.set_logits({0.15e-3, 128});  // 0.15 of the 0.5 ms a token is the row's logits
  const int32_t without = first_chunk(plain), with = first_chunk(priced);
  EXPECT_GE(without, 60);
  EXPECT_LE(without, 72);
  // 0.35 ms a token up to 128 rows: ~100 tokens in the same 35.5 ms.
  EXPECT_GE(with, 95);
  EXPECT_LE(with, 105);
}

// A bound the decode rows alone exceed still lets a prompt advance, one block a step; with no
// decode rows, or no cost curve, the bound does not apply.
TEST(SchedulerTest, AStepTimeBoundBelowTheDecodeRowsStillAdvancesPrompts) {
  CostCurve curve({{1, 0.0045}, {512, 0.26}});
  Sim sim;
  sim.config.max_batch_tokens = 512;
  sim.config.step_seconds_while_decoding = 0.001;  // under one decode row's 4.5 ms
  sim.config.step_cost = &curve;
  sim.Submit(1, 300, 5);
  Schedule s = sim.Step();  // alone: the whole prompt
  ASSERT_EQ(s.plans.size(), 1u);
  EXPECT_EQ(s.plans[0].end, 300);
  sim.Submit(2, 200, 3);
  s = sim.Step();  // 1 decodes: 2 gets one block
  ASSERT_EQ(s.plans.size(), 2u);
  EXPECT_EQ(s.plans[1].id, 2);
  EXPECT_EQ(s.plans[1].end - s.plans[1].start, sim.config.block_size);
  sim.config.step_cost = nullptr;  // no curve: no bound in time
  s = sim.Step();
  ASSERT_EQ(s.plans.size(), 2u);
  EXPECT_EQ(s.plans[1].end, 200);
  sim.RunToEnd();
  EXPECT_EQ(sim.finished_order, (std::vector<int64_t>{1, 2}));
}

TEST(SchedulerTest, DraftsShrinkToFitTheBudget) {
  Sim sim;
  sim.config.max_batch_tokens = 6;
  sim.Submit(1, 2, 100, 4);
  sim.Submit(2, 2, 100, 4);
  sim.Step();
  Schedule s = sim.Step();
  ASSERT_EQ(s.plans.size(), 2u);
  EXPECT_EQ(s.plans[0].k, 4);
  EXPECT_EQ(s.plans[1].k, 0);  // 6 - 5 = 1 token left: a plain decode row
}

TEST(SchedulerTest, HeadOfQueueWaitsForKvRoom) {
  Sim sim;
  sim.config.block_size = 4;
  sim.config.target_blocks = 10;
  sim.Submit(1, 20, 8);   // 6 blocks at admission
  sim.Submit(2, 16, 4);   // 5 blocks: does not fit next to 1
  sim.Submit(3, 1, 1);    // would fit, but FCFS keeps it behind 2
  Schedule s = sim.Step();
  EXPECT_EQ(s.admit, (std::vector<int64_t>{1}));
  sim.RunToEnd();
  EXPECT_EQ(sim.admitted_order, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(sim.preemptions, 0);
}

TEST(SchedulerTest, PreemptsYoungestByRecomputeAndEveryoneFinishes) {
  Sim sim;
  sim.config.block_size = 4;
  sim.config.target_blocks = 12;
  sim.config.max_batch_tokens = 64;
  for (int i = 1; i <= 3; ++i) sim.Submit(i, 8, 12);  // each grows to 20 tokens = 5 blocks
  sim.Step();
  EXPECT_EQ(sim.state.running.size(), 3u);  // 3 x 3 blocks fit at first
  sim.RunToEnd();
  EXPECT_GT(sim.preemptions, 0);
  EXPECT_EQ(sim.finished_order.size(), 3u);
  EXPECT_EQ(sim.finished_order.front(), 1);  // the oldest is never the victim
}

TEST(SchedulerTest, DraftKvOnlyDropsDrafts) {
  Sim sim;
  sim.config.block_size = 4;
  sim.config.draft_blocks = 3;
  sim.Submit(1, 6, 30, 2);
  sim.Submit(2, 6, 30, 2);
  sim.Step();
  Schedule s = sim.Step();
  ASSERT_EQ(s.plans.size(), 2u);
  EXPECT_EQ(s.plans[0].k, 2);
  EXPECT_EQ(s.plans[1].k, 0);  // no draft room left: target-only, still running
  EXPECT_TRUE(sim.Step().preempt.empty());
}

// A sampled request's k is its own: the budget, draft KV and target KV make it wait or
// preempt it, never shorten its drafts (the Sim checks every pinned row keeps want_k), while
// greedy requests in the same batch have theirs trimmed.
TEST(SchedulerTest, PinnedKIsNeverCutByLoad) {
  struct Case {
    const char* name;
    int32_t budget, target_blocks, draft_blocks;
  };
  for (const Case c : {Case{"budget", 9, 1024, 1024}, Case{"draft kv", 64, 1024, 6},
                       Case{"target kv", 64, 14, 1024}}) {
    Sim sim;
    sim.config.block_size = 4;
    sim.config.max_batch_tokens = c.budget;
    sim.config.target_blocks = c.target_blocks;
    sim.config.draft_blocks = c.draft_blocks;
    for (int i = 1; i <= 4; ++i) sim.Submit(i, 5, 12, 4, /*pinned=*/i % 2 == 1);
    bool unpinned_trimmed = false;
    while ((!sim.state.running.empty() || !sim.state.waiting.empty()) && sim.iterations < 500) {
      std::map<int64_t, SeqView> before;
      for (const SeqView& v : sim.state.running) before[v.id] = v;
      for (const SeqPlan& p : sim.Step().plans) {
        auto it = before.find(p.id);
        if (it != before.end() && !it->second.pinned_k && p.emit && p.k < 4 &&
            it->second.committed + 4 < sim.goal[p.id]) {
          unpinned_trimmed = true;
        }
      }
    }
    EXPECT_EQ(sim.finished_order.size(), 4u) << c.name;
    EXPECT_GT(sim.pinned_rows, 4) << c.name;
    EXPECT_TRUE(unpinned_trimmed) << c.name << ": the case puts no pressure on k";
  }
}

TEST(SchedulerTest, PinnedReprefillStopsOneShortSoItsNextTokenIsDrafted) {
  SchedulerConfig c;
  c.draft_blocks = 1024;
  SchedulerState st;
  st.waiting.push_back({1, 30, 0, 4, false, /*pinned_k=*/true, /*has_output=*/true});
  st.waiting.push_back({2, 30, 0, 4, false, /*pinned_k=*/false, /*has_output=*/true});
  Schedule s = ScheduleIteration(st, c);
  ASSERT_EQ(s.plans.size(), 2u);
  EXPECT_EQ(s.plans[0].end, 29);
  EXPECT_FALSE(s.plans[0].emit);
  EXPECT_EQ(s.plans[1].end, 30);  // greedy: the prefill row emits
  EXPECT_TRUE(s.plans[1].emit);
  st.running = {{1, 30, 29, 4, false, true, true}};
  st.waiting.clear();
  s = ScheduleIteration(st, c);
  ASSERT_EQ(s.plans.size(), 1u);
  EXPECT_TRUE(s.plans[0].emit);
  EXPECT_EQ(s.plans[0].k, 4);
}

// The in-process engine's mode (drafts_with_prompt): a prompt's last chunk verifies its drafts
// too, so the first token can come with speculation. Short of budget an unpinned sequence
// drafts fewer; a pinned one stops one token short instead (its next row decodes with its k).
TEST(SchedulerTest, DraftsWithPromptVerifyTheLastChunk) {
  SchedulerConfig c;
  c.draft_blocks = 1024;
  c.drafts_with_prompt = true;
  c.max_batch_tokens = 64;
  SchedulerState st;
  st.waiting.push_back({1, 20, 0, 3, false, /*pinned_k=*/false});
  st.waiting.push_back({2, 20, 0, 3, false, /*pinned_k=*/true});
  Schedule s = ScheduleIteration(st, c);
  ASSERT_EQ(s.plans.size(), 2u);
  for (const SeqPlan& p : s.plans) {
    EXPECT_TRUE(p.emit);
    EXPECT_EQ(p.end, 20);
    EXPECT_EQ(p.k, 3);
  }
  c.max_batch_tokens = 44;  // 23 for the first; 21 left: the second's prompt fits, 3 drafts not
  s = ScheduleIteration(st, c);
  ASSERT_EQ(s.plans.size(), 2u);
  EXPECT_EQ(s.plans[0].k, 3);
  EXPECT_FALSE(s.plans[1].emit);  // pinned: [0, 19), then [19, 20) + its 3 drafts
  EXPECT_EQ(s.plans[1].end, 19);
  st.waiting[1].pinned_k = false;
  s = ScheduleIteration(st, c);
  ASSERT_EQ(s.plans.size(), 2u);
  EXPECT_TRUE(s.plans[1].emit);
  EXPECT_EQ(s.plans[1].k, 1);  // unpinned: fewer drafts
  // The router's mode: the prefill row emits alone.
  c.drafts_with_prompt = false;
  s = ScheduleIteration(st, c);
  EXPECT_EQ(s.plans[0].k, 0);
  EXPECT_TRUE(s.plans[0].emit);
}

TEST(SchedulerTest, NoDraftServiceMeansNoDrafts) {
  Sim sim;
  sim.config.draft_blocks = 0;
  sim.Submit(1, 3, 10, 4);
  sim.Step();
  EXPECT_EQ(sim.Step().plans[0].k, 0);
}

TEST(SchedulerTest, LocalDraftsNeedNoDraftService) {
  SchedulerConfig c;
  c.draft_blocks = 0;
  SchedulerState st;
  st.running.push_back({1, 10, 9, 4, /*local_drafts=*/true, false, /*has_output=*/true});
  st.running.push_back({2, 10, 9, 4, /*local_drafts=*/false, false, /*has_output=*/true});
  Schedule s = ScheduleIteration(st, c);
  ASSERT_EQ(s.plans.size(), 2u);
  EXPECT_EQ(s.plans[0].k, 4);
  EXPECT_EQ(s.plans[1].k, 0);
}


// A prompt's first token comes from a prompt chunk's row (no drafts), however the prompt was
// cut: a chunk ending one token short (budget) or a cached prefix leaving one token.
TEST(SchedulerTest, OneTokenLeftOfAPromptIsAChunkNotADecodeRow) {
  SchedulerConfig c;
  c.draft_blocks = 1024;
  SchedulerState st;
  st.running.push_back({1, 33, 32, /*want_k=*/4, false, /*pinned_k=*/true});
  Schedule s = ScheduleIteration(st, c);
  ASSERT_EQ(s.plans.size(), 1u);
  EXPECT_TRUE(s.plans[0].emit);
  EXPECT_EQ(s.plans[0].k, 0) << "no drafts before the first token";
  st.running[0].has_output = true;  // after a token came out it is a decode row
  s = ScheduleIteration(st, c);
  ASSERT_EQ(s.plans.size(), 1u);
  EXPECT_EQ(s.plans[0].k, 4);
}

// With the target's prefix cache: a prefill starts past the cached prefix, the token budget
// pays only for what is computed, and KV charges only the uncached blocks (shared blocks come
// out of the capacity once; cached blocks no one holds are charged when taken).
TEST(SchedulerTest, CachedPrefixesAreChargedOnlyForWhatIsComputed) {
  SchedulerConfig c;
  c.block_size = 16;
  c.max_batch_tokens = 64;
  c.target_blocks = 10;
  c.draft_blocks = 1024;
  SchedulerState st;
  // Three requests of 100 prompt tokens, 96 of them cached on the target (6 blocks).
  for (int64_t id = 1; id <= 3; ++id) {
    st.waiting.push_back({id, 100, 96, 0, false, false, false, /*cached_blocks=*/6});
  }
  // Blocks held by the running set (here none) plus the 6 shared ones.
  c.target_adopted_blocks = 6;
  Schedule s = ScheduleIteration(st, c);
  // Each needs 7 blocks, 6 of them shared: 1 private block each fits in 10 - 6 = 4.
  EXPECT_EQ(s.admit, (std::vector<int64_t>{1, 2, 3}));
  ASSERT_EQ(s.plans.size(), 3u);
  for (const SeqPlan& p : s.plans) {
    EXPECT_EQ(p.start, 96);
    EXPECT_EQ(p.end, 100);
    EXPECT_TRUE(p.emit);
  }
  // The same prefix cached but held by no one (evictable): the first to take it pays for its
  // 6 blocks (free memory until then), the others 1 each.
  c.target_adopted_blocks = 0;
  c.target_evictable_blocks = 6;
  s = ScheduleIteration(st, c);
  EXPECT_EQ(s.admit, (std::vector<int64_t>{1, 2, 3}))
      << "only the first pays for the evictable blocks: 7 + 1 + 1 <= 10";
  c.target_blocks = 8;
  s = ScheduleIteration(st, c);
  EXPECT_EQ(s.admit, (std::vector<int64_t>{1, 2})) << "7 + 1 = 8 fits, a third does not";
}

}  // namespace
}  // namespace specd::router
