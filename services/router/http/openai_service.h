// The OpenAI-compatible HTTP face of the router: POST /v1/chat/completions and /v1/completions
// (unary and Server-Sent Events), GET /v1/models, GET /health. A thin layer over the same
// request path as gRPC: openai_api.h translates the JSON, THE validator (request_validation.h)
// checks it, the RouterEngine runs it, and a client that disconnects cancels its request.
#ifndef SPECD_SERVICES_ROUTER_HTTP_OPENAI_SERVICE_H_
#define SPECD_SERVICES_ROUTER_HTTP_OPENAI_SERVICE_H_

#include <atomic>
#include <ctime>
#include <functional>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "services/common/metrics.h"
#include "services/router/api_keys.h"
#include "services/router/http/http_server.h"
#include "services/router/http/openai_api.h"
#include "services/router/router_engine.h"

namespace specd::router::http {

class OpenAiService final : public HttpHandler {
 public:
  // `model_id` is the name clients pass as "model". `chat` may be null. All pointers must
  // outlive the service.
  OpenAiService(RouterEngine* engine, const tok::Tokenizer* tokenizer,
                const tok::ChatTemplate* chat, std::string model_id, services::Metrics* metrics)
      : engine_(engine),
        tokenizer_(tokenizer),
        chat_(chat),
        model_id_(std::move(model_id)),
        metrics_(metrics) {}

  void Handle(const HttpRequest& request, std::shared_ptr<HttpExchange> exchange) override;
  // /health answers 503 while `ready` is false (the router cannot reach its target).
  void set_ready(std::function<bool()> ready) { ready_ = std::move(ready); }
  // With keys, /v1/* needs `Authorization: Bearer <key>` (401 otherwise; /health stays open).
  void set_api_keys(const ApiKeys* keys) { keys_ = keys; }
  // When the last request of any path arrived (the drain lingers while requests keep coming,
  // as it does for gRPC calls, so a client sees 503 rather than a cut connection).
  absl::Time last_request() const { return absl::FromUnixNanos(last_request_ns_.load()); }

 private:
  void Generate(const HttpRequest& request, Endpoint endpoint,
                const std::shared_ptr<HttpExchange>& exchange);
  void Fail(const std::shared_ptr<HttpExchange>& exchange, const ApiError& error);

  RouterEngine* engine_;
  const tok::Tokenizer* tokenizer_;
  const tok::ChatTemplate* chat_;
  const std::string model_id_;
  services::Metrics* metrics_;
  std::atomic<int64_t> next_id_{1};
  std::atomic<int64_t> last_request_ns_{0};
  std::function<bool()> ready_;
  const ApiKeys* keys_ = nullptr;
  const int64_t started_ = static_cast<int64_t>(std::time(nullptr));  // ids unique across restarts
};

}  // namespace specd::router::http

#endif  // SPECD_SERVICES_ROUTER_HTTP_OPENAI_SERVICE_H_
