// Speculative verification on the device (kernels/cuda/sampling.cu) against THE verifier,
// VerifyDraft: the same tokens, acceptances, stops and mismatches for the same counters, and
// logprobs within float rounding, for every transform, batched, at the default model's
// vocabulary. Needs a GPU: without one it prints NOT RUN and ctest reports it as skipped
// (label gpu), never as passed. The same algorithm runs on the host in blockwise_verify_test.
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/sampling/blockwise_verify_host.h"
#include "common/sampling/draft_proposal.h"
#include "gtest/gtest.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/rms_norm.h"
#include "testing/verify_cases.h"

namespace specd::sampling {
namespace {

using testing_cases::Batch;
using testing_cases::Case;
using testing_cases::ExpectSame;
using testing_cases::Expected;
using testing_cases::MakeCase;
using testing_cases::ParamsGrid;

#define SKIP_WITHOUT_DEVICE() \
  if (kernels::cuda::DeviceCount() == 0) GTEST_SKIP() << "NOT RUN: no CUDA device"

void ExpectDeviceMatchesCpu(const std::vector<Case>& cases, int32_t vocab,
                            const std::string& what) {
  const Batch batch(cases, vocab);
  absl::StatusOr<std::vector<VerifyResult>> got =
      kernels::cuda::VerifyBlockwiseHost(batch.plan, batch.logits.data(), batch.rows);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    ExpectSame(Expected(cases[i], vocab), (*got)[i], what + " case " + std::to_string(i));
  }
}

TEST(CudaSamplingTest, VerifyMatchesVerifyDraftForEveryTransform) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(2027);
  const std::vector<SamplingParams> grid = ParamsGrid();
  for (int32_t vocab : {7, 1000, 49152}) {
    std::vector<Case> cases;  // every transform in one step, as a real batch mixes them
    for (size_t g = 0; g < grid.size(); ++g) {
      for (int rep = 0; rep < 3; ++rep) {
        cases.push_back(MakeCase(rng, grid[g], vocab, 1 + (rep + g) % 5, 100 * g + rep));
      }
    }
    ExpectDeviceMatchesCpu(cases, vocab, "vocab " + std::to_string(vocab));
  }
}

TEST(CudaSamplingTest, SeedsSweepGivesTheCpuTokens) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(12);
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.9f;
  const Case base = MakeCase(rng, p, 4096, 3, 0);
  std::vector<Case> cases;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    cases.push_back(base);
    cases.back().params.seed = seed;
  }
  ExpectDeviceMatchesCpu(cases, 4096, "seed sweep");
}

TEST(CudaSamplingTest, MalformedRowIsNamed) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(5);
  std::vector<Case> cases = {MakeCase(rng, ParamsGrid()[2], 1000, 2, 1)};
  cases[0].logits[17] = std::numeric_limits<float>::quiet_NaN();
  const Batch batch(cases, 1000);
  absl::StatusOr<std::vector<VerifyResult>> got =
      kernels::cuda::VerifyBlockwiseHost(batch.plan, batch.logits.data(), batch.rows);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("logits[17]"), std::string::npos) << got.status();
}

// Draft proposals on the device against the reference proposal: the same q and token.
TEST(CudaSamplingTest, ProposalsMatchMakeProposalReference) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(31);
  std::normal_distribution<float> normal(0.0f, 2.5f);
  const std::vector<SamplingParams> grid = ParamsGrid();
  for (int32_t vocab : {5, 49152}) {
    for (int32_t top_n : {1, 32}) {
      std::vector<float> logits;
      std::vector<SamplingParams> params(grid);
      std::vector<PenaltyState> histories(grid.size());
      std::vector<SequenceToVerify> seqs(grid.size());
      for (size_t g = 0; g < grid.size(); ++g) {
        params[g].seed = 3 * g + 1;
        for (int32_t i = 0; i < vocab; ++i) logits.push_back(normal(rng));
        histories[g].AddGenerated(static_cast<int32_t>(rng() % vocab));
        seqs[g].params = &params[g];
        seqs[g].history = &histories[g];
        seqs[g].position = 11 + static_cast<int64_t>(g);
        seqs[g].first_logits_row = static_cast<int64_t>(g);
      }
      absl::StatusOr<BlockwisePlan> plan = BlockwisePlan::Build(vocab, seqs);
      ASSERT_TRUE(plan.ok()) << plan.status();
      absl::StatusOr<std::vector<BlockwiseProposal>> got = kernels::cuda::ProposeBlockwiseHost(
          *plan, logits.data(), static_cast<int64_t>(grid.size()), top_n);
      ASSERT_TRUE(got.ok()) << got.status();
      for (size_t g = 0; g < grid.size(); ++g) {
        absl::StatusOr<SparseProposal> want = MakeProposalReference(
            absl::MakeConstSpan(logits.data() + g * vocab, vocab), histories[g], params[g], top_n,
            CounterRng(params[g].seed), 11 + static_cast<int64_t>(g));
        ASSERT_TRUE(want.ok());
        EXPECT_EQ((*got)[g].q.ids, want->ids) << "vocab " << vocab << " params " << g;
        EXPECT_EQ((*got)[g].q.token, want->token) << "vocab " << vocab << " params " << g;
      }
    }
  }
}

}  // namespace
}  // namespace specd::sampling
