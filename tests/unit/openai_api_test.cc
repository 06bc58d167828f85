// The OpenAI JSON translation (services/router/http/openai_api.h) without a server: what each
// field becomes in the router's request, which param each error names, and the shapes of the
// responses (parsed back as JSON).
#include "services/router/http/openai_api.h"

#include <string>
#include <variant>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace specd::router::http {
namespace {

using json = nlohmann::json;

OpenAiRequest Parse(const std::string& body, Endpoint e = Endpoint::kChat) {
  auto r = ParseRequest(body, e);
  if (auto* err = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << body << " -> " << err->message;
    return {};
  }
  return std::get<OpenAiRequest>(r);
}

ApiError Error(const std::string& body, Endpoint e = Endpoint::kChat) {
  auto r = ParseRequest(body, e);
  if (auto* err = std::get_if<ApiError>(&r)) return *err;
  ADD_FAILURE() << body << " parsed";
  return {};
}

TEST(OpenAiApiTest, ChatFieldsMapOntoTheRouterRequest) {
  const OpenAiRequest r = Parse(R"({
    "model": "m", "messages": [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": [{"type": "text", "text": "a"},
                                                            {"type": "text", "text": "b"}]},
                               {"role": "assistant", "content": null}],
    "max_completion_tokens": 16, "temperature": 0.5, "top_p": 0.9, "seed": 7,
    "stop": ["x", "y"], "presence_penalty": 1, "frequency_penalty": -1,
    "logprobs": true, "top_logprobs": 3, "stream": true,
    "stream_options": {"include_usage": true},
    "top_k": 40, "min_p": 0.1, "repetition_penalty": 1.2, "ignore_eos": true,
    "speculation": {"mode": "ngram", "k": 3}, "user": "someone", "unknown_field": 1})");
  EXPECT_EQ(r.model, "m");
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 3);
  const specd::v1::GenerateRequest& g = r.request;
  ASSERT_EQ(g.chat().messages_size(), 3);
  EXPECT_EQ(g.chat().messages(1).content(), "ab");
  const specd::v1::SamplingOptions& s = g.sampling();
  EXPECT_EQ(s.max_new_tokens(), 16);
  EXPECT_FLOAT_EQ(s.temperature(), 0.5f);
  EXPECT_FLOAT_EQ(s.top_p(), 0.9f);
  EXPECT_EQ(s.seed(), 7u);
  ASSERT_EQ(s.stop_size(), 2);
  EXPECT_EQ(s.logprobs(), 3);
  EXPECT_EQ(s.top_k(), 40);
  EXPECT_FLOAT_EQ(s.min_p(), 0.1f);
  EXPECT_TRUE(s.ignore_eos());
  EXPECT_EQ(g.speculation().mode(), specd::v1::SPECULATION_MODE_NGRAM);
  EXPECT_EQ(g.speculation().num_draft_tokens(), 3);
}

TEST(OpenAiApiTest, CompletionPromptsTextOrTokenIdsButNoBatches) {
  EXPECT_EQ(Parse(R"({"model": "m", "prompt": "hi"})", Endpoint::kCompletions).request.prompt(),
            "hi");
  EXPECT_EQ(Parse(R"({"model": "m", "prompt": ["hi"]})", Endpoint::kCompletions).request.prompt(),
            "hi");
  EXPECT_EQ(
      Parse(R"({"model": "m", "prompt": [5, 6]})", Endpoint::kCompletions).request.tokens().ids_size(),
      2);
  EXPECT_EQ(Error(R"({"model": "m", "prompt": ["a", "b"]})", Endpoint::kCompletions).param,
            "prompt");
  const OpenAiRequest lp =
      Parse(R"({"model": "m", "prompt": "x", "logprobs": 0})", Endpoint::kCompletions);
  EXPECT_TRUE(lp.logprobs);
  EXPECT_EQ(lp.request.sampling().logprobs(), 1) << "the chosen token's logprob at least";
}

TEST(OpenAiApiTest, EveryBadFieldIsA400NamingIt) {
  const std::string m = R"("model": "m", "messages": [{"role": "user", "content": "x"}])";
  const std::pair<std::string, std::string> cases[] = {
      {R"({"temperature": "hot", )" + m + "}", "temperature"},
      {R"({"temperature": 1e400, )" + m + "}", ""},  // not JSON (out of double range)
      {R"({"max_tokens": 1.5, )" + m + "}", "max_tokens"},
      {R"({"max_tokens": 99999999999999999999, )" + m + "}", "max_tokens"},
      {R"({"seed": -3, )" + m + "}", "seed"},
      {R"({"n": 3, )" + m + "}", "n"},
      {R"({"stop": 5, )" + m + "}", "stop"},
      {R"({"stop": ["a", 1], )" + m + "}", "stop"},
      {R"({"stream": "yes", )" + m + "}", "stream"},
      {R"({"top_logprobs": 2, )" + m + "}", "top_logprobs"},
      {R"({"stream_options": {"include_usage": 1}, )" + m + "}", "stream_options.include_usage"},
      {R"({"speculation": {"mode": 3}, )" + m + "}", "speculation.mode"},
      {R"({"speculation": {"k": -1}, )" + m + "}", "speculation.k"},
      {R"({"user": 5, )" + m + "}", "user"},
      {R"({"model": "m", "messages": "hi"})", "messages"},
      {R"({"model": "m", "messages": [{"role": 1, "content": "x"}]})", "messages[0].role"},
      {R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content[0]"},
      {R"({"messages": [{"role": "user", "content": "x"}]})", "model"},
      {"[]", ""},
      {"{\"model\": \"\xff\"}", ""},  // not UTF-8
      {"", ""},
  };
  for (const auto& [body, param] : cases) {
    const ApiError e = Error(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, param) << body << " -> " << e.message;
    EXPECT_FALSE(e.message.empty()) << body;
  }
}

TEST(OpenAiApiTest, ValidatorFieldsAreRenamedToTheClientsParams) {
  OpenAiRequest chat;
  chat.endpoint = Endpoint::kChat;
  EXPECT_EQ(ParamOf("sampling.temperature", chat), "temperature");
  EXPECT_EQ(ParamOf("sampling.max_new_tokens", chat), "max_tokens");
  EXPECT_EQ(ParamOf("sampling.logprobs", chat), "top_logprobs");
  EXPECT_EQ(ParamOf("chat.messages[3].content", chat), "messages[3].content");
  EXPECT_EQ(ParamOf("speculation.num_draft_tokens", chat), "speculation.k");
  chat.max_completion_tokens = true;
  EXPECT_EQ(ParamOf("sampling.max_new_tokens", chat), "max_completion_tokens");
  OpenAiRequest comp;
  comp.endpoint = Endpoint::kCompletions;
  EXPECT_EQ(ParamOf("sampling.logprobs", comp), "logprobs");
  EXPECT_EQ(ParamOf("tokens.ids", comp), "prompt");

  const ApiError e = ErrorFromStatus(
      absl::InvalidArgumentError("sampling.top_p must be in (0, 1], got 0"), &chat);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "top_p");
  EXPECT_EQ(e.message, "top_p must be in (0, 1], got 0");
  EXPECT_EQ(ErrorFromStatus(absl::ResourceExhaustedError("queue full"), &chat).status, 429);
  EXPECT_EQ(ErrorFromStatus(absl::UnavailableError("draining"), &chat).status, 503);
  EXPECT_EQ(ErrorFromStatus(absl::InternalError("bug"), &chat).status, 500);
  const json j = json::parse(ErrorJson(e));
  EXPECT_EQ(j["error"]["param"], "top_p");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(j["error"]["code"].is_null());
}

TEST(OpenAiApiTest, ResponsesHaveOpenAisShapeAndTheSpeculationBlock) {
  OpenAiRequest r = Parse(R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
                              "logprobs": true, "top_logprobs": 1, "stream_options":
                              {"include_usage": true}})");
  ResponseMeta meta{"chatcmpl-1", 1700000000, "m"};
  specd::v1::Completion c;
  c.set_finish_reason(specd::v1::FINISH_REASON_LENGTH);
  c.mutable_usage()->set_prompt_tokens(5);
  c.mutable_usage()->set_completion_tokens(3);
  c.mutable_speculation()->set_draft_tokens(4);
  c.mutable_speculation()->set_accepted_tokens(3);
  c.mutable_speculation()->set_target_steps(2);
  c.mutable_speculation()->set_mean_accepted_length(1.5);
  const std::vector<TokenPiece> pieces{{"Hi", -0.5f, {{"Hi", -0.5f}}}};
  const json u = json::parse(CompletionJson(r, meta, "Hi", pieces, c));
  EXPECT_EQ(u["object"], "chat.completion");
  EXPECT_EQ(u["choices"][0]["message"]["content"], "Hi");
  EXPECT_EQ(u["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(u["choices"][0]["logprobs"]["content"][0]["token"], "Hi");
  EXPECT_EQ(u["usage"]["total_tokens"], 8);
  EXPECT_EQ(u["speculation"]["draft_tokens"], 4);
  EXPECT_DOUBLE_EQ(u["speculation"]["acceptance_rate"].get<double>(), 0.75);
  const json first = json::parse(ChunkJson(r, meta, "H", pieces, true));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  const json next = json::parse(ChunkJson(r, meta, "i", {}, false));
  EXPECT_FALSE(next["choices"][0]["delta"].contains("role"));
  const std::vector<std::string> last = FinalChunksJson(r, meta, c);
  ASSERT_EQ(last.size(), 2u) << "finish chunk, then the usage chunk (include_usage)";
  EXPECT_EQ(json::parse(last[0])["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(json::parse(last[1])["choices"].empty());
  EXPECT_EQ(json::parse(last[1])["usage"]["completion_tokens"], 3);
  // Text cut inside a UTF-8 character never breaks the JSON.
  EXPECT_NO_THROW(json::parse(ChunkJson(r, meta, "\xe2\x82", {}, false)));
  const json models = json::parse(ModelsJson({"m"}, 1));
  EXPECT_EQ(models["data"][0]["id"], "m");
}

}  // namespace
}  // namespace specd::router::http
