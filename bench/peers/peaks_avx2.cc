// AVX2 throughput loops of bench_peaks (see peaks.h).
#include <immintrin.h>

#include "peaks.h"

namespace fp4moe::bench {

float fma_f32_avx2(int64_t iters) {
  // 12 chains: FMA latency 4-5 cycles x 2 ports needs >= 10 in flight.
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(0.001f * static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-6f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  return _mm256_cvtss_f32(s);
}

int32_t maddubs_i8_avx2(int64_t iters) {
  // vpmaddubsw has no accumulate: each chain feeds its own result back as the unsigned operand,
  // which keeps 12 independent chains (latency 3-5 cycles x 2 ports).
  __m256i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi8(static_cast<char>(i + 1));
  const __m256i w = _mm256_set1_epi8(1);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_maddubs_epi16(acc[i], w);
  }
  __m256i s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_xor_si256(s, acc[i]);
  return _mm256_extract_epi32(s, 0);
}

}  // namespace fp4moe::bench
