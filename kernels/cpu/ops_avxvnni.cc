// The AVX-VNNI backend: ops_avx2.cc's kernels on AVX2's 256-bit shapes, with the quantized
// MatMul's int8 dot done by vpdpbusd in its VEX form (AVX-VNNI), for the AVX2 CPUs that have
// it and no AVX-512. Built with -mavxvnni on top of the AVX2 flags; only entered after a
// runtime check.
#define SPECD_X8_DOT 3
#include "kernels/cpu/ops_avx2.cc"  // NOLINT(bugprone-suspicious-include): one source, five ISAs
