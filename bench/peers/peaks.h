// Throughput loops for bench_peaks: each runs `iters` iterations of independent dependency chains
// (enough chains to cover the instruction's latency on every port that executes it) and returns
// a value that depends on every chain, so the compiler keeps them all.
#pragma once

#include <cstdint>

namespace fp4moe::bench {

// Operations one iteration of each loop performs (a multiply-add counts 2).
inline constexpr double kFmaAvx2OpsPerIter = 12 * 8 * 2;        // 12 x vfmadd231ps ymm
inline constexpr double kFmaAvx512OpsPerIter = 12 * 16 * 2;     // 12 x vfmadd231ps zmm
inline constexpr double kMaddubsAvx2OpsPerIter = 12 * 32 * 2;   // 12 x vpmaddubsw ymm
inline constexpr double kDpbusdAvx512OpsPerIter = 12 * 64 * 2;  // 12 x vpdpbusd zmm
// 3 groups of the AVX2 W4A8 block dot: 4 x vpmaddubsw ymm (the counted operations), 3 x vpaddw,
// vpmaddwd, vpaddd
inline constexpr double kW4a8MixAvx2OpsPerIter = 3 * 4 * 32 * 2;
// The one-token decode loops' instruction mixes (peaks_decode_avx512.cc): FP4 code bytes one
// iteration decodes and multiplies (3 chunk pairs of 64 bytes; 6 chunks of 32).
inline constexpr double kBf16TileMixBytesPerIter = 3 * 64;
inline constexpr double kW4a8TileMixBytesPerIter = 6 * 32;
// 4 x tdpbssd of 16 x 16 outputs over k bytes
inline constexpr double amx_ops_per_iter(int k) { return 4.0 * 16 * 16 * k * 2; }

// The 12 chains of one iteration as inline assembly, for the integer loops: `OP(i)` gives the
// instruction for chain i (its operand named %[c<i>]); the chains are 12 variables v0 .. v11,
// register operands C ("+x" or "+v"). GCC 12 compiled the AVX2 vpmaddubsw loop, written with
// intrinsics over an array of 12 accumulators, with 7 stores to the stack per iteration (it
// measured 1.28 vpmaddubsw per cycle on Zen 3, where this form measures 2.0: an int8 peak 1.56x
// too low), and the AVX-512 vpdpbusd loop with 13 register copies per 12 instructions. Separate
// variables, not an array: with array elements as operands GCC stores the array back every
// iteration. The FMA loops compile clean from intrinsics (and gave two copies per iteration when
// written this way). tests/python/test_kernel_objects.py checks every loop's machine code.
// Kept out of clang-format: version 14 reflowed this macro differently on every run.
// clang-format off
#define FP4MOE_PEAK_12(OP) \
  OP("0") OP("1") OP("2") OP("3") OP("4") OP("5") OP("6") OP("7") OP("8") OP("9") OP("10") OP("11")
// clang-format on
#define FP4MOE_PEAK_12_OPERANDS(C, v)                                                 \
  [c0] C(v##0), [c1] C(v##1), [c2] C(v##2), [c3] C(v##3), [c4] C(v##4), [c5] C(v##5), \
      [c6] C(v##6), [c7] C(v##7), [c8] C(v##8), [c9] C(v##9), [c10] C(v##10), [c11] C(v##11)

// A vector's 16 int32 lanes, stored by the caller, xor-ed: the loops' results depend on every chain
// this way (summed in scalar: GCC 12's _mm512_reduce_* trip -Werror=uninitialized).
inline int32_t xor_lanes(const int32_t (&lanes)[16]) {
  int32_t x = 0;
  for (int32_t l : lanes) x ^= l;
  return x;
}

float fma_f32_avx2(int64_t iters);
float fma_f32_avx512(int64_t iters);
int32_t maddubs_i8_avx2(int64_t iters);
int32_t dpbusd_i8_avx512(int64_t iters);
// The AVX2 int8 block dot every W4A8 kernel here is built from (vpmaddubsw has no accumulating
// form: its int16 pair sums are added in int16, widened by vpmaddwd and added in int32), in
// registers: the most the integer pipes allow such a kernel, loads and scales aside.
int32_t w4a8_mix_avx2(int64_t iters);
// The loop bodies of the one-token paths, in registers (loads, the scale stream and the block ends
// aside): the AVX512-BF16 kernel's bf16_tile (needs AVX512-BF16 and VBMI) and the VNNI W4A8
// kernel's w4a8_tile (VNNI and VBMI). What they sustain per second is a ceiling on the bytes per
// second those kernels can read, per core.
int32_t bf16_tile_mix_avx512(int64_t iters);
int32_t w4a8_tile_mix_avx512(int64_t iters);
// k = 64 (a whole tile row) or 16 (one NVFP4 scale block per product, as the AMX W4A8 kernel).
int32_t tdpbssd_i8_amx(int64_t iters, int k);

}  // namespace fp4moe::bench
