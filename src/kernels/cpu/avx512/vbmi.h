// AVX512-VBMI's vpermb and vpermt2b for the AVX-512 kernel files that are compiled without
// -mavx512vbmi (their ISA levels, registry.h, do not require VBMI: Cascade Lake and Cooper Lake
// have VNNI, and Cooper Lake BF16, without it), so each chooses at run time: host_has_vbmi().
//
// Internal linkage, as fp4_avx512.h: the including files are compiled with different ISA flags.
#pragma once

#include <immintrin.h>

#include <cstdlib>

namespace fp4moe::kernels::avx512 {
namespace {

// A real AVX-512 build emits vpermb by inline assembly; the SIMDe-emulated test build (compiled
// for the host's AVX2, so no __AVX512BW__) takes SIMDe's, which any host runs.
#if defined(__AVX512BW__)
constexpr bool kVbmiAsm = true;
#else
constexpr bool kVbmiAsm = false;
#endif

// out byte o = table[idx[o] & 63].
[[gnu::always_inline]] inline __m512i vpermb(__m512i idx, __m512i table) {
#if defined(__AVX512BW__)
  __m512i out;
  asm("vpermb %[t], %[i], %[o]" : [o] "=v"(out) : [i] "v"(idx), [t] "v"(table));
  return out;
#else
  return _mm512_permutexvar_epi8(idx, table);
#endif
}

// The 256-bit form (AVX512-VBMI with VL): out byte o = table[idx[o] & 31].
[[gnu::always_inline]] inline __m256i vpermb(__m256i idx, __m256i table) {
#if defined(__AVX512BW__)
  __m256i out;
  asm("vpermb %[t], %[i], %[o]" : [o] "=v"(out) : [i] "v"(idx), [t] "v"(table));
  return out;
#else
  return _mm256_permutexvar_epi8(idx, table);
#endif
}

// out byte o = 0 where mask bit o is clear, else (idx[o] & 64 ? hi : lo)[idx[o] & 63] (vpermt2b,
// zero-masked).
[[gnu::always_inline]] inline __m512i vpermt2b_maskz(__mmask64 mask, __m512i lo, __m512i idx,
                                                     __m512i hi) {
#if defined(__AVX512BW__)
  asm("vpermt2b %[h], %[i], %[o]%{%[k]%}%{z%}"
      : [o] "+v"(lo)
      : [i] "v"(idx), [h] "v"(hi), [k] "Yk"(mask));
  return lo;
#else
  return _mm512_maskz_permutex2var_epi8(mask, lo, idx, hi);
#endif
}

// out byte o = (idx[o] & 64 ? hi : lo)[idx[o] & 63] (vpermt2b; bit 7 of an index is ignored).
[[gnu::always_inline]] inline __m512i vpermt2b(__m512i lo, __m512i idx, __m512i hi) {
#if defined(__AVX512BW__)
  asm("vpermt2b %[h], %[i], %[o]" : [o] "+v"(lo) : [i] "v"(idx), [h] "v"(hi));
  return lo;
#else
  return _mm512_permutex2var_epi8(lo, idx, hi);
#endif
}

// Whether this host runs vpermb: cpuid's VBMI bit in a real build, always in the emulated one.
// FP4MOE_NO_VBMI (any value) says no, so a VBMI host also runs the kernels' other variants
// natively (tests/cpp/kernels/CMakeLists.txt runs the kernel tests once more with it).
inline bool host_has_vbmi() {
  static const bool has = (!kVbmiAsm || __builtin_cpu_supports("avx512vbmi")) &&
                          std::getenv("FP4MOE_NO_VBMI") == nullptr;
  return has;
}

}  // namespace
}  // namespace fp4moe::kernels::avx512
