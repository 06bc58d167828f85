// libFuzzer target: any bytes as an OpenAI HTTP API request body (chat and completions). The
// parser must answer every input with a request or a 400 naming the field, never crash, and
// whatever it answers must serialize (errors, and the responses built from a parsed request).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "absl/status/status.h"
#include "services/router/http/openai_api.h"

namespace h = specd::router::http;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (h::Endpoint e : {h::Endpoint::kChat, h::Endpoint::kCompletions}) {
    std::variant<h::OpenAiRequest, h::ApiError> r = h::ParseRequest(body, e);
    if (auto* err = std::get_if<h::ApiError>(&r)) {
      if (err->status != 400 || err->message.empty()) __builtin_trap();
      (void)h::ErrorJson(*err);  // a string: nothing to check beyond not crashing
      continue;
    }
    const h::OpenAiRequest& req = std::get<h::OpenAiRequest>(r);
    // The validator's messages start with a field name; any text must map without crashing.
    const h::ApiError mapped =
        h::ErrorFromStatus(absl::InvalidArgumentError(std::string(body.substr(0, 64))), &req);
    (void)h::ErrorJson(mapped);
    h::ResponseMeta meta{"id", 0, req.model};
    specd::v1::Completion c;
    std::vector<h::TokenPiece> pieces{{std::string(body.substr(0, 8)), -1.0f, {{"a", -2.0f}}}};
    (void)h::CompletionJson(req, meta, std::string(body.substr(0, 16)), pieces, c);
    (void)h::ChunkJson(req, meta, std::string(body.substr(0, 16)), pieces, true);
    (void)h::FinalChunksJson(req, meta, c);
  }
  return 0;
}
