#include "kernels/cpu/matmul_exact.h"

#include <cpuid.h>
#include <immintrin.h>

#include <vector>

#include "kernels/ref/ops.h"

namespace specd::kernels::cpu {
namespace {

// Plain dot, four interleaved partial sums combined in a fixed order.
float DotGeneric(const float* a, const float* b, int64_t n) {
  float s[4] = {0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 4 <= n; k += 4) {
    for (int j = 0; j < 4; ++j) s[j] += a[k + j] * b[k + j];
  }
  float r = (s[0] + s[1]) + (s[2] + s[3]);
  for (; k < n; ++k) r += a[k] * b[k];
  return r;
}

__attribute__((target("avx2,fma"))) float DotAvx2(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8), acc1);
  }
  for (; k + 8 <= n; k += 8) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc0);
  }
  const __m256 acc = _mm256_add_ps(acc0, acc1);
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  float r = _mm_cvtss_f32(lo);
  for (; k < n; ++k) r += a[k] * b[k];
  return r;
}

// Fast dequantizers for the types real files use most, bitwise equal to ref::DequantizeRow
// (w = d * q + m with a separate multiply and add; the library builds with -ffp-contract=off).
// Q8_0 block: {f16 d, int8 q[32]}.
__attribute__((target("avx2,fma,f16c"))) void DequantQ8_0Avx2(const uint8_t* row, int64_t n,
                                                               float* dst) {
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 32; ++b) {
    const uint8_t* blk = row + b * 34;
    uint16_t dh;
    __builtin_memcpy(&dh, blk, 2);
    const __m256 d = _mm256_set1_ps(ref::F16ToF32(dh));
    for (int j = 0; j < 32; j += 8) {
      const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + j));
      const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
      _mm256_storeu_ps(dst + b * 32 + j, _mm256_add_ps(_mm256_mul_ps(d, q), zero));
    }
  }
}

// Q4_1 block: {f16 d, f16 m, u8 q[16]}; element j < 16 is q[j] & 15, element 16 + j is q[j] >> 4.
__attribute__((target("avx2,fma,f16c"))) void DequantQ4_1Avx2(const uint8_t* row, int64_t n,
                                                               float* dst) {
  const __m128i mask = _mm_set1_epi8(0x0F);
  for (int64_t b = 0; b < n / 32; ++b) {
    const uint8_t* blk = row + b * 20;
    uint16_t dh, mh;
    __builtin_memcpy(&dh, blk, 2);
    __builtin_memcpy(&mh, blk + 2, 2);
    const __m256 d = _mm256_set1_ps(ref::F16ToF32(dh));
    const __m256 m = _mm256_set1_ps(ref::F16ToF32(mh));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 4));
    const __m128i lo = _mm_and_si128(q, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int j = 0; j < 4; ++j) {
      const __m256 qf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[j]));
      _mm256_storeu_ps(dst + b * 32 + j * 8, _mm256_add_ps(_mm256_mul_ps(d, qf), m));
    }
  }
}

bool HaveAvx2() {
  static const bool have = [] {
    // F16C via cpuid: clang 14's __builtin_cpu_supports does not know "f16c".
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  }();
  return have;
}

void DequantizeRowFast(const WeightMatrix& w, int64_t n, float* dst) {
  const uint8_t* row = w.data + n * w.row_bytes;
  if (HaveAvx2() && w.type == gguf::GgmlType::kQ4_1) return DequantQ4_1Avx2(row, w.cols, dst);
  if (HaveAvx2() && w.type == gguf::GgmlType::kQ8_0) return DequantQ8_0Avx2(row, w.cols, dst);
  ref::DequantizeRow(w.type, row, w.cols, dst);
}

}  // namespace

void MatMulExact(ThreadPool& pool, const WeightMatrix& w, const float* x, int64_t T, float* y) {
  auto dot = HaveAvx2() ? DotAvx2 : DotGeneric;
  pool.ParallelFor(
      w.rows,
      [&](int64_t n0, int64_t n1) {
        thread_local std::vector<float> row;  // grows once per thread, then reused
        if (static_cast<int64_t>(row.size()) < w.cols) row.resize(w.cols);
        for (int64_t n = n0; n < n1; ++n) {
          DequantizeRowFast(w, n, row.data());
          for (int64_t t = 0; t < T; ++t) y[t * w.rows + n] = dot(row.data(), x + t * w.cols, w.cols);
        }
      },
      16);
}

}  // namespace specd::kernels::cpu
