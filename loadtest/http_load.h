// The HTTP side of specd-loadtest: one streamed OpenAI-API request over a fresh connection
// (Boost.Beast, synchronous: the load generator runs one thread per client), timed the way the
// gRPC path times its stream.
#ifndef SPECD_LOADTEST_HTTP_LOAD_H_
#define SPECD_LOADTEST_HTTP_LOAD_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace specd::loadtest {

struct HttpResult {
  bool ok = false;
  int status = 0;  // HTTP status (0: no answer)
  std::string error;
  double ttft_ms = 0, e2e_ms = 0;
  std::vector<double> itl_ms;
  int tokens = 0, drafted = 0, accepted = 0, steps = 0;
};

// `server` is host:port. POSTs `body` (a streamed request with return_token_ids) to `path`.
HttpResult StreamHttp(const std::string& server, const std::string& path,
                      const std::string& body);
// GET `path`: the body of a 200 answer.
absl::StatusOr<std::string> GetHttp(const std::string& server, const std::string& path);

}  // namespace specd::loadtest

#endif  // SPECD_LOADTEST_HTTP_LOAD_H_
