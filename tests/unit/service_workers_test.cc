// TargetWorker / DraftWorker driven directly (no network): prefill, chunked prefill, plain and
// speculative greedy decoding against an in-process reference, re-prefill, release.
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/llama_model.h"
#include "common/gguf/gguf_file.h"
#include "common/sampling/sampler.h"
#include "testing/fenced_backend.h"
#include "testing/expected_greedy.h"
#include "testing/plain_greedy.h"
#include "testing/tiny_model.h"
#include "gtest/gtest.h"
#include "services/common/model_host.h"
#include "services/common/proto_convert.h"
#include "services/draft_service/draft_worker.h"
#include "services/target_service/target_worker.h"

namespace specd::services {
namespace {

using specd::testing::ExpectedGreedy;
using specd::testing::SyntheticPrompt;

namespace iv1 = specd::internal::v1;

std::string TinyModel(uint64_t seed) {
  const std::string path = ::testing::TempDir() + "/svc_worker_tiny_" + std::to_string(seed) + ".gguf";
  testing::TinyModelSpec spec;
  spec.seed = seed;
  EXPECT_TRUE(testing::WriteTinyModel(spec, path).ok());
  return path;
}

std::unique_ptr<ModelHost> Host(const std::string& path, int kv_blocks = 64,
                                int world_size = 1,
                                kernels::KvDtype kv_dtype = kernels::KvDtype::kF16) {
  ModelHostOptions o;
  o.kv_dtype = kv_dtype;
  o.model_path = path;
  o.world_size = world_size;
  o.threads = world_size;
  o.kv_blocks = kv_blocks;
  o.max_batch_tokens = 64;
  absl::StatusOr<std::unique_ptr<ModelHost>> h = ModelHost::Load(o);
  EXPECT_TRUE(h.ok()) << h.status();
  return std::move(*h);
}

sampling::SamplingParams Greedy() {
  sampling::SamplingParams p;
  p.temperature = 0;
  p.ignore_eos = true;
  return p;
}

std::vector<int32_t> Prompt() { return SyntheticPrompt(23); }

iv1::TargetSequenceStep* AddTarget(iv1::TargetStepRequest& r, int64_t id, int32_t start,
                                   const std::vector<int32_t>& toks, bool emit, int32_t n_prompt) {
  iv1::TargetSequenceStep* s = r.add_sequences();
  s->set_seq_id(id);
  s->set_start_pos(start);
  s->mutable_tokens()->Assign(toks.begin(), toks.end());
  s->set_emit(emit);
  s->set_num_prompt_tokens(n_prompt);
  ToProto(Greedy(), s->mutable_sampling());
  return s;
}

// These tests check the protocol with exact k: the draft proposes all k it is asked for.
const DraftWorker::Options kAlwaysK{0.0, 0.0};

// Decodes `n` tokens for one sequence; k = 0 means no draft.
std::vector<int32_t> Decode(TargetWorker& target, DraftWorker* draft, int k, int chunk, int n,
                            int* target_steps = nullptr, int* proposed = nullptr) {
  const std::vector<int32_t> prompt = Prompt();
  std::vector<int32_t> committed = prompt;
  int32_t target_pos = 0;
  int steps = 0;
  while (static_cast<int>(committed.size() - prompt.size()) < n) {
    iv1::TargetStepRequest req;
    const int32_t end = std::min<int32_t>(committed.size(), target_pos + chunk);
    const bool emit = end == static_cast<int32_t>(committed.size());
    iv1::TargetSequenceStep* s =
        AddTarget(req, 7, target_pos, std::vector<int32_t>(committed.begin() + target_pos,
                                                           committed.begin() + end),
                  emit, prompt.size());
    if (emit && draft != nullptr && committed.size() > prompt.size()) {
      iv1::DraftStepRequest dr;
      iv1::DraftSequenceStep* d = dr.add_sequences();
      d->set_seq_id(7);
      d->set_start_pos(0);
      d->mutable_tokens()->Assign(committed.begin(), committed.end());
      d->set_num_draft_tokens(k);
      d->set_num_prompt_tokens(prompt.size());
      ToProto(Greedy(), d->mutable_sampling());
      auto dres = draft->Step(dr);
      EXPECT_TRUE(dres.ok()) << dres.status();
      if (draft->options().min_keep == 0.0 && draft->options().min_extend == 0.0) {
        EXPECT_EQ(dres->sequences(0).proposals_size(), k);
      } else {  // the draft's confidence may end the chain early
        EXPECT_LE(dres->sequences(0).proposals_size(), k);
      }
      if (proposed != nullptr) *proposed += dres->sequences(0).proposals_size();
      *s->mutable_proposals() = dres->sequences(0).proposals();
    }
    auto res = target.Step(req);
    EXPECT_TRUE(res.ok()) << res.status();
    if (!res.ok()) break;
    EXPECT_FALSE(res->sequences(0).needs_prefill());
    if (!emit) {
      target_pos = end;
      continue;
    }
    ++steps;
    for (const iv1::TokenResult& t : res->sequences(0).tokens()) committed.push_back(t.token());
    target_pos = static_cast<int32_t>(committed.size()) - 1;
  }
  if (target_steps != nullptr) *target_steps = steps;
  committed.resize(prompt.size() + n);
  return std::vector<int32_t>(committed.begin() + prompt.size(), committed.end());
}

class WorkersTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    target_path_ = new std::string(TinyModel(11));
    draft_path_ = new std::string(TinyModel(12));
  }
  static std::string* target_path_;
  static std::string* draft_path_;
};
std::string* WorkersTest::target_path_ = nullptr;
std::string* WorkersTest::draft_path_ = nullptr;

// A service's cost curve reaches the router whole: its points, what context adds
// (spec::DepthCost), a logit row's and a draft's catch-up row's price; a negative or NaN
// figure from a peer reads as none.
TEST(CostCurveProtoTest, PointsAndDepthCostRoundTrip) {
  spec::CostCurve curve({{1, 3e-3}, {5, 6e-3}, {64, 50e-3}});
  curve.set_depth({0.99e-6, 0.54e-6});
  curve.set_logits({0.15e-3, 128});
  curve.set_catch_up_row(25e-6);
  iv1::ServiceInfo info;
  ToProto(curve, &info);
  const spec::CostCurve back = CostCurveFromProto(info);
  EXPECT_EQ(back.points(), curve.points());
  EXPECT_EQ(back.depth().per_key, 0.99e-6);
  EXPECT_EQ(back.depth().per_row_key, 0.54e-6);
  EXPECT_EQ(back.logits().per_row, 0.15e-3);
  EXPECT_EQ(back.logits().calibrated_rows, 128);
  EXPECT_EQ(back.catch_up_row(), 25e-6);
  info.set_step_cost_per_key(-1.0);
  info.set_step_cost_per_row_key(std::nan(""));
  info.set_step_cost_per_logit_row(std::nan(""));
  info.set_step_cost_per_catch_up_row(std::nan(""));
  EXPECT_TRUE(CostCurveFromProto(info).depth().empty());
  EXPECT_TRUE(CostCurveFromProto(info).logits().empty());
  EXPECT_EQ(CostCurveFromProto(info).catch_up_row(), 0.0);
  info.set_step_cost_per_logit_row(0.15e-3);
  info.set_step_cost_logit_rows(0);  // a peer that did not measure it
  EXPECT_TRUE(CostCurveFromProto(info).logits().empty());
  info.clear_step_cost();
  EXPECT_TRUE(CostCurveFromProto(info).empty());
}

// --calibrate-depth 0 leaves context unpriced (the curve without a depth cost, in Info);
// a negative depth is refused naming the flag.
TEST_F(WorkersTest, CalibrateDepthZeroReportsNoDepthCost) {
  TargetWorker::Options o;
  o.calibrate_depth = 0;
  TargetWorker target(Host(*target_path_), o);
  ASSERT_TRUE(target.Calibrate().ok());
  const iv1::ServiceInfo info = target.Info();
  EXPECT_GT(info.step_cost_size(), 0);
  EXPECT_EQ(info.step_cost_per_key(), 0.0);
  EXPECT_EQ(info.step_cost_per_row_key(), 0.0);
  o.calibrate_depth = -1;
  const absl::Status st = o.Check();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--calibrate-depth"), std::string::npos) << st;
}

TEST_F(WorkersTest, PlainGreedyMatchesEngine) {
  TargetWorker target(Host(*target_path_));
  const std::vector<int32_t> want = ExpectedGreedy(*target_path_, Prompt(), 20);
  EXPECT_EQ(Decode(target, nullptr, 0, 64, 20), want);
}

// Both services on a backend whose memory the host cannot address (testing::FencedBackend,
// the CPU's stand-in for a GPU): the draft proposes and the target verifies where their logits
// are (ModelHost::ForwardAndPropose / ForwardAndVerify), and speculative greedy decoding still
// equals plain greedy decoding.
TEST_F(WorkersTest, WorkersSampleOnDeviceMemoryAndKeepGreedyOutput) {
  auto fenced_host = [](const std::string& path, testing::FencedBackend** backend) {
    ModelHostOptions o;
    o.model_path = path;
    o.threads = 1;
    o.kv_blocks = 64;
    o.max_batch_tokens = 64;
    o.make_backend = [backend]() -> std::unique_ptr<engine::Backend> {
      std::unique_ptr<testing::FencedBackend> b = testing::MakeFencedBackend();
      *backend = b.get();
      return b;
    };
    absl::StatusOr<std::unique_ptr<ModelHost>> h = ModelHost::Load(o);
    EXPECT_TRUE(h.ok()) << h.status();
    return std::move(*h);
  };
  testing::FencedBackend* target_backend = nullptr;
  testing::FencedBackend* draft_backend = nullptr;
  std::unique_ptr<ModelHost> target_host = fenced_host(*target_path_, &target_backend);
  std::unique_ptr<ModelHost> draft_host = fenced_host(*draft_path_, &draft_backend);
  ASSERT_TRUE(target_host->samples_on_device());
  ASSERT_TRUE(draft_host->samples_on_device());
  TargetWorker target(std::move(target_host));
  DraftWorker draft(std::move(draft_host), kAlwaysK);
  int proposed = 0;
  EXPECT_EQ(Decode(target, &draft, 3, 64, 24, nullptr, &proposed),
            ExpectedGreedy(*target_path_, Prompt(), 24));
  EXPECT_GT(proposed, 0);
  EXPECT_GT(target_backend->blockwise_verifications(), 0);
  EXPECT_GT(draft_backend->blockwise_proposals(), 0);
  EXPECT_EQ(target_backend->violations(), std::vector<std::string>{});
  EXPECT_EQ(draft_backend->violations(), std::vector<std::string>{});
}

TEST_F(WorkersTest, ChunkedPrefillMatches) {
  TargetWorker target(Host(*target_path_));
  EXPECT_EQ(Decode(target, nullptr, 0, 5, 12), ExpectedGreedy(*target_path_, Prompt(), 12));
}

TEST_F(WorkersTest, SpeculativeGreedyMatchesPlain) {
  const std::vector<int32_t> want = ExpectedGreedy(*target_path_, Prompt(), 30);
  for (int k : {1, 3, 6}) {
    TargetWorker target(Host(*target_path_));
    DraftWorker draft(Host(*draft_path_), kAlwaysK);
    EXPECT_EQ(Decode(target, &draft, k, 64, 30), want) << "k=" << k;
  }
  // A draft identical to the target accepts everything: k+1 tokens per step.
  TargetWorker target(Host(*target_path_));
  DraftWorker self(Host(*target_path_), kAlwaysK);
  int steps = 0;
  EXPECT_EQ(Decode(target, &self, 4, 64, 30, &steps), want);
  EXPECT_LE(steps, 1 + (29 + 4) / 5);
}

// The draft service's draft length from its confidence (DraftWorkerOptions; the product
// defaults are > 0): the options reach the drafter, and greedy output stays the plain
// reference. These tiny models are confident to within 1e-4 at every position (a cut at 0.9999
// drafts everything), so the check is the strictest cut: min_keep 1 drafts nothing. Where a
// cut falls inside a chain is SpecEngineTest.DraftConfidenceSetsTheChainLength.
TEST_F(WorkersTest, DraftLengthFromConfidenceKeepsGreedyOutput) {
  EXPECT_GT(DraftWorker::Options{}.min_keep, 0.0);
  EXPECT_GT(DraftWorker::Options{}.min_extend, 0.0);
  const std::vector<int32_t> want = ExpectedGreedy(*target_path_, Prompt(), 30);
  for (double keep : {0.9999, 1.0}) {
    TargetWorker target(Host(*target_path_));
    DraftWorker draft(Host(*draft_path_), DraftWorker::Options{keep, 0.0});
    int steps = 0, proposed = 0;
    EXPECT_EQ(Decode(target, &draft, 6, 64, 30, &steps, &proposed), want) << keep;
    if (keep < 1.0) {
      EXPECT_EQ(proposed, 6 * (steps - 1));  // the first step has no drafts
    } else {
      EXPECT_EQ(proposed, 0);
    }
  }
}

// The int8 KV cache and bf16 attention keep speculation lossless: verification rows and
// decode rows read the same rounded rows the same way, so greedy speculative output equals
// plain greedy output on such a target (and its plain output stays close to the f16 one: the
// tiny model's logits are far from ties for its first tokens).
TEST_F(WorkersTest, ReducedPrecisionKvSpeculativeGreedyMatchesPlain) {
  const std::vector<int32_t> f16 = ExpectedGreedy(*target_path_, Prompt(), 30);
  for (kernels::KvDtype dt : {kernels::KvDtype::kInt8, kernels::KvDtype::kBF16}) {
    TargetWorker plain(Host(*target_path_, 64, 1, dt));
    const std::vector<int32_t> want = Decode(plain, nullptr, 0, 5, 30);
    for (int k : {1, 3, 6}) {
      TargetWorker target(Host(*target_path_, 64, 1, dt));
      DraftWorker draft(Host(*draft_path_, 64, 1, dt), kAlwaysK);
      EXPECT_EQ(Decode(target, &draft, k, 64, 30), want) << "k=" << k << " kv " << static_cast<int>(dt);
    }
    EXPECT_EQ(std::vector<int32_t>(want.begin(), want.begin() + 4),
              std::vector<int32_t>(f16.begin(), f16.begin() + 4));
  }
}

// A target served by 2 tensor-parallel ranks (rank 0 drives rank 1 through the Communicator):
// the same greedy output as the engine on one rank, with chunked prefill, speculation and
// rollback, and release mirrored on every rank's cache.
TEST_F(WorkersTest, TensorParallelTargetMatchesOneRank) {
  const std::vector<int32_t> want = ExpectedGreedy(*target_path_, Prompt(), 30);
  {
    TargetWorker target(Host(*target_path_, 64, /*world_size=*/2));
    EXPECT_EQ(target.Info().world_size(), 2);
    EXPECT_EQ(Decode(target, nullptr, 0, 7, 30), want);
  }
  TargetWorker target(Host(*target_path_, 64, /*world_size=*/2));
  DraftWorker draft(Host(*draft_path_), kAlwaysK);
  EXPECT_EQ(Decode(target, &draft, 3, 64, 30), want);
  iv1::ReleaseRequest rel;
  rel.add_seq_ids(7);
  EXPECT_EQ(target.Release(rel).kv().used_blocks(), 0);
  // Heads that do not split: a load error naming the ranks, not a crash.
  ModelHostOptions o;
  o.model_path = *target_path_;
  o.world_size = 4;  // the tiny model has 2 KV heads
  auto bad = ModelHost::Load(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("4 ranks"), std::string::npos) << bad.status();
}

// A distilled draft (no token_embd.weight, a truncated head) served by a draft service borrows
// the target's embeddings (--borrow-from): speculation through it stays lossless, on one and on
// two tensor-parallel ranks; without the target it is a clear start-up error.
TEST_F(WorkersTest, DistilledDraftServiceBorrowsTheTargetsEmbeddings) {
  testing::TinyModelSpec lean;
  lean.seed = 77;
  lean.omit_token_embd = true;
  lean.tied_output = false;
  for (int32_t id = 0; id < 300; id += 2) lean.head_token_ids.push_back(id);
  const std::string lean_path = ::testing::TempDir() + "/svc_distilled_draft.gguf";
  ASSERT_TRUE(testing::WriteTinyModel(lean, lean_path).ok());
  ModelHostOptions o;
  o.model_path = lean_path;
  o.kv_blocks = 64;
  o.max_batch_tokens = 64;
  auto alone = ModelHost::Load(o);
  ASSERT_FALSE(alone.ok());
  EXPECT_NE(alone.status().message().find("--borrow-from"), std::string::npos) << alone.status();
  o.borrow_path = *target_path_;
  const std::vector<int32_t> want = ExpectedGreedy(*target_path_, Prompt(), 30);
  for (int world : {1, 2}) {
    o.world_size = world;
    o.threads = world;
    auto h = ModelHost::Load(o);
    ASSERT_TRUE(h.ok()) << h.status();
    TargetWorker target(Host(*target_path_));
    DraftWorker draft(std::move(*h), kAlwaysK);
    EXPECT_EQ(Decode(target, &draft, 3, 64, 30), want) << "world " << world;
  }
}

// A --borrow-from file with another vocabulary is refused by name on rank 0 (Load) and by a
// rank process (ServeRank) alike, before the rank process joins its group: every rank opens its
// files through the same checked step.
TEST_F(WorkersTest, EveryRankRefusesABorrowFileWithAnotherVocabulary) {
  testing::TinyModelSpec lean;
  lean.seed = 78;
  lean.omit_token_embd = true;
  const std::string lean_path = ::testing::TempDir() + "/svc_lean_draft.gguf";
  ASSERT_TRUE(testing::WriteTinyModel(lean, lean_path).ok());
  testing::TinyModelSpec other;
  other.seed = 79;
  other.vocab_size = 400;  // another vocabulary
  const std::string other_path = ::testing::TempDir() + "/svc_other_vocab.gguf";
  ASSERT_TRUE(testing::WriteTinyModel(other, other_path).ok());
  ModelHostOptions o;
  o.model_path = lean_path;
  o.borrow_path = other_path;
  o.kv_blocks = 64;
  o.max_batch_tokens = 64;
  auto expect_refused = [&](const absl::Status& st, const char* who) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << who << ": " << st;
    EXPECT_NE(st.message().find("different vocabularies"), std::string::npos) << who << ": " << st;
    EXPECT_NE(st.message().find(lean_path), std::string::npos) << who << ": " << st;
    EXPECT_NE(st.message().find(other_path), std::string::npos) << who << ": " << st;
  };
  expect_refused(ModelHost::Load(o).status(), "rank 0");
  o.world_size = 2;
  o.rank = 1;
  o.rendezvous = "127.0.0.1:1";  // never reached: the files are checked first
  o.tp_connect_timeout_s = 1;
  expect_refused(ModelHost::ServeRank(o), "rank process 1");
}

// A rank > 0 whose forward fails (an injected fault) fails the step on rank 0 with that rank's
// message, instead of leaving rank 0 waiting in an all-reduce; the ranks stay in step, so the
// host keeps serving other calls (and a fault on rank 0 is reported the same way).
TEST_F(WorkersTest, FailingRankFailsTheStepWithItsMessage) {
  for (int fault_rank : {1, 0}) {
    ModelHostOptions o;
    o.model_path = *target_path_;
    o.world_size = 2;
    o.threads = 2;
    o.kv_blocks = 64;
    o.max_batch_tokens = 64;
    o.inject_forward_fault_on_rank = fault_rank;
    absl::StatusOr<std::unique_ptr<ModelHost>> h = ModelHost::Load(o);
    ASSERT_TRUE(h.ok()) << h.status();
    TargetWorker target(std::move(*h));
    iv1::TargetStepRequest req;
    AddTarget(req, 1, 0, Prompt(), true, Prompt().size());
    absl::StatusOr<iv1::TargetStepResponse> res = target.Step(req);
    ASSERT_FALSE(res.ok());
    EXPECT_EQ(res.status().code(), absl::StatusCode::kInternal);
    EXPECT_NE(res.status().message().find("injected forward fault"), std::string::npos)
        << res.status();
    if (fault_rank == 1) {
      EXPECT_NE(res.status().message().find("rank 1"), std::string::npos) << res.status();
    }
    // Still in step: the next call is answered, and release works on every rank.
    EXPECT_FALSE(target.Step(req).ok());
    iv1::ReleaseRequest rel;
    rel.add_seq_ids(1);
    EXPECT_EQ(target.Release(rel).kv().used_blocks(), 0);
  }
}

// Prefix caching on the target (one rank and two: every rank adopts and publishes the same):
// a lookup changes nothing; a step with cached_prefix takes the blocks and answers exactly as
// a full prefill did; once the cache is dropped the same step needs a prefill.
TEST_F(WorkersTest, CachedPrefixIsTakenByTheStepAndADroppedOneNeedsPrefill) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(5 + (i * 13) % 190);  // 2 full blocks + 8
  const std::vector<int32_t> prefix(prompt.begin(), prompt.begin() + 32);
  const std::vector<int32_t> rest(prompt.begin() + 32, prompt.end());
  for (int world : {1, 2}) {
    SCOPED_TRACE(world);
    TargetWorker target(Host(*target_path_, 64, world));
    EXPECT_TRUE(target.Info().prefix_caching());
    iv1::TargetStepRequest full;
    AddTarget(full, 1, 0, prompt, true, prompt.size());
    auto first = target.Step(full);
    ASSERT_TRUE(first.ok()) << first.status();
    iv1::ReleaseRequest rel;
    rel.add_seq_ids(1);
    EXPECT_EQ(target.Release(rel).kv().cached_blocks(), 2) << "the 2 full blocks stay cached";

    iv1::TargetStepRequest lookup;
    iv1::PrefixLookup* l = lookup.add_prefix_lookups();
    l->set_seq_id(2);
    l->mutable_tokens()->Assign(prompt.begin(), prompt.end());
    auto found = target.Step(lookup);
    ASSERT_TRUE(found.ok()) << found.status();
    ASSERT_EQ(found->prefix_cached_size(), 1);
    EXPECT_EQ(found->prefix_cached(0), 32);
    EXPECT_EQ(found->kv().num_sequences(), 0) << "a lookup holds nothing";

    iv1::TargetStepRequest cached;
    AddTarget(cached, 2, 32, rest, true, prompt.size())
        ->mutable_cached_prefix()->Assign(prefix.begin(), prefix.end());
    auto second = target.Step(cached);
    ASSERT_TRUE(second.ok()) << second.status();
    ASSERT_FALSE(second->sequences(0).needs_prefill());
    ASSERT_EQ(second->sequences(0).tokens_size(), 1);
    EXPECT_EQ(second->sequences(0).tokens(0).token(), first->sequences(0).tokens(0).token());
    EXPECT_EQ(second->sequences(0).tokens(0).logprob(), first->sequences(0).tokens(0).logprob())
        << "the cached KV is the KV a prefill computes, bit for bit";
    EXPECT_EQ(second->kv().adopted_blocks(), 2);
    EXPECT_EQ(second->kv().prefix_hit_tokens(), 32);

    iv1::ReleaseRequest drop;
    drop.add_seq_ids(2);
    drop.set_drop_prefix_cache(true);
    const iv1::KvUsage after = target.Release(drop).kv();
    EXPECT_EQ(after.cached_blocks(), 0);
    EXPECT_EQ(after.used_blocks(), 0);
    EXPECT_EQ(after.adopted_blocks(), 0);
    iv1::TargetStepRequest stale;
    AddTarget(stale, 3, 32, rest, true, prompt.size())
        ->mutable_cached_prefix()->Assign(prefix.begin(), prefix.end());
    auto gone = target.Step(stale);
    ASSERT_TRUE(gone.ok()) << gone.status();
    EXPECT_TRUE(gone->sequences(0).needs_prefill());
    EXPECT_EQ(gone->kv().num_sequences(), 0);
    // A cached_prefix that is not the tokens before start_pos is the router's bug.
    iv1::TargetStepRequest bad;
    AddTarget(bad, 4, 31, rest, true, prompt.size())
        ->mutable_cached_prefix()->Assign(prefix.begin(), prefix.end());
    EXPECT_EQ(target.Step(bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST_F(WorkersTest, UnknownSequenceNeedsPrefillAndReleaseFreesBlocks) {
  TargetWorker target(Host(*target_path_));
  iv1::TargetStepRequest req;
  AddTarget(req, 5, 10, {1, 2, 3}, true, 3);
  auto res = target.Step(req);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_TRUE(res->sequences(0).needs_prefill());
  EXPECT_EQ(res->sequences(0).tokens_size(), 0);

  iv1::TargetStepRequest ok;
  AddTarget(ok, 5, 0, Prompt(), true, Prompt().size());
  res = target.Step(ok);
  ASSERT_TRUE(res.ok());
  EXPECT_GT(res->kv().used_blocks(), 0);
  iv1::ReleaseRequest rel;
  rel.add_seq_ids(5);
  EXPECT_EQ(target.Release(rel).kv().used_blocks(), 0);
}

TEST_F(WorkersTest, MalformedStepsAreInvalidArgument) {
  TargetWorker target(Host(*target_path_));
  iv1::TargetStepRequest bad_token;
  AddTarget(bad_token, 1, 0, {1, 999999}, true, 2);
  EXPECT_EQ(target.Step(bad_token).status().code(), absl::StatusCode::kInvalidArgument);
  iv1::TargetStepRequest dup;
  AddTarget(dup, 1, 0, {1}, true, 1);
  AddTarget(dup, 1, 0, {1}, true, 1);
  EXPECT_EQ(target.Step(dup).status().code(), absl::StatusCode::kInvalidArgument);
  iv1::TargetStepRequest big;
  AddTarget(big, 1, 0, std::vector<int32_t>(65, 1), true, 65);
  EXPECT_EQ(target.Step(big).status().code(), absl::StatusCode::kInvalidArgument);
  iv1::TargetStepRequest bad_params;
  AddTarget(bad_params, 1, 0, {1}, true, 1)->mutable_sampling()->set_top_p(0);
  EXPECT_EQ(target.Step(bad_params).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(WorkersTest, KvExhaustionIsResourceExhausted) {
  TargetWorker target(Host(*target_path_, /*kv_blocks=*/2));
  iv1::TargetStepRequest req;
  AddTarget(req, 1, 0, std::vector<int32_t>(40, 5), true, 40);
  EXPECT_EQ(target.Step(req).status().code(), absl::StatusCode::kResourceExhausted);
  iv1::TargetStepRequest small;
  AddTarget(small, 1, 0, std::vector<int32_t>(20, 5), true, 20);
  EXPECT_TRUE(target.Step(small).ok());
}

}  // namespace
}  // namespace specd::services
