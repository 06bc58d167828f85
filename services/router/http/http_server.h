// An asynchronous HTTP/1.1 server (Boost.Beast over Asio): a few threads serve every
// connection, so thousands of streaming clients cost memory, not threads. It parses requests
// (Beast's parser; a body over the limit is a 413 before it is read), hands each to a handler,
// and writes the handler's answer: a whole response, or a chunked stream (Server-Sent Events)
// written as the handler produces it. A client that goes away mid-response fires the exchange's
// close callback (the router cancels the request then).
#ifndef SPECD_SERVICES_ROUTER_HTTP_HTTP_SERVER_H_
#define SPECD_SERVICES_ROUTER_HTTP_HTTP_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace specd::router::http {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target without its query
  std::string body;
  std::string content_type;
  std::string authorization;  // the Authorization header ("" when absent)
};

// One request's answer; thread-safe (the engine answers from its own thread). Exactly one of
// Reply or StartStream, then (for a stream) any number of Write and one End.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  virtual void Reply(int status, std::string content_type, std::string body) = 0;
  virtual void StartStream(int status, std::string content_type) = 0;
  virtual void Write(std::string data) = 0;
  virtual void End() = 0;
  // `on_close` runs once if the client disconnects before the answer is complete (possibly
  // right away, if it already has).
  virtual void OnClose(std::function<void()> on_close) = 0;
};

class HttpHandler {
 public:
  virtual ~HttpHandler() = default;
  // On a server thread; may answer later from any thread.
  virtual void Handle(const HttpRequest& request, std::shared_ptr<HttpExchange> exchange) = 0;
};

struct HttpServerOptions {
  std::string address = "127.0.0.1";
  int port = 0;                        // 0: any free port
  int threads = 2;
  int64_t max_body_bytes = 4 << 20;    // larger bodies: 413
  int header_timeout_seconds = 30;     // a connection that sends no whole request is dropped
};

class HttpServer {
 public:
  // Listens and starts serving; `handler` must outlive the server.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           HttpHandler* handler);
  // Waits until every request received has been answered in full (the engine has finished
  // them; their last bytes are written), at most `timeout_s`. False on timeout.
  bool Drain(double timeout_s);
  ~HttpServer();  // stops: open connections are closed
  int port() const { return port_; }

 private:
  struct Impl;
  HttpServer() = default;
  std::unique_ptr<Impl> impl_;
  std::vector<std::thread> threads_;
  int port_ = 0;
};

}  // namespace specd::router::http

#endif  // SPECD_SERVICES_ROUTER_HTTP_HTTP_SERVER_H_
