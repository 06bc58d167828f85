#include "testing/plain_greedy.h"

#include "engine/backend.h"
#include "engine/communicator.h"
#include "engine/llama_model.h"
#include "engine/paged_kv_cache.h"
#include "common/gguf/gguf_file.h"
#include "common/sampling/sampler.h"

namespace specd::testing {

absl::StatusOr<std::vector<int32_t>> PlainGreedy(const std::string& path,
                                                 const std::vector<int32_t>& prompt, int n) {
  auto file = gguf::GgufFile::Open(path);
  if (!file.ok()) return file.status();
  engine::LocalCommunicator comm;
  auto be = engine::MakeCpuBackend(1);
  auto model = engine::LlamaModel::Load(**file, be.get(), &comm, {});
  if (!model.ok()) return model.status();
  auto kv = engine::PagedKvCache::Create(
      (*model)->MakeKvCacheConfig(64, 16, kernels::KvDtype::kF16));
  if (!kv.ok()) return kv.status();
  absl::Status st = (*kv)->AddSequence(0);
  if (!st.ok()) return st;
  std::vector<int32_t> seq = prompt, out;
  std::vector<float> logits((*model)->vocab_size());
  sampling::SamplingParams greedy;
  greedy.temperature = 0;
  int32_t pos = 0;
  for (int i = 0; i < n; ++i) {
    engine::ForwardBatch b;
    b.Add(0, pos, seq.data() + pos, static_cast<int32_t>(seq.size()) - pos, false);
    if (!(st = (*model)->Forward(b, **kv, logits.data())).ok()) return st;
    pos = static_cast<int32_t>(seq.size());
    auto s = sampling::Sample(logits, {}, greedy, sampling::CounterRng(0), pos);
    if (!s.ok()) return s.status();
    seq.push_back(s->token);
    out.push_back(s->token);
  }
  return out;
}

std::vector<int32_t> SyntheticPrompt(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(3 + (i * 37 + salt * 11) % 200);
  return p;
}

}  // namespace specd::testing
