// RouterEngine over in-process workers (no network): outputs against plain greedy decoding,
// streaming, stop strings, cancellation, deadlines, queue bound, preemption, and the fault
// paths (draft down and back, target restart).
#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "engine/backend.h"
#include "engine/llama_model.h"
#include "common/gguf/gguf_file.h"
#include "common/sampling/sampler.h"
#include "testing/expected_greedy.h"
#include "testing/metric_sum.h"
#include "testing/plain_greedy.h"
#include "testing/tiny_model.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "services/common/metrics.h"
#include "services/inproc/local_backends.h"
#include "services/router/remote_backends.h"
#include "services/router/router_engine.h"
#include "speculation/model_drafter.h"

namespace specd::router {
namespace {

using specd::testing::ExpectedGreedy;
using specd::testing::SyntheticPrompt;

std::string TinyModel(uint64_t seed) {
  const std::string path =
      ::testing::TempDir() + "/router_tiny_" + std::to_string(seed) + ".gguf";
  testing::TinyModelSpec spec;
  spec.seed = seed;
  EXPECT_TRUE(testing::WriteTinyModel(spec, path).ok());
  return path;
}

// A draft with its own head: it disagrees with the tied target almost always. "" on failure.
std::string NeverRightDraft(const std::string& name) {
  testing::TinyModelSpec spec;
  spec.seed = 23;
  spec.tied_output = false;
  const std::string path = ::testing::TempDir() + "/" + name + ".gguf";
  const absl::Status st = testing::WriteTinyModel(spec, path);
  EXPECT_TRUE(st.ok()) << st;
  return st.ok() ? path : "";
}

std::unique_ptr<services::ModelHost> Host(const std::string& path, int kv_blocks,
                                          int num_layers = 0, bool prefix_caching = true) {
  services::ModelHostOptions o;
  o.prefix_caching = prefix_caching;
  o.model_path = path;
  o.num_layers = num_layers;
  o.threads = 1;
  o.kv_blocks = kv_blocks;
  o.max_batch_tokens = 128;
  auto h = services::ModelHost::Load(o);
  EXPECT_TRUE(h.ok()) << h.status();
  return std::move(*h);
}

class Collect : public RequestSink {
 public:
  void OnChunk(specd::v1::GenerateStreamResponse chunk) override {
    absl::MutexLock l(&mu_);
    text_ += chunk.text();
    tokens_.insert(tokens_.end(), chunk.token_ids().begin(), chunk.token_ids().end());
    ++chunks_;
    if (!first_.HasBeenNotified()) first_.Notify();
  }
  void OnDone(absl::Status status, specd::v1::Completion c) override {
    {
      absl::MutexLock l(&mu_);
      status_ = status;
      completion_ = c;
    }
    done_.Notify();
  }
  void Wait() { EXPECT_TRUE(done_.WaitForNotificationWithTimeout(absl::Seconds(120))); }
  void WaitFirst() { first_.WaitForNotificationWithTimeout(absl::Seconds(60)); }
  bool done() { return done_.HasBeenNotified(); }
  absl::Status status() { absl::MutexLock l(&mu_); return status_; }
  std::vector<int32_t> tokens() { absl::MutexLock l(&mu_); return tokens_; }
  std::string text() { absl::MutexLock l(&mu_); return text_; }
  specd::v1::Completion completion() { absl::MutexLock l(&mu_); return completion_; }

 private:
  absl::Mutex mu_;
  std::string text_;
  std::vector<int32_t> tokens_;
  int chunks_ = 0;
  absl::Status status_;
  specd::v1::Completion completion_;
  absl::Notification done_, first_;
};

class RouterEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    target_path_ = new std::string(TinyModel(21));
    draft_path_ = new std::string(TinyModel(22));
    file_ = gguf::GgufFile::Open(*target_path_)->release();
    tokenizer_ = tok::Tokenizer::FromGguf(*file_)->release();
  }

  void Make(RouterOptions options = {}, int target_blocks = 256, bool with_draft = true,
            const std::string* draft_model = nullptr, const std::string* target_model = nullptr,
            int draft_layers = 0, const tok::Tokenizer* tokenizer = nullptr) {
    auto t = std::make_unique<LocalTargetBackend>(std::make_unique<services::TargetWorker>(
        Host(target_model ? *target_model : *target_path_, target_blocks, 0, prefix_caching_)));
    target_ = t.get();
    std::unique_ptr<TargetBackend> target = std::move(t);
    if (wrap_target_) target = wrap_target_(std::move(target));
    std::unique_ptr<LocalDraftBackend> d;
    if (with_draft) {
      // The draft proposes every k the router asks for: these tests check the router's k.
      d = std::make_unique<LocalDraftBackend>(std::make_unique<services::DraftWorker>(
          Host(draft_model ? *draft_model : *draft_path_, 256, draft_layers, prefix_caching_),
          services::DraftWorkerOptions{0.0, 0.0}));
      draft_ = d.get();
    }
    if (options.scheduler.max_batch_tokens > 128) options.scheduler.max_batch_tokens = 128;
    // Adaptive k on fixed curves (these tiny workers are not calibrated, and a tiny draft costs
    // as much as its target): a memory-bound target, a draft round ~5 % of a target step.
    if (options.verify_cost.empty()) {
      options.verify_cost = spec::CostCurve({{1, 1.0}, {64, 1.63}, {1024, 20.83}});
      options.draft_cost = spec::CostCurve({{1, 0.05}, {256, 1.0}});
      options.track_load = false;
    }
    options.draft_retry = absl::Milliseconds(50);
    engine_ = std::make_unique<RouterEngine>(options, std::move(target), std::move(d),
                                             tokenizer ? *tokenizer : *tokenizer_, &metrics_);
    ASSERT_TRUE(engine_->Start().ok());
  }

  ValidatedRequest Req(const std::vector<int32_t>& prompt, int n, SpecMode mode, int k = 0) {
    ValidatedRequest r;
    r.prompt = prompt;
    r.max_new_tokens = n;
    r.params.temperature = 0;
    r.params.ignore_eos = true;
    r.seed_set = true;
    r.spec_mode = mode;
    r.fixed_k = k;
    return r;
  }

  std::shared_ptr<Collect> Run(ValidatedRequest r) {
    auto sink = std::make_shared<Collect>();
    auto id = engine_->Submit(std::move(r), sink);
    EXPECT_TRUE(id.ok()) << id.status();
    return sink;
  }

  bool prefix_caching_ = true;  // on both services, as they ship
  // Make() hands the target backend to this first, when set (a test's wrapper around it).
  std::function<std::unique_ptr<TargetBackend>(std::unique_ptr<TargetBackend>)> wrap_target_;
  static std::string* target_path_;
  static std::string* draft_path_;
  static gguf::GgufFile* file_;
  static tok::Tokenizer* tokenizer_;
  services::Metrics metrics_;
  LocalTargetBackend* target_ = nullptr;
  LocalDraftBackend* draft_ = nullptr;
  std::unique_ptr<RouterEngine> engine_;
};
std::string* RouterEngineTest::target_path_ = nullptr;
std::string* RouterEngineTest::draft_path_ = nullptr;
gguf::GgufFile* RouterEngineTest::file_ = nullptr;
tok::Tokenizer* RouterEngineTest::tokenizer_ = nullptr;

TEST_F(RouterEngineTest, GreedyEqualsPlainWithAndWithoutSpeculation) {
  Make();
  const auto prompt = SyntheticPrompt(20, 1);
  const auto want = ExpectedGreedy(*target_path_, prompt, 24);
  for (auto [mode, k] : {std::pair{SpecMode::kOff, 0}, std::pair{SpecMode::kDraft, 4},
                         std::pair{SpecMode::kAuto, 0}}) {
    auto sink = Run(Req(prompt, 24, mode, k));
    sink->Wait();
    ASSERT_TRUE(sink->status().ok()) << sink->status();
    EXPECT_EQ(sink->tokens(), want);
    const auto c = sink->completion();
    EXPECT_EQ(c.finish_reason(), specd::v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(c.usage().completion_tokens(), 24);
    EXPECT_EQ(c.usage().prompt_tokens(), 20);
    if (mode == SpecMode::kDraft) {
      EXPECT_GT(c.speculation().draft_tokens(), 0);
    }
    EXPECT_EQ(sink->text(), tokenizer_->Decode(want, /*skip_special=*/true));
  }
}

// A feature-conditioned (EAGLE-style) draft service: the router asks the target for its hidden
// states and forwards them with the draft steps. Output equals plain greedy, drafts are made
// (the features arrive), and a repeated prompt (whose prefix the target has cached) still gets
// drafts: the target computes its features rather than taking the cached prefix.
TEST_F(RouterEngineTest, FeatureConditionedDraftServiceGetsTheTargetsFeatures) {
  testing::TinyModelSpec spec;
  spec.seed = 22;
  spec.num_layers = 1;
  spec.feature_conditioned = true;
  const std::string eagle = ::testing::TempDir() + "/router_tiny_eagle.gguf";
  ASSERT_TRUE(testing::WriteTinyModel(spec, eagle).ok());
  Make({}, 256, true, &eagle);
  for (int round = 0; round < 2; ++round) {
    std::vector<std::shared_ptr<Collect>> sinks;
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 3; ++i) {
      prompts.push_back(SyntheticPrompt(40 + 7 * i, i));
      sinks.push_back(Run(Req(prompts.back(), 20, SpecMode::kDraft, 3)));
    }
    for (int i = 0; i < 3; ++i) {
      sinks[i]->Wait();
      ASSERT_TRUE(sinks[i]->status().ok()) << sinks[i]->status();
      EXPECT_EQ(sinks[i]->tokens(), ExpectedGreedy(*target_path_, prompts[i], 20)) << i;
      EXPECT_GT(sinks[i]->completion().speculation().draft_tokens(), 0) << round << " " << i;
    }
  }
}

TEST_F(RouterEngineTest, SelfDraftAcceptsEverything) {
  Make({}, 256, true, target_path_);
  const auto prompt = SyntheticPrompt(9, 2);
  auto sink = Run(Req(prompt, 30, SpecMode::kDraft, 4));
  sink->Wait();
  EXPECT_EQ(sink->tokens(), ExpectedGreedy(*target_path_, prompt, 30));
  const auto c = sink->completion();
  EXPECT_EQ(c.speculation().accepted_tokens(), c.speculation().draft_tokens());
  EXPECT_GT(c.speculation().mean_accepted_length(), 3.0);
}

// SPECULATION_MODE_SELF runs on a draft service that serves the target's own first layers,
// and is refused, naming the field, when the draft is a separate model.
TEST_F(RouterEngineTest, SelfModeNeedsASelfDraftService) {
  Make({}, 256, true, target_path_, nullptr, /*draft_layers=*/1);
  const auto prompt = SyntheticPrompt(9, 3);
  auto sink = Run(Req(prompt, 30, SpecMode::kSelf, 3));
  sink->Wait();
  ASSERT_TRUE(sink->status().ok()) << sink->status();
  EXPECT_EQ(sink->tokens(), ExpectedGreedy(*target_path_, prompt, 30));
  EXPECT_GT(sink->completion().speculation().draft_tokens(), 0);
  engine_->Stop();

  Make();  // a separate draft model
  auto refused = engine_->Submit(Req(prompt, 30, SpecMode::kSelf, 3), std::make_shared<Collect>());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("speculation.mode"), std::string::npos);
  engine_->Stop();

  Make({}, 256, /*with_draft=*/false);
  EXPECT_FALSE(engine_->Submit(Req(prompt, 30, SpecMode::kSelf, 3), std::make_shared<Collect>())
                   .ok());
}

TEST_F(RouterEngineTest, NgramSpeculationWithoutDraftServiceMatchesPlain) {
  Make({}, 256, /*with_draft=*/false);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 6; ++i) {
    for (int32_t t : {40, 41, 42, 43, 44}) prompt.push_back(t);
  }
  auto sink = Run(Req(prompt, 40, SpecMode::kNgram, 4));
  sink->Wait();
  ASSERT_TRUE(sink->status().ok()) << sink->status();
  EXPECT_EQ(sink->tokens(), ExpectedGreedy(*target_path_, prompt, 40));
  EXPECT_GT(sink->completion().speculation().draft_tokens(), 0);
  // Sampled too: a point-mass q is still verified losslessly; same seed, same text.
  auto a = Req(prompt, 30, SpecMode::kNgram, 3);
  a.params.temperature = 0.8f;
  a.params.seed = 9;
  auto s1 = Run(a);
  s1->Wait();
  ASSERT_TRUE(s1->status().ok());
  EXPECT_EQ(s1->tokens().size(), 30u);
}

// A seed the client chose pins a sampled request's k (its text must replay); one the router
// picked does not, so with every verified row priced at a whole step (compute-bound) the
// unseeded request drafts nothing while the seeded one drafts on the nominal costs. Both are
// answered, and the unseeded one is told the seed it ran with.
TEST_F(RouterEngineTest, OnlyAClientChosenSeedPinsSampledK) {
  RouterOptions o;
  o.verify_cost = spec::CostCurve({{1, 1.0}, {64, 64.0}});
  o.track_load = false;
  Make(o, 256, /*with_draft=*/false);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 6; ++i) {
    for (int32_t t : {40, 41, 42, 43, 44}) prompt.push_back(t);
  }
  for (bool seeded : {true, false}) {
    ValidatedRequest r = Req(prompt, 30, SpecMode::kNgram);
    r.params.temperature = 0.7f;
    r.params.seed = 3;
    r.seed_set = seeded;
    auto sink = Run(r);
    sink->Wait();
    ASSERT_TRUE(sink->status().ok()) << sink->status();
    EXPECT_EQ(sink->tokens().size(), 30u);
    const int64_t drafted = sink->completion().speculation().draft_tokens();
    if (seeded) {
      EXPECT_GT(drafted, 0);
      EXPECT_EQ(sink->completion().seed(), 3u);
    } else {
      EXPECT_EQ(drafted, 0);
    }
  }
}

// AUTO tries the n-gram lookup first each step: text that repeats its context is drafted for
// free even when the draft model is never right, and with no draft service at all.
TEST_F(RouterEngineTest, AutoDraftsRepeatedTextFromTheLookup) {
  const std::string bad = NeverRightDraft("router_bad_draft_auto");
  ASSERT_FALSE(bad.empty());
  std::vector<int32_t> prompt;
  for (int i = 0; i < 6; ++i) {
    for (int32_t t : {40, 41, 42, 43, 44}) prompt.push_back(t);
  }
  const std::vector<int32_t> want = ExpectedGreedy(*target_path_, prompt, 40);
  Make({}, 256, true, &bad);
  auto draft_only = Run(Req(prompt, 40, SpecMode::kDraft, 0));
  draft_only->Wait();
  ASSERT_TRUE(draft_only->status().ok()) << draft_only->status();
  EXPECT_EQ(draft_only->tokens(), want);
  EXPECT_EQ(draft_only->completion().speculation().accepted_tokens(), 0) << "the control";
  auto sink = Run(Req(prompt, 40, SpecMode::kAuto, 0));
  sink->Wait();
  ASSERT_TRUE(sink->status().ok()) << sink->status();
  EXPECT_EQ(sink->tokens(), want);
  EXPECT_GT(sink->completion().speculation().accepted_tokens(), 0);
  EXPECT_NE(metrics_.Text().find("mode=\"ngram\",position=\"1\""), std::string::npos);
  engine_->Stop();
  Make({}, 256, /*with_draft=*/false);
  auto alone = Run(Req(prompt, 40, SpecMode::kAuto, 0));
  alone->Wait();
  ASSERT_TRUE(alone->status().ok()) << alone->status();
  EXPECT_EQ(alone->tokens(), want);
  EXPECT_GT(alone->completion().speculation().accepted_tokens(), 0);
}

TEST_F(RouterEngineTest, ConcurrentRequestsWithChunkedPrefill) {
  RouterOptions o;
  o.scheduler.max_batch_tokens = 16;  // forces chunked prefill mixed with decode rows
  Make(o);
  std::vector<std::shared_ptr<Collect>> sinks;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(SyntheticPrompt(10 + 7 * i, i));
    sinks.push_back(Run(Req(prompts.back(), 12, i % 2 ? SpecMode::kDraft : SpecMode::kOff, 3)));
  }
  for (int i = 0; i < 6; ++i) {
    sinks[i]->Wait();
    ASSERT_TRUE(sinks[i]->status().ok());
    EXPECT_EQ(sinks[i]->tokens(), ExpectedGreedy(*target_path_, prompts[i], 12)) << i;
  }
}

TEST_F(RouterEngineTest, StopStringSpanningTokens) {
  Make();
  const auto prompt = SyntheticPrompt(12, 3);
  const auto want = ExpectedGreedy(*target_path_, prompt, 40);
  // A stop string that starts inside token 5's text and ends inside a later token.
  std::string before = tokenizer_->Decode(std::vector<int32_t>(want.begin(), want.begin() + 5), true);
  std::string full = tokenizer_->Decode(want, true);
  ASSERT_GT(full.size(), before.size() + 4);
  size_t start = before.size() > 0 ? before.size() - 1 : 0;
  std::string stop = full.substr(start, 4);
  const size_t first = full.find(stop);
  auto r = Req(prompt, 40, SpecMode::kDraft, 3);
  r.stop = {stop};
  auto sink = Run(r);
  sink->Wait();
  EXPECT_EQ(sink->completion().finish_reason(), specd::v1::FINISH_REASON_STOP_STRING);
  EXPECT_EQ(sink->text(), full.substr(0, first));
  EXPECT_EQ(sink->completion().stop(), stop);
}

TEST_F(RouterEngineTest, CancelReleasesKvOnBothServices) {
  Make();
  ValidatedRequest r = Req(SyntheticPrompt(30, 4), 400, SpecMode::kDraft, 2);
  auto sink = std::make_shared<Collect>();
  auto id = engine_->Submit(r, sink);
  ASSERT_TRUE(id.ok());
  sink->WaitFirst();
  EXPECT_GT(target_->Info().kv_used_blocks(), 0);
  engine_->Cancel(*id);
  sink->Wait();
  EXPECT_EQ(sink->status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(engine_->WaitIdle(absl::Seconds(5)));
  EXPECT_EQ(target_->Info().kv_used_blocks(), 0);
  EXPECT_EQ(draft_->Info().kv_used_blocks(), 0);
  // The router's gauge follows the releases (it used to keep the last step's count).
  const std::string text = metrics_.Text();
  EXPECT_NE(text.find("specd_router_kv_blocks{service=\"target\",state=\"used\"} 0\n"),
            std::string::npos) << text;
  EXPECT_NE(text.find("specd_router_kv_blocks{service=\"draft\",state=\"used\"} 0\n"),
            std::string::npos) << text;
}

// A request that ends on the end-of-generation token: that token is produced by a target step
// but not returned, and mean_accepted_length counts it, so it never falls below 1 (a plain
// decode is exactly 1 token per step).
TEST_F(RouterEngineTest, MeanAcceptedLengthCountsTheEosStep) {
  // A livelier target than the fixture's (larger weights: it does not settle on one token),
  // then the same weights with the first token it emits that it had not emitted before
  // declared EOS.
  testing::TinyModelSpec spec;
  spec.seed = 23;
  spec.weight_scale = 0.5f;
  const std::string lively = ::testing::TempDir() + "/router_tiny_lively.gguf";
  ASSERT_TRUE(testing::WriteTinyModel(spec, lively).ok());
  std::vector<int32_t> prompt, out;
  size_t cut = 0;
  for (int salt = 0; salt < 64 && cut == 0; ++salt) {
    prompt = SyntheticPrompt(12, salt);
    out = ExpectedGreedy(lively, prompt, 16);
    ASSERT_EQ(out.size(), 16u);
    cut = 1;
    while (cut < out.size() &&
           std::find(out.begin(), out.begin() + cut, out[cut]) != out.begin() + cut) {
      ++cut;
    }
    if (cut == out.size()) cut = 0;  // one token over and over: try another prompt
  }
  ASSERT_GT(cut, 0u) << "every prompt makes the tiny model repeat one token";
  const std::vector<int32_t> want(out.begin(), out.begin() + cut);
  spec.eos_token_id = out[cut];
  const std::string path = ::testing::TempDir() + "/router_tiny_21_eos.gguf";
  ASSERT_TRUE(testing::WriteTinyModel(spec, path).ok());
  auto file = gguf::GgufFile::Open(path);
  ASSERT_TRUE(file.ok());
  auto tokenizer = tok::Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tokenizer.ok());
  ASSERT_TRUE((*tokenizer)->IsEndOfGeneration(out[cut]));
  Make({}, 256, true, nullptr, &path, 0, tokenizer->get());
  for (SpecMode mode : {SpecMode::kOff, SpecMode::kDraft}) {
    ValidatedRequest r = Req(prompt, 16, mode, mode == SpecMode::kOff ? 0 : 3);
    r.params.ignore_eos = false;
    auto sink = Run(r);
    sink->Wait();
    ASSERT_TRUE(sink->status().ok()) << sink->status();
    const specd::v1::Completion c = sink->completion();
    EXPECT_EQ(c.finish_reason(), specd::v1::FINISH_REASON_EOS);
    EXPECT_EQ(sink->tokens(), want);
    const specd::v1::SpeculationStats& s = c.speculation();
    ASSERT_GT(s.target_steps(), 0);
    EXPECT_GE(s.mean_accepted_length(), 1.0) << "mode " << static_cast<int>(mode);
    EXPECT_DOUBLE_EQ(s.mean_accepted_length(),
                     static_cast<double>(want.size() + 1) / s.target_steps());
    if (mode == SpecMode::kOff) {
      EXPECT_DOUBLE_EQ(s.mean_accepted_length(), 1.0);
    }
  }
}

TEST_F(RouterEngineTest, DeadlineExceeded) {
  Make();
  target_->set_down(true);  // nothing can progress: the deadline must end the request
  auto sink = std::make_shared<Collect>();
  ASSERT_TRUE(engine_->Submit(Req(SyntheticPrompt(30, 5), 400, SpecMode::kOff), sink,
                              absl::Now() + absl::Milliseconds(30)).ok());
  sink->Wait();
  EXPECT_EQ(sink->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(metrics_.Text().find("specd_router_requests_total{code=\"DEADLINE_EXCEEDED\"} 1"),
            std::string::npos)
      << "counted as a deadline, not a cancellation";
  target_->set_down(false);
  EXPECT_TRUE(engine_->WaitIdle(absl::Seconds(5)));
  EXPECT_EQ(target_->Info().kv_used_blocks(), 0);
}

TEST_F(RouterEngineTest, FullQueueIsResourceExhaustedAtOnce) {
  RouterOptions o;
  o.scheduler.max_running = 1;
  o.scheduler.max_queue = 2;
  Make(o);
  std::vector<std::shared_ptr<Collect>> ok;
  int refused = 0;
  for (int i = 0; i < 8; ++i) {
    auto sink = std::make_shared<Collect>();
    const absl::Time t0 = absl::Now();
    auto id = engine_->Submit(Req(SyntheticPrompt(8, i), 50, SpecMode::kOff), sink);
    if (!id.ok()) {
      EXPECT_EQ(id.status().code(), absl::StatusCode::kResourceExhausted);
      EXPECT_LT(absl::Now() - t0, absl::Milliseconds(50));
      ++refused;
    } else {
      ok.push_back(sink);
    }
  }
  EXPECT_GE(refused, 4);
  for (auto& s : ok) {
    s->Wait();
    EXPECT_TRUE(s->status().ok());
  }
}

TEST_F(RouterEngineTest, PreemptionByRecomputeKeepsOutputs) {
  RouterOptions o;
  Make(o, /*target_blocks=*/10);  // 160 tokens for 4 requests growing to 70 tokens each
  std::vector<std::shared_ptr<Collect>> sinks;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(SyntheticPrompt(20, 10 + i));
    sinks.push_back(Run(Req(prompts.back(), 50, SpecMode::kDraft, 3)));
  }
  for (int i = 0; i < 4; ++i) {
    sinks[i]->Wait();
    ASSERT_TRUE(sinks[i]->status().ok()) << sinks[i]->status();
    EXPECT_EQ(sinks[i]->tokens(), ExpectedGreedy(*target_path_, prompts[i], 50)) << i;
  }
  EXPECT_GT(metrics_.router_preemptions.Value(), 0);
}

TEST_F(RouterEngineTest, DraftDownDegradesAndResumes) {
  Make();
  const auto prompt = SyntheticPrompt(15, 6);
  const auto want = ExpectedGreedy(*target_path_, prompt, 60);
  draft_->set_down(true);
  auto sink = Run(Req(prompt, 60, SpecMode::kDraft, 3));
  sink->Wait();
  ASSERT_TRUE(sink->status().ok()) << sink->status();
  EXPECT_EQ(sink->tokens(), want);
  EXPECT_EQ(sink->completion().speculation().draft_tokens(), 0);
  EXPECT_FALSE(engine_->draft_available());
  draft_->set_down(false);
  absl::SleepFor(absl::Milliseconds(80));  // past the retry interval
  auto again = Run(Req(prompt, 60, SpecMode::kDraft, 3));
  again->Wait();
  ASSERT_TRUE(again->status().ok());
  EXPECT_EQ(again->tokens(), want);
  EXPECT_GT(again->completion().speculation().draft_tokens(), 0);
  EXPECT_TRUE(engine_->draft_available());
}

TEST_F(RouterEngineTest, TargetRestartRePrefillsSeededOutputUnchanged) {
  auto sampled = [&](const std::vector<int32_t>& prompt) {
    ValidatedRequest r = Req(prompt, 60, SpecMode::kDraft, 3);
    r.params.temperature = 0.9f;
    r.params.top_p = 0.95f;
    r.params.seed = 1234;
    return r;
  };
  const auto prompt = SyntheticPrompt(25, 7);
  Make();
  auto baseline = Run(sampled(prompt));
  baseline->Wait();
  ASSERT_TRUE(baseline->status().ok());

  // Crash a few steps in (prefill and the first rounds), whatever the model's speed: 60 tokens
  // at k=3 take at least 15 steps, so the request is still running when the target dies.
  target_->CrashAfterSteps(4);
  auto sink = Run(sampled(prompt));
  for (int i = 0; i < 6000 && !target_->down(); ++i) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(target_->down()) << "the armed crash never fired";
  EXPECT_FALSE(sink->done()) << "the request finished before the crash";
  absl::SleepFor(absl::Milliseconds(60));  // the router retries against a dead target ...
  target_->Replace(std::make_unique<services::TargetWorker>(Host(*target_path_, 256)));
  target_->set_down(false);  // ... and restart with an empty KV cache
  sink->Wait();
  ASSERT_TRUE(sink->status().ok()) << sink->status();
  EXPECT_EQ(sink->tokens(), baseline->tokens());
  EXPECT_EQ(sink->text(), baseline->text());
  // The re-prefill looked in the new process's cache, which held nothing of the old one's; the
  // prompt it computed there is what the next identical request finds.
  absl::StatusOr<iv1::KvUsage> fresh = target_->Release({});
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(fresh->prefix_hit_tokens(), 0);
  EXPECT_GT(fresh->cached_blocks(), 0);
  auto again = Run(sampled(prompt));
  again->Wait();
  EXPECT_EQ(again->tokens(), baseline->tokens());
  EXPECT_EQ(again->completion().usage().cached_prompt_tokens(), 16);
  EXPECT_GE(target_->Release({})->prefix_hit_tokens(), 16);
}

// Prefix caching changes nothing in the output, token for token: greedy and seeded sampled,
// with and without speculation (draft model, n-gram), for prompts that share a prefix at a
// block boundary, one token off it, and differ inside a block; one after another (every hit
// possible) and all at once. The usage reports the cached prompt tokens.
TEST_F(RouterEngineTest, PrefixCacheOnEqualsOffTokenForToken) {
  const std::vector<int32_t> base = SyntheticPrompt(64, 3);  // 4 blocks of 16
  std::vector<std::vector<int32_t>> prompts;
  prompts.push_back(base);                                            // the whole prefix
  prompts.push_back(base);                                            // again
  prompts.push_back(std::vector<int32_t>(base.begin(), base.begin() + 48));  // at a boundary
  prompts.push_back(std::vector<int32_t>(base.begin(), base.begin() + 49));  // one past it
  prompts.push_back(std::vector<int32_t>(base.begin(), base.begin() + 47));  // one short
  std::vector<int32_t> longer = base;
  for (int i = 0; i < 21; ++i) longer.push_back(7 + i);
  prompts.push_back(longer);
  std::vector<int32_t> inside = base;
  inside[40] = 5;  // differs inside block 2
  prompts.push_back(inside);
  std::vector<ValidatedRequest> requests;
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (int variant = 0; variant < 4; ++variant) {
      ValidatedRequest r =
          Req(prompts[i], 24,
              variant == 3 ? SpecMode::kNgram : (variant == 0 ? SpecMode::kOff : SpecMode::kDraft),
              variant == 2 ? 3 : 0);
      if (variant >= 2) {  // seeded sampled
        r.params.temperature = 0.9f;
        r.params.top_p = 0.95f;
        r.params.seed = 77 + i;
      }
      requests.push_back(r);
    }
  }
  auto run_each = [&](bool caching, std::vector<int32_t>* cached) {
    prefix_caching_ = caching;
    Make();
    std::vector<std::vector<int32_t>> out;
    for (const ValidatedRequest& r : requests) {
      auto sink = Run(r);
      sink->Wait();
      EXPECT_TRUE(sink->status().ok()) << sink->status();
      out.push_back(sink->tokens());
      if (cached != nullptr) cached->push_back(sink->completion().usage().cached_prompt_tokens());
    }
    engine_->Stop();
    return out;
  };
  std::vector<int32_t> cached_off, cached_on;
  const auto off = run_each(false, &cached_off);
  const auto on = run_each(true, &cached_on);
  ASSERT_EQ(on.size(), off.size());
  int64_t total_cached = 0;
  for (size_t i = 0; i < on.size(); ++i) {
    EXPECT_EQ(on[i], off[i]) << "request " << i;
    EXPECT_EQ(cached_off[i], 0);
    EXPECT_EQ(cached_on[i] % 16, 0);
    EXPECT_LT(cached_on[i], static_cast<int32_t>(requests[i].prompt.size()));
    total_cached += cached_on[i];
  }
  EXPECT_EQ(cached_on[0], 0) << "nothing is cached before the first request";
  EXPECT_EQ(cached_on[4], 48) << "the second identical prompt: 3 blocks (the last token computes)";
  EXPECT_GT(total_cached, 1000);
  // All at once, caching on: the same tokens.
  prefix_caching_ = true;
  Make();
  std::vector<std::shared_ptr<Collect>> sinks;
  for (const ValidatedRequest& r : requests) sinks.push_back(Run(r));
  for (size_t i = 0; i < sinks.size(); ++i) {
    sinks[i]->Wait();
    ASSERT_TRUE(sinks[i]->status().ok()) << sinks[i]->status();
    EXPECT_EQ(sinks[i]->tokens(), off[i]) << "concurrent request " << i;
  }
}

// Random request streams against the same streams without the cache: prompts sharing
// prefixes of random length, greedy and seeded sampled, no speculation / draft model (adaptive
// and fixed k, partial acceptance) / n-gram, a KV pool small enough to preempt, and cancels.
// Every completed request's tokens equal the no-cache run's; a cancelled one's are a prefix of
// them; afterwards no block is referenced on either service and every block is free or cached.
TEST_F(RouterEngineTest, RandomStreamsWithTheCacheEqualTheSameWithout) {
  std::mt19937 rng(17);
  std::vector<std::vector<int32_t>> bases;
  for (int b = 0; b < 3; ++b) bases.push_back(SyntheticPrompt(70, 40 + b));
  struct Item {
    ValidatedRequest request;
    bool cancel = false;
  };
  std::vector<Item> items;
  for (int i = 0; i < 2000; ++i) {
    Item it;
    const auto& base = bases[rng() % bases.size()];
    std::vector<int32_t> prompt(base.begin(), base.begin() + 1 + rng() % base.size());
    for (int t = static_cast<int>(rng() % 4); t > 0; --t) prompt.push_back(3 + rng() % 200);
    const int mode = static_cast<int>(rng() % 4);
    it.request = Req(prompt, 4 + static_cast<int>(rng() % 16),
                     mode == 0 ? SpecMode::kOff : mode == 3 ? SpecMode::kNgram : SpecMode::kDraft,
                     mode == 2 ? 3 : 0);
    if (rng() % 2 == 0) {
      it.request.params.temperature = 0.8f;
      it.request.params.seed = 1000 + i;
    }
    it.cancel = rng() % 10 == 0;
    items.push_back(std::move(it));
  }
  RouterOptions o;
  o.scheduler.max_batch_tokens = 48;
  auto run = [&](bool caching, bool cancels) {
    SCOPED_TRACE(caching ? "cache on" : "cache off");
    prefix_caching_ = caching;
    Make(o, /*target_blocks=*/20);
    std::vector<std::shared_ptr<Collect>> sinks(items.size());
    for (size_t start = 0; start < items.size(); start += 24) {  // waves of 24 at once
      std::vector<int64_t> ids;
      for (size_t i = start; i < std::min(items.size(), start + 24); ++i) {
        sinks[i] = std::make_shared<Collect>();
        auto id = engine_->Submit(items[i].request, sinks[i]);
        EXPECT_TRUE(id.ok()) << id.status();
        ids.push_back(id.ok() ? *id : -1);
      }
      for (size_t i = start; i < std::min(items.size(), start + 24); ++i) {
        if (cancels && items[i].cancel) {
          absl::SleepFor(absl::Microseconds(rng() % 3000));
          engine_->Cancel(ids[i - start]);
        }
      }
      for (size_t i = start; i < std::min(items.size(), start + 24); ++i) sinks[i]->Wait();
    }
    // Nothing referenced once everything ended; every block free or only cached.
    for (int i = 0; i < 100 && target_->Info().kv_used_blocks() > 0; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    const iv1::ServiceInfo t = target_->Info();
    EXPECT_EQ(t.kv_used_blocks(), 0);
    EXPECT_EQ(t.num_sequences(), 0);
    EXPECT_EQ(draft_->Info().kv_used_blocks(), 0);
    EXPECT_EQ(draft_->Info().num_sequences(), 0);
    engine_->Stop();
    return sinks;
  };
  const auto off = run(false, false);
  const int64_t preempted_before = static_cast<int64_t>(metrics_.router_preemptions.Value());
  const auto on = run(true, true);
  EXPECT_GT(static_cast<int64_t>(metrics_.router_preemptions.Value()), preempted_before)
      << "the pool should be small enough to preempt";
  int completed = 0, cancelled = 0, cached = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    ASSERT_TRUE(off[i]->status().ok()) << off[i]->status();
    const std::vector<int32_t> want = off[i]->tokens(), got = on[i]->tokens();
    if (on[i]->status().ok()) {
      ++completed;
      EXPECT_EQ(got, want) << "request " << i;
      cached += on[i]->completion().usage().cached_prompt_tokens() > 0;
    } else {
      EXPECT_EQ(on[i]->status().code(), absl::StatusCode::kCancelled) << on[i]->status();
      ++cancelled;
      ASSERT_LE(got.size(), want.size());
      EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << "cancelled request " << i;
    }
  }
  EXPECT_GT(completed, 1700);
  EXPECT_GT(cancelled, 0);
  EXPECT_GT(cached, 500) << "the streams should share prefixes";
}

// A seeded sampled request with adaptive k gives the same tokens alone and in a loaded batch
// (token budget, KV pressure with preemption, greedy neighbours that do adapt): its k schedule
// follows only its own acceptance (scheduler.h, "Pinned k").
TEST_F(RouterEngineTest, SeededSampledOutputIndependentOfBatchWithAdaptiveK) {
  auto sampled = [&](int i) {
    // Long enough that a probe may pay (KPolicy::kProbePayback): this draft costs 0.65 of the
    // target (nominal), so a 40-token request would never probe it, never draft, and the test
    // would show nothing. 32 target blocks below still preempt.
    ValidatedRequest r = Req(SyntheticPrompt(12 + 5 * i, 30 + i), 400, SpecMode::kDraft, /*k=*/0);
    r.params.temperature = 1.0f;
    r.params.seed = 500 + i;
    return r;
  };
  // A peaked target and its Q4_1 sibling as draft: acceptance is partial, so a different k
  // schedule would give different samples (with the default pair nearly every draft is
  // accepted, or with near-uniform p and q the sample hardly depends on k: no test).
  auto write = [](const char* name, gguf::GgmlType type) {
    testing::TinyModelSpec spec;
    spec.seed = 5;
    spec.num_layers = 3;
    spec.weight_scale = 0.3f;
    spec.weight_type = type;
    const std::string path = ::testing::TempDir() + "/router_peaked_" + name + ".gguf";
    EXPECT_TRUE(testing::WriteTinyModel(spec, path).ok());
    return path;
  };
  const std::string target = write("target", gguf::GgmlType::kQ8_0);
  const std::string draft = write("draft", gguf::GgmlType::kQ4_1);
  std::vector<std::vector<int32_t>> alone;
  Make({}, 256, true, &draft, &target);
  for (int i = 0; i < 4; ++i) {
    auto sink = Run(sampled(i));
    sink->Wait();
    ASSERT_TRUE(sink->status().ok()) << sink->status();
    alone.push_back(sink->tokens());
  }
  engine_->Stop();
  RouterOptions o;
  o.scheduler.max_batch_tokens = 20;
  Make(o, /*target_blocks=*/32, true, &draft, &target);
  std::vector<std::shared_ptr<Collect>> sinks;
  for (int i = 0; i < 4; ++i) {
    sinks.push_back(Run(sampled(i)));
    sinks.push_back(
        Run(Req(SyntheticPrompt(20, 60 + i), 40, SpecMode::kDraft, 0)));  // greedy, adapts
  }
  for (int i = 0; i < 4; ++i) {
    sinks[2 * i]->Wait();
    ASSERT_TRUE(sinks[2 * i]->status().ok()) << sinks[2 * i]->status();
    EXPECT_EQ(sinks[2 * i]->tokens(), alone[i]) << i;
    EXPECT_GT(sinks[2 * i]->completion().speculation().draft_tokens(), 0) << i;
    sinks[2 * i + 1]->Wait();
    EXPECT_TRUE(sinks[2 * i + 1]->status().ok());
  }
  EXPECT_GT(metrics_.router_preemptions.Value(), 0);
}

// A draft that is never right: the first greedy request learns it (drafting some steps from
// the policy's hopeful prior for a drafter it has no evidence of); later ones start from the
// router-wide acceptance and hardly draft at all.
TEST_F(RouterEngineTest, AdaptiveKStartsFromTheDraftsTrackRecord) {
  const std::string bad = NeverRightDraft("router_bad_draft");
  ASSERT_FALSE(bad.empty());
  Make({}, 256, true, &bad);
  std::vector<int32_t> drafted;
  for (int i = 0; i < 10; ++i) {
    // DRAFT: the draft model alone (AUTO would also try the n-gram lookup, which these models'
    // repetitive text rewards).
    auto sink = Run(Req(SyntheticPrompt(10, 40 + i), 30, SpecMode::kDraft, 0));
    sink->Wait();
    ASSERT_TRUE(sink->status().ok()) << sink->status();
    EXPECT_EQ(sink->tokens(), ExpectedGreedy(*target_path_, SyntheticPrompt(10, 40 + i), 30));
    EXPECT_EQ(sink->completion().speculation().accepted_tokens(), 0);
    drafted.push_back(sink->completion().speculation().draft_tokens());
  }
  EXPECT_GE(drafted[0], 4);
  // From the fourth request on, a probe or two, or a k = 1 step the prior still finds worth it
  // (a draft round is cheap here): a quarter of the first request's drafting at most, and the
  // last five requests together less than the first. Measured: 20 7 5 4 3 3 2 2 2 2 (13 6 4 3
  // 3 2 2 2 2 2 before new_sequence_prior's optimism: it costs the first requests, not later).
  int32_t last_five = 0;
  for (size_t i = 3; i < drafted.size(); ++i) {
    EXPECT_LE(4 * drafted[i], drafted[0]) << i;
    if (i >= drafted.size() - 5) last_five += drafted[i];
  }
  EXPECT_LT(last_five, drafted[0]);
}

TEST_F(RouterEngineTest, RequestLargerThanKvCapacityIsRefused) {
  Make({}, /*target_blocks=*/4);  // 64 tokens
  auto id =
      engine_->Submit(Req(SyntheticPrompt(20, 1), 60, SpecMode::kOff), std::make_shared<Collect>());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(id.status().message()).rfind("sampling.max_new_tokens", 0), 0u);
  auto fits = Run(Req(SyntheticPrompt(20, 1), 40, SpecMode::kOff));
  fits->Wait();
  EXPECT_TRUE(fits->status().ok());
}

TEST_F(RouterEngineTest, DrainRefusesNewAndFinishesInFlight) {
  Make();
  auto sink = Run(Req(SyntheticPrompt(10, 8), 30, SpecMode::kOff));
  engine_->BeginDrain();
  auto refused =
      engine_->Submit(Req(SyntheticPrompt(10, 9), 5, SpecMode::kOff), std::make_shared<Collect>());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(engine_->WaitIdle(absl::Seconds(60)));
  EXPECT_TRUE(sink->status().ok());
  EXPECT_EQ(sink->tokens().size(), 30u);
}

// The target as a service that takes a step's request before answering it: StepOverlapping
// counts the step as issued, runs the caller's overlapped work, then answers. `issued` is read
// by the sink below when a chunk reaches it.
// A test's wrapper around a target backend: everything goes to `inner_`; a wrapper overrides
// what it watches or delays.
class ForwardingTarget : public TargetBackend {
 public:
  explicit ForwardingTarget(std::unique_ptr<TargetBackend> inner) : inner_(std::move(inner)) {}
  absl::StatusOr<iv1::TargetStepResponse> Step(const iv1::TargetStepRequest& r) override {
    return inner_->Step(r);
  }
  absl::StatusOr<iv1::KvUsage> Release(const std::vector<int64_t>& ids) override {
    return inner_->Release(ids);
  }
  absl::StatusOr<iv1::ServiceInfo> GetInfo() override { return inner_->GetInfo(); }

 protected:
  std::unique_ptr<TargetBackend> inner_;
};

class IssuingTarget final : public ForwardingTarget {
 public:
  using ForwardingTarget::ForwardingTarget;
  absl::StatusOr<iv1::TargetStepResponse> Step(const iv1::TargetStepRequest& r) override {
    ++issued;
    return inner_->Step(r);
  }
  absl::StatusOr<iv1::TargetStepResponse> StepOverlapping(
      const iv1::TargetStepRequest& r, absl::FunctionRef<void()> while_waiting) override {
    ++issued;
    while_waiting();
    auto answer = inner_->Step(r);
    ++answered;
    return answer;
  }
  std::atomic<int> issued{0};
  std::atomic<int> answered{0};
};

// Per chunk: how many target steps had been issued, and answered, when it reached the sink.
class IssuedAtChunk final : public Collect {
 public:
  explicit IssuedAtChunk(const IssuingTarget* t) : target_(t) {}
  void OnChunk(specd::v1::GenerateStreamResponse chunk) override {
    {
      absl::MutexLock l(&mu_);
      issued_.push_back(target_->issued.load());
      answered_.push_back(target_->answered.load());
    }
    Collect::OnChunk(std::move(chunk));
  }
  std::vector<int> issued() {
    absl::MutexLock l(&mu_);
    return issued_;
  }
  std::vector<int> answered() {
    absl::MutexLock l(&mu_);
    return answered_;
  }

 private:
  const IssuingTarget* target_;
  absl::Mutex mu_;
  std::vector<int> issued_, answered_;
};

// A step's tokens reach the client while the next step is on the target (the client's write
// never delays that step), except a request's last chunk, which goes as the request ends
// (before its completion, and before the engine is idle). With overlap_client_writes off, each
// chunk goes before the next step is issued. Same tokens either way.
TEST_F(RouterEngineTest, TokensReachTheClientWhileTheNextStepRuns) {
  const auto prompt = SyntheticPrompt(10, 4);
  const int n = 6;
  const auto want = ExpectedGreedy(*target_path_, prompt, n);
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlapped" : "not overlapped");
    RouterOptions o;
    o.overlap_client_writes = overlap;
    o.verify_cost = spec::CostCurve({{1, 1.0}, {64, 1.63}});
    o.track_load = false;
    auto target = std::make_unique<IssuingTarget>(std::make_unique<LocalTargetBackend>(
        std::make_unique<services::TargetWorker>(Host(*target_path_, 64))));
    const IssuingTarget* t = target.get();
    RouterEngine engine(o, std::move(target), nullptr, *tokenizer_, &metrics_);
    ASSERT_TRUE(engine.Start().ok());
    auto sink = std::make_shared<IssuedAtChunk>(t);
    ASSERT_TRUE(engine.Submit(Req(prompt, n, SpecMode::kOff), sink).ok());
    sink->Wait();
    ASSERT_TRUE(sink->status().ok()) << sink->status();
    EXPECT_EQ(sink->tokens(), want);
    // One step per token here (a short prompt prefills in one step, no drafts): step i emits
    // token i. Overlapped, chunk i goes while step i + 1 is issued; the last as it ends.
    const std::vector<int> at = sink->issued();
    ASSERT_EQ(at.size(), static_cast<size_t>(n));
    const int base = t->issued.load() - n;  // steps before the request's (none expected)
    EXPECT_EQ(base, 0);
    const std::vector<int> done = sink->answered();
    for (int i = 0; i < n; ++i) {
      const bool during_next = overlap && i + 1 < n;
      EXPECT_EQ(at[i] - base, during_next ? i + 2 : i + 1) << "chunk " << i;
      // Overlapped: step i + 2 was issued and not yet answered (the chunk went during it).
      EXPECT_EQ(done[i] - base, i + 1) << "chunk " << i;
    }
    EXPECT_TRUE(engine.WaitIdle(absl::Seconds(10)));
    engine.Stop();
  }
}

// A deadline that passes while the client also cancels (a gRPC deadline does both) counts as
// DEADLINE_EXCEEDED.
TEST_F(RouterEngineTest, DeadlineWinsOverTheCancelItCauses) {
  Make();
  target_->set_down(true);
  auto sink = std::make_shared<Collect>();
  absl::StatusOr<int64_t> id = engine_->Submit(Req(SyntheticPrompt(30, 5), 400, SpecMode::kOff),
                                               sink, absl::Now() + absl::Milliseconds(20));
  ASSERT_TRUE(id.ok());
  absl::SleepFor(absl::Milliseconds(40));
  engine_->Cancel(*id);
  sink->Wait();
  EXPECT_EQ(sink->status().code(), absl::StatusCode::kDeadlineExceeded);
  target_->set_down(false);
}

// Model drafts and n-gram drafts are counted apart (the mode label).
TEST_F(RouterEngineTest, AcceptanceIsCountedPerDrafter) {
  Make();
  for (SpecMode mode : {SpecMode::kDraft, SpecMode::kNgram}) {
    auto sink = std::make_shared<Collect>();
    ASSERT_TRUE(engine_->Submit(Req(SyntheticPrompt(40, 3), 40, mode, 3), sink).ok());
    sink->Wait();
    ASSERT_TRUE(sink->status().ok());
  }
  const std::string text = metrics_.Text();
  EXPECT_NE(text.find("mode=\"draft\",position=\"1\""), std::string::npos) << text;
  EXPECT_NE(text.find("mode=\"ngram\",position=\"1\""), std::string::npos) << text;
}

// The router's mirror of the draft service: after each verification's Commit,
// RemoteDrafter::CachedLength is what an in-process ModelDrafter on the same model keeps (its KV
// after its own Commit): the committed tokens it was fed and the drafts the target accepted,
// however many were. The adaptive-k policy prices the draft's catch-up from it.
TEST_F(RouterEngineTest, RemoteDrafterKeepsWhatAnInProcessDrafterKeeps) {
  services::Metrics metrics;
  LocalDraftBackend backend(std::make_unique<services::DraftWorker>(
      Host(*draft_path_, 256, 0, false), services::DraftWorkerOptions{0.0, 0.0}));
  RemoteDrafter remote(&backend, &metrics);
  remote.set_available(true);
  std::unique_ptr<services::ModelHost> twin_host = Host(*draft_path_, 256, 0, false);
  spec::ModelDrafterOptions o;
  o.max_batch_tokens = twin_host->options().max_batch_tokens;
  auto twin = spec::ModelDrafter::CreateOnRunner(twin_host.get(), o, "twin");
  ASSERT_TRUE(twin.ok()) << twin.status();
  const int32_t vocab = twin_host->model().vocab_size();

  const spec::SeqId seq = 7;
  std::vector<int32_t> tokens = SyntheticPrompt(30, 5);
  sampling::SamplingParams params;
  params.temperature = 0;
  const sampling::PenaltyState history;
  const sampling::CounterRng rng(1);
  std::mt19937 outcome(11);
  int drafts_kept = 0;
  for (int step = 0; step < 32; ++step) {
    const int32_t k = 1 + step % 4;
    const spec::DraftInput in{seq, tokens, &params, &history, &rng, k, 30};
    std::vector<spec::DraftOutput> from_service(1), from_twin(1);
    ASSERT_TRUE(remote.Propose({&in, 1}, absl::MakeSpan(from_service)).ok());
    ASSERT_TRUE((*twin)->Propose({&in, 1}, absl::MakeSpan(from_twin)).ok());
    ASSERT_EQ(from_service[0].proposals.size(), static_cast<size_t>(k));
    for (int32_t i = 0; i < k; ++i) {
      ASSERT_EQ(from_service[0].proposals[i].token, from_twin[0].proposals[i].token);
    }
    // The target accepts j of the k drafts, then emits a token of its own (a correction, or
    // the bonus after all k).
    const int32_t j = static_cast<int32_t>(outcome() % (k + 1));
    const size_t before = tokens.size();
    for (int32_t i = 0; i < j; ++i) tokens.push_back(from_service[0].proposals[i].token);
    tokens.push_back(j < k ? (from_service[0].proposals[j].token + 1) % vocab : 3);
    ASSERT_TRUE(remote.Commit(seq, tokens).ok());
    ASSERT_TRUE((*twin)->Commit(seq, tokens).ok());
    ASSERT_EQ(remote.CachedLength(seq), (*twin)->CachedLength(seq))
        << "step " << step << ": k " << k << ", accepted " << j;
    drafts_kept += static_cast<int>(remote.CachedLength(seq) - static_cast<int64_t>(before));
  }
  EXPECT_GT(drafts_kept, 10);  // accepted drafts the service already holds were counted
  remote.Release(seq);
  EXPECT_EQ(remote.CachedLength(seq), -1);
}

// The router's counters, 0 where a family has no sample yet.
double SumSamples(const std::string& text, const std::string& family, const std::string& label = "") {
  return specd::testing::MetricSum(text, family, label, /*absent=*/0);
}

TEST(StepBatchLabelTest, Buckets) {
  const std::vector<std::pair<int64_t, std::string>> want = {
      {0, "1"},    {1, "1"},     {2, "2"},      {3, "3-4"},    {4, "3-4"},  {5, "5-8"},
      {8, "5-8"},  {9, "9-16"},  {16, "9-16"},  {17, "17-32"}, {32, "17-32"}, {33, "33+"},
      {512, "33+"}};
  for (const auto& [n, label] : want) EXPECT_EQ(services::StepBatchLabel(n), label) << n;
}

// The target, with its steps held while `held`: requests submitted meanwhile all wait for the
// next step, however the test's threads are scheduled.
class HeldTarget final : public ForwardingTarget {
 public:
  using ForwardingTarget::ForwardingTarget;
  absl::StatusOr<iv1::TargetStepResponse> Step(const iv1::TargetStepRequest& r) override {
    {
      absl::MutexLock l(&mu_);
      ++waiting_;
      mu_.Await(absl::Condition(this, &HeldTarget::Free));
      --waiting_;
    }
    return inner_->Step(r);
  }
  void Hold(bool held) {
    absl::MutexLock l(&mu_);
    held_ = held;
  }
  // Returns once a step waits for the hold to end.
  void AwaitHeldStep() {
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(this, &HeldTarget::StepWaits));
  }

 private:
  bool Free() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !held_; }
  bool StepWaits() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return waiting_ > 0; }
  absl::Mutex mu_;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

// The fixture's next Make() puts its target behind a HeldTarget; *held points at it after Make.
void HoldTargets(
    std::function<std::unique_ptr<TargetBackend>(std::unique_ptr<TargetBackend>)>& wrap,
    HeldTarget** held) {
  wrap = [held](std::unique_ptr<TargetBackend> t) {
    auto h = std::make_unique<HeldTarget>(std::move(t));
    *held = h.get();
    return std::unique_ptr<TargetBackend>(std::move(h));
  };
}

TEST_F(RouterEngineTest, DraftsAreCountedByTheSizeOfTheirStep) {
  HeldTarget* held = nullptr;
  HoldTargets(wrap_target_, &held);
  Make();
  ASSERT_NE(held, nullptr);
  const std::string proposed = "specd_router_batch_draft_proposed_tokens_total";
  const std::string accepted = "specd_router_batch_draft_accepted_tokens_total";
  // Alone: every draft is verified in a step of one sequence.
  auto alone = Run(Req(SyntheticPrompt(24, 5), 24, SpecMode::kDraft, 3));
  alone->Wait();
  ASSERT_TRUE(alone->status().ok()) << alone->status();
  std::string text = metrics_.Text();
  const double drafted_alone = alone->completion().speculation().draft_tokens();
  ASSERT_GT(drafted_alone, 0);
  EXPECT_EQ(SumSamples(text, proposed, "batch=\"1\""), drafted_alone) << text;
  EXPECT_EQ(SumSamples(text, proposed), drafted_alone) << text;
  EXPECT_EQ(SumSamples(text, accepted), alone->completion().speculation().accepted_tokens());
  // Three at once (submitted while the target's steps are held, so from the second step on
  // all three decode together): most of their steps verify all three.
  held->Hold(true);
  std::vector<std::shared_ptr<Collect>> sinks;
  for (int i = 0; i < 3; ++i)
    sinks.push_back(Run(Req(SyntheticPrompt(24, 6 + i), 48, SpecMode::kDraft, 3)));
  held->Hold(false);
  double drafted = drafted_alone, accepted_all = alone->completion().speculation().accepted_tokens();
  for (const auto& sink : sinks) {
    sink->Wait();
    ASSERT_TRUE(sink->status().ok()) << sink->status();
    drafted += sink->completion().speculation().draft_tokens();
    accepted_all += sink->completion().speculation().accepted_tokens();
  }
  text = metrics_.Text();
  EXPECT_GT(SumSamples(text, proposed, "batch=\"3-4\""), 0) << text;
  // Every draft is in exactly one batch bucket, as in the per-position counters.
  EXPECT_EQ(SumSamples(text, proposed), drafted) << text;
  EXPECT_EQ(SumSamples(text, proposed), SumSamples(text, "specd_router_draft_proposed_tokens_total"));
  EXPECT_EQ(SumSamples(text, accepted), accepted_all) << text;
  EXPECT_EQ(SumSamples(text, accepted), SumSamples(text, "specd_router_draft_accepted_tokens_total"));
}

// Every target step and the draft rounds are priced by the cost model and observed against it;
// the steps the step bound limits (prompt tokens beside decoding sequences) are timed apart.
TEST_F(RouterEngineTest, StepsArePricedAndStepsBesideDecodersTimed) {
  HeldTarget* held = nullptr;
  HoldTargets(wrap_target_, &held);
  RouterOptions o;
  o.scheduler.step_seconds_while_decoding = 0.05;
  prefix_caching_ = false;  // no prefix lookups: the first held step is a's prefill
  Make(o);
  ASSERT_NE(held, nullptr);
  std::string text = metrics_.Text();
  EXPECT_NE(text.find("\nspecd_router_step_bound_seconds 0.05\n"), std::string::npos) << text;
  held->Hold(true);
  auto a = Run(Req(SyntheticPrompt(24, 5), 48, SpecMode::kDraft, 3));
  held->AwaitHeldStep();  // a's prefill: b arrives after it, and goes in while a decodes
  auto b = Run(Req(SyntheticPrompt(40, 7), 8, SpecMode::kDraft, 3));
  held->Hold(false);
  a->Wait();
  b->Wait();
  ASSERT_TRUE(a->status().ok()) << a->status();
  ASSERT_TRUE(b->status().ok()) << b->status();
  text = metrics_.Text();
  const double steps = SumSamples(text, "specd_router_step_tokens_count");
  ASSERT_GT(steps, 0) << text;
  const std::string ratio = "specd_router_step_cost_ratio";
  EXPECT_EQ(SumSamples(text, ratio + "_count", "stage=\"target\""), steps) << text;
  EXPECT_GT(SumSamples(text, ratio + "_sum", "stage=\"target\""), 0) << text;
  // The draft rounds the draft curve priced: not the catch-up of a's and b's first rounds.
  const double draft_rounds = SumSamples(text, ratio + "_count", "stage=\"draft\"");
  EXPECT_GT(draft_rounds, 0) << text;
  EXPECT_LT(draft_rounds, steps) << text;
  EXPECT_GT(SumSamples(text, ratio + "_sum", "stage=\"draft\""), 0) << text;
  // b's prompt went in beside a's decoding (in chunks: the tests' curve prices any step over
  // the 50 ms bound, so each chunk is one block); a's and b's other steps are not counted.
  const double mixed = SumSamples(text, "specd_router_mixed_step_seconds_count");
  EXPECT_GE(mixed, 2) << text;
  EXPECT_LT(mixed, steps) << text;
}

}  // namespace
}  // namespace specd::router
