#include "services/router/http/openai_api.h"

#include <cmath>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace specd::router::http {
namespace {

using json = nlohmann::json;
namespace v1 = specd::v1;

ApiError Bad(std::string param, std::string message) {
  ApiError e;
  e.status = 400;
  e.param = std::move(param);
  e.message = std::move(message);
  return e;
}

// Typed reads of optional fields: absent or null -> nullopt; the wrong type -> error.
class Fields {
 public:
  explicit Fields(const json& body) : body_(body) {}
  std::optional<ApiError> error;

  const json* Get(const char* key) {
    auto it = body_.find(key);
    if (it == body_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  std::optional<double> Number(const char* key, double lo, double hi) {
    const json* v = Get(key);
    if (v == nullptr || error) return std::nullopt;
    if (!v->is_number()) return Fail(key, "must be a number");
    const double d = v->get<double>();
    if (!std::isfinite(d) || d < lo || d > hi) {
      return Fail(key, absl::StrCat("must be in [", lo, ", ", hi, "]"));
    }
    return d;
  }
  std::optional<int64_t> Integer(const char* key, int64_t lo, int64_t hi) {
    const json* v = Get(key);
    if (v == nullptr || error) return std::nullopt;
    if (!v->is_number_integer()) return Fail(key, "must be an integer");
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi)) {
      return Fail(key, absl::StrCat("must be in [", lo, ", ", hi, "]"));
    }
    const int64_t i = v->get<int64_t>();
    if (i < lo || i > hi) return Fail(key, absl::StrCat("must be in [", lo, ", ", hi, "]"));
    return i;
  }
  std::optional<uint64_t> Seed(const char* key) {
    const json* v = Get(key);
    if (v == nullptr || error) return std::nullopt;
    if (!v->is_number_integer()) return Fail(key, "must be an integer");
    if (!v->is_number_unsigned() && v->get<int64_t>() < 0) return Fail(key, "must be >= 0");
    return v->get<uint64_t>();
  }
  std::optional<bool> Bool(const char* key) {
    const json* v = Get(key);
    if (v == nullptr || error) return std::nullopt;
    if (!v->is_boolean()) return Fail(key, "must be true or false");
    return v->get<bool>();
  }
  std::optional<std::string> String(const char* key) {
    const json* v = Get(key);
    if (v == nullptr || error) return std::nullopt;
    if (!v->is_string()) return Fail(key, "must be a string");
    return v->get<std::string>();
  }

 private:
  std::nullopt_t Fail(const std::string& key, const std::string& what) {
    if (!error) error = Bad(key, absl::StrCat(key, " ", what));
    return std::nullopt;
  }
  const json& body_;
};

// messages -> the request's chat input. content: a string or a list of {"type":"text"} parts.
std::optional<ApiError> ParseMessages(const json* messages, v1::GenerateRequest& out) {
  if (messages == nullptr) return Bad("messages", "messages is required");
  if (!messages->is_array()) return Bad("messages", "messages must be an array");
  v1::ChatMessages* chat = out.mutable_chat();
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return Bad(where, where + " must be an object");
    v1::ChatMessage* cm = chat->add_messages();
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return Bad(where + ".role", where + ".role must be a string");
    }
    cm->set_role(role->get<std::string>());
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) continue;  // e.g. an assistant turn
    if (content->is_string()) {
      cm->set_content(content->get<std::string>());
      continue;
    }
    if (!content->is_array()) {
      return Bad(where + ".content", where + ".content must be a string or a list of parts");
    }
    std::string text;
    for (size_t j = 0; j < content->size(); ++j) {
      const json& part = (*content)[j];
      const std::string pw = absl::StrCat(where, ".content[", j, "]");
      auto type = part.is_object() ? part.find("type") : part.end();
      if (!part.is_object() || type == part.end() || *type != "text") {
        return Bad(pw, pw + " must be a {\"type\": \"text\"} part (only text is supported)");
      }
      auto t = part.find("text");
      if (t == part.end() || !t->is_string()) return Bad(pw + ".text", pw + ".text must be a string");
      text += t->get<std::string>();
    }
    cm->set_content(text);
  }
  return std::nullopt;
}

// prompt -> text or token ids. One prompt per request (n = 1 and no batches).
std::optional<ApiError> ParsePrompt(const json* prompt, v1::GenerateRequest& out) {
  if (prompt == nullptr) return Bad("prompt", "prompt is required");
  if (prompt->is_string()) {
    out.set_prompt(prompt->get<std::string>());
    return std::nullopt;
  }
  if (!prompt->is_array()) return Bad("prompt", "prompt must be a string or a list");
  if (prompt->size() == 1 && (*prompt)[0].is_string()) {
    out.set_prompt((*prompt)[0].get<std::string>());
    return std::nullopt;
  }
  if (!prompt->empty() && (*prompt)[0].is_number_integer()) {
    for (const json& t : *prompt) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
          t.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return Bad("prompt", "prompt token ids must be non-negative integers");
      }
      out.mutable_tokens()->add_ids(static_cast<int32_t>(t.get<int64_t>()));
    }
    return std::nullopt;
  }
  return Bad("prompt",
             "prompt must be one string or one list of token ids: batches of prompts are not "
             "supported (send one request per prompt)");
}

std::optional<ApiError> ParseStop(const json* stop, v1::SamplingOptions& s) {
  if (stop == nullptr) return std::nullopt;
  if (stop->is_string()) {
    s.add_stop(stop->get<std::string>());
    return std::nullopt;
  }
  if (!stop->is_array()) return Bad("stop", "stop must be a string or a list of strings");
  for (const json& x : *stop) {
    if (!x.is_string()) return Bad("stop", "stop must be a string or a list of strings");
    s.add_stop(x.get<std::string>());
  }
  return std::nullopt;
}

std::optional<ApiError> ParseSpeculation(const json* sp, v1::GenerateRequest& out) {
  if (sp == nullptr) return std::nullopt;
  if (!sp->is_object()) return Bad("speculation", "speculation must be an object {mode, k}");
  v1::SpeculationOptions* o = out.mutable_speculation();
  if (auto mode = sp->find("mode"); mode != sp->end() && !mode->is_null()) {
    if (!mode->is_string()) return Bad("speculation.mode", "speculation.mode must be a string");
    const std::string m = mode->get<std::string>();
    if (m == "off") o->set_mode(v1::SPECULATION_MODE_OFF);
    else if (m == "auto") o->set_mode(v1::SPECULATION_MODE_AUTO);
    else if (m == "draft") o->set_mode(v1::SPECULATION_MODE_DRAFT);
    else if (m == "ngram") o->set_mode(v1::SPECULATION_MODE_NGRAM);
    else if (m == "self") o->set_mode(v1::SPECULATION_MODE_SELF);
    else {
      return Bad("speculation.mode",
                 "speculation.mode must be one of off, auto, draft, ngram, self");
    }
  }
  if (auto k = sp->find("k"); k != sp->end() && !k->is_null()) {
    if (!k->is_number_integer() || k->get<int64_t>() < 0 || k->get<int64_t>() > 1024) {
      return Bad("speculation.k", "speculation.k must be an integer >= 0 (0 = adaptive)");
    }
    o->set_num_draft_tokens(static_cast<int32_t>(k->get<int64_t>()));
  }
  return std::nullopt;
}

}  // namespace

std::variant<OpenAiRequest, ApiError> ParseRequest(std::string_view body, Endpoint endpoint) {
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return Bad("", "the body is not valid JSON (UTF-8 text holding one object)");
  }
  if (!j.is_object()) return Bad("", "the body must be a JSON object");
  OpenAiRequest r;
  r.endpoint = endpoint;
  v1::GenerateRequest& g = r.request;
  v1::SamplingOptions& s = *g.mutable_sampling();
  Fields f(j);
  if (auto model = f.String("model")) r.model = *model;
  if (f.error) return *f.error;
  if (r.model.empty()) return Bad("model", "model is required (GET /v1/models lists it)");
  const std::optional<ApiError> input = endpoint == Endpoint::kChat
                                            ? ParseMessages(f.Get("messages"), g)
                                            : ParsePrompt(f.Get("prompt"), g);
  if (input) return *input;
  if (endpoint == Endpoint::kCompletions && g.has_prompt()) g.set_add_special_tokens(true);
  if (auto n = f.Integer("n", 1, 1 << 20); n && *n != 1) {
    return Bad("n", "n must be 1: one choice per request is supported");
  }
  if (f.error) return *f.error;
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  std::optional<int64_t> max_tokens = f.Integer("max_tokens", 1, kMaxInt);
  if (auto mct = f.Integer("max_completion_tokens", 1, kMaxInt)) {
    max_tokens = mct;
    r.max_completion_tokens = true;
  }
  if (max_tokens) s.set_max_new_tokens(static_cast<int32_t>(*max_tokens));
  if (auto t = f.Number("temperature", 0, 2)) s.set_temperature(static_cast<float>(*t));
  if (auto p = f.Number("top_p", 0, 1)) s.set_top_p(static_cast<float>(*p));
  if (auto p = f.Number("presence_penalty", -2, 2)) s.set_presence_penalty(static_cast<float>(*p));
  if (auto p = f.Number("frequency_penalty", -2, 2)) {
    s.set_frequency_penalty(static_cast<float>(*p));
  }
  if (auto seed = f.Seed("seed")) s.set_seed(*seed);
  // Extensions in the body, as vLLM takes them.
  if (auto k = f.Integer("top_k", -1, kMaxInt)) s.set_top_k(static_cast<int32_t>(std::max<int64_t>(*k, 0)));
  if (auto p = f.Number("min_p", 0, 1)) s.set_min_p(static_cast<float>(*p));
  if (auto p = f.Number("repetition_penalty", 0, 1e9)) {
    s.set_repetition_penalty(static_cast<float>(*p));
  }
  if (auto b = f.Bool("ignore_eos")) s.set_ignore_eos(*b);
  if (auto st = f.Bool("stream")) r.stream = *st;
  if (auto ids = f.Bool("return_token_ids")) r.return_token_ids = *ids;
  (void)f.String("user");  // accepted and unused: a value of the wrong type is still a 400
  if (f.error) return *f.error;
  // logprobs: chat takes a bool and top_logprobs; completions an integer (the top-n).
  if (endpoint == Endpoint::kChat) {
    if (auto lp = f.Bool("logprobs")) r.logprobs = *lp;
    const std::optional<int64_t> top = f.Integer("top_logprobs", 0, 20);
    if (f.error) return *f.error;
    if (top && !r.logprobs) return Bad("top_logprobs", "top_logprobs needs logprobs: true");
    r.top_logprobs = static_cast<int32_t>(top.value_or(0));
  } else if (auto lp = f.Integer("logprobs", 0, 5)) {
    r.logprobs = true;
    r.top_logprobs = static_cast<int32_t>(*lp);
  }
  // The engine reports the chosen token's logprob with its top-n: at least one.
  if (r.logprobs) s.set_logprobs(std::max(1, r.top_logprobs));
  if (f.error) return *f.error;
  if (const json* so = f.Get("stream_options")) {
    if (!so->is_object()) return Bad("stream_options", "stream_options must be an object");
    auto iu = so->find("include_usage");
    if (iu != so->end() && !iu->is_null()) {
      if (!iu->is_boolean()) {
        return Bad("stream_options.include_usage", "stream_options.include_usage must be a bool");
      }
      r.include_usage = iu->get<bool>();
    }
  }
  if (auto e = ParseStop(f.Get("stop"), s)) return *e;
  if (auto e = ParseSpeculation(f.Get("speculation"), g)) return *e;
  return r;
}

std::string ParamOf(std::string_view field, const OpenAiRequest& request) {
  auto strip = [&](std::string_view prefix) {
    return field.starts_with(prefix) ? field.substr(prefix.size()) : std::string_view();
  };
  if (field == "sampling.max_new_tokens") {
    return request.max_completion_tokens ? "max_completion_tokens" : "max_tokens";
  }
  if (field == "sampling.logprobs") {
    return request.endpoint == Endpoint::kChat ? "top_logprobs" : "logprobs";
  }
  if (field == "speculation.num_draft_tokens") return "speculation.k";
  if (auto rest = strip("sampling."); !rest.empty()) return std::string(rest);
  if (auto rest = strip("chat."); !rest.empty()) return std::string(rest);
  if (field == "chat") return "messages";
  if (field == "tokens.ids" || field == "input") return "prompt";
  return std::string(field);
}

ApiError ErrorFromStatus(const absl::Status& status, const OpenAiRequest* request) {
  ApiError e;
  e.message = std::string(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange: {
      e.status = 400;
      const std::string msg(status.message());
      std::string field = msg.substr(0, msg.find(' '));
      if (!field.empty() && field.back() == ':') field.pop_back();
      if (request != nullptr) {
        e.param = ParamOf(field, *request);
        // Say it with the client's name for the field.
        if (e.param != field) e.message = absl::StrCat(e.param, msg.substr(field.size()));
      }
      break;
    }
    case absl::StatusCode::kUnauthenticated:
      e.status = 401;
      e.code = "invalid_api_key";
      break;
    case absl::StatusCode::kResourceExhausted:
      e.status = 429;
      e.type = "rate_limit_error";
      e.code = "rate_limit_exceeded";
      break;
    case absl::StatusCode::kUnavailable:
      e.status = 503;
      e.type = "service_unavailable";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.status = 504;
      e.type = "timeout";
      break;
    case absl::StatusCode::kNotFound:
      e.status = 404;
      e.type = "not_found_error";
      break;
    case absl::StatusCode::kCancelled:
      e.status = 499;
      e.type = "cancelled";
      break;
    default:
      e.status = 500;
      e.type = "internal_error";
  }
  return e;
}

std::string ErrorJson(const ApiError& error) {
  json e = {{"message", error.message}, {"type", error.type}};
  e["param"] = error.param.empty() ? json(nullptr) : json(error.param);
  e["code"] = error.code.empty() ? json(nullptr) : json(error.code);
  return json{{"error", e}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

const char* FinishReasonName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_LENGTH:
      return "length";
    default:
      return "stop";
  }
}

namespace {

json Usage(const v1::Completion& c) {
  return {{"prompt_tokens", c.usage().prompt_tokens()},
          {"completion_tokens", c.usage().completion_tokens()},
          {"total_tokens", c.usage().prompt_tokens() + c.usage().completion_tokens()},
          // OpenAI's field for prompt tokens served from the prompt cache.
          {"prompt_tokens_details", {{"cached_tokens", c.usage().cached_prompt_tokens()}}}};
}

// Per request, what speculation did: users of every serving system ask for this.
json Speculation(const v1::Completion& c) {
  const v1::SpeculationStats& s = c.speculation();
  return {{"draft_tokens", s.draft_tokens()},
          {"accepted_tokens", s.accepted_tokens()},
          {"acceptance_rate",
           s.draft_tokens() > 0 ? static_cast<double>(s.accepted_tokens()) / s.draft_tokens()
                                : 0.0},
          {"mean_accepted_length", s.mean_accepted_length()},
          {"target_steps", s.target_steps()}};
}

json Bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

json ChatLogprobs(const std::vector<TokenPiece>& pieces) {
  json content = json::array();
  for (const TokenPiece& p : pieces) {
    json top = json::array();
    for (const auto& [t, lp] : p.top) {
      top.push_back({{"token", t}, {"logprob", lp}, {"bytes", Bytes(t)}});
    }
    content.push_back(
        {{"token", p.text}, {"logprob", p.logprob}, {"bytes", Bytes(p.text)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

json CompletionLogprobs(const std::vector<TokenPiece>& pieces) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  size_t offset = 0;
  for (const TokenPiece& p : pieces) {
    tokens.push_back(p.text);
    lps.push_back(p.logprob);
    json top = json::object();
    for (const auto& [t, lp] : p.top) top[t] = lp;
    tops.push_back(top);
    offs.push_back(offset);
    offset += p.text.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

std::string Dump(const json& j) {
  // Text may end inside a multi-byte character only at the very end of a stream; never
  // crash on it.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json Envelope(const OpenAiRequest& request, const ResponseMeta& meta, bool chunk) {
  const bool chat = request.endpoint == Endpoint::kChat;
  return {{"id", meta.id},
          {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                          : "text_completion"},
          {"created", meta.created},
          {"model", meta.model}};
}

}  // namespace

std::string CompletionJson(const OpenAiRequest& request, const ResponseMeta& meta,
                           const std::string& text, const std::vector<TokenPiece>& pieces,
                           const v1::Completion& completion) {
  json r = Envelope(request, meta, false);
  json choice = {{"index", 0}, {"finish_reason", FinishReasonName(completion.finish_reason())}};
  const bool chat = request.endpoint == Endpoint::kChat;
  if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = !request.logprobs ? json(nullptr)
                       : chat            ? ChatLogprobs(pieces)
                                         : CompletionLogprobs(pieces);
  r["choices"] = json::array({choice});
  r["usage"] = Usage(completion);
  r["speculation"] = Speculation(completion);
  r["system_fingerprint"] = nullptr;
  return Dump(r);
}

std::string ChunkJson(const OpenAiRequest& request, const ResponseMeta& meta,
                      const std::string& text, const std::vector<TokenPiece>& pieces,
                      bool first, const std::vector<int32_t>& token_ids) {
  json r = Envelope(request, meta, true);
  json choice = {{"index", 0}, {"finish_reason", nullptr}};
  const bool chat = request.endpoint == Endpoint::kChat;
  if (chat) {
    json delta = {{"content", text}};
    if (first) delta["role"] = "assistant";
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = !request.logprobs ? json(nullptr)
                       : chat            ? ChatLogprobs(pieces)
                                         : CompletionLogprobs(pieces);
  if (request.return_token_ids) choice["token_ids"] = token_ids;
  r["choices"] = json::array({choice});
  if (request.include_usage) r["usage"] = nullptr;
  return Dump(r);
}

std::vector<std::string> FinalChunksJson(const OpenAiRequest& request, const ResponseMeta& meta,
                                         const v1::Completion& completion) {
  std::vector<std::string> out;
  json r = Envelope(request, meta, true);
  json choice = {{"index", 0},
                 {"finish_reason", FinishReasonName(completion.finish_reason())},
                 {"logprobs", nullptr}};
  if (request.endpoint == Endpoint::kChat) {
    choice["delta"] = json::object();
  } else {
    choice["text"] = "";
  }
  r["choices"] = json::array({choice});
  r["speculation"] = Speculation(completion);
  if (request.include_usage) r["usage"] = nullptr;
  out.push_back(Dump(r));
  if (request.include_usage) {
    json u = Envelope(request, meta, true);
    u["choices"] = json::array();
    u["usage"] = Usage(completion);
    u["speculation"] = Speculation(completion);
    out.push_back(Dump(u));
  }
  return out;
}

std::string ModelsJson(const std::vector<std::string>& models, int64_t created) {
  json data = json::array();
  for (const std::string& m : models) {
    data.push_back({{"id", m}, {"object", "model"}, {"created", created}, {"owned_by", "specd"}});
  }
  return Dump(json{{"object", "list"}, {"data", data}});
}

}  // namespace specd::router::http
