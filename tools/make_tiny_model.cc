// specd-make-tiny-model: writes a small random-weight Llama-architecture GGUF for tests and
// experiments (see testing/tiny_model.h).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "common/gguf/ggml_type.h"
#include "testing/tiny_model.h"

namespace {

constexpr char kUsage[] =
    "usage: specd-make-tiny-model -o OUT.gguf [--arch llama|qwen2] [--layers N] [--dim N]\n"
    "       [--ffn N] [--heads N] [--kv-heads N] [--ctx N] [--vocab N] [--type TYPE]\n"
    "       [--seed N] [--untied] [--tokenizer-from FILE.gguf] [--weight-scale S]\n"
    "       [--tile-weights]  (repeat one random block: a shapes-only benchmark model, fast)\n"
    "  TYPE: F32 F16 BF16 Q8_0 Q4_0 Q4_1 (2-D weights; norms stay F32)\n";

bool ParseType(const std::string& s, specd::gguf::GgmlType* t) {
  using specd::gguf::GgmlType;
  for (GgmlType c : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                     GgmlType::kQ4_0, GgmlType::kQ4_1}) {
    if (s == specd::gguf::GgmlTypeName(c)) {
      *t = c;
      return true;
    }
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  specd::testing::TinyModelSpec spec;
  std::string out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    auto int_flag = [&](int32_t* v) {
      if (!has_value || !absl::SimpleAtoi(argv[++i], v)) {
        std::fprintf(stderr, "specd-make-tiny-model: %s needs an integer\n", a.c_str());
        std::exit(2);
      }
    };
    if (a == "-o" && has_value) {
      out = argv[++i];
    } else if (a == "--arch" && has_value) {
      spec.architecture = argv[++i];
    } else if (a == "--layers") {
      int_flag(&spec.num_layers);
    } else if (a == "--dim") {
      int_flag(&spec.embedding_dim);
    } else if (a == "--ffn") {
      int_flag(&spec.ffn_dim);
    } else if (a == "--heads") {
      int_flag(&spec.num_heads);
    } else if (a == "--kv-heads") {
      int_flag(&spec.num_kv_heads);
    } else if (a == "--ctx") {
      int_flag(&spec.context_length);
    } else if (a == "--vocab") {
      int_flag(&spec.vocab_size);
    } else if (a == "--seed") {
      int32_t seed;
      int_flag(&seed);
      spec.seed = static_cast<uint64_t>(seed);
    } else if (a == "--type" && has_value) {
      if (!ParseType(argv[++i], &spec.weight_type)) {
        std::fprintf(stderr, "specd-make-tiny-model: unknown --type %s\n%s", argv[i], kUsage);
        return 2;
      }
      spec.embedding_type = spec.weight_type;
    } else if (a == "--weight-scale" && has_value) {
      spec.weight_scale = std::strtof(argv[++i], nullptr);
      if (!(spec.weight_scale > 0)) {
        std::fprintf(stderr, "specd-make-tiny-model: --weight-scale must be > 0\n%s", kUsage);
        return 2;
      }
    } else if (a == "--tile-weights") {
      spec.tile_random = true;
    } else if (a == "--untied") {
      spec.tied_output = false;
    } else if (a == "--tokenizer-from" && has_value) {
      spec.tokenizer_from = argv[++i];
    } else {
      std::fprintf(stderr, "specd-make-tiny-model: unknown argument %s\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  if (out.empty()) {
    std::fprintf(stderr, "specd-make-tiny-model: -o OUT.gguf is required\n%s", kUsage);
    return 2;
  }
  const absl::Status st = specd::testing::WriteTinyModel(spec, out);
  if (!st.ok()) {
    std::fprintf(stderr, "specd-make-tiny-model: %s\n", st.ToString().c_str());
    return 1;
  }
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
