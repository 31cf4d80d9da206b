// Helpers shared by the AVX2 kernel files (gemm_avx2.cc, w4a8_avx2.cc) and by the AVX-512 files'
// one-tile paths (8 rows on ymm). Only for files compiled with the AVX2 flags or above: include
// nothing of this from code that runs before dispatch. Internal linkage, as fp4_avx512.h: files
// compiled with different ISA flags include it, and one shared out-of-line copy could carry one
// file's instructions into another's callers.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/prefetch.h"
#include "kernels/types.h"

namespace fp4moe::kernels::avx2 {
namespace {

// 2 * e2m1(code) for codes 0..15, signed, repeated in both 128-bit lanes (pshufb is in-lane): the
// exact path's decode (gemm_avx2.cc) and the W4A8 wide path's signed weights (w4a8_avx2.cc).
inline __m256i e2m1_x2_lut() {
  return _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,  //
                          0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
}

// The 8 rows' block scales as floats. UE4M3 -> F32: code << 20 lands the 4 exponent and 3
// mantissa bits in F32's fields (bias 127 instead of 7, so times 2^120); F32 subnormals make
// E4M3's subnormals exact too. E8M0 -> F32: code << 23 is 2^(code - 127) for codes 1..254; code
// 0 is 2^-127, the F32 subnormal 0x00400000, OR-ed in where the code is 0 (pack/ rejects the NaN
// code 0xFF).
// The UE4M3 codes' bits shifted into place, before the times 2^120.
inline __m256 nvfp4_scale_bits(const uint8_t* codes) {
  const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(c, 20));
}

template <WeightFormat kFormat>
inline __m256 decode_block_scales(const uint8_t* codes) {
  if constexpr (kFormat == WeightFormat::kNvfp4) {
    return _mm256_mul_ps(nvfp4_scale_bits(codes), _mm256_set1_ps(0x1p120f));
  } else {
    const __m256i c =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
    const __m256i zero_code = _mm256_cmpeq_epi32(c, _mm256_setzero_si256());
    return _mm256_castsi256_ps(_mm256_or_si256(
        _mm256_slli_epi32(c, 23), _mm256_and_si256(zero_code, _mm256_set1_epi32(0x00400000))));
  }
}

// FP4 tile t of w: its codes, its block scales, and how many of its 8 rows are real (the last
// tile of N may be partial).
struct Fp4Tile {
  const uint8_t* codes;
  const uint8_t* scales;
  int rows;
};
inline int tile_rows(const PackedMatrix& w, int64_t t) {
  return static_cast<int>(std::min<int64_t>(kTileRows, w.n - t * kTileRows));
}
inline Fp4Tile fp4_tile_at(const PackedMatrix& w, int64_t t) {
  const int64_t k_blocks = w.k / weight_format_k_block(w.format);
  return {w.codes + t * w.chunks * kChunkBytes, w.block_scales + t * k_blocks * kTileRows,
          tile_rows(w, t)};
}

// Stores the first `rows` lanes of v (a partial last tile must not write past row N).
inline void store_rows(float* y, __m256 v, int rows) {
  if (rows == kTileRows) {
    _mm256_storeu_ps(y, v);
  } else {
    alignas(32) float tmp[kTileRows];
    _mm256_store_ps(tmp, v);
    std::memcpy(y, tmp, sizeof(float) * rows);
  }
}

}  // namespace
}  // namespace fp4moe::kernels::avx2
