// specd-inspect: prints what a GGUF model file holds — format facts, the model's
// hyper-parameters, the tokenizer, the chat template and the tensor table.
//   specd-inspect [--metadata] FILE.gguf
// A bad file prints the reader's message (problem and byte offset) to stderr and exits 1.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/gguf/ggml_type.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_value.h"

namespace specd::gguf {
namespace {

// Printable form of arbitrary bytes: control characters escaped, UTF-8 kept.
std::string Escape(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      default:
        if (c < 0x20 || c == 0x7F) {
          out += absl::StrFormat("\\x%02x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

std::string Quote(std::string_view s, size_t max_chars = 0) {
  if (max_chars != 0 && s.size() > max_chars) {
    return absl::StrFormat("\"%s\"... (%d bytes)", Escape(s.substr(0, max_chars)), s.size());
  }
  return "\"" + Escape(s) + "\"";
}

std::string TypeLabel(const Value& v) {
  if (const auto* a = std::get_if<ArrayValue>(&v.data)) {
    return absl::StrFormat("array[%s]", ValueTypeName(a->element_type));
  }
  return ValueTypeName(v.type);
}

// One-line rendering; arrays show their length and the first few elements.
std::string Render(const Value& v, size_t max_string = 120) {
  if (const auto* u = std::get_if<uint64_t>(&v.data)) return absl::StrCat(*u);
  if (const auto* i = std::get_if<int64_t>(&v.data)) return absl::StrCat(*i);
  if (const auto* d = std::get_if<double>(&v.data)) {
    // float32 values print at float precision (1e-05, not 9.99999975e-06).
    return absl::StrFormat(v.type == ValueType::kFloat32 ? "%.7g" : "%.17g", *d);
  }
  if (const auto* b = std::get_if<bool>(&v.data)) return *b ? "true" : "false";
  if (const auto* s = std::get_if<std::string>(&v.data)) return Quote(*s, max_string);
  const auto& a = std::get<ArrayValue>(v.data);
  constexpr size_t kShow = 6;
  std::vector<std::string> items;
  for (size_t i = 0; i < a.elements.size() && i < kShow; ++i) {
    items.push_back(Render(a.elements[i], 40));
  }
  return absl::StrFormat("len=%d [%s%s]", a.elements.size(), absl::StrJoin(items, ", "),
                         a.elements.size() > kShow ? ", ..." : "");
}

std::string HumanBytes(uint64_t n) {
  if (n >= (uint64_t{1} << 30)) return absl::StrFormat("%.2f GiB", n / 1073741824.0);
  if (n >= (uint64_t{1} << 20)) return absl::StrFormat("%.2f MiB", n / 1048576.0);
  if (n >= 1024) return absl::StrFormat("%.2f KiB", n / 1024.0);
  return absl::StrFormat("%d B", n);
}

class Inspector {
 public:
  explicit Inspector(const GgufFile& g) : g_(g) {
    auto arch = g_.GetString("general.architecture");
    arch_ = arch.ok() ? *arch : "";
    auto tokens = g_.GetStringArray("tokenizer.ggml.tokens");
    if (tokens.ok()) tokens_ = std::move(*tokens);
  }

  // "key: value" with graceful fallbacks for absent keys or unexpected types.
  void Line(std::string_view label, std::string_view key) const {
    absl::PrintF("  %-18s %s\n", std::string(label) + ":", Describe(key));
  }
  std::string Describe(std::string_view key) const {
    const Value* v = g_.Find(key);
    return v == nullptr ? "(absent)" : Render(*v);
  }
  std::string ArchKey(std::string_view suffix) const { return arch_ + "." + std::string(suffix); }

  void PrintFile() const {
    absl::PrintF("File:        %s\n", g_.path());
    absl::PrintF("Version:     GGUF v%d\n", g_.version());
    absl::PrintF("Size:        %d bytes (%s)\n", g_.file_size(), HumanBytes(g_.file_size()));
    absl::PrintF("Alignment:   %d\n", g_.alignment());
    absl::PrintF("Data offset: %d\n", g_.data_offset());
    absl::PrintF("Metadata:    %d keys\n", g_.metadata().size());
    absl::PrintF("Tensors:     %d\n\n", g_.tensors().size());
  }

  void PrintModel() const {
    absl::PrintF("Model\n");
    absl::PrintF("  %-18s %s\n", "architecture:", arch_.empty() ? "(absent)" : arch_);
    Line("name", "general.name");
    Line("file type", "general.file_type");
    if (arch_.empty()) {
      absl::PrintF("  (no general.architecture: hyper-parameters unknown)\n\n");
      return;
    }
    Line("context length", ArchKey("context_length"));
    Line("embedding", ArchKey("embedding_length"));
    Line("layers", ArchKey("block_count"));
    Line("heads", ArchKey("attention.head_count"));
    Line("kv heads", ArchKey("attention.head_count_kv"));
    // Head dim: explicit key_length when present, otherwise embedding / heads.
    if (g_.Find(ArchKey("attention.key_length")) != nullptr) {
      Line("head dim", ArchKey("attention.key_length"));
    } else {
      auto emb = g_.GetInt(ArchKey("embedding_length"));
      auto heads = g_.GetInt(ArchKey("attention.head_count"));
      if (emb.ok() && heads.ok() && *heads > 0) {
        absl::PrintF("  %-18s %d (embedding / heads)\n", "head dim:", *emb / *heads);
      } else {
        absl::PrintF("  %-18s (unknown)\n", "head dim:");
      }
    }
    Line("ffn", ArchKey("feed_forward_length"));
    Line("rope base", ArchKey("rope.freq_base"));
    Line("rope dims", ArchKey("rope.dimension_count"));
    if (g_.Find(ArchKey("rope.scaling.type")) != nullptr) {
      absl::PrintF("  %-18s type=%s factor=%s original_ctx=%s\n", "rope scaling:",
                   Describe(ArchKey("rope.scaling.type")), Describe(ArchKey("rope.scaling.factor")),
                   Describe(ArchKey("rope.scaling.original_context_length")));
    } else {
      absl::PrintF("  %-18s none\n", "rope scaling:");
    }
    Line("rms eps", ArchKey("attention.layer_norm_rms_epsilon"));
    if (g_.Find(ArchKey("vocab_size")) != nullptr) {
      Line("vocab size", ArchKey("vocab_size"));
    } else if (!tokens_.empty()) {
      absl::PrintF("  %-18s %d (from tokenizer.ggml.tokens)\n", "vocab size:", tokens_.size());
    } else {
      absl::PrintF("  %-18s (absent)\n", "vocab size:");
    }
    absl::PrintF("\n");
  }

  void PrintTokenizer() const {
    absl::PrintF("Tokenizer\n");
    Line("model", "tokenizer.ggml.model");
    Line("pre-tokenizer", "tokenizer.ggml.pre");
    absl::PrintF("  %-18s %s\n", "vocabulary:",
                 g_.Find("tokenizer.ggml.tokens") == nullptr
                     ? std::string("(absent)")
                     : absl::StrFormat("%d tokens", tokens_.size()));
    const Value* merges = g_.Find("tokenizer.ggml.merges");
    const auto* merges_arr = merges ? std::get_if<ArrayValue>(&merges->data) : nullptr;
    absl::PrintF("  %-18s %s\n", "merges:",
                 merges_arr ? absl::StrCat(merges_arr->elements.size()) : "(absent)");
    const std::pair<const char*, const char*> specials[] = {
        {"bos", "tokenizer.ggml.bos_token_id"},   {"eos", "tokenizer.ggml.eos_token_id"},
        {"eot", "tokenizer.ggml.eot_token_id"},   {"unk", "tokenizer.ggml.unknown_token_id"},
        {"pad", "tokenizer.ggml.padding_token_id"}};
    for (const auto& [label, key] : specials) {
      absl::PrintF("  %-18s %s\n", std::string(label) + ":", SpecialToken(key));
    }
    Line("add_bos", "tokenizer.ggml.add_bos_token");
    Line("add_eos", "tokenizer.ggml.add_eos_token");
    absl::PrintF("\n");
  }

  std::string SpecialToken(const char* key) const {
    if (g_.Find(key) == nullptr) return "(absent)";
    auto id = g_.GetInt(key);
    if (!id.ok()) return absl::StrFormat("%s (not an integer)", Describe(key));
    if (*id < 0 || static_cast<uint64_t>(*id) >= tokens_.size()) {
      return absl::StrFormat("%d (out of vocabulary range)", *id);
    }
    return absl::StrFormat("%d %s", *id, Quote(tokens_[static_cast<size_t>(*id)]));
  }

  void PrintChatTemplate() const {
    auto tmpl = g_.GetString("tokenizer.chat_template");
    if (!tmpl.ok()) {
      absl::PrintF("Chat template: (absent)\n\n");
      return;
    }
    absl::PrintF("Chat template (%d bytes):\n-----\n%s\n-----\n\n", tmpl->size(), *tmpl);
  }

  void PrintTensors() const {
    struct Summary {
      int count = 0;
      int64_t elements = 0;
      uint64_t bytes = 0;
    };
    std::map<std::string, Summary> by_type;
    int64_t total_elements = 0;
    uint64_t total_bytes = 0;
    size_t name_width = 4;
    for (const TensorInfo& t : g_.tensors()) {
      Summary& s = by_type[std::string(GgmlTypeName(t.type))];
      ++s.count;
      s.elements += t.num_elements;
      s.bytes += t.num_bytes;
      total_elements += t.num_elements;
      total_bytes += t.num_bytes;
      name_width = std::max(name_width, t.name.size());
    }
    absl::PrintF("Tensor types\n");
    for (const auto& [type, s] : by_type) {
      absl::PrintF("  %-6s %5d tensors %12d elements %14d bytes (%s)\n", type, s.count,
                   s.elements, s.bytes, HumanBytes(s.bytes));
    }
    absl::PrintF("\nTensors\n");
    absl::PrintF("  %-*s  %-5s  %-22s %12s\n", static_cast<int>(name_width), "name", "type",
                 "dims", "bytes");
    for (const TensorInfo& t : g_.tensors()) {
      absl::PrintF("  %-*s  %-5s  %-22s %12d\n", static_cast<int>(name_width), t.name,
                   GgmlTypeName(t.type), "[" + absl::StrJoin(t.dims, ", ") + "]", t.num_bytes);
    }
    absl::PrintF("Total: %d tensors, %d elements (%.1fM params), %d bytes (%s)\n",
                 g_.tensors().size(), total_elements, total_elements / 1e6, total_bytes,
                 HumanBytes(total_bytes));
  }

  void PrintMetadata() const {
    absl::PrintF("Metadata (%d keys)\n", g_.metadata().size());
    for (const auto& [key, value] : g_.metadata()) {
      absl::PrintF("  %-45s %-14s %s\n", key, TypeLabel(value), Render(value));
    }
    absl::PrintF("\n");
  }

 private:
  const GgufFile& g_;
  std::string arch_;
  std::vector<std::string> tokens_;
};

int Main(int argc, char** argv) {
  bool metadata = false;
  std::string path;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--metadata") {
      metadata = true;
    } else if (arg == "-h" || arg == "--help") {
      absl::PrintF("usage: specd-inspect [--metadata] FILE.gguf\n");
      return 0;
    } else if (!arg.empty() && arg[0] == '-') {
      absl::FPrintF(stderr, "specd-inspect: unknown option %s\n", arg);
      return 2;
    } else if (path.empty()) {
      path = std::string(arg);
    } else {
      absl::FPrintF(stderr, "specd-inspect: only one file may be given\n");
      return 2;
    }
  }
  if (path.empty()) {
    absl::FPrintF(stderr, "usage: specd-inspect [--metadata] FILE.gguf\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  if (!file.ok()) {
    absl::FPrintF(stderr, "specd-inspect: %s\n", file.status().ToString());
    return 1;
  }
  Inspector in(**file);
  in.PrintFile();
  if (metadata) in.PrintMetadata();
  in.PrintModel();
  in.PrintTokenizer();
  in.PrintChatTemplate();
  in.PrintTensors();
  return 0;
}

}  // namespace
}  // namespace specd::gguf

int main(int argc, char** argv) { return specd::gguf::Main(argc, argv); }
