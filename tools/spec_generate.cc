#include "tools/spec_generate.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/backend_factory.h"
#include "engine/backend.h"
#include "engine/communicator.h"
#include "engine/llama_model.h"
#include "common/gguf/gguf_file.h"
#include "speculation/ngram_drafter.h"
#include "speculation/spec_engine.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/detokenizer.h"
#include "common/tokenizer/tokenizer.h"

namespace specd {

absl::StatusOr<bool> ParseSpecFlag(int argc, char** argv, int* i, SpecGenerateOptions* o) {
  const std::string_view f = argv[*i];
  auto value = [&]() -> absl::StatusOr<std::string> {
    if (*i + 1 >= argc) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(f), ": missing value"));
    }
    return std::string(argv[++*i]);
  };
  if (f == "--draft") {
    // `--draft` alone (last, or before another flag) = `--draft default`: the shipped draft.
    const bool bare = *i + 1 >= argc || argv[*i + 1][0] == '-';
    absl::StatusOr<std::string> v = bare ? absl::StatusOr<std::string>("default") : value();
    if (!v.ok()) return v.status();
    o->drafter.kind = spec::DrafterChoice::Kind::kModel;
    o->drafter.draft_path = *v;
  } else if (f == "--self-draft") {
    absl::StatusOr<std::string> v = value();
    if (!v.ok()) return v.status();
    o->drafter.kind = spec::DrafterChoice::Kind::kSelf;
    if (!absl::SimpleAtoi(*v, &o->drafter.self_layers)) {
      return absl::InvalidArgumentError(absl::StrCat("--self-draft: not a layer count: ", *v));
    }
  } else if (f == "--ngram") {
    o->drafter.kind = spec::DrafterChoice::Kind::kNgram;
  } else if (f == "--no-lookup") {
    o->lookup = false;
  } else if (f == "--k") {
    absl::StatusOr<std::string> v = value();
    if (!v.ok()) return v.status();
    if (*v == "auto") {
      o->adaptive_k = true;
      o->k = 8;
    } else if (!absl::SimpleAtoi(*v, &o->k) || o->k < 0 || o->k > 32) {
      return absl::InvalidArgumentError(absl::StrCat("--k: expected 0..32 or auto, got ", *v));
    }
  } else if (f == "--draft-min-keep" || f == "--draft-min-extend") {
    absl::StatusOr<std::string> v = value();
    if (!v.ok()) return v.status();
    double& p = f == "--draft-min-keep" ? o->draft_min_keep : o->draft_min_extend;
    if (!absl::SimpleAtod(*v, &p) || !(p >= 0.0 && p <= 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(f), ": expected a probability in [0, 1], got ", *v));
    }
  } else if (f == "--target-weights") {
    absl::StatusOr<std::string> v = value();
    if (!v.ok()) return v.status();
    if (*v == "f16") {
      o->target_weights = gguf::GgmlType::kF16;
    } else if (*v == "bf16") {
      o->target_weights = gguf::GgmlType::kBF16;
    } else if (*v == "f32") {
      o->target_weights = gguf::GgmlType::kF32;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--target-weights: unknown value ", *v));
    }
  } else {
    return false;
  }
  return true;
}

namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

absl::Status SpecGenerate(const SpecGenerateOptions& a) {
  auto file = gguf::GgufFile::Open(a.model);
  if (!file.ok()) return file.status();
  auto tokenizer = tok::Tokenizer::FromGguf(**file);
  if (!tokenizer.ok()) return tokenizer.status();
  const tok::Tokenizer& tk = **tokenizer;
  std::string text = a.prompt;
  if (a.chat) {
    auto tmpl = tok::ChatTemplate::FromGguf(**file);
    if (!tmpl.ok()) return tmpl.status();
    const tok::ChatMessage msg{"user", a.prompt};
    auto applied = tmpl->Apply({&msg, 1}, /*add_generation_prompt=*/true);
    if (!applied.ok()) return applied.status();
    text = *applied;
  }
  auto prompt = tk.Encode(text, /*add_special=*/true, /*parse_special=*/a.chat);
  if (!prompt.ok()) return prompt.status();

  absl::StatusOr<std::unique_ptr<engine::Backend>> made = engine::MakeBackend(a.device, a.threads);
  if (!made.ok()) return made.status();
  std::unique_ptr<engine::Backend> backend = std::move(*made);
  engine::LocalCommunicator comm;
  engine::ModelOptions mo;
  mo.max_batch_tokens = 256;
  mo.max_logit_rows = 64;
  mo.reencode_weights = a.target_weights;
  auto model = engine::LlamaModel::Load(**file, backend.get(), &comm, mo);
  if (!model.ok()) return model.status();

  const int64_t total = static_cast<int64_t>(prompt->size()) + a.max_new_tokens + a.k + 1;
  const int32_t blocks = a.kv_blocks > 0 ? a.kv_blocks : static_cast<int32_t>(total / 16 + 2);
  spec::DrafterChoice choice = a.drafter;
  if (choice.kind == spec::DrafterChoice::Kind::kModel && choice.draft_path == "default") {
    std::error_code ec;  // no /proc: only $SPECD_DRAFTS_DIR and the target's directory
    const std::string exe_dir =
        !a.exe_dir.empty()
            ? a.exe_dir
            : std::filesystem::read_symlink("/proc/self/exe", ec).parent_path().string();
    absl::StatusOr<std::string> shipped = spec::ShippedDraftFor(a.model, exe_dir);
    if (!shipped.ok()) return shipped.status();
    choice.draft_path = *shipped;
  }
  choice.model.kv_blocks = blocks;
  choice.model.kv_dtype = a.kv_dtype;
  choice.model.min_keep = a.draft_min_keep;
  choice.model.min_extend = a.draft_min_extend;
  auto drafter = spec::MakeDrafter(choice, **file, a.model, backend.get());
  if (!drafter.ok()) return drafter.status();

  spec::SpecEngineOptions eo;
  eo.max_batch_tokens = 256;
  eo.max_running = 1;
  eo.kv_blocks = blocks;
  eo.kv_dtype = a.kv_dtype;
  eo.k = a.k;
  eo.adaptive_k = a.adaptive_k;
  for (int32_t id = 0; id < tk.vocab_size(); ++id) {
    if (tk.IsEndOfGeneration(id)) eo.eos_token_ids.push_back(id);
  }
  // As the router's "auto": with adaptive k, a model draft gets the n-gram lookup in front.
  std::unique_ptr<spec::NgramDrafter> lookup;
  if (a.adaptive_k && a.lookup && (*drafter)->runs_model()) {
    absl::StatusOr<std::unique_ptr<spec::NgramDrafter>> n =
        spec::NgramDrafter::Create(spec::NgramDrafterOptions{});
    if (!n.ok()) return n.status();
    lookup = std::move(*n);
    eo.lookup = lookup.get();
  }
  auto engine = spec::SpecEngine::Create(model->get(), drafter->get(), eo);
  if (!engine.ok()) return engine.status();

  tok::StreamingDetokenizer detok(tk, /*skip_special=*/true);
  (*engine)->SetStreamCallback(
      [&](spec::RequestId, absl::Span<const int32_t> tokens, spec::FinishReason) {
        for (int32_t t : tokens) {
          if (!a.params.ignore_eos && tk.IsEndOfGeneration(t)) continue;
          std::fputs(detok.Append(t).c_str(), stdout);
        }
        std::fflush(stdout);
      });
  spec::SpecRequest req;
  req.prompt = *prompt;
  req.params = a.params;
  req.max_new_tokens = a.max_new_tokens;
  auto id = (*engine)->Admit(std::move(req));
  if (!id.ok()) return id.status();
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status st = (*engine)->RunToCompletion();
  if (!st.ok()) return st;
  const double secs = Since(t0);
  auto result = (*engine)->TakeResult(*id);
  if (!result.ok()) return result.status();
  if (!result->status.ok()) return result->status;
  std::fputs(detok.Finish().c_str(), stdout);
  std::fputs("\n", stdout);
  std::fprintf(stderr,
               "\n[specd] %s, k %s: prompt %zu tokens + %zu generated in %.3f s (%.1f tok/s "
               "including prefill); finish: %s\n%s\n",
               (choice.Describe() + (lookup != nullptr ? " after the n-gram lookup" : "")).c_str(),
               a.adaptive_k ? absl::StrCat("auto<=", a.k).c_str() : absl::StrCat(a.k).c_str(),
               prompt->size(), result->tokens.size(), secs, result->tokens.size() / secs,
               spec::FinishReasonName(result->finish), (*engine)->stats().ToString().c_str());
  return absl::OkStatus();
}

}  // namespace specd
