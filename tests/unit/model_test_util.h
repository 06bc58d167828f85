// What model tests share: a model loaded with its own backend and KV cache, and token ids.
#ifndef SPECD_TESTS_UNIT_MODEL_TEST_UTIL_H_
#define SPECD_TESTS_UNIT_MODEL_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/gguf/gguf_file.h"
#include "engine/backend.h"
#include "engine/communicator.h"
#include "engine/forward_batch.h"
#include "engine/llama_model.h"
#include "engine/paged_kv_cache.h"
#include "gtest/gtest.h"

namespace specd::engine {

// A loaded model with its own backend and KV cache.
struct Loaded {
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<Backend> backend;
  LocalCommunicator comm;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<PagedKvCache> kv;

  // The logits of the batch's rows.
  std::vector<float> Run(const ForwardBatch& b) {
    std::vector<float> logits(b.logit_rows.size() * model->vocab_size());
    absl::Status st = model->Forward(b, *kv, logits.data());
    EXPECT_TRUE(st.ok()) << backend->name() << ": " << st;
    return logits;
  }
};

// n deterministic token ids in [0, vocab).
inline std::vector<int32_t> Tokens(int n, int vocab, int seed) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 37 + seed * 101 + 11) % vocab;
  return t;
}

}  // namespace specd::engine

#endif  // SPECD_TESTS_UNIT_MODEL_TEST_UTIL_H_
