// Reference kernels: plain scalar loops. Speed is irrelevant here; clarity is not.
#include "kernels/ref/ops.h"
#include "kernels/attn_bf16.h"
#include "kernels/kv_int8.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numbers>
#include <vector>

#include "kernels/act_quant.h"

namespace specd::kernels::ref {
namespace {

using gguf::GgmlType;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "specd::kernels::ref: %s\n", what);
  std::abort();
}

uint16_t Load16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// Block layouts (bytes, little endian), per the GGUF format:
//   Q8_0 (32 values, 34 B):  f16 d, i8 qs[32]                 w = d * qs[i]
//   Q4_0 (32 values, 18 B):  f16 d, u8 qs[16]                 w = d * (nib - 8)
//   Q4_1 (32 values, 20 B):  f16 d, f16 m, u8 qs[16]          w = d * nib + m
//     (value i < 16 is the low nibble of qs[i], value i + 16 its high nibble)
//   Q4_K (256 values, 144 B): f16 d, f16 dmin, u8 scales[12], u8 qs[128]
//     8 sub-blocks of 32 with 6-bit scale sc_j and min m_j: w = d*sc_j*nib - dmin*m_j;
//     qs[32c + l] holds value 64c + l (low nibble) and 64c + 32 + l (high nibble).
//   Q6_K (256 values, 210 B): u8 ql[128], u8 qh[64], i8 scales[16], f16 d
//     w = d * scales[i / 16] * (q6 - 32), q6 = 4 low bits from ql | 2 high bits from qh.
constexpr int64_t kQ8_0Bytes = 34, kQ4_0Bytes = 18, kQ4_1Bytes = 20, kQ4_KBytes = 144,
                  kQ6_KBytes = 210;

void Q4KScaleMin(const uint8_t* scales, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4);
    *m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}

// Decodes sub-block `sb` (32 values) of a quantized row.
void DecodeSubBlockImpl(GgmlType type, const uint8_t* row, int64_t sb, IntSubBlock* out) {
  for (int i = 0; i < 32; ++i) out->sub_scale[i] = 1;
  out->min = 0.0f;
  switch (type) {
    case GgmlType::kQ8_0: {
      const uint8_t* b = row + sb * kQ8_0Bytes;
      out->scale = F16ToF32(Load16(b));
      for (int i = 0; i < 32; ++i) out->q[i] = static_cast<int8_t>(b[2 + i]);
      return;
    }
    case GgmlType::kQ4_0: {
      const uint8_t* b = row + sb * kQ4_0Bytes;
      out->scale = F16ToF32(Load16(b));
      for (int i = 0; i < 16; ++i) {
        out->q[i] = (b[2 + i] & 0x0F) - 8;
        out->q[i + 16] = (b[2 + i] >> 4) - 8;
      }
      return;
    }
    case GgmlType::kQ4_1: {
      const uint8_t* b = row + sb * kQ4_1Bytes;
      out->scale = F16ToF32(Load16(b));
      out->min = F16ToF32(Load16(b + 2));
      for (int i = 0; i < 16; ++i) {
        out->q[i] = b[4 + i] & 0x0F;
        out->q[i + 16] = b[4 + i] >> 4;
      }
      return;
    }
    case GgmlType::kQ4_K: {
      const uint8_t* b = row + (sb / 8) * kQ4_KBytes;
      const int j = static_cast<int>(sb % 8);
      const float d = F16ToF32(Load16(b));
      const float dmin = F16ToF32(Load16(b + 2));
      int sc, m;
      Q4KScaleMin(b + 4, j, &sc, &m);
      out->scale = d * static_cast<float>(sc);
      out->min = -dmin * static_cast<float>(m);
      const uint8_t* qs = b + 16 + 32 * (j / 2);
      for (int i = 0; i < 32; ++i) out->q[i] = (j % 2 == 0) ? (qs[i] & 0x0F) : (qs[i] >> 4);
      return;
    }
    case GgmlType::kQ6_K: {
      const uint8_t* b = row + (sb / 8) * kQ6_KBytes;
      const uint8_t* ql = b;
      const uint8_t* qh = b + 128;
      const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
      out->scale = F16ToF32(Load16(b + 208));
      for (int i = 0; i < 32; ++i) {
        const int idx = static_cast<int>(sb % 8) * 32 + i;  // 0..255 within the block
        const int half = idx / 128;                           // which 128-value half
        const int r = idx % 128;
        const int quarter = r / 32;                           // 0..3
        const int l = r % 32;
        const uint8_t* qlh = ql + 64 * half;
        const uint8_t* qhh = qh + 32 * half;
        int lo;
        switch (quarter) {
          case 0: lo = qlh[l] & 0x0F; break;
          case 1: lo = qlh[l + 32] & 0x0F; break;
          case 2: lo = qlh[l] >> 4; break;
          default: lo = qlh[l + 32] >> 4; break;
        }
        const int hi = (qhh[l] >> (2 * quarter)) & 3;
        out->q[i] = (lo | (hi << 4)) - 32;
        out->sub_scale[i] = scales[idx / 16];
      }
      return;
    }
    default:
      Fail("DecodeSubBlock: unsupported type");
  }
}

bool IsQuantized(GgmlType t) {
  return t == GgmlType::kQ8_0 || t == GgmlType::kQ4_0 || t == GgmlType::kQ4_1 ||
         t == GgmlType::kQ4_K || t == GgmlType::kQ6_K;
}

float LoadFloat(GgmlType t, const uint8_t* row, int64_t k) {
  switch (t) {
    case GgmlType::kF32: {
      float f;
      std::memcpy(&f, row + 4 * k, 4);
      return f;
    }
    case GgmlType::kF16: return F16ToF32(Load16(row + 2 * k));
    case GgmlType::kBF16: return BF16ToF32(Load16(row + 2 * k));
    default: Fail("LoadFloat: not a float type");
  }
}

// Element `index` of the K or V pool as f32; `scale` is its row's int8 scale (kInt8 only).
float KvLoad(const PagedKvLayer& kv, const void* base, int64_t index, float scale) {
  switch (kv.dtype) {
    case KvDtype::kF32: return static_cast<const float*>(base)[index];
    case KvDtype::kF16: return F16ToF32(static_cast<const uint16_t*>(base)[index]);
    case KvDtype::kBF16: return BF16ToF32(static_cast<const uint16_t*>(base)[index]);
    case KvDtype::kInt8: return static_cast<float>(static_cast<const int8_t*>(base)[index]) * scale;
  }
  return 0.0f;
}

}  // namespace

void DecodeIntSubBlock(gguf::GgmlType type, const uint8_t* row, int64_t sb, IntSubBlock* out) {
  DecodeSubBlockImpl(type, row, sb, out);
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1;
  const int exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal
  } else if (exp == 31) {
    v = mant ? std::nanf("") : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
  }
  return sign ? -v : v;
}

uint16_t F32ToF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t ax = x & 0x7FFFFFFF;
  if (ax > 0x7F800000) return sign | 0x7E00 | static_cast<uint16_t>((ax >> 13) & 0x3FF);  // NaN
  if (ax >= 0x47800000) {  // >= 65536: overflow unless it rounds down below; 65520 rounds to inf
    return sign | 0x7C00;
  }
  const float af = std::fabs(f);
  if (af < 6.103515625e-05f) {  // subnormal half: units of 2^-24, round half even
    const float units = af * 16777216.0f;  // exact (power-of-two scaling)
    return sign | static_cast<uint16_t>(std::nearbyint(units));
  }
  // Normal: keep 10 mantissa bits, round to nearest even on the 13 dropped bits.
  uint32_t e = (ax >> 23) - 127 + 15;
  uint32_t m = ax & 0x7FFFFF;
  const uint32_t dropped = m & 0x1FFF;
  m >>= 13;
  uint32_t h = (e << 10) | m;
  if (dropped > 0x1000 || (dropped == 0x1000 && (m & 1))) ++h;  // may carry into exponent/inf
  return sign | static_cast<uint16_t>(h);
}

float BF16ToF32(uint16_t h) {
  const uint32_t x = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t F32ToBF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  const uint32_t rounded = x + 0x7FFF + ((x >> 16) & 1);
  return static_cast<uint16_t>(rounded >> 16);
}

bool DequantizeRow(gguf::GgmlType type, const void* src, int64_t n, float* dst) {
  const auto* row = static_cast<const uint8_t*>(src);
  if (type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16) {
    for (int64_t k = 0; k < n; ++k) dst[k] = LoadFloat(type, row, k);
    return true;
  }
  if (!IsQuantized(type)) return false;
  IntSubBlock sb;
  for (int64_t b = 0; b < n / 32; ++b) {
    DecodeSubBlockImpl(type, row, b, &sb);
    for (int i = 0; i < 32; ++i) {
      dst[b * 32 + i] = sb.scale * static_cast<float>(sb.sub_scale[i] * sb.q[i]) + sb.min;
    }
  }
  return true;
}

void MatMul(const WeightMatrix& w, const float* x, int64_t T, float* y) {
  if (!MatMulSupportsType(w.type)) Fail("MatMul: unsupported weight type");
  const int64_t K = w.cols;
  if (!IsQuantized(w.type)) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t n = 0; n < w.rows; ++n) {
        const uint8_t* row = w.data + n * w.row_bytes;
        float acc = 0.0f;
        for (int64_t k = 0; k < K; ++k) acc += LoadFloat(w.type, row, k) * x[t * K + k];
        y[t * w.rows + n] = acc;
      }
    }
    return;
  }
  if (K % 32 != 0) Fail("MatMul: cols not a multiple of 32");
  const int64_t nb = K / 32;
  std::vector<ActBlockQ8> act(static_cast<size_t>(T * nb));
  for (int64_t t = 0; t < T; ++t) QuantizeActRow(x + t * K, K, act.data() + t * nb);
  IntSubBlock sb;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < w.rows; ++n) {
      const uint8_t* row = w.data + n * w.row_bytes;
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        DecodeSubBlockImpl(w.type, row, b, &sb);
        const ActBlockQ8& a = act[t * nb + b];
        int32_t isum = 0;
        for (int i = 0; i < 32; ++i) isum += sb.sub_scale[i] * sb.q[i] * a.qs[i];
        acc += (sb.scale * a.d) * static_cast<float>(isum);
        if (sb.min != 0.0f) acc += sb.min * a.s;
      }
      y[t * w.rows + n] = acc;
    }
  }
}

void RmsNorm(const float* x, int64_t T, int64_t D, const float* w, float eps, float* out) {
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0.0;
    for (int64_t i = 0; i < D; ++i) ss += static_cast<double>(x[t * D + i]) * x[t * D + i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(D) + eps));
    for (int64_t i = 0; i < D; ++i) out[t * D + i] = x[t * D + i] * inv * w[i];
  }
}

void RopeInvFreq(const RopeParams& p, double* inv_freq) {
  const int half = p.rope_dim / 2;
  for (int i = 0; i < half; ++i) {
    double f = std::pow(static_cast<double>(p.freq_base), -2.0 * i / p.rope_dim);
    if (p.freq_factors != nullptr) {
      f /= p.freq_factors[i];
    } else if (p.llama3_scaling) {
      // Llama 3.1: keep high frequencies, divide low ones by `factor`, blend between.
      const double low_freq_wavelen = p.original_context / static_cast<double>(p.low_freq_factor);
      const double high_freq_wavelen = p.original_context / static_cast<double>(p.high_freq_factor);
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen < high_freq_wavelen) {
        // unchanged
      } else if (wavelen > low_freq_wavelen) {
        f = f / p.factor;
      } else {
        const double smooth = (p.original_context / wavelen - p.low_freq_factor) /
                              (static_cast<double>(p.high_freq_factor) - p.low_freq_factor);
        f = (1.0 - smooth) * f / p.factor + smooth * f;
      }
    }
    inv_freq[i] = f / p.linear_scale;
  }
}

void Rope(float* x, int64_t T, int32_t num_heads, int32_t head_dim, const int32_t* positions,
          const RopeParams& p) {
  const int half = p.rope_dim / 2;
  std::vector<double> inv_freq(half);
  RopeInvFreq(p, inv_freq.data());
  for (int64_t t = 0; t < T; ++t) {
    for (int32_t h = 0; h < num_heads; ++h) {
      float* v = x + (t * num_heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const double angle = static_cast<double>(positions[t]) * inv_freq[i];
        const float c = static_cast<float>(std::cos(angle));
        const float s = static_cast<float>(std::sin(angle));
        const int i0 = p.layout == RopeLayout::kNormal ? 2 * i : i;
        const int i1 = p.layout == RopeLayout::kNormal ? 2 * i + 1 : i + half;
        const float a = v[i0], b = v[i1];
        v[i0] = a * c - b * s;
        v[i1] = a * s + b * c;
      }
    }
  }
}

void SwiGlu(const float* gate, const float* up, int64_t T, int64_t F, float* out) {
  for (int64_t i = 0; i < T * F; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void Softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void AddInPlace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void AddBias(float* x, int64_t T, int64_t N, const float* b) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < N; ++i) x[t * N + i] += b[i];
}

void EmbeddingLookup(const WeightMatrix& table, const int32_t* ids, int64_t T, float* out) {
  for (int64_t t = 0; t < T; ++t) {
    if (ids[t] < 0 || ids[t] >= table.rows) Fail("EmbeddingLookup: id out of range");
    if (!DequantizeRow(table.type, table.data + ids[t] * table.row_bytes, table.cols,
                       out + t * table.cols)) {
      Fail("EmbeddingLookup: unsupported type");
    }
  }
}

void WriteKv(const float* k, const float* v, int64_t T, const int64_t* slots,
             const PagedKvLayer& kv) {
  const int64_t row = static_cast<int64_t>(kv.num_kv_heads) * kv.head_dim;
  for (int64_t t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;  // a padding row of a bucketed step
    if (slots[t] >= kv.num_blocks * kv.block_size) Fail("WriteKv: bad slot");
    if (kv.dtype == KvDtype::kInt8) {  // one scale per (token, head) row
      for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
        const int64_t src = t * row + static_cast<int64_t>(h) * kv.head_dim;
        kv.k_scale[kv.SIndex(slots[t], h)] =
            QuantizeKvRow(k + src, kv.head_dim, static_cast<int8_t*>(kv.k) + kv.KIndex(slots[t], h, 0),
                          kv.block_size);
        kv.v_scale[kv.SIndex(slots[t], h)] =
            QuantizeKvRow(v + src, kv.head_dim, static_cast<int8_t*>(kv.v) + kv.VIndex(slots[t], h), 1);
      }
      continue;
    }
    for (int64_t i = 0; i < row; ++i) {
      const int32_t h = static_cast<int32_t>(i / kv.head_dim), dim = static_cast<int32_t>(i % kv.head_dim);
      const int64_t kdst = kv.KIndex(slots[t], h, dim), vdst = kv.VIndex(slots[t], h) + dim;
      const float kf = k[t * row + i], vf = v[t * row + i];
      switch (kv.dtype) {
        case KvDtype::kF32:
          static_cast<float*>(kv.k)[kdst] = kf;
          static_cast<float*>(kv.v)[vdst] = vf;
          break;
        case KvDtype::kF16:
          static_cast<uint16_t*>(kv.k)[kdst] = F32ToF16(kf);
          static_cast<uint16_t*>(kv.v)[vdst] = F32ToF16(vf);
          break;
        case KvDtype::kBF16:  // bf16 attention's rounding (kernels/attn_bf16.h)
          static_cast<uint16_t*>(kv.k)[kdst] = ToBf16Attn(kf);
          static_cast<uint16_t*>(kv.v)[vdst] = ToBf16Attn(vf);
          break;
        case KvDtype::kInt8:
          break;  // quantized per row above
      }
    }
  }
}

float KAt(const PagedKvLayer& kv, int64_t slot, int32_t h, int32_t i) {
  return KvLoad(kv, kv.k, kv.KIndex(slot, h, i),
                kv.dtype == KvDtype::kInt8 ? kv.k_scale[kv.SIndex(slot, h)] : 1.0f);
}

float VAt(const PagedKvLayer& kv, int64_t slot, int32_t h, int32_t i) {
  return KvLoad(kv, kv.v, kv.VIndex(slot, h) + i,
                kv.dtype == KvDtype::kInt8 ? kv.v_scale[kv.SIndex(slot, h)] : 1.0f);
}

void PagedAttention(const float* q, int64_t T, int32_t num_q_heads, const int32_t* positions,
                    const int32_t* const* block_tables, const PagedKvLayer& kv, float scale,
                    float* out) {
  const int32_t d = kv.head_dim;
  const int32_t group = num_q_heads / kv.num_kv_heads;
  if (group * kv.num_kv_heads != num_q_heads) Fail("PagedAttention: Hq % Hkv != 0");
  // bf16 attention (kernels/attn_bf16.h): q rounded to bf16, each score summed over the dims
  // in pairs, odd dim first. p stays exact here: the reference is the exact attention over
  // the stored operands, so the kernels' p rounding shows as their error against it.
  const bool bf16 = kv.dtype == KvDtype::kBF16;
  const int32_t pair_swap = bf16 ? 1 : 0;
  // int8 KV (kernels/kv_int8.h): q quantized per row, each score an exact integer dot product
  // of the codes, scaled by Int8Score; p and p V stay exact here, as for bf16.
  const bool int8 = kv.dtype == KvDtype::kInt8;
  std::vector<float> scores, qr(static_cast<size_t>(d));
  std::vector<int8_t> qc(static_cast<size_t>(d));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t len = static_cast<int64_t>(positions[t]) + 1;
    scores.resize(static_cast<size_t>(len));
    for (int32_t h = 0; h < num_q_heads; ++h) {
      const int32_t kvh = h / group;
      const float* qv = q + (t * num_q_heads + h) * d;
      if (bf16) {
        for (int32_t i = 0; i < d; ++i) qr[i] = RoundBf16Attn(qv[i]);
        qv = qr.data();
      }
      const float qss = int8 ? QuantizeKvRow(qv, d, qc.data(), 1) * scale : 0.0f;
      for (int64_t j = 0; j < len; ++j) {
        const int64_t slot =
            static_cast<int64_t>(block_tables[t][j / kv.block_size]) * kv.block_size +
            j % kv.block_size;
        if (int8) {
          int64_t isum = 0;
          for (int32_t i = 0; i < d; ++i) {
            isum += static_cast<int64_t>(qc[i]) * static_cast<const int8_t*>(kv.k)[kv.KIndex(slot, kvh, i)];
          }
          scores[j] = Int8Score(static_cast<float>(isum), kv.k_scale[kv.SIndex(slot, kvh)], qss);
          continue;
        }
        float dot = 0.0f;
        for (int32_t i0 = 0; i0 < d; ++i0) {
          const int32_t i = (i0 ^ pair_swap) < d ? i0 ^ pair_swap : i0;  // an odd d's last dim alone
          dot += qv[i] * KAt(kv, slot, kvh, i);
        }
        scores[j] = dot * scale;
      }
      float mx = scores[0];
      for (int64_t j = 1; j < len; ++j) mx = scores[j] > mx ? scores[j] : mx;
      float sum = 0.0f;
      for (int64_t j = 0; j < len; ++j) {
        scores[j] = std::exp(scores[j] - mx);
        sum += scores[j];
      }
      float* o = out + (t * num_q_heads + h) * d;
      for (int32_t i = 0; i < d; ++i) o[i] = 0.0f;
      for (int64_t j = 0; j < len; ++j) {
        const int64_t slot =
            static_cast<int64_t>(block_tables[t][j / kv.block_size]) * kv.block_size +
            j % kv.block_size;
        const float p = scores[j] / sum;
        for (int32_t i = 0; i < d; ++i) o[i] += p * VAt(kv, slot, kvh, i);
      }
    }
  }
}

}  // namespace specd::kernels::ref
