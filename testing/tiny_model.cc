#include "testing/tiny_model.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_writer.h"

namespace specd::testing {
namespace {

using gguf::GgmlType;
using gguf::Value;
using gguf::ValueType;

// GPT-2's reversible byte -> printable code point table, as UTF-8 strings.
std::vector<std::string> ByteLevelAlphabet() {
  std::vector<int> cps(256, -1);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    cps[b] = printable ? b : next++;
  }
  std::vector<std::string> out;
  for (int cp : cps) {
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    out.push_back(s);
  }
  return out;
}

constexpr char kChatMlTemplate[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

absl::Status AddSyntheticTokenizer(gguf::GgufWriter& w, int32_t min_vocab, int32_t eos_id,
                                   int32_t* vocab_size) {
  std::vector<std::string> tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  std::vector<int32_t> types = {3, 3, 3};
  const std::vector<std::string> bytes = ByteLevelAlphabet();
  for (const std::string& b : bytes) {
    tokens.push_back(b);
    types.push_back(1);
  }
  const std::string sp = bytes[' '];  // "Ġ"
  // Each merge joins two tokens that already exist.
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"t", "h"}, {"h", "e"}, {"i", "n"}, {"e", "r"}, {"a", "n"}, {"r", "e"}, {"o", "n"},
      {"a", "t"}, {"e", "n"}, {"n", "d"}, {"e", "s"}, {"o", "r"}, {"t", "e"}, {"o", "f"},
      {"e", "d"}, {"i", "s"}, {"i", "t"}, {"a", "l"}, {"a", "r"}, {"s", "t"}, {"t", "o"},
      {"n", "g"}, {"o", "u"}, {"l", "e"}, {sp, "t"}, {sp, "a"}, {sp, "s"}, {sp, "w"},
      {sp, "o"}, {sp, "i"}, {sp + "t", "h"}, {sp + "th", "e"}, {"in", "g"}, {sp, "c"},
      {sp, "b"}, {sp + "a", "nd"}, {sp + "o", "f"}, {sp + "t", "o"}, {sp + "i", "n"},
      {"\n", "\n"}};
  std::vector<Value> merge_values;
  for (const auto& [a, b] : merges) {
    merge_values.push_back(Value::Str(a + " " + b));
    tokens.push_back(a + b);
    types.push_back(1);
  }
  if (min_vocab > 0 && min_vocab < static_cast<int32_t>(tokens.size())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tiny model: vocab_size %d is below the %d tokens the synthetic tokenizer needs",
        min_vocab, tokens.size()));
  }
  for (int32_t i = 0; static_cast<int32_t>(tokens.size()) < min_vocab; ++i) {
    tokens.push_back(absl::StrCat("<|unused_", i, "|>"));
    types.push_back(5);  // unused: never produced by encoding
  }
  std::vector<Value> token_values, type_values;
  for (const std::string& t : tokens) token_values.push_back(Value::Str(t));
  for (int32_t t : types) type_values.push_back(Value::I32(t));
  w.Set("tokenizer.ggml.model", Value::Str("gpt2"));
  w.Set("tokenizer.ggml.pre", Value::Str("smollm"));
  w.Set("tokenizer.ggml.tokens", Value::Array(ValueType::kString, std::move(token_values)));
  w.Set("tokenizer.ggml.token_type", Value::Array(ValueType::kInt32, std::move(type_values)));
  w.Set("tokenizer.ggml.merges", Value::Array(ValueType::kString, std::move(merge_values)));
  w.Set("tokenizer.ggml.bos_token_id", Value::U32(1));
  w.Set("tokenizer.ggml.eos_token_id", Value::U32(static_cast<uint32_t>(eos_id)));
  w.Set("tokenizer.ggml.padding_token_id", Value::U32(0));
  w.Set("tokenizer.ggml.add_bos_token", Value::Bool(false));
  w.Set("tokenizer.chat_template", Value::Str(kChatMlTemplate));
  *vocab_size = static_cast<int32_t>(tokens.size());
  return absl::OkStatus();
}

absl::Status CopyTokenizer(gguf::GgufWriter& w, const std::string& path, int32_t* vocab_size) {
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> f = gguf::GgufFile::Open(path);
  if (!f.ok()) return f.status();
  bool have_tokens = false;
  for (const auto& [key, value] : (*f)->metadata()) {
    if (key.rfind("tokenizer.", 0) == 0) {
      w.Set(key, value);
      if (key == "tokenizer.ggml.tokens") {
        *vocab_size = static_cast<int32_t>(std::get<gguf::ArrayValue>(value.data).elements.size());
        have_tokens = true;
      }
    }
  }
  if (!have_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": no tokenizer.ggml.tokens to copy for the tiny model"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteTinyModel(const TinyModelSpec& s, const std::string& path) {
  if (s.num_heads <= 0 || s.num_kv_heads <= 0 || s.num_heads % s.num_kv_heads != 0 ||
      s.embedding_dim % s.num_heads != 0 || (s.embedding_dim / s.num_heads) % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tiny model: embedding_dim %d / heads %d / kv heads %d do not fit", s.embedding_dim,
        s.num_heads, s.num_kv_heads));
  }
  gguf::GgufWriter w;
  int32_t vocab = 0;
  if (s.tokenizer_from.empty()) {
    absl::Status st = AddSyntheticTokenizer(w, s.vocab_size, s.eos_token_id, &vocab);
    if (!st.ok()) return st;
  } else {
    absl::Status st = CopyTokenizer(w, s.tokenizer_from, &vocab);
    if (!st.ok()) return st;
  }
  const std::string a = s.architecture;
  const int32_t head_dim = s.embedding_dim / s.num_heads;
  w.Set("general.architecture", Value::Str(a));
  w.Set("general.name", Value::Str("specd tiny random model"));
  w.Set(a + ".context_length", Value::U32(s.context_length));
  w.Set(a + ".embedding_length", Value::U32(s.embedding_dim));
  w.Set(a + ".block_count", Value::U32(s.num_layers));
  w.Set(a + ".feed_forward_length", Value::U32(s.ffn_dim));
  w.Set(a + ".attention.head_count", Value::U32(s.num_heads));
  w.Set(a + ".attention.head_count_kv", Value::U32(s.num_kv_heads));
  w.Set(a + ".rope.freq_base", Value::F32(s.rope_base));
  w.Set(a + ".rope.dimension_count", Value::U32(head_dim));
  if (s.llama3_rope_scaling) {
    w.Set(a + ".rope.scaling.type", Value::Str("llama3"));
    w.Set(a + ".rope.scaling.factor", Value::F32(s.rope_scaling_factor));
    w.Set(a + ".rope.scaling.low_freq_factor", Value::F32(s.rope_low_freq_factor));
    w.Set(a + ".rope.scaling.high_freq_factor", Value::F32(s.rope_high_freq_factor));
    w.Set(a + ".rope.scaling.original_context_length", Value::U32(s.rope_original_context));
  }
  w.Set(a + ".attention.layer_norm_rms_epsilon", Value::F32(1e-5f));
  w.Set(a + ".vocab_size", Value::U32(vocab));

  std::mt19937_64 rng(s.seed);
  std::normal_distribution<float> normal(0.0f, s.weight_scale);
  std::vector<float> tile;  // s.tile_random: the block every weight repeats
  if (s.tile_random) {
    tile.resize(int64_t{1} << 20);
    for (float& x : tile) x = normal(rng);
  }
  auto random = [&](int64_t n, float scale_mul) {
    std::vector<float> v(n);
    if (s.tile_random) {
      for (int64_t i = 0; i < n; ++i) v[i] = tile[i & ((int64_t{1} << 20) - 1)] * scale_mul;
      return v;
    }
    for (float& x : v) x = normal(rng) * scale_mul;
    return v;
  };
  auto ones_ish = [&](int64_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = 1.0f + normal(rng);
    return v;
  };
  const int64_t D = s.embedding_dim, F = s.ffn_dim;
  const int64_t q_rows = static_cast<int64_t>(s.num_heads) * head_dim;
  const int64_t kv_rows = static_cast<int64_t>(s.num_kv_heads) * head_dim;
  // Embeddings larger than the other weights so logits are peaked enough to be interesting.
  const std::vector<float> embd = random(D * vocab, 12.0f);
  absl::Status st;
  if (!s.omit_token_embd) {
    st = w.AddTensorF32("token_embd.weight", s.embedding_type, {D, vocab}, embd);
    if (!st.ok()) return st;
  }
  if (!(st = w.AddTensorF32("output_norm.weight", GgmlType::kF32, {D}, ones_ish(D))).ok()) {
    return st;
  }
  if (!s.rope_freq_factors.empty()) {
    // Written after the random draws above would shift them: keep the RNG stream unchanged.
    st = w.AddTensorF32("rope_freqs.weight", GgmlType::kF32,
                        {static_cast<int64_t>(s.rope_freq_factors.size())}, s.rope_freq_factors);
    if (!st.ok()) return st;
  }
  if (!s.tied_output) {
    const std::vector<float> head = random(D * vocab, 4.0f);
    if (s.head_token_ids.empty()) {
      st = w.AddTensorF32("output.weight", s.weight_type, {D, vocab}, head);
    } else {
      const int64_t N = static_cast<int64_t>(s.head_token_ids.size());
      std::vector<float> rows;
      for (int32_t id : s.head_token_ids) {
        if (id < 0 || id >= vocab) {
          return absl::InvalidArgumentError(absl::StrCat("head_token_ids: ", id, " out of range"));
        }
        rows.insert(rows.end(), head.begin() + id * D, head.begin() + (id + 1) * D);
      }
      st = w.AddTensorF32("output.weight", s.weight_type, {D, N}, rows);
      if (st.ok()) {
        std::vector<uint8_t> bytes(N * sizeof(int32_t));
        std::memcpy(bytes.data(), s.head_token_ids.data(), bytes.size());
        st = w.AddTensor("output_token_ids", GgmlType::kI32, {N}, std::move(bytes));
      }
    }
    if (!st.ok()) return st;
  } else if (!s.head_token_ids.empty()) {
    return absl::InvalidArgumentError("head_token_ids needs an untied output head");
  }
  const float attn_scale = 1.0f, ffn_scale = 1.0f;
  for (int32_t l = 0; l < s.num_layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    struct T {
      std::string name;
      std::vector<int64_t> dims;
      float scale;
      bool vec;
    };
    std::vector<T> ts = {
        {"attn_norm.weight", {D}, 1, true},           {"ffn_norm.weight", {D}, 1, true},
        {"attn_q.weight", {D, q_rows}, attn_scale, false},
        {"attn_k.weight", {D, kv_rows}, attn_scale, false},
        {"attn_v.weight", {D, kv_rows}, attn_scale, false},
        {"attn_output.weight", {q_rows, D}, attn_scale, false},
        {"ffn_gate.weight", {D, F}, ffn_scale, false},
        {"ffn_up.weight", {D, F}, ffn_scale, false},
        {"ffn_down.weight", {F, D}, ffn_scale, false},
    };
    if (a == "qwen2") {
      ts.push_back({"attn_q.bias", {q_rows}, 0.5f, false});
      ts.push_back({"attn_k.bias", {kv_rows}, 0.5f, false});
      ts.push_back({"attn_v.bias", {kv_rows}, 0.5f, false});
    }
    for (const T& t : ts) {
      int64_t n = 1;
      for (int64_t dd : t.dims) n *= dd;
      const bool is_1d = t.dims.size() == 1;
      std::vector<float> values = t.vec ? ones_ish(n) : random(n, t.scale);
      st = w.AddTensorF32(p + t.name, is_1d ? GgmlType::kF32 : s.weight_type, t.dims, values);
      if (!st.ok()) return st;
    }
  }
  if (s.feature_conditioned) {  // drawn last: the other weights stay what they were
    st = w.AddTensorF32("eagle.tok_norm.weight", GgmlType::kF32, {D}, ones_ish(D));
    if (st.ok()) st = w.AddTensorF32("eagle.feat_norm.weight", GgmlType::kF32, {D}, ones_ish(D));
    if (st.ok()) st = w.AddTensorF32("eagle.fc.weight", s.weight_type, {2 * D, D}, random(2 * D * D, 1.0f));
    if (!st.ok()) return st;
  }
  return w.WriteFile(path);
}

}  // namespace specd::testing
