// GgufWriter -> GgufFile round trips (every value type, every tensor type, v2/v3, alignment),
// typed getters, and the real SmolLM2 model when it is present.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/gguf/ggml_type.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_writer.h"
#include "common/gguf/quants.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specd::gguf {
namespace {

using ::testing::HasSubstr;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

std::string SourceDir() {
  const char* d = std::getenv("SPECD_SOURCE_DIR");
  return d != nullptr ? d : ".";
}

absl::Span<const uint8_t> AsBytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// Deep equality including the declared on-disk types.
bool SameValue(const Value& a, const Value& b) {
  if (a.type != b.type || a.data.index() != b.data.index()) return false;
  if (const auto* x = std::get_if<ArrayValue>(&a.data)) {
    const auto& y = std::get<ArrayValue>(b.data);
    if (x->element_type != y.element_type || x->elements.size() != y.elements.size()) return false;
    for (size_t i = 0; i < x->elements.size(); ++i) {
      if (!SameValue(x->elements[i], y.elements[i])) return false;
    }
    return true;
  }
  if (const auto* x = std::get_if<double>(&a.data)) {
    return std::memcmp(x, &std::get<double>(b.data), sizeof(double)) == 0;
  }
  if (const auto* x = std::get_if<uint64_t>(&a.data)) return *x == std::get<uint64_t>(b.data);
  if (const auto* x = std::get_if<int64_t>(&a.data)) return *x == std::get<int64_t>(b.data);
  if (const auto* x = std::get_if<bool>(&a.data)) return *x == std::get<bool>(b.data);
  return std::get<std::string>(a.data) == std::get<std::string>(b.data);
}

std::vector<std::pair<std::string, Value>> AllValueKinds() {
  using L = std::numeric_limits<int64_t>;
  std::vector<std::pair<std::string, Value>> kv = {
      {"u8", Value::U8(255)},
      {"i8", Value::I8(-128)},
      {"u16", Value::U16(65535)},
      {"i16", Value::I16(-32768)},
      {"u32", Value::U32(0xFFFFFFFFu)},
      {"i32", Value::I32(std::numeric_limits<int32_t>::min())},
      {"u64", Value::U64(std::numeric_limits<uint64_t>::max())},
      {"i64", Value::I64(L::min())},
      {"f32", Value::F32(3.14159274f)},
      {"f64", Value::F64(2.718281828459045)},
      {"bool_t", Value::Bool(true)},
      {"bool_f", Value::Bool(false)},
      {"str", Value::Str("héllo \xF0\x9F\x98\x80")},
      {"str_nul", Value::Str(std::string("a\0b", 3))},
      {"str_empty", Value::Str("")},
      {"arr_empty", Value::Array(ValueType::kInt32, {})},
      {"arr_u8", Value::Array(ValueType::kUint8, {Value::U8(0), Value::U8(7), Value::U8(255)})},
      {"arr_i8", Value::Array(ValueType::kInt8, {Value::I8(-1), Value::I8(1)})},
      {"arr_u16", Value::Array(ValueType::kUint16, {Value::U16(1)})},
      {"arr_i16", Value::Array(ValueType::kInt16, {Value::I16(-2)})},
      {"arr_u32", Value::Array(ValueType::kUint32, {Value::U32(3), Value::U32(4)})},
      {"arr_i32", Value::Array(ValueType::kInt32, {Value::I32(-5), Value::I32(6)})},
      {"arr_u64", Value::Array(ValueType::kUint64, {Value::U64(1ull << 63)})},
      {"arr_i64", Value::Array(ValueType::kInt64, {Value::I64(-(1ll << 62))})},
      {"arr_f32", Value::Array(ValueType::kFloat32, {Value::F32(0.5f), Value::F32(-1e-8f)})},
      {"arr_f64", Value::Array(ValueType::kFloat64, {Value::F64(1e300)})},
      {"arr_bool", Value::Array(ValueType::kBool, {Value::Bool(true), Value::Bool(false)})},
      {"arr_str", Value::Array(ValueType::kString, {Value::Str("a"), Value::Str(""),
                                                    Value::Str("ccc")})},
  };
  // Arrays of arrays of arrays of strings (depth 3), with ragged inner lengths.
  Value inner1 = Value::Array(ValueType::kString, {Value::Str("x"), Value::Str("yz")});
  Value inner2 = Value::Array(ValueType::kString, {});
  Value mid = Value::Array(ValueType::kArray, {inner1, inner2});
  kv.emplace_back("arr_nested",
                  Value::Array(ValueType::kArray, {mid, Value::Array(ValueType::kArray, {})}));
  return kv;
}

TEST(GgufRoundTripTest, EveryValueType) {
  for (uint32_t version : {2u, 3u}) {
    SCOPED_TRACE(version);
    GgufWriter w(version);
    const auto kv = AllValueKinds();
    for (const auto& [k, v] : kv) w.Set(k, v);
    absl::StatusOr<std::string> bytes = w.Serialize();
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    auto f = GgufFile::FromBuffer(AsBytes(*bytes));
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ((*f)->version(), version);
    EXPECT_EQ((*f)->alignment(), 32u);
    ASSERT_EQ((*f)->metadata().size(), kv.size());
    for (size_t i = 0; i < kv.size(); ++i) {
      EXPECT_EQ((*f)->metadata()[i].first, kv[i].first);  // file order preserved
      EXPECT_TRUE(SameValue((*f)->metadata()[i].second, kv[i].second)) << kv[i].first;
      ASSERT_NE((*f)->Find(kv[i].first), nullptr);
    }
    EXPECT_TRUE((*f)->tensors().empty());
  }
}

TEST(GgufRoundTripTest, SetReplacesExistingKey) {
  GgufWriter w;
  w.Set("a", Value::U32(1));
  w.Set("b", Value::U32(2));
  w.Set("a", Value::Str("again"));
  auto bytes = w.Serialize();
  ASSERT_TRUE(bytes.ok());
  auto f = GgufFile::FromBuffer(AsBytes(*bytes));
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ((*f)->metadata().size(), 2u);
  EXPECT_EQ(*(*f)->GetString("a"), "again");
}

TEST(GgufRoundTripTest, EveryTensorTypeAndAlignment) {
  const GgmlType types[] = {
      GgmlType::kF32,  GgmlType::kF16,  GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
      GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ8_1, GgmlType::kQ2_K, GgmlType::kQ3_K,
      GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kQ8_K, GgmlType::kI8,
      GgmlType::kI16,  GgmlType::kI32,  GgmlType::kI64,  GgmlType::kF64,  GgmlType::kBF16};
  std::mt19937 rng(7);
  for (auto [version, alignment] : {std::pair<uint32_t, uint64_t>{3, 32}, {2, 64}, {3, 1},
                                    {3, 4096}}) {
    SCOPED_TRACE(testing::Message() << "v" << version << " align " << alignment);
    GgufWriter w(version, alignment);
    w.Set("general.architecture", Value::Str("test"));
    std::vector<std::vector<uint8_t>> payloads;
    int i = 0;
    for (GgmlType t : types) {
      const int64_t block = GetTypeTraits(t)->block_size;
      // 1 to 4 dims; rows of whole blocks; odd sizes so padding is exercised.
      std::vector<int64_t> dims = {block * (1 + i % 3)};
      for (int d = 1; d < 1 + i % 4; ++d) dims.push_back(1 + (i + d) % 3);
      int64_t n = 1;
      for (int64_t d : dims) n *= d;
      std::vector<uint8_t> bytes(*RowBytes(t, n));
      for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
      payloads.push_back(bytes);
      ASSERT_TRUE(w.AddTensor("t" + std::to_string(i), t, dims, bytes).ok());
      ++i;
    }
    auto bytes = w.Serialize();
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    auto f = GgufFile::FromBuffer(AsBytes(*bytes));
    ASSERT_TRUE(f.ok()) << f.status();
    const GgufFile& g = **f;
    EXPECT_EQ(g.version(), version);
    EXPECT_EQ(g.alignment(), alignment);
    EXPECT_EQ(g.data_offset() % alignment, 0u);
    if (alignment != 32) {
      EXPECT_EQ(*g.GetInt("general.alignment"), static_cast<int64_t>(alignment));
    }
    ASSERT_EQ(g.tensors().size(), std::size(types));
    for (size_t k = 0; k < std::size(types); ++k) {
      const TensorInfo& t = g.tensors()[k];
      EXPECT_EQ(t.name, "t" + std::to_string(k));
      EXPECT_EQ(t.type, types[k]);
      EXPECT_EQ(t.num_bytes, payloads[k].size());
      EXPECT_EQ(t.offset % alignment, 0u);
      EXPECT_EQ(static_cast<uint64_t>(t.data - reinterpret_cast<const uint8_t*>(bytes->data())),
                g.data_offset() + t.offset);
      EXPECT_EQ(0, std::memcmp(t.data, payloads[k].data(), payloads[k].size())) << t.name;
      EXPECT_EQ(g.FindTensor(t.name), &t);
    }
    EXPECT_EQ(g.FindTensor("nope"), nullptr);
  }
}

TEST(GgufRoundTripTest, WriteFileOpenAndQuantizedTensors) {
  const std::string path = testing::TempDir() + "/gguf_roundtrip_test.gguf";
  std::vector<float> values(64 * 2);
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(0.1f * i);
  GgufWriter w;
  w.Set("general.name", Value::Str("roundtrip"));
  ASSERT_TRUE(w.AddTensorF32("a", GgmlType::kQ8_0, {64, 2}, values).ok());
  ASSERT_TRUE(w.AddTensorF32("b", GgmlType::kF32, {64, 2}, values).ok());
  EXPECT_EQ(w.AddTensorF32("c", GgmlType::kQ6_K, {256}, std::vector<float>(256)).code(),
            absl::StatusCode::kUnimplemented);
  ASSERT_TRUE(w.WriteFile(path).ok());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->path(), path);
  const TensorInfo* a = (*f)->FindTensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dims, (std::vector<int64_t>{64, 2}));
  std::vector<float> y(values.size());
  ASSERT_TRUE(DequantizeRow(a->type, a->data, y.data(), a->num_elements).ok());
  for (size_t i = 0; i < values.size(); ++i) EXPECT_NEAR(y[i], values[i], 1.0f / 127);
  const TensorInfo* b = (*f)->FindTensor("b");
  EXPECT_EQ(0, std::memcmp(b->data, values.data(), values.size() * 4));
  std::remove(path.c_str());
}

TEST(GgufWriterTest, RejectsBadInput) {
  GgufWriter w;
  EXPECT_TRUE(w.AddTensor("x", GgmlType::kF32, {2}, std::vector<uint8_t>(8)).ok());
  EXPECT_EQ(w.AddTensor("x", GgmlType::kF32, {2}, std::vector<uint8_t>(8)).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(Msg(w.AddTensor("y", GgmlType::kF32, {2}, std::vector<uint8_t>(7))),
              HasSubstr("needs 8 bytes"));
  EXPECT_FALSE(w.AddTensor("z", GgmlType::kF32, {0}, {}).ok());
  EXPECT_FALSE(w.AddTensor("z", GgmlType::kF32, {1, 1, 1, 1, 1}, std::vector<uint8_t>(4)).ok());
  EXPECT_THAT(Msg(w.AddTensor("z", GgmlType::kQ4_0, {16, 2}, std::vector<uint8_t>(18))),
              HasSubstr("not a multiple"));
  EXPECT_FALSE(w.AddTensor("z", static_cast<GgmlType>(5), {1}, std::vector<uint8_t>(1)).ok());

  GgufWriter bad_value;
  bad_value.Set("k", Value{ValueType::kUint8, uint64_t{300}});
  EXPECT_THAT(Msg(bad_value.Serialize().status()), HasSubstr("'k'"));
  GgufWriter bad_array;
  bad_array.Set("k", Value::Array(ValueType::kUint8, {Value::Str("no")}));
  EXPECT_THAT(Msg(bad_array.Serialize().status()), HasSubstr("declares uint8"));
  EXPECT_FALSE(GgufWriter(1).Serialize().ok());
  EXPECT_FALSE(GgufWriter(3, 48).Serialize().ok());
  GgufWriter conflicting(3, 64);
  conflicting.Set("general.alignment", Value::U32(32));
  EXPECT_EQ(conflicting.Serialize().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(GgufFileTest, TypedGetters) {
  GgufWriter w;
  w.Set("u32", Value::U32(7));
  w.Set("u64_big", Value::U64(std::numeric_limits<uint64_t>::max()));
  w.Set("i8", Value::I8(-3));
  w.Set("f32", Value::F32(0.25f));
  w.Set("b", Value::Bool(true));
  w.Set("s", Value::Str("text"));
  w.Set("strs", Value::Array(ValueType::kString, {Value::Str("a"), Value::Str("b")}));
  w.Set("ints", Value::Array(ValueType::kInt32, {Value::I32(-1), Value::I32(2)}));
  w.Set("floats", Value::Array(ValueType::kFloat32, {Value::F32(1.5f)}));
  auto bytes = w.Serialize();
  ASSERT_TRUE(bytes.ok());
  auto f = GgufFile::FromBuffer(AsBytes(*bytes));
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(*g.GetInt("u32"), 7);
  EXPECT_EQ(*g.GetInt("i8"), -3);
  EXPECT_EQ(*g.GetFloat("f32"), 0.25);
  EXPECT_EQ(*g.GetFloat("u32"), 7.0);
  EXPECT_TRUE(*g.GetBool("b"));
  EXPECT_EQ(*g.GetString("s"), "text");
  EXPECT_EQ(*g.GetStringArray("strs"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(*g.GetIntArray("ints"), (std::vector<int64_t>{-1, 2}));
  EXPECT_EQ(*g.GetFloatArray("floats"), (std::vector<float>{1.5f}));
  EXPECT_EQ(*g.GetFloatArray("ints"), (std::vector<float>{-1.0f, 2.0f}));

  EXPECT_EQ(g.GetInt("missing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(g.GetInt("missing").status()), HasSubstr("'missing'"));
  EXPECT_EQ(g.GetInt("u64_big").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(g.GetInt("s").status()), HasSubstr("'s' is string"));
  EXPECT_EQ(g.GetBool("u32").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetString("u32").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(g.GetStringArray("ints").status()), HasSubstr("array of int32"));
  EXPECT_EQ(g.GetIntArray("strs").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetFloatArray("strs").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetFloat("b").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GgufFileTest, OpenMissingFile) {
  auto f = GgufFile::Open("/nonexistent/dir/model.gguf");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(f.status()), HasSubstr("/nonexistent/dir/model.gguf"));
  auto d = GgufFile::Open(testing::TempDir());
  EXPECT_FALSE(d.ok());
}

// --- The real model (the one test that may skip) ---------------------------------------------

struct Expected {
  std::string name, type;
  int64_t start;
  std::vector<uint32_t> bits;
};

std::vector<Expected> ReadExpectations(const std::string& path) {
  std::ifstream in(path);
  std::vector<Expected> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    if (line.rfind("tensor ", 0) == 0) {
      std::string tag;
      int64_t count;
      Expected e;
      ls >> tag >> e.name >> e.type >> e.start >> count;
      out.push_back(e);
      continue;
    }
    std::string hex;
    while (ls >> hex) {
      out.back().bits.push_back(static_cast<uint32_t>(std::stoul(hex, nullptr, 16)));
    }
  }
  return out;
}

TEST(GgufRealModelTest, SmolLM2Q4_1) {
  const std::string path = SourceDir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (std::FILE* probe = std::fopen(path.c_str(), "rb")) {
    std::fclose(probe);
  } else {
    std::printf("NOT RUN: real model %s is absent (see scripts/fetch_model.sh)\n", path.c_str());
    GTEST_SKIP() << "real model " << path << " is absent; this test did not run";
  }
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.alignment(), 32u);
  EXPECT_EQ(g.file_size(), 98362432u);
  EXPECT_EQ(*g.GetString("general.architecture"), "llama");
  EXPECT_EQ(*g.GetInt("llama.block_count"), 30);
  EXPECT_EQ(*g.GetInt("llama.embedding_length"), 576);
  EXPECT_EQ(*g.GetInt("llama.attention.head_count"), 9);
  EXPECT_EQ(*g.GetInt("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(*g.GetInt("llama.context_length"), 8192);
  EXPECT_EQ(*g.GetFloat("llama.rope.freq_base"), 100000.0);
  EXPECT_EQ(*g.GetString("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(g.GetStringArray("tokenizer.ggml.tokens")->size(), 49152u);
  EXPECT_EQ(g.GetStringArray("tokenizer.ggml.merges")->size(), 48900u);
  EXPECT_EQ(*g.GetInt("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_FALSE(*g.GetBool("tokenizer.ggml.add_bos_token"));

  ASSERT_EQ(g.tensors().size(), 272u);
  int q4_1 = 0, f32 = 0, q8_0 = 0;
  uint64_t total = 0;
  for (const TensorInfo& t : g.tensors()) {
    q4_1 += t.type == GgmlType::kQ4_1;
    f32 += t.type == GgmlType::kF32;
    q8_0 += t.type == GgmlType::kQ8_0;
    total += t.num_bytes;
  }
  EXPECT_EQ(q4_1, 210);
  EXPECT_EQ(f32, 61);
  EXPECT_EQ(q8_0, 1);
  EXPECT_LE(total, g.file_size() - g.data_offset());
  const TensorInfo* emb = g.FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, GgmlType::kQ8_0);
  EXPECT_EQ(emb->dims, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(emb->num_bytes, 576u / 32 * 34 * 49152);

  // Dequantized values equal those of gguf-py (scripts/gen_quant_goldens.py), bit for bit.
  const std::vector<Expected> expected =
      ReadExpectations(SourceDir() + "/tests/data/smollm2_expected.txt");
  ASSERT_GE(expected.size(), 4u);
  for (const Expected& e : expected) {
    SCOPED_TRACE(e.name);
    const TensorInfo* t = g.FindTensor(e.name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(GgmlTypeName(t->type), e.type);
    const int64_t block = GetTypeTraits(t->type)->block_size;
    ASSERT_EQ(e.start % block, 0);
    const int64_t n = (static_cast<int64_t>(e.bits.size()) + block - 1) / block * block;
    std::vector<float> y(n);
    const uint8_t* src = t->data + *RowBytes(t->type, e.start);
    ASSERT_TRUE(DequantizeRow(t->type, src, y.data(), n).ok());
    for (size_t i = 0; i < e.bits.size(); ++i) {
      uint32_t got;
      std::memcpy(&got, &y[i], 4);
      EXPECT_EQ(got, e.bits[i]) << "element " << e.start + static_cast<int64_t>(i);
    }
  }
}

}  // namespace
}  // namespace specd::gguf
