// Writes the small seed corpus for gguf_reader_fuzz (tests/data/fuzz/gguf/): a few valid
// files covering every value type, several tensor types, v2 and a non-default alignment,
// plus truncated variants. Usage: gguf_make_fuzz_corpus OUT_DIR
#include <cstdio>
#include <string>
#include <vector>

#include "common/gguf/gguf_writer.h"
#include "common/gguf/quants.h"

using namespace specd::gguf;

namespace {

bool Save(const std::string& path, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  return std::fclose(f) == 0 && ok;
}

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 37);
  return v;
}

std::vector<float> Ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 13) * 0.25f - 1.5f;
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  std::vector<std::pair<std::string, std::string>> files;

  {  // Every metadata value type, nested arrays, no tensors.
    GgufWriter w;
    w.Set("u8", Value::U8(1));
    w.Set("i8", Value::I8(-1));
    w.Set("u16", Value::U16(2));
    w.Set("i16", Value::I16(-2));
    w.Set("u32", Value::U32(3));
    w.Set("i32", Value::I32(-3));
    w.Set("u64", Value::U64(4));
    w.Set("i64", Value::I64(-4));
    w.Set("f32", Value::F32(0.5f));
    w.Set("f64", Value::F64(0.25));
    w.Set("b", Value::Bool(true));
    w.Set("s", Value::Str("str"));
    w.Set("arr", Value::Array(ValueType::kInt32, {Value::I32(1), Value::I32(2)}));
    w.Set("nested", Value::Array(ValueType::kArray,
                                 {Value::Array(ValueType::kString, {Value::Str("a")})}));
    files.emplace_back("meta_all_types.gguf", *w.Serialize());
  }
  {  // A llama-like header with a toy tokenizer and several tensor types.
    GgufWriter w;
    w.Set("general.architecture", Value::Str("llama"));
    w.Set("llama.block_count", Value::U32(1));
    w.Set("llama.embedding_length", Value::U32(32));
    w.Set("tokenizer.ggml.model", Value::Str("gpt2"));
    w.Set("tokenizer.ggml.tokens",
          Value::Array(ValueType::kString, {Value::Str("<s>"), Value::Str("a"), Value::Str("b")}));
    w.Set("tokenizer.ggml.bos_token_id", Value::U32(0));
    (void)w.AddTensorF32("f32", GgmlType::kF32, {4, 2}, Ramp(8));
    (void)w.AddTensorF32("f16", GgmlType::kF16, {4}, Ramp(4));
    (void)w.AddTensorF32("bf16", GgmlType::kBF16, {2, 2}, Ramp(4));
    (void)w.AddTensorF32("q4_0", GgmlType::kQ4_0, {32}, Ramp(32));
    (void)w.AddTensorF32("q4_1", GgmlType::kQ4_1, {32, 2}, Ramp(64));
    (void)w.AddTensorF32("q8_0", GgmlType::kQ8_0, {32}, Ramp(32));
    files.emplace_back("llama_like_v3.gguf", *w.Serialize());
  }
  {  // K-quants and the rarer legacy types as raw blocks (scale fields set to small halves).
    GgufWriter w;
    auto with_scale = [](std::vector<uint8_t> b, size_t at) {
      const uint16_t h = F32ToF16(0.01f);
      b[at] = static_cast<uint8_t>(h & 0xFF);
      b[at + 1] = static_cast<uint8_t>(h >> 8);
      return b;
    };
    (void)w.AddTensor("q4_k", GgmlType::kQ4_K, {256}, with_scale(Pattern(144, 1), 0));
    (void)w.AddTensor("q5_k", GgmlType::kQ5_K, {256}, with_scale(Pattern(176, 2), 0));
    (void)w.AddTensor("q6_k", GgmlType::kQ6_K, {256}, with_scale(Pattern(210, 3), 208));
    (void)w.AddTensor("q2_k", GgmlType::kQ2_K, {256}, with_scale(Pattern(84, 4), 80));
    (void)w.AddTensor("q3_k", GgmlType::kQ3_K, {256}, with_scale(Pattern(110, 5), 108));
    (void)w.AddTensor("q5_0", GgmlType::kQ5_0, {32}, with_scale(Pattern(22, 6), 0));
    (void)w.AddTensor("q5_1", GgmlType::kQ5_1, {32}, with_scale(Pattern(24, 7), 0));
    (void)w.AddTensor("i32", GgmlType::kI32, {3}, Pattern(12, 8));
    files.emplace_back("kquants_v3.gguf", *w.Serialize());
  }
  {  // v2 with a non-default alignment.
    GgufWriter w(2, 64);
    w.Set("general.name", Value::Str("v2"));
    (void)w.AddTensorF32("a", GgmlType::kF32, {3}, Ramp(3));
    (void)w.AddTensorF32("b", GgmlType::kQ8_0, {32}, Ramp(32));
    files.emplace_back("v2_align64.gguf", *w.Serialize());
  }
  // Truncated variants.
  const std::string llama = files[1].second;
  files.emplace_back("trunc_header.gguf", llama.substr(0, 20));
  files.emplace_back("trunc_metadata.gguf", llama.substr(0, 120));
  files.emplace_back("trunc_data.gguf", llama.substr(0, llama.size() - 40));

  for (const auto& [name, bytes] : files) {
    if (!Save(dir + "/" + name, bytes)) {
      std::fprintf(stderr, "cannot write %s/%s\n", dir.c_str(), name.c_str());
      return 1;
    }
    std::printf("%s/%s: %zu bytes\n", dir.c_str(), name.c_str(), bytes.size());
  }
  return 0;
}
