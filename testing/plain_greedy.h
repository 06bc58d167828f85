// Plain greedy decoding straight through the engine: the reference that speculative, batched
// and networked paths are compared against in tests.
#ifndef SPECD_TESTING_PLAIN_GREEDY_H_
#define SPECD_TESTING_PLAIN_GREEDY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace specd::testing {

// Loads the GGUF at `path` (CPU backend, 1 thread, f16 KV), prefills `prompt` and returns the
// next `n` greedy tokens, one forward per token.
absl::StatusOr<std::vector<int32_t>> PlainGreedy(const std::string& path,
                                                 const std::vector<int32_t>& prompt, int n);

// A prompt of n token ids in [3, 203) that does not repeat within its first 200 tokens; `salt`
// gives another prompt of the same length.
std::vector<int32_t> SyntheticPrompt(int n, int salt = 0);

}  // namespace specd::testing

#endif  // SPECD_TESTING_PLAIN_GREEDY_H_
