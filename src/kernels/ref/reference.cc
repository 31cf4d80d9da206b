// The FP64 reference GEMM (see reference.h).
#include "kernels/ref/reference.h"

#include <cmath>

namespace fp4moe::kernels::ref {

void gemm_f64(const float* w, int64_t n, int64_t k, const float* x, int64_t m, double* y,
              double* abs_y) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      double abs_sum = 0.0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double p = double(x[i * k + kk]) * double(w[j * k + kk]);
        sum += p;
        abs_sum += std::fabs(p);
      }
      y[i * n + j] = sum;
      if (abs_y != nullptr) abs_y[i * n + j] = abs_sum;
    }
  }
}

}  // namespace fp4moe::kernels::ref
