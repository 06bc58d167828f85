#include "tools/distill_data.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <memory>
#include <numeric>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/quants.h"
#include "common/sampling/penalty_state.h"
#include "common/sampling/philox.h"
#include "common/sampling/sampler.h"
#include "common/sampling/sampling_params.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "engine/backend.h"
#include "engine/communicator.h"
#include "engine/forward_batch.h"
#include "engine/llama_model.h"
#include "engine/paged_kv_cache.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

constexpr int kBlockSize = 16;

// One response to generate: a prompt at one temperature.
struct Job {
  uint32_t prompt_index = 0;
  float temperature = 0;
  std::vector<int32_t> tokens;  // prompt, then the response so far
  uint32_t num_prompt = 0;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
  engine::SeqId seq = 0;
  int32_t computed = 0;  // tokens whose KV is written
};

absl::StatusOr<std::vector<std::vector<int32_t>>> ReadPrompts(const DistillDataOptions& o,
                                                              const tok::Tokenizer& tk,
                                                              const tok::ChatTemplate& tmpl,
                                                              int* skipped) {
  std::ifstream in(o.prompts);
  if (!in) return absl::NotFoundError(absl::StrCat("--prompts: cannot open ", o.prompts));
  std::vector<std::vector<int32_t>> prompts;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("prompt") || !j["prompt"].is_string() ||
        j["prompt"].get<std::string>().empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--prompts %s line %d: expected a JSON object with a non-empty string \"prompt\"",
          o.prompts, line_no));
    }
    std::vector<tok::ChatMessage> msgs;
    if (j.contains("system") && j["system"].is_string()) {
      msgs.push_back({"system", j["system"].get<std::string>()});
    }
    msgs.push_back({"user", j["prompt"].get<std::string>()});
    absl::StatusOr<std::string> text = tmpl.Apply(msgs, /*add_generation_prompt=*/true);
    if (!text.ok()) return text.status();
    absl::StatusOr<std::vector<int32_t>> ids =
        tk.Encode(*text, /*add_special=*/true, /*parse_special=*/true);
    if (!ids.ok()) return ids.status();
    if (static_cast<int>(ids->size()) > o.max_prompt_tokens) {
      ++*skipped;
      continue;
    }
    prompts.push_back(std::move(*ids));
    if (o.limit > 0 && static_cast<int>(prompts.size()) >= o.limit) break;
  }
  if (prompts.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prompts ", o.prompts, ": no usable prompt (empty file, or all longer "
                     "than --max-prompt-tokens)"));
  }
  return prompts;
}

// One row's top-n log-softmax: ids by logit, descending, ties to the lower id.
struct RowDistribution {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
};

// The top-n of a raw logits row in one pass: a min-heap of the n best so far. Scanning ids in
// increasing order, a logit equal to the heap's least never displaces it (the lower id wins
// the tie), so a strict compare gives exactly the order a full sort by (logit desc, id asc)
// would.
void TopIds(const float* logits, int32_t vocab, int top_n, std::vector<int32_t>* heap) {
  // worse(a, b): a ranks below b; std::*_heap with it keep the worst on top.
  auto worse = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  heap->assign(static_cast<size_t>(top_n), 0);
  std::iota(heap->begin(), heap->end(), 0);
  std::make_heap(heap->begin(), heap->end(), worse);
  for (int32_t i = top_n; i < vocab; ++i) {
    if (!(logits[i] > logits[heap->front()])) continue;
    std::pop_heap(heap->begin(), heap->end(), worse);
    heap->back() = i;
    std::push_heap(heap->begin(), heap->end(), worse);
  }
  std::sort_heap(heap->begin(), heap->end(), worse);
}

// The top-n log-softmax of a raw logits row (the log-normalizer summed in double).
void ComputeDistribution(const float* logits, int32_t vocab, int top_n, RowDistribution* d) {
  const float mx = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int32_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i] - mx));
  const float log_z = mx + static_cast<float>(std::log(sum));
  TopIds(logits, vocab, top_n, &d->ids);
  d->logprobs.resize(d->ids.size());
  for (size_t i = 0; i < d->ids.size(); ++i) d->logprobs[i] = logits[d->ids[i]] - log_z;
}

template <typename T>
void Put(std::ofstream& out, const T& v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
void PutAll(std::ofstream& out, const std::vector<T>& v) {
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
}

void WriteRecord(std::ofstream& out, const Job& j) {
  Put<uint32_t>(out, j.num_prompt);
  Put<uint32_t>(out, static_cast<uint32_t>(j.tokens.size()) - j.num_prompt);
  Put<float>(out, j.temperature);
  Put<uint32_t>(out, j.prompt_index);
  PutAll(out, j.tokens);
  PutAll(out, j.top_ids);
  PutAll(out, j.top_logprobs);
}

absl::StatusOr<float> ParseFloat(const std::string& flag, const std::string& v) {
  float x;
  if (!absl::SimpleAtof(v, &x)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": not a number: ", v));
  }
  return x;
}

}  // namespace

absl::Status ParseDistillDataArgs(int argc, char** argv, DistillDataOptions* o) {
  for (int i = 0; i < argc; ++i) {
    const std::string f = argv[i];
    if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(f, ": missing value"));
    const std::string v = argv[++i];
    auto integer = [&](int* out, int lo) -> absl::Status {
      if (!absl::SimpleAtoi(v, out) || *out < lo) {
        return absl::InvalidArgumentError(
            absl::StrCat(f, ": expected an integer >= ", lo, ", got ", v));
      }
      return absl::OkStatus();
    };
    absl::Status st;
    if (f == "-m" || f == "--model") {
      o->model = std::string(v);
    } else if (f == "--prompts") {
      o->prompts = std::string(v);
    } else if (f == "-o" || f == "--out") {
      o->out = std::string(v);
    } else if (f == "--temperatures") {
      o->temperatures.clear();
      const std::vector<std::string> parts = absl::StrSplit(v, ',');
      for (const std::string& t : parts) {
        absl::StatusOr<float> x = ParseFloat(f, t);
        if (!x.ok()) return x.status();
        if (!(*x >= 0 && *x <= 2)) {
          return absl::InvalidArgumentError(absl::StrCat(f, ": each must be in [0, 2], got ", t));
        }
        o->temperatures.push_back(*x);
      }
    } else if (f == "--temperature-mode") {
      if (v != "each" && v != "cycle") {
        return absl::InvalidArgumentError(absl::StrCat(f, ": expected each or cycle, got ", v));
      }
      o->cycle_temperatures = v == "cycle";
    } else if (f == "-n" || f == "--max-new-tokens") {
      st = integer(&o->max_new_tokens, 1);
    } else if (f == "--max-prompt-tokens") {
      st = integer(&o->max_prompt_tokens, 1);
    } else if (f == "--top") {
      st = integer(&o->top_n, 1);
    } else if (f == "--batch") {
      st = integer(&o->batch, 1);
    } else if (f == "-t" || f == "--threads") {
      st = integer(&o->threads, 0);
    } else if (f == "--limit") {
      st = integer(&o->limit, 0);
    } else if (f == "--seed") {
      if (!absl::SimpleAtoi(v, &o->seed)) {
        return absl::InvalidArgumentError(absl::StrCat(f, ": not a number: ", v));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", f));
    }
    if (!st.ok()) return st;
  }
  if (o->model.empty()) return absl::InvalidArgumentError("--model is required");
  if (o->prompts.empty()) return absl::InvalidArgumentError("--prompts is required");
  if (o->out.empty()) return absl::InvalidArgumentError("--out is required");
  if (o->temperatures.empty()) return absl::InvalidArgumentError("--temperatures is empty");
  if (o->top_n > 256) return absl::InvalidArgumentError("--top must be <= 256");
  return absl::OkStatus();
}

absl::Status RunDistillData(const DistillDataOptions& o) {
  // Step 1: the target, its tokenizer and template.
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file = gguf::GgufFile::Open(o.model);
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat("--model ", o.model, ": ", file.status().message()));
  }
  absl::StatusOr<std::unique_ptr<tok::Tokenizer>> tk = tok::Tokenizer::FromGguf(**file);
  if (!tk.ok()) return tk.status();
  absl::StatusOr<tok::ChatTemplate> tmpl = tok::ChatTemplate::FromGguf(**file);
  if (!tmpl.ok()) return tmpl.status();
  int skipped = 0;
  absl::StatusOr<std::vector<std::vector<int32_t>>> prompts =
      ReadPrompts(o, **tk, *tmpl, &skipped);
  if (!prompts.ok()) return prompts.status();
  std::ofstream out(o.out, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("--out: cannot write ", o.out));

  std::unique_ptr<engine::Backend> backend = engine::MakeCpuBackend(o.threads);
  engine::LocalCommunicator comm;
  engine::ModelOptions mo;
  mo.max_batch_tokens = std::max(o.max_prompt_tokens, o.batch) + o.batch;
  mo.max_logit_rows = o.batch;
  absl::StatusOr<std::unique_ptr<engine::LlamaModel>> model =
      engine::LlamaModel::Load(**file, backend.get(), &comm, mo);
  if (!model.ok()) return model.status();
  engine::LlamaModel& m = **model;
  const int32_t vocab = m.vocab_size();
  if (o.top_n > vocab) return absl::InvalidArgumentError("--top exceeds the vocabulary");
  const int blocks_per_seq = (o.max_prompt_tokens + o.max_new_tokens + kBlockSize) / kBlockSize;
  absl::StatusOr<std::unique_ptr<engine::PagedKvCache>> kv = engine::PagedKvCache::Create(
      m.MakeKvCacheConfig(o.batch * blocks_per_seq + 1, kBlockSize, kernels::KvDtype::kF16));
  if (!kv.ok()) return kv.status();

  // Step 2: the header; num_records is patched at the end.
  const size_t num_temps = o.temperatures.size();
  const uint32_t num_records =
      static_cast<uint32_t>(o.cycle_temperatures ? prompts->size() : prompts->size() * num_temps);
  out.write("SPDDATA1", 8);
  Put<uint32_t>(out, 1);
  Put<uint32_t>(out, static_cast<uint32_t>(o.top_n));
  Put<uint32_t>(out, static_cast<uint32_t>(vocab));
  Put<uint32_t>(out, num_records);
  Put<uint64_t>(out, (*tk)->Fingerprint());

  // Step 3: continuous batching over every (prompt, temperature).
  std::deque<Job> pending;
  for (size_t t = 0; t < num_temps; ++t) {
    for (size_t p = 0; p < prompts->size(); ++p) {
      if (o.cycle_temperatures && p % num_temps != t) continue;
      Job j;
      j.prompt_index = static_cast<uint32_t>(p);
      j.temperature = o.temperatures[t];
      j.tokens = (*prompts)[p];
      j.num_prompt = static_cast<uint32_t>(j.tokens.size());
      pending.push_back(std::move(j));
    }
  }
  std::vector<Job> active;
  std::vector<float> logits(static_cast<size_t>(o.batch) * vocab);
  engine::SeqId next_seq = 1;
  uint32_t done = 0;
  int64_t generated = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto last_report = t0;
  engine::ForwardBatch batch;
  while (!pending.empty() || !active.empty()) {
    // Admit: a new job's prompt is one slice; the batch's tokens stay within max_batch_tokens.
    int32_t tokens_in_batch = static_cast<int32_t>(active.size());
    while (!pending.empty() && static_cast<int>(active.size()) < o.batch &&
           tokens_in_batch + static_cast<int32_t>(pending.front().tokens.size()) <=
               mo.max_batch_tokens) {
      Job j = std::move(pending.front());
      pending.pop_front();
      j.seq = next_seq++;
      absl::Status st = (*kv)->AddSequence(j.seq);
      if (!st.ok()) return st;
      tokens_in_batch += static_cast<int32_t>(j.tokens.size());
      active.push_back(std::move(j));
    }
    batch.Clear();
    for (const Job& j : active) {
      batch.Add(j.seq, j.computed, j.tokens.data() + j.computed,
                static_cast<int32_t>(j.tokens.size()) - j.computed, /*all_logits=*/false);
    }
    absl::Status st = m.Forward(batch, **kv, logits.data());
    if (!st.ok()) return st;
    // Each row's distribution and next token, rows in parallel (each depends on its row alone),
    // then commit in row order so the file's records do not depend on the threads.
    std::vector<RowDistribution> dists(active.size());
    std::vector<absl::StatusOr<sampling::SampledToken>> sampled(active.size());
    backend->ParallelFor(static_cast<int64_t>(active.size()), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const Job& j = active[r];
        const float* row = logits.data() + r * vocab;
        ComputeDistribution(row, vocab, o.top_n, &dists[r]);
        sampling::SamplingParams sp;
        sp.temperature = j.temperature;
        sp.seed = o.seed * 1000003u + j.prompt_index;
        sampled[r] = sampling::Sample({row, static_cast<size_t>(vocab)}, {}, sp,
                                      sampling::CounterRng(sp.seed),
                                      static_cast<int64_t>(j.tokens.size()));
      }
    });
    std::vector<Job> still;
    for (size_t r = 0; r < active.size(); ++r) {
      Job& j = active[r];
      if (!sampled[r].ok()) return sampled[r].status();
      j.computed = static_cast<int32_t>(j.tokens.size());
      j.top_ids.insert(j.top_ids.end(), dists[r].ids.begin(), dists[r].ids.end());
      j.top_logprobs.insert(j.top_logprobs.end(), dists[r].logprobs.begin(),
                            dists[r].logprobs.end());
      j.tokens.push_back(sampled[r]->token);
      ++generated;
      const int responded = static_cast<int>(j.tokens.size() - j.num_prompt);
      if ((*tk)->IsEndOfGeneration(sampled[r]->token) || responded >= o.max_new_tokens) {
        WriteRecord(out, j);
        (*kv)->FreeSequence(j.seq);
        ++done;
      } else {
        still.push_back(std::move(j));
      }
    }
    active = std::move(still);
    const auto now = std::chrono::steady_clock::now();
    if (now - last_report > std::chrono::seconds(5) || (pending.empty() && active.empty())) {
      last_report = now;
      const double secs = std::chrono::duration<double>(now - t0).count();
      const double rate = done > 0 ? secs / done : 0;
      std::fprintf(stderr,
                   "distill-data: %u/%u responses, %lld tokens, %.0f tok/s, %.0f s, ETA %.0f s\n",
                   done, num_records, static_cast<long long>(generated), generated / secs, secs,
                   rate * (num_records - done));
    }
  }
  if (!out.good()) return absl::DataLossError(absl::StrCat("--out: write failed: ", o.out));
  std::fprintf(stderr, "distill-data: wrote %u records (%d prompts skipped as too long) to %s\n",
               done, skipped, o.out.c_str());
  return absl::OkStatus();
}

absl::Status RunLogits(int argc, char** argv) {
  std::string model, borrow, out, tokens, features, hidden_out;
  bool exact = false;
  kernels::KvDtype kv_dtype = kernels::KvDtype::kF32;
  for (int i = 0; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "--exact") {
      exact = true;
      continue;
    }
    if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(f, ": missing value"));
    const std::string v = argv[++i];
    if (f == "-m" || f == "--model") {
      model = v;
    } else if (f == "--borrow-from") {
      borrow = v;
    } else if (f == "-o" || f == "--out") {
      out = v;
    } else if (f == "--tokens") {
      tokens = v;
    } else if (f == "--features") {
      features = v;
    } else if (f == "--hidden-out") {
      hidden_out = v;
    } else if (f == "--kv-dtype") {
      absl::StatusOr<kernels::KvDtype> dt = engine::ParseKvDtype(v);
      if (!dt.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("--kv-dtype: ", dt.status().message()));
      }
      kv_dtype = *dt;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", f));
    }
  }
  if (model.empty() || out.empty() || tokens.empty()) {
    return absl::InvalidArgumentError("--model, --tokens and --out are required");
  }
  std::vector<int32_t> ids;
  const std::vector<std::string> parts = absl::StrSplit(tokens, ',');
  for (const std::string& p : parts) {
    int32_t id;
    if (!absl::SimpleAtoi(p, &id)) {
      return absl::InvalidArgumentError(absl::StrCat("--tokens: not an integer: ", p));
    }
    ids.push_back(id);
  }
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file = gguf::GgufFile::Open(model);
  if (!file.ok()) return file.status();
  std::unique_ptr<gguf::GgufFile> borrow_file;
  if (!borrow.empty()) {
    absl::StatusOr<std::unique_ptr<gguf::GgufFile>> b = gguf::GgufFile::Open(borrow);
    if (!b.ok()) return b.status();
    borrow_file = std::move(*b);
  }
  std::unique_ptr<engine::Backend> backend = engine::MakeCpuBackend(1);
  engine::LocalCommunicator comm;
  engine::ModelOptions mo;
  mo.max_batch_tokens = static_cast<int32_t>(ids.size());
  mo.max_logit_rows = static_cast<int32_t>(ids.size());
  mo.exact_activations = exact;
  mo.borrow_from = borrow_file.get();
  absl::StatusOr<std::unique_ptr<engine::LlamaModel>> m =
      engine::LlamaModel::Load(**file, backend.get(), &comm, mo);
  if (!m.ok()) return m.status();
  const int32_t blocks = static_cast<int32_t>(ids.size()) / kBlockSize + 2;
  absl::StatusOr<std::unique_ptr<engine::PagedKvCache>> kv = engine::PagedKvCache::Create(
      (*m)->MakeKvCacheConfig(blocks, kBlockSize, kv_dtype));
  if (!kv.ok()) return kv.status();
  absl::Status st = (*kv)->AddSequence(0);
  if (!st.ok()) return st;
  engine::ForwardBatch b;
  b.Add(0, 0, ids.data(), static_cast<int32_t>(ids.size()), /*all_logits=*/true);
  const size_t dim = static_cast<size_t>((*m)->config().embedding_dim);
  if (!features.empty()) {  // a feature-conditioned draft's input: f32 [tokens, D]
    std::ifstream in(features, std::ios::binary);
    b.input_features.resize(ids.size() * dim);
    in.read(reinterpret_cast<char*>(b.input_features.data()),
            static_cast<std::streamsize>(b.input_features.size() * sizeof(float)));
    if (!in.good()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--features ", features, ": cannot read ", ids.size(), " x ", dim, " floats"));
    }
  }
  std::vector<float> hidden;
  if (!hidden_out.empty()) {
    for (int32_t t = 0; t < static_cast<int32_t>(ids.size()); ++t) b.hidden_rows.push_back(t);
    hidden.resize(ids.size() * dim);
  }
  std::vector<float> logits(ids.size() * static_cast<size_t>((*m)->vocab_size()));
  if (!(st = (*m)->Forward(b, **kv, logits.data(), hidden.data())).ok()) return st;
  std::ofstream o(out, std::ios::binary | std::ios::trunc);
  PutAll(o, logits);
  if (!o.good()) return absl::PermissionDeniedError(absl::StrCat("--out: cannot write ", out));
  if (!hidden_out.empty()) {
    std::ofstream h(hidden_out, std::ios::binary | std::ios::trunc);
    PutAll(h, hidden);
    if (!h.good()) {
      return absl::PermissionDeniedError(absl::StrCat("--hidden-out: cannot write ", hidden_out));
    }
  }
  return absl::OkStatus();
}

// `specd hidden`: reads a distill-data file and writes the target's final hidden state at every
// token of every record (cut to --max-tokens), as the serving engine computes it.
absl::Status RunHidden(int argc, char** argv) {
  std::string model, data, out;
  int threads = 0, max_tokens = 256;
  for (int i = 0; i < argc; ++i) {
    const std::string f = argv[i];
    if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(f, ": missing value"));
    const std::string v = argv[++i];
    if (f == "-m" || f == "--model") {
      model = v;
    } else if (f == "--data") {
      data = v;
    } else if (f == "-o" || f == "--out") {
      out = v;
    } else if (f == "-t" || f == "--threads") {
      if (!absl::SimpleAtoi(v, &threads) || threads < 0) {
        return absl::InvalidArgumentError(absl::StrCat("--threads: not a count: ", v));
      }
    } else if (f == "--max-tokens") {
      if (!absl::SimpleAtoi(v, &max_tokens) || max_tokens < 1 || max_tokens > 4096) {
        return absl::InvalidArgumentError(absl::StrCat("--max-tokens: must be in [1, 4096]: ", v));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", f));
    }
  }
  if (model.empty() || data.empty() || out.empty()) {
    return absl::InvalidArgumentError("--model, --data and --out are required");
  }
  // Step 1: the records' token sequences.
  std::ifstream in(data, std::ios::binary);
  char magic[8] = {};
  uint32_t header[4] = {};
  uint64_t fingerprint = 0;
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  in.read(reinterpret_cast<char*>(&fingerprint), sizeof(fingerprint));
  if (!in.good() || std::string(magic, 8) != "SPDDATA1") {
    return absl::InvalidArgumentError(absl::StrCat("--data ", data, ": not a distill-data file"));
  }
  const uint32_t top_n = header[1], num_records = header[3];
  std::vector<std::vector<int32_t>> seqs;
  for (uint32_t r = 0; r < num_records; ++r) {
    uint32_t rec[4];
    if (!in.read(reinterpret_cast<char*>(rec), sizeof(rec))) break;  // a file cut short
    std::vector<int32_t> toks(rec[0] + rec[1]);
    in.read(reinterpret_cast<char*>(toks.data()), toks.size() * sizeof(int32_t));
    in.seekg(static_cast<std::streamoff>(rec[1]) * top_n * 8, std::ios::cur);
    if (!in.good()) break;
    if (static_cast<int>(toks.size()) > max_tokens) toks.resize(max_tokens);
    seqs.push_back(std::move(toks));
  }
  // Step 2: the target.
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file = gguf::GgufFile::Open(model);
  if (!file.ok()) return file.status();
  std::unique_ptr<engine::Backend> backend = engine::MakeCpuBackend(threads);
  engine::LocalCommunicator comm;
  engine::ModelOptions mo;
  mo.max_batch_tokens = std::max(512, max_tokens);
  mo.max_logit_rows = 1;
  absl::StatusOr<std::unique_ptr<engine::LlamaModel>> m =
      engine::LlamaModel::Load(**file, backend.get(), &comm, mo);
  if (!m.ok()) return m.status();
  const int64_t dim = (*m)->config().embedding_dim;
  const int32_t blocks = 2 * (mo.max_batch_tokens / kBlockSize + 1) + 16;
  absl::StatusOr<std::unique_ptr<engine::PagedKvCache>> kv = engine::PagedKvCache::Create(
      (*m)->MakeKvCacheConfig(blocks, kBlockSize, kernels::KvDtype::kF16));
  if (!kv.ok()) return kv.status();
  // Step 3: whole records in batches of up to max_batch_tokens, every row's hidden state kept.
  std::ofstream o(out, std::ios::binary | std::ios::trunc);
  if (!o) return absl::PermissionDeniedError(absl::StrCat("--out: cannot write ", out));
  o.write("SPDHID01", 8);
  Put<uint32_t>(o, static_cast<uint32_t>(dim));
  Put<uint32_t>(o, static_cast<uint32_t>(seqs.size()));
  engine::ForwardBatch batch;
  std::vector<float> hidden;
  std::vector<uint16_t> half;
  int64_t tokens_done = 0;
  double reported_secs = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t first = 0; first < seqs.size();) {
    batch.Clear();
    size_t last = first;
    while (last < seqs.size() &&
           batch.tokens.size() + seqs[last].size() <= static_cast<size_t>(mo.max_batch_tokens)) {
      const engine::SeqId id = static_cast<engine::SeqId>(last);
      if (absl::Status st = (*kv)->AddSequence(id); !st.ok()) return st;
      const int32_t base = static_cast<int32_t>(batch.tokens.size());
      batch.AddPrompt(id, 0, seqs[last].data(), static_cast<int32_t>(seqs[last].size()));
      for (int32_t t = 0; t < static_cast<int32_t>(seqs[last].size()); ++t) {
        batch.hidden_rows.push_back(base + t);
      }
      ++last;
    }
    hidden.resize(batch.hidden_rows.size() * dim);
    if (absl::Status st = (*m)->Forward(batch, **kv, nullptr, hidden.data()); !st.ok()) return st;
    half.resize(hidden.size());
    for (size_t i = 0; i < hidden.size(); ++i) half[i] = gguf::F32ToF16(hidden[i]);
    size_t row = 0;
    for (size_t r = first; r < last; ++r) {
      Put<uint32_t>(o, static_cast<uint32_t>(seqs[r].size()));
      o.write(reinterpret_cast<const char*>(half.data() + row * dim),
              static_cast<std::streamsize>(seqs[r].size() * dim * sizeof(uint16_t)));
      row += seqs[r].size();
      (*kv)->FreeSequence(static_cast<engine::SeqId>(r));
    }
    tokens_done += static_cast<int64_t>(batch.tokens.size());
    first = last;
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (first == seqs.size() || secs - reported_secs > 5) {
      reported_secs = secs;
      std::fprintf(stderr, "specd hidden: %zu/%zu records, %.0f tok/s, ETA %.0f s\n", first,
                   seqs.size(), tokens_done / secs,
                   secs / static_cast<double>(first) * static_cast<double>(seqs.size() - first));
    }
  }
  if (!o.good()) return absl::DataLossError(absl::StrCat("--out: write failed: ", out));
  return absl::OkStatus();
}

}  // namespace specd
