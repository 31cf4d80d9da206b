// AVX-512 VNNI int8 throughput loop of bench_peaks (see peaks.h).
#include <immintrin.h>

#include "peaks.h"

namespace fp4moe::bench {

int32_t dpbusd_i8_avx512(int64_t iters) {
  // 12 accumulators: vpdpbusd latency 4-5 cycles x 2 ports.
  __m512i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-1);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  }
  __m512i s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_xor_si512(s, acc[i]);
  // Stored and summed in scalar: GCC 12's _mm512_reduce_* trip -Werror=uninitialized.
  int32_t lanes[16];
  _mm512_storeu_si512(lanes, s);
  int32_t sum = 0;
  for (int32_t v : lanes) sum ^= v;
  return sum;
}

}  // namespace fp4moe::bench
