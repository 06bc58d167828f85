// The OpenAI HTTP API's JSON, translated to and from the router's own request and results. Pure
// functions (no network, no engine): a body becomes a specd.v1.GenerateRequest that THE request
// validator (request_validation.h) checks exactly as it checks gRPC requests; validation errors
// are renamed to the OpenAI parameter they came from; completions, stream chunks and errors are
// written in OpenAI's shapes.
#ifndef SPECD_SERVICES_ROUTER_HTTP_OPENAI_API_H_
#define SPECD_SERVICES_ROUTER_HTTP_OPENAI_API_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "specd/v1/generation.pb.h"

namespace specd::router::http {

enum class Endpoint { kChat, kCompletions };

// An error as OpenAI writes it: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
};

struct OpenAiRequest {
  Endpoint endpoint = Endpoint::kChat;
  specd::v1::GenerateRequest request;  // what THE validator checks
  std::string model;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // logprobs were asked for (chat: logprobs: true)
  int32_t top_logprobs = 0;    // alternatives per token (chat: top_logprobs; completions: logprobs)
  bool max_completion_tokens = false;  // the length came as max_completion_tokens
  bool return_token_ids = false;  // extension: stream chunks carry "token_ids" (load tools)
};

// Parses a request body (UTF-8 JSON object). Every invalid field is a 400 naming its param.
std::variant<OpenAiRequest, ApiError> ParseRequest(std::string_view body, Endpoint endpoint);

// The OpenAI parameter a validator field name ("sampling.temperature", "chat.messages[2].role")
// stands for ("temperature", "messages[2].role").
std::string ParamOf(std::string_view field, const OpenAiRequest& request);
// A status from validation or the engine as an OpenAI error (INVALID_ARGUMENT: 400 with the
// param named by the message's first word; RESOURCE_EXHAUSTED: 429; UNAVAILABLE: 503; ...).
ApiError ErrorFromStatus(const absl::Status& status, const OpenAiRequest* request);
std::string ErrorJson(const ApiError& error);

// What a response needs besides the engine's output.
struct ResponseMeta {
  std::string id;  // "chatcmpl-..." / "cmpl-..."
  int64_t created = 0;
  std::string model;
};

// Text pieces of the generated tokens, for logprobs (the tokenizer's bytes of each id).
struct TokenPiece {
  std::string text;
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;
};

const char* FinishReasonName(specd::v1::FinishReason reason);

// The unary response.
std::string CompletionJson(const OpenAiRequest& request, const ResponseMeta& meta,
                           const std::string& text, const std::vector<TokenPiece>& pieces,
                           const specd::v1::Completion& completion);
// One streamed chunk of new text (first: the chat chunk also carries the role); `token_ids`
// go out only with return_token_ids.
std::string ChunkJson(const OpenAiRequest& request, const ResponseMeta& meta,
                      const std::string& text, const std::vector<TokenPiece>& pieces,
                      bool first, const std::vector<int32_t>& token_ids = {});
// The closing chunk with finish_reason (and, with include_usage, the usage chunk after it).
std::vector<std::string> FinalChunksJson(const OpenAiRequest& request, const ResponseMeta& meta,
                                         const specd::v1::Completion& completion);
// GET /v1/models.
std::string ModelsJson(const std::vector<std::string>& models, int64_t created);

}  // namespace specd::router::http

#endif  // SPECD_SERVICES_ROUTER_HTTP_OPENAI_API_H_
