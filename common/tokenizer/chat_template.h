// Chat templates of the supported model families, implemented natively (no Jinja engine).
//
// The GGUF's tokenizer.chat_template (a Jinja string) is only used to recognise the family and
// to read constants from it (ChatML's default system prompt); a template that is not recognised
// is an UNIMPLEMENTED error rather than a guess. Rendered text contains special-token text
// (e.g. "<|im_start|>", Llama's "<|begin_of_text|>" / "<s>"): encode it with
// parse_special = true and add_special = false when the template already emits BOS.
#ifndef SPECD_COMMON_TOKENIZER_CHAT_TEMPLATE_H_
#define SPECD_COMMON_TOKENIZER_CHAT_TEMPLATE_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/gguf/gguf_file.h"

namespace specd::tok {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

class ChatTemplate {
 public:
  enum class Kind { kChatMl, kLlama3, kLlama2 };

  // Recognises `jinja`. bos/eos_token are the texts the template's bos_token / eos_token stand
  // for.
  static absl::StatusOr<ChatTemplate> FromJinja(std::string_view jinja, std::string bos_token,
                                                std::string eos_token);
  // Reads tokenizer.chat_template and the BOS/EOS texts from the file.
  static absl::StatusOr<ChatTemplate> FromGguf(const gguf::GgufFile& file);

  // Renders like the original template. Llama 2 requires alternating user/assistant turns
  // (after an optional system message) and ignores add_generation_prompt, as its template does;
  // a violation is INVALID_ARGUMENT.
  absl::StatusOr<std::string> Apply(absl::Span<const ChatMessage> messages,
                                    bool add_generation_prompt) const;

  Kind kind() const { return kind_; }
  // ChatML: the system message inserted when the first message is not a system message.
  const std::string& default_system_prompt() const { return default_system_; }
  bool has_default_system_prompt() const { return has_default_system_; }

 private:
  ChatTemplate() = default;
  Kind kind_ = Kind::kChatMl;
  std::string bos_, eos_;
  std::string default_system_;
  bool has_default_system_ = false;
};

}  // namespace specd::tok

#endif  // SPECD_COMMON_TOKENIZER_CHAT_TEMPLATE_H_
