// The AVX-512 VNNI backend: ops_avx2.cc's kernels with the quantized MatMul's int8 dot
// done by vpdpbusd (256-bit vectors, AVX512VL). Built with -mavx512f -mavx512bw
// -mavx512vl -mavx512vnni on top of the AVX2 flags; only entered after a runtime check.
#define SPECD_X8_DOT 1
#include "kernels/cpu/ops_avx2.cc"  // NOLINT(bugprone-suspicious-include): one source, two ISAs
