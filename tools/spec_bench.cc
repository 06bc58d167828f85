#include "tools/spec_bench.h"

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/backend.h"
#include "engine/communicator.h"
#include "engine/llama_model.h"
#include "common/gguf/gguf_file.h"
#include "speculation/drafter_factory.h"
#include "speculation/ngram_drafter.h"
#include "speculation/spec_engine.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kReps = 2;  // best of: the machine may be shared

const char* const kPrompts[] = {
    "Write a short story about a robot who learns to paint.",
    "Explain how a hash table works, step by step.",
    "List ten fruits and one fact about each.",
    "def quicksort(arr):\n    # Sort a list with quicksort and explain each line.",
    "What are the main causes of climate change?",
    "Translate to French: The weather is nice today and I want to go for a walk.",
    "Give me a recipe for pancakes.",
    "Summarize the plot of Romeo and Juliet.",
};

struct Row {
  std::string name;
  double tok_s = 0;      // wall clock, best of the repetitions
  double tok_cpu_s = 0;  // per CPU-second of this process (less sensitive to other load)
  // Batch 1 only: tokens after each request's first step per second after it. The first
  // step is the prompt's prefill (the same work with or without speculation), which would
  // otherwise dilute the ratio; it also emits the first step's drafts, so leaving it out
  // is conservative for speculation.
  double decode_tok_s = 0;
  spec::SpecStats stats;
  std::string costs;  // adaptive runs: the cost curves the decisions came from
};

double CpuSeconds() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
         1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

struct Bench {
  const SpecBenchOptions& o;
  engine::Backend* backend;
  const gguf::GgufFile& file;
  std::string path;
  engine::LlamaModel* target;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int32_t> eos;

  // Generates o.new_tokens tokens (greedy, or sampled at `temperature`) for every prompt,
  // `batch` at a time. `seeded` false: as a client that chose no seed (sampled k not pinned).
  // `lookup` (adaptive only): the n-gram lookup in front of `drafter`, as speculation "auto".
  absl::StatusOr<Row> Run(const std::string& name, spec::Drafter* drafter, int k, bool adaptive,
                          int batch, float temperature = 0, spec::Drafter* lookup = nullptr,
                          bool seeded = true) {
    spec::SpecEngineOptions eo;
    eo.max_batch_tokens = 256;
    eo.max_running = batch;
    eo.kv_blocks = 512;
    eo.k = drafter ? k : 0;
    eo.adaptive_k = drafter != nullptr && adaptive;
    eo.lookup = eo.adaptive_k ? lookup : nullptr;
    eo.eos_token_ids = eos;
    auto e = spec::SpecEngine::Create(target, drafter, eo);
    if (!e.ok()) return e.status();
    // Warm-up: one short request (pages weights in, settles the adaptive curves a little).
    spec::SpecRequest warm{prompts[0], {}, 8, -1};
    warm.params.temperature = 0;
    auto wid = (*e)->Admit(warm);
    if (!wid.ok()) return wid.status();
    if (auto st = (*e)->RunToCompletion(); !st.ok()) return st;
    Row best;
    best.name = name;
    for (int rep = 0; rep < kReps; ++rep) {
      (*e)->ResetStats();
      int64_t generated = 0, decode_tokens = 0;
      double decode_secs = 0;
      const double c0 = CpuSeconds();
      const auto t0 = Clock::now();
      for (size_t p0 = 0; p0 < prompts.size(); p0 += batch) {
        std::vector<spec::RequestId> ids;
        for (size_t p = p0; p < std::min(prompts.size(), p0 + batch); ++p) {
          spec::SpecRequest r;
          r.prompt = prompts[p];
          r.params.temperature = temperature;
          r.params.seed = 1000 + p;  // the same prompts draw the same randomness in every row
          r.seeded = seeded;         // false: as a client that sends no seed (k not pinned)
          r.params.ignore_eos = true;
          r.max_new_tokens = o.new_tokens;
          auto id = (*e)->Admit(std::move(r));
          if (!id.ok()) return id.status();
          ids.push_back(*id);
        }
        int64_t after_first = 0;
        auto t_first = Clock::now();
        if (batch == 1) {
          if (auto st = (*e)->Step(); !st.ok()) return st;
          after_first = (*e)->stats().emitted;
          t_first = Clock::now();
        }
        if (auto st = (*e)->RunToCompletion(); !st.ok()) return st;
        if (batch == 1) {
          decode_tokens += (*e)->stats().emitted - after_first;
          decode_secs += std::chrono::duration<double>(Clock::now() - t_first).count();
        }
        for (auto id : ids) {
          auto r = (*e)->TakeResult(id);
          if (!r.ok()) return r.status();
          generated += static_cast<int64_t>(r->tokens.size());
        }
      }
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      if (generated / secs > best.tok_s) {
        best.tok_s = generated / secs;
        best.decode_tok_s = decode_secs > 0 ? decode_tokens / decode_secs : 0;
        best.tok_cpu_s = generated / std::max(1e-9, CpuSeconds() - c0);
        best.stats = (*e)->stats();
      }
    }
    if (eo.adaptive_k) {
      const spec::CostCurve& v = (*e)->verify_cost();
      const spec::CostCurve& d = (*e)->draft_cost();
      best.costs = absl::StrFormat(
          "cost model: verify T=1 %.1f, T=5 %.1f, T=40 %.1f ms; draft step B=1 %.1f, B=8 %.1f ms"
          " (draft/target %.3f); verify(k+1)/verify(1), k=1..8:",
          1e3 * v.Predict(1), 1e3 * v.Predict(5), 1e3 * v.Predict(40), 1e3 * d.Predict(1),
          1e3 * d.Predict(8), d.Predict(1) / v.Predict(1));
      for (int kk = 1; kk <= 8; ++kk) {
        absl::StrAppendFormat(&best.costs, " %.2f", v.Predict(kk + 1) / v.Predict(1));
      }
    }
    return best;
  }
};

// plain: the plain row's tok/s and (batch 1) decode tok/s, or nullptr for a plain row.
void Print(const Row& r, const Row* plain) {
  const spec::SpecStats& s = r.stats;
  std::string acc;
  for (size_t i = 0; i < s.drafted_at.size(); ++i) {
    if (s.drafted_at[i] == 0) continue;
    absl::StrAppendFormat(&acc, "%s%.2f", acc.empty() ? "" : " ",
                          double(s.accepted_at[i]) / s.drafted_at[i]);
  }
  std::string decode;
  if (r.decode_tok_s > 0) {
    const double base = plain && plain->decode_tok_s > 0 ? plain->decode_tok_s : r.decode_tok_s;
    decode = absl::StrFormat(" | decode %6.1f tok/s %5.2fx", r.decode_tok_s, r.decode_tok_s / base);
  }
  std::printf(
      "  %-34s %7.1f tok/s %5.2fx (%6.1f tok/cpu-s)%s | acc.len %4.2f mean k %4.2f | draft "
      "%6.2f verify %6.2f ms/step | accept/pos %s\n",
      r.name.c_str(), r.tok_s, plain ? r.tok_s / plain->tok_s : 1.0, r.tok_cpu_s, decode.c_str(),
      s.MeanAcceptedLength(), s.MeanK(), s.steps ? 1e3 * s.draft_seconds / s.steps : 0.0,
      s.steps ? 1e3 * s.verify_seconds / s.steps : 0.0, acc.empty() ? "-" : acc.c_str());
  if (!r.costs.empty()) std::printf("      %s\n", r.costs.c_str());
  std::fflush(stdout);
}

absl::StatusOr<std::vector<std::string>> ReadPromptsFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--prompts: cannot open ", path));
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("prompt") || !j["prompt"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prompts ", path, ": every line must be {\"prompt\": \"...\"}"));
    }
    out.push_back(j["prompt"].get<std::string>());
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat("--prompts ", path, ": empty"));
  return out;
}

// The distilled draft against the model as it is: the real pair the product ships.
absl::Status RunDistilled(Bench& b, const SpecBenchOptions& o) {
  spec::DrafterChoice c;
  c.kind = spec::DrafterChoice::Kind::kModel;
  c.draft_path = o.draft_path;
  if (c.draft_path == "default") {
    std::error_code ec;
    const std::string exe_dir =
        std::filesystem::read_symlink("/proc/self/exe", ec).parent_path().string();
    absl::StatusOr<std::string> shipped = spec::ShippedDraftFor(o.model_path, exe_dir);
    if (!shipped.ok()) return shipped.status();
    c.draft_path = *shipped;
  }
  c.model.kv_blocks = 512;
  c.model.max_sequences = 64;
  auto d = spec::MakeDrafter(c, b.file, o.model_path, b.backend);
  if (!d.ok()) return d.status();
  absl::StatusOr<std::unique_ptr<spec::NgramDrafter>> lookup =
      spec::NgramDrafter::Create(spec::NgramDrafterOptions{});
  if (!lookup.ok()) return lookup.status();
  std::printf("distilled draft %s (%.1f MB of weights per step) vs target (%.1f MB):\n",
              c.draft_path.c_str(), (*d)->weight_bytes() / 1e6, b.target->weight_bytes() / 1e6);
  for (float temp : {0.0f, 0.8f}) {
    for (int batch : {1, 8}) {
      const std::string t = temp == 0 ? "greedy" : "T 0.8";
      auto plain = b.Run(absl::StrCat("plain, batch ", batch, ", ", t), nullptr, 0, false, batch,
                         temp);
      if (!plain.ok()) return plain.status();
      Print(*plain, nullptr);
      std::vector<int> ks = o.distilled_fixed_k;
      ks.push_back(0);  // 0: k auto (up to 8)
      for (int k : ks) {
        const bool adaptive = k == 0;
        auto r = b.Run(absl::StrCat("distilled, batch ", batch, ", ", t,
                                    adaptive ? ", k auto" : absl::StrCat(", k ", k)),
                       d->get(), adaptive ? 8 : k, adaptive, batch, temp);
        if (!r.ok()) return r.status();
        Print(*r, &*plain);
      }
      // Speculation "auto" as the cluster runs it: the n-gram lookup first, then the draft.
      auto a = b.Run(absl::StrCat("lookup + distilled, batch ", batch, ", ", t, ", k auto"),
                     d->get(), 8, true, batch, temp, lookup->get());
      if (!a.ok()) return a.status();
      Print(*a, &*plain);
      if (temp == 0) continue;
      // A sampled request without a chosen seed: nothing to replay, so k is not pinned and
      // follows the measured costs as greedy requests' does (LoopSeq::seeded).
      for (spec::Drafter* front : {static_cast<spec::Drafter*>(nullptr),
                                   static_cast<spec::Drafter*>(lookup->get())}) {
        auto u = b.Run(absl::StrCat(front ? "lookup + distilled" : "distilled", ", batch ", batch,
                                    ", ", t, ", k auto, unseeded"),
                       d->get(), 8, true, batch, temp, front, /*seeded=*/false);
        if (!u.ok()) return u.status();
        Print(*u, &*plain);
      }
    }
  }
  return absl::OkStatus();
}

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "specd-bench --spec: %s\n", st.ToString().c_str());
  return 1;
}

}  // namespace

int RunSpecBench(const SpecBenchOptions& o) {
  auto file = gguf::GgufFile::Open(o.model_path);
  if (!file.ok()) return Fail(file.status());
  auto tk = tok::Tokenizer::FromGguf(**file);
  if (!tk.ok()) return Fail(tk.status());
  auto backend = engine::MakeCpuBackend(o.threads);
  engine::LocalCommunicator comm;
  engine::ModelOptions mo;
  mo.max_batch_tokens = 256;
  mo.max_logit_rows = 128;
  auto target = engine::LlamaModel::Load(**file, backend.get(), &comm, mo);
  if (!target.ok()) return Fail(target.status());

  Bench b{o, backend.get(), **file, o.model_path, target->get(), {}, {}};
  auto tmpl = tok::ChatTemplate::FromGguf(**file);
  std::vector<std::string> texts(std::begin(kPrompts), std::end(kPrompts));
  if (!o.prompts_file.empty()) {
    auto read = ReadPromptsFile(o.prompts_file);
    if (!read.ok()) return Fail(read.status());
    texts = *read;
  }
  for (int i = 0; i < o.prompts; ++i) {
    const std::string& p = texts[i % texts.size()];
    std::string text = p;
    if (tmpl.ok()) {
      const tok::ChatMessage msg{"user", p};
      auto applied = tmpl->Apply({&msg, 1}, true);
      if (applied.ok()) text = *applied;
    }
    auto ids = (*tk)->Encode(text, true, tmpl.ok());
    if (!ids.ok()) return Fail(ids.status());
    b.prompts.push_back(*ids);
  }
  for (int32_t id = 0; id < (*tk)->vocab_size(); ++id) {
    if ((*tk)->IsEndOfGeneration(id)) b.eos.push_back(id);
  }

  spec::DrafterChoice same, self, ngram;
  same.kind = spec::DrafterChoice::Kind::kModel;
  same.draft_path = o.model_path;
  self.kind = spec::DrafterChoice::Kind::kSelf;
  self.self_layers = o.self_layers;
  ngram.kind = spec::DrafterChoice::Kind::kNgram;
  for (spec::DrafterChoice* c : {&same, &self}) {
    c->model.kv_blocks = 512;
    c->model.max_sequences = 64;
  }
  std::printf("speculative decoding: %s, %d chat prompts%s x %d tokens, threads %d\n",
              o.model_path.c_str(), o.prompts,
              o.prompts_file.empty() ? "" : absl::StrCat(" from ", o.prompts_file).c_str(),
              o.new_tokens, o.threads);
  if (o.distilled || o.distilled_only) {
    if (auto st = RunDistilled(b, o); !st.ok()) return Fail(st);
    if (o.distilled_only) return 0;
  }
  for (int batch : {1, 8}) {
    if (o.pair_only) break;
    std::printf("batch %d (%s):\n", batch,
                batch == 1 ? "one request at a time" : "8 requests continuously batched");
    auto plain = b.Run("plain (no speculation)", nullptr, 0, false, batch);
    if (!plain.ok()) return Fail(plain.status());
    Print(*plain, nullptr);
    for (const spec::DrafterChoice* c : {&same, &self, &ngram}) {
      auto d = spec::MakeDrafter(*c, **file, o.model_path, backend.get());
      if (!d.ok()) return Fail(d.status());
      for (bool adaptive : {false, true}) {
        const std::string name = absl::StrCat(
            c->Describe() == absl::StrCat("draft model ", o.model_path) ? "same-file draft"
                                                                        : c->Describe(),
            adaptive ? ", k auto" : ", k 4");
        auto r = b.Run(name, d->get(), adaptive ? 8 : 4, adaptive, batch);
        if (!r.ok()) return Fail(r.status());
        Print(*r, &*plain);
      }
    }
  }
  if (!o.pair) return 0;

  // The pairs: target = this file re-encoded at load, draft = the file as is.
  auto d = spec::MakeDrafter(same, **file, o.model_path, backend.get());
  if (!d.ok()) return Fail(d.status());
  for (const std::string& type : o.pair_types) {
    gguf::GgmlType pair_type = gguf::GgmlType::kF16;
    std::string tname = "F16";
    if (type == "bf16") {
      pair_type = gguf::GgmlType::kBF16;
      tname = "BF16";
    } else if (type == "f32") {
      pair_type = gguf::GgmlType::kF32;
      tname = "F32";
    } else if (type != "f16") {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--pair-type: expected f16, bf16 or f32, got ", type)));
    }
    engine::ModelOptions big_opt = mo;
    big_opt.reencode_weights = pair_type;
    auto big = engine::LlamaModel::Load(**file, backend.get(), &comm, big_opt);
    if (!big.ok()) return Fail(big.status());
    b.target = big->get();
    std::printf(
        "pair: target = %s re-encoded to %s (%.0f MB of weights per step), draft = the "
        "file as is (%.0f MB):\n",
        o.model_path.c_str(), tname.c_str(), (*big)->weight_bytes() / 1e6,
        (*target)->weight_bytes() / 1e6);
    for (int batch : {1, 8}) {
      auto plain = b.Run(absl::StrCat(tname, " plain, batch ", batch), nullptr, 0, false, batch);
      if (!plain.ok()) return Fail(plain.status());
      Print(*plain, nullptr);
      for (bool adaptive : {false, true}) {
        auto r = b.Run(absl::StrCat(tname, " + file draft, batch ", batch,
                                    adaptive ? ", k auto" : ", k 4"),
                       d->get(), adaptive ? 8 : 4, adaptive, batch);
        if (!r.ok()) return Fail(r.status());
        Print(*r, &*plain);
      }
    }
  }
  return 0;
}

}  // namespace specd
