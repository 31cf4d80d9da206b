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
// 4 x tdpbssd of 16 x 16 outputs over k bytes
inline constexpr double amx_ops_per_iter(int k) { return 4.0 * 16 * 16 * k * 2; }

float fma_f32_avx2(int64_t iters);
float fma_f32_avx512(int64_t iters);
int32_t maddubs_i8_avx2(int64_t iters);
int32_t dpbusd_i8_avx512(int64_t iters);
// k = 64 (a whole tile row) or 16 (one NVFP4 scale block per product, as the AMX W4A8 kernel).
int32_t tdpbssd_i8_amx(int64_t iters, int k);

}  // namespace fp4moe::bench
