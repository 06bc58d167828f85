#include "kernels/ref/matmul_exact.h"

#include <vector>

#include "kernels/ref/ops.h"

namespace specd::kernels::ref {

void MatMulExact(const WeightMatrix& w, const float* x, int64_t T, float* y) {
  std::vector<float> row(w.cols);
  for (int64_t n = 0; n < w.rows; ++n) {
    DequantizeRow(w.type, w.data + n * w.row_bytes, w.cols, row.data());
    for (int64_t t = 0; t < T; ++t) {
      double acc = 0;
      for (int64_t k = 0; k < w.cols; ++k) acc += double{row[k]} * x[t * w.cols + k];
      y[t * w.rows + n] = static_cast<float>(acc);
    }
  }
}

}  // namespace specd::kernels::ref
