#include "services/router/http/http_server.h"

#include <atomic>
#include <chrono>
#include <deque>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "boost/asio.hpp"
#include "boost/beast.hpp"

namespace specd::router::http {
namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

constexpr size_t kMaxBufferedAhead = 64 << 10;  // pipelined bytes kept while answering
constexpr auto kIdleTimeout = std::chrono::seconds(60);

// One connection. Everything runs on the connection's strand; the exchange posts onto it.
// While a response is pending (or the connection idles after one) a single "watch" read is
// outstanding: it only learns that the client left, and keeps whatever bytes of a next request
// arrive for the parser.
class Session : public std::enable_shared_from_this<Session> {
 public:
  // `busy` counts requests whose answer is not yet written (the server's graceful stop waits
  // for it to reach 0).
  Session(tcp::socket socket, const HttpServerOptions& options, HttpHandler* handler,
          std::atomic<int>* busy)
      : stream_(std::move(socket)), options_(options), handler_(handler), busy_(busy) {}
  ~Session() { SetAnswering(false); }

  void Start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->Read(); });
  }

  // ---- what the exchange asks (any thread) -------------------------------------------------
  void Reply(uint64_t gen, int status, std::string content_type, std::string body) {
    Post([=, this, self = shared_from_this(), body = std::move(body)]() mutable {
      if (!Current(gen) || started_) return;
      bhttp::response<bhttp::string_body> res{static_cast<bhttp::status>(status), version_};
      res.set(bhttp::field::server, "specd");
      res.set(bhttp::field::content_type, content_type);
      res.keep_alive(keep_alive_);
      res.body() = std::move(body);
      res.prepare_payload();
      std::ostringstream os;
      os << res;
      started_ = true;
      done_ = true;
      Send(os.str());
    });
  }
  void StartStream(uint64_t gen, int status, std::string content_type) {
    Post([=, this, self = shared_from_this()] {
      if (!Current(gen) || started_) return;
      bhttp::response<bhttp::empty_body> res{static_cast<bhttp::status>(status), version_};
      res.set(bhttp::field::server, "specd");
      res.set(bhttp::field::content_type, content_type);
      res.set(bhttp::field::cache_control, "no-cache");
      res.keep_alive(keep_alive_);
      res.chunked(true);
      std::ostringstream os;
      os << res.base();
      started_ = true;
      Send(os.str());
    });
  }
  void Write(uint64_t gen, std::string data) {
    Post([=, this, self = shared_from_this(), data = std::move(data)] {
      if (!Current(gen) || !started_ || done_ || data.empty()) return;
      Send(beast::buffers_to_string(bhttp::make_chunk(net::const_buffer(data.data(), data.size()))));
    });
  }
  void End(uint64_t gen) {
    Post([=, this, self = shared_from_this()] {
      if (!Current(gen) || !started_ || done_) return;
      done_ = true;
      Send(beast::buffers_to_string(bhttp::make_chunk_last()));
    });
  }
  void OnClose(uint64_t gen, std::function<void()> cb) {
    Post([=, this, self = shared_from_this(), cb = std::move(cb)]() mutable {
      if (gen != gen_) return;
      if (closed_ && !done_) {
        cb();
        return;
      }
      if (!done_) on_close_ = std::move(cb);
    });
  }
  uint64_t generation() const { return gen_; }

 private:
  template <typename F>
  void Post(F&& f) {
    net::post(stream_.get_executor(), std::forward<F>(f));
  }
  bool Current(uint64_t gen) const { return gen == gen_ && !closed_; }

  // ---- reading -----------------------------------------------------------------------------
  void Read() {
    parser_.emplace();
    parser_->body_limit(static_cast<uint64_t>(options_.max_body_bytes));
    parser_->header_limit(64 << 10);
    stream_.expires_after(std::chrono::seconds(options_.header_timeout_seconds));
    bhttp::async_read(stream_, buffer_, *parser_,
                      beast::bind_front_handler(&Session::OnRead, shared_from_this()));
  }

  void OnRead(beast::error_code ec, size_t) {
    if (ec == bhttp::error::end_of_stream || ec == net::error::eof) return Close();
    if (ec == bhttp::error::body_limit) {
      return Refuse(bhttp::status::payload_too_large,
                    absl::StrCat("the body exceeds ", options_.max_body_bytes, " bytes"));
    }
    if (ec == beast::error::timeout || ec == net::error::operation_aborted) return Close();
    if (ec) return Refuse(bhttp::status::bad_request, "malformed HTTP request: " + ec.message());
    bhttp::request<bhttp::string_body> req = parser_->release();
    stream_.expires_never();
    ++gen_;
    started_ = done_ = false;
    on_close_ = nullptr;
    keep_alive_ = req.keep_alive();
    version_ = req.version();
    HttpRequest r;
    r.method = std::string(req.method_string());
    const std::string target(req.target());
    r.path = std::string(target.substr(0, target.find('?')));
    r.content_type = std::string(req[bhttp::field::content_type]);
    r.authorization = std::string(req[bhttp::field::authorization]);
    r.body = std::move(req.body());
    SetAnswering(true);
    Watch();
    handler_->Handle(r, MakeExchange());
  }

  // A read that only waits for the client to leave (or to send its next request).
  void Watch() {
    if (watching_ || buffer_.size() >= kMaxBufferedAhead) return;
    watching_ = true;
    stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](
                                                       beast::error_code ec, size_t n) {
      self->watching_ = false;
      self->buffer_.commit(n);
      if (ec) return self->Close();
      if (self->done_) {  // the next request has begun: the parser takes over
        if (self->writing_) {
          self->read_after_write_ = true;
        } else {
          self->Read();
        }
        return;
      }
      self->Watch();
    });
  }

  // ---- writing -----------------------------------------------------------------------------
  void Send(std::string bytes) {
    out_.push_back(std::move(bytes));
    if (!writing_) WriteNext();
  }

  void WriteNext() {
    if (out_.empty()) {
      writing_ = false;
      if (done_) Finished();
      return;
    }
    writing_ = true;
    net::async_write(stream_, net::buffer(out_.front()),
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->out_.pop_front();
                       if (ec) return self->Close();
                       self->WriteNext();
                     });
  }

  // The whole answer is out: the next request, or the end of the connection.
  void Finished() {
    on_close_ = nullptr;
    SetAnswering(false);
    if (!keep_alive_) return Close();
    stream_.expires_after(kIdleTimeout);
    if (read_after_write_) {
      read_after_write_ = false;
      Read();
    } else if (!watching_) {
      Read();
    }  // else the watch read hands over when the next bytes come
  }

  void Refuse(bhttp::status status, const std::string& message) {
    ++gen_;
    keep_alive_ = false;
    version_ = 11;
    started_ = false;
    done_ = false;
    const uint64_t gen = gen_;
    const std::string body = absl::StrCat(
        R"({"error": {"message": ")", message,
        R"(", "type": "invalid_request_error", "param": null, "code": null}})");
    Reply(gen, static_cast<int>(status), "application/json", body);
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    SetAnswering(false);
    if (!done_ && on_close_) {
      std::function<void()> cb = std::move(on_close_);
      on_close_ = nullptr;
      cb();
    }
    beast::error_code ignored;  // the peer may have gone already: nothing to report
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

  std::shared_ptr<HttpExchange> MakeExchange();
  void SetAnswering(bool on) {
    if (on == answering_) return;
    answering_ = on;
    busy_->fetch_add(on ? 1 : -1);
  }

  beast::tcp_stream stream_;
  const HttpServerOptions& options_;
  HttpHandler* handler_;
  std::atomic<int>* busy_;
  bool answering_ = false;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::deque<std::string> out_;
  std::function<void()> on_close_;
  uint64_t gen_ = 0;  // which request the connection answers now
  unsigned version_ = 11;
  bool keep_alive_ = false, started_ = false, done_ = false;
  bool writing_ = false, watching_ = false, closed_ = false, read_after_write_ = false;
};

class Exchange final : public HttpExchange {
 public:
  Exchange(std::shared_ptr<Session> s, uint64_t gen) : session_(std::move(s)), gen_(gen) {}
  void Reply(int status, std::string content_type, std::string body) override {
    session_->Reply(gen_, status, std::move(content_type), std::move(body));
  }
  void StartStream(int status, std::string content_type) override {
    session_->StartStream(gen_, status, std::move(content_type));
  }
  void Write(std::string data) override { session_->Write(gen_, std::move(data)); }
  void End() override { session_->End(gen_); }
  void OnClose(std::function<void()> on_close) override {
    session_->OnClose(gen_, std::move(on_close));
  }

 private:
  std::shared_ptr<Session> session_;
  uint64_t gen_;
};

std::shared_ptr<HttpExchange> Session::MakeExchange() {
  return std::make_shared<Exchange>(shared_from_this(), gen_);
}

}  // namespace

struct HttpServer::Impl {
  explicit Impl(const HttpServerOptions& o, HttpHandler* h)
      : options(o), handler(h), ioc(std::max(1, o.threads)), acceptor(net::make_strand(ioc)) {}

  void Accept() {
    acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket s) {
      if (ec == net::error::operation_aborted) return;
      if (!ec) {
        // Stream events are small writes: without this, Nagle holds each one back until the
        // client acknowledges the last (up to its delayed-ACK time).
        beast::error_code ignored;  // a socket that refuses the option still works, slower
        s.set_option(tcp::no_delay(true), ignored);
        std::make_shared<Session>(std::move(s), options, handler, &busy)->Start();
        Accept();
        return;
      }
      // Out of file descriptors or similar: try again shortly rather than spin.
      auto timer = std::make_shared<net::steady_timer>(ioc, std::chrono::milliseconds(50));
      timer->async_wait([this, timer](beast::error_code) { Accept(); });
    });
  }

  HttpServerOptions options;
  HttpHandler* handler;
  net::io_context ioc;
  tcp::acceptor acceptor;
  std::atomic<int> busy{0};  // requests being answered
};

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              HttpHandler* handler) {
  std::unique_ptr<HttpServer> server(new HttpServer());
  server->impl_ = std::make_unique<Impl>(options, handler);
  Impl& impl = *server->impl_;
  beast::error_code ec;
  const net::ip::address address = net::ip::make_address(options.address, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("http address \"", options.address, "\": ", ec.message()));
  }
  const tcp::endpoint endpoint(address, static_cast<uint16_t>(options.port));
  impl.acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl.acceptor.bind(endpoint, ec);
  if (!ec) impl.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("http: cannot listen on ", options.address, ":",
                                               options.port, ": ", ec.message()));
  }
  server->port_ = impl.acceptor.local_endpoint().port();
  impl.Accept();
  for (int i = 0; i < std::max(1, options.threads); ++i) {
    server->threads_.emplace_back([&impl] { impl.ioc.run(); });
  }
  return server;
}

bool HttpServer::Drain(double timeout_s) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(timeout_s));
  while (impl_->busy.load() > 0) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

HttpServer::~HttpServer() {
  if (impl_ == nullptr) return;
  impl_->ioc.stop();
  for (std::thread& t : threads_) t.join();
}

}  // namespace specd::router::http
