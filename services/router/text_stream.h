// Turns emitted token ids into streamable text: incremental detokenization (whole UTF-8
// characters only) plus stop strings that may span tokens. Text that could still become the
// start of a stop string is held back until it cannot.
#ifndef SPECD_SERVICES_ROUTER_TEXT_STREAM_H_
#define SPECD_SERVICES_ROUTER_TEXT_STREAM_H_

#include <string>
#include <vector>

#include "common/tokenizer/detokenizer.h"
#include "common/tokenizer/tokenizer.h"

namespace specd::router {

class TextStream {
 public:
  TextStream(const tok::Tokenizer& tokenizer, std::vector<std::string> stop)
      : detok_(tokenizer, /*skip_special=*/true), stop_(std::move(stop)) {}

  // Appends a token; returns text now safe to send. After a stop string matched, stopped() is
  // true, the returned text ends right before it and later calls return nothing.
  std::string Append(int32_t token);
  // End of the stream: flushes held-back text (unless stopped).
  std::string Finish();

  bool stopped() const { return stopped_; }
  const std::string& matched_stop() const { return matched_; }

 private:
  std::string Release(bool final);

  tok::StreamingDetokenizer detok_;
  std::vector<std::string> stop_;
  std::string held_;  // decoded, not yet sent
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace specd::router

#endif  // SPECD_SERVICES_ROUTER_TEXT_STREAM_H_
