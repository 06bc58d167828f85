// The device-resident forward, checked on the CPU: a model on testing::FencedBackend (memory
// the host cannot touch between backend calls, and every op pointer checked to be in it) must
// give bitwise the reference backend's logits and hidden rows, for prefill, chunked prefill,
// batched decode, verification rows with rollback, prefix-cache copy-on-write, every KV dtype,
// QKV biases, a truncated head, exact activations and a feature-conditioned draft that borrows
// its target's embeddings. A model that read an activation or a weight from host code would
// crash here; one that handed an op a host pointer would leave a violation. That is what a GPU
// backend, whose memory is not the host's, needs of the model. The fenced backend also
// records and replays steps as CUDA graphs do, so the model's bucketed steps are checked too.
#include <sys/mman.h>

#include <cmath>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/gguf/gguf_file.h"
#include "engine/backend.h"
#include "engine/backend_factory.h"
#include "engine/communicator.h"
#include "engine/llama_model.h"
#include "engine/paged_kv_cache.h"
#include "engine/thread_communicator.h"
#include "gtest/gtest.h"
#include "tests/unit/model_test_util.h"
#include "testing/fenced_backend.h"
#include "testing/tiny_model.h"

namespace specd::engine {
namespace {

using kernels::KvDtype;

std::string TinyModelPath(const std::string& name, const testing::TinyModelSpec& spec) {
  const std::string path = ::testing::TempDir() + "/device_resident_" + name + ".gguf";
  absl::Status st = testing::WriteTinyModel(spec, path);
  EXPECT_TRUE(st.ok()) << st;
  return path;
}

// One model on one backend with its KV cache.
struct Runner {
  std::unique_ptr<Backend> backend;
  testing::FencedBackend* fenced = nullptr;  // backend, when it is the fenced one
  LocalCommunicator comm;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<PagedKvCache> kv;

  // logits of the batch's rows, then its hidden rows.
  std::vector<float> Run(const ForwardBatch& b) {
    const int64_t V = model->vocab_size(), D = model->config().embedding_dim;
    std::vector<float> out(b.logit_rows.size() * V + b.hidden_rows.size() * D, 7.0f);
    absl::Status st = model->Forward(b, *kv, out.data(), out.data() + b.logit_rows.size() * V);
    EXPECT_TRUE(st.ok()) << backend->name() << ": " << st;
    return out;
  }
};

struct Case {
  std::string name;
  testing::TinyModelSpec spec;
  KvDtype dtype = KvDtype::kF16;
  bool exact = false;
  bool prefix_caching = false;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::unique_ptr<Runner> Load(const gguf::GgufFile& file, bool fenced, const Case& c,
                             const gguf::GgufFile* borrow = nullptr,
                             int32_t step_graph_max_tokens = 256) {
  auto r = std::make_unique<Runner>();
  if (fenced) {
    std::unique_ptr<testing::FencedBackend> f = testing::MakeFencedBackend();
    r->fenced = f.get();
    r->backend = std::move(f);
  } else {
    r->backend = MakeReferenceBackend();
  }
  ModelOptions o;
  o.max_batch_tokens = 64;
  o.max_logit_rows = 64;
  o.exact_activations = c.exact;
  o.borrow_from = borrow;
  o.step_graph_max_tokens = step_graph_max_tokens;
  auto m = LlamaModel::Load(file, r->backend.get(), &r->comm, o);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  r->model = std::move(*m);
  KvCacheConfig kc = r->model->MakeKvCacheConfig(24, 16, c.dtype);
  kc.prefix_caching = c.prefix_caching;
  auto kv = PagedKvCache::Create(kc);
  EXPECT_TRUE(kv.ok()) << kv.status();
  if (!kv.ok()) return nullptr;
  r->kv = std::move(*kv);
  return r;
}

// The same script of steps on both runners; every step's outputs bitwise equal.
void RunScript(Runner& fenced, Runner& host, const std::string& what) {
  const int vocab = host.model->vocab_size();
  const std::vector<int32_t> a = Tokens(37, vocab, 1), b = Tokens(5, vocab, 2);
  std::vector<ForwardBatch> steps;
  {  // seq 1: a chunk of 20 tokens, nothing returned
    ForwardBatch s;
    s.AddPrompt(1, 0, a.data(), 20);
    steps.push_back(s);
  }
  {  // seq 1's last 17 tokens (last logits) beside seq 2's whole prompt (all logits, hidden)
    ForwardBatch s;
    s.Add(1, 20, a.data() + 20, 17, /*all_logits=*/false);
    s.Add(2, 0, b.data(), 5, /*all_logits=*/true);
    s.hidden_rows = {0, 16, 19};
    steps.push_back(s);
  }
  {  // batched decode
    ForwardBatch s;
    const int32_t t1 = 3, t2 = 4;
    s.Add(1, 37, &t1, 1, false);
    s.Add(2, 5, &t2, 1, false);
    steps.push_back(s);
  }
  {  // a verification group [last, d1..d3] on seq 1
    ForwardBatch s;
    const std::vector<int32_t> last = {9}, drafts = {10, 11, 12};
    s.AddVerify(1, 38, last, drafts);
    s.hidden_rows = {1};
    steps.push_back(s);
  }
  {  // rejected at d1: seq 1 restarts at 39 with a correction, seq 2 decodes
    ForwardBatch s;
    const std::vector<int32_t> last = {13}, drafts = {14};
    s.AddVerify(1, 39, last, drafts);
    const int32_t t2 = 5;
    s.Add(2, 6, &t2, 1, false);
    steps.push_back(s);
  }
  for (auto* r : {&fenced, &host}) {
    ASSERT_TRUE(r->kv->AddSequence(1).ok());
    ASSERT_TRUE(r->kv->AddSequence(2).ok());
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::vector<float> f = fenced.Run(steps[i]), h = host.Run(steps[i]);
    ASSERT_EQ(f.size(), h.size());
    for (size_t j = 0; j < f.size(); ++j) {
      ASSERT_TRUE(std::isfinite(h[j]) || std::isinf(h[j])) << what << " step " << i;
      ASSERT_EQ(f[j], h[j]) << what << ": step " << i << " value " << j;
    }
  }
  EXPECT_EQ(fenced.fenced->violations(), std::vector<std::string>{}) << what;
}

// The case's model on the fenced backend, recording steps of up to 8 tokens, and on the host
// backend, from one file that outlives both (null runners when loading failed).
struct RecordingPair {
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<Runner> fenced, host;
};

RecordingPair LoadRecordingPair(const Case& c) {
  RecordingPair p;
  auto file = gguf::GgufFile::Open(TinyModelPath(c.name, c.spec));
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return p;
  p.file = std::move(*file);
  p.fenced = Load(*p.file, true, c, nullptr, /*step_graph_max_tokens=*/8);
  p.host = Load(*p.file, false, c);
  return p;
}

class DeviceResidentTest : public ::testing::TestWithParam<Case> {};

TEST_P(DeviceResidentTest, ForwardInMemoryTheHostCannotTouchEqualsTheHostBackend) {
  const Case& c = GetParam();
  const std::string path = TinyModelPath(c.name, c.spec);
  auto file = gguf::GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto fenced = Load(**file, true, c), host = Load(**file, false, c);
  ASSERT_TRUE(fenced && host);
  RunScript(*fenced, *host, c.name);
  EXPECT_GT(fenced->fenced->used(), 0u);
}

// Steps as recordings, the discipline CUDA graphs need, on the fenced backend (which records
// a shape's second step and replays its ops with the arguments they were recorded with from
// then on): decode and verification steps of 3 to 7 real tokens, padded to buckets of 4 and 8,
// at contexts that grow across KV blocks, against the reference backend running each step as
// it is. Every output must be bitwise the same: a recorded op handed a size or a pointer that
// a later step changes (the batch's own token count, a caller's buffer) would replay stale
// work. Prompts longer than step_graph_max_tokens run op by op.
TEST_P(DeviceResidentTest, RecordedStepsReplayBitwiseTheHostBackend) {
  const Case& c = GetParam();
  RecordingPair pair = LoadRecordingPair(c);
  ASSERT_TRUE(pair.fenced && pair.host);
  std::unique_ptr<Runner>& fenced = pair.fenced;
  std::unique_ptr<Runner>& host = pair.host;
  const int vocab = host->model->vocab_size();
  std::vector<int32_t> next_pos(3);
  for (Runner* r : {fenced.get(), host.get()}) {
    for (int32_t seq = 0; seq < 3; ++seq) {
      ASSERT_TRUE(r->kv->AddSequence(seq).ok());
      const std::vector<int32_t> prompt = Tokens(9 + 7 * seq, vocab, 40 + seq);
      ForwardBatch p;
      p.Add(seq, 0, prompt.data(), static_cast<int32_t>(prompt.size()), false);
      const std::vector<float> f = r->Run(p);
      next_pos[seq] = static_cast<int32_t>(prompt.size());
    }
  }
  const engine::StepGraphStats before = fenced->backend->step_graph_stats();
  EXPECT_EQ(before.captures, 0) << "prompts of 9 to 23 tokens run op by op";
  for (int round = 0; round < 14; ++round) {
    ForwardBatch s;
    const int32_t verifier = round % 3, k = 1 + round % 4;
    std::vector<int32_t> drafts(static_cast<size_t>(k));
    for (int32_t i = 0; i < k; ++i) drafts[i] = (round * 7 + i * 13) % vocab;
    const std::vector<int32_t> last = {(round * 11) % vocab};
    s.AddVerify(verifier, next_pos[verifier], last, drafts);
    for (int32_t seq = 0; seq < 3; ++seq) {
      if (seq == verifier) continue;
      const int32_t tok = (round + seq * 5) % vocab;
      s.Add(seq, next_pos[seq], &tok, 1, false);
    }
    if (round % 2 == 1) s.hidden_rows = {0, 1};
    const std::vector<float> f = fenced->Run(s), h = host->Run(s);
    ASSERT_EQ(f.size(), h.size());
    for (size_t j = 0; j < f.size(); ++j) ASSERT_EQ(f[j], h[j]) << c.name << ": round " << round << " value " << j;
    // The verifier keeps its first draft (a partial acceptance): later steps overwrite the
    // rest of its slots, as after a rejection.
    next_pos[verifier] += 2;
    for (int32_t seq = 0; seq < 3; ++seq) next_pos[seq] += seq == verifier ? 0 : 1;
  }
  const engine::StepGraphStats after = fenced->backend->step_graph_stats();
  EXPECT_GE(after.captures, 2) << "shapes of 4 and 8 tokens (with and without hidden rows)";
  EXPECT_GE(after.replays, 6);
  EXPECT_EQ(fenced->fenced->violations(), std::vector<std::string>{}) << c.name;
  // The model's recordings go with it.
  fenced->model.reset();
  EXPECT_EQ(fenced->backend->step_graph_stats().discarded, after.captures);
}

// A recorded step names the KV cache it ran on (its pools' addresses are in the recording,
// as in a CUDA graph). A model that goes on with a new cache after the old one is freed (a
// new engine over the same model: the benchmark's rows, a restarted scheduler) must not
// replay onto the freed pools: the fenced arena names such a replay, a GPU faults on it.
TEST_P(DeviceResidentTest, RecordedStepsFollowTheModelToANewKvCache) {
  const Case& c = GetParam();
  RecordingPair pair = LoadRecordingPair(c);
  ASSERT_TRUE(pair.fenced && pair.host);
  std::unique_ptr<Runner>& fenced = pair.fenced;
  std::unique_ptr<Runner>& host = pair.host;
  const int vocab = host->model->vocab_size();
  const std::vector<int32_t> prompt = Tokens(11, vocab, 7);
  for (int cache = 0; cache < 2; ++cache) {
    for (Runner* r : {fenced.get(), host.get()}) {
      if (cache > 0) {  // the first cache goes (its pools freed), a second one comes
        r->kv.reset();
        auto kv = PagedKvCache::Create(r->model->MakeKvCacheConfig(24, 16, c.dtype));
        ASSERT_TRUE(kv.ok()) << kv.status();
        r->kv = std::move(*kv);
      }
      ASSERT_TRUE(r->kv->AddSequence(0).ok());
      ForwardBatch p;
      p.Add(0, 0, prompt.data(), static_cast<int32_t>(prompt.size()), false);
      r->Run(p);
    }
    for (int32_t step = 0; step < 4; ++step) {  // one shape: as it is, recorded, replayed twice
      ForwardBatch s;
      const int32_t tok = (step * 17 + cache) % vocab;
      s.Add(0, static_cast<int32_t>(prompt.size()) + step, &tok, 1, false);
      const std::vector<float> f = fenced->Run(s), h = host->Run(s);
      ASSERT_EQ(f.size(), h.size());
      for (size_t j = 0; j < f.size(); ++j) {
        ASSERT_EQ(f[j], h[j]) << c.name << ": cache " << cache << " step " << step << " value " << j;
      }
    }
  }
  EXPECT_GE(fenced->backend->step_graph_stats().replays, 4);
  EXPECT_EQ(fenced->fenced->violations(), std::vector<std::string>{}) << c.name;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  {
    Case c{"llama_tied_f16", {}};
    cases.push_back(c);
  }
  {
    Case c{"qwen2_bias_bf16", {}};
    c.spec.architecture = "qwen2";
    c.dtype = KvDtype::kBF16;
    cases.push_back(c);
  }
  {
    Case c{"truncated_head_int8", {}};
    c.spec.tied_output = false;
    for (int32_t id = 0; id < 300; id += 3) c.spec.head_token_ids.push_back(id);
    c.dtype = KvDtype::kInt8;
    cases.push_back(c);
  }
  {
    Case c{"q4_1_f32kv_exact", {}};
    c.spec.weight_type = gguf::GgmlType::kQ4_1;
    c.spec.tied_output = false;
    c.dtype = KvDtype::kF32;
    c.exact = true;
    cases.push_back(c);
  }
  return cases;
}

// The recorded sizes: powers of two to 8, multiples of 8 to 64, then of 32, never past the cap,
// never below the step; 17 shapes up to 256 rows.
TEST(StepBucketTest, PadsWithinTheMatMulsTokenGroups) {
  const std::vector<std::pair<int64_t, int64_t>> table = {
      {1, 1},   {2, 2},   {3, 4},   {5, 8},    {8, 8},    {9, 16},   {16, 16},  {17, 24},
      {33, 40}, {40, 40}, {41, 48}, {63, 64},  {64, 64},  {65, 96},  {97, 128}, {129, 160},
      {160, 160}, {161, 192}, {255, 256}, {256, 256}};
  for (const auto& [n, want] : table) EXPECT_EQ(StepBucket(n, 512), want) << "n = " << n;
  EXPECT_EQ(StepBucket(70, 80), 80) << "the cap wins";
  std::set<int64_t> shapes;
  for (int64_t n = 1; n <= 256; ++n) {
    const int64_t b = StepBucket(n, 256);
    ASSERT_GE(b, n);
    ASSERT_LE(b - n, n <= 64 ? 7 : 31) << "n = " << n;
    shapes.insert(b);
  }
  EXPECT_EQ(shapes.size(), 17u);
}

// Steps of more than 8 rows pad to multiples of 8 (StepBucket): three sequences verifying 2-5
// drafts each (9-18 rows, buckets 16 and 24) and the prompts themselves (9-23 tokens) run as
// recordings, bitwise the host backend's steps as they are.
TEST_P(DeviceResidentTest, RecordedStepsOfManyRowsReplayBitwiseTheHostBackend) {
  const Case& c = GetParam();
  auto file = gguf::GgufFile::Open(TinyModelPath(c.name, c.spec));
  ASSERT_TRUE(file.ok()) << file.status();
  auto fenced = Load(**file, true, c, nullptr, /*step_graph_max_tokens=*/32);
  auto host = Load(**file, false, c);
  ASSERT_TRUE(fenced && host);
  const int vocab = host->model->vocab_size();
  std::vector<int32_t> next_pos(3);
  for (int32_t seq = 0; seq < 3; ++seq) {
    ASSERT_TRUE(fenced->kv->AddSequence(seq).ok());
    ASSERT_TRUE(host->kv->AddSequence(seq).ok());
    const std::vector<int32_t> prompt = Tokens(9 + 7 * seq, vocab, 60 + seq);
    ForwardBatch p;
    p.Add(seq, 0, prompt.data(), static_cast<int32_t>(prompt.size()), true);
    ASSERT_EQ(fenced->Run(p), host->Run(p)) << c.name << ": prompt " << seq;
    next_pos[seq] = static_cast<int32_t>(prompt.size());
  }
  for (int round = 0; round < 12; ++round) {
    ForwardBatch s;
    for (int32_t seq = 0; seq < 3; ++seq) {
      const int32_t k = 2 + round % 4;  // 9, 12, 15, 18 rows: buckets 16, 16, 16, 24
      std::vector<int32_t> drafts(static_cast<size_t>(k));
      for (int32_t i = 0; i < k; ++i) drafts[i] = (round * 7 + seq * 3 + i * 13) % vocab;
      const std::vector<int32_t> last = {(round * 11 + seq) % vocab};
      s.AddVerify(seq, next_pos[seq], last, drafts);
    }
    const int64_t rows = static_cast<int64_t>(s.tokens.size());
    ASSERT_GT(rows, 8);
    const std::vector<float> f = fenced->Run(s), h = host->Run(s);
    ASSERT_EQ(f.size(), h.size());
    for (size_t j = 0; j < f.size(); ++j) {
      ASSERT_EQ(f[j], h[j]) << c.name << ": round " << round << " (" << rows << " rows) value " << j;
    }
    for (int32_t seq = 0; seq < 3; ++seq) next_pos[seq] += 2;  // each keeps its first draft
  }
  const engine::StepGraphStats st = fenced->backend->step_graph_stats();
  EXPECT_GE(st.captures, 2) << "verify steps of 16 and 24 rows";
  EXPECT_GE(st.replays, 8);
  EXPECT_EQ(fenced->fenced->violations(), std::vector<std::string>{}) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Models, DeviceResidentTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

// Prefix caching: a sequence adopts another's published blocks, then is cut inside an
// adopted block, so the kept rows are copied to a private block in device memory (Copy2D).
TEST(DeviceResidentCacheTest, PrefixCacheCopyOnWriteRunsInDeviceMemory) {
  for (KvDtype dtype : {KvDtype::kF16, KvDtype::kInt8}) {
    Case c{"prefix", {}};
    c.dtype = dtype;
    c.prefix_caching = true;
    const std::string path = TinyModelPath("prefix", c.spec);
    auto file = gguf::GgufFile::Open(path);
    ASSERT_TRUE(file.ok());
    auto fenced = Load(**file, true, c), host = Load(**file, false, c);
    ASSERT_TRUE(fenced && host);
    const int vocab = host->model->vocab_size();
    const std::vector<int32_t> prompt = Tokens(40, vocab, 5);
    std::vector<std::vector<float>> outs[2];
    int i = 0;
    for (Runner* r : {fenced.get(), host.get()}) {
      ASSERT_TRUE(r->kv->AddSequence(1).ok());
      ForwardBatch p;
      p.Add(1, 0, prompt.data(), 40, false);
      outs[i].push_back(r->Run(p));
      ASSERT_TRUE(r->kv->Publish(1, prompt).ok());
      ASSERT_TRUE(r->kv->AddSequence(2).ok());
      absl::StatusOr<int64_t> adopted = r->kv->AdoptPrefix(2, prompt);
      ASSERT_TRUE(adopted.ok());
      ASSERT_EQ(*adopted, 32);
      ForwardBatch tail;  // from 20: inside the second adopted block, which is copied first
      tail.Add(2, 20, prompt.data() + 20, 20, /*all_logits=*/true);
      outs[i].push_back(r->Run(tail));
      EXPECT_EQ(outs[i].back().size(), 20u * vocab);
      ++i;
    }
    EXPECT_EQ(outs[0], outs[1]) << "dtype " << KvDtypeName(dtype);
    EXPECT_EQ(fenced->fenced->violations(), std::vector<std::string>{});
    // Sequence 1's blocks are untouched: its next token matches on both.
    const int32_t next = 17;
    ForwardBatch d;
    d.Add(1, 40, &next, 1, false);
    EXPECT_EQ(fenced->Run(d), host->Run(d));
  }
}

TEST(DeviceResidentCacheTest, FeatureConditionedDraftBorrowingEmbeddings) {
  testing::TinyModelSpec target_spec;
  target_spec.seed = 31;
  testing::TinyModelSpec draft_spec = target_spec;
  draft_spec.num_layers = 1;
  draft_spec.feature_conditioned = true;
  draft_spec.omit_token_embd = true;
  draft_spec.tied_output = false;
  auto target = gguf::GgufFile::Open(TinyModelPath("target", target_spec));
  auto draft = gguf::GgufFile::Open(TinyModelPath("eagle_draft", draft_spec));
  ASSERT_TRUE(target.ok() && draft.ok());
  Case c{"eagle", draft_spec};
  auto fenced = Load(**draft, true, c, target->get()), host = Load(**draft, false, c, target->get());
  ASSERT_TRUE(fenced && host);
  const int64_t D = host->model->config().embedding_dim;
  const std::vector<int32_t> toks = Tokens(9, host->model->vocab_size(), 3);
  ForwardBatch b;
  b.Add(1, 0, toks.data(), 9, /*all_logits=*/true);
  b.input_features.resize(9 * D);
  for (size_t i = 0; i < b.input_features.size(); ++i) b.input_features[i] = std::cos(0.3f * i);
  b.hidden_rows = {8};
  for (Runner* r : {fenced.get(), host.get()}) ASSERT_TRUE(r->kv->AddSequence(1).ok());
  EXPECT_EQ(fenced->Run(b), host->Run(b));
  EXPECT_EQ(fenced->fenced->violations(), std::vector<std::string>{});
}

// The fence is real: an op handed host memory is a violation, and host code that reads the
// arena outside a backend call dies.
TEST(DeviceResidentCacheTest, TheFenceCatchesHostPointersAndHostReads) {
  std::unique_ptr<testing::FencedBackend> be = testing::MakeFencedBackend(size_t{1} << 24);
  absl::StatusOr<DeviceBuffer> buf = DeviceBuffer::Allocate(be->memory(), 64 * sizeof(float));
  ASSERT_TRUE(buf.ok());
  std::vector<float> host(64, 1.0f);
  be->AddInPlace(buf->as<float>(), host.data(), 64);
  EXPECT_EQ(be->violations(), std::vector<std::string>{"AddInPlace: y"});
  ASSERT_TRUE(be->memory().Upload(buf->data(), host.data(), 64 * sizeof(float)).ok());
  std::vector<float> back(64, 0.0f);
  ASSERT_TRUE(be->memory().Download(back.data(), buf->data(), 64 * sizeof(float)).ok());
  EXPECT_EQ(back, host);
  EXPECT_DEATH(
      {
        volatile float x = buf->as<float>()[3];
        static_cast<void>(x);
      },
      "");
}

// The recording itself: a shape's first step runs as it is, its second is recorded with the
// arguments it was issued with and replayed, and so is every later step of that shape, even
// when the host would now issue other arguments (which is why the model must not). Work that
// a device capture refuses (an upload) makes the step run as it is.
TEST(DeviceResidentCacheTest, StepsOfAShapeReplayTheirRecording) {
  std::unique_ptr<testing::FencedBackend> be = testing::MakeFencedBackend(size_t{1} << 24);
  absl::StatusOr<DeviceBuffer> x = DeviceBuffer::Allocate(be->memory(), 4 * sizeof(float));
  absl::StatusOr<DeviceBuffer> y = DeviceBuffer::Allocate(be->memory(), 4 * sizeof(float));
  ASSERT_TRUE(x.ok() && y.ok());
  const std::vector<float> ones(4, 1.0f);
  ASSERT_TRUE(be->memory().Upload(y->data(), ones.data(), 4 * sizeof(float)).ok());
  int64_t n = 1;
  auto step = [&] {
    be->AddInPlace(x->as<float>(), y->as<float>(), n);
    return absl::OkStatus();
  };
  const StepGraphKey key{nullptr, 4, 0, 0};
  auto read = [&] {
    std::vector<float> back(4);
    EXPECT_TRUE(be->memory().Download(back.data(), x->data(), 4 * sizeof(float)).ok());
    return back;
  };
  ASSERT_TRUE(be->RunStep(key, step).ok());  // as it is: n = 1
  EXPECT_EQ(read(), (std::vector<float>{1, 0, 0, 0}));
  n = 2;
  ASSERT_TRUE(be->RunStep(key, step).ok());  // recorded with n = 2, then replayed
  EXPECT_EQ(read(), (std::vector<float>{2, 1, 0, 0}));
  n = 4;
  ASSERT_TRUE(be->RunStep(key, step).ok());  // the recording: still n = 2
  EXPECT_EQ(read(), (std::vector<float>{3, 2, 0, 0}));
  StepGraphStats st = be->step_graph_stats();
  EXPECT_EQ(st.eager, 1);
  EXPECT_EQ(st.captures, 1);
  EXPECT_EQ(st.replays, 2);

  const StepGraphKey other{nullptr, 8, 0, 0};
  auto uploading = [&] {
    be->AddInPlace(x->as<float>(), y->as<float>(), 4);
    return be->memory().Upload(y->data(), ones.data(), 4 * sizeof(float));
  };
  ASSERT_TRUE(be->RunStep(other, uploading).ok());  // as it is
  ASSERT_TRUE(be->RunStep(other, uploading).ok());  // refused as a recording: as it is again
  ASSERT_TRUE(be->RunStep(other, uploading).ok());  // not tried again
  EXPECT_EQ(read(), (std::vector<float>{6, 5, 3, 3}));
  st = be->step_graph_stats();
  EXPECT_EQ(st.captures, 1);
  EXPECT_EQ(st.eager, 4);
  EXPECT_EQ(be->violations(), std::vector<std::string>{"Upload while a step is recorded"});
}

TEST(DeviceResidentCacheTest, MismatchedMemoryIsAClearError) {
  const std::string path = TinyModelPath("mismatch", {});
  auto file = gguf::GgufFile::Open(path);
  ASSERT_TRUE(file.ok());
  auto fenced = Load(**file, true, Case{"mismatch", {}});
  ASSERT_TRUE(fenced);
  // A cache made in host memory cannot serve a device model.
  KvCacheConfig kc = fenced->model->MakeKvCacheConfig(8, 16, KvDtype::kF16);
  kc.memory = nullptr;
  auto host_kv = PagedKvCache::Create(kc);
  ASSERT_TRUE(host_kv.ok() && (*host_kv)->AddSequence(1).ok());
  const int32_t tok = 5;
  ForwardBatch b;
  b.Add(1, 0, &tok, 1, false);
  std::vector<float> logits(fenced->model->vocab_size());
  absl::Status st = fenced->model->Forward(b, **host_kv, logits.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("kv:"), std::string::npos) << st;
  // Host collectives cannot reduce device memory: two thread ranks refuse at load.
  ThreadGroup group(2);
  std::unique_ptr<Communicator> rank0 = group.Rank(0);
  std::unique_ptr<testing::FencedBackend> be = testing::MakeFencedBackend();
  auto m = LlamaModel::Load(**file, be.get(), rank0.get(), {});
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(m.status().message().find("NCCL"), std::string::npos) << m.status();
}

// --device names, on every build (the CUDA backend itself: tests/unit/cuda_model_test.cc).
TEST(BackendFactoryTest, NamesAreCheckedAndCudaIsClearWhereItCannotRun) {
  EXPECT_TRUE(MakeBackend("cpu", 1).ok());
  EXPECT_TRUE(MakeBackend("ref", 1).ok());
  auto bad = MakeBackend("tpu", 1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--device tpu"), std::string::npos) << bad.status();
  auto ordinal = MakeBackend("cuda:x", 1);
  EXPECT_EQ(ordinal.status().code(), absl::StatusCode::kInvalidArgument) << ordinal.status();
  auto far = MakeBackend("cuda:4096", 1);
  EXPECT_EQ(far.status().code(), CudaBackendBuilt() ? absl::StatusCode::kFailedPrecondition
                                                    : absl::StatusCode::kUnavailable)
      << far.status();
  EXPECT_NE(far.status().message().find("cuda:4096"), std::string::npos) << far.status();
}

}  // namespace
}  // namespace specd::engine
