// SpecEngine on tiny random-weight models: greedy speculation == plain greedy for every drafter
// and k (alone, batched, adaptive, under KV pressure), seeded sampling independent of batching,
// KV rollback bookkeeping on both models, cancellation, and the errors.
#include "speculation/spec_engine.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/sampling/draft_proposal.h"

#include "speculation/calibration.h"
#include "speculation/model_drafter.h"
#include "speculation/ngram_drafter.h"
#include "testing/tiny_model.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "testing/fenced_backend.h"
#include "tests/unit/spec_test_util.h"

namespace specd::spec {
namespace {

using test::EngineGenerate;
using test::LoadModel;
using test::PlainGenerate;

std::string TinyPath(const std::string& name, testing::TinyModelSpec spec) {
  const std::string path = ::testing::TempDir() + "/spec_" + name + ".gguf";
  absl::Status st = testing::WriteTinyModel(spec, path);
  EXPECT_TRUE(st.ok()) << st;
  return path;
}

// Prompts with some repetition so the n-gram drafter finds matches.
std::vector<std::vector<int32_t>> Prompts(int n, int vocab) {
  std::vector<std::vector<int32_t>> p;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> t;
    const int len = 3 + (i * 7) % 19;
    for (int j = 0; j < len; ++j) t.push_back((i * 31 + (j % 5) * 17 + 3) % vocab);
    p.push_back(t);
  }
  return p;
}

std::vector<sampling::SamplingParams> Greedy(size_t n) {
  sampling::SamplingParams g;
  g.temperature = 0.0f;
  g.ignore_eos = true;
  return std::vector<sampling::SamplingParams>(n, g);
}

class SpecEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = engine::MakeCpuBackend(2);
    testing::TinyModelSpec t;
    t.seed = 1;
    t.num_layers = 3;
    t.weight_scale = 0.3f;  // peaked distributions: the draft agrees often, not always
    target_path_ = TinyPath("target", t);
    testing::TinyModelSpec d = t;
    d.seed = 1;
    d.num_layers = 3;
    d.weight_type = gguf::GgmlType::kQ4_1;  // a quantized sibling: mostly agrees
    draft_path_ = TinyPath("draft", d);
    testing::TinyModelSpec e = t;  // one random layer over (token, the target's hidden state)
    e.seed = 7;
    e.num_layers = 1;
    e.feature_conditioned = true;
    eagle_path_ = TinyPath("eagle", e);
    target_ = LoadModel(target_path_, backend_.get(), 256, 256);
    ASSERT_TRUE(target_);
    auto tk = tok::Tokenizer::FromGguf(*target_->file);
    ASSERT_TRUE(tk.ok());
    identity_ = {target_path_, (*tk)->Fingerprint(), (*tk)->vocab_size()};
    vocab_ = target_->model->vocab_size();
  }

  std::unique_ptr<Drafter> MakeDrafter(const std::string& kind, double min_keep = 0.0,
                                       double min_extend = 0.0) {
    ModelDrafterOptions o;
    o.kv_blocks = 256;
    o.min_keep = min_keep;
    o.min_extend = min_extend;
    if (kind == "model") {
      auto d = ModelDrafter::CreateFromFile(draft_path_, identity_, backend_.get(), o);
      EXPECT_TRUE(d.ok()) << d.status();
      return d.ok() ? std::move(*d) : nullptr;
    }
    if (kind == "eagle") {
      auto d = ModelDrafter::CreateFromFile(eagle_path_, identity_, backend_.get(), o);
      EXPECT_TRUE(d.ok()) << d.status();
      return d.ok() ? std::move(*d) : nullptr;
    }
    if (kind == "same") {
      auto d = ModelDrafter::CreateFromFile(target_path_, identity_, backend_.get(), o);
      EXPECT_TRUE(d.ok()) << d.status();
      return d.ok() ? std::move(*d) : nullptr;
    }
    if (kind == "self") {
      auto d = ModelDrafter::CreateSelf(*target_->file, 1, backend_.get(), o);
      EXPECT_TRUE(d.ok()) << d.status();
      return d.ok() ? std::move(*d) : nullptr;
    }
    auto d = NgramDrafter::Create({});
    EXPECT_TRUE(d.ok());
    return std::move(*d);
  }

  std::unique_ptr<SpecEngine> MakeEngine(Drafter* d, SpecEngineOptions o) {
    auto e = SpecEngine::Create(target_->model.get(), d, o);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }

  std::unique_ptr<engine::Backend> backend_;
  std::string target_path_, draft_path_, eagle_path_;
  std::unique_ptr<test::LoadedModel> target_;
  TargetIdentity identity_;
  int32_t vocab_ = 0;
};

// A runner whose forwards cost what a test says: the tiny model's forward plus a sleep of
// extra(tokens, nth), nth counting the earlier forwards of that many tokens (or of
// by_batch(batch), for costs that depend on where the rows sit).
class CostedRunner final : public engine::ModelRunner {
 public:
  using Extra = std::chrono::microseconds (*)(int32_t tokens, int nth);
  using BatchExtra = std::chrono::microseconds (*)(const engine::ForwardBatch& batch);
  CostedRunner(engine::LlamaModel* model, engine::PagedKvCache* kv, Extra extra)
      : inner_(model, kv), extra_(extra) {}
  CostedRunner(engine::LlamaModel* model, engine::PagedKvCache* kv, BatchExtra by_batch)
      : inner_(model, kv), by_batch_(by_batch) {}
  absl::Status Forward(const engine::ForwardBatch& batch, float* logits, float* hidden) override {
    const int32_t n = static_cast<int32_t>(batch.tokens.size());
    std::this_thread::sleep_for(by_batch_ != nullptr ? by_batch_(batch) : extra_(n, calls_[n]++));
    return inner_.Forward(batch, logits, hidden);
  }
  absl::Status AddSequence(SeqId seq) override { return inner_.AddSequence(seq); }
  void FreeSequence(SeqId seq) override { inner_.FreeSequence(seq); }
  absl::Status Truncate(SeqId seq, int64_t length) override { return inner_.Truncate(seq, length); }
  absl::StatusOr<int64_t> AdoptPrefix(SeqId seq, absl::Span<const int32_t> prompt) override {
    return inner_.AdoptPrefix(seq, prompt);
  }
  absl::Status Publish(SeqId seq, absl::Span<const int32_t> committed) override {
    return inner_.Publish(seq, committed);
  }
  void DropPrefixCache() override { inner_.DropPrefixCache(); }
  const engine::PagedKvCache& kv() const override { return inner_.kv(); }
  const engine::LlamaModel& model() const override { return inner_.model(); }

 private:
  engine::LocalModelRunner inner_;
  Extra extra_ = nullptr;
  BatchExtra by_batch_ = nullptr;
  std::map<int32_t, int> calls_;
};

// The verify curve the policy starts from: every decode size 1..9 measured (not interpolated
// between powers of two), the slow first forward of each size left out, and a size timed below
// a smaller one (noise) raised to it.
TEST_F(SpecEngineTest, CalibrationTimesEveryDecodeSizeWithoutFirstTouches) {
  auto kv = engine::PagedKvCache::Create(target_->model->MakeKvCacheConfig(16, 16, kernels::KvDtype::kF16));
  ASSERT_TRUE(kv.ok());
  // 2 ms a token, 30 ms more the first time a size runs; 6 tokens read as cheap as 1.
  CostedRunner runner(target_->model.get(), kv->get(), [](int32_t tokens, int nth) {
    return std::chrono::microseconds((tokens == 6 ? 2000 : 2000 * tokens) + (nth == 0 ? 30000 : 0));
  });
  absl::StatusOr<CostCurve> curve = CalibrateVerify(runner, 40, 40);
  ASSERT_TRUE(curve.ok()) << curve.status();
  std::vector<double> sizes;
  for (const auto& [x, secs] : curve->points()) sizes.push_back(x);
  EXPECT_EQ(sizes, (std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 32, 40}));
  for (size_t i = 0; i < curve->points().size(); ++i) {
    const auto& [x, secs] = curve->points()[i];
    if (i > 0) {
      EXPECT_GE(secs, curve->points()[i - 1].second) << "x=" << x;
    }
    if (x == 6) continue;  // raised to 5 tokens' time
    EXPECT_GE(secs, 0.002 * x) << "x=" << x;
    // A sleep overshoots by well under the 30 ms of a first forward.
    EXPECT_LT(secs, 0.002 * x + 0.015) << "x=" << x << ": the first forward was kept";
  }
  EXPECT_GE(curve->Shape(6), curve->Shape(5));
}

// What context adds to a forward, measured: a runner whose forwards cost 1 ms, 0.2 ms a row,
// 4 us per position of context before a sequence's rows and 2 us more per (row, position)
// gives those two figures back, and the curve near position 0 stays what it was.
TEST_F(SpecEngineTest, CalibrationMeasuresWhatContextAddsPerPositionAndPerRow) {
  auto kv = engine::PagedKvCache::Create(
      target_->model->MakeKvCacheConfig(64, 16, kernels::KvDtype::kF16));
  ASSERT_TRUE(kv.ok());
  CostedRunner runner(target_->model.get(), kv->get(), [](const engine::ForwardBatch& b) {
    double us = 1000.0 + 200.0 * static_cast<double>(b.tokens.size());
    for (const engine::SequenceSlice& s : b.slices) us += (4.0 + 2.0 * s.num_tokens) * s.start_pos;
    return std::chrono::microseconds(static_cast<int64_t>(us));
  });
  absl::StatusOr<CostCurve> curve = CalibrateVerify(runner, 40, 40);
  ASSERT_TRUE(curve.ok()) << curve.status();
  // At 507 positions (the tiny model's 512 less the rows): 3 ms more for one row, 7 ms for
  // five. A sleep overshoots by up to ~0.1 ms, which moves the per-position figures by ~10 %.
  // The tiny model's own forward adds to every time (~0.4 ms under a sanitizer): the curve's
  // checks are on differences.
  EXPECT_NEAR(curve->depth().per_key, 4e-6, 1e-6);
  EXPECT_NEAR(curve->depth().per_row_key, 2e-6, 0.5e-6);
  EXPECT_GE(curve->Shape(1), 1.2e-3);
  EXPECT_NEAR(curve->Shape(5) - curve->Shape(1), 0.8e-3, 0.3e-3);
  StepContext deep;
  deep.Add(400, 5);
  EXPECT_NEAR(curve->Shape(5, deep) - curve->Shape(5), 400 * (4e-6 + 5 * 2e-6), 0.8e-3);
  // No room for a deep sequence (or depth 0 asked): no depth cost, and no error.
  auto small = engine::PagedKvCache::Create(
      target_->model->MakeKvCacheConfig(16, 16, kernels::KvDtype::kF16));
  ASSERT_TRUE(small.ok());
  CostedRunner cramped(target_->model.get(), small->get(), [](const engine::ForwardBatch&) {
    return std::chrono::microseconds(100);
  });
  absl::StatusOr<CostCurve> shallow = CalibrateVerify(cramped, 40, 40);
  ASSERT_TRUE(shallow.ok()) << shallow.status();
  EXPECT_TRUE(shallow->depth().empty());
  EXPECT_EQ((*small)->num_free_blocks(), 16);  // both probes freed
  absl::StatusOr<CostCurve> none = CalibrateVerify(runner, 40, 40, -1, /*depth_keys=*/0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->depth().empty());
  EXPECT_EQ((*kv)->num_free_blocks(), 64);
}

// What a row's logits add, measured: a runner whose forwards cost 1 ms, 0.1 ms a row and
// 0.3 ms a logit row gives 0.3 ms back, over the rows the calibration computed logits for.
TEST_F(SpecEngineTest, CalibrationMeasuresWhatALogitRowAdds) {
  auto kv = engine::PagedKvCache::Create(
      target_->model->MakeKvCacheConfig(16, 16, kernels::KvDtype::kF16));
  ASSERT_TRUE(kv.ok());
  CostedRunner runner(target_->model.get(), kv->get(), [](const engine::ForwardBatch& b) {
    return std::chrono::microseconds(1000 + 100 * static_cast<int64_t>(b.tokens.size()) +
                                     300 * static_cast<int64_t>(b.logit_rows.size()));
  });
  absl::StatusOr<CostCurve> curve = CalibrateVerify(runner, 40, 40, -1, /*depth_keys=*/0);
  ASSERT_TRUE(curve.ok()) << curve.status();
  // Timed at 40 tokens with 40 and with 1 logit rows: 11.7 ms over 39 rows. The tiny model's
  // own logits add a little (its vocabulary is small).
  EXPECT_NEAR(curve->logits().per_row, 0.3e-3, 0.05e-3);
  EXPECT_EQ(curve->logits().calibrated_rows, 40);
  StepContext chunk;
  chunk.AddLogitRows(1);
  EXPECT_NEAR(curve->Shape(40) - curve->Shape(40, chunk), 39 * 0.3e-3, 2e-3);
  // Fewer logit rows than tokens, always (max_rows 1): nothing to compare, no logit cost.
  absl::StatusOr<CostCurve> one = CalibrateVerify(runner, 40, 1, -1, 0);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_TRUE(one->logits().empty());
  EXPECT_EQ((*kv)->num_free_blocks(), 16);
}

// A drafter whose round costs 0.3 ms plus 3 us per position of each sequence's context, plus
// 40 us for each committed token it catches up on beyond the row that drafts (tokens past what
// it holds of the sequence), and that has no room past `room` positions (RESOURCE_EXHAUSTED).
// Proposes token 1, for sure.
class ContextCostedDrafter final : public Drafter {
 public:
  explicit ContextCostedDrafter(size_t room) : room_(room) {}
  std::string_view name() const override { return "context-costed"; }
  absl::Status Propose(absl::Span<const DraftInput> in, absl::Span<DraftOutput> out) override {
    double us = 300.0;
    for (const DraftInput& d : in) {
      if (d.tokens.size() > room_) return absl::ResourceExhaustedError("no KV room");
      us += 3.0 * static_cast<double>(d.tokens.size());
      size_t& held = held_[d.seq];
      if (held > 0 && d.tokens.size() > held + 1) {
        us += 40.0 * static_cast<double>(d.tokens.size() - held - 1);
      }
      held = d.tokens.size();
    }
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(us)));
    for (size_t i = 0; i < in.size(); ++i) {
      out[i].proposals.clear();
      out[i].proposals.push_back({1, {1}, {1.0f}});
    }
    return absl::OkStatus();
  }
  absl::Status Commit(SeqId, absl::Span<const int32_t>) override { return absl::OkStatus(); }
  void Release(SeqId seq) override { held_.erase(seq); }
  bool runs_model() const override { return true; }

 private:
  size_t room_;
  std::map<SeqId, size_t> held_;  // tokens of each sequence fed so far
};

// A draft round's depth cost, measured: 3 us a position comes back; a drafter without room for
// the deep sequence, or depth 0, leaves the curve without one (and calibrates all the same).
// And its catch-up: 40 us a row fed beyond the drafting one, plus those rows' 3 us of context.
TEST(CalibrateDraftTest, MeasuresWhatContextAddsToARound) {
  ContextCostedDrafter roomy(1 << 20), cramped(512);
  absl::StatusOr<CostCurve> curve = CalibrateDraft(roomy, 1000, 4, /*depth_keys=*/1024);
  ASSERT_TRUE(curve.ok()) << curve.status();
  EXPECT_NEAR(curve->depth().per_key, 3e-6, 0.5e-6);
  EXPECT_EQ(curve->depth().per_row_key, 0.0);
  EXPECT_NEAR(curve->Shape(1), 0.324e-3, 0.2e-3);
  EXPECT_NEAR(curve->catch_up_row(), 43e-6, 12e-6);
  absl::StatusOr<CostCurve> no_room = CalibrateDraft(cramped, 1000, 4, 1024);
  ASSERT_TRUE(no_room.ok()) << no_room.status();
  EXPECT_TRUE(no_room->depth().empty());
  EXPECT_FALSE(no_room->empty());
  absl::StatusOr<CostCurve> none = CalibrateDraft(roomy, 1000, 4, 0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->depth().empty());
  // Room for the rounds' 8 tokens but not for a catch-up on 16 more: calibrated all the same,
  // without a catch-up price (the policy then prices it from the target's curve).
  ContextCostedDrafter tiny(20);
  absl::StatusOr<CostCurve> no_catch_up = CalibrateDraft(tiny, 1000, 4, 0);
  ASSERT_TRUE(no_catch_up.ok()) << no_catch_up.status();
  EXPECT_FALSE(no_catch_up->empty());
  EXPECT_EQ(no_catch_up->catch_up_row(), 0.0);
}

// A slow spell of the machine (three forwards in a row, 12 ms slower each), wherever it falls,
// leaves every size up to kRoundRobinCalibrationTokens at its quiet time: the step of a batch
// prices its drafts on the slope between those sizes, and one size timed in a slow spell
// bent it (docs/PERFORMANCE.md: 0.76x of speculation off at concurrency 16).
int slow_spell_start = 0;
int forwards_so_far = 0;

TEST_F(SpecEngineTest, CalibrationLeavesOutASlowSpellAtEveryBatchSize) {
  static_assert(kRoundRobinCalibrationTokens >= 40);
  for (int start = 0; start < 72; start += 5) {
    auto kv = engine::PagedKvCache::Create(target_->model->MakeKvCacheConfig(16, 16, kernels::KvDtype::kF16));
    ASSERT_TRUE(kv.ok());
    slow_spell_start = start;
    forwards_so_far = 0;
    // 0.2 ms a token; forwards start .. start + 2 of the calibration take 12 ms more.
    CostedRunner runner(target_->model.get(), kv->get(), [](int32_t tokens, int) {
      const int nth = forwards_so_far++;
      const bool slow = nth >= slow_spell_start && nth < slow_spell_start + 3;
      return std::chrono::microseconds(200 * tokens + (slow ? 12000 : 0));
    });
    absl::StatusOr<CostCurve> curve = CalibrateVerify(runner, 40, 40);
    ASSERT_TRUE(curve.ok()) << curve.status();
    for (const auto& [x, secs] : curve->points()) {
      // A sleep overshoots by well under the spell's 12 ms.
      EXPECT_LT(secs, 0.0002 * x + 0.006) << "x=" << x << ", spell from forward " << start;
    }
  }
}

TEST_F(SpecEngineTest, GreedyEqualsPlainForEveryDrafterAndK) {
  const auto prompts = Prompts(12, vocab_);
  const auto params = Greedy(prompts.size());
  constexpr int kNew = 20;
  const auto plain = PlainGenerate(*target_->model, prompts, params, kNew, {});
  for (const std::string kind : {"model", "same", "self", "ngram", "eagle"}) {
    for (int k : {1, 4, 8}) {
      for (int running : {1, 12}) {
        auto d = MakeDrafter(kind);
        SpecEngineOptions o;
        o.k = k;
        o.max_running = running;
        auto e = MakeEngine(d.get(), o);
        ASSERT_TRUE(e);
        const auto got = EngineGenerate(*e, prompts, params, kNew);
        for (size_t i = 0; i < prompts.size(); ++i) {
          ASSERT_EQ(got[i], plain[i])
              << kind << " k=" << k << " running=" << running << " prompt " << i;
        }
        if (kind == "same") {
          // The same weights draft: every draft is accepted.
          EXPECT_EQ(e->stats().accepted, e->stats().drafted) << k;
        }
        EXPECT_GT(e->stats().drafted, 0) << kind << " k=" << k;
        EXPECT_EQ(e->kv_cache().num_used_blocks(), 0);
        if (d->kv_cache() != nullptr) {
          EXPECT_EQ(d->kv_cache()->num_used_blocks(), 0);
        }
      }
    }
  }
}

// The whole speculative engine on memory the host cannot touch (testing::FencedBackend, the
// CPU's stand-in for a GPU: weights, both KV caches and the activations in it; only indices go
// in and logit / hidden rows come out): greedy output equals plain greedy on the reference
// backend (the fenced backend's ops), for a model draft, a feature-conditioned draft and the
// n-gram lookup, and no op is handed host memory.
TEST_F(SpecEngineTest, GreedyOnDeviceMemoryEqualsPlain) {
  const auto prompts = Prompts(6, vocab_);
  const auto params = Greedy(prompts.size());
  constexpr int kNew = 12;
  std::unique_ptr<engine::Backend> ref = engine::MakeReferenceBackend();
  auto plain_target = LoadModel(target_path_, ref.get(), 256, 256);
  ASSERT_TRUE(plain_target);
  const auto plain = PlainGenerate(*plain_target->model, prompts, params, kNew, {});
  std::unique_ptr<testing::FencedBackend> fenced = testing::MakeFencedBackend();
  auto target = LoadModel(target_path_, fenced.get(), 256, 256);
  ASSERT_TRUE(target);
  for (const std::string kind : {"model", "eagle", "ngram"}) {
    ModelDrafterOptions o;
    o.kv_blocks = 256;
    std::unique_ptr<Drafter> d;
    if (kind == "ngram") {
      d = std::move(*NgramDrafter::Create({}));
    } else {
      auto m = ModelDrafter::CreateFromFile(kind == "model" ? draft_path_ : eagle_path_, identity_, fenced.get(), o);
      ASSERT_TRUE(m.ok()) << m.status();
      d = std::move(*m);
    }
    SpecEngineOptions eo;
    eo.k = 3;
    eo.max_running = 6;
    auto e = SpecEngine::Create(target->model.get(), d.get(), eo);
    ASSERT_TRUE(e.ok()) << e.status();
    const auto got = EngineGenerate(**e, prompts, params, kNew);
    for (size_t i = 0; i < prompts.size(); ++i) ASSERT_EQ(got[i], plain[i]) << kind << " prompt " << i;
    EXPECT_GT((*e)->stats().drafted, 0) << kind;
  }
  EXPECT_EQ(fenced->violations(), std::vector<std::string>{});
  // The stand-in records and replays steps as CUDA graphs: speculation ran on recordings.
  EXPECT_GT(fenced->step_graph_stats().replays, 0);
}

// Sampled requests (seeded, every transform) sampled where the logits are: a draft and a
// target on FencedBackend (memory the host cannot address) propose and verify on their backend
// (Backend::ProposeBlockwise / VerifyBlockwise, the kernels' algorithm) and give, token for
// token, what the same pair on the reference backend gives through the host sampler
// (MakeProposal, VerifyDraft).
TEST_F(SpecEngineTest, SampledVerifiedOnDeviceMemoryEqualsHostVerifier) {
  const auto prompts = Prompts(5, vocab_);
  std::vector<sampling::SamplingParams> params(prompts.size());
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].temperature = 0.7f + 0.2f * static_cast<float>(i);
    params[i].seed = 40 + i;
    params[i].ignore_eos = true;
  }
  params[1].top_k = 5;
  params[2].top_p = 0.8f;
  params[2].num_logprobs = 3;  // top logprobs come back from the device path too
  params[3].min_p = 0.05f;
  params[4].repetition_penalty = 1.3f;
  params[4].presence_penalty = 0.4f;
  constexpr int kNew = 14;
  auto generate = [&](engine::Backend* backend) {
    auto target = LoadModel(target_path_, backend, 256, 256);
    EXPECT_TRUE(target);
    ModelDrafterOptions o;
    o.kv_blocks = 256;
    auto d = ModelDrafter::CreateFromFile(draft_path_, identity_, backend, o);
    EXPECT_TRUE(d.ok()) << d.status();
    SpecEngineOptions eo;
    eo.k = 3;
    eo.max_running = 5;
    auto e = SpecEngine::Create(target->model.get(), d->get(), eo);
    EXPECT_TRUE(e.ok()) << e.status();
    auto out = EngineGenerate(**e, prompts, params, kNew);
    EXPECT_GT((*e)->stats().drafted, 0);
    EXPECT_GT((*e)->stats().accepted, 0);
    return out;
  };
  std::unique_ptr<engine::Backend> ref = engine::MakeReferenceBackend();
  const auto host_verified = generate(ref.get());
  std::unique_ptr<testing::FencedBackend> fenced = testing::MakeFencedBackend();
  const auto device_verified = generate(fenced.get());
  EXPECT_GT(fenced->blockwise_verifications(), 0);
  EXPECT_GT(fenced->blockwise_proposals(), 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(device_verified[i], host_verified[i]) << "prompt " << i;
  }
  EXPECT_EQ(fenced->violations(), std::vector<std::string>{});
}

// The feature-conditioned drafter against its plain-loop twin: every proposal equals a fresh
// forward of the draft over the whole sequence, row t fed the target's hidden state at t - 1
// (zeros at 0) and each drafted row fed the hidden state of the draft row before it. After a
// partial acceptance the rows that had been fed drafted features are fed the target's.
TEST_F(SpecEngineTest, FeatureConditionedDraftMatchesItsPlainTwin) {
  auto eagle = test::LoadModel(eagle_path_, backend_.get(), 64, 64);
  ASSERT_TRUE(eagle);
  ASSERT_TRUE(eagle->model->feature_conditioned());
  const int64_t D = target_->model->config().embedding_dim;
  // The target's hidden states at every position of `toks`.
  auto target_hidden = [&](const std::vector<int32_t>& toks) {
    auto kv = engine::PagedKvCache::Create(
        target_->model->MakeKvCacheConfig(16, 16, kernels::KvDtype::kF16));
    EXPECT_TRUE(kv.ok() && (*kv)->AddSequence(0).ok());
    engine::ForwardBatch b;
    b.AddPrompt(0, 0, toks.data(), static_cast<int32_t>(toks.size()));
    for (int32_t t = 0; t < static_cast<int32_t>(toks.size()); ++t) b.hidden_rows.push_back(t);
    std::vector<float> hidden(toks.size() * D);
    EXPECT_TRUE(target_->model->Forward(b, **kv, nullptr, hidden.data()).ok());
    return hidden;
  };
  // The twin: k greedy drafts after `toks`, each from a fresh forward of the whole row set.
  auto twin = [&](const std::vector<int32_t>& toks, int k) {
    const std::vector<float> target = target_hidden(toks);
    std::vector<int32_t> seq = toks;
    std::vector<float> feats(D, 0.0f);  // row 0
    feats.insert(feats.end(), target.begin(), target.end() - D);  // rows 1..n-1
    std::vector<int32_t> drafts;
    for (int j = 0; j < k; ++j) {
      auto kv = engine::PagedKvCache::Create(
          eagle->model->MakeKvCacheConfig(16, 16, kernels::KvDtype::kF16));
      EXPECT_TRUE(kv.ok() && (*kv)->AddSequence(0).ok());
      engine::ForwardBatch b;
      b.Add(0, 0, seq.data(), static_cast<int32_t>(seq.size()), /*all_logits=*/false);
      b.input_features = feats;
      b.hidden_rows = b.logit_rows;
      std::vector<float> logits(vocab_), hidden(D);
      EXPECT_TRUE(eagle->model->Forward(b, **kv, logits.data(), hidden.data()).ok());
      const int32_t d = static_cast<int32_t>(
          std::max_element(logits.begin(), logits.end()) - logits.begin());
      drafts.push_back(d);
      seq.push_back(d);
      feats.insert(feats.end(), hidden.begin(), hidden.end());
    }
    return drafts;
  };
  auto drafter = MakeDrafter("eagle");
  ASSERT_TRUE(drafter && drafter->wants_features());
  const auto params = Greedy(1);
  const sampling::CounterRng rng(1);
  auto propose = [&](const std::vector<int32_t>& toks, int k) {
    const sampling::PenaltyState history;
    DraftInput in{0, toks, &params[0], &history, &rng, k, 3};
    std::vector<DraftOutput> out(1);
    EXPECT_TRUE(drafter->Propose({in}, absl::MakeSpan(out)).ok());
    std::vector<int32_t> got;
    for (const auto& q : out[0].proposals) got.push_back(q.token);
    return got;
  };
  std::vector<int32_t> toks = {5, 17, 33, 2, 90, 41, 8};
  // Without the target's features there is nothing to draft from.
  EXPECT_TRUE(propose(toks, 3).empty());
  std::vector<float> h = target_hidden(toks);
  drafter->AddFeatures(0, 0, absl::MakeConstSpan(h.data(), (toks.size() - 1) * D));
  std::vector<int32_t> got = propose(toks, 3);
  EXPECT_EQ(got, twin(toks, 3));
  // The verifier accepts d_1 and emits a correction: the target kept rows n-1 and n.
  const int64_t n = static_cast<int64_t>(toks.size());
  toks.push_back(got[0]);
  toks.push_back((got[1] + 1) % vocab_);
  h = target_hidden(toks);
  drafter->AddFeatures(0, static_cast<int32_t>(n - 1),
                       absl::MakeConstSpan(h.data() + (n - 1) * D, 2 * D));
  ASSERT_TRUE(drafter->Commit(0, toks).ok());
  EXPECT_EQ(propose(toks, 4), twin(toks, 4));
  // Asked again with nothing new (a lost step): the same drafts.
  EXPECT_EQ(propose(toks, 4), twin(toks, 4));
  drafter->Release(0);
  EXPECT_EQ(drafter->kv_cache()->num_used_blocks(), 0);
}

// Calibration times real draft rounds of a feature-conditioned drafter: its probe sequences
// get (zero) target states, so every Propose it times drafts. Without them the rounds were
// empty and the draft was priced at ~0.
TEST_F(SpecEngineTest, CalibrationProbesMakeAFeatureConditionedDrafterDraft) {
  class Counting final : public Drafter {
   public:
    explicit Counting(Drafter* d) : d_(d) {}
    std::string_view name() const override { return d_->name(); }
    absl::Status Propose(absl::Span<const DraftInput> in, absl::Span<DraftOutput> out) override {
      absl::Status st = d_->Propose(in, out);
      ++calls;
      for (const DraftOutput& o : out) empty += o.proposals.empty() ? 1 : 0;
      return st;
    }
    absl::Status Commit(SeqId s, absl::Span<const int32_t> c) override { return d_->Commit(s, c); }
    void Release(SeqId s) override { d_->Release(s); }
    bool runs_model() const override { return true; }
    bool wants_features() const override { return d_->wants_features(); }
    int32_t feature_dim() const override { return d_->feature_dim(); }
    void AddFeatures(SeqId s, int32_t p, absl::Span<const float> r) override {
      d_->AddFeatures(s, p, r);
    }
    int calls = 0, empty = 0;

   private:
    Drafter* d_;
  };
  auto eagle = MakeDrafter("eagle");
  ASSERT_TRUE(eagle);
  Counting counting(eagle.get());
  SpecEngineOptions o;
  o.adaptive_k = true;
  o.calibrate = true;
  auto e = MakeEngine(&counting, o);
  ASSERT_TRUE(e);
  EXPECT_GT(counting.calls, 5);
  EXPECT_EQ(counting.empty, 0) << "calibration timed draft rounds that drafted nothing";
}

TEST_F(SpecEngineTest, AdaptiveKAndKvPressureKeepGreedyOutput) {
  const auto prompts = Prompts(10, vocab_);
  const auto params = Greedy(prompts.size());
  constexpr int kNew = 40;
  const auto plain = PlainGenerate(*target_->model, prompts, params, kNew, {});
  {
    auto d = MakeDrafter("model");
    SpecEngineOptions o;
    o.k = 8;
    o.adaptive_k = true;
    o.max_running = 10;
    auto e = MakeEngine(d.get(), o);
    ASSERT_TRUE(e);
    EXPECT_FALSE(e->verify_cost().empty());
    EXPECT_FALSE(e->draft_cost().empty());
    // The calibration's price of a catch-up row survives its refinement (a model draft's rows
    // cost something).
    EXPECT_GT(e->draft_cost().catch_up_row(), 0.0);
    EXPECT_EQ(EngineGenerate(*e, prompts, params, kNew), plain);
  }
  {
    // 10 sequences of up to ~60 tokens need ~40 blocks; give 12: admission waits and running
    // sequences get preempted and recomputed, with identical output.
    auto d = MakeDrafter("model");
    SpecEngineOptions o;
    o.k = 4;
    o.kv_blocks = 12;
    o.max_running = 10;
    auto e = MakeEngine(d.get(), o);
    ASSERT_TRUE(e);
    EXPECT_EQ(EngineGenerate(*e, prompts, params, kNew), plain);
    EXPECT_GT(e->stats().preemptions, 0);
    EXPECT_EQ(e->kv_cache().num_used_blocks(), 0);
    EXPECT_EQ(d->kv_cache()->num_used_blocks(), 0);
  }
}

// ModelDrafterOptions min_keep / min_extend: a chain is the uncut chain while the product of
// its confidences stays >= min_keep, and it grows past a token only while that product is
// >= min_extend. Each token's confidence is recomputed here from an independent forward of the
// draft model over prompt + the uncut chain (the engine's logits do not depend on how a
// sequence was chunked). Greedy output stays plain greedy's.
TEST_F(SpecEngineTest, DraftConfidenceSetsTheChainLength) {
  constexpr int kK = 6;
  const auto prompts = Prompts(12, vocab_);
  const auto params = Greedy(prompts.size());
  const sampling::PenaltyState none;
  const sampling::CounterRng rng(0);
  auto draft = LoadModel(draft_path_, backend_.get(), 256, 256);
  ASSERT_TRUE(draft);
  auto uncut = MakeDrafter("model");
  std::vector<DraftInput> in;
  for (size_t i = 0; i < prompts.size(); ++i) {
    in.push_back({static_cast<SeqId>(i), prompts[i], &params[i], &none, &rng, kK,
                  static_cast<int32_t>(prompts[i].size())});
  }
  std::vector<DraftOutput> full(in.size());
  ASSERT_TRUE(uncut->Propose(in, absl::MakeSpan(full)).ok());

  // survival[i][j]: the product of the confidences of d_1..d_{j+1} of chain i.
  std::vector<std::vector<double>> survival(in.size());
  std::vector<double> all;
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(full[i].proposals.size(), static_cast<size_t>(kK));
    std::vector<int32_t> seq = prompts[i];
    for (const auto& q : full[i].proposals) seq.push_back(q.token);
    auto kv = engine::PagedKvCache::Create(
        draft->model->MakeKvCacheConfig(8, 16, kernels::KvDtype::kF16));
    ASSERT_TRUE(kv.ok() && (*kv)->AddSequence(0).ok());
    engine::ForwardBatch b;
    b.Add(0, 0, seq.data(), static_cast<int32_t>(seq.size()), /*all_logits=*/true);
    std::vector<float> logits(seq.size() * vocab_);
    ASSERT_TRUE(draft->model->Forward(b, **kv, logits.data()).ok());
    double product = 1.0;
    for (int j = 0; j < kK; ++j) {
      const size_t row = prompts[i].size() - 1 + j;  // the row that gave d_{j+1}
      absl::StatusOr<double> c = sampling::DraftConfidence(
          absl::Span<const float>(logits.data() + row * vocab_, vocab_), none, params[i],
          sampling::kDefaultProposalTopN, full[i].proposals[j]);
      ASSERT_TRUE(c.ok()) << c.status();
      product *= *c;
      survival[i].push_back(product);
      all.push_back(product);
    }
  }
  // Thresholds between two distinct products (no chain sits on one): two thirds up all the
  // products, and the median of the first tokens' confidences.
  auto between = [](std::vector<double> v, double at) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    EXPECT_GT(v.size(), 3u);
    const size_t i = std::max<size_t>(1, static_cast<size_t>(at * v.size()));
    return 0.5 * (v[i - 1] + v[i]);
  };
  std::vector<double> firsts;
  for (const auto& s : survival) firsts.push_back(s[0]);
  const double high = between(all, 2.0 / 3), low = between(firsts, 0.5);

  const auto plain = PlainGenerate(*target_->model, prompts, params, 20, {});
  for (auto [keep, extend] : {std::pair{high, 0.0}, std::pair{low, high}}) {
    SCOPED_TRACE(::testing::Message() << "min_keep " << keep << " min_extend " << extend);
    auto cut = MakeDrafter("model", keep, extend);
    std::vector<DraftOutput> got(in.size());
    ASSERT_TRUE(cut->Propose(in, absl::MakeSpan(got)).ok());
    int none_drafted = 0, cut_inside = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      size_t expect = 0;
      while (expect < static_cast<size_t>(kK) && survival[i][expect] >= keep) {
        ++expect;
        if (survival[i][expect - 1] < extend) break;
      }
      ASSERT_EQ(got[i].proposals.size(), expect) << "sequence " << i;
      for (size_t j = 0; j < expect; ++j) {
        EXPECT_EQ(got[i].proposals[j].token, full[i].proposals[j].token) << i << " " << j;
      }
      none_drafted += expect == 0;
      cut_inside += expect > 0 && expect < static_cast<size_t>(kK);
    }
    // The thresholds cut chains at their start and inside them.
    EXPECT_GT(none_drafted, 0);
    EXPECT_GT(cut_inside, 0);

    // Through the engine, with fixed and adaptive k: plain greedy's output.
    for (bool adaptive : {false, true}) {
      auto d = MakeDrafter("model", keep, extend);
      SpecEngineOptions o;
      o.k = kK;
      o.adaptive_k = adaptive;
      o.max_running = 12;
      auto e = MakeEngine(d.get(), o);
      ASSERT_TRUE(e);
      EXPECT_EQ(EngineGenerate(*e, prompts, params, 20), plain) << adaptive;
      EXPECT_EQ(d->kv_cache()->num_used_blocks(), 0);
    }
  }
  for (auto [keep, extend] : {std::pair{1.5, 0.0}, std::pair{0.0, -0.1}}) {
    ModelDrafterOptions bad;
    bad.min_keep = keep;
    bad.min_extend = extend;
    auto refused = ModelDrafter::CreateFromFile(draft_path_, identity_, backend_.get(), bad);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find(keep > 1 ? "min_keep" : "min_extend"),
              std::string::npos)
        << refused.status();
  }
}

// Adaptive k (k <= 4) on the given curves as they are: no timing, no load tracking, so what
// drafts follows from the costs and the acceptance alone, on any machine.
SpecEngineOptions FixedCostAdaptive(CostCurve verify, CostCurve draft) {
  SpecEngineOptions o;
  o.k = 4;
  o.adaptive_k = true;
  o.calibrate = false;
  o.track_load = false;
  o.verify_cost = std::move(verify);
  o.draft_cost = std::move(draft);
  return o;
}

// The loop hands the policy each sequence's context. A draft round nearly as dear as a target
// step never pays near position 0 (the next test's second half has one as dear), but when
// every KV position a sequence reads costs 2 % of a step, 400 of them make each step 9 steps'
// worth, which the drafts' rows share: the same drafter drafts there (its catch-up on the
// prompt repaid within the request), and output stays plain greedy's. The same curve without
// its depth cost drafts nothing.
TEST_F(SpecEngineTest, ContextReachesThePolicyAndADeepSequenceDrafts) {
  std::vector<std::vector<int32_t>> prompts(1);
  for (int j = 0; j < 400; ++j) prompts[0].push_back((j * 37 + (j % 7) * 11 + 5) % vocab_);
  const auto params = Greedy(1);
  const auto plain = PlainGenerate(*target_->model, prompts, params, 60, {});
  for (const bool priced : {true, false}) {
    auto d = MakeDrafter("same");
    SpecEngineOptions o = FixedCostAdaptive(CostCurve({{1, 1.0}, {5, 1.6}, {40, 8.0}}),
                                            CostCurve({{1, 0.9}, {8, 7.2}}));
    if (priced) o.verify_cost.set_depth({0.02, 0.0});
    ASSERT_EQ(ChooseK(std::vector<KCandidate>{{1.0, 4, 0}}, 0, 4, o.verify_cost, o.draft_cost),
              std::vector<int32_t>{0});
    auto e = MakeEngine(d.get(), o);
    ASSERT_TRUE(e);
    EXPECT_EQ(EngineGenerate(*e, prompts, params, 60), plain) << "priced " << priced;
    if (priced) {
      EXPECT_GT(e->stats().drafted, 20);
      EXPECT_EQ(e->stats().accepted, e->stats().drafted);
    } else {
      EXPECT_EQ(e->stats().drafted, 0);
    }
  }
}

// Adaptive k starts from a pessimistic prior (alpha 0.5) under which these costs say k = 0;
// probes every SpecEngine::kProbeEvery steps find that the drafter (the target itself) is always
// right, and the engine then speculates deep.
TEST_F(SpecEngineTest, AdaptiveKProbesAndFindsAGoodDrafter) {
  const auto prompts = Prompts(1, vocab_);
  const auto params = Greedy(1);
  auto d = MakeDrafter("same");
  SpecEngineOptions o = FixedCostAdaptive(CostCurve({{1, 1.0}, {5, 1.6}, {40, 8.0}}),
                                          CostCurve({{1, 0.4}, {8, 1.0}}));
  ASSERT_EQ(ChooseK(std::vector<KCandidate>{{0.5, 4}}, 0, 4, o.verify_cost, o.draft_cost),
            std::vector<int32_t>{0});
  ASSERT_EQ(ChooseK(std::vector<KCandidate>{{0.95, 4}}, 0, 4, o.verify_cost, o.draft_cost),
            std::vector<int32_t>{4});
  auto e = MakeEngine(d.get(), o);
  ASSERT_TRUE(e);
  EXPECT_EQ(EngineGenerate(*e, prompts, params, 80),
            PlainGenerate(*target_->model, prompts, params, 80, {}));
  EXPECT_GT(e->stats().drafted, 20);
  EXPECT_EQ(e->stats().accepted, e->stats().drafted);
  EXPECT_GT(e->stats().k_chosen[4], 0);

  // A draft step as dear as a target step: no k pays even if every draft were accepted, so
  // the engine does not probe at all.
  o.draft_cost = CostCurve({{1, 1.0}, {8, 8.0}});
  auto d2 = MakeDrafter("same");
  auto e2 = MakeEngine(d2.get(), o);
  ASSERT_TRUE(e2);
  EXPECT_EQ(EngineGenerate(*e2, prompts, params, 80),
            PlainGenerate(*target_->model, prompts, params, 80, {}));
  EXPECT_EQ(e2->stats().drafted, 0);
}

// The router's speculation "auto" in one process: the n-gram lookup drafts first where it has a
// match, the draft model elsewhere. Greedy output equals plain decoding, and both drafted.
TEST_F(SpecEngineTest, LookupFirstThenTheDraftModelKeepsGreedyOutput) {
  class Counting final : public Drafter {
   public:
    explicit Counting(std::unique_ptr<Drafter> d) : d_(std::move(d)) {}
    std::string_view name() const override { return d_->name(); }
    absl::Status Propose(absl::Span<const DraftInput> in, absl::Span<DraftOutput> out) override {
      absl::Status st = d_->Propose(in, out);
      for (const DraftOutput& o : out) drafted += static_cast<int64_t>(o.proposals.size());
      return st;
    }
    absl::Status Commit(SeqId s, absl::Span<const int32_t> c) override { return d_->Commit(s, c); }
    void Release(SeqId s) override { d_->Release(s); }
    bool HasProposal(absl::Span<const int32_t> t, int32_t min_match) const override {
      return d_->HasProposal(t, min_match);
    }
    bool runs_model() const override { return d_->runs_model(); }
    uint64_t weight_bytes() const override { return d_->weight_bytes(); }
    const engine::PagedKvCache* kv_cache() const override { return d_->kv_cache(); }
    int64_t CachedLength(SeqId s) const override { return d_->CachedLength(s); }
    int64_t drafted = 0;

   private:
    std::unique_ptr<Drafter> d_;
  };
  // Prompts that repeat a pattern (the lookup has matches), then random ones (it has few).
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p;
    for (int r = 0; r < 5; ++r) {
      for (int32_t t = 0; t < 6; ++t) p.push_back(10 + 7 * i + t);
    }
    prompts.push_back(p);
  }
  for (const auto& p : Prompts(4, vocab_)) prompts.push_back(p);
  const auto params = Greedy(prompts.size());
  constexpr int kNew = 40;
  const auto plain = PlainGenerate(*target_->model, prompts, params, kNew, {});
  for (int running : {1, 8}) {
    Counting model(MakeDrafter("model"));
    Counting lookup(MakeDrafter("ngram"));
    SpecEngineOptions o;
    o.k = 4;
    o.adaptive_k = true;
    o.max_running = running;
    o.lookup = &lookup;
    // Fixed costs (no timing): drafting pays for both alone, and what drafts follows from the
    // tokens and the acceptance alone, on any machine and under a sanitizer.
    o.calibrate = false;
    o.track_load = false;
    o.verify_cost = CostCurve({{1, 1.0}, {48, 1.5}});
    o.draft_cost = CostCurve({{1, 0.05}, {8, 0.1}});
    auto e = MakeEngine(&model, o);
    ASSERT_TRUE(e);
    EXPECT_EQ(EngineGenerate(*e, prompts, params, kNew), plain) << running;
    if (running == 1) {  // in a batch the policies price rows past the step's fixed cost
      EXPECT_GT(lookup.drafted, 0);
      EXPECT_GT(model.drafted, 0);
    }
    EXPECT_EQ(e->kv_cache().num_used_blocks(), 0);
    EXPECT_EQ(model.kv_cache()->num_used_blocks(), 0);
  }
  // A lookup needs adaptive k and must be model-free.
  auto d = MakeDrafter("model");
  auto n = MakeDrafter("ngram");
  SpecEngineOptions bad;
  bad.lookup = n.get();
  EXPECT_EQ(SpecEngine::Create(target_->model.get(), d.get(), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad.adaptive_k = true;
  bad.lookup = d.get();
  EXPECT_EQ(SpecEngine::Create(target_->model.get(), d.get(), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SpecEngineTest, SeededSamplingIsIndependentOfBatching) {
  const auto prompts = Prompts(6, vocab_);
  std::vector<sampling::SamplingParams> params(prompts.size());
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].temperature = 0.9f;
    params[i].top_k = 40;
    params[i].repetition_penalty = 1.1f;
    params[i].seed = 1000 + i;
    params[i].ignore_eos = true;
  }
  // Each sequence alone, with fixed and with adaptive k (a pinned sequence's adaptive k follows
  // its own acceptance, so the two schedules differ).
  std::vector<std::vector<int32_t>> alone_by_mode[2];
  for (bool adaptive : {false, true}) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto d = MakeDrafter("model");
      SpecEngineOptions o;
      o.k = 4;
      o.adaptive_k = adaptive;
      auto e = MakeEngine(d.get(), o);
      alone_by_mode[adaptive].push_back(EngineGenerate(*e, {prompts[i]}, {params[i]}, 30)[0]);
    }
  }
  // Batched: the same tokens, also when the batch changes what the engine would choose —
  // adaptive k, a token budget smaller than the drafts (pinned sequences wait a step), and KV
  // pressure (preemption, drafts dropped for greedy sequences only). A sampled sequence's k
  // schedule is its own (SpecEngine::PinnedK); a greedy one in the same batch still adapts.
  struct Variant {
    const char* name;
    bool adaptive;
    int32_t budget, kv_blocks;
  };
  for (const Variant v : {Variant{"fixed", false, 256, 1024}, Variant{"adaptive", true, 256, 1024},
                          Variant{"tight budget", true, 12, 1024},
                          Variant{"kv pressure", true, 256, 14}}) {
    auto d = MakeDrafter("model");
    SpecEngineOptions o;
    o.k = 4;
    o.adaptive_k = v.adaptive;
    o.max_batch_tokens = v.budget;
    o.kv_blocks = v.kv_blocks;
    o.max_running = 6;
    auto e = MakeEngine(d.get(), o);
    ASSERT_TRUE(e) << v.name;
    const std::vector<std::vector<int32_t>>& alone = alone_by_mode[v.adaptive];
    EXPECT_EQ(EngineGenerate(*e, prompts, params, 30), alone) << v.name;
    EXPECT_EQ(e->kv_cache().num_used_blocks(), 0) << v.name;
    if (v.kv_blocks < 100) {
      EXPECT_GT(e->stats().preemptions, 0) << v.name;
    }
  }
  // k = 0 is plain sampling: the same tokens as the independent plain decoder.
  auto e = MakeEngine(nullptr, SpecEngineOptions{});
  EXPECT_EQ(EngineGenerate(*e, prompts, params, 30),
            PlainGenerate(*target_->model, prompts, params, 30, {}));
}

// A sampled request that chose no seed has nothing to reproduce, so its k follows the step's
// costs like a greedy request's; a seeded one keeps its pinned k on the nominal costs. Fixed
// curves (no timing): where every verified row costs a whole step (compute-bound, as a batch
// is on a small CPU) the unseeded requests draft nothing and the seeded ones still draft; on
// a flat curve both draft.
TEST_F(SpecEngineTest, UnseededSampledKFollowsTheCostsSeededStaysPinned) {
  const auto prompts = Prompts(4, vocab_);
  struct Case {
    const char* name;
    CostCurve verify;
    bool unseeded_drafts;
  };
  for (const Case& c : {Case{"compute-bound", CostCurve({{1, 1.0}, {64, 64.0}}), false},
                        Case{"flat", CostCurve({{1, 1.0}, {64, 1.5}}), true}}) {
    for (bool seeded : {true, false}) {
      auto d = MakeDrafter("ngram");
      SpecEngineOptions o;
      o.k = 4;
      o.adaptive_k = true;
      o.calibrate = false;
      o.track_load = false;
      o.verify_cost = c.verify;
      o.max_running = 4;
      auto e = MakeEngine(d.get(), o);
      ASSERT_TRUE(e) << c.name;
      std::vector<RequestId> ids;
      for (size_t i = 0; i < prompts.size(); ++i) {
        SpecRequest r;
        r.prompt = prompts[i];
        r.params.temperature = 0.7f;
        r.params.seed = 40 + i;
        r.params.ignore_eos = true;
        r.max_new_tokens = 30;
        r.seeded = seeded;
        auto id = e->Admit(r);
        ASSERT_TRUE(id.ok()) << id.status();
        ids.push_back(*id);
      }
      ASSERT_TRUE(e->RunToCompletion().ok());
      int64_t drafted = 0;
      for (RequestId id : ids) {
        auto r = e->TakeResult(id);
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(r->tokens.size(), 30u) << c.name;
        drafted += r->drafted;
      }
      const bool want = seeded || c.unseeded_drafts;
      EXPECT_EQ(drafted > 0, want) << c.name << (seeded ? " seeded" : " unseeded") << ": drafted "
                                   << drafted;
      EXPECT_EQ(e->kv_cache().num_used_blocks(), 0);
    }
  }
}

// After every step each sequence's KV holds exactly what a fresh run of its committed tokens
// would: the target all but the last emitted token, the draft that or one less (when every
// draft was accepted, d_k was never fed to it), with whole blocks freed on rollback.
TEST_F(SpecEngineTest, RollbackLeavesExactKvBlocksOnBothModels) {
  for (const std::string kind : {"model", "self"}) {
    auto d = MakeDrafter(kind);
    SpecEngineOptions o;
    o.k = 6;
    auto e = MakeEngine(d.get(), o);
    ASSERT_TRUE(e);
    const auto prompts = Prompts(8, vocab_);
    std::vector<RequestId> ids;
    for (size_t i = 0; i < prompts.size(); ++i) {
      SpecRequest r;
      r.prompt = prompts[i];
      r.params.temperature = i % 2 ? 0.0f : 1.0f;
      r.params.seed = i;
      r.params.ignore_eos = true;
      r.max_new_tokens = 50;
      ids.push_back(*e->Admit(r));
    }
    const engine::PagedKvCache& tkv = e->kv_cache();
    const engine::PagedKvCache& dkv = *d->kv_cache();
    int checked = 0;
    while (e->HasWork()) {
      ASSERT_TRUE(e->Step().ok());
      int64_t target_blocks = 0, draft_blocks = 0;
      for (size_t i = 0; i < ids.size(); ++i) {
        const RequestId id = ids[i];
        const int64_t n = e->CommittedLength(id);
        if (n < 0) continue;  // finished
        ASSERT_EQ(*tkv.Length(id), n - 1);
        ASSERT_EQ(tkv.NumBlocksOf(id), tkv.BlocksFor(n - 1));
        target_blocks += tkv.BlocksFor(n - 1);
        const int64_t dl = d->CachedLength(id);
        ASSERT_TRUE(dl == n - 1 || dl == n - 2) << kind << " draft " << dl << " committed " << n;
        ASSERT_EQ(dkv.NumBlocksOf(id), dkv.BlocksFor(dl));
        draft_blocks += dkv.BlocksFor(dl);
        ++checked;
      }
      ASSERT_EQ(tkv.num_used_blocks(), target_blocks);
      ASSERT_EQ(dkv.num_used_blocks(), draft_blocks);
    }
    EXPECT_GT(checked, 50);
    EXPECT_EQ(tkv.num_used_blocks(), 0);
    EXPECT_EQ(dkv.num_used_blocks(), 0);
    EXPECT_LT(e->stats().accepted, e->stats().drafted) << "rejections must occur";
  }
}

TEST_F(SpecEngineTest, CancellationFreesKvWithinOneStep) {
  auto d = MakeDrafter("model");
  SpecEngineOptions o;
  o.k = 4;
  auto e = MakeEngine(d.get(), o);
  const auto prompts = Prompts(3, vocab_);
  std::vector<RequestId> ids;
  std::vector<FinishReason> streamed(4, FinishReason::kNone);
  e->SetStreamCallback([&](RequestId id, absl::Span<const int32_t>, FinishReason f) {
    if (f != FinishReason::kNone) streamed[id] = f;
  });
  for (const auto& p : prompts) {
    SpecRequest r;
    r.prompt = p;
    r.params.temperature = 0;
    r.params.ignore_eos = true;
    r.max_new_tokens = 100;
    ids.push_back(*e->Admit(r));
  }
  ASSERT_TRUE(e->Step().ok());
  ASSERT_TRUE(e->Step().ok());
  EXPECT_GT(e->kv_cache().NumBlocksOf(ids[1]), 0);
  ASSERT_TRUE(e->Cancel(ids[1]).ok());
  ASSERT_TRUE(e->Step().ok());
  EXPECT_FALSE(e->kv_cache().HasSequence(ids[1]));
  EXPECT_FALSE(d->kv_cache()->HasSequence(ids[1]));
  auto r = e->TakeResult(ids[1]);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->finish, FinishReason::kCancelled);
  EXPECT_EQ(streamed[ids[1]], FinishReason::kCancelled);
  EXPECT_EQ(e->Cancel(ids[1]).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(e->TakeResult(ids[0]).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(e->RunToCompletion().ok());
  EXPECT_EQ(e->TakeResult(ids[0])->tokens.size(), 100u);
  EXPECT_EQ(streamed[ids[0]], FinishReason::kLength);
}

TEST_F(SpecEngineTest, StopTokenEndsTheRequest) {
  const auto prompts = Prompts(4, vocab_);
  auto params = Greedy(prompts.size());
  const auto plain = PlainGenerate(*target_->model, prompts, params, 30, {});
  // Make the 5th greedy token of each prompt a stop token.
  for (size_t i = 0; i < prompts.size(); ++i) params[i].stop_token_ids = {plain[i][4]};
  const auto expect = PlainGenerate(*target_->model, prompts, params, 30, {});
  auto d = MakeDrafter("same");
  SpecEngineOptions o;
  o.k = 8;
  auto e = MakeEngine(d.get(), o);
  std::vector<RequestId> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SpecRequest r{prompts[i], params[i], 30, -1};
    ids.push_back(*e->Admit(r));
  }
  ASSERT_TRUE(e->RunToCompletion().ok());
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto r = e->TakeResult(ids[i]);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->tokens, expect[i]);
    EXPECT_LE(r->tokens.size(), 5u);
    EXPECT_EQ(r->finish, FinishReason::kStop);
  }
}

TEST_F(SpecEngineTest, VocabularyMismatchNamesBothModels) {
  testing::TinyModelSpec s;
  s.tokenizer_from = test::SourceDir() + "/tests/data/tokenizer/tiny_spm.gguf";
  const std::string other = TinyPath("other_vocab", s);
  auto d = ModelDrafter::CreateFromFile(other, identity_, backend_.get(), {});
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find(other), std::string::npos) << d.status();
  EXPECT_NE(d.status().message().find(target_path_), std::string::npos) << d.status();
  EXPECT_NE(d.status().message().find("vocabular"), std::string::npos) << d.status();
}

TEST_F(SpecEngineTest, BadParamsAreInvalidArgumentNamingTheField) {
  auto d = MakeDrafter("ngram");
  SpecEngineOptions o;
  o.k = 4;
  auto e = MakeEngine(d.get(), o);
  auto admit = [&](auto mutate) {
    SpecRequest r;
    r.prompt = {1, 2, 3};
    r.max_new_tokens = 8;
    mutate(r);
    return e->Admit(std::move(r)).status();
  };
  auto expect = [](const absl::Status& st, const std::string& field) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << field << ": " << st;
    EXPECT_NE(st.message().find(field), std::string::npos) << field << ": " << st;
  };
  expect(admit([](SpecRequest& r) { r.params.temperature = -1; }), "temperature");
  expect(admit([](SpecRequest& r) { r.params.top_p = 0; }), "top_p");
  expect(admit([](SpecRequest& r) { r.params.min_p = 2; }), "min_p");
  expect(admit([](SpecRequest& r) { r.params.repetition_penalty = 0; }), "repetition_penalty");
  expect(admit([](SpecRequest& r) { r.prompt.clear(); }), "prompt");
  expect(admit([&](SpecRequest& r) { r.prompt = {vocab_}; }), "prompt[0]");
  expect(admit([](SpecRequest& r) { r.max_new_tokens = 0; }), "max_new_tokens");
  expect(admit([](SpecRequest& r) { r.max_new_tokens = 1 << 20; }), "max_new_tokens");
  expect(admit([](SpecRequest& r) { r.k = 5; }), "k");
  EXPECT_TRUE(admit([](SpecRequest&) {}).ok());

  SpecEngineOptions bad;
  bad.max_running = 0;
  expect(SpecEngine::Create(target_->model.get(), d.get(), bad).status(), "max_running");
  bad = SpecEngineOptions{};
  bad.max_batch_tokens = 100000;
  expect(SpecEngine::Create(target_->model.get(), d.get(), bad).status(), "max_batch_tokens");
  bad = SpecEngineOptions{};
  bad.k = -1;
  expect(SpecEngine::Create(target_->model.get(), d.get(), bad).status(), "k must");
  expect(ModelDrafter::CreateSelf(*target_->file, 0, backend_.get(), {}).status(),
         "self_draft_layers");
  expect(ModelDrafter::CreateSelf(*target_->file, 3, backend_.get(), {}).status(),
         "self_draft_layers");
  NgramDrafterOptions n;
  n.min_ngram = 0;
  expect(NgramDrafter::Create(n).status(), "min_ngram");
  n = NgramDrafterOptions{};
  n.max_ngram = 0;
  expect(NgramDrafter::Create(n).status(), "max_ngram");
}

TEST_F(SpecEngineTest, QueueFullIsResourceExhausted) {
  SpecEngineOptions o;
  o.max_waiting = 2;
  auto e = MakeEngine(nullptr, o);
  SpecRequest r;
  r.prompt = {1, 2};
  r.max_new_tokens = 4;
  ASSERT_TRUE(e->Admit(r).ok());
  ASSERT_TRUE(e->Admit(r).ok());
  EXPECT_EQ(e->Admit(r).status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace specd::spec
