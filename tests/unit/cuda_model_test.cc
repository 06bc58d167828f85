// The whole model forward on the CUDA backend (label gpu): the tiny models' logits against the
// reference backend's, every step of a prefill / decode / verify script; each decode row alone
// bitwise equal to the same row in a batch (the kernels' results depend only on their own row);
// greedy speculation on the GPU equal to plain greedy; steps as CUDA graphs bitwise steps
// launch by launch. Without a CUDA device every case prints
// NOT RUN and is reported skipped.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/gguf/gguf_file.h"
#include "engine/backend.h"
#include "engine/backend_factory.h"
#include "engine/communicator.h"
#include "engine/llama_model.h"
#include "engine/nccl_communicator.h"
#include "engine/paged_kv_cache.h"
#include "gtest/gtest.h"
#include "tests/unit/model_test_util.h"
#include "kernels/cuda/rms_norm.h"
#include "common/tokenizer/tokenizer.h"
#include "speculation/model_drafter.h"
#include "speculation/spec_engine.h"
#include "tests/unit/spec_test_util.h"
#include "testing/free_port.h"
#include "testing/tiny_model.h"

namespace specd::engine {
namespace {

using kernels::KvDtype;

std::unique_ptr<Loaded> Load(const std::string& path, const std::string& device, KvDtype dtype) {
  auto l = std::make_unique<Loaded>();
  auto f = gguf::GgufFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return nullptr;
  l->file = std::move(*f);
  auto be = MakeBackend(device, 1);
  EXPECT_TRUE(be.ok()) << be.status();
  if (!be.ok()) return nullptr;
  l->backend = std::move(*be);
  ModelOptions o;
  o.max_batch_tokens = 256;  // the invariance test's batched prefill: 249 tokens
  o.max_logit_rows = 128;
  auto m = LlamaModel::Load(*l->file, l->backend.get(), &l->comm, o);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  l->model = std::move(*m);
  auto kv = PagedKvCache::Create(l->model->MakeKvCacheConfig(64, 16, dtype));
  EXPECT_TRUE(kv.ok()) << kv.status();
  l->kv = std::move(*kv);
  return l;
}

class CudaModelTest : public ::testing::TestWithParam<KvDtype> {
 protected:
  void SetUp() override {
    if (!CudaBackendBuilt() || kernels::cuda::DeviceCount() == 0) {
      GTEST_SKIP() << "NOT RUN: no CUDA device";
    }
  }
};

TEST_P(CudaModelTest, LogitsMatchTheReferenceBackendStepByStep) {
  for (const char* arch : {"llama", "qwen2"}) {
    testing::TinyModelSpec spec;
    spec.architecture = arch;
    spec.num_layers = 3;
    const std::string path = ::testing::TempDir() + "/cuda_model_" + arch + ".gguf";
    ASSERT_TRUE(testing::WriteTinyModel(spec, path).ok());
    auto gpu = Load(path, "cuda", GetParam()), ref = Load(path, "ref", GetParam());
    ASSERT_TRUE(gpu && ref);
    const int vocab = ref->model->vocab_size();
    const std::vector<int32_t> a = Tokens(100, vocab, 1), b = Tokens(7, vocab, 2);
    for (Loaded* l : {gpu.get(), ref.get()}) {
      ASSERT_TRUE(l->kv->AddSequence(1).ok());
      ASSERT_TRUE(l->kv->AddSequence(2).ok());
    }
    std::vector<ForwardBatch> steps(3);
    steps[0].Add(1, 0, a.data(), 100, /*all_logits=*/true);
    steps[0].Add(2, 0, b.data(), 7, /*all_logits=*/true);
    const int32_t t1 = 5, t2 = 6;
    steps[1].Add(1, 100, &t1, 1, false);
    steps[1].Add(2, 7, &t2, 1, false);
    steps[2].AddVerify(1, 101, std::vector<int32_t>{8}, std::vector<int32_t>{9, 10, 11});
    for (size_t i = 0; i < steps.size(); ++i) {
      const std::vector<float> g = gpu->Run(steps[i]), r = ref->Run(steps[i]);
      double max_diff = 0, max_abs = 0;
      for (size_t j = 0; j < g.size(); ++j) {
        ASSERT_TRUE(std::isfinite(g[j])) << arch << " step " << i << " value " << j;
        max_diff = std::max(max_diff, std::fabs(double{g[j]} - r[j]));
        max_abs = std::max(max_abs, std::fabs(double{r[j]}));
      }
      // Not bitwise the reference (float RmsNorm, expf, the warp MatMul's order): a last-bit
      // difference can flip an int8 activation rounding of the next product, as between the
      // CPU's fast and reference backends (measured there: 0.14 of a logit of 72).
      const double tol = 2e-2 * std::max(1.0, max_abs);
      EXPECT_LT(max_diff, tol) << arch << " step " << i << " (max |logit| " << max_abs << ")";
    }
  }
}

TEST_P(CudaModelTest, EachRowAloneEqualsItsRowInABatch) {
  testing::TinyModelSpec spec;
  const std::string path = ::testing::TempDir() + "/cuda_model_invariance.gguf";
  ASSERT_TRUE(testing::WriteTinyModel(spec, path).ok());
  auto batched = Load(path, "cuda", GetParam()), alone = Load(path, "cuda", GetParam());
  ASSERT_TRUE(batched && alone);
  const int vocab = batched->model->vocab_size();
  constexpr int kSeqs = 6;
  ForwardBatch prefill;
  std::vector<std::vector<int32_t>> prompts;
  for (int s = 0; s < kSeqs; ++s) prompts.push_back(Tokens(9 + 13 * s, vocab, s));
  for (Loaded* l : {batched.get(), alone.get()}) {
    for (int s = 0; s < kSeqs; ++s) ASSERT_TRUE(l->kv->AddSequence(s).ok());
  }
  for (int s = 0; s < kSeqs; ++s) {
    ForwardBatch one;
    one.Add(s, 0, prompts[s].data(), static_cast<int32_t>(prompts[s].size()), false);
    prefill.Add(s, 0, prompts[s].data(), static_cast<int32_t>(prompts[s].size()), false);
    alone->Run(one);
  }
  batched->Run(prefill);
  ForwardBatch decode;
  std::vector<int32_t> next(kSeqs);
  for (int s = 0; s < kSeqs; ++s) {
    next[s] = (s * 7 + 3) % vocab;
    decode.Add(s, static_cast<int32_t>(prompts[s].size()), &next[s], 1, false);
  }
  const std::vector<float> all = batched->Run(decode);
  for (int s = 0; s < kSeqs; ++s) {
    ForwardBatch one;
    one.Add(s, static_cast<int32_t>(prompts[s].size()), &next[s], 1, false);
    const std::vector<float> row = alone->Run(one);
    for (int v = 0; v < vocab; ++v) ASSERT_EQ(row[v], all[s * vocab + v]) << "seq " << s << " token " << v;
  }
}

// Steps as CUDA graphs against the same steps launch by launch (SPECD_CUDA_GRAPHS=off):
// prefill, then greedy decoding of 3 sequences with a verification group each round, at
// contexts that grow past several attention chunks (so the plan's buffers grow and graphs are
// recaptured). Bitwise the same logits (a row depends only on itself, so padding rows change
// nothing), the same greedy tokens, and graphs actually replayed.
// A graph names the KV pools it ran on. The same model going on with a new cache once the old
// one is freed (a new engine over the model: specd-bench's rows) must record anew, not replay
// onto freed pools (an illegal address on the device: seen on an H200 before the fix).
TEST_P(CudaModelTest, RecordedStepsFollowTheModelToANewKvCache) {
  testing::TinyModelSpec spec;
  spec.num_layers = 2;
  const std::string path = ::testing::TempDir() + "/cuda_model_new_cache.gguf";
  ASSERT_TRUE(testing::WriteTinyModel(spec, path).ok());
  auto gpu = Load(path, "cuda", GetParam()), ref = Load(path, "ref", GetParam());
  ASSERT_TRUE(gpu && ref);
  const int vocab = ref->model->vocab_size();
  const std::vector<int32_t> prompt = Tokens(11, vocab, 3);
  for (int cache = 0; cache < 2; ++cache) {
    for (Loaded* l : {gpu.get(), ref.get()}) {
      if (cache > 0) {  // the new cache is made first, so its pools cannot take the old address
        auto fresh = PagedKvCache::Create(l->model->MakeKvCacheConfig(64, 16, GetParam()));
        ASSERT_TRUE(fresh.ok()) << fresh.status();
        l->kv = std::move(*fresh);
      }
      ASSERT_TRUE(l->kv->AddSequence(0).ok());
      ForwardBatch p;
      p.Add(0, 0, prompt.data(), static_cast<int32_t>(prompt.size()), false);
      l->Run(p);
    }
    for (int32_t step = 0; step < 4; ++step) {  // one shape: as it is, captured, replayed
      ForwardBatch s;
      const int32_t tok = (step * 17 + cache) % vocab;
      s.Add(0, static_cast<int32_t>(prompt.size()) + step, &tok, 1, false);
      const std::vector<float> g = gpu->Run(s), r = ref->Run(s);
      double max_diff = 0, max_abs = 0;
      for (size_t j = 0; j < g.size(); ++j) {
        ASSERT_TRUE(std::isfinite(g[j])) << "cache " << cache << " step " << step;
        max_diff = std::max(max_diff, std::fabs(double{g[j]} - r[j]));
        max_abs = std::max(max_abs, std::fabs(double{r[j]}));
      }
      EXPECT_LT(max_diff, 2e-2 * std::max(1.0, max_abs)) << "cache " << cache << " step " << step;
    }
  }
  EXPECT_GE(gpu->backend->step_graph_stats().replays, 4);
}

TEST_P(CudaModelTest, StepsAsGraphsEqualStepsLaunchByLaunch) {
  testing::TinyModelSpec spec;
  const std::string path = ::testing::TempDir() + "/cuda_model_graphs.gguf";
  ASSERT_TRUE(testing::WriteTinyModel(spec, path).ok());
  auto graphs = Load(path, "cuda", GetParam());
  ASSERT_EQ(setenv("SPECD_CUDA_GRAPHS", "off", 1), 0);
  auto eager = Load(path, "cuda", GetParam());
  ASSERT_EQ(unsetenv("SPECD_CUDA_GRAPHS"), 0);
  ASSERT_TRUE(graphs && eager);
  ASSERT_TRUE(graphs->backend->replays_steps());
  ASSERT_FALSE(eager->backend->replays_steps());
  const int vocab = graphs->model->vocab_size();
  std::vector<int32_t> pos(3), last(3);
  for (Loaded* l : {graphs.get(), eager.get()}) {
    for (int32_t s = 0; s < 3; ++s) {
      ASSERT_TRUE(l->kv->AddSequence(s).ok());
      const std::vector<int32_t> prompt = Tokens(70 + 40 * s, vocab, s);
      ForwardBatch p;
      p.Add(s, 0, prompt.data(), static_cast<int32_t>(prompt.size()), false);
      l->Run(p);
      pos[s] = static_cast<int32_t>(prompt.size());
      last[s] = prompt.back();
    }
  }
  for (int round = 0; round < 60; ++round) {
    ForwardBatch b;
    const int32_t verifier = round % 3;
    for (int32_t s = 0; s < 3; ++s) {
      if (s == verifier) {
        b.AddVerify(s, pos[s], std::vector<int32_t>{last[s]}, std::vector<int32_t>{(round * 5) % vocab});
      } else {
        b.Add(s, pos[s], &last[s], 1, false);
      }
    }
    const std::vector<float> g = graphs->Run(b), e = eager->Run(b);
    ASSERT_EQ(g, e) << "round " << round;
    // Each sequence takes its greedy token after its last row (the verifier: after its
    // draft row, as if the draft was rejected and corrected).
    int64_t row = 0;
    for (int32_t s = 0; s < 3; ++s) {
      const int64_t rows = s == verifier ? 2 : 1;
      const float* r = g.data() + (row + rows - 1) * vocab;
      last[s] = static_cast<int32_t>(std::max_element(r, r + vocab) - r);
      pos[s] += 1;  // the verifier's draft slot is overwritten next round
      row += rows;
    }
  }
  const StepGraphStats st = graphs->backend->step_graph_stats();
  EXPECT_GE(st.captures, 1);
  EXPECT_GE(st.replays, 40) << "captures " << st.captures << ", eager " << st.eager;
  EXPECT_EQ(eager->backend->step_graph_stats().replays, 0);
}

// The tensor-parallel all-reduces inside the graphs: a model whose communicator is NCCL at
// world size 1, enqueue-only on the backend's stream (so each step's graph holds its
// collectives), against the same model with the one-rank LocalCommunicator. NCCL's sum over
// one rank is its input, so the logits are bitwise the same, step after step.
TEST_P(CudaModelTest, CollectivesInsideTheGraphs) {
  testing::TinyModelSpec spec;
  const std::string path = ::testing::TempDir() + "/cuda_model_nccl_graphs.gguf";
  ASSERT_TRUE(testing::WriteTinyModel(spec, path).ok());
  auto local = Load(path, "cuda", GetParam());
  ASSERT_TRUE(local);
  auto be = MakeBackend("cuda", 1);
  ASSERT_TRUE(be.ok()) << be.status();
  NcclOptions o;
  o.rendezvous = "127.0.0.1:" + std::to_string(testing::FreeTcpPort());
  o.stream = (*be)->device_stream();
  o.enqueue_only = true;
  auto nccl = NcclCommunicator::Connect(o);
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  ASSERT_TRUE((*nccl)->works_in_step_graphs());
  ModelOptions mo;
  mo.max_batch_tokens = 256;
  mo.max_logit_rows = 128;
  auto model = LlamaModel::Load(*local->file, be->get(), nccl->get(), mo);
  ASSERT_TRUE(model.ok()) << model.status();
  auto kv = PagedKvCache::Create((*model)->MakeKvCacheConfig(64, 16, GetParam()));
  ASSERT_TRUE(kv.ok() && (*kv)->AddSequence(1).ok() && local->kv->AddSequence(1).ok());
  const int vocab = (*model)->vocab_size();
  const std::vector<int32_t> prompt = Tokens(33, vocab, 4);
  int32_t pos = 0, tok = prompt[0];
  for (int step = 0; step < 24; ++step) {
    ForwardBatch b;
    if (step == 0) {
      b.Add(1, 0, prompt.data(), 33, false);
      pos = 33;
    } else {
      b.Add(1, pos++, &tok, 1, false);
    }
    std::vector<float> with_nccl(b.logit_rows.size() * vocab);
    ASSERT_TRUE((*model)->Forward(b, **kv, with_nccl.data()).ok());
    const std::vector<float> with_local = local->Run(b);
    ASSERT_EQ(with_nccl, with_local) << "step " << step;
    tok = static_cast<int32_t>(std::max_element(with_local.begin(), with_local.end()) - with_local.begin());
  }
  EXPECT_GE((*be)->step_graph_stats().replays, 20);
  model->reset();
  (*nccl)->Disarm();
}

// Greedy speculation on the GPU equals plain greedy, with the steps as CUDA graphs and launch
// by launch: target and draft on CUDA backends, verification and proposals where the logits
// are, against plain decoding of the same target on the GPU launch by launch.
// Not per KV dtype: the model-level tests above cover those; this one is about the engine.
class CudaSpecTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaBackendBuilt() || kernels::cuda::DeviceCount() == 0) {
      GTEST_SKIP() << "NOT RUN: no CUDA device";
    }
  }
};

TEST_F(CudaSpecTest, GreedySpeculationEqualsPlainWithGraphsOnAndOff) {
  testing::TinyModelSpec t;
  t.seed = 1;
  t.num_layers = 3;
  t.weight_scale = 0.3f;  // peaked distributions: the draft agrees often, not always
  testing::TinyModelSpec d = t;
  d.weight_type = gguf::GgmlType::kQ4_1;
  const std::string target_path = ::testing::TempDir() + "/cuda_spec_target.gguf";
  const std::string draft_path = ::testing::TempDir() + "/cuda_spec_draft.gguf";
  ASSERT_TRUE(testing::WriteTinyModel(t, target_path).ok() && testing::WriteTinyModel(d, draft_path).ok());
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) prompts.push_back(Tokens(4 + 5 * i, 256, 20 + i));
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.ignore_eos = true;
  const std::vector<sampling::SamplingParams> params(prompts.size(), greedy);
  std::vector<std::vector<int32_t>> plain;
  for (const bool graphs : {false, true}) {
    if (!graphs) {
      ASSERT_EQ(setenv("SPECD_CUDA_GRAPHS", "off", 1), 0);
    }
    auto target_be = MakeBackend("cuda", 1), draft_be = MakeBackend("cuda", 1);
    ASSERT_EQ(unsetenv("SPECD_CUDA_GRAPHS"), 0);
    ASSERT_TRUE(target_be.ok() && draft_be.ok());
    auto target = spec::test::LoadModel(target_path, target_be->get(), 256, 256);
    ASSERT_TRUE(target);
    if (!graphs) plain = spec::test::PlainGenerate(*target->model, prompts, params, 24, {});
    auto tk = tok::Tokenizer::FromGguf(*target->file);
    ASSERT_TRUE(tk.ok());
    const spec::TargetIdentity identity{target_path, (*tk)->Fingerprint(), (*tk)->vocab_size()};
    spec::ModelDrafterOptions o;
    o.kv_blocks = 256;
    auto drafter = spec::ModelDrafter::CreateFromFile(draft_path, identity, draft_be->get(), o);
    ASSERT_TRUE(drafter.ok()) << drafter.status();
    spec::SpecEngineOptions eo;
    eo.k = 3;
    eo.max_running = 5;
    auto engine = spec::SpecEngine::Create(target->model.get(), drafter->get(), eo);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const auto got = spec::test::EngineGenerate(**engine, prompts, params, 24);
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], plain[i]) << "graphs " << graphs << ", prompt " << i;
    EXPECT_GT((*engine)->stats().drafted, 0);
    EXPECT_EQ((*target_be)->step_graph_stats().replays > 0, graphs);
  }
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, CudaModelTest,
                         ::testing::Values(KvDtype::kF16, KvDtype::kBF16, KvDtype::kInt8, KvDtype::kF32));

}  // namespace
}  // namespace specd::engine
