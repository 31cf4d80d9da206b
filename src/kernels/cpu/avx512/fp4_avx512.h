// Helpers shared by the AVX-512 kernel files (cpu/avx512/gemm_avx512.cc,
// cpu/avx512_vnni/w4a8_avx512_vnni.cc, cpu/avx512_bf16/gemm_bf16_avx512.cc): two 8-row tiles side
// by side in one zmm (16 rows).
//
// Internal linkage on purpose: the files that include this are compiled with different ISA flags
// (AVX-512 with and without VNNI), and one shared out-of-line copy of an inline function could
// carry one file's instructions into the other's callers.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/types.h"

namespace fp4moe::kernels::avx512 {
namespace {

// 32 bytes of tile t in the low half, 32 bytes of tile t + 1 (or zeros) in the high half.
inline __m512i load_pair(const uint8_t* a, const uint8_t* b) {
  const __m512i lo =
      _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
  if (b == nullptr) return lo;
  return _mm512_inserti64x4(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
}

// 16 rows' block scales as floats (8 codes of tile a, then 8 of tile b or zeros). UE4M3 and E8M0
// are decoded as in the AVX2 kernels (cpu/avx2/fp4_avx2.h), E8M0 code 0 = 2^-127 included.
template <WeightFormat kFormat>
inline __m512 decode_block_scales(const uint8_t* a, const uint8_t* b) {
  const __m128i lo = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(a));
  const __m128i hi =
      b == nullptr ? _mm_setzero_si128() : _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b));
  const __m512i c = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(lo, hi));
  if constexpr (kFormat == WeightFormat::kNvfp4) {
    return _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(c, 20)), _mm512_set1_ps(0x1p120f));
  } else {
    // Code 0 is 2^-127, the F32 subnormal 0x00400000 (code << 23 would give 0).
    const __mmask16 zero_code = _mm512_cmpeq_epi32_mask(c, _mm512_setzero_si512());
    return _mm512_castsi512_ps(
        _mm512_mask_mov_epi32(_mm512_slli_epi32(c, 23), zero_code, _mm512_set1_epi32(0x00400000)));
  }
}

// The first `rows` of 16 lanes: a partial last tile must not write past row N.
inline __mmask16 row_mask(int rows) { return static_cast<__mmask16>((1u << rows) - 1u); }

// FP4 tiles t and t + 1 of `w`, run as one 16-row pair; the second is absent (nullptr) when t is
// the last tile of the range. `rows` counts the real rows of the pair (the last tile of N may be
// partial), `y` points at row t * 8 of an output row.
struct Fp4TilePair {
  const uint8_t* codes_a;
  const uint8_t* codes_b;
  const uint8_t* scales_a;
  const uint8_t* scales_b;
  int rows;
  int64_t first_row;

  // Chunk bytes at offset `off` within each tile, and block `b`'s 8 scale codes of each tile.
  const uint8_t* b_codes(int64_t off) const { return codes_b == nullptr ? nullptr : codes_b + off; }
  const uint8_t* b_scales(int64_t b) const {
    return scales_b == nullptr ? nullptr : scales_b + b * kTileRows;
  }
};

// Prefetches block b (block_bytes per tile) of pair p into L1, with its scale line every 8 blocks
// (8 blocks' scales per 64-byte line): the int8 many-token kernels fetch the next tile set's
// blocks of a slice while they decode the current one (a slice is only part of a tile, so the
// bytes that follow it, which prefetch_ahead would fetch, are read much later). always_inline, as
// prefetch_ahead: GCC 12 deletes calls to a function that only prefetches.
[[gnu::always_inline]] inline void prefetch_pair_block(const Fp4TilePair& p, int64_t b,
                                                       int64_t block_bytes) {
  const int64_t off = b * block_bytes;
  for (int64_t line = 0; line < block_bytes; line += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(p.codes_a + off + line), _MM_HINT_T0);
    if (p.codes_b != nullptr) {
      _mm_prefetch(reinterpret_cast<const char*>(p.codes_b + off + line), _MM_HINT_T0);
    }
  }
  if (b % 8 == 0) {
    _mm_prefetch(reinterpret_cast<const char*>(p.scales_a + b * kTileRows), _MM_HINT_T0);
    if (p.scales_b != nullptr) {
      _mm_prefetch(reinterpret_cast<const char*>(p.scales_b + b * kTileRows), _MM_HINT_T0);
    }
  }
}

inline Fp4TilePair fp4_tile_pair(const PackedMatrix& w, int64_t t, int64_t tile_end) {
  const int64_t k_blocks = w.k / weight_format_k_block(w.format);
  const bool pair = t + 1 < tile_end;
  Fp4TilePair p;
  p.codes_a = w.codes + t * w.chunks * kChunkBytes;
  p.codes_b = pair ? p.codes_a + w.chunks * kChunkBytes : nullptr;
  p.scales_a = w.block_scales + t * k_blocks * kTileRows;
  p.scales_b = pair ? p.scales_a + k_blocks * kTileRows : nullptr;
  p.rows =
      static_cast<int>(std::min<int64_t>(pair ? 2 * kTileRows : kTileRows, w.n - t * kTileRows));
  p.first_row = t * kTileRows;
  return p;
}

// FP8: the AVX2 FP16 route per tile (see gemm_avx2.cc), then the two tiles' 8-row halves of one k
// are joined (vperm2i128) so one vcvtph2ps makes 16 rows.
inline __m256i e4m3_to_fp16_words(__m256i bytes_as_words) {
  return _mm256_and_si256(_mm256_srai_epi16(bytes_as_words, 1),
                          _mm256_set1_epi16(static_cast<int16_t>(0xBFFF)));
}

// The 16 rows of an FP8 tile pair at the 4 k of one chunk (a: rows 0-7, b: rows 8-15 or zeros),
// as F32 times 2^-8 (the FP16 route's bias).
inline void fp8_chunk_rows(const uint8_t* a, const uint8_t* b, __m512 (&wk)[kFp8ChunkK]) {
  const __m256i zero = _mm256_setzero_si256();
  const __m256i va = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  const __m256i vb = b == nullptr ? zero : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
  const __m256i ea = e4m3_to_fp16_words(_mm256_unpacklo_epi8(zero, va));  // k0 | k2
  const __m256i oa = e4m3_to_fp16_words(_mm256_unpackhi_epi8(zero, va));  // k1 | k3
  const __m256i eb = e4m3_to_fp16_words(_mm256_unpacklo_epi8(zero, vb));
  const __m256i ob = e4m3_to_fp16_words(_mm256_unpackhi_epi8(zero, vb));
  wk[0] = _mm512_cvtph_ps(_mm256_permute2x128_si256(ea, eb, 0x20));
  wk[1] = _mm512_cvtph_ps(_mm256_permute2x128_si256(oa, ob, 0x20));
  wk[2] = _mm512_cvtph_ps(_mm256_permute2x128_si256(ea, eb, 0x31));
  wk[3] = _mm512_cvtph_ps(_mm256_permute2x128_si256(oa, ob, 0x31));
}

// FP8 tiles t and t + 1 from an even t (both in one 128-row scale block), or tile t alone.
struct Fp8Pair {
  const uint8_t* codes_a;
  const uint8_t* codes_b;  // nullptr: a lone tile
  const float* scales;     // the pair's row of [ceil(n/128), ceil(k/128)] scales
  int rows;
  int64_t first_row;
};

inline Fp8Pair fp8_pair_at(const PackedMatrix& w, int64_t t, bool with_next) {
  const int64_t k_blocks = (w.k + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  Fp8Pair p;
  p.codes_a = w.codes + t * w.chunks * kChunkBytes;
  p.codes_b = with_next ? p.codes_a + w.chunks * kChunkBytes : nullptr;
  p.scales = w.fp8_scales + (t * kTileRows / kFp8ScaleBlock) * k_blocks;
  p.rows = static_cast<int>(
      std::min<int64_t>(with_next ? 2 * kTileRows : kTileRows, w.n - t * kTileRows));
  p.first_row = t * kTileRows;
  return p;
}

}  // namespace
}  // namespace fp4moe::kernels::avx512
