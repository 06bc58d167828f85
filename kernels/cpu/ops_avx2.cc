// AVX2 + FMA + F16C kernels. This file is compiled with -mavx2 -mfma -mf16c and is only
// called after a runtime CPU check; everything here is in an anonymous namespace and uses
// no standard-library templates (see backend.h).
//
// SPECD_X8_DOT picks the quantized MatMul's int8 dot and vector shapes, the one thing that
// differs between the backends built from this file:
//   0  AVX2: maddubs into int16 pairs, 8 weight rows per vector (this file, ops_avx2.cc)
//   1  AVX-512 VNNI: vpdpbusd; batches (T > 1) take 16 rows per 512-bit vector, single
//      tokens 8 per 256-bit one (ops_avx512vnni.cc, -mavx512f/bw/vl/vnni)
//   2  the same code with AVX-512 emulated by SIMDe in AVX2 (ops_vnni_emulated.cc): runs
//      the VNNI paths on CPUs without AVX-512, for tests; never chosen by default
//   3  AVX-VNNI: vpdpbusd in its VEX form on AVX2's 256-bit shapes, 8 weight rows per
//      vector (ops_avxvnni.cc, -mavxvnni): AVX2 CPUs with AVX-VNNI and no AVX-512 (Intel's
//      client cores since Alder Lake, its E-core Xeons)
//   4  that code with vpdpbusd emulated exactly in AVX2 (ops_avxvnni_emulated.cc): runs the
//      AVX-VNNI paths on CPUs without it, for tests; never chosen by default
// Every path computes the same exact integer block sums and then the same float steps per
// (row, token), so all five give bitwise the same MatMul.
#ifndef SPECD_X8_DOT
#define SPECD_X8_DOT 0
#endif
// The backends with 512-bit vectors (Z16 below): AVX-512 VNNI and its emulated twin.
#define SPECD_X8_Z16 (SPECD_X8_DOT == 1 || SPECD_X8_DOT == 2)

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#if SPECD_X8_Z16
// The VNNI backends' 512-bit and vpdpbusd code is written against SIMDe: its functions are
// the native intrinsics where the compiler targets the ISA (ops_avx512vnni.cc) and a
// portable emulation where it does not (ops_vnni_emulated.cc).
#include <simde/x86/avx512.h>
#if SPECD_X8_DOT == 1 && !(defined(SIMDE_X86_AVX512VNNI_NATIVE) && defined(SIMDE_X86_AVX512BW_NATIVE) && \
                           defined(SIMDE_X86_AVX512VL_NATIVE))
#error "ops_avx512vnni.cc must be built with -mavx512f -mavx512bw -mavx512vl -mavx512vnni"
#endif
#if SPECD_X8_DOT == 2 && (defined(SIMDE_X86_AVX512VNNI_NATIVE) || defined(SIMDE_X86_AVX512F_NATIVE))
#error "ops_vnni_emulated.cc must be built without AVX-512: it is the emulated twin"
#endif
#endif
#if SPECD_X8_DOT == 3 && !defined(__AVXVNNI__)
#error "ops_avxvnni.cc must be built with -mavxvnni"
#endif
#if SPECD_X8_DOT == 4 && (defined(__AVXVNNI__) || defined(__AVX512F__))
#error "ops_avxvnni_emulated.cc must be built with AVX2 alone: it is the emulated twin"
#endif

#include "kernels/attn_bf16.h"
#include "kernels/cpu/isa_kernels.h"
#include "kernels/kv_int8.h"

namespace specd::kernels::cpu::internal {
namespace {

constexpr bool kVnni = SPECD_X8_DOT != 0;

using gguf::GgmlType;

inline float HsumPs(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

inline float HmaxPs(__m256 v) {
  __m128 lo = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_max_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_max_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

inline int32_t HsumEpi32(__m256i v) {
  __m128i lo = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  lo = _mm_add_epi32(lo, _mm_shuffle_epi32(lo, 0x4E));
  lo = _mm_add_epi32(lo, _mm_shuffle_epi32(lo, 0xB1));
  return _mm_cvtsi128_si32(lo);
}

// A software prefetch (prefetcht0, or prefetcht1 with kL2) that the compiler keeps. GCC counts
// _mm_prefetch as free of side effects: a helper that did nothing but prefetch
// (PrefetchKvChunk, MatMulFT's prefetch_rows) was found pure and every call to it deleted, so
// for sessions the KV cache was never prefetched (docs/PERFORMANCE.md, "The KV prefetch
// that was never emitted").
template <bool kL2 = false>
inline void PrefetchLine(const void* p) {
  if constexpr (kL2) {
    __asm__ volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(p)));
  } else {
    __asm__ volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
  }
}

inline uint16_t Ld16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline float H2F(uint16_t h) { return _cvtsh_ss(h); }

// Float vectors of 8 (AVX2) and 16 (AVX-512) lanes, for code written once for both widths
// whose lanes must see the same steps (so the same bits) at either width.
struct Vec8 {
  using F = __m256;
  static constexpr int kW = 8;
  static F Zero() { return _mm256_setzero_ps(); }
  static F Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F Set1(float x) { return _mm256_set1_ps(x); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F Fnma(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F Min(F a, F b) { return _mm256_min_ps(a, b); }
  static F Max(F a, F b) { return _mm256_max_ps(a, b); }
  static F RoundNearest(F a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // 2^n for integral n in float lanes (exponent bits).
  static F Pow2(F n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  // v where x >= lo or x is NaN, else 0.
  static F ZeroBelow(F x, F lo, F v) { return _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), v); }
  // ZeroBelow(x, lo, v * 2^n), n integral in [-126, 127].
  static F ScaledPow2ZeroBelow(F x, F lo, F v, F n) { return ZeroBelow(x, lo, Mul(v, Pow2(n))); }
  // kW f16 values / int8 codes to f32 (exact).
  static F FromF16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F FromI8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
};
#if SPECD_X8_DOT == 1
struct Vec16 {
  using F = __m512;
  static constexpr int kW = 16;
  static F Zero() { return _mm512_setzero_ps(); }
  static F Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F Set1(float x) { return _mm512_set1_ps(x); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F Fnma(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F Min(F a, F b) { return _mm512_min_ps(a, b); }
  static F Max(F a, F b) { return _mm512_max_ps(a, b); }
  static F RoundNearest(F a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static F Pow2(F n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  static F ZeroBelow(F x, F lo, F v) { return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ), v); }
  // One vscalefps: v * 2^n is one correctly rounded product either way, so Vec8's bits.
  static F ScaledPow2ZeroBelow(F x, F lo, F v, F n) {
    return _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ), v, n);
  }
  static F FromF16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static F FromI8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
};

// The largest of v's 16 lanes: the larger of its halves lane by lane, then HmaxPs.
inline float Hmax16(__m512 v) {
  return HmaxPs(_mm256_max_ps(_mm512_castps512_ps256(v),
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

// The first `count` of 16 lanes (none for count <= 0, all for count >= 16).
inline __mmask16 FirstLanes16(int64_t count) {
  return count >= 16 ? __mmask16(0xFFFF) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1);
}
#endif

// e^x per lane: x = n ln2 + r, |r| <= ln2/2, degree-7 Taylor polynomial for e^r.
// Relative error ~1e-7; inputs below -87.3 give 0, above 88 saturate near e^88.
template <class V>
inline typename V::F ExpV(typename V::F x) {
  const typename V::F lo = V::Set1(-87.3f);
  const typename V::F xc = V::Min(V::Max(x, lo), V::Set1(88.0f));
  const typename V::F fx = V::RoundNearest(V::Mul(xc, V::Set1(1.44269504088896341f)));
  typename V::F r = V::Fnma(fx, V::Set1(0.693359375f), xc);
  r = V::Fnma(fx, V::Set1(-2.12194440e-4f), r);
  typename V::F p = V::Set1(1.0f / 5040.0f);
  p = V::Fma(p, r, V::Set1(1.0f / 720.0f));
  p = V::Fma(p, r, V::Set1(1.0f / 120.0f));
  p = V::Fma(p, r, V::Set1(1.0f / 24.0f));
  p = V::Fma(p, r, V::Set1(1.0f / 6.0f));
  p = V::Fma(p, r, V::Set1(0.5f));
  p = V::Fma(p, r, V::Set1(1.0f));
  p = V::Fma(p, r, V::Set1(1.0f));
  return V::ScaledPow2ZeroBelow(x, lo, p, fx);
}
inline __m256 Exp8(__m256 x) { return ExpV<Vec8>(x); }

// ---------------------------------------------------------------- activations

#if SPECD_X8_DOT == 1
// Lane i of the result: op over the 16 lanes of v[i]. Halves, then quarters, then pairs of the
// vectors are folded into each other, which transposes as it reduces; the lanes come out in
// the order kReduce16Lanes undoes. max and exact integer sums do not depend on the order.
constexpr int kReduce16Lanes[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};
template <class Op>
inline __m512 Reduce16(const __m512 (&v)[16], Op op) {
  __m512 w[8], x[4], y[2];
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    w[k] = op(_mm512_shuffle_f32x4(v[k], v[k + 8], _MM_SHUFFLE(1, 0, 1, 0)),
              _mm512_shuffle_f32x4(v[k], v[k + 8], _MM_SHUFFLE(3, 2, 3, 2)));
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    x[k] = op(_mm512_shuffle_f32x4(w[k], w[k + 4], _MM_SHUFFLE(2, 0, 2, 0)),
              _mm512_shuffle_f32x4(w[k], w[k + 4], _MM_SHUFFLE(3, 1, 3, 1)));
  }
#pragma GCC unroll 2
  for (int k = 0; k < 2; ++k) {
    y[k] = op(_mm512_shuffle_ps(x[k], x[k + 2], _MM_SHUFFLE(1, 0, 1, 0)),
              _mm512_shuffle_ps(x[k], x[k + 2], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  const __m512 z = op(_mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                      _mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i lanes = _mm512_loadu_si512(kReduce16Lanes);
  return _mm512_permutexvar_ps(lanes, z);
}

// 16 blocks (x: [16][32]) at once: each block's |x| max and code sum are reduced across the
// 16 together (Reduce16), so d, 1 / d and s are vector operations, not two scalar divisions
// and two horizontal reductions a block that wait on each other (~41 cycles a block before,
// docs/PERFORMANCE.md). Per value the same operations as QuantizeActRow: the same bytes.
void QuantizeAct16(const float* x, ActBlockQ8* out) {
  const __m512 qmax = _mm512_set1_ps(127.0f), qmin = _mm512_set1_ps(-127.0f);
  __m512 part[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    part[i] = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + 32 * i)),
                            _mm512_abs_ps(_mm512_loadu_ps(x + 32 * i + 16)));
  }
  const __m512 amax = Reduce16(part, [](__m512 a, __m512 b) { return _mm512_max_ps(a, b); });
  const __m512 d = _mm512_div_ps(amax, qmax);
  const __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_UQ),
                                        _mm512_set1_ps(1.0f), d);
  alignas(64) float ids[16];
  _mm512_store_ps(ids, id);
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    const __m512 idb = _mm512_set1_ps(ids[i]);
    __m512i c[2];
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * i + 16 * h), idb),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      c[h] = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(r, qmin), qmax));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out[i].qs + 16 * h), _mm512_cvtsepi32_epi8(c[h]));
    }
    part[i] = _mm512_castsi512_ps(_mm512_add_epi32(c[0], c[1]));
  }
  const __m512 sums = Reduce16(part, [](__m512 a, __m512 b) {
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
  });
  const __m512 sv = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_castps_si512(sums)));
  alignas(64) float ds[16], ss[16];
  _mm512_store_ps(ds, d);
  _mm512_store_ps(ss, sv);
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    out[i].d = ds[i];
    out[i].s = ss[i];
  }
}
#endif

void QuantizeAct(const float* x, int64_t n, ActBlockQ8* out) {
  int64_t b0 = 0;
#if SPECD_X8_DOT == 1
  for (; b0 + 16 <= n / 32; b0 += 16) QuantizeAct16(x + b0 * 32, out + b0);
#endif
  x += b0 * 32;
  out += b0;
  n -= b0 * 32;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 qmax = _mm256_set1_ps(127.0f), qmin = _mm256_set1_ps(-127.0f);
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    __m256 v[4];
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(xb + 8 * i);
    const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                   _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    const float amax = HmaxPs(m);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m256 idv = _mm256_set1_ps(id);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) {
      __m256 r = _mm256_round_ps(_mm256_mul_ps(v[i], idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      r = _mm256_min_ps(_mm256_max_ps(r, qmin), qmax);
      q[i] = _mm256_cvtps_epi32(r);
    }
    const int32_t sum = HsumEpi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].qs), _mm256_permutevar8x32_epi32(p, perm));
    out[b].d = d;
    out[b].s = d * static_cast<float>(sum);
  }
}

// ---------------------------------------------------------------- quantized MatMul

// f16 -> f32 of the low or high half of each 32-bit lane.
inline __m256 HalvesToF32(__m256i halves_in_u32) {  // each lane holds a half in its low 16 bits
  const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(halves_in_u32, halves_in_u32), 0x08);
  return _mm256_cvtph_ps(_mm256_castsi256_si128(p));
}
inline __m256 LowHalves(__m256i w) { return HalvesToF32(_mm256_and_si256(w, _mm256_set1_epi32(0xFFFF))); }
inline __m256 HighHalves(__m256i w) { return HalvesToF32(_mm256_srli_epi32(w, 16)); }

// Every quantized type takes the same layout: 8 weight rows share every vector, one per
// 32-bit lane. A group of 8 rows is decoded once per block into vectors
//   v[j]: [8 rows][4 codes]  = codes 4j .. 4j+3 of each row,
// and a token's block is then 8 x (broadcast 4 activation bytes, maddubs), summed
// exactly in integers, and one convert: the per-block work on floats is shared by the
// 8 rows instead of paid per row.
//
// Every (row, token) sees the same sequence, whatever T, the tile or the row group:
//   acc = 0; for b: acc = fma(float(isum_b), dw_b * da_b, acc); [mins: acc = fma(mw_b, s_b, acc)]
// with isum_b the exact integer dot (Q4_0: sum(q * a) - 8 * sum(a); Q6_K: with its int8
// scales per 16 values), dw_b the block's scale and mw_b its min (Q4_1, Q4_K).

// p: 8 rows' 16-byte slices -> d[j]: dword j of the rows [0 1 2 3 | 4 5 6 7].
inline void Transpose8x16(const uint8_t* const (&p)[8], __m256i (&d)[4]) {
  __m256i x[4];
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {  // x[r] = [row r | row r + 4], 4 dwords each
    x[r] = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(p[r + 4]),
                               reinterpret_cast<const __m128i*>(p[r]));
  }
  const __m256i t0 = _mm256_unpacklo_epi32(x[0], x[1]), t1 = _mm256_unpackhi_epi32(x[0], x[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(x[2], x[3]), t3 = _mm256_unpackhi_epi32(x[2], x[3]);
  d[0] = _mm256_unpacklo_epi64(t0, t2);
  d[1] = _mm256_unpackhi_epi64(t0, t2);
  d[2] = _mm256_unpacklo_epi64(t1, t3);
  d[3] = _mm256_unpackhi_epi64(t1, t3);
}

// The 32-bit word at each of the 8 addresses.
inline __m256i LoadWords8(const uint8_t* const (&p)[8]) {
  int32_t v[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) std::memcpy(&v[i], p[i], 4);
  return _mm256_setr_epi32(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
}

inline int32_t Word4(const ActBlockQ8& a, int j) {  // activation bytes 4j .. 4j+3
  int32_t word;
  std::memcpy(&word, a.qs + 4 * j, 4);
  return word;
}

// Vector shapes of the quantized MatMul. Y8: 8 rows, one per 32-bit lane of a 256-bit
// vector (every backend). Z16: 16 rows per 512-bit vector (the VNNI backends, for T > 1).
// Each (row, token) runs the same lane operations in both, so they give the same bits.
struct Y8 {
  using I = __m256i;
  using F = __m256;
  static constexpr int kRows = 8;
  static I Zero() { return _mm256_setzero_si256(); }
  static I Set1(int32_t x) { return _mm256_set1_epi32(x); }
  static F ZeroF() { return _mm256_setzero_ps(); }
  static F Set1F(float x) { return _mm256_set1_ps(x); }
  static F LoadF(const float* p) { return _mm256_load_ps(p); }  // 32-byte aligned
  static void StoreF(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F Cvt(I v) { return _mm256_cvtepi32_ps(v); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static I Add32(I a, I b) { return _mm256_add_epi32(a, b); }
  static I Sub32(I a, I b) { return _mm256_sub_epi32(a, b); }
  static I Madd(I a, I b) { return _mm256_madd_epi16(a, b); }
  static I MaddUbs(I u, I v) { return _mm256_maddubs_epi16(u, v); }
  static I Shl5(I a) { return _mm256_slli_epi32(a, 5); }
  static I And(I a, I b) { return _mm256_and_si256(a, b); }
  static I Xor(I a, I b) { return _mm256_xor_si256(a, b); }
  static I Abs8(I a) { return _mm256_abs_epi8(a); }
  static I Shr4x16(I a) { return _mm256_srli_epi16(a, 4); }
  // Packed weights (kPackRows = 16 rows a vector there): half h, rows 8h .. 8h + 7, of the
  // 16 lanes at p (64-byte aligned), as codes and as f16 values.
  static I LoadPacked(const uint8_t* p, int h) {
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32 * h));
  }
  static F LoadPackedHalves(const uint8_t* p, int h) {
    return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
  }
  // s + the sum of the 4 byte products u * v in each 32-bit lane (u unsigned, v signed),
  // exact in int32.
#if SPECD_X8_Z16
  static I Dp(I s, I u, I v) { return simde_mm256_dpbusd_epi32(s, u, v); }
#elif SPECD_X8_DOT == 3
  static I Dp(I s, I u, I v) { return _mm256_dpbusd_avx_epi32(s, u, v); }
#elif SPECD_X8_DOT == 4
  // Even and odd bytes widened to int16 (u by zero, v by sign), then madd's exact int32 pair
  // sums: each product is at most 255 * 128, so nothing saturates (maddubs could).
  static I Dp(I s, I u, I v) {
    const I u_even = _mm256_and_si256(u, _mm256_set1_epi16(0x00FF));
    const I u_odd = _mm256_srli_epi16(u, 8);
    const I v_even = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8);
    const I v_odd = _mm256_srai_epi16(v, 8);
    const I even = _mm256_madd_epi16(u_even, v_even), odd = _mm256_madd_epi16(u_odd, v_odd);
    return _mm256_add_epi32(s, _mm256_add_epi32(even, odd));
  }
#endif
  // Keeps a sum's steps in this order: reassociated into trees, they spill to the stack.
  static void Pin(I& s) { __asm__("" : "+x"(s)); }
};

#if SPECD_X8_Z16
struct Z16 {
  using I = simde__m512i;
  using F = simde__m512;
  static constexpr int kRows = 16;
  static I Zero() { return simde_mm512_setzero_si512(); }
  static I Set1(int32_t x) { return simde_mm512_set1_epi32(x); }
  static F ZeroF() { return simde_mm512_setzero_ps(); }
  static F Set1F(float x) { return simde_mm512_set1_ps(x); }
  static F LoadF(const float* p) { return simde_mm512_load_ps(p); }  // 64-byte aligned
  static void StoreF(float* p, F v) { simde_mm512_storeu_ps(p, v); }
#if SPECD_X8_DOT == 1
  static F Cvt(I v) { return _mm512_cvtepi32_ps(v); }
#else
  static F Cvt(I v) {  // SIMDe 0.7 has no cvtepi32_ps for 512 bits: two AVX2 halves
    alignas(64) int32_t i[16];
    alignas(64) float f[16];
    simde_mm512_store_si512(i, v);
    _mm256_store_ps(f, _mm256_cvtepi32_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(i))));
    _mm256_store_ps(f + 8, _mm256_cvtepi32_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(i + 8))));
    return simde_mm512_load_ps(f);
  }
#endif
  static F Mul(F a, F b) { return simde_mm512_mul_ps(a, b); }
  static F Fma(F a, F b, F c) { return simde_mm512_fmadd_ps(a, b, c); }
  static I Add32(I a, I b) { return simde_mm512_add_epi32(a, b); }
  static I Sub32(I a, I b) { return simde_mm512_sub_epi32(a, b); }
  static I Madd(I a, I b) { return simde_mm512_madd_epi16(a, b); }
  static I MaddUbs(I u, I v) { return simde_mm512_maddubs_epi16(u, v); }
  static I Shl5(I a) { return simde_mm512_slli_epi32(a, 5); }
  static I And(I a, I b) { return simde_mm512_and_si512(a, b); }
  static I Xor(I a, I b) { return simde_mm512_xor_si512(a, b); }
  static I Shr4x16(I a) { return simde_mm512_srli_epi16(a, 4); }
  static I LoadPacked(const uint8_t* p, int) { return simde_mm512_load_si512(p); }
#if SPECD_X8_DOT == 1
  static F LoadPackedHalves(const uint8_t* p, int) {
    return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
  }
#else
  static F LoadPackedHalves(const uint8_t* p, int) {  // no 512-bit cvtph in SIMDe 0.7
    alignas(64) float f[16];
    _mm256_store_ps(f, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p))));
    _mm256_store_ps(f + 8, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p + 16))));
    return simde_mm512_load_ps(f);
  }
#endif
  static I Dp(I s, I u, I v) { return simde_mm512_dpbusd_epi32(s, u, v); }
#if SPECD_X8_DOT == 1
  static void Pin(I& s) { __asm__("" : "+v"(s)); }
#else
  static void Pin(I&) {}  // emulated: a struct of two halves, nothing to pin
#endif
};
#endif

inline __m256i Bcast4(const ActBlockQ8& a, int j) { return _mm256_set1_epi32(Word4(a, j)); }

#if SPECD_X8_DOT
// The VNNI step of the formats whose codes go to vpdpbusd as they are (unsigned): adds code
// vector j's products with activation bytes 4j .. 4j+3 to the int32 sums s.
template <class X>
inline typename X::I DpStep(const typename X::I* v, const ActBlockQ8& a, typename X::I s, int j) {
#if SPECD_X8_DOT == 1
  if constexpr (X::kRows == 16) {
    // The activation word as vpdpbusd's own {1to16} memory operand: one fused instruction
    // instead of a broadcast and a vpdpbusd, which GCC 12 does not fold. The same sums;
    // prefill at 512 tokens read +3.5-4.7 % (docs/PERFORMANCE.md, 2026-12-07).
    using Word = int32_t __attribute__((may_alias));  // read through the int8 codes' storage
    typename X::I acc = j == 0 ? X::Zero() : s;
    __asm__("vpdpbusd %2%{1to16%}, %1, %0"
            : "+v"(acc)
            : "v"(v[j]), "m"(*reinterpret_cast<const Word*>(a.qs + 4 * j)));
    return acc;
  }
#endif
  return X::Dp(j == 0 ? X::Zero() : s, v[j], X::Set1(Word4(a, j)));
}
#endif

// Formats. Decode() turns 32-value block b of 8 rows (rp: the rows) into kVecs vectors
// and the rows' scales (and mins); kBlockBytes is a block's share of a row's bytes (for
// prefetching); State carries what a format decodes once for several blocks. Step() adds
// code vector j's products with one token's activations to that token's integer sum s;
// Reduce() makes s the exact int32 block dot of each row, with ActSum(a) (kAsum) for the
// formats whose codes carry an offset.

// Q4_1: blocks of 20 bytes (f16 d, f16 m, 16 bytes of codes), value = d * code + m.
// Q4_0: 18 bytes (f16 d, 16 bytes of codes), value = d * (code - 8): the codes stay
// unsigned and the - 8 is applied to the sum (kAsum).
template <int kBytes, int kHead, bool kHasMin>
struct X8Q4 {
  struct State {};
  static constexpr int kVecs = 8, kBlockBytes = kBytes;
  static constexpr bool kMin = kHasMin, kAsum = !kHasMin;
  static inline void Decode(const uint8_t* const (&rp)[8], int64_t b, __m256i* v, __m256& dw,
                            __m256& mw, State&) {
    const uint8_t* hd[8];
    const uint8_t* qs[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      hd[i] = rp[i] + b * kBytes;
      qs[i] = hd[i] + kHead;
    }
    // 16 bytes of nibbles per row: low nibbles are codes 0..15, high ones 16..31.
    __m256i d[4];
    Transpose8x16(qs, d);
    const __m256i m = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_and_si256(d[j], m);
      v[j + 4] = _mm256_and_si256(_mm256_srli_epi16(d[j], 4), m);
    }
    const __m256i words = LoadWords8(hd);
    dw = LowHalves(words);
    mw = kMin ? HighHalves(words) : dw;
  }
#if SPECD_X8_DOT
  template <class X>
  static inline typename X::I Step(const typename X::I* v, const ActBlockQ8& a, typename X::I s, int j) {
    return DpStep<X>(v, a, s, j);
  }
#else
  // int16 sums: |sum| <= 8 * 2 * 15 * 127 = 30480.
  template <class X>
  static inline __m256i Step(const __m256i* v, const ActBlockQ8& a, __m256i s, int j) {
    const __m256i p = _mm256_maddubs_epi16(v[j], Bcast4(a, j));
    return j == 0 ? p : _mm256_add_epi16(s, p);
  }
#endif
  // A packed block (isa_kernels.h) holds the code words Decode transposes; UnpackWord splits
  // word w into its nibbles: code vector w (codes 4w.. in the low nibbles) and w + 4 (16 + 4w..
  // in the high ones), the two steps StepOf(w, 0 | 1).
  static constexpr int kWords = 4, kStepsPerWord = 2;
  static constexpr int StepOf(int w, int i) { return w + 4 * i; }
  template <class X>
  static inline void UnpackWord(const uint8_t* blk, int h, int w, typename X::I* v) {
    const typename X::I nibble = X::Set1(0x0F0F0F0F);
    const typename X::I c = X::LoadPacked(blk + 64 * w, h);
    v[w] = X::And(c, nibble);
    v[w + 4] = X::And(X::Shr4x16(c), nibble);
  }
  // kAsum: asum = 8 * sum(a) of the token's block, for the - 8.
  static inline int32_t ActSum(const ActBlockQ8& a) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs));
    return 8 * HsumEpi32(_mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v), _mm256_set1_epi16(1)));
  }
#if SPECD_X8_DOT
  template <class X>
  static inline typename X::I Reduce(typename X::I s, const typename X::I*, int32_t asum) {
    return kAsum ? X::Sub32(s, X::Set1(asum)) : s;
  }
#else
  template <class X>
  static inline __m256i Reduce(__m256i s, const __m256i*, int32_t asum) {
    const __m256i s32 = _mm256_madd_epi16(s, _mm256_set1_epi16(1));
    return kAsum ? _mm256_sub_epi32(s32, _mm256_set1_epi32(asum)) : s32;
  }
#endif
};
using X8Q4_1 = X8Q4<20, 4, true>;
using X8Q4_0 = X8Q4<18, 2, false>;

// Q4_K: 256-value super-blocks of 144 bytes (f16 d, f16 dmin, 12 bytes of 6-bit scales
// and mins for the 8 sub-blocks, 128 bytes of codes); sub-block j's value is
// d * sc[j] * code - dmin * mn[j], and its 32 codes are the low (j even) or high (j odd)
// nibbles of bytes 32 * (j / 2) .. + 31. The scales of a super-block are unpacked once,
// for its first sub-block, into State.
struct X8Q4_K : X8Q4_1 {
  static constexpr int kBlockBytes = 144 / 8;
  struct State {
    __m256i sm[4];  // bytes of [rows]: sc 0-3, sc 4-7, mn 0-3, mn 4-7
    __m256 d, dmin;
    __m256i dl[4], dh[4];  // the transposed code bytes a sub-block pair shares
  };
  // s: a row's 12 scale bytes -> out: sc[0..7], mn[0..7] (6 bits each), per byte.
  static inline void UnpackScales(const uint8_t* s, uint8_t* out) {
    uint32_t a, b, c;
    std::memcpy(&a, s, 4);
    std::memcpy(&b, s + 4, 4);
    std::memcpy(&c, s + 8, 4);
    const uint32_t w[4] = {a & 0x3F3F3F3Fu, (c & 0x0F0F0F0Fu) | ((a >> 2) & 0x30303030u),
                           b & 0x3F3F3F3Fu, ((c >> 4) & 0x0F0F0F0Fu) | ((b >> 2) & 0x30303030u)};
    std::memcpy(out, w, 16);
  }
  static inline void Decode(const uint8_t* const (&rp)[8], int64_t b, __m256i* v, __m256& dw,
                            __m256& mw, State& st) {
    const int j = static_cast<int>(b & 7);
    const uint8_t* blk[8];
    const uint8_t* lo[8];
    const uint8_t* hi[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      blk[i] = rp[i] + (b >> 3) * 144;
      lo[i] = blk[i] + 16 + 32 * (j >> 1);
      hi[i] = lo[i] + 16;
    }
    if (j == 0) {
      uint8_t unpacked[8][16];
      const uint8_t* up[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        UnpackScales(blk[i] + 4, unpacked[i]);
        up[i] = unpacked[i];
      }
      Transpose8x16(up, st.sm);
      const __m256i words = LoadWords8(blk);
      st.d = LowHalves(words);
      st.dmin = HighHalves(words);
    }
    const __m128i byte = _mm_cvtsi32_si128(8 * (j & 3));
    const __m256i ff = _mm256_set1_epi32(0xFF);
    const __m256i sc = _mm256_and_si256(_mm256_srl_epi32(st.sm[j >> 2], byte), ff);
    const __m256i mn = _mm256_and_si256(_mm256_srl_epi32(st.sm[2 + (j >> 2)], byte), ff);
    dw = _mm256_mul_ps(st.d, _mm256_cvtepi32_ps(sc));
    mw = _mm256_mul_ps(_mm256_sub_ps(_mm256_setzero_ps(), st.dmin), _mm256_cvtepi32_ps(mn));
    if ((j & 1) == 0) {
      Transpose8x16(lo, st.dl);
      Transpose8x16(hi, st.dh);
    }
    const __m256i* dl = st.dl;
    const __m256i* dh = st.dh;
    const __m128i shift = _mm_cvtsi32_si128(4 * (j & 1));
    const __m256i mask = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_and_si256(_mm256_srl_epi16(dl[k], shift), mask);
      v[k + 4] = _mm256_and_si256(_mm256_srl_epi16(dh[k], shift), mask);
    }
  }
};

// Q8_0: 34-byte blocks (f16 d, 32 int8 codes). AVX2: v[j] = |codes|, v[8 + j] = the codes
// (for their signs), int32 sums. VNNI: v[j] = codes + 128 (unsigned, as vpdpbusd wants
// one operand), and the 128 * sum(a) that adds is taken off the sum (kAsum).
struct X8Q8_0 {
  struct State {};
  static constexpr int kVecs = kVnni ? 8 : 16, kBlockBytes = 34;
  static constexpr bool kMin = false, kAsum = kVnni;
  static inline void Decode(const uint8_t* const (&rp)[8], int64_t b, __m256i* v, __m256& dw,
                            __m256& mw, State&) {
    const uint8_t* hd[8];
    const uint8_t* lo[8];
    const uint8_t* hi[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      hd[i] = rp[i] + b * kBlockBytes;
      lo[i] = hd[i] + 2;
      hi[i] = hd[i] + 18;
    }
    __m256i* codes = v + kVecs - 8;
    Transpose8x16(lo, *reinterpret_cast<__m256i(*)[4]>(codes));
    Transpose8x16(hi, *reinterpret_cast<__m256i(*)[4]>(codes + 4));
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      v[j] = kVnni ? _mm256_xor_si256(codes[j], _mm256_set1_epi8(static_cast<char>(0x80)))
                   : _mm256_abs_epi8(codes[j]);
    }
    dw = mw = LowHalves(LoadWords8(hd));
  }
  // A packed block: the code words Decode transposes; UnpackWord makes word w (code vector w,
  // step w) unsigned (VNNI) or splits it into magnitudes and signs (AVX2) as Decode does.
  static constexpr int kWords = 8, kStepsPerWord = 1;
  static constexpr int StepOf(int w, int) { return w; }
  template <class X>
  static inline void UnpackWord(const uint8_t* blk, int h, int w, typename X::I* v) {
    const typename X::I c = X::LoadPacked(blk + 64 * w, h);
    if constexpr (kVnni) {
      v[w] = X::Xor(c, X::Set1(static_cast<int32_t>(0x80808080u)));
    } else {
      v[w] = X::Abs8(c);
      v[8 + w] = c;
    }
  }
#if SPECD_X8_DOT
  template <class X>
  static inline typename X::I Step(const typename X::I* v, const ActBlockQ8& a, typename X::I s, int j) {
    return DpStep<X>(v, a, s, j);
  }
  // asum = 128 * sum(a): |asum| <= 128 * 32 * 127.
  static inline int32_t ActSum(const ActBlockQ8& a) {
    int32_t sum = 0;
    for (int i = 0; i < 32; ++i) sum += a.qs[i];
    return 128 * sum;
  }
  template <class X>
  static inline typename X::I Reduce(typename X::I s, const typename X::I*, int32_t asum) {
    return X::Sub32(s, X::Set1(asum));
  }
#else
  // |code| * (a with the code's sign): pairs <= 2 * 128 * 127 = 32512, so each
  // product vector goes to int32 before it is added.
  template <class X>
  static inline __m256i Step(const __m256i* v, const ActBlockQ8& a, __m256i s, int j) {
    const __m256i as = _mm256_sign_epi8(Bcast4(a, j), v[8 + j]);
    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(v[j], as), _mm256_set1_epi16(1));
    return j == 0 ? p : _mm256_add_epi32(s, p);
  }
  static inline int32_t ActSum(const ActBlockQ8&) { return 0; }
  template <class X>
  static inline __m256i Reduce(__m256i s, const __m256i*, int32_t) { return s; }
#endif
};

// Q6_K: 256-value super-blocks of 210 bytes (128 bytes of low nibbles, 64 of high bit
// pairs, 16 int8 scales, one per 16 values, f16 d); value = d * sc * (code - 32). A
// 32-value block's codes come from 32 low-nibble bytes (low or high nibbles) and 32
// high-pair bytes (bits 2 * quarter). v[j]: the codes (0..63, unsigned: the - 32 is applied
// to the sum), v[8 + g]: the rows' scale of 16-value group g in both int16 halves of each
// lane, v[10]: the two groups' scales as an int16 pair. The VNNI backends keep this step:
// the per-16 scales ride on the madd that widens maddubs' pairs, and a vpdpbusd step
// would need the same madd after it (one op per step either way).
struct X8Q6_K {
  struct State {  // transposed code bytes, shared: ql by quarters q and q + 2, qh by a half
    __m256i ql[2][8];
    __m256i qh[8];
  };
  static constexpr int kVecs = 11, kBlockBytes = 210 / 8;  // prefetch share, rounded down
  static constexpr bool kMin = false, kAsum = true;
  static inline void Decode(const uint8_t* const (&rp)[8], int64_t b, __m256i* v, __m256& dw,
                            __m256& mw, State& st) {
    const int j = static_cast<int>(b & 7), half = j >> 2, quarter = j & 3;
    const uint8_t* blk[8];
    const uint8_t* ql[2][8];
    const uint8_t* qh[2][8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      blk[i] = rp[i] + (b >> 3) * 210;
      ql[0][i] = blk[i] + 64 * half + 32 * (quarter & 1);
      ql[1][i] = ql[0][i] + 16;
      qh[0][i] = blk[i] + 128 + 32 * half;
      qh[1][i] = qh[0][i] + 16;
    }
    __m256i* lo = st.ql[quarter & 1];
    __m256i* hi = st.qh;
    if (quarter < 2) {
      Transpose8x16(ql[0], *reinterpret_cast<__m256i(*)[4]>(lo));
      Transpose8x16(ql[1], *reinterpret_cast<__m256i(*)[4]>(lo + 4));
    }
    if (quarter == 0) {
      Transpose8x16(qh[0], *reinterpret_cast<__m256i(*)[4]>(hi));
      Transpose8x16(qh[1], *reinterpret_cast<__m256i(*)[4]>(hi + 4));
    }
    const __m128i lshift = _mm_cvtsi32_si128(4 * (quarter >> 1));
    const __m128i hshift = _mm_cvtsi32_si128(2 * quarter);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m256i l = _mm256_and_si256(_mm256_srl_epi16(lo[k], lshift), _mm256_set1_epi8(0x0F));
      const __m256i h = _mm256_and_si256(_mm256_srl_epi16(hi[k], hshift), _mm256_set1_epi8(3));
      v[k] = _mm256_or_si256(l, _mm256_slli_epi16(h, 4));
    }
    const uint8_t* sp[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) sp[i] = blk[i] + 192 + 2 * j;
    const __m256i w = LoadWords8(sp);  // bytes 0, 1: the two groups' int8 scales
    const __m256i low16 = _mm256_set1_epi32(0xFFFF);
    __m256i sc[2];
#pragma GCC unroll 2
    for (int g = 0; g < 2; ++g) {
      sc[g] = _mm256_srai_epi32(_mm256_slli_epi32(w, 24 - 8 * g), 24);
      v[8 + g] = _mm256_or_si256(_mm256_and_si256(sc[g], low16), _mm256_slli_epi32(sc[g], 16));
    }
    v[10] = _mm256_or_si256(_mm256_and_si256(sc[0], low16), _mm256_slli_epi32(sc[1], 16));
    const uint8_t* dp[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) dp[i] = blk[i] + 206;
    dw = mw = HighHalves(LoadWords8(dp));  // d: the last 2 bytes of the block
  }
  // code * a: pairs <= 2 * 63 * 127 = 16002; madd applies the group's scale (|sc| <= 128)
  // and widens to int32.
  template <class X>
  static inline typename X::I Step(const typename X::I* v, const ActBlockQ8& a, typename X::I s, int j) {
    const typename X::I p = X::Madd(X::MaddUbs(v[j], X::Set1(Word4(a, j))), v[8 + (j >> 2)]);
    return j == 0 ? p : X::Add32(s, p);
  }
  // asum: the block's two 16-value activation sums as an int16 pair (|sum| <= 2032).
  static inline int32_t ActSum(const ActBlockQ8& a) {
    int32_t lo = 0, hi = 0;
    for (int i = 0; i < 16; ++i) {
      lo += a.qs[i];
      hi += a.qs[16 + i];
    }
    return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(lo)) |
                                (static_cast<uint32_t>(static_cast<uint16_t>(hi)) << 16));
  }
  // - 32 * (sc0 * sum(a[0..15]) + sc1 * sum(a[16..31])), one madd.
  template <class X>
  static inline typename X::I Reduce(typename X::I s, const typename X::I* v, int32_t asum) {
    return X::Sub32(s, X::Shl5(X::Madd(v[10], X::Set1(asum))));
  }
};

// One token's block for a row group: Step over the 8 code vectors, then the float
// update of acc (lanes = rows). Every path (T = 1, tiles of 1-8 tokens, 8- or 16-row
// groups) runs these, so each lane sees the same operations.
template <class F, class X>
inline typename X::I XStep(const typename X::I* v, const ActBlockQ8& a, typename X::I s, int j) {
  s = F::template Step<X>(v, a, s, j);
  X::Pin(s);
  return s;
}
template <class F, class X>
inline typename X::F XFinish(typename X::I s, const typename X::I* v, typename X::F dw, typename X::F mw, float da,
                             float sa, int32_t asum, typename X::F acc) {
  const typename X::I s32 = F::template Reduce<X>(s, v, asum);
  acc = X::Fma(X::Cvt(s32), X::Mul(dw, X::Set1F(da)), acc);
  if constexpr (F::kMin) acc = X::Fma(mw, X::Set1F(sa), acc);
  return acc;
}

// R tokens x X::kRows rows. q: [nb][kVecs] vectors of the group; dm: [nb][2][kRows]
// scales, mins.
template <class F, class X, int R>
inline void TileX(const typename X::I* q, const float* dm, int64_t nb, const ActBlockQ8* a,
                  const int32_t* asum8, typename X::F (&acc)[R]) {
  using I = typename X::I;
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = X::ZeroF();
  for (int64_t b = 0; b < nb; ++b) {
    I s[R];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) s[r] = XStep<F, X>(q + b * F::kVecs, a[r * nb + b], s[r], j);
    }
    const typename X::F dw = X::LoadF(dm + b * 2 * X::kRows);
    const typename X::F mw = F::kMin ? X::LoadF(dm + b * 2 * X::kRows + X::kRows) : dw;
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const ActBlockQ8& ab = a[r * nb + b];
      const int32_t asum = F::kAsum ? asum8[r * nb + b] : 0;
      acc[r] = XFinish<F, X>(s[r], q + b * F::kVecs, dw, mw, ab.d, ab.s, asum, acc[r]);
    }
  }
}

template <class X>
inline void StoreRows(float* y, typename X::F v, int64_t rows) {
  if (rows == X::kRows) {
    X::StoreF(y, v);
  } else {
    float tmp[X::kRows];
    X::StoreF(tmp, v);
    for (int64_t i = 0; i < rows; ++i) y[i] = tmp[i];
  }
}

// How far ahead, in packed blocks, a step of 2..kFarPrefetchMaxTokens tokens requests its
// weights into L2 (MatMulPackedX says why); 0 turns it off.
inline constexpr int64_t kFarPrefetchBlocks = 512;
inline constexpr int64_t kFarPrefetchMaxTokens = 9;

// R tokens x X::kRows rows of packed weights: gp, a 16-row group's blocks in layout lay, of
// which half h when X is Y8 (see isa_kernels.h). Unpacking a block is a load and one or two
// ops per code vector (F::Unpack), the scales a convert; then each (row, token) runs XStep /
// XFinish as TileX does, so the results are TileX's bitwise. far: 0, or how many bytes ahead
// to request the stream into L2 as well.
template <class F, class X, int R>
inline void PackedTileX(const uint8_t* gp, int h, const PackLayout& lay, int64_t far, int64_t nb,
                        const ActBlockQ8* a, const int32_t* asum8, typename X::F (&acc)[R]) {
  using I = typename X::I;
  // A decode step streams the groups: prefetch a dozen blocks (~4-7 KB) ahead, into the next
  // group past the last block (groups are contiguous).
  const int64_t ahead = 12 * lay.block_bytes;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = X::ZeroF();
  // A packed block: its code words, then the scales (and mins), one line each (PackLayoutOf).
  constexpr int kLines = F::kWords + 1;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = gp + b * lay.block_bytes;
    if (h == 0) {
#pragma GCC unroll 16
      for (int l = 0; l < kLines; ++l) {
        _mm_prefetch(reinterpret_cast<const char*>(blk + ahead + 64 * l), _MM_HINT_T0);
      }
      if (far > 0) {
#pragma GCC unroll 16
        for (int l = 0; l < kLines; ++l) PrefetchLine<true>(blk + far + 64 * l);
      }
    }
    // Word by word: a word's code vectors are used by every token as soon as they are
    // unpacked, so only they and the R sums need registers (AVX2 holds 8 tokens a pass this
    // way). The steps go in another order than TileX's, but their integer sums are exact.
    I v[F::kVecs];
    I s[R];
#pragma GCC unroll 8
    for (int w = 0; w < F::kWords; ++w) {
      F::template UnpackWord<X>(blk, h, w, v);
#pragma GCC unroll 2
      for (int i = 0; i < F::kStepsPerWord; ++i) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) s[r] = XStep<F, X>(v, a[r * nb + b], s[r], F::StepOf(w, i));
      }
    }
    const typename X::F dw = X::LoadPackedHalves(blk + lay.scales_at, h);
    const typename X::F mw = F::kMin ? X::LoadPackedHalves(blk + lay.mins_at, h) : dw;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const ActBlockQ8& ab = a[r * nb + b];
      acc[r] = XFinish<F, X>(s[r], v, dw, mw, ab.d, ab.s, F::kAsum ? asum8[r * nb + b] : 0, acc[r]);
    }
  }
}

// Where a tile's weights come from: a group decoded into scratch (q, dm: see TileX), or
// packed at load (gp, h: see PackedTileX).
template <class X>
struct DecodedRows {
  const typename X::I* q;
  const float* dm;
  template <class F, int R>
  void Tile(int64_t nb, const ActBlockQ8* a, const int32_t* asum8, typename X::F (&acc)[R]) const {
    TileX<F, X, R>(q, dm, nb, a, asum8, acc);
  }
};
template <class X>
struct PackedRows {
  const uint8_t* gp;
  int h;
  PackLayout lay;
  int64_t far;
  template <class F, int R>
  void Tile(int64_t nb, const ActBlockQ8* a, const int32_t* asum8, typename X::F (&acc)[R]) const {
    PackedTileX<F, X, R>(gp, h, lay, far, nb, a, asum8, acc);
  }
};

template <class F, class X, int R, class Src>
inline void TokensX(const Src& src, int64_t nb, const ActBlockQ8* act, const int32_t* asum8,
                    int64_t t, int64_t ldy, int64_t rows, float* y) {
  typename X::F out[R];
  src.template Tile<F, R>(nb, act + t * nb, asum8 + t * nb, out);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) StoreRows<X>(y + (t + r) * ldy, out[r], rows);
}

// All T tokens in tiles of kMaxR, then one tile of the rest.
template <class F, class X, int kMaxR, class Src>
inline void AllTokensX(const Src& src, int64_t nb, const ActBlockQ8* act, const int32_t* asum8,
                       int64_t T, int64_t ldy, int64_t rows, float* y) {
  static_assert(kMaxR >= 1 && kMaxR <= 8);
  int64_t t = 0;
  for (; t + kMaxR <= T; t += kMaxR) TokensX<F, X, kMaxR>(src, nb, act, asum8, t, ldy, rows, y);
  switch (T - t) {
#define SPECD_TOKENS_CASE(n)                                                              \
  case n:                                                                                  \
    if constexpr (kMaxR > n) TokensX<F, X, n>(src, nb, act, asum8, t, ldy, rows, y); \
    break;
    SPECD_TOKENS_CASE(1)
    SPECD_TOKENS_CASE(2)
    SPECD_TOKENS_CASE(3)
    SPECD_TOKENS_CASE(4)
    SPECD_TOKENS_CASE(5)
    SPECD_TOKENS_CASE(6)
    SPECD_TOKENS_CASE(7)
#undef SPECD_TOKENS_CASE
    default: break;
  }
}

// Decodes block b of a group's rows (X::kRows / 8 runs of F::Decode) into q[b] and dm[b].
template <class F, class X>
inline void DecodeGroupBlock(const uint8_t* const (&rp)[16], int64_t b, typename X::I* q, float* dm,
                             typename F::State (&st)[2]) {
#pragma GCC unroll 2
  for (int h = 0; h < X::kRows / 8; ++h) {
    const uint8_t* r8[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) r8[i] = rp[8 * h + i];
    __m256i v[F::kVecs];
    __m256 dw, mw;
    F::Decode(r8, b, v, dw, mw, st[h]);
    // Half h of each vector: lanes 8h .. 8h + 7 are rows 8h .. 8h + 7.
    __m256i* qh = reinterpret_cast<__m256i*>(q + b * F::kVecs) + h;
#pragma GCC unroll 16
    for (int k = 0; k < F::kVecs; ++k) _mm256_store_si256(qh + k * (X::kRows / 8), v[k]);
    _mm256_store_ps(dm + b * 2 * X::kRows + 8 * h, dw);
    _mm256_store_ps(dm + b * 2 * X::kRows + X::kRows + 8 * h, mw);
  }
}

// Rows [g, min(g + X::kRows, n1)) for all T tokens. scratch: 64-byte aligned, room for
// [nb][kVecs] X::I and [nb][2][kRows] floats.
template <class F, class X>
inline void MatMulGroup(const WeightMatrix& w, const ActBlockQ8* act, const int32_t* asum8,
                        int64_t T, int64_t g, int64_t n1, float* y, void* scratch) {
  const int64_t nb = w.cols / 32;
  const uint64_t rb = w.row_bytes;
  const int64_t rows = n1 - g < X::kRows ? n1 - g : X::kRows;
  typename X::I* q = static_cast<typename X::I*>(scratch);
  float* dm = reinterpret_cast<float*>(q + nb * F::kVecs);
  const uint8_t* rp[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) rp[i] = w.data + (g + (i < rows ? i : rows - 1)) * rb;
  // Prefetch the group two ahead, a group's share of 8 blocks per block of this one: a
  // decode step is bandwidth-bound and the scale loads overlap misses poorly. Past n1
  // too: another thread's next range of this matrix usually starts there. (Rows are
  // exactly nb blocks long.)
  const int64_t span = g + 3 * X::kRows <= w.rows ? X::kRows * F::kBlockBytes : 0;
  const char* pf = reinterpret_cast<const char*>(w.data + (g + 2 * X::kRows) * rb);
  typename F::State st[2] = {};
  if constexpr (X::kRows == 8) {
    if (T == 1) {  // decoded and used block by block, in registers
      const uint8_t* const(&r8)[8] = *reinterpret_cast<const uint8_t* const(*)[8]>(rp);
      __m256 acc = _mm256_setzero_ps();
      for (int64_t b = 0; b < nb; ++b) {
        for (int64_t off = (b * span) & ~int64_t{63}; off < (b + 1) * span; off += 64) {
          _mm_prefetch(pf + off, _MM_HINT_T0);
        }
        __m256i v[F::kVecs];
        __m256 dw, mw;
        F::Decode(r8, b, v, dw, mw, st[0]);
        __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) s = XStep<F, Y8>(v, act[b], s, j);
        acc = XFinish<F, Y8>(s, v, dw, mw, act[b].d, act[b].s, F::kAsum ? asum8[b] : 0, acc);
      }
      StoreRows<Y8>(y + g, acc, rows);
      return;
    }
  }
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t off = (b * span) & ~int64_t{63}; off < (b + 1) * span; off += 64) {
      _mm_prefetch(pf + off, _MM_HINT_T0);
    }
    DecodeGroupBlock<F, X>(rp, b, q, dm, st);
  }
  AllTokensX<F, X, 4>(DecodedRows<X>{q, dm}, nb, act, asum8, T, w.rows, rows, y + g);
}

template <class F>
void MatMulX8(const WeightMatrix& w, const ActBlockQ8* act, int64_t T, int64_t n0, int64_t n1,
              float* y, float* scratch) {
  const int64_t nb = w.cols / 32;
  const uint64_t rb = w.row_bytes;
  // scratch: [T][nb] F::ActSum (kAsum), then (64-byte aligned) a group's decoded blocks.
  int32_t* asum8 = reinterpret_cast<int32_t*>(scratch);
  if constexpr (F::kAsum) {
    for (int64_t i = 0; i < T * nb; ++i) asum8[i] = F::ActSum(act[i]);  // exact integer sums
  }
  void* group = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(asum8 + T * nb) + 63) & ~uintptr_t{63});
  {  // The first two groups: all their misses in flight at once, before the first use.
    const int64_t first = (n1 - n0 < 16 ? n1 - n0 : 16) * static_cast<int64_t>(rb);
    const char* p = reinterpret_cast<const char*>(w.data + n0 * rb);
    for (int64_t off = 0; off < first; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
  }
  for (int64_t g = n0; g < n1;) {
#if SPECD_X8_Z16
    if (T > 1 && n1 - g > 8) {  // 16 rows per 512-bit vector
      MatMulGroup<F, Z16>(w, act, asum8, T, g, n1, y, group);
      g += 16;
      continue;
    }
#endif
    MatMulGroup<F, Y8>(w, act, asum8, T, g, n1, y, group);
    g += 8;
  }
}

// Rows [n0, n1) (n0 a multiple of kPackRows) from w.packed: whole 16-row groups, read in
// file order. The AVX-512 VNNI backends take a group as one 512-bit vector per code vector,
// AVX2 and AVX-VNNI as two 8-row halves; all up to 8 tokens a pass (PackedTileX unpacks word
// by word).
template <class F>
void MatMulPackedX(const WeightMatrix& w, const ActBlockQ8* act, int64_t T, int64_t n0, int64_t n1,
                   float* y, float* scratch) {
  const int64_t nb = w.cols / 32;
  int32_t* asum8 = reinterpret_cast<int32_t*>(scratch);
  if constexpr (F::kAsum) {
    for (int64_t i = 0; i < T * nb; ++i) asum8[i] = F::ActSum(act[i]);  // exact integer sums
  }
#if SPECD_X8_Z16
  using X = Z16;
#else
  using X = Y8;
#endif
  constexpr int kMaxR = 8;
  const PackLayout lay = PackLayoutOf(w.type);
  // Steps of 2-9 tokens (a verification of up to 8 drafts, a small batch) also request the
  // stream ~512 blocks ahead (160-290 KB) into L2: their dot products take 1.5-6x a one-token
  // step's time per block, during which the near prefetch alone left the stream idle
  // (verify(5) / verify(1) 1.33 -> 1.21 at depth 32, docs/PERFORMANCE.md). One-token steps
  // keep the near prefetch only (with the far one they read ~8 % slower); longer steps are
  // arithmetic-bound whatever the stream does, so there it would only crowd L2.
  const bool far_stream = T >= 2 && T <= kFarPrefetchMaxTokens;
  const int64_t far = far_stream ? kFarPrefetchBlocks * lay.block_bytes : 0;
  for (int64_t g = n0; g < n1; g += kPackRows) {
    const uint8_t* gp = w.packed + (g / kPackRows) * nb * lay.block_bytes;
#pragma GCC unroll 2
    for (int h = 0; h < kPackRows / X::kRows; ++h) {
      const int64_t r0 = g + h * X::kRows;
      if (r0 >= n1) break;
      const int64_t rows = n1 - r0 < X::kRows ? n1 - r0 : X::kRows;
      AllTokensX<F, X, kMaxR>(PackedRows<X>{gp, h, lay, far}, nb, act, asum8, T, w.rows, rows,
                              y + r0);
    }
  }
}

void MatMulQ(const WeightMatrix& w, const ActBlockQ8* act, int64_t T, int64_t n0, int64_t n1,
             float* y, float* scratch) {
  switch (w.type) {
    case GgmlType::kQ8_0: MatMulX8<X8Q8_0>(w, act, T, n0, n1, y, scratch); return;
    case GgmlType::kQ4_0: MatMulX8<X8Q4_0>(w, act, T, n0, n1, y, scratch); return;
    case GgmlType::kQ4_1: MatMulX8<X8Q4_1>(w, act, T, n0, n1, y, scratch); return;
    case GgmlType::kQ4_K: MatMulX8<X8Q4_K>(w, act, T, n0, n1, y, scratch); return;
    case GgmlType::kQ6_K: MatMulX8<X8Q6_K>(w, act, T, n0, n1, y, scratch); return;
    default: return;  // ops.cc only routes supported types here
  }
}

void MatMulQPacked(const WeightMatrix& w, const ActBlockQ8* act, int64_t T, int64_t n0, int64_t n1,
                   float* y, float* scratch) {
#if !SPECD_X8_Z16
  // Unpacking again for every 8-token pass costs as much as one decode into scratch and its
  // 4-token passes by 64 tokens (kernel_cycles --isa avx2 --no-dram [--packed] -T 64, Q4_1,
  // 2026-12-07: 55.5 against 55.6 cycles per weight block; at T = 16 13.9 against 15.1). Long
  // prompts keep the decode.
  if (T > 16) {
    MatMulQ(w, act, T, n0, n1, y, scratch);
    return;
  }
#endif
  switch (w.type) {
    case GgmlType::kQ4_0: MatMulPackedX<X8Q4_0>(w, act, T, n0, n1, y, scratch); return;
    case GgmlType::kQ4_1: MatMulPackedX<X8Q4_1>(w, act, T, n0, n1, y, scratch); return;
    case GgmlType::kQ8_0: MatMulPackedX<X8Q8_0>(w, act, T, n0, n1, y, scratch); return;
    default: return;  // ops.cc packs only these types
  }
}


// ---------------------------------------------------------------- float MatMul

template <GgmlType kType>
inline __m256 LoadW8(const uint8_t* row, int64_t k) {
  if constexpr (kType == GgmlType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
  } else if constexpr (kType == GgmlType::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k)));
  } else {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
}

template <GgmlType kType>
inline float LoadW1(const uint8_t* row, int64_t k) {
  if constexpr (kType == GgmlType::kF32) {
    float f;
    std::memcpy(&f, row + 4 * k, 4);
    return f;
  } else if constexpr (kType == GgmlType::kF16) {
    return H2F(Ld16(row + 2 * k));
  } else {
    const uint32_t u = static_cast<uint32_t>(Ld16(row + 2 * k)) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
}

template <GgmlType kType, int R, int C>
inline void TileF(const uint8_t* w0, uint64_t rb, const float* x0, int64_t K, float* y0, int64_t ldy) {
  __m256 acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  const int64_t K8 = K & ~int64_t{7};
  for (int64_t k = 0; k < K8; k += 8) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const __m256 wv = LoadW8<kType>(w0 + c * rb, k);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x0 + r * K + k), acc[r][c]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      float s = HsumPs(acc[r][c]);
      for (int64_t k = K8; k < K; ++k) s += LoadW1<kType>(w0 + c * rb, k) * x0[r * K + k];
      y0[r * ldy + c] = s;
    }
}

template <GgmlType kType, int R, int C>
inline void RowsF(const WeightMatrix& w, const float* x, int64_t n0, int64_t n1, float* y) {
  int64_t n = n0;
  for (; n + C <= n1; n += C) TileF<kType, R, C>(w.data + n * w.row_bytes, w.row_bytes, x, w.cols, y + n, w.rows);
  for (; n < n1; ++n) TileF<kType, R, 1>(w.data + n * w.row_bytes, w.row_bytes, x, w.cols, y + n, w.rows);
}

template <GgmlType kType>
void MatMulFT(const WeightMatrix& w, const float* x, int64_t T, int64_t n0, int64_t n1, float* y) {
  const int64_t K = w.cols;
  constexpr int64_t kRowChunk = 8;
  // Software prefetch one chunk ahead (and the first chunk up front): the tiles read 2-4
  // rows at once, which the hardware prefetcher alone follows poorly. Into L1 unless the
  // activation tile (up to 5 rows of K floats) needs most of it.
  const bool to_l1 = T == 1 || 5 * K * 4 <= 16 * 1024;
  const auto prefetch_rows = [&](int64_t r0, int64_t r1) {
    const char* p = reinterpret_cast<const char*>(w.data + r0 * w.row_bytes);
    const int64_t bytes = (r1 - r0) * static_cast<int64_t>(w.row_bytes);
    if (to_l1) {
      for (int64_t off = 0; off < bytes; off += 64) PrefetchLine(p + off);
    } else {
      for (int64_t off = 0; off < bytes; off += 64) PrefetchLine<true>(p + off);
    }
  };
  prefetch_rows(n0, n0 + kRowChunk < n1 ? n0 + kRowChunk : n1);
  for (int64_t nc = n0; nc < n1; nc += kRowChunk) {
    const int64_t ne = nc + kRowChunk < n1 ? nc + kRowChunk : n1;
    if (ne < n1) prefetch_rows(ne, ne + kRowChunk < n1 ? ne + kRowChunk : n1);
    int64_t t = 0;
    // Tiles of 4 activation rows; a remainder of 5 (a k = 4 verification row) is one tile, so
    // each weight is converted once rather than again for a lone fifth row.
    for (; T - t >= 4 && T - t != 5; t += 4) RowsF<kType, 4, 2>(w, x + t * K, nc, ne, y + t * w.rows);
    switch (T - t) {
      case 5: RowsF<kType, 5, 2>(w, x + t * K, nc, ne, y + t * w.rows); break;
      case 3: RowsF<kType, 3, 2>(w, x + t * K, nc, ne, y + t * w.rows); break;
      case 2: RowsF<kType, 2, 2>(w, x + t * K, nc, ne, y + t * w.rows); break;
      case 1: RowsF<kType, 1, 4>(w, x + t * K, nc, ne, y + t * w.rows); break;
      default: break;
    }
  }
}

void MatMulF(const WeightMatrix& w, const float* x, int64_t T, int64_t n0, int64_t n1, float* y) {
  switch (w.type) {
    case GgmlType::kF32: MatMulFT<GgmlType::kF32>(w, x, T, n0, n1, y); return;
    case GgmlType::kF16: MatMulFT<GgmlType::kF16>(w, x, T, n0, n1, y); return;
    case GgmlType::kBF16: MatMulFT<GgmlType::kBF16>(w, x, T, n0, n1, y); return;
    default: return;
  }
}

// ---------------------------------------------------------------- elementwise

// Applies f to n floats in place-or-out, 8 at a time; a tail goes through a padded
// temporary so every element sees the same vector code (position-independent).
template <class F>
inline void Map8(int64_t n, F&& f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) f(i, 8);
  if (i < n) f(i, static_cast<int>(n - i));
}

inline __m256 LoadPartial(const float* p, int cnt) {
  if (cnt == 8) return _mm256_loadu_ps(p);
  float tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < cnt; ++i) tmp[i] = p[i];
  return _mm256_loadu_ps(tmp);
}
inline void StorePartial(float* p, __m256 v, int cnt) {
  if (cnt == 8) {
    _mm256_storeu_ps(p, v);
    return;
  }
  float tmp[8];
  _mm256_storeu_ps(tmp, v);
  for (int i = 0; i < cnt; ++i) p[i] = tmp[i];
}

void RmsNormRows(const float* x, int64_t D, const float* w, float eps, float* out, int64_t t0,
                 int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    const float* xr = x + t * D;
    float* o = out + t * D;
    __m256 acc = _mm256_setzero_ps();
    Map8(D, [&](int64_t i, int cnt) {
      const __m256 v = LoadPartial(xr + i, cnt);
      acc = _mm256_fmadd_ps(v, v, acc);
    });
    const double ss = HsumPs(acc);
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(D) + eps));
    const __m256 invv = _mm256_set1_ps(inv);
    Map8(D, [&](int64_t i, int cnt) {
      StorePartial(o + i, _mm256_mul_ps(_mm256_mul_ps(LoadPartial(xr + i, cnt), invv), LoadPartial(w + i, cnt)), cnt);
    });
  }
}

void SwiGluRange(const float* g, const float* u, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  Map8(n, [&](int64_t i, int cnt) {
    const __m256 gv = LoadPartial(g + i, cnt);
    const __m256 e = Exp8(_mm256_xor_ps(gv, sign));
    const __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
    StorePartial(out + i, _mm256_mul_ps(s, LoadPartial(u + i, cnt)), cnt);
  });
}

// x[i] = exp(x[i] - mx); returns the sum (8 lane sums in order of the 8-blocks, then HsumPs).
inline float ExpShiftSum(float* x, int64_t n, float mx) {
  const __m256 mv = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
#if SPECD_X8_DOT == 1
  int64_t i0 = 0;
  // 16 at a time on AVX-512: the same exps and the same adds in the same order.
  const __m512 mv16 = _mm512_set1_ps(mx);
  for (; i0 + 16 <= n; i0 += 16) {
    const __m512 e = ExpV<Vec16>(_mm512_sub_ps(_mm512_loadu_ps(x + i0), mv16));
    _mm512_storeu_ps(x + i0, e);
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
    acc = _mm256_add_ps(acc, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
  }
  x += i0;
  n -= i0;
#endif
  Map8(n, [&](int64_t i, int cnt) {
    __m256 e = Exp8(_mm256_sub_ps(LoadPartial(x + i, cnt), mv));
    if (cnt < 8) {
      const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      e = _mm256_and_ps(e, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(cnt), idx)));
    }
    acc = _mm256_add_ps(acc, e);
    StorePartial(x + i, e, cnt);
  });
  return HsumPs(acc);
}

inline float MaxOf(const float* x, int64_t n) {
  __m256 m = _mm256_set1_ps(-INFINITY);
  Map8(n, [&](int64_t i, int cnt) {
    __m256 v = _mm256_set1_ps(-INFINITY);
    if (cnt == 8) {
      v = _mm256_loadu_ps(x + i);
    } else {
      float tmp[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
      for (int k = 0; k < cnt; ++k) tmp[k] = x[i + k];
      v = _mm256_loadu_ps(tmp);
    }
    m = _mm256_max_ps(m, v);
  });
  return HmaxPs(m);
}

void SoftmaxRow(float* x, int64_t n) {
  if (n <= 0) return;
  const float mx = MaxOf(x, n);
  const float sum = ExpShiftSum(x, n, mx);
  const __m256 inv = _mm256_set1_ps(1.0f / sum);
  Map8(n, [&](int64_t i, int cnt) { StorePartial(x + i, _mm256_mul_ps(LoadPartial(x + i, cnt), inv), cnt); });
}

void ToF16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  }
  if (i < n) {
    float tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint16_t out[8];
    for (int64_t k = i; k < n; ++k) tmp[k - i] = src[k];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_cvtps_ph(_mm256_loadu_ps(tmp), _MM_FROUND_TO_NEAREST_INT));
    for (int64_t k = i; k < n; ++k) dst[k] = out[k - i];
  }
}

// ---------------------------------------------------------------- attention

// n consecutive elements of the KV pool (any dtype) to f32.
inline void LoadKvRun(KvDtype dt, const void* base, int64_t index, int64_t n, float* dst) {
  int64_t r = 0;
  if (dt == KvDtype::kF32) {
    std::memcpy(dst, static_cast<const float*>(base) + index, sizeof(float) * n);
    return;
  }
  const uint16_t* p = static_cast<const uint16_t*>(base) + index;
  if (dt == KvDtype::kF16) {
    for (; r + 8 <= n; r += 8) {
      _mm256_storeu_ps(dst + r, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + r))));
    }
    for (; r < n; ++r) dst[r] = H2F(p[r]);
  } else {
    for (; r + 8 <= n; r += 8) {
      const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + r)));
      _mm256_storeu_ps(dst + r, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; r < n; ++r) {
      const uint32_t bits = static_cast<uint32_t>(p[r]) << 16;
      std::memcpy(dst + r, &bits, sizeof(float));
    }
  }
}

// int8 codes times a scale per element: dst[r] = float(src[r]) * scale[r] (K runs: one scale
// per key) or, with scale_stride 0, times one scale (a V row).
inline void LoadInt8Run(const int8_t* src, const float* scale, int64_t scale_stride, int64_t n,
                        float* dst) {
  int64_t r = 0;
  for (; r + 8 <= n; r += 8) {
    const __m256 x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + r))));
    const __m256 sc = scale_stride ? _mm256_loadu_ps(scale + r) : _mm256_set1_ps(*scale);
    _mm256_storeu_ps(dst + r, _mm256_mul_ps(x, sc));
  }
  for (; r < n; ++r) dst[r] = static_cast<float>(src[r]) * scale[r * scale_stride];
}

// Converts V rows of keys [j0, j1) of kv head h to buf [round8(n)][d] f32, zeroing the
// padding rows. int8: buf gets the codes, and vs[j - j0] each row's scale (kernels/kv_int8.h:
// the scale goes onto p).
void LoadVChunk(const AttnArgs& a, int32_t t, int32_t h, int64_t j0, int64_t j1, float* buf, float* vs) {
  const PagedKvLayer& kv = *a.kv;
  const int32_t d = kv.head_dim;
  const int32_t* table = a.block_tables[t];
  const float one = 1.0f;
  for (int64_t j = j0; j < j1;) {  // one contiguous run of rows per block
    const int64_t off = j % kv.block_size, n = kv.block_size - off < j1 - j ? kv.block_size - off : j1 - j;
    const int64_t at = kv.VIndex(table[j / kv.block_size], off, h);
    if (kv.dtype == KvDtype::kInt8) {
      const float* sc = kv.v_scale + kv.SIndex(table[j / kv.block_size], off, h);
      for (int64_t r = 0; r < n; ++r) {
        LoadInt8Run(static_cast<const int8_t*>(kv.v) + at + r * d, &one, 0, d, buf + (j - j0 + r) * d);
        vs[j - j0 + r] = sc[r];
      }
    } else {
      // The run's rows are contiguous in the pool: one conversion of n * d values.
      LoadKvRun(kv.dtype, kv.v, at, n * d, buf + (j - j0) * d);
    }
    j += n;
  }
  const int64_t n = j1 - j0, n8 = (n + 7) & ~int64_t{7};
  for (int64_t r = n; r < n8; ++r) {
    for (int32_t i = 0; i < d; i += 8) _mm256_storeu_ps(buf + r * d + i, _mm256_setzero_ps());
  }
}

// K of keys [j0, j1) of kv head h, transposed: kt[i][j - j0] f32 for i < d. The pool keeps
// K transposed inside each block (PagedKvLayer::KIndex), so this is one contiguous run per
// (block, dim). Key columns past the chunk's end are zeroed (never used, but kept finite).
// int8: kt gets the codes, and ks[j - j0] each key's scale (kernels/kv_int8.h: the scale goes
// onto the score).
// kt: [d][kAttnChunk]  ks: [kAttnChunk]
void LoadKChunkT(const AttnArgs& a, int32_t t, int32_t h, int64_t j0, int64_t j1, float* kt, float* ks) {
  const PagedKvLayer& kv = *a.kv;
  const int32_t d = kv.head_dim;
  const int32_t* table = a.block_tables[t];
  for (int64_t j = j0; j < j1;) {
    const int64_t off = j % kv.block_size, n = kv.block_size - off < j1 - j ? kv.block_size - off : j1 - j;
    const int64_t at = kv.KIndex(table[j / kv.block_size], off, h, 0);
    if (kv.dtype == KvDtype::kF16 && n == 16) {  // the common case: a whole f16 block of 16
      const uint16_t* src = static_cast<const uint16_t*>(kv.k) + at;
      float* dst = kt + (j - j0);
      for (int32_t i = 0; i < d; ++i, src += kv.block_size, dst += kAttnChunk) {
        _mm256_storeu_ps(dst, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))));
        _mm256_storeu_ps(dst + 8, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 8))));
      }
    } else if (kv.dtype == KvDtype::kInt8) {
      const float* sc = kv.k_scale + kv.SIndex(table[j / kv.block_size], off, h);
      const float one = 1.0f;
      for (int32_t i = 0; i < d; ++i) {
        LoadInt8Run(static_cast<const int8_t*>(kv.k) + at + static_cast<int64_t>(i) * kv.block_size,
                    &one, 0, n, kt + static_cast<int64_t>(i) * kAttnChunk + (j - j0));
      }
      for (int64_t r = 0; r < n; ++r) ks[j - j0 + r] = sc[r];
    } else {
      for (int32_t i = 0; i < d; ++i) {
        LoadKvRun(kv.dtype, kv.k, at + static_cast<int64_t>(i) * kv.block_size, n,
                  kt + static_cast<int64_t>(i) * kAttnChunk + (j - j0));
      }
    }
    j += n;
  }
  if (j1 - j0 < kAttnChunk) {
    for (int32_t i = 0; i < d; ++i) {
      float* row = kt + static_cast<int64_t>(i) * kAttnChunk;
      for (int64_t c = j1 - j0; c < kAttnChunk; ++c) row[c] = 0.0f;
    }
    if (kv.dtype == KvDtype::kInt8) {
      for (int64_t c = j1 - j0; c < kAttnChunk; ++c) ks[c] = 0.0f;
    }
  }
}

// The attention arithmetic. Each score s[r][j] is one FMA chain over the head dims in order
// i = 0..d-1 (then times scale), and each output column o[r][c] one FMA chain over the keys
// in order. Vectors run across keys (scores) or across output columns (PV), never across
// a summed index, so a row's result does not depend on the vector width (AVX2 and AVX-512
// give the same bits), on how rows are blocked, or on which other rows share the chunk.
// bf16 attention (KvDtype::kBF16, kernels/attn_bf16.h) keeps this shape with its operands
// rounded to bf16 and each chain taken in pairs, odd element first: the Src types' kPairs
// here, vdpbf16ps itself in Bf16RowsChunk below, the same bits.
//
// kPoolRowsMax: up to this many query rows read a chunk's K and V straight from the pool
// (PoolRowsChunk), converting them in registers once per row block; more rows stage the chunk
// in scratch once. On AVX-512 a verification tile (up to 10 tokens of a 3-query group) stays
// on the pool: converting once per row block costs less than staging (docs/PERFORMANCE.md,
// "Verification at depth").
#if SPECD_X8_DOT == 1
using AttnVec = Vec16;
constexpr int kAttnRowBlock = 6;  // 6 rows x 4 vectors of accumulators + 4 loads: 28 of 32 zmm
constexpr int kPoolRowsMax = 5 * kAttnRowBlock;
#else
using AttnVec = Vec8;             // also the emulated VNNI build: the bits are the same
constexpr int kAttnRowBlock = 2;  // 2 rows x 4 vectors + 4 loads + 1 broadcast: 13 of 16 ymm
constexpr int kPoolRowsMax = kAttnRowBlock;
#endif

// One query row's view of a key chunk: it sees the chunk's first n keys (causal).
struct AttnRow {
  const float* q;  // [d]
  int64_t n;
  float* s;        // [kAttnChunk] scores, then exp(score - m)
  float* o;        // [d] raw output partial
  float* m;        // score max
  float* l;        // exp-sum
  float qss;       // int8 KV: the row's qs * scale (kernels/kv_int8.h); q holds its codes
  float wscale;    // int8 KV: its p V weight codes' scale, PWeightScale (kernels/kv_int8.h)
};
static_assert(sizeof(AttnRow) <= kAttnRowBytes, "AttnScratchFloats reserves kAttnRowBytes a row");

// Where the micro-kernels below read K and V (the Src parameter). Both sources give the same
// f32 values, hence the same bits.
// ScratchK / ScratchV: the chunk converted to f32 in scratch by LoadKChunkT / LoadVChunk (the
// prefill tiles' path: up to 64 query rows share each conversion).
// kPairs (bf16 attention, kernels/attn_bf16.h): the dims of a score and the keys of an
// output column are summed in pairs, the odd one first (vdpbf16ps's order).
// kScaledKeys (int8 KV, kernels/kv_int8.h): K holds codes, and each score is scaled by its
// key's KScale and the row's qss at the end (Int8Score).
template <bool kPairsT = false, bool kScaledKeysT = false>
struct ScratchK {
  static constexpr bool kPairs = kPairsT;
  static constexpr bool kScaledKeys = kScaledKeysT;
  const float* kt;  // [d][kAttnChunk]
  const float* ks = nullptr;  // kScaledKeys: [kAttnChunk]
  template <class V> typename V::F KScale(int64_t key) const {
    if constexpr (kScaledKeys) return V::Load(ks + key);
    return V::Zero();  // not used
  }
  // keys [key, key + kW) of dim i
  template <class V> typename V::F K(int64_t key, int32_t i, typename V::F) const {
    return V::Load(kt + static_cast<int64_t>(i) * kAttnChunk + key);
  }
};
template <bool kPairsT = false>
struct ScratchV {
  static constexpr bool kPairs = kPairsT;
  const float* v;  // [kAttnChunk][d]
  int32_t d;
  template <class V> typename V::F VScale(int64_t) const { return V::Zero(); }  // not used
  // columns [c, c + kW) of key j
  template <class V> typename V::F Val(int64_t j, int32_t c, typename V::F) const {
    return V::Load(v + j * d + c);
  }
};
// PoolKv: straight from the pool's 16-key blocks, f16 or int8 converted in registers (decode's
// path: with a few query rows, storing and reloading every converted element cost as much as
// the arithmetic). Keys past the chunk's last block read block 0 (finite, never used). int8
// reads the codes (kernels/kv_int8.h): scores scaled at the end, p V on the weights' codes
// (CodeRowWeights). Both sums are exact integers, so the pair order changes no bit.
template <KvDtype DT>
struct PoolKv {
  static constexpr bool kPairs = DT == KvDtype::kInt8;
  static constexpr bool kScaledKeys = DT == KvDtype::kInt8;
  using T = std::conditional_t<DT == KvDtype::kInt8, int8_t, uint16_t>;
  static constexpr int kBlocks = kAttnChunk / 16;
  const T* k[kBlocks];       // a block's K slab: dim i at + i * 16
  const T* v[kBlocks];       // its V rows: [16][d]
  const float* ks[kBlocks];  // int8: its 16 K scales, and V scales
  const float* vs[kBlocks];
  int32_t d;
  template <class V> typename V::F KScale(int64_t key) const {
    if constexpr (DT == KvDtype::kInt8) return V::Load(ks[key >> 4] + (key & 15));
    return V::Zero();
  }
  template <class V> typename V::F K(int64_t key, int32_t i, typename V::F) const {
    const T* p = k[key >> 4] + static_cast<int64_t>(i) * 16 + (key & 15);
    if constexpr (DT == KvDtype::kInt8) return V::FromI8(p);
    else return V::FromF16(p);
  }
  template <class V> typename V::F VScale(int64_t) const { return V::Zero(); }  // not used
  template <class V> typename V::F Val(int64_t j, int32_t c, typename V::F) const {
    const T* p = v[j >> 4] + (j & 15) * d + c;
    if constexpr (DT == KvDtype::kInt8) return V::FromI8(p);
    else return V::FromF16(p);
  }
};

// rows[r].s[kb, kb + 4W) = scale * q_r . k_j for RB rows.
template <class V, int RB, class Src>
void ScoresBlock(const AttnRow* rows, const Src& src, int32_t d, int64_t kb, float scale) {
  typename V::F acc[RB][4], ksc[4];
#pragma GCC unroll 8
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) acc[r][u] = V::Zero();
  }
#pragma GCC unroll 4
  for (int u = 0; u < 4; ++u) ksc[u] = src.template KScale<V>(kb + u * V::kW);
  for (int32_t i0 = 0; i0 < d; ++i0) {
    const int32_t i = Src::kPairs ? (i0 ^ 1) : i0;  // d is even on this path
    typename V::F k[4];
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) k[u] = src.template K<V>(kb + u * V::kW, i, ksc[u]);
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r) {
      const typename V::F qb = V::Set1(rows[r].q[i]);
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) acc[r][u] = V::Fma(qb, k[u], acc[r][u]);
    }
  }
  const typename V::F sc = V::Set1(scale);
#pragma GCC unroll 8
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      // int8: Int8Score's isum * (ks * qss); the FMA chain above summed exact integers.
      const typename V::F f = Src::kScaledKeys ? V::Mul(ksc[u], V::Set1(rows[r].qss)) : sc;
      V::Store(rows[r].s + kb + u * V::kW, V::Mul(acc[r][u], f));
    }
  }
}

template <int RB, class Src>
void ScoresRowBlock(const AttnRow* rows, const Src& src, int32_t d, int64_t n_max, float scale) {
  constexpr int64_t kKeys = 4 * AttnVec::kW;
  for (int64_t kb = 0; kb < n_max; kb += kKeys) ScoresBlock<AttnVec, RB>(rows, src, d, kb, scale);
}

// Scores of every row against keys [0, rows' n) of the chunk (and up to the vector block past
// it, unused).
template <class Src>
void ScoresRows(const AttnRow* rows, int32_t R, const Src& src, int32_t d, float scale) {
  for (int32_t r0 = 0; r0 < R; r0 += kAttnRowBlock) {
    const int32_t rb = R - r0 < kAttnRowBlock ? R - r0 : kAttnRowBlock;
    int64_t n_max = 0;
    for (int32_t r = r0; r < r0 + rb; ++r) n_max = rows[r].n > n_max ? rows[r].n : n_max;
    switch (rb) {
      case 1: ScoresRowBlock<1>(rows + r0, src, d, n_max, scale); break;
#if SPECD_X8_DOT == 1
      case 3: ScoresRowBlock<3>(rows + r0, src, d, n_max, scale); break;
      case 4: ScoresRowBlock<4>(rows + r0, src, d, n_max, scale); break;
      case 5: ScoresRowBlock<5>(rows + r0, src, d, n_max, scale); break;
      case 6: ScoresRowBlock<6>(rows + r0, src, d, n_max, scale); break;
#endif
      default: ScoresRowBlock<2>(rows + r0, src, d, n_max, scale); break;
    }
  }
}

// rows[r].o[c0, c0 + NC W) = sum_{j < j1} s_r[j] v[j][c0, ...) for RB rows, over keys
// [j0, j1): from zero when j0 == 0, otherwise continuing each column's chain from o.
template <class V, int RB, int NC, class Src>
void PvBlock(const AttnRow* rows, const Src& src, int32_t c0, int64_t j0, int64_t j1) {
  typename V::F acc[RB][NC];
#pragma GCC unroll 8
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 4
    for (int u = 0; u < NC; ++u) acc[r][u] = j0 == 0 ? V::Zero() : V::Load(rows[r].o + c0 + u * V::kW);
  }
  for (int64_t jj = j0; jj < j1; ++jj) {
    // Pairs: j0 is even, and a last key without its partner goes alone.
    const int64_t j = Src::kPairs && (jj ^ 1) < j1 ? (jj ^ 1) : jj;
    const typename V::F vsc = src.template VScale<V>(j);
    typename V::F vv[NC];
#pragma GCC unroll 4
    for (int u = 0; u < NC; ++u) vv[u] = src.template Val<V>(j, c0 + u * V::kW, vsc);
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r) {
      const typename V::F pb = V::Set1(rows[r].s[j]);
#pragma GCC unroll 4
      for (int u = 0; u < NC; ++u) acc[r][u] = V::Fma(pb, vv[u], acc[r][u]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 4
    for (int u = 0; u < NC; ++u) V::Store(rows[r].o + c0 + u * V::kW, acc[r][u]);
  }
}

// All d columns of RB rows over keys [j0, j1), in passes of up to 4 vectors; on the AVX-512
// path a last 8 columns (d % 16 == 8) take 256-bit vectors (the same bits).
template <int RB, class Src>
void PvColumns(const AttnRow* rows, const Src& src, int32_t d, int64_t j0, int64_t j1) {
  constexpr int32_t kW = AttnVec::kW;
  int32_t c = 0;
  for (; d - c >= 4 * kW; c += 4 * kW) PvBlock<AttnVec, RB, 4>(rows, src, c, j0, j1);
  switch ((d - c) / kW) {
    case 3: PvBlock<AttnVec, RB, 3>(rows, src, c, j0, j1); c += 3 * kW; break;
    case 2: PvBlock<AttnVec, RB, 2>(rows, src, c, j0, j1); c += 2 * kW; break;
    case 1: PvBlock<AttnVec, RB, 1>(rows, src, c, j0, j1); c += kW; break;
    default: break;
  }
  if (c < d) PvBlock<Vec8, RB, 1>(rows, src, c, j0, j1);  // d % 8 == 0 on this path
}

// o of every row = sum over its n keys of p v. A block of rows shares each V load up to its
// shortest row; each longer row then continues its own chains alone.
template <class Src>
void PvRows(const AttnRow* rows, int32_t R, const Src& src, int32_t d) {
  for (int32_t r0 = 0; r0 < R; r0 += kAttnRowBlock) {
    const int32_t rb = R - r0 < kAttnRowBlock ? R - r0 : kAttnRowBlock;
    int64_t n_min = rows[r0].n;
    for (int32_t r = r0; r < r0 + rb; ++r) n_min = rows[r].n < n_min ? rows[r].n : n_min;
    if (Src::kPairs) n_min &= ~int64_t{1};  // a key pair is never split between two passes
    switch (rb) {
      case 1: PvColumns<1>(rows + r0, src, d, 0, n_min); break;
#if SPECD_X8_DOT == 1
      case 3: PvColumns<3>(rows + r0, src, d, 0, n_min); break;
      case 4: PvColumns<4>(rows + r0, src, d, 0, n_min); break;
      case 5: PvColumns<5>(rows + r0, src, d, 0, n_min); break;
      case 6: PvColumns<6>(rows + r0, src, d, 0, n_min); break;
#endif
      default: PvColumns<2>(rows + r0, src, d, 0, n_min); break;
    }
    for (int32_t r = r0; r < r0 + rb; ++r) {
      if (rows[r].n > n_min) PvColumns<1>(rows + r, src, d, n_min, rows[r].n);
    }
  }
}

// The KV of keys [j0, j1) of kv head h (K slabs and V runs per block, blocks anywhere in the
// pool) is rarely cached after a pass over the weights: request it all up front so the
// misses overlap. Into L2 (prefetcht1), not L1: decode at 4k-8k ran 1.1-1.3x faster so, on f16
// and int8 (docs/PERFORMANCE.md, "KV prefetched into L2"). Likely why: two chunks ahead is 8-16
// KB per kv head, which in L1 competes with the rows' scores and partials for 32-48 KB.
void PrefetchKvChunk(const AttnArgs& a, int32_t t, int32_t h, int64_t j0, int64_t j1) {
  const PagedKvLayer& kv = *a.kv;
  const int32_t d = kv.head_dim;
  const int64_t es = KvDtypeSize(kv.dtype);
  const int32_t* table = a.block_tables[t];
  for (int64_t j = j0; j < j1;) {
    const int64_t off = j % kv.block_size, n = kv.block_size - off < j1 - j ? kv.block_size - off : j1 - j;
    const int64_t block = table[j / kv.block_size];
    const int64_t kat = kv.KIndex(block, 0, h, 0) * es, vat = kv.VIndex(block, off, h) * es;
    for (int64_t o = 0; o < static_cast<int64_t>(kv.block_size) * d * es; o += 64) {
      PrefetchLine</*kL2=*/true>(static_cast<const char*>(kv.k) + kat + o);
    }
    for (int64_t o = 0; o < n * d * es; o += 64)
      PrefetchLine</*kL2=*/true>(static_cast<const char*>(kv.v) + vat + o);
    if (kv.dtype == KvDtype::kInt8) {  // the block's scales: n floats each
      PrefetchLine(kv.k_scale + kv.SIndex(block, off, h));
      PrefetchLine(kv.v_scale + kv.SIndex(block, off, h));
    }
    j += n;
  }
}

// The chunk of a one-chunk item (a.items[i].partial >= 0).
void PrefetchItemChunk(const AttnArgs& a, const AttnItem& it) {
  const int64_t len = static_cast<int64_t>(a.positions[it.t + it.tokens - 1]) + 1;  // a tile's longest
  const int64_t j0 = static_cast<int64_t>(it.c0) * kAttnChunk;
  PrefetchKvChunk(a, it.t, it.h, j0, j0 + kAttnChunk < len ? j0 + kAttnChunk : len);
}

// MaxOf + ExpShiftSum for NR rows that each see the whole chunk, interleaved: one row's
// max and sum are chains of dependent operations (their latency, not their work, set the
// pace); NR rows' chains run side by side. Per row the same operations in the same order as
// the row-by-row functions: the same max, exps and sum (8-lane blocks in order, then HsumPs).
// emit(r, b, e) stores row r's exps e of block b (AttnVec lanes b * kW ...).
template <int NR, class Emit>
inline void FullRowsSoftmaxParts(AttnRow* rows, Emit&& emit) {
  using V = AttnVec;
  constexpr int kBlocks = kAttnChunk / V::kW;
  float mx[NR];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) {
    typename V::F m = V::Load(rows[r].s);
#pragma GCC unroll 8
    for (int b = 1; b < kBlocks; ++b) m = V::Max(m, V::Load(rows[r].s + b * V::kW));
#if SPECD_X8_DOT == 1  // AttnVec is Vec16
    mx[r] = Hmax16(m);
#else
    mx[r] = HmaxPs(m);
#endif
  }
  __m256 acc[NR];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) acc[r] = _mm256_setzero_ps();
#pragma GCC unroll 8
  for (int b = 0; b < kBlocks; ++b) {
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const typename V::F e = ExpV<V>(V::Sub(V::Load(rows[r].s + b * V::kW), V::Set1(mx[r])));
      emit(r, b, e);
#if SPECD_X8_DOT == 1
      acc[r] = _mm256_add_ps(acc[r], _mm512_castps512_ps256(e));
      acc[r] = _mm256_add_ps(acc[r], _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
#else
      acc[r] = _mm256_add_ps(acc[r], e);
#endif
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) {
    *rows[r].m = mx[r];
    *rows[r].l = HsumPs(acc[r]);
  }
}

// Whether rows[0, NR) all see the whole chunk (FullRowsSoftmaxParts<NR> can take them).
template <int NR>
inline bool FullRows(const AttnRow* rows) {
  for (int r = 0; r < NR; ++r) {
    if (rows[r].n != kAttnChunk) return false;
  }
  return true;
}

// full.template operator()<NR>(r0) for runs of NR rows from row 0 that all see the whole
// chunk, 4 at a time and then one run of 3 (a decode step's group of 3 query heads); returns
// the row after the last run.
template <class Full>
inline int32_t ForFullRowRuns(const AttnRow* rows, int32_t R, Full&& full) {
  int32_t r = 0;
  for (; r + 4 <= R && FullRows<4>(rows + r); r += 4) full.template operator()<4>(r);
  if (r + 3 <= R && FullRows<3>(rows + r)) {
    full.template operator()<3>(r);
    r += 3;
  }
  return r;
}

// Each row's score max and exp-sum (its scores become exp(score - max)).
void RowsSoftmaxParts(AttnRow* rows, int32_t R) {
  int32_t r = ForFullRowRuns(rows, R, [&]<int NR>(int32_t r0) {  // interleaved
    FullRowsSoftmaxParts<NR>(rows + r0, [&](int k, int b, AttnVec::F e) {
      AttnVec::Store(rows[r0 + k].s + b * AttnVec::kW, e);
    });
  });
  for (; r < R; ++r) {
    *rows[r].m = MaxOf(rows[r].s, rows[r].n);
    *rows[r].l = ExpShiftSum(rows[r].s, rows[r].n, *rows[r].m);
  }
}

// int8 KV (kernels/kv_int8.h): each row's p becomes its weights' codes wc_j (as floats) for
// w_j = p_j * vs_j, vs[j] the V scale of the chunk's key j, and wscale their scale. p V's
// sums of wc_j * V's codes are then exact integers (PvRows), scaled by ScaleRowOutputs.
void CodeRowWeights(AttnRow* rows, int32_t R, const float* vs) {
  for (int32_t r = 0; r < R; ++r) {
    float* x = rows[r].s;
    const int64_t n = rows[r].n;
    __m256 wm = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      const __m256 w = _mm256_mul_ps(_mm256_loadu_ps(x + j), _mm256_loadu_ps(vs + j));
      _mm256_storeu_ps(x + j, w);
      wm = _mm256_max_ps(w, wm);  // w > wm ? w : wm, as PWeightInverse's max asks
    }
    float wmax = HmaxPs(wm);
    for (; j < n; ++j) {
      x[j] *= vs[j];
      wmax = x[j] > wmax ? x[j] : wmax;
    }
    const float inv = PWeightInverse(wmax);
    const __m256 vinv = _mm256_set1_ps(inv), top = _mm256_set1_ps(kPWeightCodeMax);
    for (j = 0; j + 8 <= n; j += 8) {
      const __m256 wi = _mm256_mul_ps(_mm256_loadu_ps(x + j), vinv);
      const __m256 c = _mm256_min_ps(_mm256_max_ps(wi, _mm256_setzero_ps()), top);
      _mm256_storeu_ps(x + j, _mm256_round_ps(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    for (; j < n; ++j) x[j] = PWeightCode(x[j], inv);
    rows[r].wscale = PWeightScale(wmax);
  }
}

// int8 KV: each row's output, sums of codes, times its wscale (CodeRowWeights).
void ScaleRowOutputs(const AttnRow* rows, int32_t R, int32_t d) {
  for (int32_t r = 0; r < R; ++r) {
    const __m256 sc = _mm256_set1_ps(rows[r].wscale);
    float* o = rows[r].o;
    for (int32_t c = 0; c < d; c += 8) {
      _mm256_storeu_ps(o + c, _mm256_mul_ps(_mm256_loadu_ps(o + c), sc));
    }
  }
}

// The pool blocks holding the chunk's keys [j0, j1) (block_size 16, j0 % 16 == 0), one per 16
// keys; slots past the chunk's end repeat its first block (finite, never used).
inline void ChunkBlocks(const int32_t* table, int64_t j0, int64_t j1, int64_t* blocks) {
  const int64_t nb = (j1 - j0 + 15) / 16;
  for (int b = 0; b < kAttnChunk / 16; ++b) blocks[b] = table[(j0 + 16 * (b < nb ? b : 0)) / 16];
}

// AttnRowsChunk's arithmetic reading K and V from the pool's 16-key blocks (PoolKv).
template <KvDtype DT>
void PoolRowsChunk(const AttnArgs& a, int32_t t, int32_t h, int64_t j0, int64_t j1, AttnRow* rows,
                   int32_t R) {
  const PagedKvLayer& kv = *a.kv;
  using Src = PoolKv<DT>;
  using T = typename Src::T;
  Src src;
  src.d = kv.head_dim;
  int64_t blocks[kAttnChunk / 16];
  ChunkBlocks(a.block_tables[t], j0, j1, blocks);
  for (int b = 0; b < Src::kBlocks; ++b) {
    const int64_t block = blocks[b];
    src.k[b] = static_cast<const T*>(kv.k) + kv.KIndex(block, 0, h, 0);
    src.v[b] = static_cast<const T*>(kv.v) + kv.VIndex(block, 0, h);
    src.ks[b] = kv.k_scale != nullptr ? kv.k_scale + kv.SIndex(block, 0, h) : nullptr;
    src.vs[b] = kv.v_scale != nullptr ? kv.v_scale + kv.SIndex(block, 0, h) : nullptr;
  }
  ScoresRows(rows, R, src, kv.head_dim, a.scale);
  RowsSoftmaxParts(rows, R);
  if constexpr (DT == KvDtype::kInt8) {
    alignas(64) float vs[kAttnChunk];
    for (int b = 0; b < Src::kBlocks; ++b) std::memcpy(vs + 16 * b, src.vs[b], 16 * sizeof(float));
    CodeRowWeights(rows, R, vs);
  }
  PvRows(rows, R, src, kv.head_dim);
  if constexpr (DT == KvDtype::kInt8) ScaleRowOutputs(rows, R, kv.head_dim);
}

// Each row's p (its n exp'd scores) rounded to bf16 in place, as f32 values
// (kernels/attn_bf16.h's RoundBf16Attn: nearest even, below kBf16AttnFlush to +0; p is
// finite and >= 0).
void RoundRowsToBf16(AttnRow* rows, int32_t R) {
  const __m256i flush = _mm256_set1_epi32(0x30800000), bias = _mm256_set1_epi32(0x7FFF),
                one = _mm256_set1_epi32(1), high = _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  for (int32_t r = 0; r < R; ++r) {
    float* x = rows[r].s;
    int64_t j = 0;
    for (; j + 8 <= rows[r].n; j += 8) {
      const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + j));
      const __m256i up = _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
      const __m256i keep = _mm256_cmpgt_epi32(_mm256_add_epi32(u, one), flush);  // u >= flush
      _mm256_storeu_ps(x + j, _mm256_castsi256_ps(_mm256_and_si256(_mm256_and_si256(up, high), keep)));
    }
    for (; j < rows[r].n; ++j) x[j] = RoundBf16Attn(x[j]);
  }
}

#if SPECD_X8_DOT == 1
// The native bf16 attention: vdpbf16ps on K and V read straight from the pool's 16-key
// blocks. Each instruction lane adds two products, the odd element's first, each rounded
// once: the order kernels/attn_bf16.h defines, so these give ScratchK<true>/ScratchV<true>'s
// bits. Only entered when the CPU has AVX-512 BF16 (AttnArgs::bf16_dot).
#define SPECD_BF16_TARGET __attribute__((target("avx512bf16")))

// Output element 2m takes input m, 2m + 1 takes input 16 + m: two 16-element bf16 runs
// [a | b] become the pairs (a_m, b_m), one per 32-bit lane.
alignas(64) constexpr uint16_t kPairIdx[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                               8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

inline int32_t Ld32(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Where the bf16 kernels read K and V as vdpbf16ps operands (pairs per 32-bit lane).
// Bf16Pool: straight from the pool's 16-key blocks, paired in registers (decode: a few rows).
// kblk[b]: block b's K slab [d][16]; vblk[b]: its V rows [16][d]. Blocks past the chunk's
// end are its first (finite, never used).
struct Bf16Pool {
  const uint16_t* kblk[kAttnChunk / 16];
  const uint16_t* vblk[kAttnChunk / 16];
  int32_t d;
  // Dims i, i + 1 (i even) of block u's 16 keys: [k_i | k_i+1] -> pairs.
  __m512i KPair(int u, int32_t i) const {
    return _mm512_permutexvar_epi16(_mm512_load_si512(kPairIdx), _mm512_loadu_si512(kblk[u] + i * 16));
  }
  // Columns [c, c + 16) of keys j, j + 1 (j even; v of j + 1 taken as 0 unless both).
  __m512i VPair(int64_t j, int32_t c, bool both) const {
    const uint16_t* v0 = vblk[j >> 4] + (j & 15) * d + c;
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v0));
    const __m256i hi = both ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v0 + d)) : _mm256_setzero_si256();
    return _mm512_permutexvar_epi16(_mm512_load_si512(kPairIdx), _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
  }
};
// Bf16Staged: the chunk paired once in scratch (Stage), for the many rows of a prefill tile.
// kp: [d / 2][4 blocks][32]; vp: [32 key pairs][d / 16][32] (a key past the chunk's end: 0).
struct Bf16Staged {
  uint16_t* kp;
  uint16_t* vp;
  int32_t d;
  void Stage(const Bf16Pool& pool, int64_t nkeys) {
    for (int32_t i = 0; i < d; i += 2) {
      for (int u = 0; u < kAttnChunk / 16; ++u) _mm512_storeu_si512(kp + ((i / 2) * 4 + u) * 32, pool.KPair(u, i));
    }
    for (int64_t j = 0; j < nkeys; j += 2) {
      for (int32_t c = 0; c < d; c += 16) _mm512_storeu_si512(VAt(j, c), pool.VPair(j, c, j + 1 < nkeys));
    }
  }
  uint16_t* VAt(int64_t j, int32_t c) const { return vp + ((j / 2) * (d / 16) + c / 16) * 32; }
  __m512i KPair(int u, int32_t i) const { return _mm512_loadu_si512(kp + ((i / 2) * 4 + u) * 32); }
  __m512i VPair(int64_t j, int32_t c, bool) const { return _mm512_loadu_si512(VAt(j, c)); }
};

// rows[r].s[0, 64) = scale * q_r . k_j for RB rows and the chunk's 64 keys (keys past the
// chunk's end are computed, never used). qb[r]: row r's q as bf16 [d].
template <int RB, class Src>
SPECD_BF16_TARGET void Bf16ScoresBlock(const AttnRow* rows, const uint16_t* const* qb, const Src& src,
                                       int32_t d, float scale) {
  __m512 acc[RB][4];
#pragma GCC unroll 8
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) acc[r][u] = _mm512_setzero_ps();
  }
  for (int32_t i = 0; i < d; i += 2) {
    __m512i k[4];
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) k[u] = src.KPair(u, i);
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r) {
      const __m512bh qp = (__m512bh)_mm512_set1_epi32(Ld32(qb[r] + i));
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) acc[r][u] = _mm512_dpbf16_ps(acc[r][u], qp, (__m512bh)k[u]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 8
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) _mm512_storeu_ps(rows[r].s + u * 16, _mm512_mul_ps(acc[r][u], sc));
  }
}

// rows[r].o[c0, c0 + 16 NC) = sum over keys [j0, j1) (j0 even) of p v, continuing o's chains
// when j0 > 0. pb[r]: row r's p as bf16 [64].
template <int RB, int NC, class Src>
SPECD_BF16_TARGET void Bf16PvBlock(const AttnRow* rows, const uint16_t* const* pb, const Src& src,
                                   int32_t c0, int64_t j0, int64_t j1) {
  __m512 acc[RB][NC];
#pragma GCC unroll 8
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 4
    for (int u = 0; u < NC; ++u) acc[r][u] = j0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(rows[r].o + c0 + u * 16);
  }
  // Key pairs, then a last key alone (odd j1 - j0), paired with p = 0: adding that +-0
  // product (v is finite) leaves the sum as it is (the sum is never -0). The pairs' loop
  // broadcasts each row's p pair straight from memory.
  const auto pairs = [&](int64_t j, bool both) SPECD_BF16_TARGET {
    __m512i vv[NC];
#pragma GCC unroll 4
    for (int u = 0; u < NC; ++u) vv[u] = src.VPair(j, c0 + u * 16, both);
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r) {
      const __m512bh pp = (__m512bh)_mm512_set1_epi32(Ld32(pb[r] + j) & (both ? -1 : 0xFFFF));
#pragma GCC unroll 4
      for (int u = 0; u < NC; ++u) acc[r][u] = _mm512_dpbf16_ps(acc[r][u], pp, (__m512bh)vv[u]);
    }
  };
  int64_t j = j0;
  for (; j + 1 < j1; j += 2) pairs(j, true);
  if (j < j1) pairs(j, false);
#pragma GCC unroll 8
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 4
    for (int u = 0; u < NC; ++u) _mm512_storeu_ps(rows[r].o + c0 + u * 16, acc[r][u]);
  }
}

// 16 p (or w = p * vs) as bf16 bits, RoundBf16Attn's rounding: vcvtneps2bf16 rounds to
// nearest even as it does, and values under kBf16AttnFlush are masked to +0 first (the
// instruction itself flushes only subnormals). p and w are finite and >= +0.
SPECD_BF16_TARGET inline __m256i PackBf16(__m512 p) {
  const __mmask16 keep = _mm512_cmpge_epi32_mask(_mm512_castps_si512(p), _mm512_set1_epi32(0x30800000));
  return (__m256i)_mm512_maskz_cvtneps_pbh(keep, p);
}

// Each row's p (its n exp'd scores) rounded to bf16 (RoundRowsToBf16's rounding) and packed
// as bits over its own s: element j goes to bytes [2j, 2j + 2), below the floats still to read.
SPECD_BF16_TARGET void PackRowsBf16(AttnRow* rows, int32_t R) {
  for (int32_t r = 0; r < R; ++r) {
    float* x = rows[r].s;
    uint16_t* out = reinterpret_cast<uint16_t*>(x);
    for (int64_t j = 0; j < rows[r].n; j += 16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), PackBf16(_mm512_loadu_ps(x + j)));
    }
  }
}

// RowsSoftmaxParts, then PackRowsBf16: rows that see the whole chunk in one pass, each block's
// exps packed as they are made (the same values, without storing and reloading them).
// (flatten: the bf16 lambda can only be inlined here, into a function of its own target.)
SPECD_BF16_TARGET __attribute__((flatten)) void RowsSoftmaxPackBf16(AttnRow* rows, int32_t R) {
  const int32_t r = ForFullRowRuns(rows, R, [&]<int NR>(int32_t r0) SPECD_BF16_TARGET {
    FullRowsSoftmaxParts<NR>(rows + r0, [&](int k, int b, __m512 e) SPECD_BF16_TARGET {
      uint16_t* out = reinterpret_cast<uint16_t*>(rows[r0 + k].s) + 16 * b;  // below block b's floats
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), PackBf16(e));
    });
  });
  RowsSoftmaxParts(rows + r, R - r);
  PackRowsBf16(rows + r, R - r);
}

template <int RB, class Src>
SPECD_BF16_TARGET void Bf16ScoresRowBlock(const AttnArgs& a, const AttnRow* rows, const Src& src, int32_t d) {
  const uint16_t* qb[RB];
  for (int r = 0; r < RB; ++r) qb[r] = a.q_bf16 + (rows[r].q - a.q);
  Bf16ScoresBlock<RB>(rows, qb, src, d, a.scale);
}

// All d columns (d % 16 == 0) of RB rows over keys [j0, j1).
template <int RB, class Src>
SPECD_BF16_TARGET void Bf16PvRowBlock(const AttnRow* rows, const Src& src, int32_t d, int64_t j0, int64_t j1) {
  const uint16_t* pb[RB];
  for (int r = 0; r < RB; ++r) pb[r] = reinterpret_cast<const uint16_t*>(rows[r].s);
  int32_t c = 0;
  for (; d - c >= 64; c += 64) Bf16PvBlock<RB, 4>(rows, pb, src, c, j0, j1);
  switch ((d - c) / 16) {
    case 3: Bf16PvBlock<RB, 3>(rows, pb, src, c, j0, j1); break;
    case 2: Bf16PvBlock<RB, 2>(rows, pb, src, c, j0, j1); break;
    case 1: Bf16PvBlock<RB, 1>(rows, pb, src, c, j0, j1); break;
    default: break;
  }
}

template <class Src>
SPECD_BF16_TARGET void Bf16PvRows(AttnRow* rows, int32_t R, const Src& src, int32_t d);

// Calls fn.template operator()<RB>(r0) for each block of RB <= kAttnRowBlock (6) rows from
// row r0 of R: a row count known at compile time, for the micro-kernels' register blocks.
template <class Fn>
void ForRowBlocks(int32_t R, Fn&& fn) {
  for (int32_t r0 = 0; r0 < R; r0 += kAttnRowBlock) {
    switch (R - r0 < kAttnRowBlock ? R - r0 : kAttnRowBlock) {
      case 1: fn.template operator()<1>(r0); break;
      case 2: fn.template operator()<2>(r0); break;
      case 3: fn.template operator()<3>(r0); break;
      case 4: fn.template operator()<4>(r0); break;
      case 5: fn.template operator()<5>(r0); break;
      default: fn.template operator()<6>(r0); break;
    }
  }
}

// Scores, each row's max and exp-sum (as every dtype), p rounded and packed, then p V.
template <class Src>
SPECD_BF16_TARGET void Bf16Rows(const AttnArgs& a, const Src& src, int32_t d, AttnRow* rows, int32_t R) {
  ForRowBlocks(R, [&]<int RB>(int32_t r0) SPECD_BF16_TARGET { Bf16ScoresRowBlock<RB>(a, rows + r0, src, d); });
  RowsSoftmaxPackBf16(rows, R);
  Bf16PvRows(rows, R, src, d);
}

// p V for rows whose p is packed as bf16 (PackRowsBf16) over their s.
template <class Src>
SPECD_BF16_TARGET void Bf16PvRows(AttnRow* rows, int32_t R, const Src& src, int32_t d) {
  for (int32_t r0 = 0; r0 < R; r0 += kAttnRowBlock) {
    const int32_t rb = R - r0 < kAttnRowBlock ? R - r0 : kAttnRowBlock;
    int64_t n_min = rows[r0].n;
    for (int32_t r = r0; r < r0 + rb; ++r) n_min = rows[r].n < n_min ? rows[r].n : n_min;
    n_min &= ~int64_t{1};  // a key pair is never split between two passes
    switch (rb) {
      case 1: Bf16PvRowBlock<1>(rows + r0, src, d, 0, n_min); break;
      case 2: Bf16PvRowBlock<2>(rows + r0, src, d, 0, n_min); break;
      case 3: Bf16PvRowBlock<3>(rows + r0, src, d, 0, n_min); break;
      case 4: Bf16PvRowBlock<4>(rows + r0, src, d, 0, n_min); break;
      case 5: Bf16PvRowBlock<5>(rows + r0, src, d, 0, n_min); break;
      default: Bf16PvRowBlock<6>(rows + r0, src, d, 0, n_min); break;
    }
    for (int32_t r = r0; r < r0 + rb; ++r) {
      if (rows[r].n > n_min) Bf16PvRowBlock<1>(rows + r, src, d, n_min, rows[r].n);
    }
  }
}

// AttnRowsChunk's bf16 arithmetic with vdpbf16ps (block_size 16, d % 16 == 0). A few rows
// (decode) pair K and V in registers as they read the pool; more (a prefill tile) pair the
// chunk once into kvbuf ([kAttnChunk][d] floats: room for both bf16 copies).
SPECD_BF16_TARGET void Bf16RowsChunk(const AttnArgs& a, int32_t t, int32_t h, int64_t j0, int64_t j1,
                                     AttnRow* rows, int32_t R, float* kvbuf) {
  const PagedKvLayer& kv = *a.kv;
  const int32_t d = kv.head_dim;
  int64_t blocks[kAttnChunk / 16];
  ChunkBlocks(a.block_tables[t], j0, j1, blocks);
  Bf16Pool pool;
  pool.d = d;
  for (int b = 0; b < kAttnChunk / 16; ++b) {
    const int64_t block = blocks[b];
    pool.kblk[b] = static_cast<const uint16_t*>(kv.k) + kv.KIndex(block, 0, h, 0);
    pool.vblk[b] = static_cast<const uint16_t*>(kv.v) + kv.VIndex(block, 0, h);
  }
  if (R <= kAttnRowBlock) return Bf16Rows(a, pool, d, rows, R);
  uint16_t* kp = reinterpret_cast<uint16_t*>(kvbuf);
  Bf16Staged staged{kp, kp + static_cast<int64_t>(kAttnChunk) * d, d};
  staged.Stage(pool, j1 - j0);
  Bf16Rows(a, staged, d, rows, R);
}

// The int8 KV cache natively (kernels/kv_int8.h): each score an integer dot product of the
// codes by vpdpbusd, and p V one too, of the weights' unsigned codes and V's codes. The float
// path (ScratchK<true, true>, PoolKv<kInt8>, CodeRowWeights) gives the same bits: its sums of
// codes are exact too. Needs AVX-512 VNNI only (not BF16).

// vpdpbusd takes its first operand unsigned: K's codes go in as code + 128, and each score
// takes back 128 * (the sum of q's codes).
// From a K slab's dims 4i .. 4i + 3 ([4][16 keys], 64 bytes) to [16 keys][4 dims]: dwords
// (4g + r) <- (4r + g), then in each 128-bit lane bytes (4jj + r) <- (4r + jj).
alignas(64) constexpr int32_t kQuadDwords[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
alignas(64) constexpr int8_t kQuadBytes[64] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                               0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                               0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                               0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};

// Dims 4 i4 .. 4 i4 + 3 of a K slab's 16 keys (slab: [d][16] int8): dword j = key j's four
// codes, each + 128.
inline __m512i KCodeQuad(const int8_t* slab, int32_t i4) {
  const __m512i x = _mm512_loadu_si512(slab + static_cast<int64_t>(i4) * 64);
  const __m512i y = _mm512_permutexvar_epi32(_mm512_load_si512(kQuadDwords), x);
  return _mm512_xor_si512(_mm512_shuffle_epi8(y, _mm512_load_si512(kQuadBytes)), _mm512_set1_epi8(-128));
}

// The V codes of 4 consecutive keys (rows v, v + d, v + 2d, v + 3d) at 64 dims as 4 quads:
// dword lane i of q[u] holds the 4 keys' codes of dim 16 (i / 4) + 4 u + i % 4 (the unpacks
// work within 128-bit lanes). UnpermuteQuadColumns puts sums over them back in dim order.
inline void VCodeQuads(const int8_t* v, int32_t d, __m512i (&q)[4]) {
  const __m512i k0 = _mm512_loadu_si512(v), k1 = _mm512_loadu_si512(v + d);
  const __m512i k2 = _mm512_loadu_si512(v + 2 * d), k3 = _mm512_loadu_si512(v + 3 * d);
  const __m512i lo01 = _mm512_unpacklo_epi8(k0, k1), hi01 = _mm512_unpackhi_epi8(k0, k1);
  const __m512i lo23 = _mm512_unpacklo_epi8(k2, k3), hi23 = _mm512_unpackhi_epi8(k2, k3);
  q[0] = _mm512_unpacklo_epi16(lo01, lo23);
  q[1] = _mm512_unpackhi_epi16(lo01, lo23);
  q[2] = _mm512_unpacklo_epi16(hi01, hi23);
  q[3] = _mm512_unpackhi_epi16(hi01, hi23);
}

// f[u] laid out as VCodeQuads' q[u] -> f[n] = dims [16 n, 16 n + 16): a 4 x 4 transpose of
// 128-bit blocks (f[n]'s block u is the old f[u]'s block n).
inline void UnpermuteQuadColumns(__m512 (&f)[4]) {
  const __m512 t0 = _mm512_shuffle_f32x4(f[0], f[1], 0x44);
  const __m512 t1 = _mm512_shuffle_f32x4(f[2], f[3], 0x44);
  const __m512 t2 = _mm512_shuffle_f32x4(f[0], f[1], 0xEE);
  const __m512 t3 = _mm512_shuffle_f32x4(f[2], f[3], 0xEE);
  f[0] = _mm512_shuffle_f32x4(t0, t1, 0x88);
  f[1] = _mm512_shuffle_f32x4(t0, t1, 0xDD);
  f[2] = _mm512_shuffle_f32x4(t2, t3, 0x88);
  f[3] = _mm512_shuffle_f32x4(t2, t3, 0xDD);
}

inline int32_t Ld32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// acc += the dword dot products of u (unsigned bytes) and s (signed): vpdpbusd written out,
// since GCC keeps a copy of every intrinsic's accumulator on the stack in Int8ScoresBlock's
// loop (24 of them), and the loop then ran at the speed of those stores.
inline void DpBusd(__m512i& acc, __m512i u, __m512i s) {
  __asm__("vpdpbusd %[s], %[u], %[acc]" : [acc] "+v"(acc) : [u] "v"(u), [s] "v"(s));
}

// Int8Pool: the chunk's blocks straight from the pool (decode: a few rows). kblk[b]: block b's
// K slab [d][16]; vblk[b]: its V rows [16][d]; ks[b], vs[b]: its 16 K and V scales. Blocks
// past the chunk's end are its first (finite, never used).
struct Int8Pool {
  const int8_t* kblk[kAttnChunk / 16];
  const int8_t* vblk[kAttnChunk / 16];
  const float* ks[kAttnChunk / 16];
  const float* vs[kAttnChunk / 16];
  int32_t d;
  __m512i KQuad(int u, int32_t i4) const { return KCodeQuad(kblk[u], i4); }
  __m512 KScale(int u) const { return _mm512_loadu_ps(ks[u]); }
  // Keys 4 k4 .. 4 k4 + 3 (one block holds all 4) at dims [c, c + 64): VCodeQuads.
  void VQuads(int32_t k4, int32_t c, __m512i (&q)[4]) const {
    VCodeQuads(vblk[k4 >> 2] + (4 * k4 & 15) * d + c, d, q);
  }
};
// Int8Staged: the chunk's K quads and V quads built once in scratch, for a prefill tile's rows.
// kq: [d / 4][4 blocks][64 bytes]; vq: [16 key quads][d / 64][4][64 bytes] (VCodeQuads' q);
// ks: [kAttnChunk].
struct Int8Staged {
  int8_t* kq;
  int8_t* vq;
  float* ks;
  int32_t d;
  void StageK(const Int8Pool& pool) {
    for (int32_t i4 = 0; i4 < d / 4; ++i4) {
      for (int u = 0; u < kAttnChunk / 16; ++u) _mm512_storeu_si512(kq + (i4 * 4 + u) * 64, pool.KQuad(u, i4));
    }
    for (int u = 0; u < kAttnChunk / 16; ++u) std::memcpy(ks + 16 * u, pool.ks[u], 16 * sizeof(float));
  }
  void StageV(const Int8Pool& pool, int64_t nkeys) {
    for (int32_t k4 = 0; 4 * k4 < nkeys; ++k4) {
      for (int32_t c = 0; c < d; c += 64) {
        __m512i q[4];
        pool.VQuads(k4, c, q);
        for (int u = 0; u < 4; ++u) _mm512_storeu_si512(VAt(k4, c) + 64 * u, q[u]);
      }
    }
  }
  int8_t* VAt(int32_t k4, int32_t c) const {
    return vq + (static_cast<int64_t>(k4) * (d / 64) + c / 64) * 256;
  }
  __m512i KQuad(int u, int32_t i4) const { return _mm512_loadu_si512(kq + (i4 * 4 + u) * 64); }
  __m512 KScale(int u) const { return _mm512_loadu_ps(ks + 16 * u); }
  void VQuads(int32_t k4, int32_t c, __m512i (&q)[4]) const {
    for (int u = 0; u < 4; ++u) q[u] = _mm512_loadu_si512(VAt(k4, c) + 64 * u);
  }
};

// rows[r].s[0, 64) = Int8Score of each key for RB rows (keys past the chunk's end are
// computed, never used). qc[r]: row r's codes [d]; qsum[r]: their sum.
template <int RB, class Src>
void Int8ScoresBlock(const AttnRow* rows, const int8_t* const* qc, const int32_t* qsum, const Src& src,
                     int32_t d) {
  __m512i acc[RB][4];
#pragma GCC unroll 8
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) acc[r][u] = _mm512_setzero_si512();
  }
  for (int32_t i4 = 0; i4 < d / 4; ++i4) {
    __m512i k[4];
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) k[u] = src.KQuad(u, i4);
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r) {
      const __m512i qb = _mm512_set1_epi32(Ld32(qc[r] + 4 * i4));
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) DpBusd(acc[r][u], k[u], qb);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < RB; ++r) {
    const __m512i corr = _mm512_set1_epi32(128 * qsum[r]);
    const __m512 qss = _mm512_set1_ps(rows[r].qss);
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      const __m512 isum = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][u], corr));
      _mm512_storeu_ps(rows[r].s + u * 16, _mm512_mul_ps(isum, _mm512_mul_ps(src.KScale(u), qss)));
    }
  }
}

template <int RB, class Src>
void Int8ScoresRowBlock(const AttnArgs& a, const AttnRow* rows, const Src& src, int32_t d) {
  const int8_t* qc[RB];
  int32_t qsum[RB];
  for (int r = 0; r < RB; ++r) {
    const int64_t at = rows[r].q - a.q;
    qc[r] = a.q_i8 + at;
    qsum[r] = a.q_code_sum[at / d];
  }
  Int8ScoresBlock<RB>(rows, qc, qsum, src, d);
}

template <class Src>
void Int8ScoresRows(const AttnArgs& a, const AttnRow* rows, int32_t R, const Src& src, int32_t d) {
  ForRowBlocks(R, [&]<int RB>(int32_t r0) { Int8ScoresRowBlock<RB>(a, rows + r0, src, d); });
}

// GCC 12 reports the _mm512_undefined_ps() inside _mm512_max_ps and other intrinsics as used
// uninitialized in the two functions below (a false positive of its inlining).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
// A row's weights w = p * vs ([kAttnChunk] floats over its s) as their codes, packed as bytes
// over s (CodeRowWeights' codes; bytes [n, kAttnChunk) zero), and its wscale. wm: the running
// max of its w (as PWeightInverse asks: from 0, NaN ignored).
void PackRowWeightCodes(AttnRow& row, __m512 wm) {
  const float wmax = Hmax16(wm);  // no NaN in wm: any order gives the same max
  const __m512 inv = _mm512_set1_ps(PWeightInverse(wmax));
  int8_t* out = reinterpret_cast<int8_t*>(row.s);
  // PWeightCode's clamps change no code here: w * inv is NaN or in [0, 255 (1 + 2^-22)], so
  // the nearest-even conversion gives 0 .. 255, or NaN's 0x80000000, which vpmovdb's
  // truncation takes to 0.
#pragma GCC unroll 4
  for (int b = 0; b < kAttnChunk / 16; ++b) {  // bytes [16 b, 16 b + 16): floats < 16 b read
    const __mmask16 live = FirstLanes16(row.n - 16 * b);
    const __m512 wi = Vec16::Mul(Vec16::Load(row.s + 16 * b), inv);
    const __m512i code =
        _mm512_maskz_cvt_roundps_epi32(live, wi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m128i bytes = _mm512_mask_cvtepi32_epi8(_mm_setzero_si128(), 0xFFFF, code);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16 * b), bytes);
  }
  row.wscale = PWeightScale(wmax);
}

// Each row's score max and exp-sum, then its weights' codes (CodeRowWeights' values, packed
// by PackRowWeightCodes). vs: [kAttnChunk] the chunk's V scales.
void Int8RowsSoftmaxCodes(AttnRow* rows, int32_t R, const float* vs) {
  int32_t r = ForFullRowRuns(rows, R, [&]<int NR>(int32_t r0) {  // interleaved, w made with the exps
    __m512 wm[NR] = {};  // zeros
    FullRowsSoftmaxParts<NR>(rows + r0, [&](int k, int b, __m512 e) {
      const __m512 w = _mm512_mul_ps(e, _mm512_loadu_ps(vs + 16 * b));
      _mm512_storeu_ps(rows[r0 + k].s + 16 * b, w);
      wm[k] = Vec16::Max(w, wm[k]);
    });
    for (int k = 0; k < NR; ++k) PackRowWeightCodes(rows[r0 + k], wm[k]);
  });
  RowsSoftmaxParts(rows + r, R - r);
  for (; r < R; ++r) {
    __m512 wm = _mm512_setzero_ps();
    for (int64_t j = 0; j < rows[r].n; j += 16) {
      const __mmask16 live = FirstLanes16(rows[r].n - j);
      const __m512 w = _mm512_maskz_mul_ps(live, Vec16::Load(rows[r].s + j), Vec16::Load(vs + j));
      _mm512_storeu_ps(rows[r].s + j, w);
      wm = Vec16::Max(w, wm);
    }
    PackRowWeightCodes(rows[r], wm);
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// rows[r].o[c0, c0 + 64) = wscale_r * sum over the first 4 nq keys of wc_rj * v_j (codes; a
// row's codes past its n are 0) for RB rows.
template <int RB, class Src>
void Int8PvBlock(const AttnRow* rows, const Src& src, int32_t c0, int32_t nq) {
  __m512i acc[RB][4];
#pragma GCC unroll 8
  for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) acc[r][u] = _mm512_setzero_si512();
  }
  for (int32_t k4 = 0; k4 < nq; ++k4) {
    __m512i v[4];
    src.VQuads(k4, c0, v);
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r) {
      const int8_t* codes = reinterpret_cast<const int8_t*>(rows[r].s);
      const __m512i wc = _mm512_set1_epi32(Ld32(codes + 4 * k4));
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) DpBusd(acc[r][u], wc, v[u]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < RB; ++r) {
    const __m512 sc = _mm512_set1_ps(rows[r].wscale);
    __m512 f[4];
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) f[u] = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][u]), sc);
    UnpermuteQuadColumns(f);
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) _mm512_storeu_ps(rows[r].o + c0 + 16 * u, f[u]);
  }
}

// p V for rows whose weights are packed as codes (Int8RowsSoftmaxCodes), d % 64 == 0. A block
// of rows takes the key quads up to its longest row's.
template <class Src>
void Int8PvRows(const AttnRow* rows, int32_t R, const Src& src, int32_t d) {
  ForRowBlocks(R, [&]<int RB>(int32_t r0) {
    int64_t n_max = 0;
    for (int r = r0; r < r0 + RB; ++r) n_max = rows[r].n > n_max ? rows[r].n : n_max;
    const int32_t nq = static_cast<int32_t>((n_max + 3) / 4);
    for (int32_t c = 0; c < d; c += 64) Int8PvBlock<RB>(rows + r0, src, c, nq);
  });
}

// AttnRowsChunk's int8 arithmetic natively (block_size 16, d % 64 == 0, AVX-512 VNNI). A few
// rows (decode) read the pool's blocks; more (a prefill tile) stage the chunk once in kvbuf
// ([kAttnChunk][d + 2] floats: the K quads, then the V quads, then the K scales).
void Int8RowsChunk(const AttnArgs& a, int32_t t, int32_t h, int64_t j0, int64_t j1, AttnRow* rows,
                   int32_t R, float* kvbuf) {
  const PagedKvLayer& kv = *a.kv;
  const int32_t d = kv.head_dim;
  int64_t blocks[kAttnChunk / 16];
  ChunkBlocks(a.block_tables[t], j0, j1, blocks);
  Int8Pool pool;
  pool.d = d;
  alignas(64) float vs[kAttnChunk];
  for (int b = 0; b < kAttnChunk / 16; ++b) {
    const int64_t block = blocks[b];
    pool.kblk[b] = static_cast<const int8_t*>(kv.k) + kv.KIndex(block, 0, h, 0);
    pool.vblk[b] = static_cast<const int8_t*>(kv.v) + kv.VIndex(block, 0, h);
    pool.ks[b] = kv.k_scale + kv.SIndex(block, 0, h);
    pool.vs[b] = kv.v_scale + kv.SIndex(block, 0, h);
    std::memcpy(vs + 16 * b, pool.vs[b], 16 * sizeof(float));
  }
  if (R <= kAttnRowBlock) {
    Int8ScoresRows(a, rows, R, pool, d);
    Int8RowsSoftmaxCodes(rows, R, vs);
    Int8PvRows(rows, R, pool, d);
    return;
  }
  // kq: d * 64 bytes (16 d floats), vq: the same, ks after kvbuf's rows.
  Int8Staged staged{reinterpret_cast<int8_t*>(kvbuf), reinterpret_cast<int8_t*>(kvbuf + 16 * d),
                    kvbuf + static_cast<int64_t>(kAttnChunk) * d, d};
  staged.StageK(pool);
  Int8ScoresRows(a, rows, R, staged, d);
  Int8RowsSoftmaxCodes(rows, R, vs);
  staged.StageV(pool, j1 - j0);
  Int8PvRows(rows, R, staged, d);
}
#endif  // SPECD_X8_DOT == 1

// Raw partials of keys [j0, j1) of kv head h for rows[0, R): query rows of one sequence
// (t: any of its tokens, for the block table). Scores, then each row's max and exp-sum,
// then p V. With prefetched, the caller has already requested this chunk; with next_end >
// j1, the keys [j1, next_end) come next and are requested now, to arrive during this
// chunk's arithmetic.  kvbuf: [kAttnChunk][d], holding K^T and then V, then [2][kAttnChunk]
// for int8's K and V scales.
void AttnRowsChunk(const AttnArgs& a, int32_t t, int32_t h, int64_t j0, int64_t j1, AttnRow* rows,
                   int32_t R, float* kvbuf, bool prefetched, int64_t next_end) {
  const int32_t d = a.kv->head_dim;
  if (!prefetched) PrefetchKvChunk(a, t, h, j0, j1);
  if (next_end > j1) PrefetchKvChunk(a, t, h, j1, next_end < j1 + kAttnChunk ? next_end : j1 + kAttnChunk);
  const PagedKvLayer& kv = *a.kv;
#if SPECD_X8_DOT == 1
  if (kv.dtype == KvDtype::kInt8 && kv.block_size == 16 && j0 % 16 == 0 && d % 64 == 0) {
    return Int8RowsChunk(a, t, h, j0, j1, rows, R, kvbuf);
  }
#endif
  if (R <= kPoolRowsMax && kv.block_size == 16 && j0 % 16 == 0) {  // decode, verification: a few rows
    if (kv.dtype == KvDtype::kF16) return PoolRowsChunk<KvDtype::kF16>(a, t, h, j0, j1, rows, R);
    if (kv.dtype == KvDtype::kInt8) return PoolRowsChunk<KvDtype::kInt8>(a, t, h, j0, j1, rows, R);
  }
  if (kv.dtype == KvDtype::kBF16) {
#if SPECD_X8_DOT == 1
    if (a.bf16_dot && kv.block_size == 16 && j0 % 16 == 0 && d % 16 == 0) return Bf16RowsChunk(a, t, h, j0, j1, rows, R, kvbuf);
#endif
    // bf16 attention without the instruction: its arithmetic on f32 FMAs (the same bits).
    LoadKChunkT(a, t, h, j0, j1, kvbuf, nullptr);
    ScoresRows(rows, R, ScratchK<true>{kvbuf}, d, a.scale);
    RowsSoftmaxParts(rows, R);
    RoundRowsToBf16(rows, R);
    LoadVChunk(a, t, h, j0, j1, kvbuf, nullptr);
    PvRows(rows, R, ScratchV<true>{kvbuf, d}, d);
    return;
  }
  if (kv.dtype == KvDtype::kInt8) {  // the codes' arithmetic (kernels/kv_int8.h) on f32 FMAs
    float* ks = kvbuf + static_cast<int64_t>(kAttnChunk) * d;
    float* vs = ks + kAttnChunk;
    LoadKChunkT(a, t, h, j0, j1, kvbuf, ks);
    ScoresRows(rows, R, ScratchK<true, true>{kvbuf, ks}, d, a.scale);
    RowsSoftmaxParts(rows, R);
    LoadVChunk(a, t, h, j0, j1, kvbuf, vs);
    CodeRowWeights(rows, R, vs);
    PvRows(rows, R, ScratchV<>{kvbuf, d}, d);
    ScaleRowOutputs(rows, R, d);
    return;
  }
  LoadKChunkT(a, t, h, j0, j1, kvbuf, nullptr);
  ScoresRows(rows, R, ScratchK<>{kvbuf}, d, a.scale);
  RowsSoftmaxParts(rows, R);
  LoadVChunk(a, t, h, j0, j1, kvbuf, nullptr);
  PvRows(rows, R, ScratchV<>{kvbuf, d}, d);
}

// Raw partial of keys [j0, j1) (at most kAttnChunk) for the pair (t, h):
// part = o[group][d], m[group], l[group].  s: [group][kAttnChunk]  rows: [group]
void AttnChunk(const AttnArgs& a, int32_t t, int32_t h, int64_t j0, int64_t j1, float* kvbuf,
               float* s, AttnRow* rows, float* part, bool prefetched, int64_t next_end) {
  const int32_t d = a.kv->head_dim;
  const int32_t group = a.num_q_heads / a.kv->num_kv_heads;
  const int64_t qrow = static_cast<int64_t>(t) * a.num_q_heads + static_cast<int64_t>(h) * group;
  const float* qh = a.q + qrow * d;
  float* m = part + static_cast<int64_t>(group) * d;
  for (int32_t g = 0; g < group; ++g) {
    rows[g] = AttnRow{qh + static_cast<int64_t>(g) * d, j1 - j0, s + static_cast<int64_t>(g) * kAttnChunk,
                      part + static_cast<int64_t>(g) * d, m + g, m + group + g,
                      a.q_score_scale != nullptr ? a.q_score_scale[qrow + g] : 0.0f, 0.0f};
  }
  AttnRowsChunk(a, t, h, j0, j1, rows, group, kvbuf, prefetched, next_end);
}

// Folds the next chunk's partial into state (the first chunk is copied): rescales both
// to the larger max and adds.
void AttnFold(bool first, const float* part, float* state, int32_t group, int32_t d) {
  const int64_t od = static_cast<int64_t>(group) * d;
  if (first) {
    std::memcpy(state, part, sizeof(float) * (od + 2 * group));
    return;
  }
  for (int32_t g = 0; g < group; ++g) {
    float ws, wp;
    AttnFoldScales(part, state, group, d, g, &ws, &wp);
    float* so = state + static_cast<int64_t>(g) * d;
    const float* po = part + static_cast<int64_t>(g) * d;
    int32_t i = 0;
#if SPECD_X8_DOT == 1  // 16 lanes at a time: each lane's operations are the same
    const __m512 wsv16 = _mm512_set1_ps(ws), wpv16 = _mm512_set1_ps(wp);
    for (; i + 16 <= d; i += 16) {
      const __m512 pv = _mm512_mul_ps(_mm512_loadu_ps(po + i), wpv16);
      _mm512_storeu_ps(so + i, _mm512_fmadd_ps(_mm512_loadu_ps(so + i), wsv16, pv));
    }
#endif
    const __m256 wsv = _mm256_set1_ps(ws), wpv = _mm256_set1_ps(wp);
    for (; i < d; i += 8) {
      const __m256 pv = _mm256_mul_ps(_mm256_loadu_ps(po + i), wpv);
      _mm256_storeu_ps(so + i, _mm256_fmadd_ps(_mm256_loadu_ps(so + i), wsv, pv));
    }
  }
}

// Output rows of the pair (t, h) = o / l.
void AttnFinish(const AttnArgs& a, int32_t t, int32_t h, const float* state) {
  const int32_t d = a.kv->head_dim, group = a.num_q_heads / a.kv->num_kv_heads;
  for (int32_t g = 0; g < group; ++g) {
    const __m256 inv = _mm256_set1_ps(1.0f / state[static_cast<int64_t>(group) * d + group + g]);
    float* dst = a.out + (static_cast<int64_t>(t) * a.num_q_heads + static_cast<int64_t>(h) * group + g) * d;
    for (int32_t i = 0; i < d; i += 8) {
      _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_loadu_ps(state + static_cast<int64_t>(g) * d + i), inv));
    }
  }
}

// A tile: the queries it.t .. it.t + it.tokens - 1 (consecutive positions of one sequence)
// against kv head it.h. Each key chunk is loaded once for every query row of the tile that
// sees it, and the score and PV kernels share each K and V load across blocks of rows; every
// row's arithmetic is still exactly what it gets alone (see "The attention arithmetic"
// above), and each query folds its chunks into its own state in order, so its output is
// bitwise the same. An item of a split tile (it.partial >= 0) computes its one chunk and
// stores each query's raw partial for the merge pass, which folds them in the same order.
// kvbuf: [kAttnChunk][d + 2]  s: [tile][group][kAttnChunk]  parts, states: [tile][group][d + 2]
// rows: [tile * group]
void AttnTile(const AttnArgs& a, const AttnItem& it, float* kvbuf, float* s, float* parts,
              float* states, AttnRow* rows, bool prefetched) {
  const int32_t d = a.kv->head_dim, group = a.num_q_heads / a.kv->num_kv_heads;
  const int64_t pf = AttnPartialFloats(group, d), sf = static_cast<int64_t>(group) * kAttnChunk;
  const int32_t t0 = it.t, h = it.h;
  const bool stored = it.partial >= 0;
  const int64_t longest = static_cast<int64_t>(a.positions[t0 + it.tokens - 1]) + 1;
  const int64_t end = stored && static_cast<int64_t>(it.c1) * kAttnChunk < longest
                          ? static_cast<int64_t>(it.c1) * kAttnChunk
                          : longest;
  for (int64_t j0 = static_cast<int64_t>(it.c0) * kAttnChunk; j0 < end; j0 += kAttnChunk) {
    const int64_t j1 = j0 + kAttnChunk < end ? j0 + kAttnChunk : end;
    int32_t R = 0, first_query = -1;
    for (int32_t k = 0; k < it.tokens; ++k) {
      const int64_t len = static_cast<int64_t>(a.positions[t0 + k]) + 1;
      if (j0 >= len) continue;  // this chunk lies past the query (causal)
      if (first_query < 0) first_query = k;
      const int64_t qrow = static_cast<int64_t>(t0 + k) * a.num_q_heads + static_cast<int64_t>(h) * group;
      const float* qh = a.q + qrow * d;
      float* part = stored ? a.partials + (it.partial + k) * pf : parts + k * pf;
      float* m = part + static_cast<int64_t>(group) * d;
      for (int32_t g = 0; g < group; ++g) {
        rows[R++] = AttnRow{qh + static_cast<int64_t>(g) * d, (j1 < len ? j1 : len) - j0,
                            s + k * sf + static_cast<int64_t>(g) * kAttnChunk,
                            part + static_cast<int64_t>(g) * d, m + g, m + group + g,
                            a.q_score_scale != nullptr ? a.q_score_scale[qrow + g] : 0.0f, 0.0f};
      }
    }
    AttnRowsChunk(a, t0, h, j0, j1, rows, R, kvbuf, /*prefetched=*/stored ? prefetched : j0 > 0, stored ? 0 : longest);
    if (stored) continue;
    for (int32_t k = first_query; k < it.tokens; ++k) {
      AttnFold(j0 == 0, parts + k * pf, states + k * pf, group, d);
    }
  }
  if (stored) return;
  for (int32_t k = 0; k < it.tokens; ++k) AttnFinish(a, t0 + k, h, states + k * pf);
}

void Attention(const AttnArgs& a, int64_t i0, int64_t i1, float* scratch) {
  const int32_t d = a.kv->head_dim, group = a.num_q_heads / a.kv->num_kv_heads;
  float* kvbuf = scratch;  // and int8's scales after it
  float* s = kvbuf + static_cast<int64_t>(kAttnChunk) * (d + 2);
  float* parts = s + static_cast<int64_t>(kAttnTile) * group * kAttnChunk;
  float* states = parts + kAttnTile * AttnPartialFloats(group, d);
  // The row descriptors go last, 64-byte aligned (AttnScratchFloats keeps room for them).
  const uintptr_t rows_at = reinterpret_cast<uintptr_t>(states + kAttnTile * AttnPartialFloats(group, d));
  AttnRow* rows = reinterpret_cast<AttnRow*>((rows_at + 63) & ~uintptr_t{63});
  // A stored partial is one chunk (a split decode or verification): this thread's items run
  // in order, so each requests the chunk two items ahead (the first item also the next one),
  // and its own chunk was requested by the items before it.
  const auto prefetch_ahead = [&](int64_t i) {
    if (i == i0 && i + 1 < i1 && a.items[i + 1].partial >= 0) PrefetchItemChunk(a, a.items[i + 1]);
    if (i + 2 < i1 && a.items[i + 2].partial >= 0) PrefetchItemChunk(a, a.items[i + 2]);
  };
  for (int64_t i = i0; i < i1; ++i) {
    if (a.items[i].tokens > 1) {
      if (a.items[i].partial >= 0) prefetch_ahead(i);
      AttnTile(a, a.items[i], kvbuf, s, parts, states, rows, /*prefetched=*/a.items[i].partial >= 0 && i > i0);
      continue;
    }
    RunAttnItems(
        a, i, i + 1, parts, states,
        [&](int32_t t, int32_t h, int64_t j0, int64_t j1, float* p) {
          // An item folding all of its pair's chunks fetches each next chunk one ahead.
          if (a.items[i].partial < 0) {
            AttnChunk(a, t, h, j0, j1, kvbuf, s, rows, p, /*prefetched=*/j0 > 0,
                      static_cast<int64_t>(a.positions[t]) + 1);
            return;
          }
          prefetch_ahead(i);
          AttnChunk(a, t, h, j0, j1, kvbuf, s, rows, p, /*prefetched=*/i > i0, 0);
        },
        [&](bool first, const float* p, float* st) { AttnFold(first, p, st, group, d); },
        [&](int32_t t, int32_t h, const float* st) { AttnFinish(a, t, h, st); });
  }
}

void AttentionMerge(const AttnArgs& a, int64_t i0, int64_t i1, float* scratch) {
  const int32_t d = a.kv->head_dim, group = a.num_q_heads / a.kv->num_kv_heads;
  RunAttnMerges(
      a, i0, i1, scratch,
      [&](bool first, const float* p, float* st) { AttnFold(first, p, st, group, d); },
      [&](int32_t t, int32_t h, const float* st) { AttnFinish(a, t, h, st); });
}

// QuantizeKvRow (kernels/kv_int8.h) on 8 lanes, the same codes and scales (d % 8 == 0): the
// max of |x| ignores NaN as std::fmax does (max_ps returns its second operand for a NaN), a
// NaN product gives code 0, codes round to nearest even and clamp to +-127.
void QuantizeKvRows(const float* x, int64_t rows, int32_t d, int8_t* codes, float* code_floats,
                    int32_t* code_sums, float* scales) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    int8_t* cr = codes + r * d;
    __m256 m = _mm256_setzero_ps();
    for (int32_t i = 0; i < d; i += 8) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xr + i), abs_mask), m);
    const float amax = HmaxPs(m);
    const __m256 inv = _mm256_set1_ps(KvInverseScale(amax));
    __m256i sum = _mm256_setzero_si256();
    for (int32_t i = 0; i < d; i += 8) {
      __m256 c = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      c = _mm256_and_ps(c, _mm256_cmp_ps(c, c, _CMP_ORD_Q));  // NaN -> 0
      c = _mm256_min_ps(_mm256_max_ps(c, lo), hi);
      const __m256i ci = _mm256_cvtps_epi32(c);
      // From the integers: a small negative rounds to -0, whose code reads back as +0.
      if (code_floats != nullptr) _mm256_storeu_ps(code_floats + r * d + i, _mm256_cvtepi32_ps(ci));
      sum = _mm256_add_epi32(sum, ci);
      const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(ci), _mm256_extracti128_si256(ci, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(cr + i), _mm_packs_epi16(w, w));
    }
    scales[r] = amax / 127.0f;
    if (code_sums != nullptr) code_sums[r] = HsumEpi32(sum);
  }
}

float FmaProbe(int64_t iters, int64_t* flops) {
  constexpr int kChains = 12;  // > latency x ports: the FMA units never wait
  typename AttnVec::F acc[kChains];
  for (int u = 0; u < kChains; ++u) acc[u] = AttnVec::Set1(static_cast<float>(u));
  const typename AttnVec::F a = AttnVec::Set1(0.999f), b = AttnVec::Set1(1e-3f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int u = 0; u < kChains; ++u) acc[u] = AttnVec::Fma(acc[u], a, b);
  }
  *flops += iters * kChains * AttnVec::kW * 2;
  alignas(64) float lanes[AttnVec::kW];
  float sum = 0;
  for (int u = 0; u < kChains; ++u) {
    AttnVec::Store(lanes, acc[u]);
    for (float x : lanes) sum += x;
  }
  return sum;
}

const Backend kBackend = {
    QuantizeAct, MatMulQ, MatMulF, RmsNormRows, SwiGluRange, SoftmaxRow, Attention, AttentionMerge, ToF16,
    MatMulQPacked, QuantizeKvRows, FmaProbe,
};

}  // namespace

#if SPECD_X8_DOT == 0
const Backend* Avx2Backend() { return &kBackend; }
#elif SPECD_X8_DOT == 1
const Backend* Avx512VnniBackend() { return &kBackend; }
#elif SPECD_X8_DOT == 2
const Backend* VnniEmulatedBackend() { return &kBackend; }
#elif SPECD_X8_DOT == 3
const Backend* AvxVnniBackend() { return &kBackend; }
#else
const Backend* AvxVnniEmulatedBackend() { return &kBackend; }
#endif

}  // namespace specd::kernels::cpu::internal
