#include "common/sampling/sampling_params.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace specd::sampling {

absl::Status Validate(const SamplingParams& p, int32_t vocab_size) {
  if (vocab_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_size must be > 0, got ", vocab_size));
  }
  // Written as !(in range) so NaN fails every check.
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be a finite number >= 0, got ", p.temperature));
  }
  if (p.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0 (0 = off), got ", p.top_k));
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", p.top_p));
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("min_p must be in [0, 1], got ", p.min_p));
  }
  if (!(p.repetition_penalty > 0.0f && p.repetition_penalty <= kMaxRepetitionPenalty)) {
    return absl::InvalidArgumentError(absl::StrCat("repetition_penalty must be in (0, ",
                                                   kMaxRepetitionPenalty, "], got ",
                                                   p.repetition_penalty));
  }
  if (!(std::fabs(p.presence_penalty) <= kMaxPresenceFrequencyPenalty)) {
    return absl::InvalidArgumentError(absl::StrCat("presence_penalty must be in [-2, 2], got ",
                                                   p.presence_penalty));
  }
  if (!(std::fabs(p.frequency_penalty) <= kMaxPresenceFrequencyPenalty)) {
    return absl::InvalidArgumentError(absl::StrCat("frequency_penalty must be in [-2, 2], got ",
                                                   p.frequency_penalty));
  }
  if (p.num_logprobs < 0 || p.num_logprobs > kMaxLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat("num_logprobs must be in [0, ", kMaxLogprobs,
                                                   "], got ", p.num_logprobs));
  }
  for (size_t i = 0; i < p.stop_token_ids.size(); ++i) {
    const int32_t id = p.stop_token_ids[i];
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("stop_token_ids[", i, "] = ", id,
                                                     " is outside the vocabulary [0, ",
                                                     vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

bool IsStopToken(const SamplingParams& params, absl::Span<const int32_t> eos_token_ids,
                 int32_t token) {
  if (std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), token) !=
      params.stop_token_ids.end()) {
    return true;
  }
  return !params.ignore_eos &&
         std::find(eos_token_ids.begin(), eos_token_ids.end(), token) != eos_token_ids.end();
}

}  // namespace specd::sampling
