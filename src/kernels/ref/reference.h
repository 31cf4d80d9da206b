// The FP64 oracle for every GEMM kernel: dequantized weights (formats::dequantize_*) times the
// activations, accumulated in double. Lives apart from the kernels it judges.
#pragma once

#include <cstdint>

namespace fp4moe::kernels::ref {

// y[i, j] = sum_k x[i, k] * w[j, k] in double; also abs_y[i, j] = sum_k |x[i, k] * w[j, k]|, the
// scale of the rounding error any FP32 summation order can make (so tolerances can be relative to
// it rather than to a result that may cancel to near zero). abs_y may be null.
void gemm_f64(const float* w, int64_t n, int64_t k, const float* x, int64_t m, double* y,
              double* abs_y);

}  // namespace fp4moe::kernels::ref
