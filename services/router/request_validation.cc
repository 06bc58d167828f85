#include "services/router/request_validation.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/utf8.h"

namespace specd::router {

namespace {

absl::Status Invalid(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", what));
}

// Byte offset of the first invalid UTF-8 sequence, or -1.
int64_t InvalidUtf8At(const std::string& s) {
  size_t i = 0;
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  while (i < s.size()) {
    const unsigned c = b[i];
    int n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07;
    } else {
      return static_cast<int64_t>(i);
    }
    for (int j = 1; j <= n; ++j) {
      if (i + j >= s.size() || (b[i + j] & 0xC0) != 0x80) return static_cast<int64_t>(i);
      cp = (cp << 6) | (b[i + j] & 0x3F);
    }
    const uint32_t min_cp = n == 1 ? 0x80 : n == 2 ? 0x800 : 0x10000;
    if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return static_cast<int64_t>(i);
    }
    i += n + 1;
  }
  return -1;
}

absl::Status CheckUtf8(const std::string& field, const std::string& s) {
  const int64_t at = InvalidUtf8At(s);
  if (at >= 0) return Invalid(field, absl::StrCat("is not valid UTF-8 (byte ", at, ")"));
  return absl::OkStatus();
}

absl::Status CheckFinite(const std::string& field, float v) {
  if (!std::isfinite(v)) return Invalid(field, "must be a finite number");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> EncodeText(const std::string& field, const std::string& text,
                                                bool add_special, const tok::Tokenizer& tokenizer,
                                                const ModelLimits& limits) {
  if (text.empty()) return Invalid(field, "must not be empty");
  if (static_cast<int64_t>(text.size()) > limits.max_prompt_bytes) {
    return Invalid(field, absl::StrCat("has ", text.size(), " bytes; at most ",
                                       limits.max_prompt_bytes, " are accepted"));
  }
  if (absl::Status s = CheckUtf8(field, text); !s.ok()) return s;
  absl::StatusOr<std::vector<int32_t>> ids =
      tokenizer.Encode(text, add_special, /*parse_special=*/false);
  if (!ids.ok()) return Invalid(field, std::string(ids.status().message()));
  if (ids->empty()) return Invalid(field, "encodes to no tokens");
  return ids;
}

absl::StatusOr<std::vector<int32_t>> EncodeChat(const specd::v1::ChatMessages& chat,
                                                const tok::Tokenizer& tokenizer,
                                                const tok::ChatTemplate* tmpl,
                                                const ModelLimits& limits) {
  if (tmpl == nullptr) return Invalid("chat", "is not supported: the model has no chat template");
  if (chat.messages_size() == 0) return Invalid("chat.messages", "must not be empty");
  if (chat.messages_size() > kMaxChatMessages) {
    return Invalid("chat.messages", absl::StrCat("has more than ", kMaxChatMessages, " entries"));
  }
  std::vector<tok::ChatMessage> msgs;
  int64_t bytes = 0;
  for (int i = 0; i < chat.messages_size(); ++i) {
    const specd::v1::ChatMessage& m = chat.messages(i);
    const std::string f = absl::StrCat("chat.messages[", i, "]");
    if (m.role() != "system" && m.role() != "user" && m.role() != "assistant") {
      return Invalid(f + ".role", absl::StrCat("must be system, user or assistant, got \"",
                                               m.role().substr(0, 32), "\""));
    }
    if (absl::Status s = CheckUtf8(f + ".content", m.content()); !s.ok()) return s;
    bytes += m.content().size();
    msgs.push_back({m.role(), m.content()});
  }
  if (bytes > limits.max_prompt_bytes) {
    return Invalid("chat.messages", absl::StrCat("hold ", bytes, " bytes; at most ",
                                                 limits.max_prompt_bytes, " are accepted"));
  }
  absl::StatusOr<std::string> text =
      tmpl->Apply(msgs, chat.has_add_generation_prompt() ? chat.add_generation_prompt() : true);
  if (!text.ok()) return Invalid("chat.messages", std::string(text.status().message()));
  absl::StatusOr<std::vector<int32_t>> ids =
      tokenizer.Encode(*text, /*add_special=*/true, /*parse_special=*/true);
  if (!ids.ok()) return Invalid("chat.messages", std::string(ids.status().message()));
  if (ids->empty()) return Invalid("chat.messages", "encode to no tokens");
  return ids;
}

namespace {

// The prompt's token ids, from whichever input the request set.
absl::StatusOr<std::vector<int32_t>> ValidatePrompt(const specd::v1::GenerateRequest& request,
                                                   const tok::Tokenizer& tokenizer,
                                                   const tok::ChatTemplate* chat,
                                                   const ModelLimits& limits) {
  switch (request.input_case()) {
    case specd::v1::GenerateRequest::kPrompt:
      return EncodeText("prompt", request.prompt(), request.add_special_tokens(), tokenizer,
                        limits);
    case specd::v1::GenerateRequest::kChat:
      return EncodeChat(request.chat(), tokenizer, chat, limits);
    case specd::v1::GenerateRequest::kTokens: {
      const auto& ids = request.tokens().ids();
      if (ids.empty()) return Invalid("tokens.ids", "must not be empty");
      for (int i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= limits.vocab_size) {
          return Invalid(absl::StrCat("tokens.ids[", i, "]"),
                         absl::StrCat("= ", ids[i], " is outside the vocabulary [0, ",
                                      limits.vocab_size, ")"));
        }
      }
      return std::vector<int32_t>(ids.begin(), ids.end());
    }
    default:
      return Invalid("input", "is required: set prompt, chat or tokens");
  }
}

// out.max_new_tokens: the request's, within the limit and the context left after the prompt;
// by default as many as both allow.
absl::Status ValidateMaxNewTokens(const specd::v1::SamplingOptions& s, const ModelLimits& limits,
                                  ValidatedRequest& out) {
  const int32_t n_prompt = static_cast<int32_t>(out.prompt.size());
  if (s.has_max_new_tokens()) {
    if (s.max_new_tokens() <= 0) {
      return Invalid("sampling.max_new_tokens", absl::StrCat("must be > 0, got ", s.max_new_tokens()));
    }
    if (s.max_new_tokens() > limits.max_new_tokens) {
      return Invalid("sampling.max_new_tokens", absl::StrCat("must be <= ", limits.max_new_tokens,
                                                             ", got ", s.max_new_tokens()));
    }
    out.max_new_tokens = s.max_new_tokens();
  } else {
    out.max_new_tokens = std::min(kDefaultMaxNewTokens, limits.max_new_tokens);
  }
  if (static_cast<int64_t>(n_prompt) + out.max_new_tokens > limits.context_length) {
    if (s.has_max_new_tokens()) {
      return Invalid("sampling.max_new_tokens",
                     absl::StrCat("= ", out.max_new_tokens, " with a ", n_prompt,
                                  "-token prompt exceeds the context length ",
                                  limits.context_length));
    }
    out.max_new_tokens = limits.context_length - n_prompt;  // default: fill the context
  }
  return absl::OkStatus();
}

// out.params and out.seed_set: the sampling transforms, logprobs and stop token ids.
absl::Status ValidateSampling(const specd::v1::SamplingOptions& s, const ModelLimits& limits,
                              ValidatedRequest& out) {
  sampling::SamplingParams& p = out.params;
  struct FloatField {
    const char* name;
    bool has;
    float value;
    float* dst;
  };
  const FloatField floats[] = {
      {"sampling.temperature", s.has_temperature(), s.temperature(), &p.temperature},
      {"sampling.top_p", s.has_top_p(), s.top_p(), &p.top_p},
      {"sampling.min_p", s.has_min_p(), s.min_p(), &p.min_p},
      {"sampling.repetition_penalty", s.has_repetition_penalty(), s.repetition_penalty(),
       &p.repetition_penalty},
      {"sampling.presence_penalty", s.has_presence_penalty(), s.presence_penalty(),
       &p.presence_penalty},
      {"sampling.frequency_penalty", s.has_frequency_penalty(), s.frequency_penalty(),
       &p.frequency_penalty},
  };
  for (const FloatField& f : floats) {
    if (!f.has) continue;
    if (absl::Status st = CheckFinite(f.name, f.value); !st.ok()) return st;
    *f.dst = f.value;
  }
  if (p.temperature < 0) {
    return Invalid("sampling.temperature", absl::StrCat("must be >= 0, got ", p.temperature));
  }
  if (s.has_top_k()) p.top_k = s.top_k();
  if (s.has_seed()) {
    p.seed = s.seed();
    out.seed_set = true;
  }
  if (s.logprobs() < 0 || s.logprobs() > sampling::kMaxLogprobs) {
    return Invalid("sampling.logprobs",
                   absl::StrCat("must be in [0, ", sampling::kMaxLogprobs, "], got ", s.logprobs()));
  }
  p.num_logprobs = s.logprobs();
  if (s.stop_token_ids_size() > kMaxStopTokenIds) {
    return Invalid("sampling.stop_token_ids", absl::StrCat("has more than ", kMaxStopTokenIds));
  }
  for (int i = 0; i < s.stop_token_ids_size(); ++i) {
    const int32_t id = s.stop_token_ids(i);
    if (id < 0 || id >= limits.vocab_size) {
      return Invalid(absl::StrCat("sampling.stop_token_ids[", i, "]"),
                     absl::StrCat("= ", id, " is outside the vocabulary"));
    }
    p.stop_token_ids.push_back(id);
  }
  p.ignore_eos = s.ignore_eos();
  // The sampling library names the field; we add the message's prefix.
  if (absl::Status st = sampling::Validate(p, limits.vocab_size); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.", st.message()));
  }
  return absl::OkStatus();
}

// out.stop: the stop strings, each non-empty UTF-8 within the length limit.
absl::Status ValidateStopStrings(const specd::v1::SamplingOptions& s, ValidatedRequest& out) {
  if (s.stop_size() > kMaxStopStrings) {
    return Invalid("sampling.stop", absl::StrCat("has more than ", kMaxStopStrings, " strings"));
  }
  for (int i = 0; i < s.stop_size(); ++i) {
    const std::string f = absl::StrCat("sampling.stop[", i, "]");
    if (s.stop(i).empty()) return Invalid(f, "must not be empty");
    if (s.stop(i).size() > static_cast<size_t>(kMaxStopStringBytes)) {
      return Invalid(f, absl::StrCat("is longer than ", kMaxStopStringBytes, " bytes"));
    }
    if (absl::Status st = CheckUtf8(f, s.stop(i)); !st.ok()) return st;
    out.stop.push_back(s.stop(i));
  }
  return absl::OkStatus();
}

// out.spec_mode and out.fixed_k.
absl::Status ValidateSpeculation(const specd::v1::SpeculationOptions& sp, ValidatedRequest& out) {
  switch (sp.mode()) {
    case specd::v1::SPECULATION_MODE_UNSPECIFIED:
    case specd::v1::SPECULATION_MODE_AUTO:
      out.spec_mode = SpecMode::kAuto;
      break;
    case specd::v1::SPECULATION_MODE_OFF:
      out.spec_mode = SpecMode::kOff;
      break;
    case specd::v1::SPECULATION_MODE_DRAFT:
      out.spec_mode = SpecMode::kDraft;
      break;
    case specd::v1::SPECULATION_MODE_NGRAM:
      out.spec_mode = SpecMode::kNgram;
      break;
    case specd::v1::SPECULATION_MODE_SELF:
      out.spec_mode = SpecMode::kSelf;  // RouterEngine checks the draft service is a self-draft
      break;
    default:
      return Invalid("speculation.mode", absl::StrCat("has unknown value ", sp.mode()));
  }
  if (sp.num_draft_tokens() < 0 || sp.num_draft_tokens() > kMaxDraftTokensPerStep) {
    return Invalid("speculation.num_draft_tokens",
                   absl::StrCat("must be in [0, ", kMaxDraftTokensPerStep, "], got ",
                                sp.num_draft_tokens()));
  }
  out.fixed_k = sp.num_draft_tokens();
  return absl::OkStatus();
}

}  // namespace

// The fields in message order; the first that fails is the error, named.
absl::StatusOr<ValidatedRequest> ValidateRequest(const specd::v1::GenerateRequest& request,
                                                 const tok::Tokenizer& tokenizer,
                                                 const tok::ChatTemplate* chat,
                                                 const ModelLimits& limits) {
  ValidatedRequest out;
  if (request.request_id().size() > static_cast<size_t>(kMaxRequestIdBytes)) {
    return Invalid("request_id", absl::StrCat("is longer than ", kMaxRequestIdBytes, " bytes"));
  }
  out.request_id = request.request_id();
  absl::StatusOr<std::vector<int32_t>> prompt = ValidatePrompt(request, tokenizer, chat, limits);
  if (!prompt.ok()) return prompt.status();
  out.prompt = std::move(*prompt);
  const int32_t n_prompt = static_cast<int32_t>(out.prompt.size());
  if (n_prompt >= limits.context_length) {
    return Invalid("prompt", absl::StrCat("has ", n_prompt, " tokens; the context length is ",
                                          limits.context_length));
  }
  if (absl::Status st = ValidateMaxNewTokens(request.sampling(), limits, out); !st.ok()) return st;
  if (absl::Status st = ValidateSampling(request.sampling(), limits, out); !st.ok()) return st;
  if (absl::Status st = ValidateStopStrings(request.sampling(), out); !st.ok()) return st;
  if (absl::Status st = ValidateSpeculation(request.speculation(), out); !st.ok()) return st;
  return out;
}

}  // namespace specd::router
