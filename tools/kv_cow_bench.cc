// Copy-on-write against recompute, for the prefix cache's one write into a shared block: a
// truncation that keeps 15 rows of a shared block either copies those rows to a private block
// (what engine::PagedKvCache::Truncate does) or would recompute them (a 15-token forward).
// Both are timed on the given model, min over repetitions, and printed with their ratio.
//   build/tools/kv_cow_bench models/SmolLM2-135M-Instruct.Q4_1.gguf [threads]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "common/gguf/gguf_file.h"
#include "engine/backend.h"
#include "engine/communicator.h"
#include "engine/forward_batch.h"
#include "engine/llama_model.h"
#include "engine/paged_kv_cache.h"

namespace {

using Clock = std::chrono::steady_clock;
using specd::engine::ForwardBatch;

double Micros(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

int Fail(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "kv_cow_bench: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: kv_cow_bench MODEL.gguf [threads]\n");
    return 2;
  }
  const int threads = argc > 2 ? std::atoi(argv[2]) : 0;
  auto file = specd::gguf::GgufFile::Open(argv[1]);
  if (!file.ok()) return Fail("open", file.status());
  auto backend = specd::engine::MakeCpuBackend(threads);
  specd::engine::LocalCommunicator comm;
  specd::engine::ModelOptions mo;
  mo.max_batch_tokens = 256;
  mo.max_logit_rows = 256;
  auto model = specd::engine::LlamaModel::Load(**file, backend.get(), &comm, mo);
  if (!model.ok()) return Fail("load", model.status());
  specd::engine::KvCacheConfig kc =
      (*model)->MakeKvCacheConfig(256, 16, specd::kernels::KvDtype::kF16);
  kc.prefix_caching = true;
  auto kv_or = specd::engine::PagedKvCache::Create(kc);
  if (!kv_or.ok()) return Fail("kv", kv_or.status());
  specd::engine::PagedKvCache& kv = **kv_or;
  // A 128-token prompt, computed and published: 8 full blocks (7 adoptable).
  std::vector<int32_t> prompt;
  for (int i = 0; i < 128; ++i) prompt.push_back(100 + (i * 7) % 3000);
  std::vector<float> logits(static_cast<size_t>((*model)->vocab_size()) * 256);
  if (absl::Status s = kv.AddSequence(1); !s.ok()) return Fail("add", s);
  ForwardBatch prefill;
  prefill.Add(1, 0, prompt.data(), 128, false);
  if (absl::Status s = (*model)->Forward(prefill, kv, logits.data()); !s.ok()) {
    return Fail("prefill", s);
  }
  if (absl::Status s = kv.Publish(1, prompt); !s.ok()) return Fail("publish", s);
  double copy_us = 1e18, recompute_us = 1e18;
  for (int rep = 0; rep < 20; ++rep) {
    // Copy: a sequence adopts 7 blocks (112 tokens), then keeps 15 rows of the 7th.
    if (absl::Status s = kv.AddSequence(2); !s.ok()) return Fail("add", s);
    if (auto a = kv.AdoptPrefix(2, prompt); !a.ok() || *a != 112) return Fail("adopt", a.status());
    auto t0 = Clock::now();
    if (absl::Status s = kv.Truncate(2, 96 + 15); !s.ok()) return Fail("truncate", s);
    copy_us = std::min(copy_us, Micros(t0));
    kv.FreeSequence(2);
    // Recompute: the same 15 rows as a prompt chunk after 6 adopted blocks.
    if (absl::Status s = kv.AddSequence(3); !s.ok()) return Fail("add", s);
    const std::vector<int32_t> first97(prompt.begin(), prompt.begin() + 97);
    if (auto a = kv.AdoptPrefix(3, first97); !a.ok() || *a != 96) return Fail("adopt", a.status());
    ForwardBatch chunk;
    chunk.AddPrompt(3, 96, prompt.data() + 96, 15);
    t0 = Clock::now();
    if (absl::Status s = (*model)->Forward(chunk, kv, logits.data()); !s.ok()) {
      return Fail("recompute", s);
    }
    recompute_us = std::min(recompute_us, Micros(t0));
    kv.FreeSequence(3);
  }
  std::printf("15 rows of a shared block: copy-on-write %.1f us, recompute %.1f us (%.0fx)\n",
              copy_us, recompute_us, recompute_us / copy_us);
  return 0;
}
