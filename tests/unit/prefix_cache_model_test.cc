// Prefix caching on the real default model (SmolLM2-135M-Instruct Q4_1) and its shipped
// distilled draft, through the router's engine over in-process target and draft workers: the
// same requests one after another with both services' caches off and on give the same tokens,
// greedy and seeded sampled, with and without speculation, for chat prompts that share a long
// system prompt and for prompts cut at a block boundary and one token off it.
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/gguf/gguf_file.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "services/common/metrics.h"
#include "services/common/model_host.h"
#include "services/inproc/local_backends.h"
#include "services/router/router_engine.h"

namespace specd::router {
namespace {

std::string SourceDir() {
  const char* d = std::getenv("SPECD_SOURCE_DIR");
  return d ? d : ".";
}

class Collect : public RequestSink {
 public:
  void OnChunk(specd::v1::GenerateStreamResponse chunk) override {
    absl::MutexLock l(&mu_);
    tokens_.insert(tokens_.end(), chunk.token_ids().begin(), chunk.token_ids().end());
  }
  void OnDone(absl::Status status, specd::v1::Completion c) override {
    {
      absl::MutexLock l(&mu_);
      status_ = status;
      completion_ = c;
    }
    done_.Notify();
  }
  bool Wait() { return done_.WaitForNotificationWithTimeout(absl::Seconds(300)); }
  absl::Status status() { absl::MutexLock l(&mu_); return status_; }
  std::vector<int32_t> tokens() { absl::MutexLock l(&mu_); return tokens_; }
  specd::v1::Completion completion() { absl::MutexLock l(&mu_); return completion_; }

 private:
  absl::Mutex mu_;
  std::vector<int32_t> tokens_;
  absl::Status status_;
  specd::v1::Completion completion_;
  absl::Notification done_;
};

std::unique_ptr<services::ModelHost> Host(const std::string& path, const std::string& borrow,
                                          bool prefix_caching) {
  services::ModelHostOptions o;
  o.model_path = path;
  o.borrow_path = borrow;
  o.threads = 2;
  o.kv_blocks = 512;
  o.max_batch_tokens = 256;
  o.prefix_caching = prefix_caching;
  auto h = services::ModelHost::Load(o);
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? std::move(*h) : nullptr;
}

TEST(PrefixCacheModelTest, CacheOnEqualsOffTokenForTokenOnTheDefaultModel) {
  const std::string target = SourceDir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  const std::string draft = SourceDir() + "/drafts/SmolLM2-135M-Instruct.Q4_1.draft.gguf";
  if (!std::ifstream(target).good()) GTEST_SKIP() << "NOT RUN: default model not at " << target;
  auto file = gguf::GgufFile::Open(target);
  ASSERT_TRUE(file.ok()) << file.status();
  auto tokenizer = tok::Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tokenizer.ok());
  auto chat = tok::ChatTemplate::FromGguf(**file);
  ASSERT_TRUE(chat.ok()) << chat.status();

  // Chat prompts with one long system prompt, then prompts cut from the first of them.
  const std::string system =
      "You are the support assistant of a small company that builds a speculative decoding "
      "server. You answer in short, exact sentences, you never invent facts, and when a "
      "question is about configuration you name the flag and its default. Keep answers under "
      "three sentences unless the user asks for more detail.";
  std::vector<std::vector<int32_t>> prompts;
  for (const char* user : {"What does the draft model do?", "How do I turn speculation off?",
                           "Why is my first token slow?"}) {
    const tok::ChatMessage msgs[] = {{"system", system}, {"user", user}};
    auto text = chat->Apply(msgs, true);
    ASSERT_TRUE(text.ok()) << text.status();
    auto ids = (*tokenizer)->Encode(*text, true, true);
    ASSERT_TRUE(ids.ok());
    prompts.push_back(*ids);
  }
  const int32_t boundary = static_cast<int32_t>(prompts[0].size() / 16 * 16);
  ASSERT_GE(boundary, 48);
  prompts.emplace_back(prompts[0].begin(), prompts[0].begin() + boundary);      // at a boundary
  prompts.emplace_back(prompts[0].begin(), prompts[0].begin() + boundary + 1);  // one past it
  prompts.emplace_back(prompts[0].begin(), prompts[0].begin() + boundary - 1);  // one short

  std::vector<ValidatedRequest> requests;
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (int variant = 0; variant < 3; ++variant) {
      ValidatedRequest r;
      r.prompt = prompts[i];
      r.max_new_tokens = 16;
      r.params.ignore_eos = true;
      r.seed_set = true;
      r.params.temperature = 0;
      r.spec_mode = variant == 0 ? SpecMode::kOff : SpecMode::kDraft;
      if (variant == 2) {  // seeded sampled, fixed k
        r.params.temperature = 0.8f;
        r.params.top_p = 0.95f;
        r.params.seed = 300 + i;
        r.fixed_k = 3;
      }
      requests.push_back(r);
    }
  }

  auto run = [&](bool caching, std::vector<int32_t>* cached) {
    services::Metrics metrics;
    auto t = std::make_unique<LocalTargetBackend>(
        std::make_unique<services::TargetWorker>(Host(target, "", caching)));
    auto d = std::make_unique<LocalDraftBackend>(
        std::make_unique<services::DraftWorker>(Host(draft, target, caching)));
    RouterOptions o;
    // Fixed prices instead of a calibration: a memory-bound target, a draft ~10 % of it.
    o.verify_cost = spec::CostCurve({{1, 1.0}, {64, 1.63}, {1024, 20.83}});
    o.draft_cost = spec::CostCurve({{1, 0.1}, {256, 2.0}});
    o.track_load = false;
    RouterEngine engine(o, std::move(t), std::move(d), **tokenizer, &metrics);
    EXPECT_TRUE(engine.Start().ok());
    std::vector<std::vector<int32_t>> out;
    for (const ValidatedRequest& r : requests) {
      auto sink = std::make_shared<Collect>();
      auto id = engine.Submit(r, sink);
      EXPECT_TRUE(id.ok()) << id.status();
      EXPECT_TRUE(sink->Wait());
      EXPECT_TRUE(sink->status().ok()) << sink->status();
      out.push_back(sink->tokens());
      cached->push_back(sink->completion().usage().cached_prompt_tokens());
    }
    engine.Stop();
    return out;
  };
  std::vector<int32_t> cached_off, cached_on;
  const auto off = run(false, &cached_off);
  const auto on = run(true, &cached_on);
  ASSERT_EQ(on.size(), off.size());
  for (size_t i = 0; i < on.size(); ++i) {
    EXPECT_EQ(on[i].size(), 16u) << i;
    EXPECT_EQ(on[i], off[i]) << "request " << i << " (prompt " << i / 3 << ", variant " << i % 3
                             << ")";
    EXPECT_EQ(cached_off[i], 0);
  }
  // The system prompt's blocks serve every later prompt; the cut prompts are inside prompt 0.
  EXPECT_EQ(cached_on[0], 0);
  EXPECT_GE(cached_on[3], 48) << "the second chat prompt shares the system prompt";
  EXPECT_EQ(cached_on[9], boundary - 16) << "at a boundary: the block holding the last token "
                                            "is computed";
  EXPECT_EQ(cached_on[12], boundary);
  EXPECT_EQ(cached_on[15], boundary - 16);
}

}  // namespace
}  // namespace specd::router
