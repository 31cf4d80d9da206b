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
  auto init = [](int i) { return _mm256_set1_epi8(static_cast<char>(i + 1)); };
  __m256i v0 = init(0), v1 = init(1), v2 = init(2), v3 = init(3), v4 = init(4), v5 = init(5);
  __m256i v6 = init(6), v7 = init(7), v8 = init(8), v9 = init(9), v10 = init(10), v11 = init(11);
  const __m256i w = _mm256_set1_epi8(1);
#define FP4MOE_MADDUBS(i) "vpmaddubsw %[w], %[c" i "], %[c" i "]\n\t"
  for (int64_t it = 0; it < iters; ++it) {
    asm(FP4MOE_PEAK_12(FP4MOE_MADDUBS) : FP4MOE_PEAK_12_OPERANDS("+x", v) : [w] "x"(w));
  }
#undef FP4MOE_MADDUBS
  const __m256i s = _mm256_xor_si256(
      _mm256_xor_si256(_mm256_xor_si256(_mm256_xor_si256(v0, v1), _mm256_xor_si256(v2, v3)),
                       _mm256_xor_si256(_mm256_xor_si256(v4, v5), _mm256_xor_si256(v6, v7))),
      _mm256_xor_si256(_mm256_xor_si256(v8, v9), _mm256_xor_si256(v10, v11)));
  return _mm256_extract_epi32(s, 0);
}

int32_t w4a8_mix_avx2(int64_t iters) {
  const __m256i w = _mm256_set1_epi8(3), a = _mm256_set1_epi8(5), ones = _mm256_set1_epi16(1);
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, p0, p1, p2, t0, t1, t2;
#define FP4MOE_MIX_GROUP(g)            \
  "vpmaddubsw %[w], %[a], %[p" g       \
  "]\n\t"                              \
  "vpmaddubsw %[w], %[a], %[t" g       \
  "]\n\t"                              \
  "vpaddw %[t" g "], %[p" g "], %[p" g \
  "]\n\t"                              \
  "vpmaddubsw %[w], %[a], %[t" g       \
  "]\n\t"                              \
  "vpaddw %[t" g "], %[p" g "], %[p" g \
  "]\n\t"                              \
  "vpmaddubsw %[w], %[a], %[t" g       \
  "]\n\t"                              \
  "vpaddw %[t" g "], %[p" g "], %[p" g \
  "]\n\t"                              \
  "vpmaddwd %[ones], %[p" g "], %[p" g \
  "]\n\t"                              \
  "vpaddd %[p" g "], %[s" g "], %[s" g "]\n\t"
  for (int64_t it = 0; it < iters; ++it) {
    asm(FP4MOE_MIX_GROUP("0") FP4MOE_MIX_GROUP("1") FP4MOE_MIX_GROUP("2")
        : [s0] "+x"(s0), [s1] "+x"(s1), [s2] "+x"(s2), [p0] "=&x"(p0), [p1] "=&x"(p1),
          [p2] "=&x"(p2), [t0] "=&x"(t0), [t1] "=&x"(t1), [t2] "=&x"(t2)
        : [w] "x"(w), [a] "x"(a), [ones] "x"(ones));
  }
#undef FP4MOE_MIX_GROUP
  return _mm256_extract_epi32(_mm256_xor_si256(_mm256_xor_si256(s0, s1), s2), 0);
}

}  // namespace fp4moe::bench
