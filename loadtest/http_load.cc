#include "loadtest/http_load.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "boost/asio.hpp"
#include "boost/beast.hpp"
#include "nlohmann/json.hpp"

namespace specd::loadtest {
namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

bool Connect(const std::string& server, net::io_context& ioc, beast::tcp_stream& stream,
             std::string* host, std::string* error) {
  const size_t colon = server.rfind(':');
  *host = server.substr(0, colon);
  const std::string port = colon == std::string::npos ? "80" : server.substr(colon + 1);
  beast::error_code ec;
  tcp::resolver resolver(ioc);
  auto endpoints = resolver.resolve(*host, port, ec);
  if (!ec) stream.connect(endpoints, ec);
  if (ec) *error = "connect: " + ec.message();
  return !ec;
}

// One SSE event ("data: ..." lines) into the result; false after [DONE] or an error event.
bool OnEvent(const std::string& event, Clock::time_point t0, Clock::time_point& last,
             HttpResult& r) {
  if (event.rfind("data: ", 0) != 0) return true;
  const std::string data = event.substr(6);
  if (data == "[DONE]") return false;
  const nlohmann::json j = nlohmann::json::parse(data, nullptr, false);
  if (j.is_discarded()) return true;
  if (j.contains("error")) {
    r.ok = false;
    r.error = j["error"].value("message", "error event");
    return false;
  }
  if (j.contains("speculation")) {
    r.drafted = j["speculation"].value("draft_tokens", 0);
    r.accepted = j["speculation"].value("accepted_tokens", 0);
    r.steps = j["speculation"].value("target_steps", 0);
  }
  if (!j.contains("choices") || j["choices"].empty()) return true;
  const nlohmann::json& c = j["choices"][0];
  const int n = c.contains("token_ids") ? static_cast<int>(c["token_ids"].size()) : 0;
  if (n == 0) return true;
  const auto now = Clock::now();
  if (r.tokens == 0) {
    r.ttft_ms = Ms(now - t0);
    for (int i = 1; i < n; ++i) r.itl_ms.push_back(0);
  } else {
    for (int i = 0; i < n; ++i) r.itl_ms.push_back(Ms(now - last) / n);
  }
  r.tokens += n;
  last = now;
  return true;
}

}  // namespace

HttpResult StreamHttp(const std::string& server, const std::string& path,
                      const std::string& body) {
  HttpResult r;
  net::io_context ioc;
  beast::tcp_stream stream(ioc);
  std::string host;
  const auto t0 = Clock::now();
  if (!Connect(server, ioc, stream, &host, &r.error)) return r;
  bhttp::request<bhttp::string_body> req{bhttp::verb::post, path, 11};
  req.set(bhttp::field::host, host);
  req.set(bhttp::field::content_type, "application/json");
  req.body() = body;
  req.prepare_payload();
  beast::error_code ec;
  bhttp::write(stream, req, ec);
  beast::flat_buffer buffer;
  bhttp::response_parser<bhttp::buffer_body> parser;
  parser.body_limit(boost::none);
  if (!ec) bhttp::read_header(stream, buffer, parser, ec);
  if (ec) {
    r.error = "request: " + ec.message();
    return r;
  }
  r.status = static_cast<int>(parser.get().result_int());
  r.ok = r.status == 200;
  std::string pending;
  auto last = t0;
  bool more = true;
  char chunk[8192];
  while (more && !parser.is_done()) {
    parser.get().body().data = chunk;
    parser.get().body().size = sizeof chunk;
    // read_some: what has arrived (read would wait for the whole buffer: events in bursts).
    bhttp::read_some(stream, buffer, parser, ec);
    if (ec == bhttp::error::need_buffer) ec = {};
    if (ec) {
      r.ok = false;
      r.error = "stream: " + ec.message();
      break;
    }
    pending.append(chunk, sizeof chunk - parser.get().body().size);
    for (size_t end; more && (end = pending.find("\n\n")) != std::string::npos;) {
      if (r.status == 200) more = OnEvent(pending.substr(0, end), t0, last, r);
      pending.erase(0, end + 2);
    }
  }
  if (r.status != 200 && r.error.empty()) r.error = pending.substr(0, 200);
  r.e2e_ms = Ms(Clock::now() - t0);
  beast::error_code ignored;  // the server may have closed first: nothing to report
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  return r;
}

absl::StatusOr<std::string> GetHttp(const std::string& server, const std::string& path) {
  net::io_context ioc;
  beast::tcp_stream stream(ioc);
  std::string host, error;
  if (!Connect(server, ioc, stream, &host, &error)) return absl::UnavailableError(error);
  bhttp::request<bhttp::empty_body> req{bhttp::verb::get, path, 11};
  req.set(bhttp::field::host, host);
  beast::error_code ec;
  bhttp::write(stream, req, ec);
  beast::flat_buffer buffer;
  bhttp::response<bhttp::string_body> res;
  if (!ec) bhttp::read(stream, buffer, res, ec);
  if (ec) return absl::UnavailableError(absl::StrCat(server, path, ": ", ec.message()));
  if (res.result_int() != 200) {
    return absl::UnavailableError(absl::StrCat(server, path, ": HTTP ", res.result_int()));
  }
  return res.body();
}

}  // namespace specd::loadtest
