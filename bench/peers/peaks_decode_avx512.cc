// The one-token decode loops' instruction mixes in registers, for bench_peaks (see peaks.h): the
// most the vector pipes let each loop read per second, loads, scale stream and block ends aside.
// Each loop is one inline-assembly block, loop control included: vpermb, vpermw, vdpbf16ps and
// vpdpbusd need no compiler flag there, and 24 live vectors exceed what asm operands can name. The
// chains live in zmm8-zmm31 (clobbered); the constants come in as operands (zmm0-zmm7). bench_peaks
// runs each only where cpuid has its ISA.
#include <immintrin.h>

#include <cstdint>

#include "peaks.h"

namespace fp4moe::bench {
namespace {

int32_t fold(__m512i s) {
  int32_t lanes[16];
  _mm512_storeu_si512(lanes, s);
  return xor_lanes(lanes);
}

#define FP4MOE_CHAINS_CLOBBERED                                                                    \
  "zmm8", "zmm9", "zmm10", "zmm11", "zmm12", "zmm13", "zmm14", "zmm15", "zmm16", "zmm17", "zmm18", \
      "zmm19", "zmm20", "zmm21", "zmm22", "zmm23", "zmm24", "zmm25", "zmm26", "zmm27", "zmm28",    \
      "zmm29", "zmm30", "zmm31", "cc"
// The 12 chains (zmm20-zmm31) start at zero and end xor-ed into `out`.
#define FP4MOE_CHAINS_ZERO                                                                     \
  "vpxord %%zmm20, %%zmm20, %%zmm20\n\tvmovdqa64 %%zmm20, %%zmm21\n\t"                         \
  "vmovdqa64 %%zmm20, %%zmm22\n\tvmovdqa64 %%zmm20, %%zmm23\n\tvmovdqa64 %%zmm20, %%zmm24\n\t" \
  "vmovdqa64 %%zmm20, %%zmm25\n\tvmovdqa64 %%zmm20, %%zmm26\n\tvmovdqa64 %%zmm20, %%zmm27\n\t" \
  "vmovdqa64 %%zmm20, %%zmm28\n\tvmovdqa64 %%zmm20, %%zmm29\n\tvmovdqa64 %%zmm20, %%zmm30\n\t" \
  "vmovdqa64 %%zmm20, %%zmm31\n\t"
#define FP4MOE_CHAINS_FOLD                                                   \
  "vpxord %%zmm21, %%zmm20, %%zmm20\n\tvpxord %%zmm23, %%zmm22, %%zmm22\n\t" \
  "vpxord %%zmm25, %%zmm24, %%zmm24\n\tvpxord %%zmm27, %%zmm26, %%zmm26\n\t" \
  "vpxord %%zmm29, %%zmm28, %%zmm28\n\tvpxord %%zmm31, %%zmm30, %%zmm30\n\t" \
  "vpxord %%zmm22, %%zmm20, %%zmm20\n\tvpxord %%zmm26, %%zmm24, %%zmm24\n\t" \
  "vpxord %%zmm30, %%zmm28, %%zmm28\n\tvpxord %%zmm24, %%zmm20, %%zmm20\n\t" \
  "vpxord %%zmm28, %%zmm20, %[out]\n\t"

}  // namespace

int32_t bf16_tile_mix_avx512(int64_t iters) {
  if (iters <= 0) return 0;
  // The codes, the two vpermb controls, the E2M1 -> BF16 table and the activation pairs: any
  // values (the timing of these instructions does not depend on them).
  const __m512i raw = _mm512_set1_epi32(0x76543210), c0 = _mm512_set1_epi8(5),
                c1 = _mm512_set1_epi8(37), lut = _mm512_set1_epi16(0x3F80),
                x = _mm512_set1_epi32(0x3F803F80);
  __m512i out;
  // One 64-byte chunk pair of bf16_tile (gemm_bf16_avx512.cc): two vpermb build the index words,
  // two shifts bring the high nibbles down, four vpermw look the BF16 values up, four vdpbf16ps
  // take them. Three chunk pairs per iteration (12 vdpbf16ps into 12 chains).
#define FP4MOE_BF16_PAIR(i0, i1, h0, h1, s0, s1, s2, s3) \
  "vpermb %[raw], %[c0], %%zmm" i0                       \
  "\n\t"                                                 \
  "vpermb %[raw], %[c1], %%zmm" i1                       \
  "\n\t"                                                 \
  "vpsrlw $4, %%zmm" i0 ", %%zmm" h0                     \
  "\n\t"                                                 \
  "vpsrlw $4, %%zmm" i1 ", %%zmm" h1                     \
  "\n\t"                                                 \
  "vpermw %[lut], %%zmm" i0 ", %%zmm" i0                 \
  "\n\t"                                                 \
  "vpermw %[lut], %%zmm" i1 ", %%zmm" i1                 \
  "\n\t"                                                 \
  "vpermw %[lut], %%zmm" h0 ", %%zmm" h0                 \
  "\n\t"                                                 \
  "vpermw %[lut], %%zmm" h1 ", %%zmm" h1                 \
  "\n\t"                                                 \
  "vdpbf16ps %[x], %%zmm" i0 ", %%zmm" s0                \
  "\n\t"                                                 \
  "vdpbf16ps %[x], %%zmm" i1 ", %%zmm" s1                \
  "\n\t"                                                 \
  "vdpbf16ps %[x], %%zmm" h0 ", %%zmm" s2                \
  "\n\t"                                                 \
  "vdpbf16ps %[x], %%zmm" h1 ", %%zmm" s3 "\n\t"
  asm volatile(FP4MOE_CHAINS_ZERO
               "1:\n\t" FP4MOE_BF16_PAIR("8", "9", "10", "11", "20", "21", "22", "23")
                   FP4MOE_BF16_PAIR("12", "13", "14", "15", "24", "25", "26", "27")
                       FP4MOE_BF16_PAIR("16", "17", "18", "19", "28", "29", "30", "31")
               "dec %[n]\n\t"
               "jnz 1b\n\t" FP4MOE_CHAINS_FOLD
               : [n] "+r"(iters), [out] "=v"(out)
               : [raw] "v"(raw), [c0] "v"(c0), [c1] "v"(c1), [lut] "v"(lut), [x] "v"(x)
               : FP4MOE_CHAINS_CLOBBERED);
#undef FP4MOE_BF16_PAIR
  return fold(out);
}

int32_t w4a8_tile_mix_avx512(int64_t iters) {
  if (iters <= 0) return 0;
  const __m256i raw = _mm256_set1_epi32(0x76543210), lut = _mm256_set1_epi8(12),
                q = _mm256_set1_epi8(-3);
  __m512i out;
  // One 32-byte chunk of w4a8_tile (w4a8_avx512_vnni.cc), in 256-bit vectors: one shift brings
  // the high nibbles down, one vpermb per nibble half looks the offset codes up, two vpdpbusd take
  // them. Six chunks per iteration (12 vpdpbusd, 12 chains).
#define FP4MOE_W4A8_PAIR(v, h, s0, s1)  \
  "vpsrlw $4, %[raw], %%ymm" h          \
  "\n\t"                                \
  "vpermb %[lut], %[raw], %%ymm" v      \
  "\n\t"                                \
  "vpermb %[lut], %%ymm" h ", %%ymm" h  \
  "\n\t"                                \
  "vpdpbusd %[q], %%ymm" v ", %%ymm" s0 \
  "\n\t"                                \
  "vpdpbusd %[q], %%ymm" h ", %%ymm" s1 "\n\t"
  asm volatile(FP4MOE_CHAINS_ZERO
               "1:\n\t" FP4MOE_W4A8_PAIR("8", "9", "20", "21") FP4MOE_W4A8_PAIR("10", "11", "22", "23")
                   FP4MOE_W4A8_PAIR("12", "13", "24", "25") FP4MOE_W4A8_PAIR("14", "15", "26", "27")
                       FP4MOE_W4A8_PAIR("16", "17", "28", "29")
                           FP4MOE_W4A8_PAIR("18", "19", "30", "31")
               "dec %[n]\n\t"
               "jnz 1b\n\t" FP4MOE_CHAINS_FOLD
               : [n] "+r"(iters), [out] "=v"(out)
               : [raw] "v"(raw), [lut] "v"(lut), [q] "v"(q)
               : FP4MOE_CHAINS_CLOBBERED);
#undef FP4MOE_W4A8_PAIR
  return fold(out);
}

}  // namespace fp4moe::bench
