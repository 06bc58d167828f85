// The AVX-VNNI backend's code with vpdpbusd emulated exactly in AVX2, so its paths run, and
// are checked against the reference, on CPUs without AVX-VNNI. Tests only: never chosen by
// default (Isa::kAvxVnniEmulated).
#define SPECD_X8_DOT 4
#include "kernels/cpu/ops_avx2.cc"  // NOLINT(bugprone-suspicious-include): one source, five ISAs
