// The AVX-512 VNNI backend's code with its 512-bit vectors and vpdpbusd emulated by SIMDe
// in AVX2, so the VNNI paths run, and are checked against the reference, on CPUs without
// AVX-512. Tests only: never chosen by default (Isa::kVnniEmulated); ~40x slower.
#define SPECD_X8_DOT 2
#include "kernels/cpu/ops_avx2.cc"  // NOLINT(bugprone-suspicious-include): one source, five ISAs
