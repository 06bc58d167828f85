// MatMul with float activations for every weight type ("exact activations" mode): weights are
// dequantized a row at a time and dotted with the unquantized input. Slower than the int8
// activation path of ref/ops.h MatMul, but free of activation rounding, so the whole model
// can be checked token for token against a float64 reference.
#ifndef SPECD_KERNELS_REF_MATMUL_EXACT_H_
#define SPECD_KERNELS_REF_MATMUL_EXACT_H_

#include <cstdint>

#include "kernels/kernel_types.h"

namespace specd::kernels::ref {

// y[t, n] = sum_k W[n, k] * x[t, k], accumulated in double.  x: [T, w.cols], y: [T, w.rows].
void MatMulExact(const WeightMatrix& w, const float* x, int64_t T, float* y);

}  // namespace specd::kernels::ref

#endif  // SPECD_KERNELS_REF_MATMUL_EXACT_H_
