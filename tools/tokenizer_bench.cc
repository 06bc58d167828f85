// Encode / decode throughput of the tokenizer on ~1 MB of text built by repeating the golden
// strings. Uses the real model when present, else the tiny fixtures.
//   SPECD_SOURCE_DIR=. build/tools/tokenizer_bench [--benchmark_filter=...]
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "benchmark/benchmark.h"
#include "common/gguf/gguf_file.h"
#include "common/tokenizer/tokenizer.h"

namespace {

std::string SourceDir() {
  const char* dir = std::getenv("SPECD_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

struct Fixture {
  std::unique_ptr<specd::gguf::GgufFile> file;
  std::unique_ptr<specd::tok::Tokenizer> tok;
  std::string text;
  std::vector<int32_t> ids;
};

// ~1 MB of the golden strings repeated (special-token text included).
std::string BenchText() {
  std::ifstream in(SourceDir() + "/tests/data/tokenizer/tiny_bpe_goldens.json");
  if (!in) return std::string(1 << 20, 'a');
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json g = nlohmann::json::parse(ss.str());
  std::string unit;
  for (const auto& c : g["cases"]) unit += c["text"].get<std::string>() + "\n";
  std::string text;
  while (text.size() < (1u << 20)) text += unit;
  return text;
}

Fixture* Load(const std::string& path) {
  auto* f = new Fixture();
  auto file = specd::gguf::GgufFile::Open(path);
  if (!file.ok()) {
    std::cerr << path << ": " << file.status() << "\n";
    return nullptr;
  }
  f->file = *std::move(file);
  auto tok = specd::tok::Tokenizer::FromGguf(*f->file);
  if (!tok.ok()) {
    std::cerr << path << ": " << tok.status() << "\n";
    return nullptr;
  }
  f->tok = *std::move(tok);
  f->text = BenchText();
  f->ids = *f->tok->Encode(f->text, false, true);
  return f;
}

void BM_Encode(benchmark::State& state, const std::string& path) {
  static std::unordered_map<std::string, Fixture*> cache;
  Fixture*& f = cache[path];
  if (f == nullptr) f = Load(path);
  if (f == nullptr) {
    state.SkipWithError("model not available");
    return;
  }
  for (auto _ : state) {
    auto ids = f->tok->Encode(f->text, false, true);
    benchmark::DoNotOptimize(ids);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f->text.size()));
  state.counters["tokens"] = static_cast<double>(f->ids.size());
}

void BM_Decode(benchmark::State& state, const std::string& path) {
  Fixture* f = Load(path);
  if (f == nullptr) {
    state.SkipWithError("model not available");
    return;
  }
  for (auto _ : state) {
    std::string s = f->tok->Decode(f->ids);
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f->text.size()));
  delete f;
}

// Short prompts: no per-call cache kicks in; measures fixed overheads.
void BM_EncodeShort(benchmark::State& state, const std::string& path) {
  Fixture* f = Load(path);
  if (f == nullptr) {
    state.SkipWithError("model not available");
    return;
  }
  const std::string prompt =
      "<|im_start|>user\nWhat is speculative decoding, and why does it help latency?<|im_end|>\n";
  for (auto _ : state) {
    auto ids = f->tok->Encode(prompt, false, true);
    benchmark::DoNotOptimize(ids);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * prompt.size()));
  delete f;
}

const std::string kSmol = SourceDir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
const std::string kTinySpm = SourceDir() + "/tests/data/tokenizer/tiny_spm.gguf";

BENCHMARK_CAPTURE(BM_Encode, smollm2, kSmol)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Decode, smollm2, kSmol)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeShort, smollm2, kSmol);
BENCHMARK_CAPTURE(BM_Encode, tiny_spm, kTinySpm)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
