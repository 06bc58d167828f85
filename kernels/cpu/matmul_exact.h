// Fast twin of ref::MatMulExact (float activations for every weight type). Each output row is
// dequantized once per call and reused for all T inputs; every y[t, n] is one dot product in
// a fixed order, so results are bitwise batch-invariant.
#ifndef SPECD_KERNELS_CPU_MATMUL_EXACT_H_
#define SPECD_KERNELS_CPU_MATMUL_EXACT_H_

#include <cstdint>

#include "kernels/cpu/thread_pool.h"
#include "kernels/kernel_types.h"

namespace specd::kernels::cpu {

// x: [T, w.cols], y: [T, w.rows].
void MatMulExact(ThreadPool& pool, const WeightMatrix& w, const float* x, int64_t T, float* y);

}  // namespace specd::kernels::cpu

#endif  // SPECD_KERNELS_CPU_MATMUL_EXACT_H_
