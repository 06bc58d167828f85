// The model forward: reference vs fast backend, batch invariance, errors, and the real
// SmolLM2 model against goldens from an independent numpy implementation
// (scripts/gen_model_goldens.py).
#include "engine/llama_model.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend.h"
#include "engine/backend_factory.h"
#include "engine/communicator.h"
#include "engine/paged_kv_cache.h"
#include "engine/thread_communicator.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_writer.h"
#include "testing/tiny_model.h"
#include "gtest/gtest.h"
#include "tests/unit/model_test_util.h"
#include "kernels/cpu/ops.h"
#include "nlohmann/json.hpp"

namespace specd::engine {
namespace {

std::string SourceDir() {
  const char* d = std::getenv("SPECD_SOURCE_DIR");
  return d ? d : ".";
}

std::unique_ptr<Loaded> Load(const std::string& path, bool reference, int32_t blocks = 256,
                             kernels::KvDtype dtype = kernels::KvDtype::kF16) {
  auto l = std::make_unique<Loaded>();
  auto f = gguf::GgufFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return nullptr;
  l->file = std::move(*f);
  l->backend = reference ? MakeReferenceBackend() : MakeCpuBackend(2);
  ModelOptions opt;
  opt.max_batch_tokens = 256;
  opt.max_logit_rows = 256;
  auto m = LlamaModel::Load(*l->file, l->backend.get(), &l->comm, opt);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  l->model = std::move(*m);
  auto kv = PagedKvCache::Create(l->model->MakeKvCacheConfig(blocks, 16, dtype));
  EXPECT_TRUE(kv.ok()) << kv.status();
  l->kv = std::move(*kv);
  return l;
}

// The files this process writes under TempDir(), removed when it exits.
struct TempFiles {
  std::vector<std::string> paths;
  ~TempFiles() {
    for (const std::string& p : paths) std::remove(p.c_str());  // a missing file is fine
  }
};

// A file of this process's under the test temp dir. The name carries the pid: ctest runs this
// binary twice at once (llama_model_test_vnni_emulated), and the two must not write each
// other's files.
std::string TempPath(const std::string& name) {
  static TempFiles files;
  std::string path = ::testing::TempDir() + "/" + std::to_string(getpid()) + "_" + name;
  files.paths.push_back(path);
  return path;
}

std::string TinyModelPath(const std::string& name, testing::TinyModelSpec spec = {}) {
  const std::string path = TempPath(name + ".gguf");
  absl::Status st = testing::WriteTinyModel(spec, path);
  EXPECT_TRUE(st.ok()) << st;
  return path;
}

// SPECD_KERNELS_ISA picks the kernels this file's fast paths run on (ctest runs it a second
// time on the AVX-512 VNNI code with AVX-512 emulated): a name this CPU cannot run must
// fail here rather than quietly fall back. Unset, the default is never the emulated code.
TEST(LlamaModelTest, RequestedKernelIsaIsActive) {
  const std::string active = kernels::cpu::IsaName(kernels::cpu::ActiveIsa());
  if (const char* want = std::getenv("SPECD_KERNELS_ISA"); want != nullptr) {
    EXPECT_EQ(active, want);
  } else {
    EXPECT_NE(active, "vnni_emulated");
  }
}

TEST(LlamaModelTest, FastBackendMatchesReferenceOnTinyModels) {
  for (gguf::GgmlType type : {gguf::GgmlType::kQ8_0, gguf::GgmlType::kQ4_1,
                              gguf::GgmlType::kQ4_0, gguf::GgmlType::kF16,
                              gguf::GgmlType::kF32}) {
    for (std::string arch : {"llama", "qwen2"}) {
      testing::TinyModelSpec spec;
      spec.weight_type = type;
      spec.architecture = arch;
      spec.tied_output = arch == "llama";
      const std::string path =
          TinyModelPath(arch + "_" + std::to_string(static_cast<int>(type)), spec);
      auto ref = Load(path, /*reference=*/true);
      auto fast = Load(path, /*reference=*/false);
      ASSERT_TRUE(ref && fast);
      const int vocab = ref->model->vocab_size();
      const std::vector<int32_t> toks = Tokens(37, vocab, 1);
      ForwardBatch b;
      ASSERT_TRUE(ref->kv->AddSequence(1).ok());
      ASSERT_TRUE(fast->kv->AddSequence(1).ok());
      b.Add(1, 0, toks.data(), static_cast<int32_t>(toks.size()), /*all_logits=*/true);
      std::vector<float> a = ref->Run(b), c = fast->Run(b);
      ASSERT_EQ(a.size(), c.size());
      double max_diff = 0, max_abs = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_TRUE(std::isfinite(c[i])) << i;
        max_diff = std::max(max_diff, std::fabs(double{a[i]} - c[i]));
        max_abs = std::max(max_abs, std::fabs(double{a[i]}));
      }
      // Same integer block math on both sides; only float summation order differs.
      EXPECT_LT(max_diff, 1e-2 * std::max(1.0, max_abs))
          << arch << " type " << static_cast<int>(type) << " max|logit| " << max_abs;
    }
  }
}

// Logits of a sequence are bitwise identical whether it runs alone or batched with others,
// and whether its tokens arrive all at once, one per step, or in verification-sized chunks.
TEST(LlamaModelTest, BatchInvariance) {
  testing::TinyModelSpec spec;
  spec.weight_type = gguf::GgmlType::kQ4_1;
  const std::string path = TinyModelPath("invariance", spec);
  auto m = Load(path, false);
  ASSERT_TRUE(m);
  const int vocab = m->model->vocab_size();
  const std::vector<int32_t> a = Tokens(40, vocab, 1), o1 = Tokens(23, vocab, 2),
                             o2 = Tokens(5, vocab, 3);

  // Alone, whole sequence in one call.
  ASSERT_TRUE(m->kv->AddSequence(1).ok());
  ForwardBatch b;
  b.Add(1, 0, a.data(), 40, true);
  const std::vector<float> alone = m->Run(b);
  m->kv->FreeSequence(1);

  // Batched with two others, in chunks of 1, 5 (a k=4 verification row) and the rest.
  ASSERT_TRUE(m->kv->AddSequence(1).ok());
  ASSERT_TRUE(m->kv->AddSequence(2).ok());
  ASSERT_TRUE(m->kv->AddSequence(3).ok());
  std::vector<float> chunked;
  int pos = 0;
  const int chunks[] = {1, 5, 1, 1, 13, 19};
  int other = 0;
  for (int n : chunks) {
    b.Clear();
    b.Add(2, other, o1.data() + (other % 18), 5, true);
    b.Add(1, pos, a.data() + pos, n, true);
    b.Add(3, 0, o2.data(), 5, false);  // restarts at 0 every step: rollback path
    std::vector<float> out = m->Run(b);
    // Rows of sequence 1 follow sequence 2's 5 rows.
    chunked.insert(chunked.end(), out.begin() + 5 * vocab, out.begin() + (5 + n) * vocab);
    pos += n;
    other += 5;
  }
  ASSERT_EQ(pos, 40);
  ASSERT_EQ(chunked.size(), alone.size());
  for (size_t i = 0; i < alone.size(); ++i) {
    ASSERT_EQ(alone[i], chunked[i]) << "row " << i / vocab << " col " << i % vocab;
  }
}

TEST(LlamaModelTest, RollbackRecomputesIdentically) {
  const std::string path = TinyModelPath("rollback");
  auto m = Load(path, false);
  ASSERT_TRUE(m);
  const int vocab = m->model->vocab_size();
  const std::vector<int32_t> a = Tokens(20, vocab, 4);
  std::vector<int32_t> wrong = a;
  for (int i = 12; i < 20; ++i) wrong[i] = (wrong[i] + 1) % vocab;
  ASSERT_TRUE(m->kv->AddSequence(1).ok());
  ForwardBatch b;
  b.Add(1, 0, wrong.data(), 20, false);  // speculative tokens 12..19 are wrong
  m->Run(b);
  const int used_after_wrong = m->kv->num_used_blocks();
  b.Clear();
  b.Add(1, 12, a.data() + 12, 8, true);  // cut back to 12 and redo
  std::vector<float> redo = m->Run(b);
  EXPECT_EQ(m->kv->num_used_blocks(), used_after_wrong);

  ASSERT_TRUE(m->kv->AddSequence(2).ok());
  b.Clear();
  b.Add(2, 0, a.data(), 20, true);
  std::vector<float> fresh = m->Run(b);
  for (size_t i = 0; i < redo.size(); ++i) ASSERT_EQ(redo[i], fresh[12 * vocab + i]) << i;
  // Truncating to 12 tokens leaves exactly the blocks a 12-token sequence has.
  ASSERT_TRUE(m->kv->Truncate(1, 12).ok());
  EXPECT_EQ(m->kv->NumBlocksOf(1), m->kv->BlocksFor(12));
}

TEST(LlamaModelTest, BadBatchesAreInvalidArgumentNamingTheField) {
  const std::string path = TinyModelPath("bad_batches");
  auto m = Load(path, false, /*blocks=*/4);
  ASSERT_TRUE(m);
  const int vocab = m->model->vocab_size();
  std::vector<float> logits(4 * vocab);
  ASSERT_TRUE(m->kv->AddSequence(1).ok());
  ForwardBatch b;
  EXPECT_EQ(m->model->Forward(b, *m->kv, logits.data()).code(),
            absl::StatusCode::kInvalidArgument);
  int32_t bad = vocab;
  b.Add(1, 0, &bad, 1, true);
  absl::Status st = m->model->Forward(b, *m->kv, logits.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("batch.tokens[0]"), std::string::npos) << st;
  b.Clear();
  int32_t ok = 3;
  b.Add(1, 5, &ok, 1, true);  // start beyond the sequence's length
  st = m->model->Forward(b, *m->kv, logits.data());
  EXPECT_NE(st.message().find("start_pos"), std::string::npos) << st;
  b.Clear();
  b.Add(99, 0, &ok, 1, true);
  EXPECT_EQ(m->model->Forward(b, *m->kv, logits.data()).code(), absl::StatusCode::kNotFound);
  // 4 blocks of 16 = 64 tokens; 65 is RESOURCE_EXHAUSTED, not a crash.
  std::vector<int32_t> many = Tokens(65, vocab, 1);
  b.Clear();
  b.Add(1, 0, many.data(), 65, false);
  EXPECT_EQ(m->model->Forward(b, *m->kv, logits.data()).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(m->kv->num_used_blocks(), 0);
}

// A feature-conditioned draft (eagle.* tensors): its first layer reads fc([rms(embedding) ;
// rms(feature)]). The fast backend matches the reference twin, the features are really read,
// every row's final hidden state comes back on request, and a batch without the features (or
// a plain model given some) is INVALID_ARGUMENT naming the field.
TEST(LlamaModelTest, FeatureConditionedModelReadsItsFeatures) {
  testing::TinyModelSpec spec;
  spec.num_layers = 1;
  spec.feature_conditioned = true;
  const std::string path = TinyModelPath("feature_conditioned", spec);
  auto ref = Load(path, /*reference=*/true);
  auto fast = Load(path, /*reference=*/false);
  ASSERT_TRUE(ref && fast);
  ASSERT_TRUE(fast->model->feature_conditioned());
  const int vocab = fast->model->vocab_size();
  const int64_t D = fast->model->config().embedding_dim;
  const std::vector<int32_t> toks = Tokens(21, vocab, 4);
  std::vector<float> feats(toks.size() * D);
  for (size_t i = 0; i < feats.size(); ++i) feats[i] = std::sin(0.37f * i) * 3.0f;
  auto run = [&](Loaded& m, const std::vector<float>& f, std::vector<float>* hidden) {
    ForwardBatch b;
    EXPECT_TRUE(m.kv->AddSequence(1).ok() || m.kv->HasSequence(1));
    b.Add(1, 0, toks.data(), static_cast<int32_t>(toks.size()), /*all_logits=*/true);
    b.input_features = f;
    for (int32_t t = 0; t < static_cast<int32_t>(toks.size()); ++t) b.hidden_rows.push_back(t);
    hidden->assign(toks.size() * D, 0.0f);
    std::vector<float> logits(toks.size() * vocab);
    absl::Status st = m.model->Forward(b, *m.kv, logits.data(), hidden->data());
    EXPECT_TRUE(st.ok()) << st;
    return logits;
  };
  std::vector<float> h_ref, h_fast, h_other;
  const std::vector<float> a = run(*ref, feats, &h_ref), c = run(*fast, feats, &h_fast);
  double max_diff = 0, max_abs = 0, h_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(std::isfinite(c[i])) << i;
    max_diff = std::max(max_diff, std::fabs(double{a[i]} - c[i]));
    max_abs = std::max(max_abs, std::fabs(double{a[i]}));
  }
  for (size_t i = 0; i < h_ref.size(); ++i) {
    ASSERT_TRUE(std::isfinite(h_fast[i])) << i;
    h_diff = std::max(h_diff, std::fabs(double{h_ref[i]} - h_fast[i]));
  }
  EXPECT_LT(max_diff, 1e-2 * std::max(1.0, max_abs));
  EXPECT_LT(h_diff, 1e-2);
  // Other features, other logits: the input is read, not ignored.
  std::vector<float> other = feats;
  for (float& x : other) x = -x;
  const std::vector<float> o = run(*fast, other, &h_other);
  EXPECT_GT(std::fabs(o[0] - c[0]) + std::fabs(o[vocab + 1] - c[vocab + 1]), 1e-3);

  std::vector<float> logits(toks.size() * vocab), hidden(toks.size() * D);
  ForwardBatch b;
  b.Add(1, 0, toks.data(), static_cast<int32_t>(toks.size()), /*all_logits=*/true);
  absl::Status st = fast->model->Forward(b, *fast->kv, logits.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("batch.input_features"), std::string::npos) << st;
  b.input_features = feats;
  b.hidden_rows = {static_cast<int32_t>(toks.size())};
  st = fast->model->Forward(b, *fast->kv, logits.data(), hidden.data());
  EXPECT_NE(st.message().find("batch.hidden_rows[0]"), std::string::npos) << st;
  b.hidden_rows = {0};
  st = fast->model->Forward(b, *fast->kv, logits.data(), nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  // A plain model given features.
  auto plain = Load(TinyModelPath("not_feature_conditioned"), /*reference=*/false);
  ASSERT_TRUE(plain && plain->kv->AddSequence(1).ok());
  b.hidden_rows.clear();
  st = plain->model->Forward(b, *plain->kv, logits.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("not feature-conditioned"), std::string::npos) << st;
}

// Converted Llama 3.1+ files carry their RoPE scaling as the tensor rope_freqs.weight (per-pair
// frequency divisors) instead of metadata. A model whose divisors are the Llama-3 formula,
// computed here independently, gives the logits of the same model with the metadata form.
TEST(LlamaModelTest, RopeFreqsTensorMatchesLlama3MetadataScaling) {
  testing::TinyModelSpec base;
  base.weight_type = gguf::GgmlType::kF32;  // float activations: no int8 rounding flips
  base.embedding_type = gguf::GgmlType::kF32;
  const int32_t head_dim = base.embedding_dim / base.num_heads;  // 16: 8 pairs
  testing::TinyModelSpec meta = base;
  meta.llama3_rope_scaling = true;
  meta.rope_original_context = 32;  // wavelengths 6.3 .. 19869: pairs unchanged, blended, divided
  testing::TinyModelSpec tensor = base;
  for (int i = 0; i < head_dim / 2; ++i) {
    const double f = std::pow(double{base.rope_base}, -2.0 * i / head_dim);
    const double wavelen = 2 * M_PI / f;
    const double low = 32 / 1.0, high = 32 / 4.0;  // original_context / low|high_freq_factor
    double scaled = f;
    if (wavelen > low) {
      scaled = f / 8;
    } else if (wavelen >= high) {
      const double smooth = (32 / wavelen - 1.0) / (4.0 - 1.0);
      scaled = (1 - smooth) * f / 8 + smooth * f;
    }
    tensor.rope_freq_factors.push_back(static_cast<float>(f / scaled));
  }
  ASSERT_EQ(tensor.rope_freq_factors.front(), 1.0f);   // a high frequency: kept
  ASSERT_EQ(tensor.rope_freq_factors.back(), 8.0f);    // a low one: divided by the factor
  auto run = [&](const std::string& name, const testing::TinyModelSpec& spec) {
    auto l = Load(TinyModelPath(name, spec), /*reference=*/false);
    EXPECT_TRUE(l);
    if (!l) return std::vector<float>{};
    const std::vector<int32_t> toks = Tokens(200, l->model->vocab_size(), 3);
    EXPECT_TRUE(l->kv->AddSequence(1).ok());
    ForwardBatch b;
    b.Add(1, 0, toks.data(), static_cast<int32_t>(toks.size()), /*all_logits=*/true);
    return l->Run(b);
  };
  const std::vector<float> a = run("rope_meta", meta), b = run("rope_tensor", tensor),
                           plain = run("rope_none", base);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), plain.size());
  double max_diff = 0, max_plain_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(double{a[i]} - b[i]));
    max_plain_diff = std::max(max_plain_diff, std::fabs(double{a[i]} - plain[i]));
  }
  EXPECT_LT(max_diff, 1e-3);       // float32 divisors vs the double formula
  EXPECT_GT(max_plain_diff, 0.1);  // the scaling really changes the model

  // A divisor tensor of the wrong size is a load error naming it.
  testing::TinyModelSpec bad = base;
  bad.rope_freq_factors = {1.0f, 2.0f, 3.0f};
  auto f = gguf::GgufFile::Open(TinyModelPath("rope_bad", bad));
  ASSERT_TRUE(f.ok());
  LocalCommunicator comm;
  auto be = MakeReferenceBackend();
  auto m = LlamaModel::Load(**f, be.get(), &comm, {});
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("rope_freqs.weight"), std::string::npos) << m.status();
}

// Tensor parallelism through the Communicator hook: N ranks (threads sharing a ThreadGroup)
// each load their slice of the heads and FFN columns with their own KV cache and run the same
// batch; the row-parallel outputs are all-reduced. Every rank ends with the same logits
// (bitwise), and they match one rank within float summation-order noise.
std::vector<std::vector<float>> RunTensorParallel(const std::string& path, int world,
                                                  bool reference, absl::Status* load_status) {
  auto f = gguf::GgufFile::Open(path);
  EXPECT_TRUE(f.ok());
  ThreadGroup group(world);
  std::vector<std::vector<float>> logits(world);
  std::vector<absl::Status> status(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      std::unique_ptr<Communicator> comm = group.Rank(r);
      auto backend = reference ? MakeReferenceBackend() : MakeCpuBackend(1);
      ModelOptions opt;
      opt.max_batch_tokens = 64;
      opt.max_logit_rows = 64;
      auto m = LlamaModel::Load(**f, backend.get(), comm.get(), opt);
      status[r] = m.status();
      if (!m.ok()) return;
      auto kv = PagedKvCache::Create((*m)->MakeKvCacheConfig(64, 16, kernels::KvDtype::kF16));
      EXPECT_TRUE(kv.ok());
      // Two sequences, ragged: a prompt chunk and a continuation — rank 0 builds the batch
      // and broadcasts it, as the target service's rank 0 drives the others.
      const int vocab = (*m)->vocab_size();
      std::vector<int32_t> toks(40);
      if (r == 0) toks = Tokens(40, vocab, 7);
      EXPECT_TRUE(comm->Broadcast(toks.data(), toks.size() * sizeof(int32_t), 0).ok());
      EXPECT_TRUE((*kv)->AddSequence(1).ok());
      EXPECT_TRUE((*kv)->AddSequence(2).ok());
      ForwardBatch b;
      b.Add(1, 0, toks.data(), 23, /*all_logits=*/true);
      b.Add(2, 0, toks.data() + 23, 17, /*all_logits=*/true);
      logits[r].resize(b.logit_rows.size() * vocab);
      EXPECT_TRUE((*m)->Forward(b, **kv, logits[r].data()).ok());
      b.Clear();
      b.Add(1, 23, toks.data() + 23, 5, /*all_logits=*/true);  // decode rows on top of the KV
      std::vector<float> more(b.logit_rows.size() * vocab);
      EXPECT_TRUE((*m)->Forward(b, **kv, more.data()).ok());
      logits[r].insert(logits[r].end(), more.begin(), more.end());
    });
  }
  for (auto& t : ranks) t.join();
  *load_status = status[0];
  return logits;
}

TEST(LlamaModelTest, TensorParallelRanksMatchOneRank) {
  for (const std::string arch : {"llama", "qwen2"}) {
    for (bool reference : {true, false}) {
      testing::TinyModelSpec spec;
      spec.architecture = arch;
      spec.tied_output = arch == "llama";
      spec.weight_type = gguf::GgmlType::kQ8_0;  // quant blocks of 32 = one rank's slice of K
      const std::string path = TinyModelPath("tp_" + arch, spec);
      absl::Status st;
      const auto one = RunTensorParallel(path, 1, reference, &st);
      ASSERT_TRUE(st.ok()) << st;
      const auto two = RunTensorParallel(path, 2, reference, &st);
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_EQ(two[0].size(), one[0].size());
      EXPECT_EQ(two[0], two[1]) << arch << ": ranks disagree";
      double max_diff = 0, max_abs = 0;
      for (size_t i = 0; i < one[0].size(); ++i) {
        ASSERT_TRUE(std::isfinite(two[0][i]));
        max_diff = std::max(max_diff, std::fabs(double{one[0][i]} - two[0][i]));
        max_abs = std::max(max_abs, std::fabs(double{one[0][i]}));
      }
      // Same integer block products; the partial sums of wo and w_down are added in another
      // order (reference: ~1e-6 relative), and in the fast backend that can flip an int8
      // rounding of the next layer's input (measured 0.14 of 72).
      EXPECT_LT(max_diff, (reference ? 1e-4 : 2e-2) * std::max(1.0, max_abs))
          << arch << (reference ? " reference" : " cpu") << " max|logit| " << max_abs;
    }
  }
  // Heads that do not split evenly: a clear load error on every rank.
  absl::Status st;
  RunTensorParallel(TinyModelPath("tp_llama"), 4, /*reference=*/false, &st);  // 2 kv heads
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("4 ranks"), std::string::npos) << st;
}

// A distilled draft's truncated head: row i of output.weight scores token output_token_ids[i];
// the logits row is still over the whole vocabulary, -inf outside the head, and the head's
// entries equal the full model's logits for those tokens bitwise (same rows, same products).
TEST(LlamaModelTest, TruncatedHeadScoresOnlyItsTokens) {
  testing::TinyModelSpec full;
  full.tied_output = false;
  full.seed = 21;
  const std::string full_path = TempPath("head_full.gguf");
  ASSERT_TRUE(testing::WriteTinyModel(full, full_path).ok());
  testing::TinyModelSpec cut = full;
  for (int32_t id = 0; id < 300; id += 3) cut.head_token_ids.push_back(id);
  const std::string cut_path = TempPath("head_cut.gguf");
  ASSERT_TRUE(testing::WriteTinyModel(cut, cut_path).ok());
  for (bool reference : {true, false}) {
    auto a = Load(full_path, reference);
    auto b = Load(cut_path, reference);
    ASSERT_TRUE(a && b);
    for (auto* l : {a.get(), b.get()}) ASSERT_TRUE(l->kv->AddSequence(0).ok());
    const std::vector<int32_t> toks = {1, 40, 41, 42, 43, 7};
    ForwardBatch fb;
    fb.Add(0, 0, toks.data(), static_cast<int32_t>(toks.size()), /*all_logits=*/true);
    const std::vector<float> la = a->Run(fb), lb = b->Run(fb);
    const int64_t V = a->model->vocab_size();
    ASSERT_EQ(V, b->model->vocab_size());
    EXPECT_LT(b->model->weight_bytes(), a->model->weight_bytes());  // a third of the head
    int64_t scored = 0;
    for (size_t r = 0; r < toks.size(); ++r) {
      for (int64_t t = 0; t < V; ++t) {
        const float x = lb[r * V + t];
        if (t % 3 == 0 && t < 300) {
          ASSERT_EQ(x, la[r * V + t]) << "row " << r << " token " << t;
          ++scored;
        } else {
          ASSERT_TRUE(std::isinf(x) && x < 0) << "row " << r << " token " << t << " = " << x;
        }
      }
    }
    EXPECT_EQ(scored, static_cast<int64_t>(toks.size()) * 100);
  }
  // Ids must be strictly increasing: the error names the tensor.
  testing::TinyModelSpec bad = full;
  bad.head_token_ids = {5, 9, 9};
  const std::string bad_path = TempPath("head_bad.gguf");
  ASSERT_TRUE(testing::WriteTinyModel(bad, bad_path).ok());
  auto f = gguf::GgufFile::Open(bad_path);
  ASSERT_TRUE(f.ok());
  LocalCommunicator comm;
  auto be = MakeReferenceBackend();
  auto m = LlamaModel::Load(**f, be.get(), &comm, {});
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("output_token_ids[2]"), std::string::npos) << m.status();
}

// A draft that carries no token_embd.weight borrows the target's: without the target it is a
// clear NOT_FOUND; with it the model equals the self-contained one bitwise.
TEST(LlamaModelTest, BorrowedEmbeddingsComeFromTheTarget) {
  testing::TinyModelSpec own;
  own.seed = 23;
  const std::string own_path = TempPath("borrow_own.gguf");
  ASSERT_TRUE(testing::WriteTinyModel(own, own_path).ok());
  testing::TinyModelSpec lean = own;
  lean.omit_token_embd = true;
  const std::string lean_path = TempPath("borrow_lean.gguf");
  ASSERT_TRUE(testing::WriteTinyModel(lean, lean_path).ok());
  auto own_file = gguf::GgufFile::Open(own_path);
  auto lean_file = gguf::GgufFile::Open(lean_path);
  ASSERT_TRUE(own_file.ok() && lean_file.ok());
  EXPECT_EQ((*lean_file)->FindTensor("token_embd.weight"), nullptr);
  LocalCommunicator comm;
  auto be = MakeCpuBackend(1);
  auto alone = LlamaModel::Load(**lean_file, be.get(), &comm, {});
  EXPECT_EQ(alone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(alone.status().message().find("token_embd.weight"), std::string::npos)
      << alone.status();
  ModelOptions with;
  with.borrow_from = own_file->get();
  auto borrowed = LlamaModel::Load(**lean_file, be.get(), &comm, with);
  ASSERT_TRUE(borrowed.ok()) << borrowed.status();
  auto self = LlamaModel::Load(**own_file, be.get(), &comm, {});
  ASSERT_TRUE(self.ok());
  std::vector<std::vector<float>> out;
  for (LlamaModel* m : {borrowed->get(), self->get()}) {
    auto kv = PagedKvCache::Create(m->MakeKvCacheConfig(8, 16, kernels::KvDtype::kF16));
    ASSERT_TRUE(kv.ok() && (*kv)->AddSequence(0).ok());
    const std::vector<int32_t> toks = {1, 70, 71, 72};
    ForwardBatch fb;
    fb.Add(0, 0, toks.data(), 4, /*all_logits=*/true);
    out.emplace_back(4 * m->vocab_size());
    ASSERT_TRUE(m->Forward(fb, **kv, out.back().data()).ok());
  }
  EXPECT_EQ(out[0], out[1]);
}

TEST(LlamaModelTest, MissingTensorAndUnknownArchitectureAreClearErrors) {
  // Unknown architecture.
  {
    gguf::GgufWriter w;
    w.Set("general.architecture", gguf::Value::Str("mamba"));
    const std::string path = TempPath("mamba.gguf");
    ASSERT_TRUE(w.WriteFile(path).ok());
    auto f = gguf::GgufFile::Open(path);
    ASSERT_TRUE(f.ok());
    LocalCommunicator comm;
    auto be = MakeReferenceBackend();
    auto m = LlamaModel::Load(**f, be.get(), &comm, {});
    EXPECT_EQ(m.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_NE(m.status().message().find("mamba"), std::string::npos) << m.status();
  }
  // A tiny model with one tensor renamed away.
  {
    const std::string good = TinyModelPath("missing_src");
    auto f = gguf::GgufFile::Open(good);
    ASSERT_TRUE(f.ok());
    gguf::GgufWriter w;
    for (const auto& [k, v] : (*f)->metadata()) w.Set(k, v);
    for (const gguf::TensorInfo& t : (*f)->tensors()) {
      if (t.name == "blk.1.ffn_up.weight") continue;
      ASSERT_TRUE(w.AddTensor(t.name, t.type, t.dims,
                              std::vector<uint8_t>(t.data, t.data + t.num_bytes))
                      .ok());
    }
    const std::string path = TempPath("missing.gguf");
    ASSERT_TRUE(w.WriteFile(path).ok());
    auto f2 = gguf::GgufFile::Open(path);
    ASSERT_TRUE(f2.ok());
    LocalCommunicator comm;
    auto be = MakeReferenceBackend();
    auto m = LlamaModel::Load(**f2, be.get(), &comm, {});
    EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
    EXPECT_NE(m.status().message().find("blk.1.ffn_up.weight"), std::string::npos)
        << m.status();
  }
}

// ---- the real model against the independent reference ----

constexpr char kModel[] = "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr char kGoldens[] = "/tests/data/model/smollm2_goldens.json";

// Exact-activation mode vs the float64 reference (same f16 KV rounding): we accumulate in
// float32 in a different order, so logits differ in the last few bits, amplified a little by
// 30 layers (an f16 KV rounding flip moves later logits by ~1e-2). The test prints the
// observed maximum (0.016 on AVX2).
constexpr double kExactTolerance = 0.03;
// Default int8-activation mode: rounding an activation to the neighbouring int8 step flips
// with the last float bit, and 30 layers amplify these flips, so any change of float
// summation order moves the largest difference. Measured maxima: 1.96 for the generic
// backend (the reference arithmetic, SPECD_KERNELS_ISA=generic), 1.59 for AVX2. So logits
// are held to a loose bound, and top-1 must agree wherever the reference's top-2 margin
// exceeds kInt8Top1Margin.
constexpr double kInt8Tolerance = 2.5;
constexpr double kInt8Top1Margin = 3.0;

bool HaveRealModel() { return std::ifstream(SourceDir() + kModel).good(); }

// The backend the real model runs on in these tests: SPECD_MODEL_TEST_DEVICE (default cpu;
// the ctest entry llama_model_test_cuda, label gpu, sets cuda).
std::string TestDevice() {
  const char* d = std::getenv("SPECD_MODEL_TEST_DEVICE");
  return d != nullptr && *d != 0 ? d : "cpu";
}
// Why the test device cannot run here, or empty.
std::string DeviceMissing() {
  if (TestDevice() == "cpu") return "";
  absl::StatusOr<std::unique_ptr<Backend>> be = MakeBackend(TestDevice(), 1);
  return be.ok() ? "" : std::string(be.status().message());
}

std::unique_ptr<Loaded> LoadReal(bool exact, int32_t kv_blocks = 64,
                                 kernels::KvDtype kv_dtype = kernels::KvDtype::kF16) {
  auto l = std::make_unique<Loaded>();
  auto f = gguf::GgufFile::Open(SourceDir() + kModel);
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return nullptr;
  l->file = std::move(*f);
  absl::StatusOr<std::unique_ptr<Backend>> be = MakeBackend(TestDevice(), 2);
  EXPECT_TRUE(be.ok()) << be.status();
  if (!be.ok()) return nullptr;
  l->backend = std::move(*be);
  ModelOptions opt;
  opt.max_batch_tokens = 256;
  opt.max_logit_rows = 256;
  opt.exact_activations = exact;
  auto m = LlamaModel::Load(*l->file, l->backend.get(), &l->comm, opt);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  l->model = std::move(*m);
  auto kv = PagedKvCache::Create(l->model->MakeKvCacheConfig(kv_blocks, 16, kv_dtype));
  EXPECT_TRUE(kv.ok()) << kv.status();
  l->kv = std::move(*kv);
  return l;
}

int Argmax(const float* row, int vocab) {
  int best = 0;
  for (int v = 1; v < vocab; ++v) best = row[v] > row[best] ? v : best;
  return best;
}

double Margin(const nlohmann::json& top_row) {
  return top_row[0][1].get<double>() - top_row[1][1].get<double>();
}

// Runs prompt + golden continuation in one prefill and checks logits and top-1 at every
// position; returns the largest difference seen.
double CheckTeacherForced(Loaded& m, const nlohmann::json& c, int64_t id, double tol,
                          double top1_margin, int* checked_top1) {
  const int vocab = m.model->vocab_size();
  std::vector<int32_t> all = c["prompt_ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> greedy = c["greedy"].get<std::vector<int32_t>>();
  all.insert(all.end(), greedy.begin(), greedy.end() - 1);
  EXPECT_TRUE(m.kv->AddSequence(id).ok());
  ForwardBatch b;
  b.Add(id, 0, all.data(), static_cast<int32_t>(all.size()), true);
  std::vector<float> logits = m.Run(b);
  const auto& top = c["top"];
  EXPECT_EQ(top.size(), all.size());
  double worst = 0;
  for (size_t p = 0; p < all.size() && p < top.size(); ++p) {
    const float* row = logits.data() + p * vocab;
    for (const auto& e : top[p]) {
      const double diff = std::fabs(row[e[0].get<int>()] - e[1].get<double>());
      worst = std::max(worst, diff);
      EXPECT_LT(diff, tol) << "case " << id << " pos " << p << " token " << e[0];
    }
    if (Margin(top[p]) > top1_margin) {
      EXPECT_EQ(Argmax(row, vocab), top[p][0][0].get<int>()) << "case " << id << " pos " << p;
      ++*checked_top1;
    }
  }
  m.kv->FreeSequence(id);
  return worst;
}

TEST(LlamaModelGoldenTest, SmolLM2ExactActivationsMatchIndependentReference) {
  if (!HaveRealModel()) {
    GTEST_SKIP() << "NOT RUN: " << SourceDir() << kModel
                 << " is missing (scripts/fetch_model.sh fetches it)";
  }
  std::ifstream in(SourceDir() + kGoldens);
  ASSERT_TRUE(in.good()) << "missing " << kGoldens;
  const nlohmann::json g = nlohmann::json::parse(in);
  auto m = LoadReal(/*exact=*/true);
  ASSERT_TRUE(m);
  const int vocab = m->model->vocab_size();
  double worst = 0;
  int checked_top1 = 0, cases = 0, compared_tokens = 0;
  for (const auto& c : g["cases"]) {
    worst = std::max(worst, CheckTeacherForced(*m, c, ++cases, kExactTolerance,
                                                  2 * kExactTolerance, &checked_top1));
  }

  // Greedy decoding, one token per step (all cases batched together — logits are batch
  // invariant), reproduces each reference continuation token for token up to the first step
  // where the reference itself is undecided (top-2 margin below the tolerance): past a
  // near-tie either continuation is the model's.
  struct Live {
    int64_t id;
    const nlohmann::json* c;
    std::vector<int32_t> prompt, greedy;
    int32_t next = -1;
    size_t i = 0;  // tokens of the continuation produced so far
  };
  std::vector<Live> live;
  ForwardBatch b;
  for (const auto& c : g["cases"]) {
    Live l{static_cast<int64_t>(live.size() + 100), &c,
           c["prompt_ids"].get<std::vector<int32_t>>(), c["greedy"].get<std::vector<int32_t>>()};
    ASSERT_TRUE(m->kv->AddSequence(l.id).ok());
    if (Margin(c["top"][l.prompt.size() - 1]) < kExactTolerance) continue;
    b.Add(l.id, 0, l.prompt.data(), static_cast<int32_t>(l.prompt.size()), false);
    live.push_back(std::move(l));
  }
  while (!b.slices.empty()) {
    std::vector<float> rows = m->Run(b);
    std::vector<Live*> stepped;
    for (size_t r = 0; r < b.slices.size(); ++r) {
      for (Live& l : live) {
        if (l.id == b.slices[r].seq) stepped.push_back(&l);
      }
    }
    b.Clear();
    for (size_t r = 0; r < stepped.size(); ++r) {
      Live& l = *stepped[r];
      l.next = Argmax(rows.data() + r * vocab, vocab);
      ASSERT_EQ(l.next, l.greedy[l.i]) << (*l.c)["prompt"] << " token " << l.i;
      ++compared_tokens;
      ++l.i;
      const size_t top_row = l.prompt.size() - 1 + l.i;
      if (l.i < l.greedy.size() && Margin((*l.c)["top"][top_row]) >= kExactTolerance) {
        b.Add(l.id, static_cast<int32_t>(top_row), &l.next, 1, false);
      }
    }
  }
  EXPECT_GE(cases, 8);
  // Near-ties are rare: most of every continuation must be compared.
  EXPECT_GE(compared_tokens, cases * 64 * 6 / 10) << "too many near-ties for a real comparison";
  std::printf("exact mode: %d cases, max |logit diff| %.5f (tolerance %.3f), top-1 checked at %d "
              "positions, %d greedy tokens compared token for token\n",
              cases, worst, kExactTolerance, checked_top1, compared_tokens);
}

TEST(LlamaModelGoldenTest, SmolLM2Int8ActivationsStayCloseToReference) {
  if (!HaveRealModel()) {
    GTEST_SKIP() << "NOT RUN: " << SourceDir() << kModel
                 << " is missing (scripts/fetch_model.sh fetches it)";
  }
  if (const std::string why = DeviceMissing(); !why.empty()) GTEST_SKIP() << "NOT RUN: " << why;
  std::ifstream in(SourceDir() + kGoldens);
  ASSERT_TRUE(in.good());
  const nlohmann::json g = nlohmann::json::parse(in);
  auto m = LoadReal(/*exact=*/false);
  ASSERT_TRUE(m);
  double worst = 0;
  int checked_top1 = 0, cases = 0;
  for (const auto& c : g["cases"]) {
    worst = std::max(worst, CheckTeacherForced(*m, c, ++cases, kInt8Tolerance, kInt8Top1Margin,
                                                  &checked_top1));
  }
  std::printf("int8 mode on %s: %d cases, max |logit diff| %.4f (tolerance %.2f), top-1 checked "
              "at %d positions\n", TestDevice().c_str(), cases, worst, kInt8Tolerance, checked_top1);
}

// Long context (issue 18): one 2,100-token chat prompt, prefilled in chunks of 256 as the
// engine serves it, against the float64 reference's top-2 (id, logit) at every position
// (scripts/gen_model_goldens.py --long). Exact activations: both logits within
// kLongExactTolerance and top-1 equal wherever the reference's margin exceeds twice it.
// Default int8 activations: top-1 equal wherever the margin exceeds kInt8Top1Margin. The
// attention kernels' long-context paths (64-query tiles, chunk folds over ~33 key chunks)
// are what this adds over the short goldens.
constexpr char kLongGolden[] = "/tests/data/model/smollm2_long_golden.json";
// Measured 2026-12-02: max |logit diff| 0.0288 over 2,100 positions (AVX-512 VNNI); f16 KV
// rounding flips accumulate with depth, so looser than kExactTolerance.
constexpr double kLongExactTolerance = 0.06;

struct LongCheck {
  double worst = 0;
  int checked_top1 = 0, agreed_top1 = 0;
};

LongCheck CheckLongPrompt(Loaded& m, const nlohmann::json& g, bool exact,
                          double tol = kLongExactTolerance) {
  const int vocab = m.model->vocab_size();
  const std::vector<int32_t> ids = g["prompt_ids"].get<std::vector<int32_t>>();
  const auto& top = g["top"];
  EXPECT_EQ(top.size(), ids.size());
  LongCheck r;
  constexpr SeqId kSeq = 77;
  EXPECT_TRUE(m.kv->AddSequence(kSeq).ok());
  const int32_t chunk = 256;
  for (int32_t done = 0; done < static_cast<int32_t>(ids.size()); done += chunk) {
    const int32_t n = std::min<int32_t>(chunk, static_cast<int32_t>(ids.size()) - done);
    ForwardBatch b;
    b.Add(kSeq, done, ids.data() + done, n, true);
    const std::vector<float> logits = m.Run(b);
    for (int32_t i = 0; i < n; ++i) {
      const float* row = logits.data() + static_cast<int64_t>(i) * vocab;
      const auto& t = top[done + i];
      if (exact) {
        for (const auto& e : t) {
          const double diff = std::fabs(row[e[0].get<int>()] - e[1].get<double>());
          r.worst = std::max(r.worst, diff);
          EXPECT_LT(diff, tol) << "pos " << done + i << " token " << e[0];
        }
      }
      if (Margin(t) > (exact ? 2 * tol : kInt8Top1Margin)) {
        ++r.checked_top1;
        const bool agree = Argmax(row, vocab) == t[0][0].get<int>();
        r.agreed_top1 += agree;
        EXPECT_TRUE(agree) << "pos " << done + i;
      }
    }
  }
  m.kv->FreeSequence(kSeq);
  return r;
}

TEST(LlamaModelGoldenTest, SmolLM2LongPromptMatchesIndependentReference) {
  if (!HaveRealModel()) {
    GTEST_SKIP() << "NOT RUN: " << SourceDir() << kModel
                 << " is missing (scripts/fetch_model.sh fetches it)";
  }
  std::ifstream in(SourceDir() + kLongGolden);
  ASSERT_TRUE(in.good()) << "missing " << kLongGolden;
  const nlohmann::json g = nlohmann::json::parse(in);
  ASSERT_GE(g["prompt_ids"].size(), 2000u);
  const int32_t blocks = static_cast<int32_t>(g["prompt_ids"].size() / 16 + 2);
  for (bool exact : {true, false}) {
    auto m = LoadReal(exact, blocks);
    ASSERT_TRUE(m);
    const LongCheck r = CheckLongPrompt(*m, g, exact);
    // Most positions of a real text are decisive: a test that checks few checks nothing.
    EXPECT_GE(r.checked_top1, exact ? 1500 : 150);  // measured: 1896 and 188
    std::printf("long prompt, %s: %zu positions, max |logit diff| %s, top-1 agreed at %d of %d "
                "decisive positions\n", exact ? "exact" : "int8", g["prompt_ids"].size(),
                exact ? std::to_string(r.worst).c_str() : "not checked (int8 rounding flips)",
                r.agreed_top1, r.checked_top1);
  }
}

// The int8 KV cache (KvDtype::kInt8, off by default) against the same goldens. With exact
// activations only attention differs from the f16 runs above: the KV rounding, and attention
// on the codes (kernels/kv_int8.h: q quantized per row to int8, p times V's scale as 8-bit
// codes of each chunk row's largest). Every logit of the short goldens within
// kInt8KvTolerance and top-1 equal wherever the reference's margin exceeds kInt8KvTop1Margin;
// on the 2,100-token prompt every logit within kInt8KvLongTolerance (and top-1 past twice
// that). Measured 2026-12-06 (AVX-512 VNNI): max |logit diff| 1.47 (short), 0.80 (long), top-1
// agreed everywhere past a margin of 1.0. (With p V's weights rounded to bf16: 1.69 and 0.69;
// with the codes converted to f32 and q kept: 1.17 short.)
// With the default int8 activations on top, top-1 holds the int8 mode's margin
// (kInt8Top1Margin) and every logit kInt8KvInt8ActTolerance: the two roundings' moves add up,
// the int8-activation mode alone moving logits by up to 1.96 and the int8 KV by up to 1.47.
// Measured 2.65 (1.83 with bf16 weights; 2.66 with int16 weights, a variant not kept).
constexpr double kInt8KvTolerance = 2.0;
constexpr double kInt8KvLongTolerance = 1.5;
constexpr double kInt8KvTop1Margin = 1.0;
constexpr double kInt8KvInt8ActTolerance = 3.0;

// A KV storage type against the short and long goldens: with exact activations every logit
// within exact_tol and top-1 equal past exact_margin (on the long prompt within long_tol, and
// CheckLongPrompt's top-1 rule); with the default int8 activations the int8 mode's top-1 rule
// and every logit within int8_act_tol (the int8 mode's own bound unless the dtype adds to it).
void CheckKvDtypeAgainstGoldens(kernels::KvDtype dtype, double exact_tol, double exact_margin,
                                double long_tol, const char* label,
                                double int8_act_tol = kInt8Tolerance) {
  std::ifstream in(SourceDir() + kGoldens), in_long(SourceDir() + kLongGolden);
  ASSERT_TRUE(in.good() && in_long.good());
  const nlohmann::json g = nlohmann::json::parse(in), g_long = nlohmann::json::parse(in_long);
  const int32_t blocks = static_cast<int32_t>(g_long["prompt_ids"].size() / 16 + 2);
  for (bool exact : {true, false}) {
    auto m = LoadReal(exact, blocks, dtype);
    ASSERT_TRUE(m);
    const double tol = exact ? exact_tol : int8_act_tol;
    double worst = 0;
    int checked_top1 = 0, cases = 0;
    for (const auto& c : g["cases"]) {
      worst = std::max(worst, CheckTeacherForced(*m, c, ++cases, tol,
                                                    exact ? exact_margin : kInt8Top1Margin,
                                                    &checked_top1));
    }
    const LongCheck r = CheckLongPrompt(*m, g_long, exact, exact ? long_tol : int8_act_tol);
    EXPECT_GE(r.checked_top1, 150);
    std::printf("%s, %s activations: %d cases, max |logit diff| %.4f (tolerance %.2f), "
                "top-1 checked at %d positions; long prompt: max |logit diff| %s, top-1 "
                "agreed at %d of %d\n",
                label, exact ? "exact" : "int8", cases, worst, tol, checked_top1,
                exact ? std::to_string(r.worst).c_str() : "not checked (int8 rounding flips)",
                r.agreed_top1, r.checked_top1);
  }
}

TEST(LlamaModelGoldenTest, SmolLM2Int8KvStaysCloseToReference) {
  if (!HaveRealModel()) {
    GTEST_SKIP() << "NOT RUN: " << SourceDir() << kModel
                 << " is missing (scripts/fetch_model.sh fetches it)";
  }
  CheckKvDtypeAgainstGoldens(kernels::KvDtype::kInt8, kInt8KvTolerance, kInt8KvTop1Margin, kInt8KvLongTolerance,
                             "int8 KV", kInt8KvInt8ActTolerance);
}

// bf16 attention (KvDtype::kBF16, off by default; kernels/attn_bf16.h): K and V stored as
// bf16, q and p rounded to bf16, dot products as vdpbf16ps sums them. Against the same
// goldens as the int8 KV cache, with the same rules: exact activations keep every logit within
// kBf16KvTolerance (short goldens and the 2,100-token prompt) and top-1 wherever the
// reference's margin exceeds kBf16KvTop1Margin; int8 activations keep the int8 mode's bounds.
// Measured 2026-12-03 (AMD EPYC Zen 4, native vdpbf16ps): exact max |logit diff| 0.28 (short),
// 0.38 (long), top-1 agreed at every decisive position; int8 activations: max 1.11.
constexpr double kBf16KvTolerance = 0.5;
constexpr double kBf16KvTop1Margin = 1.0;

TEST(LlamaModelGoldenTest, SmolLM2Bf16AttentionStaysCloseToReference) {
  if (!HaveRealModel()) {
    GTEST_SKIP() << "NOT RUN: " << SourceDir() << kModel
                 << " is missing (scripts/fetch_model.sh fetches it)";
  }
  CheckKvDtypeAgainstGoldens(kernels::KvDtype::kBF16, kBf16KvTolerance, kBf16KvTop1Margin, kBf16KvTolerance,
                             "bf16 attention");
}

}  // namespace
}  // namespace specd::engine
