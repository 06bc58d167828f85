#include "speculation/drafter_factory.h"

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/tokenizer.h"

namespace specd::spec {

std::string DrafterChoice::Describe() const {
  switch (kind) {
    case Kind::kNone:
      return "none";
    case Kind::kModel:
      return absl::StrCat("draft model ", draft_path);
    case Kind::kSelf:
      return absl::StrCat("self-draft (", self_layers, " layers)");
    case Kind::kNgram:
      return "n-gram";
  }
  return "?";
}

absl::StatusOr<std::string> ShippedDraftFor(const std::string& target_path,
                                            const std::string& exe_dir) {
  namespace fs = std::filesystem;
  const std::string name = fs::path(target_path).stem().string() + ".draft.gguf";
  std::vector<fs::path> dirs;
  if (const char* env = std::getenv("SPECD_DRAFTS_DIR"); env != nullptr && *env != '\0') {
    dirs.emplace_back(env);
  }
  dirs.push_back(fs::path(target_path).parent_path());
  if (!exe_dir.empty()) dirs.push_back(fs::path(exe_dir) / ".." / ".." / "drafts");
  std::string looked;
  for (const fs::path& d : dirs) {
    const fs::path p = (d.empty() ? fs::path(".") : d) / name;
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p.lexically_normal().string();
    absl::StrAppend(&looked, looked.empty() ? "" : ", ", p.lexically_normal().string());
  }
  return absl::NotFoundError(absl::StrCat("no shipped draft for target ", target_path,
                                          " (looked for ", looked, ")"));
}

absl::StatusOr<std::unique_ptr<Drafter>> MakeDrafter(const DrafterChoice& c,
                                                     const gguf::GgufFile& target_file,
                                                     const std::string& target_path,
                                                     engine::Backend* backend) {
  switch (c.kind) {
    case DrafterChoice::Kind::kNone:
      return std::unique_ptr<Drafter>();
    case DrafterChoice::Kind::kModel: {
      absl::StatusOr<std::unique_ptr<tok::Tokenizer>> tk = tok::Tokenizer::FromGguf(target_file);
      if (!tk.ok()) return tk.status();
      const TargetIdentity target{target_path, (*tk)->Fingerprint(), (*tk)->vocab_size(),
                                  &target_file};
      auto d = ModelDrafter::CreateFromFile(c.draft_path, target, backend, c.model);
      if (!d.ok()) return d.status();
      return std::unique_ptr<Drafter>(std::move(*d));
    }
    case DrafterChoice::Kind::kSelf: {
      auto d = ModelDrafter::CreateSelf(target_file, c.self_layers, backend, c.model);
      if (!d.ok()) return d.status();
      return std::unique_ptr<Drafter>(std::move(*d));
    }
    case DrafterChoice::Kind::kNgram: {
      auto d = NgramDrafter::Create(c.ngram);
      if (!d.ok()) return d.status();
      return std::unique_ptr<Drafter>(std::move(*d));
    }
  }
  return absl::InvalidArgumentError("unknown drafter kind");
}

}  // namespace specd::spec
