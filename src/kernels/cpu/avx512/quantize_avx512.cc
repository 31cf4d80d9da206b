// AVX-512 activation quantizer for the W4A8 kernels: the operations of
// quantize_activations_int8_scalar (max of |x|, amax / 127, 127 / amax, one F32 multiply and a
// round-half-even conversion per element), so every output bit is the scalar quantizer's.
//
// The AVX2 quantizer reduces one block at a time (horizontal max and sum, a scalar division): per
// 16-value block about as many shuffles as arithmetic. Here 16 blocks of a row go together: their
// |x| bit patterns (non-negative floats order as integers, and Inf / NaN above every finite one)
// and their code sums are reduced by a transpose tree (16 vectors -> one vector of 16 results in
// 15 combining steps of two vpermt2d and one max / add), and the 16 divisions are two vdivps. A
// row's last blocks that do not fill 16 go one at a time. Measured on the 2-core Zen 4 (perf, a
// 256-token NVFP4 product 4096 -> 2048, 2 threads): quantizing took 3.3% of it against the AVX2
// quantizer's 3.9%, its time then on the loads of x (4 MiB, from L3 or DRAM).
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/cpu/kernels_cpu.h"

namespace fp4moe::kernels {
namespace {

// Fixed loops fully unrolled, so the 16 vectors stay in registers (GCC otherwise keeps such
// arrays on the stack; see gemm_avx2.cc).
#define FP4MOE_UNROLL _Pragma("GCC unroll 16")

constexpr int32_t kMaxFiniteBits = 0x7F7FFFFF;
constexpr int kGroup = 16;  // blocks reduced together

// One step of the transpose tree: a and b each hold n results' partial values in n-lane runs
// (lanes [r * 16 / n, (r + 1) * 16 / n) for result r); returns the 2n results of a then b, each
// combined over adjacent lane pairs.
template <bool kMax>
[[gnu::always_inline]] inline __m512i combine(__m512i a, __m512i b) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512i e = _mm512_permutex2var_epi32(a, even, b);
  const __m512i o = _mm512_permutex2var_epi32(a, odd, b);
  return kMax ? _mm512_max_epi32(e, o) : _mm512_add_epi32(e, o);
}

// v[i] -> lane i of the result: the max (kMax) or sum of v[i]'s 16 lanes, exactly.
template <bool kMax>
[[gnu::always_inline]] inline __m512i reduce16(__m512i (&v)[kGroup]) {
  __m512i w[8];
  FP4MOE_UNROLL
  for (int j = 0; j < 8; ++j) w[j] = combine<kMax>(v[2 * j], v[2 * j + 1]);
  FP4MOE_UNROLL
  for (int j = 0; j < 4; ++j) w[j] = combine<kMax>(w[2 * j], w[2 * j + 1]);
  FP4MOE_UNROLL
  for (int j = 0; j < 2; ++j) w[j] = combine<kMax>(w[2 * j], w[2 * j + 1]);
  return combine<kMax>(w[0], w[1]);
}

inline __m512i abs_bits(const float* p) {
  return _mm512_and_si512(_mm512_loadu_si512(p), _mm512_set1_epi32(0x7FFFFFFF));
}

// The codes of 16 values: nearest-even of (x * pre) * inv.
inline __m512i codes(const float* p, __m512 pre, __m512 inv) {
  return _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(p), pre), inv));
}

// Blocks [b0, b0 + kGroup) of one row (block values per block: kBlock, 16 or 32).
template <int kBlock>
inline void quantize_group(const float* xr, int8_t* qr, float* sr, int32_t* orow, int64_t b0) {
  constexpr int kVecs = kBlock / 16;
  __m512i v[kGroup];
  FP4MOE_UNROLL
  for (int j = 0; j < kGroup; ++j) {
    const float* xb = xr + (b0 + j) * kBlock;
    v[j] = abs_bits(xb);
    FP4MOE_UNROLL
    for (int h = 1; h < kVecs; ++h) v[j] = _mm512_max_epi32(v[j], abs_bits(xb + 16 * h));
  }
  const __m512i amax_bits = reduce16<true>(v);
  const __mmask16 finite = _mm512_cmple_epi32_mask(amax_bits, _mm512_set1_epi32(kMaxFiniteBits));
  const __mmask16 nonzero = _mm512_test_epi32_mask(amax_bits, amax_bits);
  const __mmask16 ok = finite & nonzero;
  const __m512 amax = _mm512_castsi512_ps(amax_bits);
  const __mmask16 tiny = _mm512_cmp_ps_mask(amax, _mm512_set1_ps(kW4a8TinyAmax), _CMP_LT_OQ);
  const __m512 pre = _mm512_mask_blend_ps(tiny, _mm512_set1_ps(1.0f), _mm512_set1_ps(0x1p64f));
  alignas(64) float pre_s[kGroup], inv_s[kGroup];
  _mm512_store_ps(pre_s, pre);
  _mm512_store_ps(inv_s, _mm512_div_ps(_mm512_set1_ps(127.0f), _mm512_mul_ps(amax, pre)));
  // Non-finite blocks: a NaN scale; all-zero blocks: 0 / 127; both: zero codes and offset.
  const __m512 scale =
      _mm512_mask_blend_ps(finite, _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)),
                           _mm512_div_ps(amax, _mm512_set1_ps(127.0f)));
  _mm512_storeu_ps(sr + b0, scale);
  FP4MOE_UNROLL
  for (int j = 0; j < kGroup; ++j) {
    const __m512 pj = _mm512_set1_ps(pre_s[j]), ij = _mm512_set1_ps(inv_s[j]);
    const __mmask16 keep = (ok >> j) & 1 ? 0xFFFF : 0;
    int8_t* qb = qr + (b0 + j) * kBlock;
    const float* xb = xr + (b0 + j) * kBlock;
    __m512i sum = _mm512_setzero_si512();
    FP4MOE_UNROLL
    for (int h = 0; h < kVecs; ++h) {
      const __m512i c = _mm512_maskz_mov_epi32(keep, codes(xb + 16 * h, pj, ij));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 16 * h), _mm512_cvtepi32_epi8(c));
      sum = _mm512_add_epi32(sum, c);
    }
    v[j] = sum;
  }
  const __m512i offsets =
      _mm512_mullo_epi32(reduce16<false>(v), _mm512_set1_epi32(-kW4a8CodeOffset));
  _mm512_storeu_si512(orow + b0, offsets);
}

// One block alone (a row's last blocks that do not fill a group), the same operations.
template <int kBlock>
inline void quantize_block(const float* xb, int8_t* qb, float* scale, int32_t* offset) {
  constexpr int kVecs = kBlock / 16;
  __m512i a = abs_bits(xb);
  FP4MOE_UNROLL
  for (int h = 1; h < kVecs; ++h) a = _mm512_max_epi32(a, abs_bits(xb + 16 * h));
  const int32_t amax_bits = _mm512_reduce_max_epi32(a);
  float amax_f;
  std::memcpy(&amax_f, &amax_bits, sizeof amax_f);
  if (amax_bits > kMaxFiniteBits || amax_bits == 0) {
    *scale = amax_bits == 0 ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    *offset = 0;
    std::memset(qb, 0, kBlock);
    return;
  }
  const float pre_f = amax_f < kW4a8TinyAmax ? 0x1p64f : 1.0f;
  const __m512 pre = _mm512_set1_ps(pre_f), inv = _mm512_set1_ps(127.0f / (amax_f * pre_f));
  __m512i sum = _mm512_setzero_si512();
  FP4MOE_UNROLL
  for (int h = 0; h < kVecs; ++h) {
    const __m512i c = codes(xb + 16 * h, pre, inv);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 16 * h), _mm512_cvtepi32_epi8(c));
    sum = _mm512_add_epi32(sum, c);
  }
  *scale = amax_f / 127.0f;
  *offset = -kW4a8CodeOffset * _mm512_reduce_add_epi32(sum);
}

template <int kBlock>
void quantize_rows(const float* x, int64_t ldx, int64_t m, int64_t k, int8_t* q, float* scales,
                   int32_t* offsets) {
  const int64_t blocks = k / kBlock;
  for (int64_t i = 0; i < m; ++i) {
    const float* xr = x + i * ldx;
    int8_t* qr = q + i * k;
    float* sr = scales + i * blocks;
    int32_t* orow = offsets + i * blocks;
    int64_t b = 0;
    for (; b + kGroup <= blocks; b += kGroup) quantize_group<kBlock>(xr, qr, sr, orow, b);
    for (; b < blocks; ++b) {
      quantize_block<kBlock>(xr + b * kBlock, qr + b * kBlock, sr + b, orow + b);
    }
  }
}

}  // namespace

void quantize_activations_int8_avx512(const float* x, int64_t ldx, int64_t m, int64_t k, int block,
                                      int8_t* q, float* scales, int32_t* offsets) {
  if (block == 16) {
    quantize_rows<16>(x, ldx, m, k, q, scales, offsets);
  } else if (block == 32) {
    quantize_rows<32>(x, ldx, m, k, q, scales, offsets);
  } else {
    // Other block sizes (none of the FP4 formats' today) take the AVX2 quantizer's route.
    quantize_activations_int8_avx2(x, ldx, m, k, block, q, scales, offsets);
  }
}

}  // namespace fp4moe::kernels
