#include "services/router/http/openai_service.h"

#include <ctime>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "services/common/event_log.h"
#include "services/router/request_validation.h"

namespace specd::router::http {
namespace {

namespace v1 = specd::v1;
constexpr const char* kJson = "application/json";

std::string Sse(const std::string& json) { return absl::StrCat("data: ", json, "\n\n"); }

// The tokens' text and logprobs, for the logprobs fields (`top`: alternatives per token).
std::vector<TokenPiece> Pieces(const v1::GenerateStreamResponse& chunk,
                               const tok::Tokenizer& tokenizer, int32_t top) {
  std::vector<TokenPiece> out;
  for (const v1::TokenLogprobs& lp : chunk.logprobs()) {
    TokenPiece p;
    p.text = tokenizer.Decode({lp.token_id()});
    p.logprob = lp.logprob();
    for (int j = 0; j < lp.top_size() && j < top; ++j) {
      p.top.emplace_back(tokenizer.Decode({lp.top(j).token_id()}), lp.top(j).logprob());
    }
    out.push_back(std::move(p));
  }
  return out;
}

// Receives one request's output from the engine and writes it to the HTTP exchange: SSE events
// as they come for a stream, one JSON body at the end otherwise. Nothing reaches the exchange
// before Begin (the engine may answer before Submit returns; the status line depends on
// whether Submit accepted the request).
class HttpSink final : public RequestSink {
 public:
  HttpSink(OpenAiRequest request, ResponseMeta meta, std::shared_ptr<HttpExchange> exchange,
           const tok::Tokenizer* tokenizer, services::Metrics* metrics)
      : request_(std::move(request)),
        meta_(std::move(meta)),
        exchange_(std::move(exchange)),
        tokenizer_(tokenizer),
        metrics_(metrics) {}

  // The engine took the request: from now on its output goes out.
  void Begin() {
    absl::MutexLock l(&mu_);
    begun_ = true;
    if (request_.stream) {
      Count(200);
      exchange_->StartStream(200, "text/event-stream");
      for (std::string& e : pending_) exchange_->Write(std::move(e));
      pending_.clear();
      if (ended_) exchange_->End();
    } else if (reply_) {
      SendReply();
    }
  }

  void OnChunk(v1::GenerateStreamResponse chunk) override {
    std::vector<TokenPiece> pieces;
    if (request_.logprobs) pieces = Pieces(chunk, *tokenizer_, request_.top_logprobs);
    absl::MutexLock l(&mu_);
    if (!request_.stream) {
      text_ += chunk.text();
      for (TokenPiece& p : pieces) pieces_.push_back(std::move(p));
      return;
    }
    const bool ids_only = request_.return_token_ids && !chunk.token_ids().empty();
    if (chunk.text().empty() && pieces.empty() && !ids_only) return;
    const std::vector<int32_t> ids(chunk.token_ids().begin(), chunk.token_ids().end());
    Event(Sse(ChunkJson(request_, meta_, chunk.text(), pieces, first_, ids)));
    first_ = false;
  }

  void OnDone(absl::Status status, v1::Completion completion) override {
    absl::MutexLock l(&mu_);
    if (!request_.stream) {
      if (status.ok()) {
        reply_ = Reply{200, CompletionJson(request_, meta_, text_, pieces_, completion)};
      } else {
        const ApiError e = ErrorFromStatus(status, &request_);
        reply_ = Reply{e.status, ErrorJson(e)};
      }
      if (begun_) SendReply();
      return;
    }
    if (!status.ok()) {
      // The status line is out: the error travels as an event, as OpenAI's streams carry them.
      Event(Sse(ErrorJson(ErrorFromStatus(status, &request_))));
    } else {
      if (first_) Event(Sse(ChunkJson(request_, meta_, "", {}, true)));
      for (const std::string& c : FinalChunksJson(request_, meta_, completion)) Event(Sse(c));
    }
    Event("data: [DONE]\n\n");
    ended_ = true;
    if (begun_) exchange_->End();
  }

 private:
  struct Reply {
    int status;
    std::string body;
  };
  void Event(std::string e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (begun_) {
      exchange_->Write(std::move(e));
    } else {
      pending_.push_back(std::move(e));
    }
  }
  void SendReply() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Count(reply_->status);
    exchange_->Reply(reply_->status, kJson, std::move(reply_->body));
  }
  void Count(int status) {
    metrics_->router_http_responses.Add({{"status", std::to_string(status)}}).Increment();
  }

  const OpenAiRequest request_;
  const ResponseMeta meta_;
  const std::shared_ptr<HttpExchange> exchange_;
  const tok::Tokenizer* tokenizer_;
  services::Metrics* metrics_;
  absl::Mutex mu_;
  std::string text_ ABSL_GUARDED_BY(mu_);
  std::vector<TokenPiece> pieces_ ABSL_GUARDED_BY(mu_);
  bool first_ ABSL_GUARDED_BY(mu_) = true;
  bool begun_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> pending_ ABSL_GUARDED_BY(mu_);
  std::optional<Reply> reply_ ABSL_GUARDED_BY(mu_);
};

int64_t Now() { return static_cast<int64_t>(std::time(nullptr)); }

}  // namespace

void OpenAiService::Fail(const std::shared_ptr<HttpExchange>& exchange, const ApiError& error) {
  metrics_->router_http_responses.Add({{"status", std::to_string(error.status)}}).Increment();
  services::LogEvent(services::LogLevel::kInfo, "request_refused",
                     {{"api", "http"}, {"status", error.status}, {"reason", error.message}});
  exchange->Reply(error.status, kJson, ErrorJson(error));
}

void OpenAiService::Handle(const HttpRequest& request, std::shared_ptr<HttpExchange> exchange) {
  last_request_ns_.store(absl::ToUnixNanos(absl::Now()));
  const std::string& path = request.path;
  const bool post = request.method == "POST", get = request.method == "GET";
  if (path.rfind("/v1/", 0) == 0 && keys_ != nullptr) {
    if (absl::Status a = keys_->Check(request.authorization); !a.ok()) {
      return Fail(exchange, ErrorFromStatus(a, nullptr));
    }
  }
  if (path == "/v1/chat/completions" || path == "/v1/completions") {
    if (!post) return Fail(exchange, ApiError{405, path + " takes POST", "invalid_request_error", "", ""});
    return Generate(request, path == "/v1/chat/completions" ? Endpoint::kChat
                                                            : Endpoint::kCompletions,
                    exchange);
  }
  if (path == "/v1/models" && get) {
    metrics_->router_http_responses.Add({{"status", "200"}}).Increment();
    return exchange->Reply(200, kJson, ModelsJson({model_id_}, Now()));
  }
  if (path == "/health" && get) {
    const bool draining = engine_->draining();
    const bool target_down = !draining && ready_ && !ready_();
    const int code = draining || target_down ? 503 : 200;
    metrics_->router_http_responses.Add({{"status", std::to_string(code)}}).Increment();
    return exchange->Reply(code, kJson,
                           draining      ? R"({"status": "draining"})"
                           : target_down ? R"({"status": "target unavailable"})"
                                         : R"({"status": "ok"})");
  }
  ApiError e{404, absl::StrCat("no route ", request.method, " ", path), "not_found_error", "", ""};
  Fail(exchange, e);
}

void OpenAiService::Generate(const HttpRequest& http, Endpoint endpoint,
                             const std::shared_ptr<HttpExchange>& exchange) {
  std::variant<OpenAiRequest, ApiError> parsed = ParseRequest(http.body, endpoint);
  if (auto* e = std::get_if<ApiError>(&parsed)) return Fail(exchange, *e);
  OpenAiRequest& r = std::get<OpenAiRequest>(parsed);
  if (r.model != model_id_) {
    ApiError e{404, absl::StrCat("the model \"", r.model, "\" does not exist; this server has \"",
                                 model_id_, "\""),
               "invalid_request_error", "model", "model_not_found"};
    return Fail(exchange, e);
  }
  absl::StatusOr<ValidatedRequest> v =
      ValidateRequest(r.request, *tokenizer_, chat_, engine_->limits());
  if (!v.ok()) return Fail(exchange, ErrorFromStatus(v.status(), &r));
  ResponseMeta meta;
  meta.id = absl::StrCat(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-", started_, "-",
                         next_id_.fetch_add(1));
  meta.created = Now();
  meta.model = model_id_;
  // What ParamOf needs to name a refused Submit's field (not the whole request again).
  OpenAiRequest names;
  names.endpoint = r.endpoint;
  names.max_completion_tokens = r.max_completion_tokens;
  auto sink = std::make_shared<HttpSink>(std::move(r), meta, exchange, tokenizer_, metrics_);
  absl::StatusOr<int64_t> id = engine_->Submit(std::move(*v), sink);
  if (!id.ok()) return Fail(exchange, ErrorFromStatus(id.status(), &names));
  sink->Begin();
  // A client that leaves mid-answer cancels its request: its KV is freed next iteration.
  RouterEngine* engine = engine_;
  const int64_t rid = *id;
  exchange->OnClose([engine, rid] { engine->Cancel(rid); });
}

}  // namespace specd::router::http
