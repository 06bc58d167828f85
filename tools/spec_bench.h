// `specd-bench --spec`: plain vs speculative decoding on one model, per drafter, at batch 1 and
// 8, with fixed and adaptive k, plus the pair target = the model re-encoded to F16 at load vs
// draft = the file itself. Prints tok/s, speed-up, acceptance and where the time goes.
#ifndef SPECD_TOOLS_SPEC_BENCH_H_
#define SPECD_TOOLS_SPEC_BENCH_H_

#include <string>

namespace specd {

struct SpecBenchOptions {
  std::string model_path;
  int threads = 0;
  int new_tokens = 48;  // per request
  int prompts = 8;      // requests per configuration (run one by one at batch 1)
  int self_layers = 6;
  bool pair = true;  // also the F16 target vs Q4_1 draft pair
};

int RunSpecBench(const SpecBenchOptions& o);

}  // namespace specd

#endif  // SPECD_TOOLS_SPEC_BENCH_H_
