// Reference (de)quantization. Plain loops on purpose: these are the "truth" that fast kernels
// are tested against, so they favour readability over speed. All multi-byte fields are
// little-endian and loaded with memcpy because tensor data may sit at any address.
#include "common/gguf/quants.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"

// Keep a*b+c as two roundings so results match other reference implementations bit for bit.
#if defined(__clang__)
#pragma clang fp contract(off)
#endif

namespace specd::gguf {

static_assert(std::endian::native == std::endian::little, "GGUF data is little-endian");

namespace {

constexpr int kQK = 32;     // block size of the legacy quants
constexpr int kQK_K = 256;  // super-block size of the K-quants

uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
float LoadF16(const uint8_t* p) { return F16ToF32(LoadU16(p)); }
float LoadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
void StoreU16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// --- Legacy 32-element blocks ---------------------------------------------------------------
// Nibble packing shared by Q4_x/Q5_x: byte j holds element j in its low nibble and element
// j+16 in its high nibble.

// Q4_0: {f16 d; u8 qs[16]}            x = d * (q - 8)
void DequantQ4_0(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0x0F) - 8);
    y[j + kQK / 2] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

// Q4_1: {f16 d; f16 m; u8 qs[16]}     x = d * q + m
void DequantQ4_1(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const float m = LoadF16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0x0F) + m;
    y[j + kQK / 2] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

// Q5_0: {f16 d; u32 qh; u8 qs[16]}     5th bit of element j is bit j of qh; x = d * (q - 16)
void DequantQ5_0(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < kQK / 2; ++j) {
    const int lo = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
    y[j] = d * static_cast<float>(lo - 16);
    y[j + kQK / 2] = d * static_cast<float>(hi - 16);
  }
}

// Q5_1: {f16 d; f16 m; u32 qh; u8 qs[16]}   x = d * q + m
void DequantQ5_1(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const float m = LoadF16(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < kQK / 2; ++j) {
    const int lo = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
    y[j] = d * static_cast<float>(lo) + m;
    y[j + kQK / 2] = d * static_cast<float>(hi) + m;
  }
}

// Q8_0: {f16 d; i8 qs[32]}            x = d * q
void DequantQ8_0(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// Q8_1: {f16 d; f16 s; i8 qs[32]}     x = d * q (s caches d * sum(q) for dot products)
void DequantQ8_1(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[4 + j])) * d;
}

// --- K-quants: 256-element super-blocks ---------------------------------------------------------

// Q2_K: {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}
// 16 sub-blocks of 16. scales[i]: low nibble scale, high nibble min. Element e = 128*h + 32*s + l
// (h half, s shift 0..3, l 0..31) is bits 2s..2s+1 of qs[32*h + l]; sub-block = e / 16.
// x = d*sc * q - dmin*mn
void DequantQ2_K(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = LoadF16(b + 80);
  const float dmin = LoadF16(b + 82);
  for (int e = 0; e < kQK_K; ++e) {
    const int h = e / 128, s = (e / 32) % 4, l = e % 32;
    const int q = (qs[32 * h + l] >> (2 * s)) & 3;
    const uint8_t sc = scales[e / 16];
    const float dl = d * static_cast<float>(sc & 0x0F);
    const float ml = dmin * static_cast<float>(sc >> 4);
    y[e] = dl * static_cast<float>(q) - ml;
  }
}

// Q3_K: {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}
// Low 2 bits as in Q2_K; the high bit of element e = 32*b + l is bit b of hmask[l], and a CLEAR
// bit means "subtract 4". 16 six-bit scales (biased by 32): scale i has low nibble from
// scales[i % 8] (low nibble for i < 8, high for i >= 8) and 2 high bits from scales[8 + i % 4]
// at bit position 2 * (i / 4).   x = d * (sc - 32) * q
void DequantQ3_K(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = LoadF16(b + 108);
  for (int e = 0; e < kQK_K; ++e) {
    const int i = e / 16;
    const int lo = i < 8 ? (sc[i] & 0x0F) : (sc[i - 8] >> 4);
    const int hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
    const float dl = d * static_cast<float>((lo | (hi << 4)) - 32);
    const int h = e / 128, s = (e / 32) % 4, l = e % 32;
    const int q2 = (qs[32 * h + l] >> (2 * s)) & 3;
    const bool high = (hmask[l] >> (e / 32)) & 1;
    y[e] = dl * static_cast<float>(q2 - (high ? 0 : 4));
  }
}

// Q4_K / Q5_K scales: 12 bytes hold 8 six-bit scales and 8 six-bit mins.
//   j < 4:  sc = s[j] & 63,                        mn = s[j+4] & 63
//   j >= 4: sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4, mn = (s[j+4] >> 4) | (s[j] >> 6) << 4
void ScaleMinK4(int j, const uint8_t* s, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q4_K: {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}
// 8 sub-blocks of 32. Sub-blocks 2c and 2c+1 share qs[32c .. 32c+31]: low nibbles, then high.
// x = (d*sc) * q - (dmin*mn)
void DequantQ4_K(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const float dmin = LoadF16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 8; ++j) {
    int sc, mn;
    ScaleMinK4(j, scales, &sc, &mn);
    const float d1 = d * static_cast<float>(sc);
    const float m1 = dmin * static_cast<float>(mn);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      y[32 * j + l] = d1 * static_cast<float>((q[l] >> shift) & 0x0F) - m1;
    }
  }
}

// Q5_K: {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}
// As Q4_K, plus a 5th bit: element l of sub-block j has its high bit at bit j of qh[l].
void DequantQ5_K(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const float dmin = LoadF16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int j = 0; j < 8; ++j) {
    int sc, mn;
    ScaleMinK4(j, scales, &sc, &mn);
    const float d1 = d * static_cast<float>(sc);
    const float m1 = dmin * static_cast<float>(mn);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      const int v = ((q[l] >> shift) & 0x0F) | (((qh[l] >> j) & 1) << 4);
      y[32 * j + l] = d1 * static_cast<float>(v) - m1;
    }
  }
}

// Q6_K: {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}
// Two halves of 128. In half h, for l in 0..31, with L = ql + 64h and H = qh + 32h:
//   e = l      : low nibble of L[l],      bits 0-1 of H[l]
//   e = l + 32 : low nibble of L[l + 32], bits 2-3 of H[l]
//   e = l + 64 : high nibble of L[l],     bits 4-5 of H[l]
//   e = l + 96 : high nibble of L[l + 32], bits 6-7 of H[l]
// x = (d * scales[e / 16]) * (q - 32)
void DequantQ6_K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = LoadF16(b + 208);
  for (int e = 0; e < kQK_K; ++e) {
    const int h = e / 128, r = e % 128;
    const int quarter = r / 32, l = r % 32;
    const uint8_t lo_byte = ql[64 * h + l + 32 * (quarter % 2)];
    const int lo = quarter < 2 ? (lo_byte & 0x0F) : (lo_byte >> 4);
    const int hi = (qh[32 * h + l] >> (2 * quarter)) & 3;
    const float dl = d * static_cast<float>(scales[e / 16]);
    y[e] = dl * static_cast<float>((lo | (hi << 4)) - 32);
  }
}

// Q8_K: {f32 d; i8 qs[256]; i16 bsums[16]}   x = d * q (bsums are for dot products)
void DequantQ8_K(const uint8_t* b, float* y) {
  const float d = LoadF32(b);
  for (int j = 0; j < kQK_K; ++j) y[j] = d * static_cast<float>(static_cast<int8_t>(b[4 + j]));
}

// --- Quantization (legacy types) -------------------------------------------------------------

// Q8_0: d = max|x| / 127, q = round(x / d).
void QuantQ8_0(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  StoreU16(b, F32ToF16(d));
  for (int j = 0; j < kQK; ++j) {
    float v = std::round(x[j] * id);
    if (!(v >= -127.0f)) v = v > 0 ? 127.0f : -127.0f;  // NaN lands at -127: never UB
    if (v > 127.0f) v = 127.0f;
    b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(v));
  }
}

// Clamp before converting so hostile inputs (NaN, inf) never hit an undefined float->int cast.
int TruncClamp(float v, int hi) {
  if (!(v >= 0.0f)) return 0;
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(v);
}

// Q4_0: the value of largest magnitude maps to -8 (d = max / -8); q = trunc(x / d + 8.5).
void QuantQ4_0(const float* x, uint8_t* b) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  StoreU16(b, F32ToF16(d));
  for (int j = 0; j < kQK / 2; ++j) {
    const int lo = TruncClamp(x[j] * id + 8.5f, 15);
    const int hi = TruncClamp(x[j + kQK / 2] * id + 8.5f, 15);
    b[2 + j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

// Q4_1: m = min, d = (max - min) / 15, q = trunc((x - m) / d + 0.5).
void QuantQ4_1(const float* x, uint8_t* b) {
  float min = x[0], max = x[0];
  for (int j = 1; j < kQK; ++j) {
    min = std::fmin(min, x[j]);
    max = std::fmax(max, x[j]);
  }
  const float d = (max - min) / 15.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  StoreU16(b, F32ToF16(d));
  StoreU16(b + 2, F32ToF16(min));
  for (int j = 0; j < kQK / 2; ++j) {
    const int lo = TruncClamp((x[j] - min) * id + 0.5f, 15);
    const int hi = TruncClamp((x[j + kQK / 2] - min) * id + 0.5f, 15);
    b[4 + j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

// --- Half-precision conversions --------------------------------------------------------------

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf, or NaN keeping its payload
  } else if (exp != 0) {
    bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;  // +-0
  } else {
    // Subnormal: mant * 2^-24. Normalize so the leading 1 becomes the implicit bit.
    int e = -14;
    while ((mant & 0x400) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (static_cast<uint32_t>(e + 127) << 23) | ((mant & 0x3FF) << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t F32ToF16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t abs = x & 0x7FFFFFFF;
  if (abs > 0x7F800000) {
    // NaN: keep the top payload bits and force a quiet NaN so it never becomes inf.
    return static_cast<uint16_t>(sign | 0x7E00 | ((abs >> 13) & 0x3FF));
  }
  const int e = static_cast<int>(abs >> 23) - 127;
  if (e > 15) return static_cast<uint16_t>(sign | 0x7C00);  // too large (or inf): inf
  if (e >= -14) {
    // Normal range: drop 13 mantissa bits with round-to-nearest-even. A carry out of the
    // mantissa correctly bumps the exponent (up to inf).
    const uint32_t mant = abs & 0x7FFFFF;
    uint32_t h = (static_cast<uint32_t>(e + 15) << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  // Subnormal result: value = m * 2^(e-23) with m the 24-bit significand; in units of 2^-24
  // that is m >> (-e - 1), rounded to nearest even.
  const int shift = -e - 1;  // >= 14
  if (shift > 24) return sign;  // below half of the smallest subnormal (incl. f32 subnormals)
  const uint32_t m = (abs & 0x7FFFFF) | 0x800000;
  uint32_t h = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float BF16ToF32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t F32ToBF16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFF) > 0x7F800000) {
    return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN, sign and top payload kept
  }
  // Round to nearest even on the 16 dropped bits; cannot overflow uint32 for non-NaN input.
  return static_cast<uint16_t>((x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}

// --- Row entry points ------------------------------------------------------------------------

absl::Status DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n) {
  absl::StatusOr<GgmlTypeTraits> traits = GetTypeTraits(type);
  if (!traits.ok()) return traits.status();
  if (n < 0 || n % traits->block_size != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "DequantizeRow: %d elements is not a multiple of the %s block size %d", n, traits->name,
        traits->block_size));
  }
  const uint8_t* p = static_cast<const uint8_t*>(src);
  const int64_t nb = n / traits->block_size;
  const int64_t bs = traits->type_size;
  void (*block_fn)(const uint8_t*, float*) = nullptr;
  switch (type) {
    case GgmlType::kF32:
      for (int64_t i = 0; i < n; ++i) dst[i] = LoadF32(p + 4 * i);
      return absl::OkStatus();
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = LoadF16(p + 2 * i);
      return absl::OkStatus();
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = BF16ToF32(LoadU16(p + 2 * i));
      return absl::OkStatus();
    case GgmlType::kF64:
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(Load<double>(p + 8 * i));
      return absl::OkStatus();
    case GgmlType::kI8:
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(Load<int8_t>(p + i));
      return absl::OkStatus();
    case GgmlType::kI16:
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(Load<int16_t>(p + 2 * i));
      return absl::OkStatus();
    case GgmlType::kI32:
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(Load<int32_t>(p + 4 * i));
      return absl::OkStatus();
    case GgmlType::kI64:
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(Load<int64_t>(p + 8 * i));
      return absl::OkStatus();
    case GgmlType::kQ4_0: block_fn = DequantQ4_0; break;
    case GgmlType::kQ4_1: block_fn = DequantQ4_1; break;
    case GgmlType::kQ5_0: block_fn = DequantQ5_0; break;
    case GgmlType::kQ5_1: block_fn = DequantQ5_1; break;
    case GgmlType::kQ8_0: block_fn = DequantQ8_0; break;
    case GgmlType::kQ8_1: block_fn = DequantQ8_1; break;
    case GgmlType::kQ2_K: block_fn = DequantQ2_K; break;
    case GgmlType::kQ3_K: block_fn = DequantQ3_K; break;
    case GgmlType::kQ4_K: block_fn = DequantQ4_K; break;
    case GgmlType::kQ5_K: block_fn = DequantQ5_K; break;
    case GgmlType::kQ6_K: block_fn = DequantQ6_K; break;
    case GgmlType::kQ8_K: block_fn = DequantQ8_K; break;
  }
  if (block_fn == nullptr) {
    return absl::UnimplementedError(
        absl::StrFormat("DequantizeRow: type %s is not supported", traits->name));
  }
  for (int64_t i = 0; i < nb; ++i) block_fn(p + i * bs, dst + i * traits->block_size);
  return absl::OkStatus();
}

absl::Status QuantizeRow(GgmlType type, const float* src, void* dst, int64_t n) {
  absl::StatusOr<GgmlTypeTraits> traits = GetTypeTraits(type);
  if (!traits.ok()) return traits.status();
  if (n < 0 || n % traits->block_size != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "QuantizeRow: %d elements is not a multiple of the %s block size %d", n, traits->name,
        traits->block_size));
  }
  uint8_t* p = static_cast<uint8_t*>(dst);
  const int64_t nb = n / traits->block_size;
  const int64_t bs = traits->type_size;
  void (*block_fn)(const float*, uint8_t*) = nullptr;
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(p, src, static_cast<size_t>(n) * 4);
      return absl::OkStatus();
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) StoreU16(p + 2 * i, F32ToF16(src[i]));
      return absl::OkStatus();
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) StoreU16(p + 2 * i, F32ToBF16(src[i]));
      return absl::OkStatus();
    case GgmlType::kQ4_0: block_fn = QuantQ4_0; break;
    case GgmlType::kQ4_1: block_fn = QuantQ4_1; break;
    case GgmlType::kQ8_0: block_fn = QuantQ8_0; break;
    default: break;
  }
  if (block_fn == nullptr) {
    return absl::UnimplementedError(
        absl::StrFormat("QuantizeRow: quantizing to %s is not supported", traits->name));
  }
  for (int64_t i = 0; i < nb; ++i) block_fn(src + i * traits->block_size, p + i * bs);
  return absl::OkStatus();
}

}  // namespace specd::gguf
