// `specd distill-data`: the target writes the data a draft is distilled from. For every prompt
// (JSONL, rendered with the target's chat template) and every temperature (or, with
// `--temperature-mode cycle`, prompt i at temperature i mod their count), the serving engine
// generates a response and records, at every response position, the target's own next-token
// distribution as it computes it for serving (log-softmax of the raw logits, temperature 1),
// stored sparse: the top-N ids and log-probs (the rest of the mass is 1 - sum of them).
//
// File format (little-endian), read by tools/distill/specd_distill.py:
//   "SPDDATA1"  u32 version=1  u32 top_n  u32 vocab_size  u32 num_records  u64 vocab_fingerprint
//   per record: u32 num_prompt  u32 num_response  f32 temperature  u32 prompt_index
//               i32 tokens[num_prompt + num_response]
//               i32 top_ids[num_response][top_n]      (the distribution before response token j)
//               f32 top_logprobs[num_response][top_n] (descending)
#ifndef SPECD_TOOLS_DISTILL_DATA_H_
#define SPECD_TOOLS_DISTILL_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace specd {

struct DistillDataOptions {
  std::string model;                   // target GGUF
  std::string prompts;                 // JSONL: {"prompt": "...", "system": "..." (optional)}
  std::string out;                     // data file to write
  std::vector<float> temperatures = {0.0f, 0.8f};
  // false: every prompt at every temperature; true: prompt i at temperatures[i % count] only,
  // so the same number of responses covers count times the prompts.
  bool cycle_temperatures = false;
  int max_new_tokens = 128;
  int max_prompt_tokens = 384;         // longer prompts are skipped (and counted)
  int top_n = 32;
  int batch = 16;                      // sequences decoded together
  int threads = 0;
  uint64_t seed = 1;
  int limit = 0;                       // 0 = every prompt; else the first `limit`
};

// Parses `specd distill-data` flags. INVALID_ARGUMENT naming the flag.
absl::Status ParseDistillDataArgs(int argc, char** argv, DistillDataOptions* o);

absl::Status RunDistillData(const DistillDataOptions& o);

// `specd logits -m MODEL [--borrow-from TARGET] --tokens 1,2,3 [--exact] [--kv-dtype f32]
// -o OUT.bin`: the engine's logits for every position of one sequence, float32 [n, vocab]
// row-major: what specd-distill compares its training framework's forward against (the export
// is faithful). --exact runs float activations (ModelOptions::exact_activations); --kv-dtype
// f16 reads the KV as distill-data's generation does (its test recomputes the records).
absl::Status RunLogits(int argc, char** argv);

// `specd hidden -m TARGET --data DATA.bin -o OUT.bin [--max-tokens 256] [-t N]`: the target's
// final hidden state (before output_norm) at every token of every record of a distill-data
// file, cut to --max-tokens: what a feature-conditioned draft (specd-distill --kind eagle) is
// fed. Format: "SPDHID01" u32 dim u32 num_records, per record u32 n, f16 [n][dim].
absl::Status RunHidden(int argc, char** argv);

}  // namespace specd

#endif  // SPECD_TOOLS_DISTILL_DATA_H_
