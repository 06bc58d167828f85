// Reference (de)quantization: type traits, exhaustive half-precision checks against an
// independent ldexp-based computation, goldens produced by the PyPI `gguf` package
// (scripts/gen_quant_goldens.py), and quantize/dequantize round-trip error bounds.
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/gguf/ggml_type.h"
#include "common/gguf/gguf_file.h"
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

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

// Same value, bit for bit; any NaN matches any NaN of the same sign.
bool SameFloat(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) {
    return std::isnan(a) && std::isnan(b) && std::signbit(a) == std::signbit(b);
  }
  return Bits(a) == Bits(b);
}

// --- Type traits ----------------------------------------------------------------------------

TEST(GgmlTypeTest, BlockAndByteSizes) {
  struct Want {
    GgmlType type;
    const char* name;
    int64_t block, bytes;
  };
  const Want want[] = {
      {GgmlType::kF32, "F32", 1, 4},      {GgmlType::kF16, "F16", 1, 2},
      {GgmlType::kQ4_0, "Q4_0", 32, 18},  {GgmlType::kQ4_1, "Q4_1", 32, 20},
      {GgmlType::kQ5_0, "Q5_0", 32, 22},  {GgmlType::kQ5_1, "Q5_1", 32, 24},
      {GgmlType::kQ8_0, "Q8_0", 32, 34},  {GgmlType::kQ8_1, "Q8_1", 32, 36},
      {GgmlType::kQ2_K, "Q2_K", 256, 84}, {GgmlType::kQ3_K, "Q3_K", 256, 110},
      {GgmlType::kQ4_K, "Q4_K", 256, 144}, {GgmlType::kQ5_K, "Q5_K", 256, 176},
      {GgmlType::kQ6_K, "Q6_K", 256, 210}, {GgmlType::kQ8_K, "Q8_K", 256, 292},
      {GgmlType::kI8, "I8", 1, 1},        {GgmlType::kI16, "I16", 1, 2},
      {GgmlType::kI32, "I32", 1, 4},      {GgmlType::kI64, "I64", 1, 8},
      {GgmlType::kF64, "F64", 1, 8},      {GgmlType::kBF16, "BF16", 1, 2},
  };
  for (const Want& w : want) {
    absl::StatusOr<GgmlTypeTraits> t = GetTypeTraits(w.type);
    ASSERT_TRUE(t.ok()) << w.name;
    EXPECT_EQ(t->name, w.name);
    EXPECT_EQ(t->block_size, w.block) << w.name;
    EXPECT_EQ(t->type_size, w.bytes) << w.name;
    EXPECT_EQ(GgmlTypeName(w.type), w.name);
    EXPECT_EQ(*RowBytes(w.type, w.block * 3), static_cast<uint64_t>(w.bytes * 3)) << w.name;
  }
}

TEST(GgmlTypeTest, UnknownIdsAreErrors) {
  for (uint32_t id : {4u, 5u, 16u, 17u, 23u, 29u, 31u, 39u, 1000u, 0xFFFFFFFFu}) {
    absl::StatusOr<GgmlTypeTraits> t = GetTypeTraits(id);
    ASSERT_FALSE(t.ok()) << id;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Msg(t.status()),
                HasSubstr("unknown ggml tensor type id " + std::to_string(id)));
  }
  EXPECT_EQ(GgmlTypeName(static_cast<GgmlType>(4)), "?");
}

TEST(GgmlTypeTest, RowBytesErrors) {
  EXPECT_THAT(Msg(RowBytes(GgmlType::kQ4_0, 33).status()), HasSubstr("not a multiple"));
  EXPECT_FALSE(RowBytes(GgmlType::kF32, -1).ok());
  EXPECT_THAT(Msg(RowBytes(GgmlType::kF64, std::numeric_limits<int64_t>::max()).status()),
              HasSubstr("overflows"));
}

// --- Half precision -------------------------------------------------------------------------

// Independent decoding of an IEEE binary16 value with ldexp.
double F16Reference(uint16_t h) {
  const int sign = h >> 15, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  double v;
  if (e == 0) {
    v = std::ldexp(static_cast<double>(m), -24);
  } else if (e == 31) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else {
    v = std::ldexp(static_cast<double>(1024 + m), e - 25);
  }
  return sign ? -v : v;
}

TEST(HalfTest, F16ToF32ExhaustiveAndRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = F16ToF32(static_cast<uint16_t>(h));
    const double want = F16Reference(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << h;
      ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << h;
      // NaN must stay NaN (never turn into inf) on the way back.
      const uint16_t back = F32ToF16(got);
      ASSERT_EQ(back & 0x7C00, 0x7C00) << h;
      ASSERT_NE(back & 0x3FF, 0) << h;
      continue;
    }
    ASSERT_EQ(static_cast<double>(got), want) << h;
    ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << h;  // -0 keeps its sign
    ASSERT_EQ(F32ToF16(got), h) << h;
  }
}

TEST(HalfTest, F32ToF16RoundsToNearestEven) {
  // Every pair of adjacent finite f16 values (both signs, subnormals included): the exact
  // midpoint goes to the even neighbour, one float ulp either side goes to the near one.
  for (uint32_t a = 0; a < 0x7BFF; ++a) {
    for (uint32_t sign : {0u, 0x8000u}) {
      const uint16_t lo = static_cast<uint16_t>(a | sign);
      const uint16_t hi = static_cast<uint16_t>((a + 1) | sign);
      const double mid_d = (F16Reference(lo) + F16Reference(hi)) / 2;
      const float mid = static_cast<float>(mid_d);
      ASSERT_EQ(static_cast<double>(mid), mid_d);  // midpoints are exact in float
      const uint16_t even = (lo & 1) == 0 ? lo : hi;
      ASSERT_EQ(F32ToF16(mid), even) << a;
      const float toward_zero = std::nextafter(mid, 0.0f);
      const float away = std::nextafter(mid, sign ? -INFINITY : INFINITY);
      ASSERT_EQ(F32ToF16(toward_zero), lo) << a;
      ASSERT_EQ(F32ToF16(away), hi) << a;
    }
  }
  // Overflow: halfway between 65504 (max) and 65536 rounds to even, i.e. infinity.
  EXPECT_EQ(F32ToF16(65504.0f), 0x7BFF);
  EXPECT_EQ(F32ToF16(65519.996f), 0x7BFF);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7C00);
  EXPECT_EQ(F32ToF16(-1e10f), 0xFC00);
  EXPECT_EQ(F32ToF16(INFINITY), 0x7C00);
  EXPECT_EQ(F32ToF16(-INFINITY), 0xFC00);
  // Underflow: half the smallest subnormal is a tie that goes to (even) zero.
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(F32ToF16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(F32ToF16(-std::ldexp(1.0f, -26)), 0x8000);
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(F32ToF16(-0.0f), 0x8000);
  // Signalling-looking NaN whose payload lives only in the low bits must stay NaN.
  const uint16_t n = F32ToF16(std::bit_cast<float>(0x7F800001u));
  EXPECT_EQ(n & 0x7C00, 0x7C00);
  EXPECT_NE(n & 0x3FF, 0);
}

TEST(HalfTest, BF16ExhaustiveAndRounding) {
  for (uint32_t h = 0; h < 65536; ++h) {
    // Independent decode: bf16 is float32 with 7 mantissa bits.
    const int sign = h >> 15, e = (h >> 7) & 0xFF, m = h & 0x7F;
    double want;
    if (e == 0) {
      want = std::ldexp(static_cast<double>(m), -133);
    } else if (e == 255) {
      want = m == 0 ? INFINITY : NAN;
    } else {
      want = std::ldexp(static_cast<double>(128 + m), e - 134);
    }
    if (sign) want = -want;
    const float got = BF16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << h;
      ASSERT_TRUE(std::isnan(BF16ToF32(F32ToBF16(got)))) << h;
      continue;
    }
    ASSERT_EQ(static_cast<double>(got), want) << h;
    ASSERT_EQ(F32ToBF16(got), h) << h;
    // Midpoint to the next value rounds to even (skip the step into the NaN/inf exponent).
    if ((h & 0x7FFF) < 0x7F7F) {
      const uint32_t mid = (h << 16) | 0x8000;
      const uint16_t even = (h & 1) == 0 ? h : h + 1;
      ASSERT_EQ(F32ToBF16(std::bit_cast<float>(mid)), even) << h;
      ASSERT_EQ(F32ToBF16(std::bit_cast<float>(mid + 1)), h + 1) << h;
      ASSERT_EQ(F32ToBF16(std::bit_cast<float>(mid - 1)), h) << h;
    }
  }
  // Signalling NaN with payload only in the dropped bits must not become infinity.
  EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(std::bit_cast<float>(0x7F800001u)))));
  EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(std::bit_cast<float>(0xFF800001u)))));
  EXPECT_EQ(F32ToBF16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to inf
}

// --- Goldens from gguf-py -------------------------------------------------------------------

class GoldenTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto f = GgufFile::Open(SourceDir() + "/tests/data/quant_goldens.gguf");
    ASSERT_TRUE(f.ok()) << f.status();
    file_ = f->release();
  }
  static void TearDownTestSuite() {
    delete file_;
    file_ = nullptr;
  }
  static std::vector<float> F32Values(const TensorInfo& t) {
    std::vector<float> v(static_cast<size_t>(t.num_elements));
    EXPECT_EQ(t.type, GgmlType::kF32);
    std::memcpy(v.data(), t.data, v.size() * sizeof(float));
    return v;
  }
  static GgufFile* file_;
};
GgufFile* GoldenTest::file_ = nullptr;

// Our dequantizers evaluate the same float expressions in the same order as gguf-py's numpy
// code (e.g. Q4_K: (d*sc)*q - (dmin*m)), so results must match bit for bit (0 ulp).
TEST_F(GoldenTest, DequantizeMatchesGgufPy) {
  const char* types[] = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"};
  for (const char* name : types) {
    SCOPED_TRACE(name);
    const TensorInfo* raw = file_->FindTensor(std::string("raw.") + name);
    const TensorInfo* deq = file_->FindTensor(std::string("deq.") + name);
    ASSERT_NE(raw, nullptr);
    ASSERT_NE(deq, nullptr);
    EXPECT_EQ(GgmlTypeName(raw->type), name);
    ASSERT_EQ(raw->num_elements, deq->num_elements);
    std::vector<float> want = F32Values(*deq);
    std::vector<float> got(want.size());
    ASSERT_TRUE(DequantizeRow(raw->type, raw->data, got.data(), raw->num_elements).ok());
    int mismatches = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (!SameFloat(got[i], want[i]) && ++mismatches <= 5) {
        ADD_FAILURE() << name << "[" << i << "] got " << got[i] << " want " << want[i];
      }
    }
    EXPECT_EQ(mismatches, 0);
  }
}

// gguf-py's Q8_0/Q4_0/Q4_1 quantizers follow the reference algorithm; ours must produce the
// same bytes.
TEST_F(GoldenTest, QuantizeMatchesGgufPy) {
  const TensorInfo* src = file_->FindTensor("qsrc");
  ASSERT_NE(src, nullptr);
  std::vector<float> x = F32Values(*src);
  for (const char* name : {"Q8_0", "Q4_0", "Q4_1", "F16", "BF16"}) {
    SCOPED_TRACE(name);
    const TensorInfo* want = file_->FindTensor(std::string("quant.") + name);
    ASSERT_NE(want, nullptr);
    std::vector<uint8_t> got(want->num_bytes);
    ASSERT_TRUE(QuantizeRow(want->type, x.data(), got.data(), src->num_elements).ok());
    EXPECT_EQ(0, std::memcmp(got.data(), want->data, got.size()));
  }
}

// --- Hand-made blocks for types gguf-py cannot dequantize -----------------------------------

TEST(DequantTest, Q8_1AndQ8_K) {
  uint8_t q81[36] = {};
  const uint16_t half = F32ToF16(0.5f);
  std::memcpy(q81, &half, 2);
  for (int i = 0; i < 32; ++i) q81[4 + i] = static_cast<uint8_t>(static_cast<int8_t>(i - 16));
  float y[256];
  ASSERT_TRUE(DequantizeRow(GgmlType::kQ8_1, q81, y, 32).ok());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], 0.5f * (i - 16));

  uint8_t q8k[292] = {};
  const float d = 0.25f;
  std::memcpy(q8k, &d, 4);
  for (int i = 0; i < 256; ++i) q8k[4 + i] = static_cast<uint8_t>(static_cast<int8_t>(i - 128));
  ASSERT_TRUE(DequantizeRow(GgmlType::kQ8_K, q8k, y, 256).ok());
  for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], 0.25f * (i - 128));
}

TEST(DequantTest, IntegerTypesAndErrors) {
  const int16_t v[4] = {-32768, -1, 0, 32767};
  float y[4];
  ASSERT_TRUE(DequantizeRow(GgmlType::kI16, v, y, 4).ok());
  EXPECT_EQ(y[0], -32768.0f);
  EXPECT_EQ(y[3], 32767.0f);
  EXPECT_EQ(DequantizeRow(GgmlType::kQ4_0, v, y, 31).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeRow(static_cast<GgmlType>(4), v, y, 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizeRow(GgmlType::kQ4_K, y, y, 256).code(), absl::StatusCode::kUnimplemented);
}

// --- Round trips with per-type error bounds --------------------------------------------------

TEST(QuantRoundTripTest, ErrorBounds) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int kBlocks = 64;
  std::vector<float> x(32 * kBlocks);
  for (int b = 0; b < kBlocks; ++b) {
    const float scale = std::ldexp(1.0f, b % 12 - 6);  // magnitudes 2^-6 .. 2^5
    for (int j = 0; j < 32; ++j) x[32 * b + j] = normal(rng) * scale;
  }
  for (int j = 0; j < 32; ++j) x[j] = 0.0f;  // an all-zero block must stay exactly zero
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                        GgmlType::kQ4_0, GgmlType::kQ4_1}) {
    SCOPED_TRACE(std::string(GgmlTypeName(type)));
    std::vector<uint8_t> q(*RowBytes(type, static_cast<int64_t>(x.size())));
    ASSERT_TRUE(QuantizeRow(type, x.data(), q.data(), static_cast<int64_t>(x.size())).ok());
    std::vector<float> y(x.size());
    ASSERT_TRUE(DequantizeRow(type, q.data(), y.data(), static_cast<int64_t>(x.size())).ok());
    for (int b = 0; b < kBlocks; ++b) {
      float amax = 0, lo = x[32 * b], hi = x[32 * b];
      for (int j = 0; j < 32; ++j) {
        amax = std::max(amax, std::fabs(x[32 * b + j]));
        lo = std::min(lo, x[32 * b + j]);
        hi = std::max(hi, x[32 * b + j]);
      }
      for (int j = 0; j < 32; ++j) {
        const float xi = x[32 * b + j], err = std::fabs(y[32 * b + j] - xi);
        float bound = 0;
        switch (type) {
          case GgmlType::kF32: bound = 0; break;
          case GgmlType::kF16: bound = std::fabs(xi) * 0x1p-11f + 0x1p-25f; break;  // half ulp
          case GgmlType::kBF16: bound = std::fabs(xi) * 0x1p-8f; break;
          // Half a step (amax/127) plus the f16 rounding of the scale times |q| <= 127.
          case GgmlType::kQ8_0: bound = amax / 254 + amax * 0x1p-10f; break;
          // The extreme maps to -8 exactly; the opposite side can clamp at +7: one full step.
          case GgmlType::kQ4_0: bound = amax / 8 + amax * 0x1p-9f; break;
          // Half a step of (max-min)/15 plus f16 rounding of d (times 15) and of the min.
          case GgmlType::kQ4_1:
            bound = (hi - lo) / 30 + (hi - lo) * 0x1p-9f + std::fabs(lo) * 0x1p-10f;
            break;
          default: break;
        }
        ASSERT_LE(err, bound) << "block " << b << " elem " << j << " x=" << xi;
        if (b == 0) {
          ASSERT_EQ(y[j], 0.0f);
        }
      }
    }
  }
}

}  // namespace
}  // namespace specd::gguf
