// Test-build shim (FP4MOE_EMULATE_AVX512, preset "avx512-emulated"): the AVX-512 kernel files are
// compiled for the host's AVX2 with this directory first on their include path, so their
// `#include <immintrin.h>` gets the real header plus SIMDe's portable AVX-512 (Debian
// libsimde-dev) under the native intrinsic names. That runs every AVX-512 kernel's logic, and the
// whole test matrix over it, on hosts without AVX-512; it says nothing about AVX-512 speed.
#pragma once
#pragma GCC system_header

#include_next <immintrin.h>

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

// What SIMDe 0.7.4~rc2 (Debian 12) lacks, each only where no alias exists (a newer SIMDe wins).
// Zero-extension of a 256-bit vector to 512 bits.
#ifndef _mm512_zextsi256_si512
#define _mm512_zextsi256_si512(a) simde_mm512_inserti64x4(simde_mm512_setzero_si512(), (a), 0)
#endif

// F16 -> F32 of 16 halves, as two F16C conversions (the host has F16C).
static inline simde__m512 fp4moe_emulated_mm512_cvtph_ps(__m256i halves) {
  return simde_mm512_insertf32x8(
      simde_mm512_castps256_ps512(_mm256_cvtph_ps(_mm256_castsi256_si128(halves))),
      _mm256_cvtph_ps(_mm256_extracti128_si256(halves, 1)), 1);
}
#ifndef _mm512_cvtph_ps
#define _mm512_cvtph_ps(a) fp4moe_emulated_mm512_cvtph_ps(a)
#endif

// zero-extension of 16 bytes to 16 dwords, as two AVX2 conversions.
static inline simde__m512i fp4moe_emulated_mm512_cvtepu8_epi32(__m128i bytes) {
  return simde_mm512_inserti64x4(simde_mm512_castsi256_si512(_mm256_cvtepu8_epi32(bytes)),
                                 _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)), 1);
}
#ifndef _mm512_cvtepu8_epi32
#define _mm512_cvtepu8_epi32(a) fp4moe_emulated_mm512_cvtepu8_epi32(a)
#endif

// int32 -> F32 conversion, as two AVX conversions.
static inline simde__m512 fp4moe_emulated_mm512_cvtepi32_ps(simde__m512i v) {
  return simde_mm512_insertf32x8(
      simde_mm512_castps256_ps512(_mm256_cvtepi32_ps(simde_mm512_extracti64x4_epi64(v, 0))),
      _mm256_cvtepi32_ps(simde_mm512_extracti64x4_epi64(v, 1)), 1);
}
#ifndef _mm512_cvtepi32_ps
#define _mm512_cvtepi32_ps(a) fp4moe_emulated_mm512_cvtepi32_ps(a)
#endif

// F32 -> int32 in the current rounding mode (nearest-even), as two AVX conversions.
static inline simde__m512i fp4moe_emulated_mm512_cvtps_epi32(simde__m512 v) {
  return simde_mm512_inserti64x4(
      simde_mm512_castsi256_si512(_mm256_cvtps_epi32(
          _mm256_castsi256_ps(simde_mm512_extracti64x4_epi64(simde_mm512_castps_si512(v), 0)))),
      _mm256_cvtps_epi32(
          _mm256_castsi256_ps(simde_mm512_extracti64x4_epi64(simde_mm512_castps_si512(v), 1))),
      1);
}
#ifndef _mm512_cvtps_epi32
#define _mm512_cvtps_epi32(a) fp4moe_emulated_mm512_cvtps_epi32(a)
#endif

// int32 -> int8 by truncation (vpmovdb), and the horizontal max / sum of 16 int32 lanes.
static inline __m128i fp4moe_emulated_mm512_cvtepi32_epi8(simde__m512i v) {
  int32_t lanes[16];
  signed char bytes[16];
  simde_mm512_storeu_si512(lanes, v);
  for (int i = 0; i < 16; ++i) bytes[i] = static_cast<signed char>(lanes[i] & 0xFF);
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes));
}
#ifndef _mm512_cvtepi32_epi8
#define _mm512_cvtepi32_epi8(a) fp4moe_emulated_mm512_cvtepi32_epi8(a)
#endif
static inline int32_t fp4moe_emulated_mm512_reduce_max_epi32(simde__m512i v) {
  int32_t lanes[16];
  simde_mm512_storeu_si512(lanes, v);
  int32_t r = lanes[0];
  for (int i = 1; i < 16; ++i) r = lanes[i] > r ? lanes[i] : r;
  return r;
}
#ifndef _mm512_reduce_max_epi32
#define _mm512_reduce_max_epi32(a) fp4moe_emulated_mm512_reduce_max_epi32(a)
#endif
static inline int32_t fp4moe_emulated_mm512_reduce_add_epi32(simde__m512i v) {
  int32_t lanes[16];
  simde_mm512_storeu_si512(lanes, v);
  uint32_t r = 0;  // wraps as vpaddd does
  for (int i = 0; i < 16; ++i) r += static_cast<uint32_t>(lanes[i]);
  return static_cast<int32_t>(r);
}
#ifndef _mm512_reduce_add_epi32
#define _mm512_reduce_add_epi32(a) fp4moe_emulated_mm512_reduce_add_epi32(a)
#endif

// masked unaligned store of F32 lanes (lanes whose bit is clear untouched).
static inline void fp4moe_emulated_mm512_mask_storeu_ps(void* dst, simde__mmask16 mask,
                                                        simde__m512 v) {
  float lanes[16];
  simde_mm512_storeu_ps(lanes, v);
  for (int i = 0; i < 16; ++i) {
    if ((mask >> i) & 1) __builtin_memcpy(static_cast<char*>(dst) + 4 * i, &lanes[i], 4);
  }
}
#ifndef _mm512_mask_storeu_ps
#define _mm512_mask_storeu_ps(p, k, a) fp4moe_emulated_mm512_mask_storeu_ps((p), (k), (a))
#endif

// vdpbf16ps as the hardware computes it (odd pair first, each addition rounded, subnormals
// flushed: kernels/cpu/bf16_pair_dot.h, checked against a Zen 4), in place of SIMDe's, which
// adds the even product first and flushes nothing. Replaced, not only added where missing, so
// the emulated BF16-activation kernels give the scalar kernels' bits as the real ones do.
#include "kernels/cpu/bf16_pair_dot.h"
static inline simde__m512 fp4moe_emulated_mm512_dpbf16_ps(simde__m512 src, simde__m512bh a,
                                                          simde__m512bh b) {
  float acc[16];
  uint16_t wa[32], wb[32];
  simde_mm512_storeu_ps(acc, src);
  __builtin_memcpy(wa, &a, sizeof(wa));
  __builtin_memcpy(wb, &b, sizeof(wb));
  for (int i = 0; i < 16; ++i) {
    acc[i] =
        fp4moe::kernels::bf16_pair_dot(acc[i], wa[2 * i], wa[2 * i + 1], wb[2 * i], wb[2 * i + 1]);
  }
  return simde_mm512_loadu_ps(acc);
}
#undef _mm512_dpbf16_ps
#define _mm512_dpbf16_ps(src, a, b) fp4moe_emulated_mm512_dpbf16_ps((src), (a), (b))

// In-lane permute of F32 lanes by an immediate: shufps of a vector with itself is the same map.
#ifndef _mm512_permute_ps
#define _mm512_permute_ps(a, imm8) simde_mm512_shuffle_ps((a), (a), (imm8))
#endif
