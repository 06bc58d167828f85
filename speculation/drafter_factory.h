// Builds the drafter a command line or config names: a draft model file, self-speculation on
// the target's first L layers, or n-gram lookup.
#ifndef SPECD_SPECULATION_DRAFTER_FACTORY_H_
#define SPECD_SPECULATION_DRAFTER_FACTORY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "common/gguf/gguf_file.h"
#include "speculation/drafter.h"
#include "speculation/model_drafter.h"
#include "speculation/ngram_drafter.h"

namespace specd::spec {

struct DrafterChoice {
  enum class Kind { kNone, kModel, kSelf, kNgram };
  Kind kind = Kind::kNone;
  std::string draft_path;     // kModel
  int32_t self_layers = 0;    // kSelf
  ModelDrafterOptions model;  // kModel / kSelf
  NgramDrafterOptions ngram;  // kNgram

  std::string Describe() const;
};

// The draft the project ships for a target: `<target file stem>.draft.gguf` (e.g.
// SmolLM2-135M-Instruct.Q4_1.draft.gguf, made by tools/distill) in $SPECD_DRAFTS_DIR, else next
// to the target file, else in `drafts/` of the source tree (`exe_dir`/../../drafts for binaries
// in build/tools or build/services). NOT_FOUND listing where it looked.
absl::StatusOr<std::string> ShippedDraftFor(const std::string& target_path,
                                            const std::string& exe_dir);

// Null for Kind::kNone. `target_file` (opened from `target_path`) and `backend` must outlive
// the drafter. Errors as the drafters' factories (vocabulary mismatch names both files).
absl::StatusOr<std::unique_ptr<Drafter>> MakeDrafter(const DrafterChoice& choice,
                                                     const gguf::GgufFile& target_file,
                                                     const std::string& target_path,
                                                     engine::Backend* backend);

}  // namespace specd::spec

#endif  // SPECD_SPECULATION_DRAFTER_FACTORY_H_
