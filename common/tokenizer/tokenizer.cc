#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/bpe.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/pretokenizer.h"
#include "common/tokenizer/spm.h"
#include "common/tokenizer/utf8.h"

namespace specd::tok {
namespace {

// Texts of control tokens that end a turn or a document in the supported families.
constexpr std::string_view kEndOfGenerationTexts[] = {
    "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<|eom_id|>",
    "</s>",       "<|end|>",    "<end_of_turn>",
};
// Preferred end-of-turn tokens when the file names none, in order.
constexpr std::string_view kEndOfTurnTexts[] = {"<|eot_id|>", "<|im_end|>", "<end_of_turn>",
                                                "<|end|>"};

const std::string& EmptyString() {
  static const std::string* const s = new std::string();
  return *s;
}

class Fnv1a {
 public:
  void Bytes(std::string_view s) {
    U64(s.size());
    for (char c : s) Byte(static_cast<uint8_t>(c));
  }
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) Byte(static_cast<uint8_t>(v >> (8 * i)));
  }
  uint64_t value() const { return h_; }

 private:
  void Byte(uint8_t b) {
    h_ ^= b;
    h_ *= 0x100000001b3ULL;
  }
  uint64_t h_ = 0xcbf29ce484222325ULL;
};

// Pre-tokenizers whose HF configuration sets ignore_merges.
bool IgnoresMerges(std::string_view pre) {
  return pre == "llama3" || pre == "llama-bpe" || pre == "llama-v3";
}

}  // namespace

Tokenizer::Tokenizer(Vocab vocab) : vocab_(std::move(vocab)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const gguf::GgufFile& file) {
  absl::StatusOr<Vocab> vocab = LoadVocab(file);
  if (!vocab.ok()) return vocab.status();
  return FromVocab(*std::move(vocab));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromVocab(Vocab vocab) {
  if (absl::Status s = vocab.Validate(); !s.ok()) return s;
  std::unique_ptr<Tokenizer> t(new Tokenizer(std::move(vocab)));
  if (absl::Status s = t->Init(); !s.ok()) return s;
  return t;
}

absl::Status Tokenizer::Init() {
  const int32_t n = vocab_.size();
  const bool spm = vocab_.model == ModelKind::kSentencePieceBpe;
  if (spm) {
    absl::StatusOr<std::unique_ptr<SpmModel>> m = SpmModel::Create(vocab_);
    if (!m.ok()) return m.status();
    spm_ = *std::move(m);
  } else {
    absl::StatusOr<std::unique_ptr<PreTokenizer>> p = PreTokenizer::ForName(vocab_.pre);
    if (!p.ok()) return p.status();
    pre_ = *std::move(p);
    absl::StatusOr<std::unique_ptr<BpeModel>> m = BpeModel::Create(vocab_, IgnoresMerges(vocab_.pre));
    if (!m.ok()) return m.status();
    bpe_ = *std::move(m);
  }

  token_bytes_.resize(n);
  text_to_id_.reserve(n);
  for (int32_t i = 0; i < n; ++i) {
    const std::string& text = vocab_.tokens[i];
    text_to_id_.try_emplace(text, i);
    const TokenType type = vocab_.type(i);
    std::string& bytes = token_bytes_[i];
    if (type == TokenType::kControl || type == TokenType::kUserDefined ||
        type == TokenType::kUnknown) {
      bytes = text;  // added tokens are stored as plain text in both vocab kinds
    } else if (!spm) {
      bytes = ByteLevelDecode(text);
    } else if (type == TokenType::kByte) {
      const int value = ParseByteToken(text);
      if (value >= 0) {
        bytes.assign(1, static_cast<char>(value));
      } else {
        bytes = text;
      }
    } else {
      for (size_t pos = 0; pos < text.size();) {
        if (std::string_view(text).substr(pos).starts_with(kSpmSpace)) {
          bytes.push_back(' ');
          pos += kSpmSpace.size();
        } else {
          bytes.push_back(text[pos++]);
        }
      }
    }
    if ((type == TokenType::kControl || type == TokenType::kUserDefined) && !text.empty()) {
      specials_.push_back({text, i, type == TokenType::kControl});
    }
  }
  std::stable_sort(specials_.begin(), specials_.end(),
                   [](const Special& a, const Special& b) { return a.text.size() > b.text.size(); });
  specials_by_byte_.resize(256);
  for (uint32_t i = 0; i < specials_.size(); ++i) {
    specials_by_byte_[static_cast<uint8_t>(specials_[i].text[0])].push_back(i);
  }

  eot_id_ = vocab_.eot_id;
  for (std::string_view text : kEndOfTurnTexts) {
    if (eot_id_ >= 0) break;
    const int32_t id = TokenId(text);
    if (id >= 0 && vocab_.type(id) == TokenType::kControl) eot_id_ = id;
  }
  if (vocab_.eos_id >= 0) eog_ids_.insert(vocab_.eos_id);
  if (eot_id_ >= 0) eog_ids_.insert(eot_id_);
  for (std::string_view text : kEndOfGenerationTexts) {
    const int32_t id = TokenId(text);
    if (id >= 0 &&
        (vocab_.type(id) == TokenType::kControl || vocab_.type(id) == TokenType::kUserDefined)) {
      eog_ids_.insert(id);
    }
  }

  Fnv1a h;
  h.U64(static_cast<uint64_t>(vocab_.model));
  h.U64(vocab_.tokens.size());
  for (int32_t i = 0; i < n; ++i) {
    h.Bytes(vocab_.tokens[i]);
    h.U64(static_cast<uint64_t>(vocab_.type(i)));
  }
  h.U64(vocab_.merges.size());
  for (const std::string& m : vocab_.merges) h.Bytes(m);
  fingerprint_ = h.value();
  return absl::OkStatus();
}

int32_t Tokenizer::TokenId(std::string_view text) const {
  auto it = text_to_id_.find(text);
  return it == text_to_id_.end() ? -1 : it->second;
}

const std::string& Tokenizer::TokenBytes(int32_t id) const {
  return IsValidId(id) ? token_bytes_[id] : EmptyString();
}

const std::string& Tokenizer::TokenText(int32_t id) const {
  return IsValidId(id) ? vocab_.tokens[id] : EmptyString();
}

size_t Tokenizer::FindSpecial(std::string_view text, size_t from, bool parse_special,
                              const Special** found) const {
  if (specials_.empty()) return std::string_view::npos;
  for (size_t pos = from; pos < text.size(); ++pos) {
    for (uint32_t idx : specials_by_byte_[static_cast<uint8_t>(text[pos])]) {
      const Special& s = specials_[idx];
      if (s.control && !parse_special) continue;
      if (text.compare(pos, s.text.size(), s.text) == 0) {
        *found = &s;
        return pos;
      }
    }
  }
  return std::string_view::npos;
}

// Long inputs repeat words a lot. The cache lives for one Encode call (keys view the input), so
// Encode stays thread-safe and lock-free; values locate the word's ids earlier in `out`.
struct Tokenizer::WordCache {
  struct Span {
    size_t start, len;
  };
  absl::flat_hash_map<std::string_view, Span> map;
};

void Tokenizer::EncodeFragment(std::string_view text, bool after_control_or_start,
                               WordCache& cache, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  if (spm_ != nullptr) {
    spm_->Encode(text, vocab_.add_space_prefix && after_control_or_start, out);
    return;
  }
  std::vector<std::string_view> words;
  pre_->Split(text, words);
  // Short inputs skip the cache: hashing would cost more than it saves.
  constexpr size_t kCacheFrom = 64;
  if (words.size() < kCacheFrom && cache.map.empty()) {
    for (std::string_view w : words) bpe_->EncodeWord(w, out);
    return;
  }
  for (std::string_view w : words) {
    auto [it, inserted] = cache.map.try_emplace(w, WordCache::Span{out.size(), 0});
    if (inserted) {
      bpe_->EncodeWord(w, out);
      it->second.len = out.size() - it->second.start;
    } else {
      const WordCache::Span s = it->second;
      const size_t at = out.size();
      out.resize(at + s.len);
      std::copy_n(out.begin() + s.start, s.len, out.begin() + at);
    }
  }
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text, bool add_special,
                                                       bool parse_special) const {
  if (absl::Status s = ValidateUtf8(text); !s.ok()) return s;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special && vocab_.add_bos && vocab_.bos_id >= 0) out.push_back(vocab_.bos_id);
  size_t pos = 0;
  bool fresh = true;  // at the start or right after a control token (SentencePiece prefix)
  WordCache cache;
  while (pos < text.size()) {
    const Special* special = nullptr;
    const size_t at = FindSpecial(text, pos, parse_special, &special);
    const size_t end = at == std::string_view::npos ? text.size() : at;
    if (end > pos) {
      EncodeFragment(text.substr(pos, end - pos), fresh, cache, out);
      fresh = false;
    }
    if (special == nullptr) break;
    out.push_back(special->id);
    fresh = special->control;
    pos = at + special->text.size();
  }
  if (add_special && vocab_.add_eos && vocab_.eos_id >= 0) out.push_back(vocab_.eos_id);
  return out;
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special) const {
  std::string out;
  bool first = true;
  for (int32_t id : ids) {
    if (!IsValidId(id)) continue;
    if (skip_special && vocab_.type(id) == TokenType::kControl) continue;
    std::string_view bytes = token_bytes_[id];
    if (first && strips_leading_space() && vocab_.type(id) != TokenType::kControl &&
        bytes.starts_with(' ')) {
      bytes.remove_prefix(1);
    }
    first = false;
    out.append(bytes);
  }
  return out;
}

absl::StatusOr<std::string> Tokenizer::DecodeChecked(absl::Span<const int32_t> ids,
                                                     bool skip_special) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!IsValidId(ids[i])) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", ids[i], " at index ", i,
                                                     " is outside the vocabulary [0, ",
                                                     vocab_.size(), ")"));
    }
  }
  return Decode(ids, skip_special);
}

}  // namespace specd::tok
