#include "common/tokenizer/chat_template.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/tokenizer/utf8.h"

namespace specd::tok {
namespace {

// Extracts the ChatML default system prompt from templates of the form
//   {% if loop.first and messages[0]['role'] != 'system' %}
//     {{ '<|im_start|>system\n<PROMPT><|im_end|>\n' }}{% endif %}
// The newline may be literal or the two characters "\n" (JSON-escaped template sources).
bool FindDefaultSystem(std::string_view jinja, std::string* prompt) {
  size_t cond = jinja.find("messages[0]['role'] != 'system'");
  if (cond == std::string_view::npos) cond = jinja.find("messages[0][\"role\"] != \"system\"");
  if (cond == std::string_view::npos) return false;
  constexpr std::string_view kOpen = "<|im_start|>system";
  const size_t open = jinja.find(kOpen, cond);
  if (open == std::string_view::npos) return false;
  size_t start = open + kOpen.size();
  if (jinja.substr(start).starts_with("\\n")) {
    start += 2;
  } else if (jinja.substr(start).starts_with("\n")) {
    start += 1;
  } else {
    return false;
  }
  const size_t end = jinja.find("<|im_end|>", start);
  if (end == std::string_view::npos) return false;
  *prompt = absl::StrReplaceAll(absl::string_view(jinja.data() + start, end - start), {{"\\n", "\n"}});
  return true;
}

bool Has(std::string_view s, std::string_view needle) {
  return s.find(needle) != std::string_view::npos;
}

std::string Strip(std::string_view s) { return std::string(StripPythonSpace(s)); }

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::FromJinja(std::string_view jinja,
                                                     std::string bos_token,
                                                     std::string eos_token) {
  ChatTemplate t;
  t.bos_ = std::move(bos_token);
  t.eos_ = std::move(eos_token);
  // Templates with tool calling or date logic render differently; refuse them rather than
  // approximate.
  const bool has_tools = Has(jinja, "tool") ||
                         Has(jinja, "Cutting Knowledge") ||
                         Has(jinja, "ipython");
  if (Has(jinja, "<|start_header_id|>") &&
      Has(jinja, "<|end_header_id|>") && Has(jinja, "<|eot_id|>")) {
    if (has_tools) {
      return absl::UnimplementedError(
          "chat template: Llama 3.1+ templates (tools / knowledge date) are not supported; only "
          "the Llama 3 template is");
    }
    t.kind_ = Kind::kLlama3;
    return t;
  }
  if (Has(jinja, "[INST]") && Has(jinja, "[/INST]") &&
      Has(jinja, "<<SYS>>")) {
    t.kind_ = Kind::kLlama2;
    return t;
  }
  if (Has(jinja, "<|im_start|>") && Has(jinja, "<|im_end|>")) {
    if (has_tools) {
      return absl::UnimplementedError(
          "chat template: ChatML templates with tool calling are not supported");
    }
    t.kind_ = Kind::kChatMl;
    t.has_default_system_ = FindDefaultSystem(jinja, &t.default_system_);
    return t;
  }
  std::string head(jinja.substr(0, 80));
  return absl::UnimplementedError(absl::StrCat(
      "chat template not recognised (supported: ChatML, Llama 3, Llama 2); it begins: \"", head,
      "\""));
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromGguf(const gguf::GgufFile& file) {
  absl::StatusOr<std::string> jinja = file.GetString("tokenizer.chat_template");
  if (!jinja.ok()) return jinja.status();
  std::string bos, eos;
  if (file.Find("tokenizer.ggml.bos_token_id") != nullptr ||
      file.Find("tokenizer.ggml.eos_token_id") != nullptr) {
    absl::StatusOr<std::vector<std::string>> tokens = file.GetStringArray("tokenizer.ggml.tokens");
    if (!tokens.ok()) return tokens.status();
    for (auto [key, dst] : {std::pair{"tokenizer.ggml.bos_token_id", &bos},
                            std::pair{"tokenizer.ggml.eos_token_id", &eos}}) {
      if (file.Find(key) == nullptr) continue;
      absl::StatusOr<int64_t> id = file.GetInt(key);
      if (!id.ok()) return id.status();
      if (*id < 0 || *id >= static_cast<int64_t>(tokens->size())) {
        return absl::InvalidArgumentError(
            absl::StrCat(key, " = ", *id, " is outside the vocabulary"));
      }
      *dst = (*tokens)[*id];
    }
  }
  return FromJinja(*jinja, std::move(bos), std::move(eos));
}

absl::StatusOr<std::string> ChatTemplate::Apply(absl::Span<const ChatMessage> messages,
                                                bool add_generation_prompt) const {
  std::string out;
  switch (kind_) {
    case Kind::kChatMl:
      for (size_t i = 0; i < messages.size(); ++i) {
        if (i == 0 && has_default_system_ && messages[0].role != "system") {
          absl::StrAppend(&out, "<|im_start|>system\n", default_system_, "<|im_end|>\n");
        }
        absl::StrAppend(&out, "<|im_start|>", messages[i].role, "\n", messages[i].content,
                        "<|im_end|>\n");
      }
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;

    case Kind::kLlama3:
      for (size_t i = 0; i < messages.size(); ++i) {
        if (i == 0) out += bos_;
        absl::StrAppend(&out, "<|start_header_id|>", messages[i].role, "<|end_header_id|>\n\n",
                        Strip(messages[i].content), "<|eot_id|>");
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;

    case Kind::kLlama2: {
      if (messages.empty()) {
        return absl::InvalidArgumentError("chat template (Llama 2): no messages");
      }
      absl::Span<const ChatMessage> turns = messages;
      const bool has_system = messages[0].role == "system";
      if (has_system) turns.remove_prefix(1);
      for (size_t i = 0; i < turns.size(); ++i) {
        const bool is_user = turns[i].role == "user";
        if (is_user != (i % 2 == 0)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "chat template (Llama 2): conversation roles must alternate "
              "user/assistant/user/assistant/... (message ",
              i + (has_system ? 1 : 0), " has role \"", turns[i].role, "\")"));
        }
        std::string content = turns[i].content;
        if (i == 0 && has_system) {
          content = absl::StrCat("<<SYS>>\n", messages[0].content, "\n<</SYS>>\n\n", content);
        }
        if (is_user) {
          absl::StrAppend(&out, bos_, "[INST] ", Strip(content), " [/INST]");
        } else if (turns[i].role == "assistant") {
          absl::StrAppend(&out, " ", Strip(content), " ", eos_);
        }
      }
      return out;
    }
  }
  return out;
}

}  // namespace specd::tok
