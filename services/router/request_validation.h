// Validation of public GenerateRequests: every field that can be wrong is checked here, and
// the error (INVALID_ARGUMENT) names it. Produces the router's internal form of the request.
#ifndef SPECD_SERVICES_ROUTER_REQUEST_VALIDATION_H_
#define SPECD_SERVICES_ROUTER_REQUEST_VALIDATION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/sampling/sampling_params.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "specd/v1/generation.pb.h"

namespace specd::router {

inline constexpr int32_t kDefaultMaxNewTokens = 128;
inline constexpr int32_t kMaxStopStrings = 16;
inline constexpr int32_t kMaxStopStringBytes = 256;
inline constexpr int32_t kMaxStopTokenIds = 64;
inline constexpr int32_t kMaxRequestIdBytes = 256;
inline constexpr int32_t kMaxChatMessages = 1024;
inline constexpr int32_t kMaxDraftTokensPerStep = 16;

struct ModelLimits {
  int32_t vocab_size = 0;
  int32_t context_length = 0;
  int32_t max_new_tokens = 4096;     // the server's own cap
  int64_t max_prompt_bytes = 1 << 20;
  bool draft_available = false;
};

enum class SpecMode { kOff, kAuto, kDraft, kNgram, kSelf };

struct ValidatedRequest {
  std::vector<int32_t> prompt;
  sampling::SamplingParams params;
  bool seed_set = false;
  int32_t max_new_tokens = kDefaultMaxNewTokens;
  std::vector<std::string> stop;
  SpecMode spec_mode = SpecMode::kAuto;
  int32_t fixed_k = 0;               // 0 = adaptive
  std::string request_id;
};

// `chat` may be null (a chat request is then INVALID_ARGUMENT). Tokenizes the prompt.
absl::StatusOr<ValidatedRequest> ValidateRequest(const specd::v1::GenerateRequest& request,
                                                 const tok::Tokenizer& tokenizer,
                                                 const tok::ChatTemplate* chat,
                                                 const ModelLimits& limits);

// Shared with Tokenize: the prompt/chat input as token ids.
absl::StatusOr<std::vector<int32_t>> EncodeText(const std::string& field, const std::string& text,
                                                bool add_special, const tok::Tokenizer& tokenizer,
                                                const ModelLimits& limits);
absl::StatusOr<std::vector<int32_t>> EncodeChat(const specd::v1::ChatMessages& chat,
                                                const tok::Tokenizer& tokenizer,
                                                const tok::ChatTemplate* tmpl,
                                                const ModelLimits& limits);

}  // namespace specd::router

#endif  // SPECD_SERVICES_ROUTER_REQUEST_VALIDATION_H_
