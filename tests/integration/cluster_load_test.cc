// The cluster under load, as real processes: 500 requests from 64 concurrent clients (closed
// loop) over a mix of speculation modes (off / auto / draft with adaptive and fixed k / n-gram
// with adaptive and fixed k), unary and streaming, greedy and seeded sampling, short outputs.
// None may be lost or fail; every one returns exactly its max_new_tokens (ignore_eos); greedy
// ones equal plain greedy decoding (with drafts accepted and rejected); afterwards no KV block
// is left in use on the target or the draft and the router's gauges are back to zero. Its own
// cluster (own binary), whose router admits all 64 at once and queues more, so nothing is
// refused. About 1-2 s on 2 cores.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "testing/metric_sum.h"
#include "testing/plain_greedy.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace specd::testing {
namespace {

using specd::v1::GenerateRequest;
using specd::v1::GenerateResponse;
using specd::v1::GenerateStreamResponse;

constexpr int kRequests = 500;
constexpr int kConcurrency = 64;
constexpr int kMinTokens = 8;
constexpr int kMaxTokens = 16;
constexpr int kPrompts = 8;

// Half the prompts repeat a short pattern (so n-gram lookup has something to propose), half
// do not; lengths 6..41 tokens.
std::vector<int32_t> Prompt(int p) {
  std::vector<int32_t> out;
  const int n = 6 + p * 5;
  for (int i = 0; i < n; ++i) {
    out.push_back(p % 2 == 0 ? 3 + (i * 37 + p * 11) % 250 : 40 + p + (i % 5) * 7);
  }
  return out;
}

struct Variant {
  specd::v1::SpeculationMode mode;
  int k;
  const char* name;
};
constexpr Variant kVariants[] = {
    {specd::v1::SPECULATION_MODE_OFF, 0, "off"},
    {specd::v1::SPECULATION_MODE_AUTO, 0, "auto"},
    {specd::v1::SPECULATION_MODE_DRAFT, 0, "draft k=auto"},
    {specd::v1::SPECULATION_MODE_DRAFT, 3, "draft k=3"},
    {specd::v1::SPECULATION_MODE_NGRAM, 0, "ngram k=auto"},
    {specd::v1::SPECULATION_MODE_NGRAM, 4, "ngram k=4"},
};
constexpr int kNumVariants = sizeof(kVariants) / sizeof(kVariants[0]);

struct Plan {
  int prompt = 0, tokens = 0;
  const Variant* variant = nullptr;
  bool greedy = true, stream = false;
};

Plan PlanFor(int i) {
  Plan p;
  p.prompt = i % kPrompts;
  p.tokens = kMinTokens + (i * 7) % (kMaxTokens - kMinTokens + 1);
  p.variant = &kVariants[(i / 2) % kNumVariants];
  p.greedy = i % 5 != 4;
  p.stream = i % 2 == 1;
  return p;
}

GenerateRequest Req(const Plan& p, int i) {
  GenerateRequest r;
  const std::vector<int32_t> prompt = Prompt(p.prompt);
  r.mutable_tokens()->mutable_ids()->Assign(prompt.begin(), prompt.end());
  r.mutable_sampling()->set_max_new_tokens(p.tokens);
  r.mutable_sampling()->set_temperature(p.greedy ? 0.0f : 1.5f);
  r.mutable_sampling()->set_ignore_eos(true);
  r.mutable_sampling()->set_seed(1000 + i);
  r.mutable_speculation()->set_mode(p.variant->mode);
  r.mutable_speculation()->set_num_draft_tokens(p.variant->k);
  return r;
}

struct Outcome {
  grpc::Status status;
  std::vector<int32_t> ids;
  specd::v1::Completion completion;
  bool has_completion = false;
};

Outcome Call(Cluster& c, const GenerateRequest& r, bool stream) {
  Outcome o;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  if (stream) {
    auto reader = c.router().GenerateStream(&ctx, r);
    GenerateStreamResponse m;
    while (reader->Read(&m)) {
      o.ids.insert(o.ids.end(), m.token_ids().begin(), m.token_ids().end());
      if (m.has_completion()) {
        o.completion = m.completion();
        o.has_completion = true;
      }
    }
    o.status = reader->Finish();
  } else {
    GenerateResponse u;
    o.status = c.router().Generate(&ctx, r, &u);
    o.ids.assign(u.token_ids().begin(), u.token_ids().end());
    o.completion = u.completion();
    o.has_completion = u.has_completion();
  }
  return o;
}

TEST(ClusterLoadTest, FiveHundredRequestsAtConcurrency64NoneLostKvFreed) {
  ClusterOptions o;
  o.router_flags = {"--max-running", std::to_string(kConcurrency), "--max-queue",
                    std::to_string(2 * kConcurrency)};
  // A draft that disagrees with the target part of the time (~20-70 % of its proposals are
  // accepted), so rejections and KV rollback happen under load too.
  o.draft_model_spec = [](TinyModelSpec& s) { s.weight_scale = 0.2f; };
  // The target runs as 2 tensor-parallel ranks (rank 0 serves gRPC and drives rank 1): greedy
  // output below is still checked against one-rank plain decoding.
  o.target_flags = {"--world-size", "2"};
  Cluster c(o);
  ASSERT_EQ(c.Health(c.router_addr), 1);
  ASSERT_EQ(c.TargetInfo().world_size(), 2);

  std::vector<std::vector<int32_t>> want(kPrompts);
  for (int p = 0; p < kPrompts; ++p) {
    auto ref = PlainGreedy(c.target_model, Prompt(p), kMaxTokens);
    ASSERT_TRUE(ref.ok()) << ref.status();
    want[p] = *ref;
  }

  std::atomic<int> next{0}, returned{0}, ok{0}, wrong_count{0}, mismatched{0};
  std::mutex mu;
  std::map<std::string, int> errors;  // status code -> count
  std::vector<std::string> failures;  // the first few, for the log
  std::map<std::string, long> drafted, accepted;  // by variant
  long generated = 0;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> clients;
  for (int w = 0; w < kConcurrency; ++w) {
    clients.emplace_back([&] {
      for (int i; (i = next++) < kRequests;) {
        const Plan p = PlanFor(i);
        const Outcome out = Call(c, Req(p, i), p.stream);
        ++returned;
        std::string failure;
        if (!out.status.ok()) {
          failure = "status " + std::to_string(out.status.error_code()) + " " +
                    out.status.error_message();
        } else if (static_cast<int>(out.ids.size()) != p.tokens || !out.has_completion ||
                   out.completion.usage().completion_tokens() != p.tokens ||
                   out.completion.finish_reason() != specd::v1::FINISH_REASON_LENGTH) {
          ++wrong_count;
          failure = "got " + std::to_string(out.ids.size()) + " tokens (completion_tokens " +
                    std::to_string(out.completion.usage().completion_tokens()) + "), want " +
                    std::to_string(p.tokens);
        } else if (p.greedy && out.ids != std::vector<int32_t>(want[p.prompt].begin(),
                                                               want[p.prompt].begin() + p.tokens)) {
          ++mismatched;
          failure = "greedy output differs from plain greedy";
        } else {
          ++ok;
        }
        std::lock_guard<std::mutex> l(mu);
        if (!out.status.ok()) ++errors[std::to_string(out.status.error_code())];
        if (out.status.ok()) generated += static_cast<long>(out.ids.size());
        drafted[p.variant->name] += out.completion.speculation().draft_tokens();
        accepted[p.variant->name] += out.completion.speculation().accepted_tokens();
        if (!failure.empty() && failures.size() < 10) {
          failures.push_back("request " + std::to_string(i) + " (" + p.variant->name +
                             (p.stream ? ", stream" : ", unary") + "): " + failure);
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "%d requests, concurrency %d: %.2f s, %.0f tokens/s\n", kRequests,
               kConcurrency, wall_s, generated / wall_s);
  for (const Variant& v : kVariants) {
    std::fprintf(stderr, "  %-13s drafted %5ld accepted %5ld\n", v.name, drafted[v.name],
                 accepted[v.name]);
  }
  for (const std::string& f : failures) std::fprintf(stderr, "  FAILED %s\n", f.c_str());

  EXPECT_EQ(returned.load(), kRequests);  // none lost
  EXPECT_TRUE(errors.empty()) << errors.size() << " distinct error codes, e.g. "
                              << (errors.empty() ? "" : errors.begin()->first);
  EXPECT_EQ(wrong_count.load(), 0);
  EXPECT_EQ(mismatched.load(), 0);
  EXPECT_EQ(ok.load(), kRequests);
  // Speculation really ran under load, from both drafters, with accepted and rejected drafts.
  EXPECT_GT(accepted["draft k=3"], 0);
  EXPECT_LT(accepted["draft k=3"], drafted["draft k=3"]);
  EXPECT_GT(accepted["ngram k=4"], 0);

  // Every sequence released on both services (Release is sent as requests finish).
  int target_used = -1, draft_used = -1;
  for (int i = 0; i < 250; ++i) {
    target_used = static_cast<int>(c.TargetInfo().kv_used_blocks());
    draft_used = static_cast<int>(c.DraftInfo().kv_used_blocks());
    if (target_used == 0 && draft_used == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(target_used, 0);
  EXPECT_EQ(draft_used, 0);

  const std::string m = c.RouterMetrics();
  EXPECT_EQ(MetricSum(m, "specd_router_requests_total"), kRequests) << m;
  EXPECT_EQ(MetricSum(m, "specd_router_requests_total{code=\"OK\"}"), kRequests);
  EXPECT_EQ(MetricSum(m, "specd_router_generated_tokens_total"), static_cast<double>(generated));
  EXPECT_EQ(MetricSum(m, "specd_router_running_sequences"), 0);
  EXPECT_EQ(MetricSum(m, "specd_router_waiting_requests"), 0);
  EXPECT_GT(MetricSum(m, "specd_router_draft_proposed_tokens_total"), 0);
  EXPECT_LE(MetricSum(m, "specd_router_rpc_errors_total"), 0);  // -1: no error ever counted
  // The load was real: some target steps batched more than half the clients.
  const double steps = MetricSum(m, "specd_router_batch_size_sequences_count");
  const double small = MetricSum(m, "specd_router_batch_size_sequences_bucket{le=\"32\"}");
  std::fprintf(stderr, "target steps %.0f, of which %.0f with more than 32 sequences\n", steps,
               steps - small);
  EXPECT_GT(steps - small, 0);
  EXPECT_EQ(c.Health(c.target_addr), 1);
  EXPECT_EQ(c.Health(c.draft_addr), 1);
}

}  // namespace
}  // namespace specd::testing
