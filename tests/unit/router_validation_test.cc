// Every bad GenerateRequest field gets INVALID_ARGUMENT naming it; stop strings spanning
// tokens are cut exactly; the router's n-gram lookup and adaptive k (the one policy,
// speculation/k_policy.h, as the router configures it) respond to acceptance and load.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/gguf/gguf_file.h"
#include "testing/tiny_model.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "speculation/k_policy.h"
#include "speculation/ngram_drafter.h"
#include "services/router/request_validation.h"
#include "services/router/text_stream.h"

namespace specd::router {
namespace {

class ValidationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = ::testing::TempDir() + "/router_validation_tiny.gguf";
    ASSERT_TRUE(testing::WriteTinyModel({}, path).ok());
    file_ = gguf::GgufFile::Open(path)->release();
    tokenizer_ = tok::Tokenizer::FromGguf(*file_)->release();
  }
  ModelLimits Limits() {
    ModelLimits l;
    l.vocab_size = tokenizer_->vocab_size();
    l.context_length = 512;
    l.max_new_tokens = 256;
    return l;
  }
  specd::v1::GenerateRequest Good() {
    specd::v1::GenerateRequest r;
    r.set_prompt("hello world");
    r.mutable_sampling()->set_max_new_tokens(8);
    return r;
  }
  // Expects INVALID_ARGUMENT whose message starts with `field`.
  void ExpectBad(const specd::v1::GenerateRequest& r, const std::string& field) {
    auto v = ValidateRequest(r, *tokenizer_, nullptr, Limits());
    ASSERT_FALSE(v.ok()) << field;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << v.status();
    EXPECT_EQ(std::string(v.status().message()).rfind(field, 0), 0u)
        << "message \"" << v.status().message() << "\" should name " << field;
  }
  static gguf::GgufFile* file_;
  static tok::Tokenizer* tokenizer_;
};
gguf::GgufFile* ValidationTest::file_ = nullptr;
tok::Tokenizer* ValidationTest::tokenizer_ = nullptr;

TEST_F(ValidationTest, GoodRequestPasses) {
  auto v = ValidateRequest(Good(), *tokenizer_, nullptr, Limits());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FALSE(v->prompt.empty());
  EXPECT_EQ(v->max_new_tokens, 8);
  EXPECT_EQ(v->spec_mode, SpecMode::kAuto);
}

TEST_F(ValidationTest, EveryBadFieldIsNamed) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  specd::v1::GenerateRequest r;
  ExpectBad(r, "input");
  r = Good(); r.set_prompt(""); ExpectBad(r, "prompt");
  r = Good(); r.set_prompt(std::string("ab\xff\xfe", 4)); ExpectBad(r, "prompt");
  r = Good(); r.set_prompt(std::string("\xc3", 1)); ExpectBad(r, "prompt");
  r = Good(); r.set_prompt(std::string(5000, 'a') + " b"); ExpectBad(r, "prompt");  // > context
  r = Good(); r.mutable_tokens()->Clear(); r.mutable_tokens(); ExpectBad(r, "tokens.ids");
  r = Good(); r.mutable_tokens()->add_ids(1); r.mutable_tokens()->add_ids(-3);
  ExpectBad(r, "tokens.ids[1]");
  r = Good(); r.mutable_tokens()->add_ids(tokenizer_->vocab_size()); ExpectBad(r, "tokens.ids[0]");
  r = Good(); r.mutable_chat()->add_messages()->set_role("user"); ExpectBad(r, "chat");
  r = Good(); r.mutable_sampling()->set_max_new_tokens(0); ExpectBad(r, "sampling.max_new_tokens");
  r = Good(); r.mutable_sampling()->set_max_new_tokens(-5); ExpectBad(r, "sampling.max_new_tokens");
  r = Good(); r.mutable_sampling()->set_max_new_tokens(1 << 30);
  ExpectBad(r, "sampling.max_new_tokens");
  r = Good(); r.mutable_sampling()->set_temperature(-0.5f); ExpectBad(r, "sampling.temperature");
  r = Good(); r.mutable_sampling()->set_temperature(nan); ExpectBad(r, "sampling.temperature");
  r = Good(); r.mutable_sampling()->set_top_p(0); ExpectBad(r, "sampling.top_p");
  r = Good(); r.mutable_sampling()->set_top_p(1.5f); ExpectBad(r, "sampling.top_p");
  r = Good(); r.mutable_sampling()->set_top_k(-1); ExpectBad(r, "sampling.top_k");
  r = Good(); r.mutable_sampling()->set_min_p(2); ExpectBad(r, "sampling.min_p");
  r = Good(); r.mutable_sampling()->set_repetition_penalty(0);
  ExpectBad(r, "sampling.repetition_penalty");
  r = Good(); r.mutable_sampling()->set_presence_penalty(3); ExpectBad(r, "sampling.presence_penalty");
  r = Good(); r.mutable_sampling()->set_frequency_penalty(-3);
  ExpectBad(r, "sampling.frequency_penalty");
  r = Good(); r.mutable_sampling()->set_logprobs(21); ExpectBad(r, "sampling.logprobs");
  r = Good(); r.mutable_sampling()->add_stop(""); ExpectBad(r, "sampling.stop[0]");
  r = Good(); r.mutable_sampling()->add_stop("ok"); r.mutable_sampling()->add_stop("\xff");
  ExpectBad(r, "sampling.stop[1]");
  r = Good(); r.mutable_sampling()->add_stop_token_ids(-1); ExpectBad(r, "sampling.stop_token_ids[0]");
  r = Good(); r.mutable_speculation()->set_num_draft_tokens(17);
  ExpectBad(r, "speculation.num_draft_tokens");
  r = Good(); r.mutable_speculation()->set_mode(static_cast<specd::v1::SpeculationMode>(42));
  ExpectBad(r, "speculation.mode");
  r = Good(); r.set_request_id(std::string(300, 'x')); ExpectBad(r, "request_id");
}

TEST_F(ValidationTest, EverySpeculationModeMaps) {
  const std::pair<specd::v1::SpeculationMode, SpecMode> modes[] = {
      {specd::v1::SPECULATION_MODE_UNSPECIFIED, SpecMode::kAuto},
      {specd::v1::SPECULATION_MODE_AUTO, SpecMode::kAuto},
      {specd::v1::SPECULATION_MODE_OFF, SpecMode::kOff},
      {specd::v1::SPECULATION_MODE_DRAFT, SpecMode::kDraft},
      {specd::v1::SPECULATION_MODE_NGRAM, SpecMode::kNgram},
      {specd::v1::SPECULATION_MODE_SELF, SpecMode::kSelf}};
  for (const auto& [mode, want] : modes) {
    auto r = Good();
    r.mutable_speculation()->set_mode(mode);
    auto v = ValidateRequest(r, *tokenizer_, nullptr, Limits());
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->spec_mode, want) << specd::v1::SpeculationMode_Name(mode);
  }
}

TEST_F(ValidationTest, StopStringSpanningTokensIsCutExactly) {
  auto ids = tokenizer_->Encode("the cat sat on the mat", false, false);
  ASSERT_TRUE(ids.ok());
  ASSERT_GT(ids->size(), 3u);
  TextStream ts(*tokenizer_, {"t on t"});
  std::string out;
  for (int32_t id : *ids) {
    out += ts.Append(id);
    if (ts.stopped()) break;
  }
  out += ts.Finish();
  EXPECT_TRUE(ts.stopped());
  EXPECT_EQ(out, "the cat sa");
  EXPECT_EQ(ts.matched_stop(), "t on t");

  TextStream none(*tokenizer_, {"zzz", "mat!"});
  std::string all;
  for (int32_t id : *ids) all += none.Append(id);
  all += none.Finish();
  EXPECT_FALSE(none.stopped());
  EXPECT_EQ(all, "the cat sat on the mat");
}

// The router's n-gram drafts: spec::NgramDrafter with suffixes of up to 3 tokens.
std::vector<int32_t> NgramPropose(const std::vector<int32_t>& h, int32_t k) {
  spec::NgramDrafterOptions o;
  o.max_ngram = 3;
  return (*spec::NgramDrafter::Create(o))->Lookup(h, k);
}

TEST(NgramProposerTest, ProposesWhatFollowedTheLastMatch) {
  const std::vector<int32_t> h = {1, 2, 3, 4, 9, 2, 3, 4, 7, 8, 2, 3};
  EXPECT_EQ(NgramPropose(h, 3), (std::vector<int32_t>{4, 7, 8}));  // most recent "2 3"
  EXPECT_EQ(NgramPropose(h, 1), (std::vector<int32_t>{4}));
  EXPECT_TRUE(NgramPropose({1, 2, 3}, 4).empty());
  EXPECT_EQ(NgramPropose({5, 6, 5}, 4), (std::vector<int32_t>{6, 5}));  // stops at the end
}

// Cost curves shaped like a memory-bound target (extra verified tokens nearly free up to 64
// tokens, then compute-bound) and a draft round costing ~8 % of a target step.
spec::KPolicy RouterLikePolicy() {
  spec::KPolicyOptions o;
  o.max_k = 8;
  o.track_load = false;
  o.verify_cost = spec::CostCurve({{1, 1.0}, {64, 1.63}, {1024, 20.83}});
  o.draft_cost = spec::CostCurve({{1, 0.082}, {256, 0.6}});
  return spec::KPolicy(o);
}

// k for `running` sequences of per-token acceptance `acceptance`, each allowed up to 8.
int32_t ChooseK(double acceptance, int32_t running) {
  const spec::KPolicy policy = RouterLikePolicy();
  const std::vector<spec::KCandidate> batch(running, spec::KCandidate{acceptance, 8});
  return spec::ChooseK(batch, 0, 8, policy.verify_cost(), policy.draft_cost())[0];
}

TEST(AdaptiveKTest, FollowsAcceptanceAndLoad) {
  EXPECT_GE(ChooseK(0.9, 1), 4);
  EXPECT_LE(ChooseK(0.3, 1), 1);
  EXPECT_EQ(ChooseK(0.02, 1), 0);
  EXPECT_LT(ChooseK(0.9, 64), ChooseK(0.9, 1));
  EXPECT_EQ(ChooseK(0.6, 256), 0);
  spec::KPolicy policy = RouterLikePolicy();
  spec::SpecSeqState s;
  const spec::KRequest one{&s, 8, /*pinned=*/true};  // its own history only
  auto want = [&] { return policy.Choose({&one, 1}, 0)[0]; };
  auto step = [&](int32_t drafted, int32_t accepted) {
    policy.AfterDraft(s, drafted);
    policy.AfterVerify(s, drafted, accepted);
  };
  for (int i = 0; i < 30; ++i) step(4, 4);
  EXPECT_GT(s.acceptance.alpha(), 0.9);
  // Deep on the nominal costs (a draft round half a step, each verified row 0.3 of one).
  EXPECT_GE(want(), 3);
  EXPECT_EQ(want(), want());  // asking does not change it
  for (int i = 0; i < 30; ++i) step(4, 0);
  EXPECT_LT(s.acceptance.alpha(), 0.15);
  EXPECT_EQ(want(), 0);
  int probes = 0;
  for (int i = 0; i < 34; ++i) {
    const int32_t k = want();
    probes += k > 0;
    step(k, 0);  // each step runs what was wanted
  }
  // Probes come after probe_every steps without drafts; each time drafting stops the wait
  // doubles (16 -> 32 steps here), so 34 steps see exactly one.
  EXPECT_EQ(probes, 1);
}

}  // namespace
}  // namespace specd::router
