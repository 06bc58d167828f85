// Helpers for the speculative-engine tests: loading models, an independent plain decoder (the
// reference speculation must match), and running a SpecEngine over many prompts.
#ifndef SPECD_TESTS_UNIT_SPEC_TEST_UTIL_H_
#define SPECD_TESTS_UNIT_SPEC_TEST_UTIL_H_

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend.h"
#include "engine/communicator.h"
#include "engine/llama_model.h"
#include "engine/paged_kv_cache.h"
#include "common/gguf/gguf_file.h"
#include "common/sampling/penalty_state.h"
#include "common/sampling/sampler.h"
#include "speculation/spec_engine.h"
#include "gtest/gtest.h"

namespace specd::spec::test {

inline std::string SourceDir() {
  const char* d = std::getenv("SPECD_SOURCE_DIR");
  return d ? d : ".";
}

struct LoadedModel {
  std::unique_ptr<gguf::GgufFile> file;
  engine::LocalCommunicator comm;
  std::unique_ptr<engine::LlamaModel> model;
};

inline std::unique_ptr<LoadedModel> LoadModel(const std::string& path, engine::Backend* backend,
                                              int32_t max_batch_tokens, int32_t max_logit_rows) {
  auto l = std::make_unique<LoadedModel>();
  auto f = gguf::GgufFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return nullptr;
  l->file = std::move(*f);
  engine::ModelOptions opt;
  opt.max_batch_tokens = max_batch_tokens;
  opt.max_logit_rows = max_logit_rows;
  auto m = engine::LlamaModel::Load(*l->file, backend, &l->comm, opt);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  l->model = std::move(*m);
  return l;
}

// Plain decoding, independent of SpecEngine: prefill every prompt, then one token per sequence
// per batched forward, each sampled by sampling::Sample at its absolute position. Stops at
// max_new tokens or a stop token (included). params[i] belongs to prompts[i].
inline std::vector<std::vector<int32_t>> PlainGenerate(
    engine::LlamaModel& m, const std::vector<std::vector<int32_t>>& prompts,
    const std::vector<sampling::SamplingParams>& params, int32_t max_new,
    const std::vector<int32_t>& eos) {
  const int32_t vocab = m.vocab_size();
  const size_t n = prompts.size();
  int64_t tokens = 0;
  for (const auto& p : prompts) tokens += static_cast<int64_t>(p.size()) + max_new + 16;
  auto kv = engine::PagedKvCache::Create(m.MakeKvCacheConfig(
      static_cast<int32_t>(tokens / 16 + 2 * n + 4), 16, kernels::KvDtype::kF16));
  EXPECT_TRUE(kv.ok());
  std::vector<std::vector<int32_t>> out(n);
  std::vector<std::vector<int32_t>> seq = prompts;
  std::vector<sampling::PenaltyState> hist;
  std::vector<bool> done(n, false);
  std::vector<float> logits(static_cast<size_t>(m.options().max_logit_rows) * vocab);
  engine::ForwardBatch b;
  for (size_t i = 0; i < n; ++i) {
    hist.push_back(sampling::PenaltyState::FromTokens(prompts[i], {}));
    EXPECT_TRUE((*kv)->AddSequence(static_cast<int64_t>(i)).ok());
    // Prefill all but the last prompt token; the decode loop feeds the last one.
    for (size_t done_tok = 0; done_tok + 1 < prompts[i].size();) {
      const int32_t take = static_cast<int32_t>(
          std::min<size_t>(prompts[i].size() - 1 - done_tok, m.options().max_batch_tokens));
      b.Clear();
      b.Add(static_cast<int64_t>(i), static_cast<int32_t>(done_tok), prompts[i].data() + done_tok,
            take, false);
      b.logit_rows.clear();
      EXPECT_TRUE(m.Forward(b, **kv, logits.data()).ok());
      done_tok += take;
    }
  }
  const size_t rows = static_cast<size_t>(m.options().max_logit_rows);
  for (int32_t step = 0; step < max_new; ++step) {
    // Up to max_logit_rows sequences per forward.
    std::vector<size_t> active;
    for (size_t i = 0; i < n; ++i) {
      if (!done[i]) active.push_back(i);
    }
    if (active.empty()) break;
    for (size_t a0 = 0; a0 < active.size(); a0 += rows) {
      b.Clear();
      const size_t a1 = std::min(active.size(), a0 + rows);
      for (size_t a = a0; a < a1; ++a) {
        const size_t i = active[a];
        b.Add(static_cast<int64_t>(i), static_cast<int32_t>(seq[i].size() - 1), &seq[i].back(), 1,
              false);
      }
      absl::Status st = m.Forward(b, **kv, logits.data());
      EXPECT_TRUE(st.ok()) << st;
      for (size_t a = a0; a < a1; ++a) {
        const size_t i = active[a];
        auto s = sampling::Sample(absl::Span<const float>(logits.data() + (a - a0) * vocab, vocab),
                                  hist[i], params[i], sampling::CounterRng(params[i].seed),
                                  static_cast<int64_t>(seq[i].size()));
        EXPECT_TRUE(s.ok()) << s.status();
        out[i].push_back(s->token);
        seq[i].push_back(s->token);
        hist[i].AddGenerated(s->token);
        if (static_cast<int32_t>(out[i].size()) >= max_new ||
            sampling::IsStopToken(params[i], eos, s->token)) {
          done[i] = true;
        }
      }
    }
  }
  return out;
}

// Admits every prompt, runs the engine to completion and returns the generated tokens.
inline std::vector<std::vector<int32_t>> EngineGenerate(
    SpecEngine& e, const std::vector<std::vector<int32_t>>& prompts,
    const std::vector<sampling::SamplingParams>& params, int32_t max_new, int32_t k = -1) {
  std::vector<RequestId> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SpecRequest r;
    r.prompt = prompts[i];
    r.params = params[i];
    r.max_new_tokens = max_new;
    r.k = k;
    auto id = e.Admit(std::move(r));
    EXPECT_TRUE(id.ok()) << id.status();
    ids.push_back(id.ok() ? *id : -1);
  }
  absl::Status st = e.RunToCompletion();
  EXPECT_TRUE(st.ok()) << st;
  std::vector<std::vector<int32_t>> out;
  for (RequestId id : ids) {
    auto r = e.TakeResult(id);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) {
      out.emplace_back();
      continue;
    }
    EXPECT_TRUE(r->status.ok()) << r->status;
    out.push_back(r->tokens);
  }
  return out;
}

}  // namespace specd::spec::test

#endif  // SPECD_TESTS_UNIT_SPEC_TEST_UTIL_H_
