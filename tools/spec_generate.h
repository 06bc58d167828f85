// `specd generate` with speculation (--draft FILE | --self-draft L | --ngram, --k N|auto):
// runs the in-process SpecEngine on one prompt, streams text, reports speed and acceptance.
#ifndef SPECD_TOOLS_SPEC_GENERATE_H_
#define SPECD_TOOLS_SPEC_GENERATE_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "common/gguf/ggml_type.h"
#include "common/sampling/sampling_params.h"
#include "speculation/drafter_factory.h"
#include "kernels/kernel_types.h"

namespace specd {

struct SpecGenerateOptions {
  std::string model, prompt;
  bool chat = false;
  int max_new_tokens = 128;
  int threads = 0;
  std::string device = "cpu";  // the target's backend (--device); the draft runs on the CPU
  int kv_blocks = 0;
  kernels::KvDtype kv_dtype = kernels::KvDtype::kF16;
  sampling::SamplingParams params;
  spec::DrafterChoice drafter;
  // A model draft's chain length from its confidence (spec::ModelDrafterOptions).
  double draft_min_keep = spec::kDefaultMinKeep;
  double draft_min_extend = spec::kDefaultMinExtend;
  int k = 4;
  bool adaptive_k = false;
  // With --k auto and a model draft: the n-gram lookup drafts first where it has a match (the
  // router's speculation "auto"); --no-lookup turns it off.
  bool lookup = true;
  std::optional<gguf::GgmlType> target_weights;  // re-encode the target at load (e.g. F16)
  std::string exe_dir;  // where the binary lives: --draft default looks in ../../drafts
};

// Parses one speculation flag at argv[*i] ("--draft", "--self-draft", "--ngram", "--k",
// "--no-lookup", "--draft-min-keep", "--draft-min-extend", "--target-weights"), advancing *i past its value. Returns false if argv[*i] is not one.
// INVALID_ARGUMENT for a bad value, naming the flag.
absl::StatusOr<bool> ParseSpecFlag(int argc, char** argv, int* i, SpecGenerateOptions* o);

absl::Status SpecGenerate(const SpecGenerateOptions& o);

}  // namespace specd

#endif  // SPECD_TOOLS_SPEC_GENERATE_H_
