// THE speculation loop (speculation/spec_loop.h) without a model: a fake target whose greedy
// next token is a fixed function of the previous one, and fake drafters that guess it right,
// wrong, or fail. Each test runs whole requests through the loop's steps and checks what the
// in-process engine and the router both rely on: committed tokens, KV positions, rollback,
// re-prefill, preemption, releases, and what the owner decides.
#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "speculation/spec_loop.h"

namespace specd::spec {
namespace {

constexpr int32_t kVocab = 97;
int32_t Next(int32_t t) { return (t * 7 + 3) % kVocab; }

// Greedy "target": emits the accepted prefix of the drafts that follow Next(), then Next() of the
// last accepted token. Holds each sequence's KV length; a lost sequence answers needs_prefill.
class FakeTarget final : public TargetExecutor {
 public:
  absl::Status Run(absl::Span<const TargetCall> calls, std::vector<TargetOutcome>& out) override {
    ++steps;
    if (!fail_next.ok()) {
      absl::Status st = fail_next;
      fail_next = absl::OkStatus();
      return st;
    }
    out.assign(calls.size(), TargetOutcome{});
    for (size_t i = 0; i < calls.size(); ++i) {
      const TargetCall& c = calls[i];
      const int64_t held = kv.contains(c.seq) ? kv[c.seq] : 0;
      if (c.start > held) {
        out[i].needs_prefill = true;
        kv.erase(c.seq);
        continue;
      }
      int64_t len = c.start + static_cast<int64_t>(c.tokens.size());
      if (c.emit) {
        sampling::VerifyResult& v = out[i].verified;
        v.num_drafted = static_cast<int32_t>(c.proposals.size());
        int32_t prev = c.tokens.back();
        for (const sampling::SparseProposal& q : c.proposals) {
          const bool ok = q.token == Next(prev) && v.num_accepted == v.tokens.size();
          v.accepted.push_back(ok);
          if (!ok) break;
          v.tokens.push_back(q.token);
          v.logprobs.push_back(0.0f);
          ++v.num_accepted;
          prev = q.token;
        }
        v.accepted.resize(c.proposals.size(), false);
        v.tokens.push_back(Next(prev));
        v.logprobs.push_back(0.0f);
        len += v.num_accepted;
      }
      kv[c.seq] = len;
    }
    return absl::OkStatus();
  }
  void Release(absl::Span<const SeqId> seqs) override {
    for (SeqId s : seqs) {
      kv.erase(s);
      released.push_back(s);
    }
  }

  std::map<SeqId, int64_t> kv;
  std::vector<SeqId> released;
  absl::Status fail_next;
  int steps = 0;
};

enum class Guess { kRight, kWrong, kFail };

class FakeDrafter final : public Drafter {
 public:
  explicit FakeDrafter(Guess g) : guess(g) {}
  std::string_view name() const override { return "fake"; }
  absl::Status Propose(absl::Span<const DraftInput> in, absl::Span<DraftOutput> out) override {
    ++proposes;
    if (guess == Guess::kFail) return absl::UnavailableError("draft service down");
    for (size_t i = 0; i < in.size(); ++i) {
      int32_t prev = in[i].tokens.back();
      for (int32_t j = 0; j < in[i].max_tokens; ++j) {
        const int32_t t = guess == Guess::kRight ? Next(prev) : (Next(prev) + 1) % kVocab;
        out[i].proposals.push_back(sampling::SparseProposal{t, {t}, {1.0f}});
        prev = t;
      }
      fed[in[i].seq] = static_cast<int64_t>(in[i].tokens.size());
    }
    return absl::OkStatus();
  }
  absl::Status Commit(SeqId seq, absl::Span<const int32_t> committed) override {
    commits[seq].assign(committed.begin(), committed.end());
    return absl::OkStatus();
  }
  void Release(SeqId seq) override {
    fed.erase(seq);
    released.push_back(seq);
  }
  bool runs_model() const override { return false; }
  int64_t CachedLength(SeqId seq) const override {
    auto it = fed.find(seq);
    return it == fed.end() ? -1 : it->second;
  }

  Guess guess;
  int proposes = 0;
  std::map<SeqId, int64_t> fed;
  std::map<SeqId, std::vector<int32_t>> commits;
  std::vector<SeqId> released;
};

// Takes everything (or `take_limit` tokens) and finishes at max_new_tokens.
class TakeAll final : public LoopClient {
 public:
  Emission OnVerified(LoopSeq& s, const sampling::VerifyResult& v, int32_t drafted) override {
    Emission e;
    e.take = std::min<int32_t>(static_cast<int32_t>(v.tokens.size()), take_limit);
    e.take = std::min(e.take, s.max_new_tokens - s.generated());
    e.finished = stop_now || s.generated() + e.take >= s.max_new_tokens;
    drafted_seen += drafted;
    return e;
  }
  int32_t take_limit = 1 << 20;
  bool stop_now = false;
  int64_t drafted_seen = 0;
};

// Steps until the queues are empty (at most 1000 steps); returns how many ran.
int RunLoop(SpecLoop& loop, const SchedulerConfig& config, LoopClient& client) {
  int steps = 0;
  while (!loop.running().empty() || !loop.waiting().empty()) {
    LoopStep step;
    EXPECT_TRUE(loop.RunStep(config, client, step).ok());
    if (++steps > 1000) break;
  }
  return steps;
}

// The tests' scheduler: 64 tokens and 8 sequences a step, blocks of 4; `draft_blocks` of draft
// KV (0: only drafters without a model).
SchedulerConfig TestConfig(int32_t draft_blocks = 0) {
  SchedulerConfig config;
  config.max_batch_tokens = 64;
  config.max_running = 8;
  config.block_size = 4;
  config.target_blocks = 1024;
  config.draft_blocks = draft_blocks;
  return config;
}

// A greedy request with fixed k, queued on `loop` (drafter 0; none when k is 0).
LoopSeqPtr EnqueueFixedK(SpecLoop& loop, SeqId id, std::vector<int32_t> prompt,
                         int32_t new_tokens, int32_t k) {
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  auto s = std::make_shared<LoopSeq>(id, std::move(prompt), greedy);
  s->max_new_tokens = new_tokens;
  s->drafter = k > 0 ? 0 : -1;
  s->max_k = k;
  s->fixed_k = true;
  loop.Enqueue(s);
  return s;
}

struct Fixture {
  Fixture(Guess g, LoopOptions o = {}) : drafter(g) {
    o.context_length = o.context_length > 0 ? o.context_length : 4096;
    KPolicyOptions ko;
    ko.max_k = 4;
    loop = std::make_unique<SpecLoop>(o, &target,
                                      std::vector<LoopDrafter>{{&drafter, KPolicy(ko), true}});
  }
  LoopSeqPtr Add(SeqId id, std::vector<int32_t> prompt, int32_t new_tokens, int32_t k = 3) {
    return EnqueueFixedK(*loop, id, std::move(prompt), new_tokens, k);
  }
  int RunAll(LoopClient& client) { return RunLoop(*loop, config, client); }
  FakeTarget target;
  FakeDrafter drafter;
  std::unique_ptr<SpecLoop> loop;
  SchedulerConfig config = TestConfig();
};

// The tokens a request must commit: the prompt, then Next() chained from its last token.
std::vector<int32_t> Expected(std::vector<int32_t> prompt, int32_t new_tokens) {
  for (int32_t i = 0; i < new_tokens; ++i) prompt.push_back(Next(prompt.back()));
  return prompt;
}

TEST(SpecLoopTest, RightDraftsCommitTheTargetsTokensInFewerSteps) {
  Fixture f(Guess::kRight);
  LoopSeqPtr a = f.Add(1, {5, 6, 7}, 20);
  LoopSeqPtr b = f.Add(2, {9}, 13);
  TakeAll client;
  const int steps = f.RunAll(client);
  EXPECT_EQ(a->tokens, Expected({5, 6, 7}, 20));
  EXPECT_EQ(b->tokens, Expected({9}, 13));
  // Prefill emits the first token; then 4 tokens per step (3 accepted drafts + the bonus).
  EXPECT_LE(steps, 1 + (19 + 3) / 4 + 1);
  EXPECT_EQ(a->accepted, a->drafted);
  EXPECT_GT(a->drafted, 0);
  // Finished: freed on the target and the drafter, exactly once each.
  std::vector<SeqId> released = f.target.released;
  std::sort(released.begin(), released.end());
  EXPECT_EQ(released, (std::vector<SeqId>{1, 2}));
  EXPECT_TRUE(f.target.kv.empty());
  EXPECT_EQ(f.drafter.released.size(), 2u);
}

TEST(SpecLoopTest, WrongDraftsAreRejectedAndTheDrafterRollsBackToTheCommit) {
  Fixture f(Guess::kWrong);
  LoopSeqPtr a = f.Add(1, {3, 4}, 10);
  TakeAll client;
  int steps = 0;
  while (!f.loop->running().empty() || !f.loop->waiting().empty()) {
    LoopStep step;
    ASSERT_TRUE(f.loop->RunStep(f.config, client, step).ok());
    ++steps;
    if (!f.loop->running().empty()) {
      // After every step the target holds all but the last committed token, and the drafter
      // was told exactly what was committed.
      EXPECT_EQ(f.target.kv[1], a->n() - 1);
      EXPECT_EQ(a->target_pos, a->n() - 1);
      if (a->drafted > 0) {
        EXPECT_EQ(f.drafter.commits[1], a->tokens);
      }
    }
  }
  EXPECT_EQ(a->tokens, Expected({3, 4}, 10));
  EXPECT_EQ(a->accepted, 0);
  EXPECT_GT(a->drafted, 0);
  EXPECT_EQ(steps, 10);  // one token per step: the drafts never help
}

TEST(SpecLoopTest, ALostSequenceIsRecomputedFromItsHistory) {
  Fixture f(Guess::kRight);
  LoopSeqPtr a = f.Add(1, {1, 2, 3, 4}, 16);
  TakeAll client;
  for (int i = 0; i < 3; ++i) {
    LoopStep step;
    ASSERT_TRUE(f.loop->RunStep(f.config, client, step).ok());
  }
  const int32_t before = a->n();
  f.target.kv.erase(1);  // the target restarted
  LoopStep lost;
  ASSERT_TRUE(f.loop->RunStep(f.config, client, lost).ok());
  EXPECT_EQ(a->n(), before) << "nothing is committed from a step the target did not run";
  EXPECT_EQ(a->target_pos, 0);
  LoopStep again;
  ASSERT_TRUE(f.loop->RunStep(f.config, client, again).ok());
  ASSERT_EQ(again.sched.plans.size(), 1u);
  EXPECT_EQ(again.sched.plans[0].start, 0) << "the whole history is sent again";
  f.RunAll(client);
  EXPECT_EQ(a->tokens, Expected({1, 2, 3, 4}, 16));
}

TEST(SpecLoopTest, AFailingDrafterOnlyDropsDraftsUnlessItMustFailTheStep) {
  {
    LoopOptions o;
    o.draft_errors_fail_step = false;  // the router
    Fixture f(Guess::kFail, o);
    LoopSeqPtr a = f.Add(1, {8}, 6);
    TakeAll client;
    LoopStep prefill, step;
    ASSERT_TRUE(f.loop->RunStep(f.config, client, prefill).ok());
    ASSERT_TRUE(f.loop->RunStep(f.config, client, step).ok());
    EXPECT_EQ(step.draft_error.code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(step.draft_index, 0);
    EXPECT_EQ(step.sched.plans[0].k, 0) << "the step ran without drafts";
    EXPECT_EQ(a->n(), 3);
    f.RunAll(client);
    EXPECT_EQ(a->tokens, Expected({8}, 6));
    EXPECT_EQ(a->drafted, 0);
  }
  {
    Fixture f(Guess::kFail);  // the in-process engine: a drafter error is the engine's
    f.Add(1, {8}, 6);
    TakeAll client;
    LoopStep prefill, step;
    ASSERT_TRUE(f.loop->RunStep(f.config, client, prefill).ok());
    EXPECT_EQ(f.loop->RunStep(f.config, client, step).code(), absl::StatusCode::kUnavailable);
  }
}

TEST(SpecLoopTest, AnUnavailableDrafterIsNotAskedAndItsSequencesDecodePlainly) {
  Fixture f(Guess::kRight);
  f.loop->drafters()[0].available = false;
  LoopSeqPtr a = f.Add(1, {2}, 5);
  TakeAll client;
  f.RunAll(client);
  EXPECT_EQ(a->tokens, Expected({2}, 5));
  EXPECT_EQ(f.drafter.proposes, 0);
  EXPECT_EQ(a->drafted, 0);
}

TEST(SpecLoopTest, PreemptionReleasesTheKvAndRecomputesWithTheSameOutput) {
  Fixture f(Guess::kRight);
  f.config.target_blocks = 7;  // two requests of 4 + 14 tokens need 5 blocks each
  LoopSeqPtr a = f.Add(1, {1, 2, 3, 4}, 14, /*k=*/0);
  LoopSeqPtr b = f.Add(2, {5, 6, 7, 8}, 14, /*k=*/0);
  TakeAll client;
  f.RunAll(client);
  EXPECT_GT(f.loop->stats().preemptions, 0);
  EXPECT_EQ(a->tokens, Expected({1, 2, 3, 4}, 14));
  EXPECT_EQ(b->tokens, Expected({5, 6, 7, 8}, 14));
  // Released once per preemption and once at the end.
  EXPECT_EQ(static_cast<int64_t>(f.target.released.size()), 2 + f.loop->stats().preemptions);
  EXPECT_TRUE(f.target.kv.empty());
}

TEST(SpecLoopTest, TheOwnerDecidesHowManyTokensToTakeAndWhenToStop) {
  Fixture f(Guess::kRight);
  LoopSeqPtr a = f.Add(1, {4}, 50);
  TakeAll client;
  LoopStep prefill, step;
  ASSERT_TRUE(f.loop->RunStep(f.config, client, prefill).ok());
  client.take_limit = 2;  // e.g. a stop string matched at the second token
  client.stop_now = true;
  ASSERT_TRUE(f.loop->RunStep(f.config, client, step).ok());
  EXPECT_EQ(a->n(), 1 + 1 + 2);
  ASSERT_EQ(step.finished.size(), 1u);
  EXPECT_TRUE(step.finish_status[0].ok());
  EXPECT_TRUE(f.loop->running().empty());
  EXPECT_EQ(f.target.released, (std::vector<SeqId>{1}));
  EXPECT_EQ(f.loop->Find(1), nullptr);
}

// The router's cost metrics read these: the step's rows by kind and its price before it ran.
TEST(SpecLoopTest, EachTargetStepIsPricedBeforeItRunsAndCountsItsRows) {
  Fixture f(Guess::kRight);
  TakeAll client;
  f.Add(1, {1, 2, 3, 4, 5, 6, 7, 8}, 20, /*k=*/2);
  LoopStep unpriced;
  ASSERT_TRUE(f.loop->RunStep(f.config, client, unpriced).ok());
  EXPECT_EQ(unpriced.target_predicted_seconds, 0.0);  // no policy has a curve
  EXPECT_EQ(unpriced.prefill_tokens, 7);  // the prompt but its last token, which emits
  EXPECT_EQ(unpriced.decode_rows, 0);

  // A step of one decode row (1 + k tokens at depth 9) and a new prompt chunk of 5 tokens.
  KPolicyOptions ko;
  ko.max_k = 4;
  ko.verify_cost = CostCurve({{1, 0.010}, {64, 0.030}});
  ko.verify_cost.set_depth(DepthCost{1e-5, 1e-6});
  ko.track_load = false;
  SpecLoop priced(LoopOptions{.context_length = 4096}, &f.target,
                  std::vector<LoopDrafter>{{&f.drafter, KPolicy(ko), true}});
  EnqueueFixedK(priced, 2, {1, 2, 3, 4, 5, 6, 7, 8}, 20, 2);
  LoopStep prefill;
  ASSERT_TRUE(priced.RunStep(f.config, client, prefill).ok());
  EnqueueFixedK(priced, 3, {9, 10, 11, 12, 13, 14}, 20, 2);
  LoopStep mixed;
  ASSERT_TRUE(priced.RunStep(f.config, client, mixed).ok());
  ASSERT_EQ(mixed.sched.plans.size(), 2u);
  EXPECT_EQ(mixed.decode_rows, 1);
  EXPECT_EQ(mixed.prefill_tokens, 5);
  StepContext expected;
  for (const SeqPlan& p : mixed.sched.plans) p.AddTo(expected);
  EXPECT_GT(mixed.target_predicted_seconds, ko.verify_cost.Predict(mixed.step_tokens));  // depth
  EXPECT_DOUBLE_EQ(mixed.target_predicted_seconds,
                   ko.verify_cost.Predict(static_cast<double>(mixed.step_tokens), expected));
}

// A model drafter whose cache a test sets: CachedLength is what it holds of each sequence.
class HeldDrafter final : public Drafter {
 public:
  std::string_view name() const override { return "held"; }
  absl::Status Propose(absl::Span<const DraftInput> in, absl::Span<DraftOutput> out) override {
    for (size_t i = 0; i < in.size(); ++i) {
      int32_t prev = in[i].tokens.back();
      for (int32_t j = 0; j < in[i].max_tokens; ++j) {
        prev = Next(prev);
        out[i].proposals.push_back(sampling::SparseProposal{prev, {prev}, {1.0f}});
      }
    }
    return absl::OkStatus();
  }
  absl::Status Commit(SeqId, absl::Span<const int32_t>) override { return absl::OkStatus(); }
  void Release(SeqId) override {}
  bool runs_model() const override { return true; }
  int64_t CachedLength(SeqId seq) const override {
    auto it = held.find(seq);
    return it == held.end() ? -1 : it->second;
  }
  std::map<SeqId, int64_t> held;
};

// Each draft step is priced before the policy learns from it: its rounds at the sequence's
// context, plus the catch-up on what the drafter does not hold (its rows past round 1's one);
// a catch-up longer than KPolicy::kMaxPricedCatchUp is a prefill, not priced.
TEST(SpecLoopTest, EachDraftStepIsPricedWithItsCatchUp) {
  FakeTarget target;
  HeldDrafter drafter;
  KPolicyOptions ko;
  ko.max_k = 4;
  ko.verify_cost = CostCurve({{1, 0.010}, {64, 0.030}});
  ko.draft_cost = CostCurve({{1, 0.001}, {16, 0.004}});
  ko.draft_cost.set_depth(DepthCost{1e-6, 0.0});
  ko.track_load = false;
  const KPolicy policy(ko);
  SpecLoop loop(LoopOptions{.context_length = 4096}, &target,
                std::vector<LoopDrafter>{{&drafter, policy, true}});
  const SchedulerConfig config = TestConfig(/*draft_blocks=*/1024);  // a model drafter's KV
  const LoopSeqPtr s = EnqueueFixedK(loop, 1, std::vector<int32_t>(40, 5), 200, 2);
  TakeAll client;
  LoopStep prefill;
  ASSERT_TRUE(loop.RunStep(config, client, prefill).ok());
  // behind: 1 (the drafter holds all but x_n), 5, the longest priced, one past it.
  for (const int32_t behind : {1, 5, KPolicy::kMaxPricedCatchUp, KPolicy::kMaxPricedCatchUp + 1}) {
    drafter.held[1] = s->n() - behind;
    const std::vector<int32_t> context = {s->n() - 1};
    LoopStep step;
    ASSERT_TRUE(loop.RunStep(config, client, step).ok());
    ASSERT_EQ(step.sched.plans.size(), 1u);
    ASSERT_EQ(step.sched.plans[0].k, 2);
    const double rounds = DraftRoundsCost(ko.draft_cost, {2}, context);
    const double catch_up =
        ko.draft_cost.Predict(1) * (ko.verify_cost.Predict(behind) / ko.verify_cost.Predict(1) - 1);
    if (behind > KPolicy::kMaxPricedCatchUp) {
      EXPECT_EQ(step.draft_predicted_seconds, 0.0);
    } else {
      EXPECT_NEAR(step.draft_predicted_seconds, rounds + catch_up, 1e-12) << behind;
    }
    if (behind == 1) {
      EXPECT_GT(rounds, DraftRoundsCost(ko.draft_cost, {2}));  // the context's price
    }
  }
}

TEST(SpecLoopTest, ATargetErrorEndsTheStepAndCommitsNothing) {
  Fixture f(Guess::kRight);
  LoopSeqPtr a = f.Add(1, {4}, 8);
  TakeAll client;
  LoopStep prefill;
  ASSERT_TRUE(f.loop->RunStep(f.config, client, prefill).ok());
  const std::vector<int32_t> before = a->tokens;
  f.target.fail_next = absl::ResourceExhaustedError("kv full");
  LoopStep step;
  EXPECT_EQ(f.loop->RunStep(f.config, client, step).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a->tokens, before);
  f.RunAll(client);
  EXPECT_EQ(a->tokens, Expected({4}, 8));
}

// A free lookup drafter (the n-gram one's part): after a sequence's last token, its match is
// `match_length(last)` tokens long (0: none), and it guesses right or wrong.
class FakeLookup final : public Drafter {
 public:
  FakeLookup(Guess g, std::function<int32_t(int32_t last)> m)
      : guess(g), match_length(std::move(m)) {}
  std::string_view name() const override { return "lookup"; }
  bool HasProposal(absl::Span<const int32_t> tokens, int32_t min_match) const override {
    const int32_t len = match_length(tokens.back());
    return len > 0 && len >= min_match;
  }
  absl::Status Propose(absl::Span<const DraftInput> in, absl::Span<DraftOutput> out) override {
    for (size_t i = 0; i < in.size(); ++i) {
      last_seen.push_back(in[i].tokens.back());
      int32_t prev = in[i].tokens.back();
      for (int32_t j = 0; j < in[i].max_tokens; ++j) {
        const int32_t t = guess == Guess::kRight ? Next(prev) : (Next(prev) + 1) % kVocab;
        out[i].proposals.push_back(sampling::SparseProposal{t, {t}, {1.0f}});
        prev = t;
      }
    }
    return absl::OkStatus();
  }
  absl::Status Commit(SeqId, absl::Span<const int32_t>) override { return absl::OkStatus(); }
  void Release(SeqId) override {}
  bool runs_model() const override { return false; }

  Guess guess;
  std::function<int32_t(int32_t)> match_length;
  std::vector<int32_t> last_seen;  // the last token of every sequence it drafted for
};

// A model drafter that records the last token of what it drafted from.
class RecordingDrafter final : public Drafter {
 public:
  std::string_view name() const override { return "model"; }
  absl::Status Propose(absl::Span<const DraftInput> in, absl::Span<DraftOutput> out) override {
    for (size_t i = 0; i < in.size(); ++i) {
      last_seen.push_back(in[i].tokens.back());
      int32_t prev = in[i].tokens.back();
      for (int32_t j = 0; j < in[i].max_tokens; ++j) {
        const int32_t t = Next(prev);
        out[i].proposals.push_back(sampling::SparseProposal{t, {t}, {1.0f}});
        prev = t;
      }
      fed[in[i].seq] = static_cast<int64_t>(in[i].tokens.size());
    }
    return absl::OkStatus();
  }
  absl::Status Commit(SeqId, absl::Span<const int32_t>) override { return absl::OkStatus(); }
  void Release(SeqId seq) override { fed.erase(seq); }
  bool runs_model() const override { return true; }
  int64_t CachedLength(SeqId seq) const override {
    auto it = fed.find(seq);
    return it == fed.end() ? -1 : it->second;
  }
  std::vector<int32_t> last_seen;
  std::map<SeqId, int64_t> fed;
};

// Speculation "auto": per step, the lookup drafts where it has a match and its policy drafts,
// the sequence's own drafter everywhere else. Both policies are adaptive (no fixed k).
struct AutoFixture {
  AutoFixture(Guess lookup_guess, std::function<int32_t(int32_t)> match_length)
      : lookup(lookup_guess, std::move(match_length)) {
    LoopOptions o;
    o.context_length = 4096;
    KPolicyOptions ko;
    ko.max_k = 4;
    ko.track_load = false;
    ko.verify_cost = CostCurve({{1, 1.0}, {5, 1.2}});
    KPolicyOptions model = ko;
    model.draft_cost = CostCurve({{1, 0.05}});  // cheap: a right draft pays at any k
    loop = std::make_unique<SpecLoop>(
        o, &target,
        std::vector<LoopDrafter>{{&drafter, KPolicy(model), true}, {&lookup, KPolicy(ko), true}});
    config.max_batch_tokens = 64;
    config.max_running = 8;
    config.block_size = 4;
    config.target_blocks = 1024;
    config.draft_blocks = 1024;  // the model drafter's KV
  }
  LoopSeqPtr Add(SeqId id, std::vector<int32_t> prompt, int32_t new_tokens) {
    sampling::SamplingParams greedy;
    greedy.temperature = 0.0f;
    auto s = std::make_shared<LoopSeq>(id, std::move(prompt), greedy);
    s->max_new_tokens = new_tokens;
    s->drafter = 0;
    s->lookup = 1;
    s->max_k = 4;
    loop->Enqueue(s);
    return s;
  }
  int RunAll(LoopClient& client) { return RunLoop(*loop, config, client); }
  FakeTarget target;
  RecordingDrafter drafter;
  FakeLookup lookup;
  std::unique_ptr<SpecLoop> loop;
  SchedulerConfig config;
};

TEST(SpecLoopTest, AutoDraftsFromTheLookupWhereItHasAMatchAndFromTheDrafterElsewhere) {
  // Matches after even tokens only.
  AutoFixture f(Guess::kRight, [](int32_t last) { return last % 2 == 0 ? 4 : 0; });
  LoopSeqPtr a = f.Add(1, {4, 9}, 120);
  TakeAll client;
  const int steps = f.RunAll(client);
  EXPECT_EQ(a->tokens, Expected({4, 9}, 120));
  ASSERT_FALSE(f.lookup.last_seen.empty());
  ASSERT_FALSE(f.drafter.last_seen.empty());
  for (int32_t t : f.lookup.last_seen) EXPECT_EQ(t % 2, 0) << "the lookup drafts only on a match";
  for (int32_t t : f.drafter.last_seen) {
    EXPECT_EQ(t % 2, 1) << "where the lookup matched and drafted, the draft model did not";
  }
  EXPECT_EQ(a->accepted, a->drafted);  // both right
  EXPECT_LT(steps, 120 / 2);
}

TEST(SpecLoopTest, AutoGivesAMissingLookupUpForTheDrafter) {
  AutoFixture f(Guess::kWrong, [](int32_t) { return 4; });  // always a match, always wrong
  LoopSeqPtr a = f.Add(1, {4, 9}, 200);
  TakeAll client;
  const int steps = f.RunAll(client);
  EXPECT_EQ(a->tokens, Expected({4, 9}, 200));
  EXPECT_LT(steps, 200 / 2);
  // The lookup's policy learns it is never right and only probes now and then; the draft
  // model, always right, drafts the rest.
  EXPECT_LE(f.lookup.last_seen.size(), 20u);
  EXPECT_GT(f.drafter.last_seen.size(), 20u);
  EXPECT_GT(a->accepted, 100);
}

// A 1-token match is left to the sequence's own drafter (LoopOptions::lookup_min_match), and a
// lookup with no drafter beside it takes any match.
TEST(SpecLoopTest, AutoLeavesOneTokenMatchesToTheDrafter) {
  // 1-token matches after even tokens, 2-token matches after odd ones.
  const auto length = [](int32_t last) { return last % 2 == 0 ? 1 : 2; };
  {
    AutoFixture f(Guess::kRight, length);
    LoopSeqPtr a = f.Add(1, {4, 9}, 120);
    TakeAll client;
    f.RunAll(client);
    EXPECT_EQ(a->tokens, Expected({4, 9}, 120));
    ASSERT_FALSE(f.lookup.last_seen.empty());
    ASSERT_FALSE(f.drafter.last_seen.empty());
    for (int32_t t : f.lookup.last_seen) EXPECT_EQ(t % 2, 1) << "a 1-token match: the drafter's";
    for (int32_t t : f.drafter.last_seen) EXPECT_EQ(t % 2, 0);
  }
  {
    AutoFixture f(Guess::kRight, length);
    LoopSeqPtr a = f.Add(1, {4, 9}, 120);
    a->drafter = -1;  // no draft model (the router without a draft service)
    TakeAll client;
    f.RunAll(client);
    EXPECT_EQ(a->tokens, Expected({4, 9}, 120));
    EXPECT_TRUE(f.drafter.last_seen.empty());
    int even = 0;
    for (int32_t t : f.lookup.last_seen) even += t % 2 == 0 ? 1 : 0;
    EXPECT_GT(even, 0) << "alone, the lookup drafts after 1-token matches too";
  }
}

}  // namespace
}  // namespace specd::spec
