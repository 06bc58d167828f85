// Adaptive k decisions (ChooseK and the KPolicy that uses it) and the n-gram lookup, as pure
// functions.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "speculation/adaptive_k.h"
#include "speculation/k_policy.h"
#include "speculation/ngram_drafter.h"
#include "gtest/gtest.h"

namespace specd::spec {
namespace {

// Memory-bound up to `knee` tokens (flat cost), compute-bound after (cost grows per token).
CostCurve Knee(double flat_ms, double knee, double per_token_ms) {
  return CostCurve({{1, flat_ms * 1e-3},
                    {knee, flat_ms * 1e-3},
                    {knee + 100, (flat_ms + 100 * per_token_ms) * 1e-3}});
}

std::vector<KCandidate> Batch(int n, double alpha, int cap = 8) {
  return std::vector<KCandidate>(n, KCandidate{alpha, cap});
}

// ChooseK's plain twin: the same search with alpha^k and the expected tokens computed where
// they are used (ChooseK tabulates them once per call).
std::vector<int32_t> ChooseKReference(const std::vector<KCandidate>& seqs, int32_t prefill,
                                      int32_t max_k, const CostCurve& verify,
                                      const CostCurve& draft) {
  const size_t B = seqs.size();
  std::vector<int32_t> best(B, 0);
  if (B == 0 || max_k <= 0 || verify.empty()) return best;
  auto rate = [&](const std::vector<int32_t>& k) {
    double e = 0.0, keys = 0.0, row_keys = 0.0;
    int32_t tokens = prefill, top = 0;
    for (size_t i = 0; i < B; ++i) {
      e += ExpectedTokens(seqs[i].alpha, k[i]);
      tokens += 1 + k[i];
      top = std::max(top, k[i]);
      keys += seqs[i].context;
      row_keys += double{1.0 + k[i]} * seqs[i].context;
    }
    double c = verify.Predict(tokens) + verify.load_factor() *
                                            (verify.depth().per_key * keys +
                                             verify.depth().per_row_key * row_keys);
    if (prefill > 0) c -= verify.Predict(prefill);
    // Draft round j: the sequences with k_i >= j, one row each at its context.
    for (int32_t j = 1; !draft.empty() && j <= top; ++j) {
      double n = 0.0, round_keys = 0.0;
      for (size_t i = 0; i < B; ++i) {
        if (k[i] < j) continue;
        n += 1.0;
        round_keys += seqs[i].context;
      }
      c += draft.Predict(n) + draft.load_factor() * (draft.depth().per_key +
                                                     draft.depth().per_row_key) * round_keys;
    }
    return c > 0.0 ? e / c : 0.0;
  };
  double best_rate = rate(best);
  for (int32_t K = 1; K <= max_k; ++K) {
    std::vector<int32_t> k(B);
    for (size_t i = 0; i < B; ++i) k[i] = std::max(0, std::min(K, seqs[i].cap));
    double cur = rate(k);
    for (;;) {
      int32_t pick = -1;
      double gain = 2.0;
      for (size_t i = 0; i < B; ++i) {
        if (k[i] == 0) continue;
        const double g = std::pow(seqs[i].alpha, k[i]);
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

// Random batches (1-24 sequences, acceptances from 0 to 1 with ties, caps from -1 to 10,
// contexts from 0 to 8k, prefills, free and priced drafting, with and without a depth cost)
// choose the same k as the plain twin.
TEST(AdaptiveKTest, ChooseKEqualsItsPlainTwin) {
  std::mt19937 rng(7);
  const double alphas[] = {0.0, 0.2, 0.42, 0.42, 0.6, 0.75, 0.9, 1.0};
  int drafted = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 24);
    std::vector<KCandidate> seqs(n);
    for (KCandidate& c : seqs) {
      c.alpha = rng() % 3 == 0 ? alphas[rng() % 8] : (rng() % 1001) / 1000.0;
      c.cap = static_cast<int32_t>(rng() % 12) - 1;
      c.context = rng() % 2 == 0 ? static_cast<int32_t>(rng() % 8192) : 0;
    }
    const int32_t prefill = rng() % 3 == 0 ? static_cast<int32_t>(rng() % 300) : 0;
    const int32_t max_k = static_cast<int32_t>(rng() % 10);
    CostCurve verify = Knee(2 + rng() % 20, 8 + rng() % 64, 0.05 + (rng() % 100) / 100.0);
    if (rng() % 2 == 0) verify.set_depth({(rng() % 20) * 1e-7, (rng() % 10) * 1e-7});
    CostCurve draft = rng() % 4 == 0 ? CostCurve() : Knee(0.1 + (rng() % 30) / 10.0, 32, 0.02);
    if (!draft.empty() && rng() % 2 == 0) draft.set_depth({(rng() % 10) * 1e-7, 0.0});
    const std::vector<int32_t> got = ChooseK(seqs, prefill, max_k, verify, draft);
    ASSERT_EQ(got, ChooseKReference(seqs, prefill, max_k, verify, draft)) << "trial " << trial;
    for (int32_t k : got) drafted += k > 0 ? 1 : 0;
  }
  EXPECT_GT(drafted, 1000);  // the batches draw both answers, not only k = 0
}

TEST(AdaptiveKTest, ExpectedTokens) {
  EXPECT_DOUBLE_EQ(ExpectedTokens(0.5, 0), 1.0);
  EXPECT_DOUBLE_EQ(ExpectedTokens(0.5, 2), 1.75);
  EXPECT_DOUBLE_EQ(ExpectedTokens(1.0, 4), 5.0);
}

TEST(AdaptiveKTest, CostCurveInterpolatesAndTracksLoad) {
  CostCurve c({{1, 1.0}, {9, 3.0}});
  EXPECT_DOUBLE_EQ(c.Predict(5), 2.0);
  EXPECT_DOUBLE_EQ(c.Predict(13), 4.0);             // extrapolates the last segment
  for (int i = 0; i < 200; ++i) c.Observe(5, 4.0);  // the machine got 2x slower
  EXPECT_NEAR(c.load_factor(), 2.0, 1e-3);
  EXPECT_NEAR(c.Predict(9), 6.0, 1e-2);
}

// Context is priced per KV position a sequence reads and per (row, position): a step's
// prediction adds both, the load factor scales them with the rest, and a step observed exactly
// as the curve prices it leaves the load factor at 1 (a depth-blind curve read the same step
// as a machine 2x slower).
TEST(AdaptiveKTest, CostCurvePricesContext) {
  CostCurve c({{1, 1.0e-3}, {9, 3.0e-3}});
  c.set_depth({1e-6, 0.5e-6});
  StepContext ctx;
  ctx.Add(2000, 5);  // one sequence, 5 rows over 2,000 positions
  ctx.Add(1000, 1);
  EXPECT_DOUBLE_EQ(ctx.keys, 3000.0);
  EXPECT_DOUBLE_EQ(ctx.row_keys, 11000.0);
  EXPECT_NEAR(c.Predict(6), 2.25e-3, 1e-12);
  EXPECT_NEAR(c.Predict(6, ctx), 2.25e-3 + 3e-3 + 5.5e-3, 1e-12);
  for (int i = 0; i < 200; ++i) c.Observe(6, 10.75e-3, ctx);
  EXPECT_NEAR(c.load_factor(), 1.0, 1e-9);
  CostCurve blind({{1, 1.0e-3}, {9, 3.0e-3}});
  for (int i = 0; i < 200; ++i) blind.Observe(6, 10.75e-3);
  EXPECT_NEAR(blind.load_factor(), 10.75 / 2.25, 1e-3);
  for (int i = 0; i < 200; ++i) c.Observe(6, 2 * 10.75e-3, ctx);  // now 2x slower
  EXPECT_NEAR(c.Predict(6, ctx), 2 * 10.75e-3, 1e-5);
  EXPECT_EQ(c.Unscaled().depth().per_row_key, 0.5e-6);
  EXPECT_NEAR(c.Unscaled().Predict(6, ctx), 10.75e-3, 1e-12);
}

// A curve calibrated with every row's logits (up to 32 rows) prices a step with fewer logit
// rows (prompt chunks) cheaper by per_row for each row short of that; an unknown count (-1)
// and a step of only logit rows keep the calibrated price. A prompt chunk observed at its priced
// cost leaves the load factor at 1, where pricing it as a verification read the machine faster.
TEST(AdaptiveKTest, CostCurvePricesLogitRows) {
  CostCurve c({{1, 3.0e-3}, {64, 50.0e-3}});
  c.set_logits({0.2e-3, 32});
  StepContext all;
  all.AddLogitRows(16);
  EXPECT_NEAR(c.Predict(16, all), c.Predict(16), 1e-12);
  StepContext chunk;  // 48 prompt rows, the last computing logits, beside 2 decode rows
  chunk.AddLogitRows(1);
  chunk.AddLogitRows(2);
  EXPECT_DOUBLE_EQ(chunk.logit_rows, 3.0);
  // The calibration computed 32 rows' logits at 50 tokens: 29 fewer here.
  EXPECT_NEAR(c.Predict(50, chunk), c.Predict(50) - 29 * 0.2e-3, 1e-12);
  StepContext small;  // under the calibrated rows: every row short of its logits
  small.AddLogitRows(1);
  EXPECT_NEAR(c.Predict(10, small), c.Predict(10) - 9 * 0.2e-3, 1e-12);
  for (int i = 0; i < 200; ++i) c.Observe(50, c.Shape(50, chunk), chunk);
  EXPECT_NEAR(c.load_factor(), 1.0, 1e-9);
  CostCurve blind({{1, 3.0e-3}, {64, 50.0e-3}});
  for (int i = 0; i < 200; ++i) blind.Observe(50, c.Shape(50, chunk));
  EXPECT_LT(blind.load_factor(), 0.9);
  EXPECT_EQ(c.Unscaled().logits().per_row, 0.2e-3);
  // Never below zero, however many rows lack logits.
  CostCurve cheap({{1, 1.0e-3}, {64, 2.0e-3}});
  cheap.set_logits({1e-3, 64});
  EXPECT_EQ(cheap.Predict(64, small), 0.0);
}

// The default model's costs as calibrated on a 2-core EPYC (specd-bench --cost-model,
// 2026-12-06): at 2k positions a verified row costs more (its arithmetic against every
// position), so a lone sequence drafts less deep; but the KV read is shared by all of a
// sequence's rows and dominates a deep batch's step, so at batch 8, where a shallow batch does
// not draft, a deep one does.
TEST(AdaptiveKTest, ContextShortensALoneDraftAndMakesADeepBatchDraft) {
  CostCurve verify({{1, 3.311e-3}, {2, 3.998e-3}, {3, 4.726e-3}, {4, 5.316e-3}, {5, 6.501e-3},
                    {6, 6.819e-3}, {7, 7.720e-3}, {8, 8.879e-3}, {9, 9.498e-3}, {16, 14.851e-3},
                    {32, 26.754e-3}, {64, 50.545e-3}});
  verify.set_depth({0.993e-6, 0.544e-6});
  const CostCurve draft({{1, 0.167e-3}, {4, 0.327e-3}, {16, 1.275e-3}, {32, 2.458e-3}});
  const auto k_at = [&](int n, double alpha, int32_t context) {
    std::vector<KCandidate> seqs(n, KCandidate{alpha, 8, context});
    return ChooseK(seqs, 0, 8, verify, draft);
  };
  EXPECT_EQ(k_at(1, 0.7, 0)[0], 3);
  EXPECT_EQ(k_at(1, 0.7, 2048)[0], 2);
  EXPECT_EQ(k_at(8, 0.7, 0), std::vector<int32_t>(8, 0));
  EXPECT_EQ(k_at(8, 0.7, 2048), std::vector<int32_t>(8, 1));
  // The cost model's estimate agrees: plain decoding pays for the context too.
  const SpeedupEstimate deep = EstimateSpeedup(0.7, 8, 8, verify, draft, 2048);
  EXPECT_EQ(deep.mean_k, 1.0);
  EXPECT_GT(deep.speedup, 1.05);
  EXPECT_EQ(EstimateSpeedup(0.7, 8, 8, verify, draft, 0).speedup, 1.0);
}

TEST(AdaptiveKTest, MemoryBoundTargetAndGoodDraftSpeculateDeep) {
  const CostCurve verify = Knee(10, 64, 0.5), draft = Knee(1, 64, 0.02);
  const auto k = ChooseK(Batch(1, 0.9), 0, 8, verify, draft);
  EXPECT_GE(k[0], 6);
}

TEST(AdaptiveKTest, PoorAcceptanceSpeculatesLittle) {
  const CostCurve verify = Knee(10, 64, 0.5), draft = Knee(3, 64, 0.02);
  EXPECT_LE(ChooseK(Batch(1, 0.1), 0, 8, verify, draft)[0], 1);
  EXPECT_GT(ChooseK(Batch(1, 0.8), 0, 8, verify, draft)[0],
            ChooseK(Batch(1, 0.3), 0, 8, verify, draft)[0]);
}

TEST(AdaptiveKTest, ComputeBoundTargetDoesNotSpeculate) {
  // Verify cost proportional to tokens: a draft token costs as much as a plain step.
  const CostCurve verify({{1, 0.01}, {100, 1.0}}), draft = Knee(1, 64, 0.02);
  EXPECT_EQ(ChooseK(Batch(1, 0.7), 0, 8, verify, draft)[0], 0);
}

TEST(AdaptiveKTest, KShrinksAsTheBatchGrows) {
  const CostCurve verify = Knee(10, 32, 0.5), draft = Knee(1, 32, 0.05);
  int prev = 100;
  std::vector<int> means;
  for (int b : {1, 4, 16, 64}) {
    const auto k = ChooseK(Batch(b, 0.7), 0, 8, verify, draft);
    int sum = 0;
    for (int x : k) sum += x;
    means.push_back(sum / b);
    EXPECT_LE(sum / b, prev) << "batch " << b;
    prev = sum / b;
  }
  EXPECT_GE(means.front(), 3);
  EXPECT_EQ(means.back(), 0);  // 64 sequences fill the memory-bound region alone
}

TEST(AdaptiveKTest, BigPrefillInTheStepShrinksK) {
  const CostCurve verify = Knee(10, 32, 0.5), draft = Knee(1, 32, 0.05);
  EXPECT_GT(ChooseK(Batch(2, 0.7), 0, 8, verify, draft)[0], 0);
  EXPECT_EQ(ChooseK(Batch(2, 0.7), 200, 8, verify, draft)[0], 0);
}

TEST(AdaptiveKTest, CapsAndFreeDraftingAreRespected) {
  const CostCurve verify = Knee(10, 64, 0.5);
  // Free drafting (n-gram) with a flat verify: draft to the cap.
  auto k = ChooseK({{0.6, 3}, {0.6, 0}, {0.6, 8}}, 0, 8, verify, CostCurve());
  EXPECT_EQ(k[0], 3);
  EXPECT_EQ(k[1], 0);
  EXPECT_EQ(k[2], 8);
  EXPECT_EQ(ChooseK(Batch(2, 0.9), 0, 0, verify, CostCurve())[0], 0);  // max_k 0
}

// The cost model's figures: a flat (memory-bound) verify and a free draft give the expected
// tokens of the deepest k as the speed-up; a draft step costing a tenth of the target's at
// acceptance 0.7 gives (1 + .7 + ... + .7^k) / (1 + k/10) at ChooseK's k; a compute-bound
// target gives 1x (k 0).
TEST(AdaptiveKTest, SpeedupEstimateIsTheExpectedTokensOverTheStepCost) {
  const CostCurve flat({{1, 0.01}, {512, 0.01}});
  const SpeedupEstimate free_draft = EstimateSpeedup(0.8, 1, 8, flat, CostCurve());
  EXPECT_DOUBLE_EQ(free_draft.mean_k, 8.0);
  EXPECT_NEAR(free_draft.speedup, ExpectedTokens(0.8, 8), 1e-9);
  const CostCurve draft({{1, 0.001}, {512, 0.001}});
  const SpeedupEstimate e = EstimateSpeedup(0.7, 1, 8, flat, draft);
  const int32_t k = static_cast<int32_t>(e.mean_k);
  EXPECT_GE(k, 2);
  EXPECT_NEAR(e.speedup, ExpectedTokens(0.7, k) / (1.0 + 0.1 * k), 1e-9);
  EXPECT_NEAR(e.step_seconds, 0.01 + 0.001 * k, 1e-12);
  // Batch 8 on the same flat curve: each sequence alike, the same k and figures.
  const SpeedupEstimate b8 = EstimateSpeedup(0.7, 8, 8, flat, draft);
  EXPECT_DOUBLE_EQ(b8.mean_k, e.mean_k);
  EXPECT_NEAR(b8.speedup, ExpectedTokens(0.7, k) * 8 / (0.01 + 0.001 * k) / (8 / 0.01), 1e-9);
  const CostCurve linear({{1, 0.01}, {100, 1.0}});
  const SpeedupEstimate none = EstimateSpeedup(0.7, 1, 8, linear, draft);
  EXPECT_EQ(none.mean_k, 0.0);
  EXPECT_NEAR(none.speedup, 1.0, 1e-9);
}

TEST(AdaptiveKTest, AcceptanceEstimateMovesWithEvidence) {
  AcceptanceEstimate a;
  EXPECT_NEAR(a.alpha(), AcceptanceEstimate::kPrior, 1e-12);
  EXPECT_NEAR(a.alpha(0.3), 0.3, 1e-12);
  for (int i = 0; i < 10; ++i) a.Update(4, 4);
  EXPECT_GT(a.alpha(), 0.9);
  EXPECT_GT(a.alpha(0.3), 0.85);
  // Ten failing steps: the pinned record (a few steps of memory) falls below 0.25; the
  // unpinned one (about ten) only below 0.6, and thirty take it below 0.25. One unlucky step
  // must not stop an unpinned sequence's drafting (KPolicyTest.NearTheBestFixedK).
  for (int i = 0; i < 10; ++i) a.Update(4, 0);
  EXPECT_LT(a.alpha(), 0.25);
  EXPECT_LT(a.alpha(0.3), 0.6);
  EXPECT_GT(a.alpha(0.3), 0.4);
  for (int i = 0; i < 20; ++i) a.Update(4, 0);
  EXPECT_LT(a.alpha(0.3), 0.25);
  const double before = a.alpha(), before_unpinned = a.alpha(0.3);
  a.Update(0, 0);  // nothing drafted: no evidence
  EXPECT_EQ(a.alpha(), before);
  EXPECT_EQ(a.alpha(0.3), before_unpinned);
}

TEST(NgramDrafterTest, LongestRecentSuffixMatch) {
  auto d = NgramDrafter::Create({});
  ASSERT_TRUE(d.ok());
  // "1 2 3 4 5 ... 1 2 3" -> continue with 4 5.
  EXPECT_EQ((*d)->Lookup({1, 2, 3, 4, 5, 9, 1, 2, 3}, 2), (std::vector<int32_t>{4, 5}));
  // The longer match wins over a more recent shorter one: "7 8" occurs twice, "6 7 8" once.
  EXPECT_EQ((*d)->Lookup({6, 7, 8, 1, 7, 8, 2, 6, 7, 8}, 1), (std::vector<int32_t>{1}));
  // Most recent occurrence of the same length.
  EXPECT_EQ((*d)->Lookup({5, 1, 5, 2, 5}, 1), (std::vector<int32_t>{2}));
  // Continuation stops at the end of the sequence.
  EXPECT_EQ((*d)->Lookup({3, 3}, 4), (std::vector<int32_t>{3}));
  EXPECT_TRUE((*d)->Lookup({1, 2, 3}, 4).empty());
  EXPECT_TRUE((*d)->Lookup({1, 2, 1}, 0).empty());

  std::vector<int32_t> seq = {1, 2, 3, 4, 1, 2};
  const sampling::SamplingParams p;
  const sampling::PenaltyState h;
  const sampling::CounterRng rng(1);
  std::vector<DraftInput> in = {{7, seq, &p, &h, &rng, 3}};
  std::vector<DraftOutput> out(1);
  ASSERT_TRUE((*d)->Propose(in, absl::MakeSpan(out)).ok());
  ASSERT_EQ(out[0].proposals.size(), 3u);
  EXPECT_EQ(out[0].proposals[0].token, 3);
  EXPECT_EQ(out[0].proposals[1].token, 4);
  EXPECT_EQ(out[0].proposals[2].token, 1);
  EXPECT_EQ(out[0].proposals[0].ids, (std::vector<int32_t>{3}));
  EXPECT_EQ(out[0].proposals[0].probs, (std::vector<float>{1.0f}));
}

// HasProposal (one scan of the shortest suffix) against its reference: some suffix of
// min_match..max_ngram tokens (and at least min_ngram) occurs earlier in the window with a token
// after it. At min_match 1 that is Lookup being non-empty. Random short sequences over a few
// symbols, every option set, windows cut by max_lookback.
TEST(NgramDrafterTest, HasProposalIsAMatchOfAtLeastMinMatchTokens) {
  std::mt19937 gen(5);
  for (const NgramDrafterOptions o :
       {NgramDrafterOptions{}, NgramDrafterOptions{3, 2, 4096}, NgramDrafterOptions{2, 1, 6}}) {
    auto d = NgramDrafter::Create(o);
    ASSERT_TRUE(d.ok());
    for (int trial = 0; trial < 2000; ++trial) {
      std::vector<int32_t> all(1 + gen() % 14);
      for (int32_t& x : all) x = static_cast<int32_t>(gen() % 4);
      const size_t from = all.size() > static_cast<size_t>(o.max_lookback)
                              ? all.size() - static_cast<size_t>(o.max_lookback)
                              : 0;
      const std::vector<int32_t> t(all.begin() + static_cast<std::ptrdiff_t>(from), all.end());
      const int64_t n = static_cast<int64_t>(t.size());
      for (int32_t min_match = 1; min_match <= 4; ++min_match) {
        bool expected = false;
        for (int64_t len = std::max(o.min_ngram, min_match); len <= o.max_ngram; ++len) {
          for (int64_t j = 0; j + len < n; ++j) {
            expected = expected || std::equal(t.end() - len, t.end(), t.begin() + j);
          }
        }
        EXPECT_EQ((*d)->HasProposal(all, min_match), expected)
            << "trial " << trial << " min_ngram " << o.min_ngram << " min_match " << min_match;
        if (min_match == 1) {
          EXPECT_EQ(expected, !(*d)->Lookup(all, 1).empty()) << "trial " << trial;
        }
      }
    }
  }
}

}  // namespace
}  // namespace specd::spec

namespace specd::spec {
namespace {

// A drafter whose tokens are never accepted: the first sequence finds out by drafting (its
// prior) and probing; every failed probe makes new sequences start probing later, until a
// 128-step request no longer probes at all (each probe would make the draft catch up on the
// whole prompt for nothing).
TEST(KPolicyTest, FailedProbesMakeNewSequencesProbeLater) {
  KPolicyOptions o;
  o.max_k = 4;
  o.track_load = false;
  o.verify_cost = CostCurve({{1, 1.0}, {8, 1.4}});
  o.draft_cost = CostCurve({{1, 0.3}, {16, 1.0}});
  KPolicy policy(o);
  auto run = [&](int steps) {  // one greedy sequence alone; returns the steps that drafted
    SpecSeqState s;
    policy.AfterDraft(s, 0);  // its first token came from the prefill, without drafts
    int drafted = 0;
    for (int i = 0; i < steps; ++i) {
      const KRequest r{&s, 4, /*pinned=*/false};
      const int32_t k = policy.Choose({&r, 1}, 0)[0];
      drafted += k > 0;
      policy.AfterDraft(s, k);
      policy.AfterVerify(s, k, 0);
    }
    return drafted;
  };
  EXPECT_GE(run(128), 2);
  int later = -1;
  for (int r = 0; r < 5; ++r) later = run(120);
  EXPECT_EQ(later, 0);  // no probe in a 120-token request any more
  EXPECT_GE(policy.probe_start(), 128);
}

// Measured cost shapes the policy timelines below run on.
struct Profile {
  const char* name;
  CostCurve verify, draft;
};
// An H200 running the default model: a flat verify (verify(5) = 1.24 x verify(1)), a draft
// round 0.09 of a step.
Profile H200() {
  return {"h200", CostCurve({{1, 3.3e-3}, {2, 3.53e-3}, {5, 4.1e-3}, {40, 11.0e-3}, {128, 16e-3}, {256, 32e-3}}),
          CostCurve({{1, 0.3e-3}, {8, 2.4e-3}})};
}
// This project's 2-core CPU on AVX2 (verify(5) = 1.86 x, draft 0.047).
Profile CpuAvx2() {
  return {"cpu avx2", CostCurve({{1, 3.6e-3}, {2, 4.25e-3}, {3, 5.04e-3}, {5, 6.7e-3}, {40, 36.8e-3}, {128, 110e-3}}),
          CostCurve({{1, 0.17e-3}, {8, 1.2e-3}})};
}
// The AMD VNNI VM of 2026-12-05 with the shipped draft, as the engine measured it in the loop
// (specd-bench --spec: verify(2) = 1.11 x, verify(5) = 1.3 x; a draft step 0.16 of a target step,
// the draft's weights read from memory).
Profile Cpu1205() {
  return {"cpu 12-05", CostCurve({{1, 2.2e-3}, {2, 2.45e-3}, {3, 2.6e-3}, {5, 2.9e-3}, {9, 4.0e-3}, {40, 13.7e-3}, {128, 43e-3}}),
          CostCurve({{1, 0.35e-3}, {8, 2.8e-3}})};
}

// The F16 re-encoding of the default model with its Q4_1 file as the draft, as specd-bench
// --spec --pair-only --pair-type f16 measured it on the VM of 2026-12-05 (fourth session): an
// expensive draft (0.29 of a step) and a steep verify (verify(2) = 1.41 x, verify(5) = 2.04 x).
Profile CpuF16Pair() {
  return {"cpu f16 pair", CostCurve({{1, 6.7e-3}, {2, 9.45e-3}, {3, 11.1e-3}, {5, 13.8e-3}, {9, 21.9e-3}, {40, 74.1e-3}, {128, 230e-3}}),
          CostCurve({{1, 2.0e-3}, {8, 15.6e-3}})};
}

// The policy the timelines run: k up to 8, the profile's curves.
KPolicyOptions TimelinePolicyOptions(const Profile& p, bool track_load) {
  KPolicyOptions o;
  o.max_k = 8;
  o.track_load = track_load;
  o.verify_cost = p.verify;
  o.draft_cost = p.draft;
  return o;
}

// One greedy sequence at a time: `requests` requests of `tokens` tokens after a 60-token
// prompt, each draft accepted with probability alpha (seeded), except the first
// `rejected_first` drafts of the run, which are rejected (an unlucky start). The draft
// model's catch-up on what it has not seen is charged as the policy prices it.
struct TimelineResult {
  double speedup = 0.0;    // over plain decoding, by the cost curves
  int64_t drafted = 0;     // draft tokens proposed over the run
  int64_t late_drafted = 0;  // of them, in the second half of the requests
};
TimelineResult RunTimeline(const Profile& p, double alpha, int32_t fixed_k, int requests = 32,
                           int32_t tokens = 32, int rejected_first = 0, uint32_t seed = 1) {
  KPolicy policy(TimelinePolicyOptions(p, /*track_load=*/false));
  std::mt19937 rng(seed);
  std::bernoulli_distribution accept(alpha);
  const double t1 = p.verify.Predict(1), ratio = p.draft.Predict(1) / t1;
  double produced_total = 0, seconds = 0;
  TimelineResult res;
  for (int request = 0; request < requests; ++request) {
    SpecSeqState s;
    policy.AfterDraft(s, 0);  // its first token came from the prefill
    int32_t produced = 1, behind = 60;
    while (produced < tokens) {
      const KRequest r{&s, std::min(8, tokens - produced), /*pinned=*/false, behind,
                       tokens - produced};
      const int32_t k = fixed_k >= 0 ? std::min(fixed_k, r.cap) : policy.Choose({&r, 1}, 0)[0];
      policy.AfterDraft(s, k);
      int32_t accepted = 0;
      while (accepted < k && (res.drafted + accepted >= rejected_first) && accept(rng)) ++accepted;
      policy.AfterVerify(s, k, accepted);
      res.drafted += k;
      if (request >= requests / 2) res.late_drafted += k;
      seconds += p.verify.Predict(1 + k) + k * p.draft.Predict(1);
      if (k > 0 && behind > 1) seconds += ratio * p.verify.Predict(behind);
      produced += accepted + 1;
      produced_total += accepted + 1;
      behind = k > 0 ? 1 : behind + 1;
    }
  }
  res.speedup = produced_total * t1 / seconds;
  return res;
}

double BestFixedK(const Profile& p, double alpha, int requests = 32, int32_t tokens = 32) {
  double best = 1.0;
  for (int32_t k = 1; k <= 8; ++k) best = std::max(best, RunTimeline(p, alpha, k, requests, tokens).speedup);
  return best;
}

// The policy against the best fixed k on the timeline, on the measured cost shapes. Its
// speed-up (expected by the curves) must come within 8 % of the best fixed k's and never fall
// below plain. With the old estimate (a memory of ~3 steps and a prior of one token) one
// unlucky step stopped drafting until the next probe: on the H200 profile it gave 1.10x at
// alpha 0.45 where the best fixed k gives 1.26x, and on the AVX2 profile 1.00x where k = 1
// gives 1.16x. On the 12-05 profile a plain policy-wide prior and a catch-up priced against 8
// steps kept the shipped draft (accepted 0.42) off: 0.998x where k = 1 gives 1.07x.
TEST(KPolicyTest, NearTheBestFixedK) {
  for (const Profile& p : {H200(), CpuAvx2(), Cpu1205()}) {
    for (const double alpha : {0.3, 0.42, 0.45, 0.6}) {
      for (const int32_t tokens : {32, 64}) {
        const double speedup = RunTimeline(p, alpha, -1, 32, tokens).speedup;
        const double best = BestFixedK(p, alpha, 32, tokens);
        EXPECT_GE(speedup, 0.92 * best) << p.name << " alpha " << alpha << " tokens " << tokens;
        EXPECT_GE(speedup, 0.98) << p.name << " alpha " << alpha << " tokens " << tokens;
        std::printf("%s alpha %.2f, %d tokens: policy %.3fx, best fixed k %.3fx\n", p.name, alpha,
                    tokens, speedup, best);
      }
    }
  }
}

// The draft's load factor as a timeline (track_load on): 32 greedy requests of 128 tokens,
// drafts accepted with probability 0.5 (seeded). The draft's rounds take `slow` times their
// calibrated price: the first 16 priced rounds only (a slow start: the draft service shared
// its cores, its caches were cold), or all of them (`persistent`). Returns the speed-up by
// the cost curves and the drafts proposed.
struct LoadTimeline {
  double speedup = 0.0;
  int64_t drafted = 0;
};
LoadTimeline RunLoadTimeline(const Profile& p, double slow, bool persistent) {
  KPolicy policy(TimelinePolicyOptions(p, /*track_load=*/true));
  std::mt19937 rng(1);
  std::bernoulli_distribution accept(0.5);
  int64_t priced = 0;
  double seconds = 0, produced = 0;
  LoadTimeline res;
  for (int request = 0; request < 32; ++request) {
    SpecSeqState s;
    policy.AfterDraft(s, 0);  // its first token came from the prefill
    int32_t made = 1, behind = 60;
    while (made < 128) {
      const KRequest r{&s, std::min(8, 128 - made), /*pinned=*/false, behind, 128 - made};
      const int32_t k = policy.Choose({&r, 1}, 0)[0];
      if (k > 0) {
        const double factor = persistent || priced < 16 ? slow : 1.0;
        const double price = policy.PredictDraft({&r, 1}, {&k, 1});  // 0: a catch-up, unpriced
        if (price > 0) {
          policy.ObserveDraft({&r, 1}, {&k, 1}, factor * price / policy.draft_cost().load_factor());
          ++priced;
        }
        seconds += factor * k * p.draft.Predict(1);
      }
      seconds += p.verify.Predict(1 + k);
      policy.ObserveVerify(1 + k, p.verify.Predict(1 + k));
      policy.AfterDraft(s, k);
      int32_t accepted = 0;
      while (accepted < k && accept(rng)) ++accepted;
      policy.AfterVerify(s, k, accepted);
      res.drafted += k;
      made += accepted + 1;
      produced += accepted + 1;
      behind = k > 0 ? 1 : behind + 1;
    }
  }
  res.speedup = produced * p.verify.Predict(1) / seconds;
  return res;
}

// A slow start must not keep a good draft off for the rest of the run: the load factor only
// moves while the draft runs, so 16 rounds at 4x its price left it at 2.3x on the 12-05
// profile and the draft never ran again (0.999x and 23 drafts, where a normal start gives
// 1.159x). Steps that draft nothing now let the factor fade toward the calibration
// (kIdleDraftLoadKeep) and the first reading after an idle stretch replaces it. A draft that
// really stays 10x slower is retried now and then, at a cost that must stay small.
TEST(KPolicyTest, ASlowStartDoesNotKeepTheDraftOff) {
  for (const Profile& p : {Cpu1205(), H200(), CpuAvx2()}) {
    const LoadTimeline normal = RunLoadTimeline(p, 1.0, false);
    const LoadTimeline slow_start = RunLoadTimeline(p, 4.0, false);
    const LoadTimeline slow_always = RunLoadTimeline(p, 10.0, true);
    std::printf("%s: normal %.3fx (%lld drafts), slow start %.3fx (%lld), "
                "always 10x slow %.3fx (%lld)\n",
                p.name, normal.speedup, static_cast<long long>(normal.drafted), slow_start.speedup,
                static_cast<long long>(slow_start.drafted), slow_always.speedup,
                static_cast<long long>(slow_always.drafted));
    EXPECT_GT(normal.speedup, 1.1) << p.name;
    EXPECT_GE(slow_start.speedup, 0.97 * normal.speedup) << p.name;
    EXPECT_GT(slow_start.drafted, normal.drafted / 2) << p.name;
    EXPECT_GE(slow_always.speedup, 0.975) << p.name;
    EXPECT_LT(slow_always.drafted, normal.drafted / 4) << p.name;
  }
}

// Two rejected first drafts must not keep a good drafter off for the rest of the process: the
// policy-wide estimate then reads 2 rejections against the prior's weight, and a new sequence's
// prior must still be hopeful enough (new_sequence_prior's optimism) to measure it again.
// Before it, the run drafted nothing after the first request (0.998x against 1.61x).
TEST(KPolicyTest, AnUnluckyStartDoesNotStopAGoodDrafter) {
  for (const Profile& p : {H200(), CpuAvx2(), Cpu1205()}) {
    const TimelineResult r = RunTimeline(p, 0.8, -1, 32, 32, /*rejected_first=*/2);
    EXPECT_GT(r.late_drafted, 16 * 31) << p.name;  // more than one a step in the second half
    EXPECT_GE(r.speedup, 0.9 * BestFixedK(p, 0.8)) << p.name;
  }
}

// The hopeful prior is exploration, so only small steps take it (kExploreMaxBatch, as the
// probes): with no evidence 0.5 + sqrt(0.25 / 16) at batch 1 and 2, the plain 0.5 at batch 3+;
// with evidence the optimism shrinks (10 steps of 2 drafts, 1 accepted each: ~19 tried after
// the decay, 0.5 + sqrt(0.25 / 35)).
TEST(KPolicyTest, TheHopefulPriorIsForSmallSteps) {
  KPolicy policy;
  EXPECT_DOUBLE_EQ(policy.new_sequence_prior(1), 0.625);
  EXPECT_DOUBLE_EQ(policy.new_sequence_prior(2), 0.625);
  EXPECT_DOUBLE_EQ(policy.new_sequence_prior(3), 0.5);
  EXPECT_DOUBLE_EQ(policy.new_sequence_prior(16), 0.5);
  SpecSeqState s;
  for (int i = 0; i < 10; ++i) policy.AfterVerify(s, 2, 1);  // 1 of 2: 2 tried, 1 accepted
  const double a = policy.new_sequence_prior(16);
  EXPECT_NEAR(a, 0.5, 0.01);
  EXPECT_NEAR(policy.new_sequence_prior(1) - a, std::sqrt(a * (1 - a) / (19.1 + 16)), 0.01);
  EXPECT_LT(policy.new_sequence_prior(1) - a, 0.125);
}

// Exploration (the hopeful prior, first-evidence probes) is for small *steps*: a sequence that
// is its drafter's only one in a step of 16 (the cluster's lookup group, its one match) is not
// a step of one (through the cluster at concurrency 16, runs that drafted 1,000-2,800 tokens
// read 0.90-0.93x of speculation off; such probes were one way they drafted). A free drafter
// never accepted, 64 steps: alone it is explored; as one of 16 it never drafts (it was probed
// every kProbeEvery steps).
TEST(KPolicyTest, ExplorationLooksAtTheWholeStep) {
  KPolicyOptions o;
  o.max_k = 4;
  o.track_load = false;
  // A CPU's verify: a row added to a step of 16 costs less than its own rows did (the cost
  // model here: 0.27 ms a row from 16 to 32 tokens, 0.34 from 9 to 16), so a drafter that is
  // never wrong would draft there, and the probe rule is what decides.
  o.verify_cost = CostCurve({{1, 1.0}, {2, 1.05}, {16, 3.0}, {32, 4.6}});
  // No draft cost: the n-gram lookup's drafts are free.
  auto drafted_steps = [&](size_t step_sequences) {
    KPolicy policy(o);
    SpecSeqState s;
    int drafted = 0;
    for (int step = 0; step < 64; ++step) {
      const KRequest r{&s, 4, /*pinned=*/false, /*behind=*/1, /*tokens_left=*/1000};
      const int32_t fixed = static_cast<int32_t>(step_sequences) - 1;  // the others' rows
      const int32_t k = policy.Choose({&r, 1}, fixed, step_sequences)[0];
      policy.AfterDraft(s, k);
      policy.AfterVerify(s, k, 0);
      drafted += k > 0;
    }
    return drafted;
  };
  EXPECT_GT(drafted_steps(1), 0);
  EXPECT_EQ(drafted_steps(16), 0);
}

// The optimism costs a drafter that is never accepted a few drafts, once: its evidence grows
// and the optimism shrinks with it, so the second half of a long run drafts nothing and the
// run stays at plain speed.
TEST(KPolicyTest, AUselessDrafterIsTriedBriefly) {
  for (const Profile& p : {H200(), CpuAvx2(), Cpu1205()}) {
    for (const double alpha : {0.0, 0.1}) {
      const TimelineResult r = RunTimeline(p, alpha, -1, 64, 64);
      EXPECT_LE(r.drafted, 40) << p.name << " alpha " << alpha;
      EXPECT_EQ(r.late_drafted, 0) << p.name << " alpha " << alpha;
      EXPECT_GE(r.speedup, 0.98) << p.name << " alpha " << alpha;
      std::printf("%s alpha %.2f: %lld drafts, %.3fx\n", p.name, alpha,
                  static_cast<long long>(r.drafted), r.speedup);
    }
  }
}

// A drafter whose first drafts do not pay at the hopeful prior (k = 1 at 0.625 costs more than
// it saves on these costs) is learnt only by probing, and a 32-token request is too short to
// repay a probe. The policy's first evidence is gathered anyway (kExploreTokens): a drafter
// accepted 0.95 must then draft in every later request. Before, the run never drafted:
// 1.000x against 1.158x for the best fixed k. A useless drafter costs one
// catch-up and kExploreTokens drafts, once: under 2 % of 64 such requests.
TEST(KPolicyTest, AnExpensiveDrafterIsTriedOnShortRequests) {
  const Profile p = CpuF16Pair();
  const TimelineResult good = RunTimeline(p, 0.95, -1, 32, 32);
  const double best = BestFixedK(p, 0.95, 32, 32);
  std::printf("%s alpha 0.95, 32 tokens: policy %.3fx (%lld drafts, %lld in the second half), best fixed k %.3fx\n",
              p.name, good.speedup, static_cast<long long>(good.drafted),
              static_cast<long long>(good.late_drafted), best);
  EXPECT_GT(best, 1.15);
  EXPECT_GT(good.late_drafted, 16 * 16);  // half of every later request's tokens, at least
  EXPECT_GE(good.speedup, 0.95 * best);
  for (const double alpha : {0.0, 0.1}) {
    const TimelineResult useless = RunTimeline(p, alpha, -1, 64, 32);
    std::printf("%s alpha %.2f, 32 tokens: %lld drafts, %.3fx\n", p.name, alpha,
                static_cast<long long>(useless.drafted), useless.speedup);
    EXPECT_LE(useless.drafted, 20) << alpha;
    EXPECT_EQ(useless.late_drafted, 0) << alpha;
    EXPECT_GE(useless.speedup, 0.98) << alpha;
  }
}

// What the router's draft cost metric divides by: the step's price on the draft curve, load
// factor included, the same steps the policy learns from. A catch-up of a few tokens (after
// accepted drafts the drafter did not hold, or a few steps without drafts) adds its rows past
// round 1's one; a longer one is a prefill's cost, neither priced nor learnt from.
TEST(KPolicyTest, PredictDraftPricesTheRoundsItObserves) {
  KPolicyOptions o;
  o.verify_cost = CostCurve({{1, 1.0}, {2, 1.1}, {16, 2.5}});
  o.draft_cost = CostCurve({{1, 0.1}, {16, 0.5}});
  KPolicy policy(o);
  SpecSeqState a, b;
  KRequest seqs[] = {{&a, 4, false, /*behind=*/1, 1000, /*context=*/100},
                     {&b, 4, false, /*behind=*/1, 1000, 200}};
  const std::vector<int32_t> k = {3, 1};
  const double rounds = DraftRoundsCost(policy.draft_cost(), k, std::vector<int32_t>{100, 200});
  EXPECT_DOUBLE_EQ(policy.PredictDraft(seqs, k), rounds);
  EXPECT_GT(rounds, 0.0);
  // b's one more row (all its drafts were accepted): the draft's share of a target row.
  seqs[1].behind = 2;
  EXPECT_NEAR(policy.PredictDraft(seqs, k), rounds + 0.1 * 0.1, 1e-12);
  // Observed at twice its price, the next prediction has moved toward it.
  const double before = policy.PredictDraft(seqs, k);
  policy.ObserveDraft(seqs, k, 2 * before);
  const double after = policy.PredictDraft(seqs, k);
  EXPECT_GT(after, before);
  seqs[1].behind = KPolicy::kMaxPricedCatchUp;  // 15 rows past round 1's: 1.5 target rows' worth
  EXPECT_GT(policy.PredictDraft(seqs, k), after);
  seqs[1].behind = KPolicy::kMaxPricedCatchUp + 1;  // a prefill's price: not a round's
  EXPECT_EQ(policy.PredictDraft(seqs, k), 0.0);
  policy.ObserveDraft(seqs, k, 100 * before);  // and not learnt from
  seqs[1].behind = 2;
  EXPECT_DOUBLE_EQ(policy.PredictDraft(seqs, k), after);
  EXPECT_EQ(KPolicy(KPolicyOptions{}).PredictDraft(seqs, k), 0.0);  // no curve
  // A draft curve with its own price a catch-up row (its calibration timed it) uses that: 5
  // rows past round 1's at 0.02 each, whatever the target's curve says, times the load factor.
  KPolicyOptions timed = o;
  timed.draft_cost.set_catch_up_row(0.02);
  KPolicy with_rows(timed);
  seqs[1].behind = 6;
  EXPECT_NEAR(with_rows.PredictDraft(seqs, k), rounds + 5 * 0.02, 1e-12);
  with_rows.ObserveDraft(seqs, k, 2 * (rounds + 5 * 0.02));
  const double load = with_rows.draft_cost().load_factor();
  EXPECT_GT(load, 1.0);
  EXPECT_NEAR(with_rows.PredictDraft(seqs, k), load * (rounds + 5 * 0.02), 1e-12);
}

// A pinned sequence prices the draft model's catch-up on the nominal costs, from `behind` (its
// own history): a drafter it would use with nothing to catch up on does not start on a long
// prompt, and a free drafter (ratio 0, nothing to catch up) is not held back.
TEST(KPolicyTest, PinnedSequencesPriceTheDraftsCatchUp) {
  KPolicyOptions o;
  o.max_k = 4;
  o.track_load = false;
  o.verify_cost = CostCurve({{1, 1.0}, {8, 1.4}});
  o.draft_cost = CostCurve({{1, 0.1}, {16, 0.5}});
  o.pinned_draft_ratio = 0.1;
  auto choose = [&](double ratio, int32_t behind) {
    KPolicyOptions with = o;
    with.pinned_draft_ratio = ratio;
    KPolicy policy(with);
    SpecSeqState s;
    for (int i = 0; i < 40; ++i) policy.AfterVerify(s, 2, 2);  // a good record: ~0.95
    const KRequest r{&s, 4, /*pinned=*/true, behind};
    return policy.Choose({&r, 1}, 0)[0];
  };
  EXPECT_GT(choose(0.1, 1), 0);     // drafting along: nothing to catch up on
  EXPECT_GT(choose(0.1, 20), 0);    // a short pause: the saving pays for it
  EXPECT_EQ(choose(0.1, 2000), 0);  // a long prompt the draft has never seen
  EXPECT_GT(choose(0.0, 2000), 0);  // free drafts never catch up
  // The same sequence with a poor record does not start on a 60-token prompt.
  KPolicy policy(o);
  SpecSeqState poor;
  for (int i = 0; i < 40; ++i) policy.AfterVerify(poor, 2, 1);  // ~0.5 per token
  const KRequest fresh{&poor, 4, /*pinned=*/true, 60};
  const KRequest along{&poor, 4, /*pinned=*/true, 1};
  EXPECT_EQ(policy.Choose({&fresh, 1}, 0)[0], 0);
  EXPECT_GT(policy.Choose({&along, 1}, 0)[0], 0);
}

// A probe is exploration: taken only with enough tokens left to use what it finds. A seeded
// (pinned) sequence whose draft is never accepted, on the nominal costs (a draft at 0.15 of the
// target), catching up on a 60-token prompt: a 64-token request never probes (at batch 8 such
// probes cost 8-10 % of plain), a 1024-token one still does, but not near its end. An unpinned
// sequence, which prices its probes on measured costs, may spend twice as much. A free
// drafter's probe costs one verified row and is taken until a few tokens before the end.
TEST(KPolicyTest, ProbesNeedTokensLeftToRepayThem) {
  KPolicyOptions o;
  o.max_k = 4;
  o.track_load = false;
  o.verify_cost = CostCurve({{1, 1.0}, {8, 1.4}});
  o.draft_cost = CostCurve({{1, 0.15}, {16, 1.0}});
  o.pinned_draft_ratio = 0.15;
  struct Probes {
    int count = 0;
    int last_left = -1;  // tokens left at the last probe
  };
  // tell_left false: the request does not say how many tokens it has left (the control).
  auto run = [&](const KPolicyOptions& options, bool pinned, int32_t max_tokens,
                 bool tell_left = true) {
    KPolicy policy(options);
    SpecSeqState s;
    policy.AfterDraft(s, 0);  // the first token came from the prefill
    Probes p;
    int32_t seen_through = 0;
    for (int32_t produced = 1; produced < max_tokens; ++produced) {
      const int32_t n = 60 + produced;
      const int32_t left = max_tokens - produced;
      const KRequest r{&s, std::min(4, left - 1), pinned, n - seen_through,
                       tell_left ? left : INT32_MAX};
      const int32_t k = policy.Choose({&r, 1}, 0)[0];
      if (s.probed) {
        EXPECT_EQ(k, 1);
        ++p.count;
        p.last_left = left;
      }
      if (k > 0) seen_through = n - 1;
      policy.AfterDraft(s, k);
      policy.AfterVerify(s, k, 0);
    }
    return p;
  };
  EXPECT_EQ(run(o, /*pinned=*/true, 64).count, 0);
  const Probes long_request = run(o, /*pinned=*/true, 1024);
  EXPECT_GE(long_request.count, 2);
  // Its catch-up then is ~0.15 x (1 + 0.3 x ~1000) = 45 steps: 32 x that is more than is left.
  EXPECT_GT(long_request.last_left, 100);
  // On costs equal to the nominal ones, a 120-token request's unpinned sequence probes (16 x
  // the ~4-step probe fits in ~100 tokens left) where a pinned one does not (32 x it does not).
  KPolicyOptions nominal = o;
  nominal.verify_cost = CostCurve({{1, 1.0}, {2, 1.3}});
  nominal.draft_cost = CostCurve({{1, 0.15}, {2, 0.3}});
  EXPECT_EQ(run(nominal, /*pinned=*/true, 120).count, 0);
  EXPECT_GE(run(nominal, /*pinned=*/false, 120).count, 1);
  // Not told how many tokens are left, the same 64-token request probes (the control).
  EXPECT_GE(run(o, /*pinned=*/true, 64, /*tell_left=*/false).count, 1);
  // A free drafter (its record starts on the prior, drafts, fails, then probes): a probe costs
  // one verified row (0.3 of a step on the nominal costs, 0.06 on the measured ones here), so
  // it probes until ~10 tokens (pinned) or ~1 token are left.
  KPolicyOptions free_drafts = o;
  free_drafts.draft_cost = CostCurve();
  free_drafts.pinned_draft_ratio = 0.0;
  for (const bool pinned : {true, false}) {
    const Probes free_short = run(free_drafts, pinned, 64);
    EXPECT_GE(free_short.count, 1) << pinned;
    EXPECT_LT(free_short.last_left, 48) << pinned;
  }
}

}  // namespace
}  // namespace specd::spec
