#include "tools/spec_bench.h"

#include <sys/resource.h>

#include <algorithm>
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
#include "engine/backend_factory.h"
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
  // Paired runs (--spec-pairs): each round's tok/s (and batch 1 decode tok/s) over plain's.
  std::vector<double> paired, paired_decode;
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

  // An engine for one configuration, warmed up (one short request pages the weights in and
  // settles the adaptive curves a little). `lookup` (adaptive only): the n-gram lookup in
  // front of `drafter`, as speculation "auto".
  absl::StatusOr<std::unique_ptr<spec::SpecEngine>> Engine(spec::Drafter* drafter, int k,
                                                           bool adaptive, int batch,
                                                           spec::Drafter* lookup = nullptr) {
    spec::SpecEngineOptions eo;
    eo.max_batch_tokens = 256;
    eo.max_running = batch;
    eo.kv_blocks = 512;
    eo.calibrate_depth_keys = o.depth_keys;
    eo.k = drafter ? k : 0;
    eo.adaptive_k = drafter != nullptr && adaptive;
    eo.lookup = eo.adaptive_k ? lookup : nullptr;
    eo.eos_token_ids = eos;
    auto e = spec::SpecEngine::Create(target, drafter, eo);
    if (!e.ok()) return e.status();
    spec::SpecRequest warm{prompts[0], {}, 8, -1};
    warm.params.temperature = 0;
    auto wid = (*e)->Admit(warm);
    if (!wid.ok()) return wid.status();
    if (auto st = (*e)->RunToCompletion(); !st.ok()) return st;
    return e;
  }

  // What a pass adds up over its groups of prompts.
  struct Tally {
    int64_t generated = 0, decode_tokens = 0;
    double secs = 0, decode_secs = 0, cpu_secs = 0;
    Row ToRow(const spec::SpecEngine& e) const {
      Row row;
      row.tok_s = generated / std::max(1e-9, secs);
      row.decode_tok_s = decode_secs > 0 ? decode_tokens / decode_secs : 0;
      row.tok_cpu_s = generated / std::max(1e-9, cpu_secs);
      row.stats = e.stats();
      return row;
    }
  };

  // One pass: o.new_tokens tokens (greedy, or sampled at `temperature`) for every prompt,
  // `batch` at a time. `seeded` false: as a client that chose no seed (sampled k not pinned).
  absl::StatusOr<Row> Measure(spec::SpecEngine& e, int batch, float temperature, bool seeded) {
    e.ResetStats();
    Tally t;
    for (size_t p0 = 0; p0 < prompts.size(); p0 += batch) {
      if (absl::Status st = RunGroup(e, p0, batch, temperature, seeded, t); !st.ok()) return st;
    }
    return t.ToRow(e);
  }

  // One pass of each engine, interleaved by group of prompts: each group runs on both, the
  // order alternating from group to group (`mine_first` for the first). A host whose speed
  // drifts over seconds (a shared VM's neighbours) then slows both sides of a ratio alike,
  // where pass after pass it moved one side by up to ±15 % (docs/PERFORMANCE.md).
  absl::Status MeasurePair(spec::SpecEngine& plain, spec::SpecEngine& mine, int batch,
                           float temperature, bool seeded, bool mine_first, Row& base, Row& row) {
    plain.ResetStats();
    mine.ResetStats();
    Tally tb, tm;
    bool mine_now = mine_first;
    for (size_t p0 = 0; p0 < prompts.size(); p0 += batch, mine_now = !mine_now) {
      for (int side = 0; side < 2; ++side) {
        const bool run_mine = (side == 0) == mine_now;
        absl::Status st = RunGroup(run_mine ? mine : plain, p0, batch, temperature, seeded,
                                   run_mine ? tm : tb);
        if (!st.ok()) return st;
      }
    }
    base = tb.ToRow(plain);
    row = tm.ToRow(mine);
    return absl::OkStatus();
  }

  // Prompts [p0, p0 + batch) to completion on `e`, added to `t`.
  absl::Status RunGroup(spec::SpecEngine& e, size_t p0, int batch, float temperature, bool seeded,
                        Tally& t) {
    const double c0 = CpuSeconds();
    const auto t0 = Clock::now();
    std::vector<spec::RequestId> ids;
    for (size_t p = p0; p < std::min(prompts.size(), p0 + batch); ++p) {
      spec::SpecRequest r;
      r.prompt = prompts[p];
      r.params.temperature = temperature;
      r.params.seed = 1000 + p;  // the same prompts draw the same randomness in every row
      r.seeded = seeded;
      r.params.ignore_eos = true;
      r.max_new_tokens = o.new_tokens;
      auto id = e.Admit(std::move(r));
      if (!id.ok()) return id.status();
      ids.push_back(*id);
    }
    // Batch 1's decode phase starts at its first token: a long prompt takes several chunked
    // prefill steps before it, which would otherwise count as decoding (and dilute the ratio).
    int64_t after_first = 0;
    auto t_first = Clock::now();
    if (batch == 1) {
      const int64_t before = e.stats().emitted;
      while (e.stats().emitted == before && e.HasWork()) {
        if (auto st = e.Step(); !st.ok()) return st;
      }
      after_first = e.stats().emitted;
      t_first = Clock::now();
    }
    if (auto st = e.RunToCompletion(); !st.ok()) return st;
    if (batch == 1) {
      t.decode_tokens += e.stats().emitted - after_first;
      t.decode_secs += std::chrono::duration<double>(Clock::now() - t_first).count();
    }
    for (auto id : ids) {
      auto r = e.TakeResult(id);
      if (!r.ok()) return r.status();
      t.generated += static_cast<int64_t>(r->tokens.size());
    }
    t.secs += std::chrono::duration<double>(Clock::now() - t0).count();
    t.cpu_secs += CpuSeconds() - c0;
    return absl::OkStatus();
  }

  // The adaptive policy's cost curves, as printed under a row.
  static std::string Costs(const spec::SpecEngine& e) {
    const spec::CostCurve& v = e.verify_cost();
    const spec::CostCurve& d = e.draft_cost();
    std::string costs = absl::StrFormat(
        "cost model: verify T=1 %.1f, T=5 %.1f, T=40 %.1f ms; draft step B=1 %.1f, B=8 %.1f ms"
        " (draft/target %.3f); verify(k+1)/verify(1), k=1..8:",
        1e3 * v.Predict(1), 1e3 * v.Predict(5), 1e3 * v.Predict(40), 1e3 * d.Predict(1),
        1e3 * d.Predict(8), d.Predict(1) / v.Predict(1));
    for (int kk = 1; kk <= 8; ++kk) {
      absl::StrAppendFormat(&costs, " %.2f", v.Predict(kk + 1) / v.Predict(1));
    }
    absl::StrAppendFormat(&costs,
                          "; context %.2f us a position, %.2f us more a row's position (draft "
                          "round %.2f us a position, %.1f us a catch-up row); a logit row %.3f ms",
                          1e6 * v.depth().per_key, 1e6 * v.depth().per_row_key,
                          1e6 * d.depth().per_key, 1e6 * d.catch_up_row(), 1e3 * v.logits().per_row);
    return costs;
  }

  // Best of kReps passes of a fresh engine.
  absl::StatusOr<Row> Run(const std::string& name, spec::Drafter* drafter, int k, bool adaptive,
                          int batch, float temperature = 0, spec::Drafter* lookup = nullptr,
                          bool seeded = true) {
    auto e = Engine(drafter, k, adaptive, batch, lookup);
    if (!e.ok()) return e.status();
    Row best;
    for (int rep = 0; rep < kReps; ++rep) {
      absl::StatusOr<Row> r = Measure(**e, batch, temperature, seeded);
      if (!r.ok()) return r.status();
      if (r->tok_s > best.tok_s) best = *r;
    }
    best.name = name;
    if (drafter != nullptr && adaptive) best.costs = Costs(**e);
    return best;
  }

  // Paired against plain decoding: `pairs` rounds of a pass on `plain` and a pass on this
  // configuration's engine, interleaved by group of prompts (MeasurePair), the order within a
  // group alternating (whichever runs second on this machine can read faster or slower), so
  // the machine's drift cancels in each round's ratio. The row's ratio is the median of the
  // rounds' ratios; its tok/s and stats are the last pass.
  absl::StatusOr<Row> RunPaired(const std::string& name, spec::SpecEngine& plain, int pairs,
                                spec::Drafter* drafter, int k, bool adaptive, int batch,
                                float temperature, spec::Drafter* lookup = nullptr,
                                bool seeded = true) {
    auto e = Engine(drafter, k, adaptive, batch, lookup);
    if (!e.ok()) return e.status();
    Row row;
    for (int i = 0; i < pairs; ++i) {
      Row base, mine;
      absl::Status st =
          MeasurePair(plain, **e, batch, temperature, seeded, /*mine_first=*/i % 2 == 1, base, mine);
      if (!st.ok()) return st;
      row.paired.push_back(mine.tok_s / base.tok_s);
      if (batch == 1 && base.decode_tok_s > 0) {
        row.paired_decode.push_back(mine.decode_tok_s / base.decode_tok_s);
      }
      row.tok_s = mine.tok_s;
      row.decode_tok_s = mine.decode_tok_s;
      row.tok_cpu_s = mine.tok_cpu_s;
      row.stats = mine.stats;
    }
    row.name = name;
    if (drafter != nullptr && adaptive) row.costs = Costs(**e);
    return row;
  }
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// plain: the plain row's tok/s and (batch 1) decode tok/s, or nullptr for a plain row.
void Print(const Row& r, const Row* plain) {
  const spec::SpecStats& s = r.stats;
  std::string acc;
  for (size_t i = 0; i < s.drafted_at.size(); ++i) {
    if (s.drafted_at[i] == 0) continue;
    absl::StrAppendFormat(&acc, "%s%.2f", acc.empty() ? "" : " ",
                          double(s.accepted_at[i]) / s.drafted_at[i]);
  }
  if (!r.paired.empty()) {
    const auto [lo, hi] = std::minmax_element(r.paired.begin(), r.paired.end());
    std::string decode;
    if (!r.paired_decode.empty()) {
      decode = absl::StrFormat(" | decode %5.2fx", Median(r.paired_decode));
    }
    std::printf(
        "  %-34s %7.1f tok/s %5.2fx paired (%.2f-%.2f over %zu rounds)%s | acc.len %4.2f mean k "
        "%4.2f | draft %6.2f verify %6.2f ms/step | accept/pos %s\n",
        r.name.c_str(), r.tok_s, Median(r.paired), *lo, *hi, r.paired.size(), decode.c_str(),
        s.MeanAcceptedLength(), s.MeanK(), s.steps ? 1e3 * s.draft_seconds / s.steps : 0.0,
        s.steps ? 1e3 * s.verify_seconds / s.steps : 0.0, acc.empty() ? "-" : acc.c_str());
    if (!r.costs.empty()) std::printf("      %s\n", r.costs.c_str());
    std::fflush(stdout);
    return;
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
  c.model.min_keep = o.draft_min_keep;
  c.model.min_extend = o.draft_min_extend;
  auto d = spec::MakeDrafter(c, b.file, o.model_path, b.backend);
  if (!d.ok()) return d.status();
  absl::StatusOr<std::unique_ptr<spec::NgramDrafter>> lookup =
      spec::NgramDrafter::Create(spec::NgramDrafterOptions{});
  if (!lookup.ok()) return lookup.status();
  std::printf("distilled draft %s (%.1f MB of weights per step; chain confidence: keep >= %.2f, extend >= %.2f) vs target (%.1f MB):\n",
              c.draft_path.c_str(), (*d)->weight_bytes() / 1e6, o.draft_min_keep, o.draft_min_extend, b.target->weight_bytes() / 1e6);
  for (float temp : o.distilled_temps) {
    for (int batch : o.distilled_batches) {
      const std::string t = temp == 0 ? "greedy" : absl::StrCat("T ", temp);
      auto plain = b.Run(absl::StrCat("plain, batch ", batch, ", ", t), nullptr, 0, false, batch,
                         temp);
      if (!plain.ok()) return plain.status();
      Print(*plain, nullptr);
      // --spec-pairs N: each row against this plain engine, round by round.
      std::unique_ptr<spec::SpecEngine> plain_engine;
      if (o.spec_pairs > 0) {
        auto e = b.Engine(nullptr, 0, false, batch);
        if (!e.ok()) return e.status();
        plain_engine = std::move(*e);
      }
      auto row = [&](const std::string& name, int k, bool adaptive, spec::Drafter* front,
                     bool seeded) -> absl::Status {
        const std::string full = absl::StrCat(name, ", batch ", batch, ", ", t,
                                              adaptive ? ", k auto" : absl::StrCat(", k ", k),
                                              seeded ? "" : ", unseeded");
        absl::StatusOr<Row> r =
            plain_engine ? b.RunPaired(full, *plain_engine, o.spec_pairs, d->get(), k, adaptive,
                                       batch, temp, front, seeded)
                         : b.Run(full, d->get(), k, adaptive, batch, temp, front, seeded);
        if (!r.ok()) return r.status();
        Print(*r, &*plain);
        return absl::OkStatus();
      };
      for (int k : o.distilled_fixed_k) {
        if (auto st = row("distilled", k, false, nullptr, true); !st.ok()) return st;
      }
      if (auto st = row("distilled", 8, true, nullptr, true); !st.ok()) return st;
      // Speculation "auto" as the cluster runs it: the n-gram lookup first, then the draft.
      if (auto st = row("lookup + distilled", 8, true, lookup->get(), true); !st.ok()) return st;
      if (temp == 0) continue;
      // A sampled request without a chosen seed: nothing to replay, so k is not pinned and
      // follows the measured costs as greedy requests' does (LoopSeq::seeded).
      if (auto st = row("distilled", 8, true, nullptr, false); !st.ok()) return st;
      if (auto st = row("lookup + distilled", 8, true, lookup->get(), false); !st.ok()) return st;
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
  absl::StatusOr<std::unique_ptr<engine::Backend>> made = engine::MakeBackend(o.device, o.threads);
  if (!made.ok()) return Fail(made.status());
  std::unique_ptr<engine::Backend> backend = std::move(*made);
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
