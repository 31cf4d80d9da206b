// AVX-512 (F/BW/VL/DQ) kernels over the kernel layout (types.h): the same decode as the AVX2
// kernels, on two 8-row tiles at once so one zmm holds 16 output rows. Compiled with only the
// AVX-512 flags; dispatch/ calls them only when cpuid and XCR0 (opmask + zmm state) allow.
//
// No VNNI / BF16 / VBMI variants: these kernels are W4A16 (the decoded weight times the F32
// activation, accumulated in F32). VNNI is an int8 dot product: it pays in the W4A8 kernels
// (cpu/avx512_vnni/), not here; vdpbf16ps would round the activations to BF16 (exact only for BF16
// inputs) and flushes subnormals; VBMI's 64-entry vpermb buys nothing over pshufb for a 16-entry
// table.
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/avx512/fp4_avx512.h"
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/cpu/mca.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/token_groups.h"

namespace fp4moe::kernels {
namespace {

using avx512::decode_block_scales;
using avx512::Fp4TilePair;
using avx512::load_pair;
using avx512::row_mask;

constexpr float kFp4DecodeFactor = 1.0f / 33554432.0f;  // 2^-25: undoes (2 * e2m1) << 24

inline __m512i e2m1_x2_lut() {
  return _mm512_broadcast_i32x4(
      _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12));
}

inline __m512i top_byte_ctrl(int j) {
  auto dw = [j](int r) { return static_cast<int>(0x00808080u | (uint32_t(4 * j + r) << 24)); };
  return _mm512_broadcast_i32x4(_mm_setr_epi32(dw(0), dw(1), dw(2), dw(3)));
}

template <WeightFormat kFormat, int MR>
inline void fp4_pair(const PackedMatrix& w, const Fp4TilePair& p, const float* x, int64_t ldx,
                     float* y, int64_t ldy) {
  // 32 zmm registers: 4 independent FMA chains per token at every MR (see gemm_avx2.cc).
  constexpr int kChains = 4;
  constexpr int kChunksPerBlock = (kFormat == WeightFormat::kNvfp4 ? 16 : 32) / kFp4ChunkK;
  const int64_t k_blocks = w.chunks / kChunksPerBlock;
  const __m512i lut = e2m1_x2_lut();
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i ctrl[4] = {top_byte_ctrl(0), top_byte_ctrl(1), top_byte_ctrl(2), top_byte_ctrl(3)};
  __m512 total[MR];
  for (int i = 0; i < MR; ++i) total[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < k_blocks; ++b) {
    FP4MOE_MCA_BLOCK_BEGIN("exact", "avx512");
    __m512 block[MR][kChains];
    for (int i = 0; i < MR; ++i) {
      for (int c = 0; c < kChains; ++c) block[i][c] = _mm512_setzero_ps();
    }
    const int64_t block_off = b * kChunksPerBlock * kChunkBytes;
    prefetch_ahead(p.codes_a + block_off, kChunksPerBlock * kChunkBytes);
    prefetch_ahead(p.b_codes(block_off), kChunksPerBlock * kChunkBytes);
    for (int c = 0; c < kChunksPerBlock; ++c) {
      const int64_t off = (b * kChunksPerBlock + c) * kChunkBytes;
      const __m512i v = load_pair(p.codes_a + off, p.b_codes(off));
      const __m512i lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(v, low4));
      const __m512i hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), low4));
      const float* xk = x + (b * kChunksPerBlock + c) * kFp4ChunkK;
      for (int kk = 0; kk < kFp4ChunkK; ++kk) {
        const __m512i codes = kk < 4 ? lo : hi;
        const __m512 wv = _mm512_cvtepi32_ps(_mm512_shuffle_epi8(codes, ctrl[kk % 4]));
        for (int i = 0; i < MR; ++i) {
          block[i][kk % kChains] =
              _mm512_fmadd_ps(wv, _mm512_set1_ps(xk[i * ldx + kk]), block[i][kk % kChains]);
        }
      }
    }
    const __m512 scale = decode_block_scales<kFormat>(p.scales_a + b * kTileRows, p.b_scales(b));
    for (int i = 0; i < MR; ++i) {
      __m512 sum = block[i][0];
      for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, block[i][c]);
      total[i] = _mm512_fmadd_ps(sum, scale, total[i]);
    }
    FP4MOE_MCA_BLOCK_END();
  }
  const __m512 out_scale = _mm512_set1_ps(w.tensor_scale * kFp4DecodeFactor);
  for (int i = 0; i < MR; ++i) {
    _mm512_mask_storeu_ps(y + i * ldy, row_mask(p.rows), _mm512_mul_ps(total[i], out_scale));
  }
}

template <WeightFormat kFormat>
void fp4_gemm_avx512(const PackedMatrix& w, const float* x, int64_t ldx, int64_t m, float* y,
                     int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  for (int64_t t = tile_begin; t < tile_end; t += 2) {
    const Fp4TilePair p = avx512::fp4_tile_pair(w, t, tile_end);
    float* yt = y + p.first_row;
    for_token_groups<4>(m, [&](auto mr, int64_t i) {
      fp4_pair<kFormat, decltype(mr)::value>(w, p, x + i * ldx, ldx, yt + i * ldy, ldy);
    });
  }
}

// FP8: the AVX2 FP16 route per tile (see gemm_avx2.cc), then the two tiles' 8-row halves of one k
// are joined (vperm2i128) so one vcvtph2ps makes 16 rows.
inline __m256i e4m3_to_fp16_words(__m256i bytes_as_words) {
  return _mm256_and_si256(_mm256_srai_epi16(bytes_as_words, 1),
                          _mm256_set1_epi16(static_cast<int16_t>(0xBFFF)));
}

template <int MR, bool kTail>
inline void fp8_chunk(const uint8_t* a, const uint8_t* b, const float* xk, int64_t ldx, int valid_k,
                      __m512 (&block)[MR][4]) {
  const __m256i zero = _mm256_setzero_si256();
  const __m256i va = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  const __m256i vb = b == nullptr ? zero : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
  const __m256i ea = e4m3_to_fp16_words(_mm256_unpacklo_epi8(zero, va));  // k0 | k2
  const __m256i oa = e4m3_to_fp16_words(_mm256_unpackhi_epi8(zero, va));  // k1 | k3
  const __m256i eb = e4m3_to_fp16_words(_mm256_unpacklo_epi8(zero, vb));
  const __m256i ob = e4m3_to_fp16_words(_mm256_unpackhi_epi8(zero, vb));
  const __m512 wk[4] = {_mm512_cvtph_ps(_mm256_permute2x128_si256(ea, eb, 0x20)),
                        _mm512_cvtph_ps(_mm256_permute2x128_si256(oa, ob, 0x20)),
                        _mm512_cvtph_ps(_mm256_permute2x128_si256(ea, eb, 0x31)),
                        _mm512_cvtph_ps(_mm256_permute2x128_si256(oa, ob, 0x31))};
  for (int j = 0; j < kFp8ChunkK; ++j) {
    if (kTail && j >= valid_k) break;
    for (int i = 0; i < MR; ++i) {
      block[i][j] = _mm512_fmadd_ps(wk[j], _mm512_set1_ps(xk[i * ldx + j]), block[i][j]);
    }
  }
}

template <int MR>
inline void fp8_pair(const PackedMatrix& w, const uint8_t* tile_a, const uint8_t* tile_b,
                     const float* scales, const float* x, int64_t ldx, float* y, int64_t ldy,
                     int rows) {
  constexpr int64_t kChunksPerBlock = kFp8ScaleBlock / kFp8ChunkK;
  const int64_t full_chunks = w.k / kFp8ChunkK;
  const int tail_k = static_cast<int>(w.k % kFp8ChunkK);
  const int64_t k_blocks = (w.k + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  __m512 total[MR];
  for (int i = 0; i < MR; ++i) total[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < k_blocks; ++b) {
    __m512 block[MR][4];  // one chain per k of a chunk
    for (int i = 0; i < MR; ++i) {
      for (int c = 0; c < 4; ++c) block[i][c] = _mm512_setzero_ps();
    }
    const int64_t c_end = std::min(full_chunks, (b + 1) * kChunksPerBlock);
    const int64_t block_off = b * kChunksPerBlock * kChunkBytes;
    const int64_t block_bytes = (c_end - b * kChunksPerBlock) * kChunkBytes;
    prefetch_ahead(tile_a + block_off, block_bytes);
    prefetch_ahead(tile_b == nullptr ? nullptr : tile_b + block_off, block_bytes);
    for (int64_t c = b * kChunksPerBlock; c < c_end; ++c) {
      const int64_t off = c * kChunkBytes;
      fp8_chunk<MR, false>(tile_a + off, tile_b == nullptr ? nullptr : tile_b + off,
                           x + c * kFp8ChunkK, ldx, kFp8ChunkK, block);
    }
    if (b == k_blocks - 1 && tail_k != 0) {
      const int64_t off = full_chunks * kChunkBytes;
      fp8_chunk<MR, true>(tile_a + off, tile_b == nullptr ? nullptr : tile_b + off,
                          x + full_chunks * kFp8ChunkK, ldx, tail_k, block);
    }
    // Both tiles of a pair share the 128-row scale block (see the caller).
    const __m512 scale = _mm512_set1_ps(scales[b] * 256.0f);
    for (int i = 0; i < MR; ++i) {
      const __m512 sum = _mm512_add_ps(_mm512_add_ps(block[i][0], block[i][1]),
                                       _mm512_add_ps(block[i][2], block[i][3]));
      total[i] = _mm512_fmadd_ps(sum, scale, total[i]);
    }
  }
  for (int i = 0; i < MR; ++i) _mm512_mask_storeu_ps(y + i * ldy, row_mask(rows), total[i]);
}

}  // namespace

void nvfp4_gemm_16r_avx512(const PackedMatrix& w, const float* x, int64_t ldx, int64_t m, float* y,
                           int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  fp4_gemm_avx512<WeightFormat::kNvfp4>(w, x, ldx, m, y, ldy, tile_begin, tile_end);
}

void mxfp4_gemm_16r_avx512(const PackedMatrix& w, const float* x, int64_t ldx, int64_t m, float* y,
                           int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  fp4_gemm_avx512<WeightFormat::kMxfp4>(w, x, ldx, m, y, ldy, tile_begin, tile_end);
}

void fp8b128_gemm_16r_avx512(const PackedMatrix& w, const float* x, int64_t ldx, int64_t m,
                             float* y, int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  const int64_t k_blocks = (w.k + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  for (int64_t t = tile_begin; t < tile_end;) {
    // Pair tiles (t, t + 1) only from an even t: 16 divides 128, so both then lie in one 128-row
    // scale block. A range that starts odd runs its first tile alone.
    const bool pair = t + 1 < tile_end && t % 2 == 0;
    const uint8_t* tile_a = w.codes + t * w.chunks * kChunkBytes;
    const uint8_t* tile_b = pair ? tile_a + w.chunks * kChunkBytes : nullptr;
    const float* scales = w.fp8_scales + (t * kTileRows / kFp8ScaleBlock) * k_blocks;
    const int rows =
        static_cast<int>(std::min<int64_t>(pair ? 2 * kTileRows : kTileRows, w.n - t * kTileRows));
    float* yt = y + t * kTileRows;
    for_token_groups<4>(m, [&](auto mr, int64_t i) {
      fp8_pair<decltype(mr)::value>(w, tile_a, tile_b, scales, x + i * ldx, ldx, yt + i * ldy, ldy,
                                    rows);
    });
    t += pair ? 2 : 1;
  }
}

}  // namespace fp4moe::kernels
