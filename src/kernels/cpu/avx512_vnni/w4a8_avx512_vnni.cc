// AVX-512 VNNI W4A8 kernels (types.h, "W4A8"); compiled with the AVX-512 and VNNI flags only.
//
// The AVX2 W4A8 kernel's arithmetic (cpu/avx2/w4a8_avx2.cc) on two 8-row tiles per zmm (16 rows):
// one in-lane pshufb per 32-byte chunk pair transposes each 4x4 byte block so dword r holds one
// row's 4 consecutive k, one pshufb per nibble half maps codes to u = 2 * e2m1 + 12 in [0, 24],
// and one vpdpbusd per half adds u * q over those 4 k straight into the int32 sums. That replaces
// AVX2's pmaddubsw + int16 adds + pmaddwd + int32 add (VNNI is where this family pays). A chain
// that starts at -12 * sum(q) gives sum((2 * e2m1) * q) exactly per block, and
// fma(float(sum), fl(weight scale * activation scale), total) is the scalar kernel's operation, so
// the bits agree with it and with the AVX2 kernel. There is no AVX-512 W4A8 kernel without VNNI:
// such hosts run the AVX2 one (the ISA levels are nested, registry.h).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/avx512/fp4_avx512.h"
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/cpu/mca.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/token_groups.h"

namespace fp4moe::kernels {
namespace {

// Fixed small loops fully unrolled so decoded vectors and totals stay in registers (GCC otherwise
// keeps such arrays on the stack; see gemm_avx2.cc).
#define FP4MOE_UNROLL _Pragma("GCC unroll 16")

using avx512::decode_block_scales;
using avx512::Fp4TilePair;
using avx512::load_pair;
using avx512::row_mask;

constexpr int32_t kCodeOffset = 12;  // u = 2 * e2m1 + 12

inline __m512i offset_e2m1_x2_lut() {
  return _mm512_broadcast_i32x4(
      _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
}

// In-lane 4x4 byte transpose: output byte 4r + j takes input byte 4j + r.
inline __m512i transpose4x4_ctrl() {
  return _mm512_broadcast_i32x4(
      _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
}

inline __m512i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm512_set1_epi32(v);
}

template <WeightFormat kFormat>
constexpr int kBlock = kFormat == WeightFormat::kNvfp4 ? 16 : 32;
template <WeightFormat kFormat>
constexpr int kChunks = kBlock<kFormat> / kFp4ChunkK;  // 2 or 4

// One K block of a tile pair, decoded: lo[c] / hi[c] hold k 0-3 / 4-7 of chunk c, dword = row.
// A missing second tile decodes as code 0 (u = 12), whose sum the offset cancels; its rows are
// never stored.
template <int kN>
struct DecodedPair {
  __m512i lo[kN], hi[kN];
};

template <int kN>
[[gnu::always_inline]] inline void decode_pair(const uint8_t* a, const uint8_t* b,
                                               DecodedPair<kN>& d) {
  const __m512i lut = offset_e2m1_x2_lut();
  const __m512i transpose = transpose4x4_ctrl();
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  prefetch_ahead(a, kN * kChunkBytes);
  prefetch_ahead(b, kN * kChunkBytes);
  FP4MOE_UNROLL
  for (int c = 0; c < kN; ++c) {
    const __m512i v = _mm512_shuffle_epi8(
        load_pair(a + c * kChunkBytes, b == nullptr ? nullptr : b + c * kChunkBytes), transpose);
    d.lo[c] = _mm512_shuffle_epi8(lut, _mm512_and_si512(v, low4));
    d.hi[c] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), low4));
  }
}

// Block b of a tile pair: its codes decoded and its 16 rows' weight scales.
template <WeightFormat kFormat>
struct PairBlock {
  DecodedPair<kChunks<kFormat>> codes;
  __m512 w_scale;
};

template <WeightFormat kFormat>
[[gnu::always_inline]] inline void decode_pair_block(const Fp4TilePair& p, int64_t b,
                                                     PairBlock<kFormat>& out) {
  const int64_t off = b * kChunks<kFormat> * kChunkBytes;
  decode_pair(p.codes_a + off, p.b_codes(off), out.codes);
  out.w_scale = decode_block_scales<kFormat>(p.scales_a + b * kTileRows, p.b_scales(b));
}

// sum(u * q) - 12 * sum(q) = sum((2 * e2m1) * q) over the block per row, exactly in int32
// (|.| <= 32 * 24 * 128 + 12 * 32 * 128): the low-nibble chain starts at -12 * sum(q) instead of
// zero, so the offset costs no subtraction per token; two independent vpdpbusd chains (low and
// high nibble halves) for latency.
template <int kN>
[[gnu::always_inline]] inline __m512i block_dot(const DecodedPair<kN>& d, const int8_t* q,
                                                int32_t q_sum) {
  __m512i lo = _mm512_set1_epi32(-kCodeOffset * q_sum), hi = _mm512_setzero_si512();
  FP4MOE_UNROLL
  for (int c = 0; c < kN; ++c) {
    lo = _mm512_dpbusd_epi32(lo, d.lo[c], broadcast4(q + 8 * c));
    hi = _mm512_dpbusd_epi32(hi, d.hi[c], broadcast4(q + 8 * c + 4));
  }
  return _mm512_add_epi32(lo, hi);
}

// total + float(sum) * fl(weight scale * activation scale), lane by lane.
inline __m512 accumulate_block(__m512i sum, __m512 w_scale, float act_scale, __m512 total) {
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(w_scale, _mm512_set1_ps(act_scale)),
                         total);
}

// MR tokens (from token i0) against one tile pair over all of K, totals in registers.
template <WeightFormat kFormat, int MR>
inline void w4a8_pair(const PackedMatrix& w, const Fp4TilePair& p, const QuantizedActivations& x,
                      int64_t i0, float* y, int64_t ldy) {
  const int64_t k_blocks = w.k / kBlock<kFormat>;
  __m512 total[MR];
  FP4MOE_UNROLL
  for (int i = 0; i < MR; ++i) total[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < k_blocks; ++b) {
    FP4MOE_MCA_BLOCK_BEGIN("w4a8", "avx512_vnni");
    PairBlock<kFormat> blk;
    decode_pair_block(p, b, blk);
    FP4MOE_UNROLL
    for (int i = 0; i < MR; ++i) {
      const int64_t s = (i0 + i) * x.lds + b;
      total[i] = accumulate_block(
          block_dot(blk.codes, x.q + (i0 + i) * x.ldq + b * kBlock<kFormat>, x.sums[s]),
          blk.w_scale, x.scales[s], total[i]);
    }
    FP4MOE_MCA_BLOCK_END();
  }
  const __m512 out_scale = _mm512_set1_ps(w.tensor_scale * 0.5f);
  FP4MOE_UNROLL
  for (int i = 0; i < MR; ++i) {
    _mm512_mask_storeu_ps(y + (i0 + i) * ldy, row_mask(p.rows), _mm512_mul_ps(total[i], out_scale));
  }
}

// Many tokens against one tile pair: each block is decoded once and every token (up to
// kManyTokens per pass) runs over it, its totals in an L1-resident array (as the AVX2 kernel's
// many-token path, which measured faster from 8 tokens on).
constexpr int64_t kManyTokens = 64;
constexpr int64_t kManyTokensMin = 8;

template <WeightFormat kFormat>
inline void w4a8_pair_many(const PackedMatrix& w, const Fp4TilePair& p,
                           const QuantizedActivations& x, int64_t m, float* y, int64_t ldy) {
  constexpr int kRows = 2 * kTileRows;
  const int64_t k_blocks = w.k / kBlock<kFormat>;
  const __m512 out_scale = _mm512_set1_ps(w.tensor_scale * 0.5f);
  alignas(64) float totals[kManyTokens * kRows];
  for (int64_t i0 = 0; i0 < m; i0 += kManyTokens) {
    const int64_t mb = std::min(kManyTokens, m - i0);
    for (int64_t i = 0; i < mb; ++i) _mm512_store_ps(totals + i * kRows, _mm512_setzero_ps());
    for (int64_t b = 0; b < k_blocks; ++b) {
      PairBlock<kFormat> blk;
      decode_pair_block(p, b, blk);
      for (int64_t i = 0; i < mb; ++i) {
        const int64_t s = (i0 + i) * x.lds + b;
        float* tot = totals + i * kRows;
        _mm512_store_ps(
            tot, accumulate_block(
                     block_dot(blk.codes, x.q + (i0 + i) * x.ldq + b * kBlock<kFormat>, x.sums[s]),
                     blk.w_scale, x.scales[s], _mm512_load_ps(tot)));
      }
    }
    for (int64_t i = 0; i < mb; ++i) {
      _mm512_mask_storeu_ps(y + (i0 + i) * ldy, row_mask(p.rows),
                            _mm512_mul_ps(_mm512_load_ps(totals + i * kRows), out_scale));
    }
  }
}

template <WeightFormat kFormat>
void w4a8_gemm_avx512_vnni(const PackedMatrix& w, const QuantizedActivations& x, int64_t m,
                           float* y, int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  for (int64_t t = tile_begin; t < tile_end; t += 2) {
    const Fp4TilePair p = avx512::fp4_tile_pair(w, t, tile_end);
    float* yt = y + p.first_row;
    if (m >= kManyTokensMin) {
      w4a8_pair_many<kFormat>(w, p, x, m, yt, ldy);
      continue;
    }
    for_token_groups<4>(m, [&](auto mr, int64_t i) {
      w4a8_pair<kFormat, decltype(mr)::value>(w, p, x, i, yt, ldy);
    });
  }
}

}  // namespace

void nvfp4_gemm_w4a8_16r_avx512_vnni(const PackedMatrix& w, const QuantizedActivations& x,
                                     int64_t m, float* y, int64_t ldy, int64_t tile_begin,
                                     int64_t tile_end) {
  w4a8_gemm_avx512_vnni<WeightFormat::kNvfp4>(w, x, m, y, ldy, tile_begin, tile_end);
}

void mxfp4_gemm_w4a8_16r_avx512_vnni(const PackedMatrix& w, const QuantizedActivations& x,
                                     int64_t m, float* y, int64_t ldy, int64_t tile_begin,
                                     int64_t tile_end) {
  w4a8_gemm_avx512_vnni<WeightFormat::kMxfp4>(w, x, m, y, ldy, tile_begin, tile_end);
}

}  // namespace fp4moe::kernels
