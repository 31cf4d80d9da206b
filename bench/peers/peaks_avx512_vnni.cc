// AVX-512 VNNI int8 throughput loop of bench_peaks (see peaks.h).
#include <immintrin.h>

#include "peaks.h"

namespace fp4moe::bench {

int32_t dpbusd_i8_avx512(int64_t iters) {
  // 12 accumulators: vpdpbusd latency 4-5 cycles x 2 ports.
  auto init = [](int i) { return _mm512_set1_epi32(i); };
  __m512i v0 = init(0), v1 = init(1), v2 = init(2), v3 = init(3), v4 = init(4), v5 = init(5);
  __m512i v6 = init(6), v7 = init(7), v8 = init(8), v9 = init(9), v10 = init(10), v11 = init(11);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-1);
#define FP4MOE_DPBUSD(i) "vpdpbusd %[b], %[a], %[c" i "]\n\t"
  for (int64_t it = 0; it < iters; ++it) {
    asm(FP4MOE_PEAK_12(FP4MOE_DPBUSD) : FP4MOE_PEAK_12_OPERANDS("+v", v) : [a] "v"(a), [b] "v"(b));
  }
#undef FP4MOE_DPBUSD
  const __m512i s = _mm512_xor_si512(
      _mm512_xor_si512(_mm512_xor_si512(_mm512_xor_si512(v0, v1), _mm512_xor_si512(v2, v3)),
                       _mm512_xor_si512(_mm512_xor_si512(v4, v5), _mm512_xor_si512(v6, v7))),
      _mm512_xor_si512(_mm512_xor_si512(v8, v9), _mm512_xor_si512(v10, v11)));
  int32_t lanes[16];
  _mm512_storeu_si512(lanes, s);
  return xor_lanes(lanes);
}

}  // namespace fp4moe::bench
