// `specd-bench --cost-model DRAFT.gguf -m TARGET.gguf [--device D]`: the speculation cost model
// of a target/draft pair where they run. Measured: the target's forward by tokens (what a
// verification of k+1 rows per sequence costs) and the draft's forward by sequences (a draft
// round). Printed: draft step / target step, verify(k+1) / verify(1) for k = 1..8, and the
// speed-up those costs imply at acceptance 0.4 ... 0.8 for batch 1, 8 and 32 with the k the
// adaptive policy (spec::ChooseK) picks. Random-weight models of real shapes
// (specd-make-tiny-model) have real costs, so a Llama-3-8B-shaped target and a 1B-shaped draft
// need no downloaded weights. A benchmark: it prints figures and asserts nothing.
#ifndef SPECD_TOOLS_COST_MODEL_BENCH_H_
#define SPECD_TOOLS_COST_MODEL_BENCH_H_

#include <string>
#include <vector>

namespace specd {

struct CostModelOptions {
  std::string target_path;
  std::string draft_path;
  std::string device = "cpu";
  int threads = 0;
  int max_k = 8;
  std::vector<int> batches = {1, 8, 32};
  std::vector<double> acceptances = {0.4, 0.5, 0.6, 0.7, 0.8};  // 0.4-0.5: our drafts today
};

int RunCostModel(const CostModelOptions& o);

}  // namespace specd

#endif  // SPECD_TOOLS_COST_MODEL_BENCH_H_
