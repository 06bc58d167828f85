// Malformed GGUF images: one test per error class. Each asserts the status code, that the
// message names the problem, and the byte offset where it was found.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specd::gguf {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t k2p60 = uint64_t{1} << 60;

// Little-endian byte builder for hand-made (often invalid) files.
class Bytes {
 public:
  Bytes& U8(uint8_t v) { return Put(v); }
  Bytes& U32(uint32_t v) { return Put(v); }
  Bytes& U64(uint64_t v) { return Put(v); }
  Bytes& Raw(std::string_view s) {
    s_.append(s);
    return *this;
  }
  Bytes& Str(std::string_view s) { return U64(s.size()).Raw(s); }
  Bytes& Zeros(size_t n) {
    s_.append(n, '\0');
    return *this;
  }
  Bytes& PadTo(size_t align) { return Zeros((align - s_.size() % align) % align); }
  Bytes& Header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    return Raw("GGUF").U32(version).U64(n_tensors).U64(n_kv);
  }
  // A key with a scalar u32 value.
  Bytes& KvU32(std::string_view key, uint32_t v) { return Str(key).U32(4).U32(v); }
  Bytes& Tensor(std::string_view name, std::initializer_list<uint64_t> dims, uint32_t type,
                uint64_t offset) {
    Str(name).U32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) U64(d);
    return U32(type).U64(offset);
  }
  size_t size() const { return s_.size(); }
  const std::string& str() const { return s_; }
  absl::Span<const uint8_t> span() const {
    return {reinterpret_cast<const uint8_t*>(s_.data()), s_.size()};
  }

 private:
  template <typename T>
  Bytes& Put(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    s_.append(b, sizeof(T));
    return *this;
  }
  std::string s_;
};

void ExpectError(const Bytes& b, std::initializer_list<std::string_view> parts, uint64_t offset) {
  auto f = GgufFile::FromBuffer(b.span());
  ASSERT_FALSE(f.ok()) << "parsed a bad file";
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  const std::string msg(f.status().message());
  for (std::string_view p : parts) EXPECT_THAT(msg, HasSubstr(std::string(p)));
  EXPECT_THAT(msg, HasSubstr("at byte offset " + std::to_string(offset)));
}

// Header is 24 bytes; the first key starts at 24. A tensor info for a 1-char name and n dims:
// name 9, n_dims 4, dims 8n, type 4, offset 8.

TEST(GgufCorruptTest, WrongMagic) {
  ExpectError(Bytes().Raw("GGML").U32(3).U64(0).U64(0), {"bad magic", "GGUF"}, 0);
}

TEST(GgufCorruptTest, UnsupportedVersion) {
  ExpectError(Bytes().Header(1, 0, 0), {"unsupported GGUF version 1"}, 4);
  ExpectError(Bytes().Header(4, 0, 0), {"unsupported GGUF version 4"}, 4);
  ExpectError(Bytes().Header(0x03000000, 0, 0), {"unsupported GGUF version", "big-endian"}, 4);
}

TEST(GgufCorruptTest, TruncatedHeader) {
  ExpectError(Bytes(), {"truncated header (magic)"}, 0);
  ExpectError(Bytes().Raw("GGUF").U32(3).U32(0), {"truncated header (tensor count)"}, 8);
  ExpectError(Bytes().Raw("GGUF").U32(3).U64(0).U32(0), {"truncated header (metadata count)"},
              16);
}

TEST(GgufCorruptTest, TruncatedString) {
  ExpectError(Bytes().Header(3, 0, 1).U64(100).Raw("abc").Zeros(10),
              {"truncated metadata key #0", "string length 100"}, 24);
  ExpectError(Bytes().Header(3, 0, 1).Str("k").U32(8).U64(50).Raw("xy"),
              {"truncated string value of 'k'", "string length 50"}, 37);
  // A length of 2^63 must be rejected, not allocated.
  ExpectError(Bytes().Header(3, 0, 1).U64(uint64_t{1} << 63).Zeros(16),
              {"truncated metadata key #0"}, 24);
  ExpectError(Bytes().Header(3, 0, 1).Str("k").U32(10).Raw("abc"), {"truncated value of 'k'"},
              37);
}

TEST(GgufCorruptTest, TruncatedArray) {
  // key "arr": 8+3 bytes, type 4 bytes, elem type 4 bytes, then the count at 43.
  ExpectError(Bytes().Header(3, 0, 1).Str("arr").U32(9).U32(4).U64(1000).Zeros(8),
              {"truncated array", "1000 elements of uint32", "'arr'"}, 43);
  ExpectError(Bytes().Header(3, 0, 1).Str("arr").U32(9).U32(4),
              {"truncated array length of 'arr'"}, 43);
}

TEST(GgufCorruptTest, TruncatedTensorInfoAndData) {
  ExpectError(Bytes().Header(3, 1, 0).Str("t").U32(1).U64(8).U32(0),
              {"truncated tensor info of 't'"}, 49);
  // Infos end at 57; the data section would start at 64 but the file stops at 57.
  ExpectError(Bytes().Header(3, 1, 0).Tensor("t", {8}, 0, 0),
              {"truncated data", "starts at byte 64"}, 57);
}

TEST(GgufCorruptTest, TensorDataOutOfBounds) {
  // 8 x F32 = 32 bytes needed, only 16 present. The offset field is at 49.
  ExpectError(Bytes().Header(3, 1, 0).Tensor("t", {8}, 0, 0).PadTo(32).Zeros(16),
              {"tensor 't' data out of bounds", "32 bytes at data offset 0"}, 49);
  ExpectError(Bytes().Header(3, 1, 0).Tensor("t", {8}, 0, uint64_t{1} << 63).PadTo(32).Zeros(64),
              {"tensor 't' data out of bounds"}, 49);
  ExpectError(Bytes().Header(3, 1, 0).Tensor("t", {8}, 0, 64).PadTo(32).Zeros(64),
              {"tensor 't' data out of bounds"}, 49);
}

TEST(GgufCorruptTest, TensorOffsetNotAligned) {
  ExpectError(Bytes().Header(3, 1, 0).Tensor("t", {8}, 0, 4).PadTo(32).Zeros(64),
              {"tensor 't' data offset 4 is not aligned to 32"}, 49);
  // With general.alignment = 64 (key 8+17, type 4, value 4 -> infos start at 57).
  ExpectError(Bytes().Header(3, 1, 1).KvU32("general.alignment", 64).Tensor("t", {8}, 0, 32)
                  .PadTo(64).Zeros(128),
              {"not aligned to 64"}, 57 + 9 + 4 + 8 + 4);
}

TEST(GgufCorruptTest, BadAlignment) {
  for (uint32_t a : {0u, 3u, 48u}) {
    ExpectError(Bytes().Header(3, 0, 1).KvU32("general.alignment", a),
                {"general.alignment must be a nonzero power-of-two"}, 49);
  }
  ExpectError(Bytes().Header(3, 0, 1).Str("general.alignment").U32(8).Str("32"),
              {"general.alignment"}, 49);
}

TEST(GgufCorruptTest, UnknownTensorType) {
  ExpectError(Bytes().Header(3, 1, 0).Tensor("t", {32}, 4, 0).PadTo(32).Zeros(128),
              {"unknown tensor type id 4 for tensor 't'"}, 45);
  ExpectError(Bytes().Header(3, 1, 0).Tensor("t", {32}, 0xFFFFFFFF, 0).PadTo(32).Zeros(128),
              {"unknown tensor type id 4294967295"}, 45);
}

TEST(GgufCorruptTest, UnknownValueType) {
  ExpectError(Bytes().Header(3, 0, 1).Str("k").U32(13).U32(0), {"unknown value type 13", "'k'"},
              33);
  ExpectError(Bytes().Header(3, 0, 1).Str("k").U32(9).U32(99).U64(0),
              {"unknown value type 99 for array elements of key 'k'"}, 37);
}

TEST(GgufCorruptTest, InvalidBool) {
  ExpectError(Bytes().Header(3, 0, 1).Str("k").U32(7).U8(2), {"invalid bool value 2"}, 37);
}

TEST(GgufCorruptTest, OverflowingCounts) {
  ExpectError(Bytes().Header(3, 0, k2p60).Zeros(64), {"metadata count 1152921504606846976 exceeds"},
              16);
  ExpectError(Bytes().Header(3, k2p60, 0).Zeros(64), {"tensor count 1152921504606846976 exceeds"},
              8);
  // Array lengths: checked against the bytes left before anything is reserved.
  ExpectError(Bytes().Header(3, 0, 1).Str("arr").U32(9).U32(10).U64(k2p60).Zeros(64),
              {"truncated array", "cannot fit"}, 43);
  ExpectError(Bytes().Header(3, 0, 1).Str("arr").U32(9).U32(8).U64(uint64_t{1} << 62).Zeros(64),
              {"truncated array", "of string"}, 43);
  ExpectError(Bytes().Header(3, 0, 1).Str("arr").U32(9).U32(9).U64(~uint64_t{0}).Zeros(64),
              {"truncated array", "of array"}, 43);
  // Dims product overflows int64 at the second dim (offset 45).
  ExpectError(Bytes().Header(3, 1, 0).Tensor("t", {uint64_t{1} << 32, uint64_t{1} << 32}, 0, 0)
                  .PadTo(32).Zeros(32),
              {"element count overflows"}, 45);
  // 2^62 F64 elements fit in int64 but their byte size (2^65) does not fit in uint64.
  ExpectError(Bytes().Header(3, 1, 0).Tensor("t", {uint64_t{1} << 62}, 28, 0).PadTo(32).Zeros(32),
              {"tensor 't'", "overflows"}, 45);
}

TEST(GgufCorruptTest, DuplicateKeysAndTensorNames) {
  // First kv: key 9 bytes + type 4 + u32 4 = 17 -> the second key starts at 41.
  ExpectError(Bytes().Header(3, 0, 2).KvU32("a", 1).KvU32("a", 2), {"duplicate metadata key 'a'"},
              41);
  ExpectError(Bytes().Header(3, 2, 0).Tensor("t", {8}, 0, 0).Tensor("t", {8}, 0, 32)
                  .PadTo(32).Zeros(64),
              {"duplicate tensor name 't'"}, 24 + 33);
}

TEST(GgufCorruptTest, BadDims) {
  ExpectError(Bytes().Header(3, 1, 0).Tensor("t", {0}, 0, 0).PadTo(32),
              {"tensor 't' dim 0 is 0, dims must be > 0"}, 37);
  ExpectError(Bytes().Header(3, 1, 0).Tensor("t", {4, ~uint64_t{0}}, 0, 0).PadTo(32),
              {"dim 1 is -1, dims must be > 0"}, 45);
  ExpectError(Bytes().Header(3, 1, 0).Tensor("t", {1, 1, 1, 1, 1}, 0, 0).PadTo(32).Zeros(32),
              {"tensor 't' has 5 dims, expected 1..4"}, 33);
  ExpectError(Bytes().Header(3, 1, 0).Tensor("t", {}, 0, 0).PadTo(32).Zeros(32),
              {"has 0 dims"}, 33);
}

TEST(GgufCorruptTest, ElementCountNotMultipleOfBlock) {
  ExpectError(Bytes().Header(3, 1, 0).Tensor("t", {33}, 2, 0).PadTo(32).Zeros(64),
              {"row length 33 (dims[0]) is not a multiple of the Q4_0 block size 32"}, 45);
  // 16 x 2 = 32 elements in total, but rows of 16 cannot hold whole Q4_0 blocks.
  ExpectError(Bytes().Header(3, 1, 0).Tensor("t", {16, 2}, 2, 0).PadTo(32).Zeros(64),
              {"not a multiple"}, 53);
  ExpectError(Bytes().Header(3, 1, 0).Tensor("t", {128}, 12, 0).PadTo(32).Zeros(256),
              {"Q4_K block size 256"}, 45);
}

TEST(GgufCorruptTest, ArrayNestingDepthIsBounded) {
  auto nested = [](int levels) {
    Bytes b;
    b.Header(3, 0, 1).Str("k").U32(9);
    for (int i = 0; i < levels - 1; ++i) b.U32(9).U64(1);  // array of 1 array ...
    b.U32(4).U64(0);                                       // ... innermost: empty u32 array
    return b;
  };
  EXPECT_TRUE(GgufFile::FromBuffer(nested(8).span()).ok());
  ExpectError(nested(9), {"arrays nested deeper than 8 levels in key 'k'"}, 33 + 4 + 12 * 8);
  // A deep bomb fails at the same place, without recursing further.
  ExpectError(nested(100000), {"nested deeper than 8"}, 33 + 4 + 12 * 8);
}

// Every proper prefix of a valid file is rejected cleanly (never a crash), with an offset.
TEST(GgufCorruptTest, EveryTruncationIsAnError) {
  GgufWriter w(3, 32);
  w.Set("general.architecture", Value::Str("llama"));
  w.Set("a", Value::Array(ValueType::kArray,
                          {Value::Array(ValueType::kString, {Value::Str("x")})}));
  w.Set("f", Value::F32(1.0f));
  ASSERT_TRUE(w.AddTensor("t0", GgmlType::kQ8_0, {32}, std::vector<uint8_t>(34, 1)).ok());
  ASSERT_TRUE(w.AddTensor("t1", GgmlType::kF16, {3}, std::vector<uint8_t>(6, 2)).ok());
  auto full = w.Serialize();
  ASSERT_TRUE(full.ok());
  auto whole = GgufFile::FromBuffer(
      {reinterpret_cast<const uint8_t*>(full->data()), full->size()});
  ASSERT_TRUE(whole.ok()) << whole.status();
  const TensorInfo& last = (*whole)->tensors().back();
  const size_t needed = (*whole)->data_offset() + last.offset + last.num_bytes;
  for (size_t n = 0; n < full->size(); ++n) {
    auto f = GgufFile::FromBuffer({reinterpret_cast<const uint8_t*>(full->data()), n});
    if (n >= needed) {
      EXPECT_TRUE(f.ok()) << n;  // only trailing padding was cut
      continue;
    }
    ASSERT_FALSE(f.ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(f.status().message()), HasSubstr("at byte offset"));
  }
}

TEST(GgufCorruptTest, OpenNamesThePath) {
  const std::string path = testing::TempDir() + "/gguf_corrupt_test.gguf";
  Bytes b;
  b.Header(1, 0, 0);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(b.str().data(), 1, b.size(), f);
  std::fclose(f);
  auto g = GgufFile::Open(path);
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(std::string(g.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("unsupported GGUF version 1"));
  // An empty file is a truncated header, not an mmap failure.
  f = std::fopen(path.c_str(), "wb");
  std::fclose(f);
  g = GgufFile::Open(path);
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("truncated header"));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace specd::gguf
