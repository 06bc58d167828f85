// Greedy speculative output == plain greedy output, token for token, on the REAL default model
// (SmolLM2-135M-Instruct Q4_1) for 20 prompts x each drafter (the same file as a draft model,
// self-speculation on the first 4 layers, n-gram) x k in {1, 4, 8}, batched, plus each drafter
// alone (one sequence at a time, k = 4). Adaptive k is covered on tiny models
// (spec_engine_test) to keep this test's runtime sane. Relies on the CPU kernels' batch
// invariance: a verify row's logits equal a plain decode step's bitwise.
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/gguf/gguf_file.h"
#include "speculation/model_drafter.h"
#include "speculation/ngram_drafter.h"
#include "speculation/spec_engine.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "testing/tiny_model.h"
#include "gtest/gtest.h"
#include "tests/unit/spec_test_util.h"

namespace specd::spec {
namespace {

constexpr int kNew = 24;

const char* const kPrompts[] = {
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The three primary colors are",
    "To make a cup of tea, first",
    "Water boils at 100 degrees Celsius. Water boils at",
    "List of planets: Mercury, Venus, Earth, Mars,",
    "Q: What is 12 times 12?\nA:",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "In machine learning, overfitting means",
    "import numpy as np\nimport",
    "Monday, Tuesday, Wednesday,",
    "The best way to learn a new language is",
    "Photosynthesis is the process by which",
    "Dear Sir or Madam,\nI am writing to",
    "1, 2, 3, 4, 5, 6,",
    "A haiku about autumn:\n",
    "The mitochondria is",
    "SELECT name FROM users WHERE",
    "Speculative decoding speeds up inference by",
};

class SpecModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string(test::SourceDir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if (!std::ifstream(*path_).good()) return;
    backend_ = engine::MakeCpuBackend(2).release();
    target_ = test::LoadModel(*path_, backend_, 256, 256).release();
    auto tk = tok::Tokenizer::FromGguf(*target_->file);
    ASSERT_TRUE(tk.ok());
    identity_ = new TargetIdentity{*path_, (*tk)->Fingerprint(), (*tk)->vocab_size(),
                                   target_->file.get()};
    prompts_ = new std::vector<std::vector<int32_t>>();
    auto tmpl = tok::ChatTemplate::FromGguf(*target_->file);
    int i = 0;
    for (const char* p : kPrompts) {
      std::string text = p;
      const bool chat = tmpl.ok() && i++ % 4 == 3;  // every 4th as a chat turn
      if (chat) {
        const tok::ChatMessage msg{"user", p};
        auto applied = tmpl->Apply({&msg, 1}, true);
        ASSERT_TRUE(applied.ok());
        text = *applied;
      }
      auto ids = (*tk)->Encode(text, true, chat);
      ASSERT_TRUE(ids.ok());
      prompts_->push_back(*ids);
    }
    sampling::SamplingParams g;
    g.temperature = 0;
    g.ignore_eos = true;
    params_ = new std::vector<sampling::SamplingParams>(prompts_->size(), g);
    plain_ = new std::vector<std::vector<int32_t>>(
        test::PlainGenerate(*target_->model, *prompts_, *params_, kNew, {}));
  }

  void SetUp() override {
    if (target_ == nullptr) GTEST_SKIP() << "default model not found at " << *path_;
  }

  std::unique_ptr<Drafter> MakeDrafter(const std::string& kind) {
    ModelDrafterOptions o;
    o.kv_blocks = 256;
    if (kind == "same-file") {
      auto d = ModelDrafter::CreateFromFile(*path_, *identity_, backend_, o);
      EXPECT_TRUE(d.ok()) << d.status();
      return d.ok() ? std::move(*d) : nullptr;
    }
    if (kind == "distilled") {
      auto d = ModelDrafter::CreateFromFile(ShippedDraftPath(), *identity_, backend_, o);
      EXPECT_TRUE(d.ok()) << d.status();
      return d.ok() ? std::move(*d) : nullptr;
    }
    if (kind == "self-4") {
      auto d = ModelDrafter::CreateSelf(*target_->file, 4, backend_, o);
      EXPECT_TRUE(d.ok()) << d.status();
      return d.ok() ? std::move(*d) : nullptr;
    }
    return std::move(*NgramDrafter::Create({}));
  }

  void Check(const std::string& kind, int k, int running, bool adaptive) {
    auto d = MakeDrafter(kind);
    ASSERT_TRUE(d);
    SpecEngineOptions o;
    o.k = k;
    o.max_running = running;
    o.kv_blocks = 256;
    o.adaptive_k = adaptive;
    auto e = SpecEngine::Create(target_->model.get(), d.get(), o);
    ASSERT_TRUE(e.ok()) << e.status();
    const auto got = test::EngineGenerate(**e, *prompts_, *params_, kNew);
    for (size_t i = 0; i < prompts_->size(); ++i) {
      ASSERT_EQ(got[i], (*plain_)[i]) << kind << " k=" << k << " running=" << running
                                      << " adaptive=" << adaptive << " prompt " << i;
    }
    const SpecStats& s = (*e)->stats();
    std::printf("%-9s k=%d running=%2d%s: mean accepted length %.2f, acceptance %.2f\n",
                kind.c_str(), k, running, adaptive ? " adaptive" : "", s.MeanAcceptedLength(),
                s.AcceptanceRate());
    if (!adaptive) {
      EXPECT_GT(s.drafted, 0);
    }
    if (kind == "same-file" && !adaptive) {
      EXPECT_GT(s.AcceptanceRate(), 0.95);
    }
    if (kind == "distilled" && !adaptive && k >= 2) {
      // On these prompts (mostly raw text, which the draft never trained on) the 4-layer
      // self-draft's mean accepted length is 1.04 and the distilled draft's ~1.45-1.5
      // (measured 2026-12-01); on held-out chat prompts see docs/PERFORMANCE.md.
      EXPECT_GT(s.MeanAcceptedLength(), 1.3);
    }
    EXPECT_EQ((*e)->kv_cache().num_used_blocks(), 0);
  }

  static std::string ShippedDraftPath() {
    return test::SourceDir() + "/drafts/SmolLM2-135M-Instruct.Q4_1.draft.gguf";
  }

  static std::string* path_;
  static engine::Backend* backend_;
  static test::LoadedModel* target_;
  static TargetIdentity* identity_;
  static std::vector<std::vector<int32_t>>* prompts_;
  static std::vector<sampling::SamplingParams>* params_;
  static std::vector<std::vector<int32_t>>* plain_;
};

std::string* SpecModelTest::path_ = nullptr;
engine::Backend* SpecModelTest::backend_ = nullptr;
test::LoadedModel* SpecModelTest::target_ = nullptr;
TargetIdentity* SpecModelTest::identity_ = nullptr;
std::vector<std::vector<int32_t>>* SpecModelTest::prompts_ = nullptr;
std::vector<sampling::SamplingParams>* SpecModelTest::params_ = nullptr;
std::vector<std::vector<int32_t>>* SpecModelTest::plain_ = nullptr;

TEST_F(SpecModelTest, SameFileDraftBatched) {
  for (int k : {1, 4, 8}) Check("same-file", k, 20, false);
}
TEST_F(SpecModelTest, SelfDraftBatched) {
  for (int k : {1, 4, 8}) Check("self-4", k, 20, false);
}
TEST_F(SpecModelTest, NgramBatched) {
  for (int k : {1, 4, 8}) Check("ngram", k, 20, false);
}
TEST_F(SpecModelTest, EachDrafterAlone) {
  for (const char* kind : {"same-file", "self-4", "ngram", "distilled"}) Check(kind, 4, 1, false);
}
// The shipped distilled draft (drafts/, made by tools/distill): greedy speculative output equals
// plain greedy for every prompt, batched, at fixed and adaptive k.
TEST_F(SpecModelTest, ShippedDistilledDraft) {
  ASSERT_TRUE(std::ifstream(ShippedDraftPath()).good()) << ShippedDraftPath() << " is missing";
  for (int k : {2, 5}) Check("distilled", k, 20, false);
  Check("distilled", 8, 20, true);
}
// Against a target of another vocabulary the shipped draft is refused at start-up, naming both.
TEST_F(SpecModelTest, ShippedDraftRefusesAnotherTarget) {
  testing::TinyModelSpec t;
  const std::string other = ::testing::TempDir() + "/other_target.gguf";
  ASSERT_TRUE(testing::WriteTinyModel(t, other).ok());
  auto f = gguf::GgufFile::Open(other);
  ASSERT_TRUE(f.ok());
  auto tk = tok::Tokenizer::FromGguf(**f);
  ASSERT_TRUE(tk.ok());
  const TargetIdentity id{other, (*tk)->Fingerprint(), (*tk)->vocab_size(), f->get()};
  auto d = ModelDrafter::CreateFromFile(ShippedDraftPath(), id, backend_, {});
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find(other), std::string::npos) << d.status();
  EXPECT_NE(d.status().message().find(ShippedDraftPath()), std::string::npos) << d.status();
}

}  // namespace
}  // namespace specd::spec
