// Declarations of every CPU kernel in kernel_list.inc; each is defined in its ISA's directory.
#pragma once

#include "kernels/types.h"

namespace fp4moe::kernels {

#define FP4MOE_GEMM_KERNEL(fn, format, isa)                                                     \
  void fn(const PackedMatrix& w, const float* x, int64_t ldx, int64_t m, float* y, int64_t ldy, \
          int64_t tile_begin, int64_t tile_end);
#define FP4MOE_W4A8_KERNEL(fn, format, isa)                                                       \
  void fn(const PackedMatrix& w, const QuantizedActivations& x, int64_t m, float* y, int64_t ldy, \
          int64_t tile_begin, int64_t tile_end);
#define FP4MOE_BF16_KERNEL(fn, format, isa)                                                        \
  void fn(const PackedMatrix& w, const uint16_t* x, int64_t ldx, int64_t m, float* y, int64_t ldy, \
          int64_t tile_begin, int64_t tile_end);
#define FP4MOE_ACT_QUANTIZER(fn, isa)                                                             \
  void fn(const float* x, int64_t ldx, int64_t m, int64_t k, int block, int8_t* q, float* scales, \
          int32_t* offsets);
#include "kernels/kernel_list.inc"
#undef FP4MOE_GEMM_KERNEL
#undef FP4MOE_W4A8_KERNEL
#undef FP4MOE_BF16_KERNEL
#undef FP4MOE_ACT_QUANTIZER

}  // namespace fp4moe::kernels
