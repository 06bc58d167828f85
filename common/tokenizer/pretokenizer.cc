#include "common/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace specd::tok {

struct PreTokenizer::Step {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Step() { pcre2_code_free(code); }
};

// Our patterns have no capture groups, so one ovector pair serves every step.
struct PreTokenizer::MatchData {
  MatchData() : data(pcre2_match_data_create(1, nullptr)) {}
  ~MatchData() { pcre2_match_data_free(data); }
  pcre2_match_data* data;
};

PreTokenizer::~PreTokenizer() = default;

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::FromPatterns(
    const std::vector<std::string>& patterns) {
  std::unique_ptr<PreTokenizer> pt(new PreTokenizer());
  for (const std::string& pattern : patterns) {
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    auto step = std::make_unique<Step>();
    step->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                               PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
    if (step->code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return absl::InvalidArgumentError(absl::StrCat("pre-tokenizer regex /", pattern,
                                                     "/ does not compile at offset ", err_offset,
                                                     ": ", reinterpret_cast<const char*>(msg)));
    }
    // JIT is an optimisation only: without it (or when it fails) the interpreter runs.
    step->jit = pcre2_jit_compile(step->code, PCRE2_JIT_COMPLETE) == 0;
    pt->steps_.push_back(std::move(step));
  }
  return pt;
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::ForName(std::string_view name) {
  if (name == "default" || name == "gpt2") {
    return FromPatterns({std::string(kGpt2Pattern)});
  }
  if (name == "smollm" || name == "starcoder") {
    return FromPatterns({std::string(kIsolateDigitsPattern), std::string(kGpt2Pattern)});
  }
  if (name == "llama3" || name == "llama-bpe" || name == "llama-v3") {
    return FromPatterns({std::string(kLlama3Pattern)});
  }
  if (name == "qwen2") {
    return FromPatterns({std::string(kQwen2Pattern)});
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "tokenizer.ggml.pre = \"", std::string(name),
      "\" is not a supported pre-tokenizer (supported: default, gpt2, smollm, starcoder, "
      "llama3, llama-bpe, llama-v3, qwen2)"));
}

void PreTokenizer::SplitStep(const Step& step, std::string_view piece, MatchData& md,
                             std::vector<std::string_view>& out) const {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  size_t emitted = 0;  // end of the last piece pushed
  size_t search = 0;
  while (search < piece.size()) {
    // The text was validated once up front; re-checking per match would be quadratic.
    uint32_t options = PCRE2_NO_UTF_CHECK;
    int rc = pcre2_match(step.code, subject, piece.size(), search, options, md.data, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // Very long runs can exhaust the JIT stack; the interpreter has no such limit.
      rc = pcre2_match(step.code, subject, piece.size(), search, options | PCRE2_NO_JIT,
                       md.data, nullptr);
    }
    if (rc < 0) break;  // no match (or an error): the rest is one gap piece
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.data);
    const size_t start = ov[0], end = ov[1];
    if (end == start) {
      // An empty match emits nothing; step over one code point so the loop progresses.
      search = start + 1;
      while (search < piece.size() && (static_cast<uint8_t>(piece[search]) & 0xC0) == 0x80) {
        ++search;
      }
      continue;
    }
    if (start > emitted) out.push_back(piece.substr(emitted, start - emitted));
    out.push_back(piece.substr(start, end - start));
    emitted = search = end;
  }
  if (emitted < piece.size()) out.push_back(piece.substr(emitted));
}

void PreTokenizer::Split(std::string_view text, std::vector<std::string_view>& out) const {
  if (text.empty()) return;
  if (steps_.empty()) {
    out.push_back(text);
    return;
  }
  MatchData md;  // per call: pcre2 match data is not shareable between threads
  const size_t first = out.size();
  SplitStep(*steps_[0], text, md, out);
  std::vector<std::string_view> next;
  for (size_t s = 1; s < steps_.size(); ++s) {
    next.clear();
    for (size_t i = first; i < out.size(); ++i) SplitStep(*steps_[s], out[i], md, next);
    out.resize(first);
    out.insert(out.end(), next.begin(), next.end());
  }
}

}  // namespace specd::tok
