// libFuzzer target: any bytes as the payload of a Generation call, handled as the router
// handles it (services/router/router_service.cc): parse (services/common/wire_parse), then
// validate (services/router/request_validation) against a tiny model's tokenizer and chat
// template. Every input must end in a request or INVALID_ARGUMENT with a message; nothing
// crashes. The same bytes as a TokenizeRequest go through the same parser.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "common/gguf/gguf_file.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "google/protobuf/stubs/logging.h"
#include "services/common/wire_parse.h"
#include "services/router/request_validation.h"
#include "testing/tiny_model.h"

namespace {

struct Model {
  std::unique_ptr<specd::gguf::GgufFile> file;
  std::unique_ptr<specd::tok::Tokenizer> tokenizer;
  std::unique_ptr<specd::tok::ChatTemplate> chat;
  specd::router::ModelLimits limits;
};

Model* Load() {
  auto* m = new Model;
  const std::string path =
      (std::filesystem::temp_directory_path() / "specd_router_fuzz_model.gguf").string();
  specd::testing::TinyModelSpec spec;
  if (!specd::testing::WriteTinyModel(spec, path).ok()) __builtin_trap();
  auto file = specd::gguf::GgufFile::Open(path);
  if (!file.ok()) __builtin_trap();
  m->file = std::move(*file);
  auto tokenizer = specd::tok::Tokenizer::FromGguf(*m->file);
  auto chat = specd::tok::ChatTemplate::FromGguf(*m->file);
  if (!tokenizer.ok() || !chat.ok()) __builtin_trap();
  m->tokenizer = std::move(*tokenizer);
  m->chat = std::make_unique<specd::tok::ChatTemplate>(std::move(*chat));
  m->limits.vocab_size = m->tokenizer->vocab_size();
  m->limits.context_length = 512;
  m->limits.max_new_tokens = 256;
  m->limits.max_prompt_bytes = 1 << 16;
  m->limits.draft_available = true;
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 is expected, not news
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Model* model = Load();
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto expect_named = [](const absl::Status& s) {
    if (s.code() != absl::StatusCode::kInvalidArgument || s.message().empty()) __builtin_trap();
  };
  specd::v1::GenerateRequest request;
  absl::Status parsed = specd::services::ParseMessage(bytes, &request);
  if (!parsed.ok()) {
    expect_named(parsed);
  } else {
    absl::StatusOr<specd::router::ValidatedRequest> v = specd::router::ValidateRequest(
        request, *model->tokenizer, model->chat.get(), model->limits);
    if (!v.ok()) {
      expect_named(v.status());
    } else if (v->prompt.empty() || v->max_new_tokens < 1) {
      __builtin_trap();  // validation let through what the engine cannot run
    }
  }
  specd::v1::TokenizeRequest tokenize;
  absl::Status t = specd::services::ParseMessage(bytes, &tokenize);
  if (!t.ok()) expect_named(t);
  return 0;
}
