// `specd-bench --spec`: plain vs speculative decoding on one model, per drafter, at batch 1 and
// 8, with fixed and adaptive k, plus the pair target = the model re-encoded to F16 (or BF16 /
// F32) at load vs draft = the file itself. Prints tok/s, speed-up, acceptance and where the time goes.
#ifndef SPECD_TOOLS_SPEC_BENCH_H_
#define SPECD_TOOLS_SPEC_BENCH_H_

#include <string>
#include <vector>

#include "speculation/model_drafter.h"

namespace specd {

struct SpecBenchOptions {
  std::string model_path;
  int threads = 0;
  std::string device = "cpu";  // --device: the target's and the model drafters' backend
  int new_tokens = 48;  // per request
  int prompts = 8;      // requests per configuration (run one by one at batch 1)
  int self_layers = 6;
  bool pair = true;  // also the re-encoded target vs the file as draft
  bool pair_only = false;  // skip the single-file drafters
  // The pairs' target weights (f16, bf16, f32): F16 is the pair the issue names; F32 has
  // the cost gap (draft step ~0.3 of a target step) that speculation is meant for.
  std::vector<std::string> pair_types = {"f16", "f32"};
  // The distilled draft (tools/distill) against the model as it is: batch 1 and 8, k 4 and
  // auto, greedy and temperature 0.8, with the cost figures (draft step / target step,
  // verify(k+1) / verify(1)). `distilled_only` skips everything else.
  bool distilled = true;
  bool distilled_only = false;
  std::string draft_path = "default";  // `default`: the shipped draft for the model
  std::vector<int> distilled_fixed_k = {4};  // the fixed-k rows of the distilled section
  // > 0: each distilled-section row is measured against plain decoding in this many rounds
  // (one pass each, the order swapped every round) and reports the median of the rounds'
  // ratios with their range; 0: best of 2 passes, against the section's plain row.
  int spec_pairs = 0;
  // The distilled draft's confidence cut (spec::ModelDrafterOptions min_keep / min_extend).
  double draft_min_keep = spec::kDefaultMinKeep;
  double draft_min_extend = spec::kDefaultMinExtend;
  // The adaptive policy's calibration at depth (SpecEngineOptions::calibrate_depth_keys; 0:
  // context not priced), to compare k choices with and without it.
  int32_t depth_keys = 1024;
  // The distilled section's batches and temperatures (--spec-batches, --spec-temps): a paired
  // run of one configuration need not pay for the others.
  std::vector<int> distilled_batches = {1, 8};
  std::vector<float> distilled_temps = {0.0f, 0.8f};
  std::string prompts_file;  // JSONL {"prompt": ...}: e.g. tools/distill/eval_prompts.jsonl
  // (the held-out set); empty = the built-in chat prompts
};

int RunSpecBench(const SpecBenchOptions& o);

}  // namespace specd

#endif  // SPECD_TOOLS_SPEC_BENCH_H_
