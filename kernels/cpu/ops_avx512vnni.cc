// The AVX-512 VNNI backend: ops_avx2.cc's kernels with the quantized MatMul's int8 dot done
// by vpdpbusd, on 512-bit vectors of 16 weight rows for batches (T > 1) and 256-bit ones
// (AVX512VL) for single tokens. Built with -mavx512f -mavx512bw -mavx512vl -mavx512vnni on
// top of the AVX2 flags; only entered after a runtime check.
// GCC 12's avx512fintrin.h trips -Wmaybe-uninitialized on its own _mm512_undefined_*().
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define SPECD_X8_DOT 1
#include "kernels/cpu/ops_avx2.cc"  // NOLINT(bugprone-suspicious-include): one source, five ISAs
