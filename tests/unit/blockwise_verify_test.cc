// The blockwise verifier (common/sampling/blockwise_verify.h: what the CUDA sampling kernels
// run) held against THE verifier, VerifyDraft, on the host twin with 1, 3 and 32 threads per
// block: the same tokens, acceptances, stops and mismatches for the same counters, logprobs
// within float rounding, over random rows with ties and masks and every transform.
#include "common/sampling/blockwise_verify_host.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/sampling/draft_proposal.h"
#include "common/sampling/penalty_state.h"
#include "common/sampling/speculative_verifier.h"
#include "gtest/gtest.h"
#include "testing/verify_cases.h"

namespace specd::sampling {
namespace {

using testing_cases::Case;
using testing_cases::Batch;
using testing_cases::ExpectSame;
using testing_cases::Expected;
using testing_cases::MakeCase;
using testing_cases::ParamsGrid;
using testing_cases::ToSequence;

// Verifies `cases` as one batched plan (rows concatenated in order) on the host twin.
std::vector<VerifyResult> RunBatch(const std::vector<Case>& cases, int32_t vocab, int threads) {
  const Batch batch(cases, vocab);
  absl::StatusOr<std::vector<VerifyResult>> got =
      VerifyBlockwiseOnHost(batch.plan, batch.logits, threads);
  EXPECT_TRUE(got.ok()) << got.status();
  return got.ok() ? *got : std::vector<VerifyResult>();
}

TEST(BlockwiseVerifyTest, MatchesVerifyDraftForEveryTransform) {
  std::mt19937 rng(2026);
  const std::vector<SamplingParams> grid = ParamsGrid();
  int64_t emitted = 0, accepted = 0, rejected = 0, mismatched = 0;
  for (int32_t vocab : {7, 64, 1000}) {
    for (int threads : {1, 3}) {
      for (size_t g = 0; g < grid.size(); ++g) {
        std::vector<Case> cases;
        for (int rep = 0; rep < 6; ++rep) {
          cases.push_back(MakeCase(rng, grid[g], vocab, 1 + rep % 4, 1000 * g + rep));
        }
        const std::vector<VerifyResult> got = RunBatch(cases, vocab, threads);
        ASSERT_EQ(got.size(), cases.size());
        for (size_t i = 0; i < cases.size(); ++i) {
          const VerifyResult want = Expected(cases[i], vocab);
          ExpectSame(want, got[i],
                     "vocab " + std::to_string(vocab) + " threads " + std::to_string(threads) +
                         " params " + std::to_string(g) + " case " + std::to_string(i));
          emitted += static_cast<int64_t>(want.tokens.size());
          accepted += want.num_accepted;
          rejected += want.num_accepted < want.num_drafted && !want.stopped;
          mismatched += want.proposal_mismatch;
        }
      }
    }
  }
  // The cases reach every branch of the chain.
  EXPECT_GT(accepted, 20);
  EXPECT_GT(rejected, 20);
  EXPECT_GT(mismatched, 2);
  EXPECT_GT(emitted, 200);
}

TEST(BlockwiseVerifyTest, ManyThreadsAndTheDefaultVocabulary) {
  std::mt19937 rng(7);
  const std::vector<SamplingParams> grid = ParamsGrid();
  for (size_t g : {size_t{0}, size_t{2}, size_t{5}, size_t{8}}) {
    std::vector<Case> cases = {MakeCase(rng, grid[g], 49152, 3, 77 + g)};
    const std::vector<VerifyResult> got = RunBatch(cases, 49152, 32);
    ASSERT_EQ(got.size(), 1u);
    ExpectSame(Expected(cases[0], 49152), got[0], "params " + std::to_string(g));
  }
}

TEST(BlockwiseVerifyTest, SeedsSweepGivesTheSameTokensAsTheCpu) {
  // One fixed row pair under many seeds: every accept / resample draw lands on the CPU's token.
  std::mt19937 rng(11);
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.9f;
  Case base = MakeCase(rng, p, 256, 2, 0);
  int differ = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    Case c = base;
    c.params.seed = seed;
    const std::vector<VerifyResult> got = RunBatch({c}, 256, 1);
    ASSERT_EQ(got.size(), 1u);
    const VerifyResult want = Expected(c, 256);
    differ += got[0].tokens != want.tokens;
  }
  EXPECT_EQ(differ, 0);
}

TEST(BlockwiseVerifyTest, RowErrorsOnlyWhereTheChainReachesThem) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const int32_t vocab = 16;
  Case c;
  c.params = greedy;
  c.eos = {};
  c.logits.assign(3 * vocab, 0.0f);
  c.logits[5] = 3.0f;  // row 0's argmax is 5
  SparseProposal d;
  d.token = 5;
  d.ids = {5};
  d.probs = {1.0f};
  c.proposals = {d, d};
  c.logits[vocab + 2] = std::numeric_limits<float>::quiet_NaN();  // row 1 is malformed
  {
    std::vector<float> logits = c.logits;
    SequenceToVerify s = ToSequence(c, 0);
    absl::StatusOr<BlockwisePlan> plan = BlockwisePlan::Build(vocab, {&s, 1});
    ASSERT_TRUE(plan.ok());
    absl::StatusOr<std::vector<VerifyResult>> got = VerifyBlockwiseOnHost(*plan, logits, 3);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find("row 1"), std::string::npos) << got.status();
    EXPECT_NE(got.status().message().find("logits[2]"), std::string::npos) << got.status();
  }
  // Draft 1 rejected at row 0: row 1 is never read, as on the CPU.
  c.proposals[0].token = 6;
  c.proposals[0].ids = {6};
  {
    SequenceToVerify s = ToSequence(c, 0);
    absl::StatusOr<BlockwisePlan> plan = BlockwisePlan::Build(vocab, {&s, 1});
    ASSERT_TRUE(plan.ok());
    absl::StatusOr<std::vector<VerifyResult>> got = VerifyBlockwiseOnHost(*plan, c.logits, 3);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ((*got)[0].tokens, std::vector<int32_t>({5}));
    ExpectSame(Expected(c, vocab), (*got)[0], "rejected before the bad row");
  }
  // Every logit masked.
  c.logits.assign(3 * vocab, -std::numeric_limits<float>::infinity());
  {
    SequenceToVerify s = ToSequence(c, 0);
    absl::StatusOr<BlockwisePlan> plan = BlockwisePlan::Build(vocab, {&s, 1});
    ASSERT_TRUE(plan.ok());
    absl::StatusOr<std::vector<VerifyResult>> got = VerifyBlockwiseOnHost(*plan, c.logits, 1);
    ASSERT_FALSE(got.ok());
    EXPECT_NE(got.status().message().find("every logit is -inf"), std::string::npos);
  }
}

TEST(BlockwiseVerifyTest, PlanNamesBadInput) {
  const int32_t vocab = 16;
  SamplingParams bad;
  bad.top_p = 0.0f;
  Case c;
  c.params = bad;
  c.logits.assign(vocab, 0.0f);
  SequenceToVerify s = ToSequence(c, 0);
  absl::StatusOr<BlockwisePlan> plan = BlockwisePlan::Build(vocab, {&s, 1});
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("top_p"), std::string::npos) << plan.status();

  c.params = SamplingParams();
  c.params.num_logprobs = 21;
  s = ToSequence(c, 0);
  plan = BlockwisePlan::Build(vocab, {&s, 1});
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("num_logprobs"), std::string::npos) << plan.status();

  c.params = SamplingParams();
  SparseProposal q;
  q.token = 3;
  q.ids = {3, 3};
  q.probs = {0.5f, 0.5f};
  c.proposals = {q};
  c.logits.assign(2 * vocab, 0.0f);
  s = ToSequence(c, 0);
  plan = BlockwisePlan::Build(vocab, {&s, 1});
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("sequence 0: proposals[0]"), std::string::npos)
      << plan.status();

  // The logits must hold every row the plan names.
  c.proposals.clear();
  s = ToSequence(c, 5);
  plan = BlockwisePlan::Build(vocab, {&s, 1});
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(VerifyBlockwiseOnHost(*plan, c.logits, 1).ok());
}

// Draft proposals where the draft's logits are (blockwise_propose.h) against the reference
// proposal: the same q (ids in the same order, probabilities within float rounding), the same
// drawn token, and DraftConfidence's value.
TEST(BlockwiseProposeTest, MatchesMakeProposalReference) {
  std::mt19937 rng(99);
  std::normal_distribution<float> normal(0.0f, 2.5f);
  const std::vector<SamplingParams> grid = ParamsGrid();
  int compared = 0;
  for (int32_t vocab : {5, 300, 49152}) {
    for (int32_t top_n : {1, 6, 32}) {
      for (int threads : {1, 3}) {
        if (vocab == 49152 && threads == 3 && top_n != 32) continue;  // time
        std::vector<float> logits;
        std::vector<SamplingParams> params;
        std::vector<PenaltyState> histories(grid.size());
        std::vector<SequenceToVerify> seqs;
        for (size_t g = 0; g < grid.size(); ++g) {
          params.push_back(grid[g]);
          params.back().seed = 7 * g + top_n;
          for (int32_t i = 0; i < vocab; ++i) {
            float v = normal(rng);
            if (g % 2 == 0) v = std::round(v * 2.0f) / 2.0f;  // ties
            logits.push_back(v);
          }
          histories[g].AddPrompt(static_cast<int32_t>(rng() % vocab));
          histories[g].AddGenerated(static_cast<int32_t>(rng() % vocab));
        }
        for (size_t g = 0; g < grid.size(); ++g) {
          SequenceToVerify s;
          s.params = &params[g];
          s.history = &histories[g];
          s.position = 30 + static_cast<int64_t>(g);
          s.first_logits_row = static_cast<int64_t>(g);
          seqs.push_back(s);
        }
        absl::StatusOr<BlockwisePlan> plan = BlockwisePlan::Build(vocab, seqs);
        ASSERT_TRUE(plan.ok()) << plan.status();
        absl::StatusOr<std::vector<BlockwiseProposal>> got =
            ProposeBlockwiseOnHost(*plan, logits, top_n, threads);
        ASSERT_TRUE(got.ok()) << got.status();
        ASSERT_EQ(got->size(), grid.size());
        for (size_t g = 0; g < grid.size(); ++g) {
          const std::string what = "vocab " + std::to_string(vocab) + " top_n " +
                                   std::to_string(top_n) + " params " + std::to_string(g);
          absl::Span<const float> row(logits.data() + g * vocab, vocab);
          absl::StatusOr<SparseProposal> want = MakeProposalReference(
              row, histories[g], params[g], top_n, CounterRng(params[g].seed), 30 + g);
          ASSERT_TRUE(want.ok()) << want.status();
          const BlockwiseProposal& p = (*got)[g];
          EXPECT_EQ(p.q.ids, want->ids) << what;
          EXPECT_EQ(p.q.token, want->token) << what;
          ASSERT_EQ(p.q.probs.size(), want->probs.size()) << what;
          for (size_t j = 0; j < p.q.probs.size(); ++j) {
            EXPECT_NEAR(p.q.probs[j], want->probs[j], 1e-6 * want->probs[j] + 1e-12) << what;
          }
          absl::StatusOr<double> conf =
              DraftConfidence(row, histories[g], params[g], top_n, *want);
          ASSERT_TRUE(conf.ok());
          EXPECT_NEAR(p.confidence, *conf, 1e-5) << what;
          ++compared;
        }
      }
    }
  }
  EXPECT_GT(compared, 100);
}

TEST(BlockwiseProposeTest, NamesBadInput) {
  SamplingParams p;
  std::vector<float> logits(8, 0.0f);
  logits[3] = std::numeric_limits<float>::quiet_NaN();
  SequenceToVerify s;
  s.params = &p;
  s.name = 12;
  absl::StatusOr<BlockwisePlan> plan = BlockwisePlan::Build(8, {&s, 1});
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(ProposeBlockwiseOnHost(*plan, logits, 0, 1).ok());
  absl::StatusOr<std::vector<BlockwiseProposal>> got = ProposeBlockwiseOnHost(*plan, logits, 4, 1);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("sequence 12: logits[3]"), std::string::npos)
      << got.status();
}

}  // namespace
}  // namespace specd::sampling
