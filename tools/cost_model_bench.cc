#include "tools/cost_model_bench.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/gguf/gguf_file.h"
#include "engine/backend.h"
#include "engine/backend_factory.h"
#include "engine/communicator.h"
#include "engine/llama_model.h"
#include "engine/model_runner.h"
#include "engine/paged_kv_cache.h"
#include "speculation/adaptive_k.h"
#include "speculation/calibration.h"

namespace specd {
namespace {

// One model on its own backend, sized for `max_tokens` tokens a forward.
struct Loaded {
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<engine::Backend> backend;
  engine::LocalCommunicator comm;
  std::unique_ptr<engine::LlamaModel> model;
  std::unique_ptr<engine::PagedKvCache> kv;
  std::unique_ptr<engine::LocalModelRunner> runner;
};

// borrow: tensors the file lacks (a distilled draft shares its target's embeddings).
// depth_tokens: KV room beyond max_tokens, for the calibration at depth.
absl::StatusOr<std::unique_ptr<Loaded>> Load(const std::string& path, const CostModelOptions& o,
                                             int32_t max_tokens, const gguf::GgufFile* borrow,
                                             int32_t depth_tokens = 0) {
  auto l = std::make_unique<Loaded>();
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file = gguf::GgufFile::Open(path);
  if (!file.ok()) return file.status();
  l->file = *std::move(file);
  absl::StatusOr<std::unique_ptr<engine::Backend>> be = engine::MakeBackend(o.device, o.threads);
  if (!be.ok()) return be.status();
  l->backend = *std::move(be);
  engine::ModelOptions mo;
  mo.max_batch_tokens = max_tokens;
  mo.max_logit_rows = max_tokens;
  mo.borrow_from = borrow;
  absl::StatusOr<std::unique_ptr<engine::LlamaModel>> model =
      engine::LlamaModel::Load(*l->file, l->backend.get(), &l->comm, mo);
  if (!model.ok()) return model.status();
  l->model = *std::move(model);
  constexpr int32_t kBlock = 16;
  absl::StatusOr<std::unique_ptr<engine::PagedKvCache>> kv = engine::PagedKvCache::Create(
      l->model->MakeKvCacheConfig((max_tokens + depth_tokens) / kBlock + 4, kBlock,
                                  kernels::KvDtype::kF16));
  if (!kv.ok()) return kv.status();
  l->kv = *std::move(kv);
  l->runner = std::make_unique<engine::LocalModelRunner>(l->model.get(), l->kv.get());
  return l;
}

std::string Base(const std::string& path) { return path.substr(path.find_last_of('/') + 1); }

}  // namespace

int RunCostModel(const CostModelOptions& o) {
  const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  const int32_t verify_tokens = max_batch * (o.max_k + 1);
  absl::StatusOr<std::unique_ptr<Loaded>> target = Load(o.target_path, o, verify_tokens, nullptr,
                                                                /*depth_tokens=*/1024 + 16);
  absl::StatusOr<std::unique_ptr<Loaded>> draft =
      target.ok() ? Load(o.draft_path, o, max_batch, (*target)->file.get()) : target.status();
  if (!target.ok() || !draft.ok()) {
    std::fprintf(stderr, "specd-bench: --cost-model: %s\n",
                 (target.ok() ? draft.status() : target.status()).ToString().c_str());
    return 1;
  }
  // Verification asks for every row's logits, as a draft round does for each sequence's.
  absl::StatusOr<spec::CostCurve> verify = spec::CalibrateVerify(*(*target)->runner, verify_tokens, verify_tokens);
  // A draft round is priced by sequences alone: no depth.
  absl::StatusOr<spec::CostCurve> round = spec::CalibrateVerify(
      *(*draft)->runner, max_batch, max_batch, /*probe=*/-1, /*depth_keys=*/0);
  if (!verify.ok() || !round.ok()) {
    std::fprintf(stderr, "specd-bench: --cost-model: %s\n",
                 (verify.ok() ? round.status() : verify.status()).ToString().c_str());
    return 1;
  }
  std::printf("cost model on %s: target %s (%.0f MB of weights a step), draft %s (%.0f MB)\n",
              o.device.c_str(), Base(o.target_path).c_str(), (*target)->model->weight_bytes() / 1e6,
              Base(o.draft_path).c_str(), (*draft)->model->weight_bytes() / 1e6);
  std::printf("target forward by tokens (ms, best of runs):");
  for (const auto& [x, s] : verify->points()) std::printf(" %g: %.3f", x, s * 1e3);
  std::printf("\ndraft round by sequences (ms):");
  for (const auto& [x, s] : round->points()) std::printf(" %g: %.3f", x, s * 1e3);
  const double v1 = verify->Predict(1);
  std::printf("\ndraft step / target step (batch 1): %.3f\n", round->Predict(1) / v1);
  std::printf("verify(k+1) / verify(1), k = 1..%d:", o.max_k);
  for (int k = 1; k <= o.max_k; ++k) std::printf(" %.2f", verify->Predict(k + 1) / v1);
  const spec::DepthCost& depth = verify->depth();
  std::printf(
      "\ncontext (calibrated at depth): %.3f us a position, %.3f us more a row's position\n",
      depth.per_key * 1e6, depth.per_row_key * 1e6);
  std::printf("a row's logits: %.3f ms (calibrated with every row's, up to %d rows)\n",
              verify->logits().per_row * 1e3, verify->logits().calibrated_rows);
  constexpr int32_t kDeep = 2048;
  const auto at_deep = [&](int32_t rows) {
    spec::StepContext c;
    c.Add(kDeep, rows);
    return verify->Predict(rows, c);
  };
  std::printf("verify(k+1) / verify(1) at %d positions, k = 1..%d:", kDeep, o.max_k);
  for (int k = 1; k <= o.max_k; ++k) std::printf(" %.2f", at_deep(k + 1) / at_deep(1));
  for (int32_t context : {0, kDeep}) {
    std::printf("\nimplied speed-up over plain decoding at %d positions of context, adaptive k "
                "(ChooseK, k <= %d):\n", context, o.max_k);
    std::printf("%-11s", "acceptance");
    for (int b : o.batches) std::printf("  batch %-14d", b);
    std::printf("\n");
    for (double a : o.acceptances) {
      std::printf("%-11.2f", a);
      for (int b : o.batches) {
        const spec::SpeedupEstimate e =
            spec::EstimateSpeedup(a, b, o.max_k, *verify, *round, context);
        std::printf("  %5.2fx (k %4.1f)    ", e.speedup, e.mean_k);
      }
      std::printf("\n");
    }
  }
  std::printf("reported anchors (not measured here): SGLang, EAGLE-3 on Llama-3.1-8B, H100, batch 1: "
              "2.36x; NVIDIA, a 70B draft-target pair on H200: 3.55x\n");
  return 0;
}

}  // namespace specd
