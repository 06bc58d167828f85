// specd-loadtest: a gRPC load generator for the router. Open loop (Poisson arrivals at --qps)
// or closed loop (--concurrency clients back to back); reports TTFT, inter-token and
// end-to-end latency percentiles, throughput, speculation acceptance and errors by code, as
// JSON. --qps-sweep a,b,c runs one open-loop point per rate (the latency-vs-QPS curve).
// --http host:port sends the same requests to the router's OpenAI HTTP API instead (streamed,
// one connection per request), for gRPC-vs-HTTP figures from one tool.
#include <algorithm>
#include <cctype>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "absl/synchronization/notification.h"
#include "common/gguf/gguf_file.h"
#include "loadtest/http_load.h"
#include "loadtest/prompt_set.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "services/common/flags.h"
#include "services/common/metrics.h"
#include "services/inproc/local_backends.h"
#include "services/router/router_engine.h"
#include "specd/v1/generation.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Sample {
  bool ok = false;
  int code = 0;
  double ttft_ms = 0, e2e_ms = 0;
  std::vector<double> itl_ms;
  int tokens = 0, drafted = 0, accepted = 0, steps = 0;
};

struct Config {
  std::string server = "localhost:50051", mode = "closed", spec = "auto", qps_sweep, out;
  std::string prompts = "builtin";  // or "random": prompt_tokens random ids
  std::string http, http_model;     // the OpenAI HTTP API (host:port) and its model name
  // In-process baseline: the same router engine and workers, no network.
  std::string in_process_model, in_process_draft;
  int32_t in_process_draft_layers = 0, threads = 1, max_batch_tokens = 512;
  int32_t vocab_size = 5000;  // from the server's model info
  int32_t concurrency = 4, requests = 32, prompt_tokens = 64, max_new_tokens = 64, k = 0;
  int32_t shared_prefix_tokens = 0;  // random prompts: the same leading ids in every request
  int32_t prompt_seed = 0;  // random prompts: request i draws its ids from seed i + this
  int32_t seeded = 1;       // 1: request i sends seed i; 0: no seed (the router picks one)
  int32_t ignore_eos = 1;   // 1: every request runs to max_new_tokens; 0: it ends at EOS
  int32_t conversations = 4;         // multiturn: request i is turn i / C of conversation i % C
  double qps = 2, duration_s = 30, temperature = 0;
};

// "off", "auto", ... -> the enum; "" when unknown (main() rejects it before any request).
specd::v1::SpeculationMode SpecMode(const std::string& name) {
  std::string upper = "SPECULATION_MODE_";
  for (char ch : name) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  specd::v1::SpeculationMode mode = specd::v1::SPECULATION_MODE_UNSPECIFIED;
  if (!specd::v1::SpeculationMode_Parse(upper, &mode)) return specd::v1::SPECULATION_MODE_UNSPECIFIED;
  return mode;
}

// Multi-turn chat: every conversation shares one long system prompt (~500 tokens) and resends
// its whole history each turn (earlier user turns and canned assistant answers), so a prefix
// cache sees what chat traffic gives it.
void MultiTurnChat(const Config& c, int index, specd::v1::ChatMessages* chat) {
  const auto& set = specd::loadtest::BuiltinPrompts();
  std::string system =
      "You are a careful assistant for a team that writes software and documentation. Answer "
      "briefly and precisely; say when you do not know. Some examples of what users ask:\n";
  for (size_t i = 0; system.size() < 2200 && i < set.size(); ++i) {
    system += "- " + set[(i * 5) % set.size()] + "\n";
  }
  auto add = [chat](const char* role, const std::string& content) {
    specd::v1::ChatMessage* m = chat->add_messages();
    m->set_role(role);
    m->set_content(content);
  };
  add("system", system);
  const int conv = index % std::max(1, c.conversations);
  const int turn = index / std::max(1, c.conversations);
  for (int t = 0; t <= turn; ++t) {
    add("user", set[(conv * 7 + t * 3) % set.size()]);
    if (t < turn) add("assistant", "Here is a short answer. " + set[(conv + t + 11) % set.size()]);
  }
}

specd::v1::GenerateRequest MakeRequest(const Config& c, int index) {
  specd::v1::GenerateRequest r;
  if (c.prompts == "multiturn") {
    MultiTurnChat(c, index, r.mutable_chat());
  } else if (c.prompts == "builtin" || c.prompts == "edit") {
    const auto& set = c.prompts == "edit" ? specd::loadtest::EditPrompts()
                                          : specd::loadtest::BuiltinPrompts();
    specd::v1::ChatMessage* m = r.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(set[index % set.size()]);
  } else {
    std::mt19937 shared(12345);
    for (int i = 0; i < c.shared_prefix_tokens; ++i) {
      r.mutable_tokens()->add_ids(3 + shared() % std::max(1, c.vocab_size - 3));
    }
    std::mt19937 gen(static_cast<uint32_t>(index + c.prompt_seed));
    for (int i = 0; i < c.prompt_tokens; ++i) {
      r.mutable_tokens()->add_ids(3 + gen() % std::max(1, c.vocab_size - 3));
    }
  }
  r.mutable_sampling()->set_max_new_tokens(c.max_new_tokens);
  r.mutable_sampling()->set_temperature(static_cast<float>(c.temperature));
  r.mutable_sampling()->set_ignore_eos(c.ignore_eos != 0);
  if (c.seeded != 0) r.mutable_sampling()->set_seed(index);
  r.mutable_speculation()->set_mode(SpecMode(c.spec));
  r.mutable_speculation()->set_num_draft_tokens(c.k);
  return r;
}

// Records the same figures as the gRPC path from the engine's callbacks.
class TimingSink : public specd::router::RequestSink {
 public:
  explicit TimingSink(Clock::time_point t0) : t0_(t0), last_(t0) {}
  void OnChunk(specd::v1::GenerateStreamResponse m) override {
    const auto now = Clock::now();
    const int n = m.token_ids_size();
    if (n == 0) return;
    auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
    if (s.tokens == 0) {
      s.ttft_ms = ms(now - t0_);
      for (int i = 1; i < n; ++i) s.itl_ms.push_back(0);
    } else {
      for (int i = 0; i < n; ++i) s.itl_ms.push_back(ms(now - last_) / n);
    }
    s.tokens += n;
    last_ = now;
  }
  void OnDone(absl::Status st, specd::v1::Completion c) override {
    s.ok = st.ok();
    s.code = static_cast<int>(st.code());
    s.drafted = c.speculation().draft_tokens();
    s.accepted = c.speculation().accepted_tokens();
    s.steps = c.speculation().target_steps();
    s.e2e_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0_).count();
    done.Notify();
  }
  Sample s;
  absl::Notification done;

 private:
  Clock::time_point t0_, last_;
};

struct InProcess {
  std::unique_ptr<specd::gguf::GgufFile> file;
  std::unique_ptr<specd::tok::Tokenizer> tokenizer;
  std::unique_ptr<specd::tok::ChatTemplate> chat;  // null: the model has none
  specd::services::Metrics metrics;
  std::unique_ptr<specd::router::RouterEngine> engine;
};

Sample OneInProcess(InProcess& p, const Config& c, int index) {
  const specd::v1::GenerateRequest r = MakeRequest(c, index);
  auto v = specd::router::ValidateRequest(r, *p.tokenizer, p.chat.get(), p.engine->limits());
  Sample fail;
  if (!v.ok()) {
    fail.code = static_cast<int>(v.status().code());
    return fail;
  }
  auto sink = std::make_shared<TimingSink>(Clock::now());
  auto id = p.engine->Submit(std::move(*v), sink);
  if (!id.ok()) {
    fail.code = static_cast<int>(id.status().code());
    return fail;
  }
  sink->done.WaitForNotification();
  return sink->s;
}

std::unique_ptr<specd::services::ModelHost> LoadHost(const std::string& path, int layers,
                                                     const Config& c) {
  specd::services::ModelHostOptions o;
  o.model_path = path;
  o.threads = c.threads;
  o.num_layers = layers;
  o.max_batch_tokens = c.max_batch_tokens;
  auto h = specd::services::ModelHost::Load(o);
  if (!h.ok()) {
    std::fprintf(stderr, "specd-loadtest: %s\n", h.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*h);
}

Sample One(specd::v1::Generation::Stub& stub, const Config& c, int index) {
  const specd::v1::GenerateRequest r = MakeRequest(c, index);
  Sample s;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
  const auto t0 = Clock::now();
  auto last = t0;
  auto reader = stub.GenerateStream(&ctx, r);
  specd::v1::GenerateStreamResponse m;
  auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  while (reader->Read(&m)) {
    const auto now = Clock::now();
    const int n = m.token_ids_size();
    if (n > 0) {
      if (s.tokens == 0) {
        s.ttft_ms = ms(now - t0);
        for (int i = 1; i < n; ++i) s.itl_ms.push_back(0);
      } else {
        for (int i = 0; i < n; ++i) s.itl_ms.push_back(ms(now - last) / n);
      }
      s.tokens += n;
      last = now;
    }
    if (m.has_completion()) {
      s.drafted = m.completion().speculation().draft_tokens();
      s.accepted = m.completion().speculation().accepted_tokens();
      s.steps = m.completion().speculation().target_steps();
    }
  }
  grpc::Status st = reader->Finish();
  s.e2e_ms = ms(Clock::now() - t0);
  s.ok = st.ok();
  s.code = st.error_code();
  return s;
}

// The same request as MakeRequest, as an OpenAI API body: chat for the built-in prompts,
// completions (token ids) for random ones.
std::string HttpBody(const Config& c, int index, std::string* path) {
  const specd::v1::GenerateRequest g = MakeRequest(c, index);
  nlohmann::json j = {{"model", c.http_model},
                      {"max_tokens", c.max_new_tokens},
                      {"temperature", c.temperature},
                      {"ignore_eos", c.ignore_eos != 0},
                      {"stream", true},
                      {"return_token_ids", true},
                      {"speculation", {{"mode", c.spec}, {"k", c.k}}}};
  if (c.seeded != 0) j["seed"] = index;
  if (g.has_chat()) {
    *path = "/v1/chat/completions";
    j["messages"] = nlohmann::json::array();
    for (const specd::v1::ChatMessage& m : g.chat().messages()) {
      j["messages"].push_back({{"role", m.role()}, {"content", m.content()}});
    }
  } else {
    *path = "/v1/completions";
    j["prompt"] = std::vector<int32_t>(g.tokens().ids().begin(), g.tokens().ids().end());
  }
  return j.dump();
}

Sample OneHttp(const Config& c, int index) {
  std::string path;
  const std::string body = HttpBody(c, index, &path);
  specd::loadtest::HttpResult h = specd::loadtest::StreamHttp(c.http, path, body);
  Sample s;
  s.ok = h.ok;
  s.code = h.ok ? 0 : h.status;  // errors_by_code holds HTTP statuses in this mode (0: none)
  s.ttft_ms = h.ttft_ms;
  s.e2e_ms = h.e2e_ms;
  s.itl_ms = std::move(h.itl_ms);
  s.tokens = h.tokens;
  s.drafted = h.drafted;
  s.accepted = h.accepted;
  s.steps = h.steps;
  if (!h.ok && !h.error.empty()) std::fprintf(stderr, "http: %d %s\n", h.status, h.error.c_str());
  return s;
}

double Pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double idx = p / 100.0 * (v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(idx)), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (idx - lo);
}

nlohmann::json Summarize(const std::vector<Sample>& samples, double wall_s, double qps) {
  std::vector<double> ttft, e2e, itl;
  long tokens = 0, drafted = 0, accepted = 0, steps = 0;
  std::map<std::string, int> errors;
  for (const Sample& s : samples) {
    if (!s.ok) {
      ++errors[std::to_string(s.code)];
      continue;
    }
    ttft.push_back(s.ttft_ms);
    e2e.push_back(s.e2e_ms);
    itl.insert(itl.end(), s.itl_ms.begin(), s.itl_ms.end());
    tokens += s.tokens;
    drafted += s.drafted;
    accepted += s.accepted;
    steps += s.steps;
  }
  auto pcts = [](const std::vector<double>& v) {
    return nlohmann::json{{"p50", Pct(v, 50)}, {"p90", Pct(v, 90)}, {"p99", Pct(v, 99)},
                          {"mean", v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / v.size()}};
  };
  nlohmann::json j;
  j["offered_qps"] = qps;
  j["requests"] = samples.size();
  j["ok"] = ttft.size();
  j["errors_by_code"] = errors;
  j["wall_s"] = wall_s;
  j["output_tokens"] = tokens;
  j["throughput_tokens_per_s"] = tokens / std::max(wall_s, 1e-9);
  j["ttft_ms"] = pcts(ttft);
  j["itl_ms"] = pcts(itl);
  j["e2e_ms"] = pcts(e2e);
  j["draft_tokens"] = drafted;
  j["accepted_tokens"] = accepted;
  j["acceptance_rate"] = drafted > 0 ? static_cast<double>(accepted) / drafted : 0.0;
  j["tokens_per_target_step"] = steps > 0 ? static_cast<double>(tokens) / steps : 0.0;
  return j;
}

nlohmann::json RunPoint(specd::v1::Generation::Stub& stub, InProcess* inproc, const Config& c,
                        double qps) {
  auto one = [&](int i) {
    if (inproc != nullptr) return OneInProcess(*inproc, c, i);
    return c.http.empty() ? One(stub, c, i) : OneHttp(c, i);
  };
  std::vector<Sample> samples;
  std::mutex mu;
  std::vector<std::thread> threads;
  const auto t0 = Clock::now();
  if (c.mode == "closed") {
    std::atomic<int> next{0};
    for (int w = 0; w < c.concurrency; ++w) {
      threads.emplace_back([&] {
        for (int i; (i = next++) < c.requests;) {
          Sample s = one(i);
          std::lock_guard<std::mutex> l(mu);
          samples.push_back(std::move(s));
        }
      });
    }
  } else {  // open loop: Poisson arrivals, one thread per request
    std::mt19937_64 gen(42);
    std::exponential_distribution<double> gap(qps);
    auto at = t0;
    for (int i = 0; Clock::now() - t0 < std::chrono::duration<double>(c.duration_s); ++i) {
      at += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(gen)));
      std::this_thread::sleep_until(at);
      threads.emplace_back([&, i] {
        Sample s = one(i);
        std::lock_guard<std::mutex> l(mu);
        samples.push_back(std::move(s));
      });
    }
  }
  for (auto& t : threads) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  return Summarize(samples, wall, c.mode == "closed" ? 0 : qps);
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  specd::services::FlagSet f("specd-loadtest");
  f.Add("server", "SPECD_SERVER", &c.server, "router address");
  f.Add("mode", "SPECD_LOADTEST_MODE", &c.mode, "closed (concurrency) or open (Poisson)");
  f.Add("concurrency", "SPECD_LOADTEST_CONCURRENCY", &c.concurrency, "closed loop: clients");
  f.Add("requests", "SPECD_LOADTEST_REQUESTS", &c.requests, "closed loop: total requests");
  f.Add("qps", "SPECD_LOADTEST_QPS", &c.qps, "open loop: mean arrival rate");
  f.Add("qps-sweep", "SPECD_LOADTEST_QPS_SWEEP", &c.qps_sweep, "open loop: comma-separated rates");
  f.Add("duration-s", "SPECD_LOADTEST_DURATION_S", &c.duration_s, "open loop: seconds per point");
  f.Add("prompts", "SPECD_LOADTEST_PROMPTS", &c.prompts,
        "builtin (chat prompts of varied length, loadtest/prompt_set.cc), edit (a given text or "
        "program back with a small change), multiturn (a shared system prompt and a growing "
        "history per conversation) or random (token ids)");
  f.Add("prompt-tokens", "SPECD_LOADTEST_PROMPT_TOKENS", &c.prompt_tokens,
        "random prompts: length in tokens (after the shared prefix)");
  f.Add("shared-prefix-tokens", "SPECD_LOADTEST_SHARED_PREFIX_TOKENS", &c.shared_prefix_tokens,
        "random prompts: this many leading token ids the same in every request");
  f.Add("prompt-seed", "SPECD_LOADTEST_PROMPT_SEED", &c.prompt_seed,
        "random prompts: request i draws its ids from seed i + this (another value: other "
        "prompts, none already in the prefix cache)");
  f.Add("conversations", "SPECD_LOADTEST_CONVERSATIONS", &c.conversations,
        "multiturn prompts: conversations (request i is turn i / N of conversation i % N)");
  f.Add("max-new-tokens", "SPECD_LOADTEST_MAX_NEW_TOKENS", &c.max_new_tokens, "tokens out");
  f.Add("temperature", "SPECD_LOADTEST_TEMPERATURE", &c.temperature, "0 = greedy");
  f.Add("seeded", "SPECD_LOADTEST_SEEDED", &c.seeded,
        "1: request i sends seed i (its sampled text replays: pinned k); 0: no seed, as most "
        "clients send (the router's k follows load)");
  f.Add("ignore-eos", "SPECD_LOADTEST_IGNORE_EOS", &c.ignore_eos,
        "1: every request runs to --max-new-tokens, past the model's end of turn (fixed "
        "lengths); 0: requests end at the end of turn, as a chat client's do");
  f.Add("spec", "SPECD_LOADTEST_SPEC", &c.spec,
        "speculation: off, auto, draft, ngram or self");
  f.Add("k", "SPECD_LOADTEST_K", &c.k, "draft tokens per step (0 = adaptive)");
  f.Add("out", "SPECD_LOADTEST_OUT", &c.out, "JSON output file (default stdout)");
  f.Add("http", "SPECD_LOADTEST_HTTP", &c.http,
        "host:port of the router's OpenAI HTTP API: send the requests there (streamed) instead "
        "of gRPC");
  f.Add("in-process-model", "SPECD_LOADTEST_IN_PROCESS_MODEL", &c.in_process_model,
        "baseline: run the router engine + workers in this process on this GGUF (no network)");
  f.Add("in-process-draft", "SPECD_LOADTEST_IN_PROCESS_DRAFT", &c.in_process_draft,
        "baseline: draft GGUF (empty: none)");
  f.Add("in-process-draft-layers", "SPECD_LOADTEST_IN_PROCESS_DRAFT_LAYERS",
        &c.in_process_draft_layers, "baseline: draft = first N layers (0 = all)");
  f.Add("threads", "SPECD_LOADTEST_THREADS", &c.threads, "baseline: CPU threads per model");
  f.Add("max-batch-tokens", "SPECD_LOADTEST_MAX_BATCH_TOKENS", &c.max_batch_tokens,
        "baseline: target tokens per iteration");
  if (absl::Status s = f.Parse(argc, argv); !s.ok()) {
    if (s.code() == absl::StatusCode::kCancelled) return 0;
    std::fprintf(stderr, "specd-loadtest: %s\n%s", std::string(s.message()).c_str(),
                 f.Usage().c_str());
    return 2;
  }
  if (c.prompts != "builtin" && c.prompts != "edit" && c.prompts != "random" &&
      c.prompts != "multiturn") {
    std::fprintf(stderr,
                 "specd-loadtest: --prompts must be builtin, edit, multiturn or random, got '%s'\n",
                 c.prompts.c_str());
    return 2;
  }
  if (c.ignore_eos != 0 && c.ignore_eos != 1) {
    std::fprintf(stderr, "specd-loadtest: --ignore-eos must be 0 or 1, got %d\n", c.ignore_eos);
    return 2;
  }
  if (SpecMode(c.spec) == specd::v1::SPECULATION_MODE_UNSPECIFIED) {
    std::fprintf(stderr, "specd-loadtest: --spec must be off, auto, draft, ngram or self, got '%s'\n",
                 c.spec.c_str());
    return 2;
  }
  auto stub = specd::v1::Generation::NewStub(
      grpc::CreateChannel(c.server, grpc::InsecureChannelCredentials()));
  std::unique_ptr<InProcess> inproc;
  if (!c.in_process_model.empty()) {
    inproc = std::make_unique<InProcess>();
    inproc->file = std::move(*specd::gguf::GgufFile::Open(c.in_process_model));
    inproc->tokenizer = std::move(*specd::tok::Tokenizer::FromGguf(*inproc->file));
    if (auto chat = specd::tok::ChatTemplate::FromGguf(*inproc->file); chat.ok()) {
      inproc->chat = std::make_unique<specd::tok::ChatTemplate>(std::move(*chat));
    }
    std::unique_ptr<specd::router::DraftBackend> draft;
    if (!c.in_process_draft.empty()) {
      draft = std::make_unique<specd::router::LocalDraftBackend>(
          std::make_unique<specd::services::DraftWorker>(
              LoadHost(c.in_process_draft, c.in_process_draft_layers, c)));
    }
    specd::router::RouterOptions o;
    o.scheduler.max_batch_tokens = c.max_batch_tokens;
    inproc->engine = std::make_unique<specd::router::RouterEngine>(
        o,
        std::make_unique<specd::router::LocalTargetBackend>(
            std::make_unique<specd::services::TargetWorker>(LoadHost(c.in_process_model, 0, c))),
        std::move(draft), *inproc->tokenizer, &inproc->metrics);
    if (absl::Status st = inproc->engine->Start(); !st.ok()) {
      std::fprintf(stderr, "specd-loadtest: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  if (inproc != nullptr) {
    c.vocab_size = std::min(c.vocab_size, inproc->engine->limits().vocab_size);
  } else {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    specd::v1::ModelInfo info;
    grpc::Status st = stub->GetModelInfo(&ctx, {}, &info);
    if (!st.ok()) {
      std::fprintf(stderr, "specd-loadtest: %s: %s\n", c.server.c_str(), st.error_message().c_str());
      return 1;
    }
    c.vocab_size = std::min(c.vocab_size, info.vocab_size());
  }
  if (!c.http.empty()) {
    absl::StatusOr<std::string> models = specd::loadtest::GetHttp(c.http, "/v1/models");
    const nlohmann::json m =
        models.ok() ? nlohmann::json::parse(*models, nullptr, false) : nlohmann::json();
    if (!models.ok() || m.is_discarded() || !m.contains("data") || m["data"].empty()) {
      std::fprintf(stderr, "specd-loadtest: %s: no model list (%s)\n", c.http.c_str(),
                   models.ok() ? "bad JSON" : std::string(models.status().message()).c_str());
      return 1;
    }
    c.http_model = m["data"][0].value("id", "");
  }
  if (!c.qps_sweep.empty()) c.mode = "open";
  nlohmann::json out;
  out["config"] = {{"server", c.server}, {"mode", c.mode}, {"spec", c.spec}, {"k", c.k},
                   {"prompts", c.prompts}, {"prompt_tokens", c.prompt_tokens},
                   {"max_new_tokens", c.max_new_tokens}, {"ignore_eos", c.ignore_eos},
                   {"temperature", c.temperature}, {"concurrency", c.concurrency},
                   {"in_process", !c.in_process_model.empty()}, {"http", c.http}};
  if (!c.qps_sweep.empty()) {
    for (absl::string_view q : absl::StrSplit(c.qps_sweep, ',')) {
      const double qps = std::strtod(std::string(q).c_str(), nullptr);
      out["points"].push_back(RunPoint(*stub, inproc.get(), c, qps));
      std::fprintf(stderr, "qps %.2f done\n", qps);
    }
  } else {
    out["points"].push_back(RunPoint(*stub, inproc.get(), c, c.qps));
  }
  const std::string text = out.dump(2);
  if (c.out.empty()) {
    std::printf("%s\n", text.c_str());
  } else {
    FILE* fp = std::fopen(c.out.c_str(), "w");
    if (fp == nullptr) return 1;
    std::fputs(text.c_str(), fp);
    std::fclose(fp);
  }
  return 0;
}
