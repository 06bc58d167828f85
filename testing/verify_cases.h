// Random verification cases for the blockwise verifier's tests (host twin and CUDA): target
// rows with ties and masks, drafts from a noisy copy of each row (some accepted, some not, some
// outside their own q), every transform; and THE verifier's answer for each.
#ifndef SPECD_TESTING_VERIFY_CASES_H_
#define SPECD_TESTING_VERIFY_CASES_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/sampling/blockwise_verify_host.h"
#include "common/sampling/draft_proposal.h"
#include "common/sampling/penalty_state.h"
#include "common/sampling/speculative_verifier.h"
#include "gtest/gtest.h"

namespace specd::sampling::testing_cases {

// One sequence's inputs, owned.
struct Case {
  SamplingParams params;
  PenaltyState history;
  std::vector<SparseProposal> proposals;
  int64_t position = 0;
  std::vector<int32_t> eos;
  std::vector<float> logits;  // [(k + 1) * vocab]
};

inline std::vector<SamplingParams> ParamsGrid() {
  std::vector<SamplingParams> grid;
  auto add = [&](float t, int32_t top_k, float top_p, float min_p, float rep, float pres,
                 float freq) {
    SamplingParams p;
    p.temperature = t;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.repetition_penalty = rep;
    p.presence_penalty = pres;
    p.frequency_penalty = freq;
    grid.push_back(p);
  };
  add(0.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);    // greedy
  add(0.0f, 0, 1.0f, 0.0f, 1.3f, 0.5f, 0.2f);    // greedy with penalties
  add(1.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);    // plain sampling: dense p
  add(0.7f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
  add(1.0f, 5, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);    // top-k
  add(1.0f, 0, 0.8f, 0.0f, 1.0f, 0.0f, 0.0f);    // top-p
  add(1.3f, 0, 0.3f, 0.0f, 1.0f, 0.0f, 0.0f);
  add(1.0f, 0, 1.0f, 0.1f, 1.0f, 0.0f, 0.0f);    // min-p
  add(0.8f, 40, 0.9f, 0.05f, 1.1f, 0.3f, 0.1f);  // everything at once
  add(2.0f, 3, 0.95f, 0.0f, 0.8f, -0.5f, 0.0f);  // penalties that raise logits
  grid[0].num_logprobs = 2;  // top logprobs: greedy, sampled, all 20
  grid[5].num_logprobs = 5;
  grid[8].num_logprobs = 20;
  return grid;
}

// A target row with ties (logits on a grid) and masked tokens; the draft's row is the target's
// plus noise so that some drafts are accepted and some are not.
inline Case MakeCase(std::mt19937& rng, const SamplingParams& params, int32_t vocab, int k,
              uint64_t seed) {
  Case c;
  c.params = params;
  c.params.seed = seed;
  c.position = 17 + static_cast<int64_t>(rng() % 100);
  c.eos = {vocab - 1};
  std::normal_distribution<float> normal(0.0f, 2.5f);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  const bool grid = rng() % 2 == 0;
  const bool masks = rng() % 3 == 0;
  c.logits.resize(static_cast<size_t>(k + 1) * vocab);
  for (float& v : c.logits) {
    v = normal(rng);
    if (grid) v = std::round(v * 2.0f) / 2.0f;  // many exact ties
    if (masks && rng() % 5 == 0) v = -std::numeric_limits<float>::infinity();
  }
  for (int i = 0; i < 6; ++i) c.history.AddPrompt(token(rng));
  for (int i = 0; i < 4; ++i) c.history.AddGenerated(token(rng));
  SamplingParams draft_params = c.params;
  draft_params.top_k = 0;
  draft_params.top_p = 1.0f;
  draft_params.min_p = 0.0f;
  for (int i = 0; i < k; ++i) {
    std::vector<float> draft_row(c.logits.begin() + static_cast<size_t>(i) * vocab,
                                 c.logits.begin() + static_cast<size_t>(i + 1) * vocab);
    for (float& v : draft_row) {
      if (std::isfinite(v)) v += normal(rng) * 0.4f;
    }
    absl::StatusOr<SparseProposal> q =
        MakeProposal(draft_row, c.history, draft_params, 8, CounterRng(seed ^ 0x5eed), c.position + i);
    EXPECT_TRUE(q.ok()) << q.status();
    if (rng() % 11 == 0 && q->ids.size() < static_cast<size_t>(vocab)) {
      // A drafter that broke its contract: d outside q (the verifier's mismatch path).
      int32_t outside = token(rng);
      while (std::find(q->ids.begin(), q->ids.end(), outside) != q->ids.end()) {
        outside = (outside + 1) % vocab;
      }
      q->token = outside;
    }
    c.proposals.push_back(*q);
  }
  return c;
}

inline SequenceToVerify ToSequence(const Case& c, int64_t first_row) {
  SequenceToVerify s;
  s.params = &c.params;
  s.history = &c.history;
  s.proposals = c.proposals;
  s.position = c.position;
  s.eos_token_ids = c.eos;
  s.first_logits_row = first_row;
  return s;
}

inline VerifyResult Expected(const Case& c, int32_t vocab) {
  VerifyInput in;
  in.target_logits = c.logits;
  in.vocab_size = vocab;
  in.proposals = c.proposals;
  in.history = &c.history;
  in.position = c.position;
  in.eos_token_ids = c.eos;
  absl::StatusOr<VerifyResult> r = VerifyDraft(c.params, CounterRng(c.params.seed), in);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : VerifyResult();
}

inline void ExpectSame(const VerifyResult& want, const VerifyResult& got, const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  EXPECT_EQ(got.num_accepted, want.num_accepted) << what;
  EXPECT_EQ(got.num_drafted, want.num_drafted) << what;
  EXPECT_EQ(got.accepted, want.accepted) << what;
  EXPECT_EQ(got.stopped, want.stopped) << what;
  EXPECT_EQ(got.proposal_mismatch, want.proposal_mismatch) << what;
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << what;
  for (size_t i = 0; i < got.logprobs.size(); ++i) {
    EXPECT_NEAR(got.logprobs[i], want.logprobs[i], 2e-5) << what << " logprob " << i;
  }
  ASSERT_EQ(got.top_logprobs.size(), want.top_logprobs.size()) << what;
  for (size_t i = 0; i < got.top_logprobs.size(); ++i) {
    ASSERT_EQ(got.top_logprobs[i].size(), want.top_logprobs[i].size()) << what << " top " << i;
    for (size_t m = 0; m < got.top_logprobs[i].size(); ++m) {
      EXPECT_EQ(got.top_logprobs[i][m].token, want.top_logprobs[i][m].token)
          << what << " top " << i << "." << m;
      const float g = got.top_logprobs[i][m].logprob, w = want.top_logprobs[i][m].logprob;
      if (g != w) {  // equal covers -inf == -inf
        EXPECT_NEAR(g, w, 2e-5) << what << " top " << i << "." << m;
      }
    }
  }
}

// Cases verified as one step: rows concatenated in order, one plan.
struct Batch {
  Batch(const std::vector<Case>& cases, int32_t vocab) {
    std::vector<SequenceToVerify> seqs;
    for (const Case& c : cases) {
      seqs.push_back(ToSequence(c, static_cast<int64_t>(logits.size() / vocab)));
      logits.insert(logits.end(), c.logits.begin(), c.logits.end());
    }
    absl::StatusOr<BlockwisePlan> built = BlockwisePlan::Build(vocab, seqs);
    EXPECT_TRUE(built.ok()) << built.status();
    if (built.ok()) plan = std::move(*built);
    rows = static_cast<int64_t>(logits.size() / vocab);
  }
  std::vector<float> logits;  // [rows, vocab]
  int64_t rows = 0;
  BlockwisePlan plan;
};

}  // namespace specd::sampling::testing_cases

#endif  // SPECD_TESTING_VERIFY_CASES_H_
