#include "common/tokenizer/vocab.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace specd::tok {
namespace {

// Optional integer key: -1 when absent; errors (wrong type) propagate.
absl::StatusOr<int32_t> OptionalId(const gguf::GgufFile& file, std::string_view key) {
  if (file.Find(key) == nullptr) return -1;
  absl::StatusOr<int64_t> v = file.GetInt(key);
  if (!v.ok()) return v.status();
  return static_cast<int32_t>(*v);
}

absl::StatusOr<bool> OptionalBool(const gguf::GgufFile& file, std::string_view key, bool dflt) {
  if (file.Find(key) == nullptr) return dflt;
  return file.GetBool(key);
}

}  // namespace

absl::Status Vocab::Validate() const {
  if (tokens.empty()) {
    return absl::InvalidArgumentError("tokenizer.ggml.tokens is empty");
  }
  if (!scores.empty() && scores.size() != tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer.ggml.scores has ", scores.size(), " entries but there are ", tokens.size(),
        " tokens"));
  }
  if (!types.empty() && types.size() != tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer.ggml.token_type has ", types.size(), " entries but there are ",
        tokens.size(), " tokens"));
  }
  for (size_t i = 0; i < types.size(); ++i) {
    const auto t = static_cast<int32_t>(types[i]);
    if (t < 0 || t > 6) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.ggml.token_type[", i, "] = ", t, " is not a known type"));
    }
  }
  const std::pair<const char*, int32_t> ids[] = {
      {"tokenizer.ggml.bos_token_id", bos_id},     {"tokenizer.ggml.eos_token_id", eos_id},
      {"tokenizer.ggml.eot_token_id", eot_id},     {"tokenizer.ggml.unknown_token_id", unk_id},
      {"tokenizer.ggml.padding_token_id", pad_id},
  };
  for (const auto& [key, id] : ids) {
    if (id < -1 || id >= size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, " = ", id, " is outside the vocabulary of ", size(), " tokens"));
    }
  }
  if (model == ModelKind::kByteLevelBpe && merges.empty()) {
    return absl::InvalidArgumentError(
        "tokenizer.ggml.merges is missing or empty (required for tokenizer.ggml.model gpt2)");
  }
  if (model == ModelKind::kSentencePieceBpe && scores.empty()) {
    return absl::InvalidArgumentError(
        "tokenizer.ggml.scores is missing (required for tokenizer.ggml.model llama)");
  }
  return absl::OkStatus();
}

absl::StatusOr<Vocab> LoadVocab(const gguf::GgufFile& file) {
  Vocab v;
  absl::StatusOr<std::string> model = file.GetString("tokenizer.ggml.model");
  if (!model.ok()) return model.status();
  if (*model == "gpt2") {
    v.model = ModelKind::kByteLevelBpe;
  } else if (*model == "llama") {
    v.model = ModelKind::kSentencePieceBpe;
  } else {
    return absl::UnimplementedError(absl::StrCat(
        "tokenizer.ggml.model = \"", *model, "\" is not supported (supported: gpt2, llama)"));
  }

  absl::StatusOr<std::vector<std::string>> tokens = file.GetStringArray("tokenizer.ggml.tokens");
  if (!tokens.ok()) return tokens.status();
  v.tokens = *std::move(tokens);

  if (file.Find("tokenizer.ggml.pre") != nullptr) {
    absl::StatusOr<std::string> pre = file.GetString("tokenizer.ggml.pre");
    if (!pre.ok()) return pre.status();
    v.pre = *std::move(pre);
  }
  if (file.Find("tokenizer.ggml.scores") != nullptr) {
    absl::StatusOr<std::vector<float>> scores = file.GetFloatArray("tokenizer.ggml.scores");
    if (!scores.ok()) return scores.status();
    v.scores = *std::move(scores);
  }
  if (file.Find("tokenizer.ggml.token_type") != nullptr) {
    absl::StatusOr<std::vector<int64_t>> types = file.GetIntArray("tokenizer.ggml.token_type");
    if (!types.ok()) return types.status();
    v.types.reserve(types->size());
    for (int64_t t : *types) v.types.push_back(static_cast<TokenType>(t));
  }
  if (file.Find("tokenizer.ggml.merges") != nullptr) {
    absl::StatusOr<std::vector<std::string>> merges = file.GetStringArray("tokenizer.ggml.merges");
    if (!merges.ok()) return merges.status();
    v.merges = *std::move(merges);
  }

  const std::pair<const char*, int32_t*> ids[] = {
      {"tokenizer.ggml.bos_token_id", &v.bos_id},
      {"tokenizer.ggml.eos_token_id", &v.eos_id},
      {"tokenizer.ggml.eot_token_id", &v.eot_id},
      {"tokenizer.ggml.unknown_token_id", &v.unk_id},
      {"tokenizer.ggml.padding_token_id", &v.pad_id},
  };
  for (const auto& [key, dst] : ids) {
    absl::StatusOr<int32_t> id = OptionalId(file, key);
    if (!id.ok()) return id.status();
    *dst = *id;
  }
  const bool spm = v.model == ModelKind::kSentencePieceBpe;
  absl::StatusOr<bool> b = OptionalBool(file, "tokenizer.ggml.add_bos_token", spm);
  if (!b.ok()) return b.status();
  v.add_bos = *b;
  b = OptionalBool(file, "tokenizer.ggml.add_eos_token", false);
  if (!b.ok()) return b.status();
  v.add_eos = *b;
  b = OptionalBool(file, "tokenizer.ggml.add_space_prefix", spm);
  if (!b.ok()) return b.status();
  v.add_space_prefix = *b;

  if (absl::Status s = v.Validate(); !s.ok()) return s;
  return v;
}

}  // namespace specd::tok
