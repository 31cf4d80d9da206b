// AVX-512 FP32 throughput loop of bench_peaks (see peaks.h).
#include <immintrin.h>

#include "peaks.h"

namespace fp4moe::bench {

float fma_f32_avx512(int64_t iters) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(0.001f * static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-6f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  // Stored and summed in scalar: GCC 12's _mm512_reduce_* trip -Werror=uninitialized.
  float lanes[16];
  _mm512_storeu_ps(lanes, s);
  float sum = 0;
  for (float v : lanes) sum += v;
  return sum;
}

}  // namespace fp4moe::bench
