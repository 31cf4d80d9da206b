// AVX2 + FMA + F16C kernels over the kernel layout (types.h). Compiled with only -mavx2 -mfma
// -mf16c; dispatch/ calls them only when cpuid and XCR0 say the host has those.
//
// FP4 decode, per 32-byte chunk (8 rows x 8 k): split nibbles (and, shift+and), one pshufb maps
// each nibble to int8 = 2 * e2m1 (exact, |v| <= 12), then per k one in-lane pshufb puts the 8
// rows' int8 in the top byte of 8 int32 lanes (v << 24, sign included) and cvtdq2ps makes them
// floats v * 2^24, exactly. The constant 2^-25 is applied once per output.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/avx2/fp4_avx2.h"
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/cpu/mca.h"
#include "kernels/cpu/token_groups.h"

namespace fp4moe::kernels {
namespace {

constexpr float kFp4DecodeFactor = 1.0f / 33554432.0f;  // 2^-25: undoes (2 * e2m1) << 24

// pshufb control moving the byte of k offset j of each row (types.h: byte 4r + j of the chunk, in
// its 128-bit lane) to the top byte of the row's dword and zeroing the rest (index bytes with the
// high bit set give 0).
inline __m256i top_byte_ctrl(int j) {
  auto dw = [j](int r) {
    return static_cast<int>(0x00808080u | (uint32_t(fp4_chunk_byte(r, j)) << 24));
  };
  return _mm256_setr_epi32(dw(0), dw(1), dw(2), dw(3), dw(0), dw(1), dw(2), dw(3));
}

// Small fixed loops over tokens, chains and k must be fully unrolled so the accumulator arrays
// become registers: GCC otherwise kept them on the stack (a load and a store around every FMA, the
// chain then bound by store forwarding), which the disassembly showed for MR >= 2 and for FP8.
#define FP4MOE_UNROLL _Pragma("GCC unroll 16")

using avx2::decode_block_scales;
using avx2::e2m1_x2_lut;
using avx2::store_rows;

// Independent FMA chains per token within a block: an FMA has 4 cycles of latency and a chunk
// issues one FMA per ~1 cycle per token, so one token needs 4 chains to be throughput-bound; from
// 2 tokens on, 2 chains each (more would spill: AVX2 has 16 ymm registers; measured, 2 tokens x 4
// chains spilled and ran slower than 2 x 2).
constexpr int chains_for(int mr) { return mr == 1 ? 4 : 2; }

// MR tokens against one tile.
template <WeightFormat kFormat, int MR>
inline void fp4_tile(const PackedMatrix& w, const uint8_t* tile, const uint8_t* scales,
                     const float* x, int64_t ldx, float* y, int64_t ldy, int rows) {
  constexpr int kChains = chains_for(MR);
  constexpr int kChunksPerBlock = (kFormat == WeightFormat::kNvfp4 ? 16 : 32) / kFp4ChunkK;
  const int64_t k_blocks = w.chunks / kChunksPerBlock;
  const __m256i lut = e2m1_x2_lut();
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i ctrl[4] = {top_byte_ctrl(0), top_byte_ctrl(1), top_byte_ctrl(2), top_byte_ctrl(3)};
  __m256 total[MR];
  FP4MOE_UNROLL
  for (int i = 0; i < MR; ++i) total[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < k_blocks; ++b) {
    FP4MOE_MCA_BLOCK_BEGIN("exact", "avx2");
    __m256 block[MR][kChains];
    FP4MOE_UNROLL
    for (int i = 0; i < MR; ++i) {
      FP4MOE_UNROLL
      for (int c = 0; c < kChains; ++c) block[i][c] = _mm256_setzero_ps();
    }
    prefetch_ahead(tile + b * kChunksPerBlock * kChunkBytes, kChunksPerBlock * kChunkBytes);
    for (int c = 0; c < kChunksPerBlock; ++c) {
      const int64_t chunk = b * kChunksPerBlock + c;
      const __m256i v =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + chunk * kChunkBytes));
      const __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, low4));
      const __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
      const float* xk = x + chunk * kFp4ChunkK;
      FP4MOE_UNROLL
      for (int kk = 0; kk < kFp4ChunkK; ++kk) {
        // k offsets 0-3 come from the low nibbles, 4-7 from the high ones (types.h).
        const __m256i codes = kk < 4 ? lo : hi;
        const __m256 wv = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(codes, ctrl[kk % 4]));
        FP4MOE_UNROLL
        for (int i = 0; i < MR; ++i) {
          block[i][kk % kChains] =
              _mm256_fmadd_ps(wv, _mm256_broadcast_ss(xk + i * ldx + kk), block[i][kk % kChains]);
        }
      }
    }
    const __m256 scale = decode_block_scales<kFormat>(scales + b * kTileRows);
    FP4MOE_UNROLL
    for (int i = 0; i < MR; ++i) {
      __m256 sum = block[i][0];
      FP4MOE_UNROLL
      for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, block[i][c]);
      total[i] = _mm256_fmadd_ps(sum, scale, total[i]);
    }
    FP4MOE_MCA_BLOCK_END();
  }
  const __m256 out_scale = _mm256_set1_ps(w.tensor_scale * kFp4DecodeFactor);
  FP4MOE_UNROLL
  for (int i = 0; i < MR; ++i) store_rows(y + i * ldy, _mm256_mul_ps(total[i], out_scale), rows);
}

// ---- Many tokens: decode a panel of the tiles once, then a register-blocked FMA kernel. -------
// From kPanelMinTokens tokens on, re-decoding the weights for every 4 tokens costs more than
// writing them once, scaled, to an L1-resident panel that every token then reads: the decoded
// weight times its block scale is exact in F32 (2-bit and 4-bit significands), so the sum is the
// same W4A16 product, only summed without per-block partial sums.
// Tiles go in pairs (16 rows, two vectors per k) against 6 tokens: 12 accumulators, 2 weight
// vectors and a broadcast per k, so 8 loads feed 12 FMAs (one tile against 8 tokens loaded 9 per
// 8; Zen 3 sustains about 1.6 SIMD loads per cycle, measured, short of the 2.25 that 2 FMAs per
// cycle would need). A last odd tile runs alone against 8 tokens.
constexpr int64_t kPanelMinTokens = 8;
constexpr int64_t kPanelFloats = 4096;  // 16 KiB: half of L1d (512 k x 8 rows or 256 k x 16)
constexpr int64_t kPanelTokens = 96;    // accumulators of up to 96 tokens x 16 rows on the stack
template <int kTiles>
constexpr int64_t kPanelK = kPanelFloats / (kTiles * kTileRows);
template <int kTiles>
constexpr int kPanelMr = kTiles == 1 ? 8 : 6;  // accumulators + weight vectors + a broadcast

// The tile's scaled F32 weights for k0 .. k0 + kc, k's 8 rows at panel + (k - k0) * stride.
template <WeightFormat kFormat>
inline void decode_panel(const uint8_t* tile, const uint8_t* scales, int64_t k0, int64_t kc,
                         float* panel, int64_t stride) {
  constexpr int kChunksPerBlock = (kFormat == WeightFormat::kNvfp4 ? 16 : 32) / kFp4ChunkK;
  const __m256i lut = e2m1_x2_lut();
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int64_t c = k0 / kFp4ChunkK; c < (k0 + kc) / kFp4ChunkK; ++c) {
    const __m256 scale = decode_block_scales<kFormat>(scales + (c / kChunksPerBlock) * kTileRows);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + c * kChunkBytes));
    const __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, low4));
    const __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
    float* out = panel + (c * kFp4ChunkK - k0) * stride;
    FP4MOE_UNROLL
    for (int kk = 0; kk < kFp4ChunkK; ++kk) {
      const __m256 wv =
          _mm256_cvtepi32_ps(_mm256_shuffle_epi8(kk < 4 ? lo : hi, top_byte_ctrl(kk % 4)));
      _mm256_store_ps(out + kk * stride, _mm256_mul_ps(wv, scale));
    }
  }
}

// acc[i] += panel . x[i] over kc k's, for MR tokens and kTiles tiles (the panel holds kTiles x 8
// rows per k; acc holds each token's kTiles x 8 sums).
template <int MR, int kTiles>
inline void panel_fma(const float* panel, int64_t kc, const float* x, int64_t ldx, float* acc) {
  constexpr int64_t kW = kTiles * kTileRows;
  __m256 a[MR][kTiles];
  FP4MOE_UNROLL
  for (int i = 0; i < MR; ++i) {
    FP4MOE_UNROLL
    for (int t = 0; t < kTiles; ++t) a[i][t] = _mm256_load_ps(acc + i * kW + t * kTileRows);
  }
  for (int64_t k = 0; k < kc; ++k) {
    __m256 wv[kTiles];
    FP4MOE_UNROLL
    for (int t = 0; t < kTiles; ++t) wv[t] = _mm256_load_ps(panel + k * kW + t * kTileRows);
    FP4MOE_UNROLL
    for (int i = 0; i < MR; ++i) {
      const __m256 xb = _mm256_broadcast_ss(x + i * ldx + k);
      FP4MOE_UNROLL
      for (int t = 0; t < kTiles; ++t) a[i][t] = _mm256_fmadd_ps(wv[t], xb, a[i][t]);
    }
  }
  FP4MOE_UNROLL
  for (int i = 0; i < MR; ++i) {
    FP4MOE_UNROLL
    for (int t = 0; t < kTiles; ++t) _mm256_store_ps(acc + i * kW + t * kTileRows, a[i][t]);
  }
}

// The panel driver for kTiles (1 or 2) adjacent tiles: decode(t, k0, kc, panel, stride) writes
// tile t's scaled F32 weights for k0 .. k0 + kc (kc <= kPanelK) into the panel (decode_panel's
// layout); out_scale is applied once per output. Each output's FMAs run in k order into one
// accumulator, whatever the panel size or pairing: the same bits as one tile at a time.
template <int kTiles, class Decode>
void tiles_panel(Decode&& decode, int64_t k, float out_scale_f, const float* x, int64_t ldx,
                 int64_t m, float* y, int64_t ldy, const int (&rows)[kTiles]) {
  constexpr int64_t kW = kTiles * kTileRows;
  alignas(32) float panel[kPanelFloats];
  alignas(32) float acc[kPanelTokens * kW];
  const __m256 out_scale = _mm256_set1_ps(out_scale_f);
  for (int64_t m0 = 0; m0 < m; m0 += kPanelTokens) {
    const int64_t mb = std::min(kPanelTokens, m - m0);
    std::memset(acc, 0, sizeof(float) * mb * kW);
    for (int64_t k0 = 0; k0 < k; k0 += kPanelK<kTiles>) {
      const int64_t kc = std::min(kPanelK<kTiles>, k - k0);
      for (int t = 0; t < kTiles; ++t) decode(t, k0, kc, panel + t * kTileRows, kW);
      for_token_groups<kPanelMr<kTiles>>(mb, [&](auto mr, int64_t i) {
        panel_fma<decltype(mr)::value, kTiles>(panel, kc, x + (m0 + i) * ldx + k0, ldx,
                                               acc + i * kW);
      });
    }
    for (int64_t i = 0; i < mb; ++i) {
      for (int t = 0; t < kTiles; ++t) {
        store_rows(y + (m0 + i) * ldy + t * kTileRows,
                   _mm256_mul_ps(_mm256_load_ps(acc + i * kW + t * kTileRows), out_scale), rows[t]);
      }
    }
  }
}

// Tiles [tile_begin, tile_end) through tiles_panel, in pairs and a last odd one alone;
// decode(tile, t, k0, kc, panel, stride) decodes tile `tile`.
template <class Decode>
void panel_tiles(const PackedMatrix& w, Decode&& decode, float out_scale, const float* x,
                 int64_t ldx, int64_t m, float* y, int64_t ldy, int64_t tile_begin,
                 int64_t tile_end) {
  auto rows_of = [&](int64_t t) {
    return static_cast<int>(std::min<int64_t>(kTileRows, w.n - t * kTileRows));
  };
  int64_t t = tile_begin;
  for (; t + 1 < tile_end; t += 2) {
    const int rows[2] = {rows_of(t), rows_of(t + 1)};
    tiles_panel<2>([&](int i, int64_t k0, int64_t kc, float* panel,
                       int64_t stride) { decode(t + i, k0, kc, panel, stride); },
                   w.k, out_scale, x, ldx, m, y + t * kTileRows, ldy, rows);
  }
  if (t < tile_end) {
    const int rows[1] = {rows_of(t)};
    tiles_panel<1>([&](int, int64_t k0, int64_t kc, float* panel,
                       int64_t stride) { decode(t, k0, kc, panel, stride); },
                   w.k, out_scale, x, ldx, m, y + t * kTileRows, ldy, rows);
  }
}

template <WeightFormat kFormat>
void fp4_gemm_avx2(const PackedMatrix& w, const float* x, int64_t ldx, int64_t m, float* y,
                   int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  if (m >= kPanelMinTokens) {
    panel_tiles(
        w,
        [&](int64_t t, int64_t k0, int64_t kc, float* panel, int64_t stride) {
          const avx2::Fp4Tile at = avx2::fp4_tile_at(w, t);
          decode_panel<kFormat>(at.codes, at.scales, k0, kc, panel, stride);
        },
        w.tensor_scale * kFp4DecodeFactor, x, ldx, m, y, ldy, tile_begin, tile_end);
    return;
  }
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    // Not a structured binding: the token lambdas below capture these (clang < 16 cannot).
    const avx2::Fp4Tile at = avx2::fp4_tile_at(w, t);
    const uint8_t* tile = at.codes;
    const uint8_t* scales = at.scales;
    const int rows = at.rows;
    float* yt = y + t * kTileRows;
    for_token_groups<4>(m, [&](auto mr, int64_t i) {
      fp4_tile<kFormat, decltype(mr)::value>(w, tile, scales, x + i * ldx, ldx, yt + i * ldy, ldy,
                                             rows);
    });
  }
}

// FP8: 8 codes (one k, 8 rows) -> FP16 words: code << 8 (unpack with zero), arithmetic shift
// right by 1 and clear bit 14 gives S.0EEEE.MMM0000000, an FP16 of value e4m3 * 2^-8 (FP16 bias
// 15 vs 7); vcvtph2ps widens exactly. The 2^8 is folded into the block scale.
[[gnu::always_inline]] inline void decode_fp8_chunk(const uint8_t* bytes,
                                                    __m256 (&wk)[kFp8ChunkK]) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes));
  const __m256i zero = _mm256_setzero_si256();
  const __m256i mask = _mm256_set1_epi16(static_cast<int16_t>(0xBFFF));
  const __m256i even = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpacklo_epi8(zero, v), 1), mask);
  const __m256i odd = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpackhi_epi8(zero, v), 1), mask);
  // unpacklo holds k = 0 (low lane) and k = 2 (high lane); unpackhi holds k = 1 and k = 3.
  wk[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(even));
  wk[1] = _mm256_cvtph_ps(_mm256_castsi256_si128(odd));
  wk[2] = _mm256_cvtph_ps(_mm256_extracti128_si256(even, 1));
  wk[3] = _mm256_cvtph_ps(_mm256_extracti128_si256(odd, 1));
}

template <int MR, bool kTail>
[[gnu::always_inline]] inline void fp8_chunk(const uint8_t* bytes, const float* xk, int64_t ldx,
                                             int valid_k, __m256 (&block)[MR][chains_for(MR)]) {
  constexpr int kChains = chains_for(MR);
  __m256 wk[kFp8ChunkK];
  decode_fp8_chunk(bytes, wk);
  FP4MOE_UNROLL
  for (int j = 0; j < kFp8ChunkK; ++j) {
    if (kTail && j >= valid_k) break;
    FP4MOE_UNROLL
    for (int i = 0; i < MR; ++i) {
      block[i][j % kChains] =
          _mm256_fmadd_ps(wk[j], _mm256_broadcast_ss(xk + i * ldx + j), block[i][j % kChains]);
    }
  }
}

// The FP8 panel (from kPanelMinTokens tokens): each k's 8 weights decoded (decode_fp8_chunk) and
// multiplied by their block's scale x 2^8, rounded once (e4m3 x 2^-8 and the power-of-two factor
// are exact): the same rounding as the AVX-512 FP8 panel, inside the tests' FP64 bound. k past K
// (the tail chunk's padding) is written as zero. k0 is a multiple of kPanelK, so of 4.
inline void decode_panel_fp8(const uint8_t* tile, const float* scales, int64_t k0, int64_t kc,
                             float* panel, int64_t stride) {
  for (int64_t kk = 0; kk < kc; kk += kFp8ChunkK) {
    const int64_t k = k0 + kk;
    const __m256 scale = _mm256_set1_ps(scales[k / kFp8ScaleBlock] * 256.0f);
    __m256 wk[kFp8ChunkK];
    decode_fp8_chunk(tile + (k / kFp8ChunkK) * kChunkBytes, wk);
    FP4MOE_UNROLL
    for (int j = 0; j < kFp8ChunkK; ++j) {
      _mm256_store_ps(panel + (kk + j) * stride,
                      kk + j < kc ? _mm256_mul_ps(wk[j], scale) : _mm256_setzero_ps());
    }
  }
}

template <int MR>
inline void fp8_tile(const PackedMatrix& w, const uint8_t* tile, const float* scales,
                     const float* x, int64_t ldx, float* y, int64_t ldy, int rows) {
  constexpr int64_t kChunksPerBlock = kFp8ScaleBlock / kFp8ChunkK;
  const int64_t full_chunks = w.k / kFp8ChunkK;
  const int tail_k = static_cast<int>(w.k % kFp8ChunkK);
  const int64_t k_blocks = (w.k + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  __m256 total[MR];
  FP4MOE_UNROLL
  for (int i = 0; i < MR; ++i) total[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < k_blocks; ++b) {
    constexpr int kChains = chains_for(MR);
    __m256 block[MR][kChains];
    FP4MOE_UNROLL
    for (int i = 0; i < MR; ++i) {
      FP4MOE_UNROLL
      for (int c = 0; c < kChains; ++c) block[i][c] = _mm256_setzero_ps();
    }
    const int64_t c_end = std::min(full_chunks, (b + 1) * kChunksPerBlock);
    prefetch_ahead(tile + b * kChunksPerBlock * kChunkBytes,
                   (c_end - b * kChunksPerBlock) * kChunkBytes);
    for (int64_t c = b * kChunksPerBlock; c < c_end; ++c) {
      fp8_chunk<MR, false>(tile + c * kChunkBytes, x + c * kFp8ChunkK, ldx, kFp8ChunkK, block);
    }
    if (b == k_blocks - 1 && tail_k != 0) {
      fp8_chunk<MR, true>(tile + full_chunks * kChunkBytes, x + full_chunks * kFp8ChunkK, ldx,
                          tail_k, block);
    }
    const __m256 scale = _mm256_set1_ps(scales[b] * 256.0f);
    FP4MOE_UNROLL
    for (int i = 0; i < MR; ++i) {
      __m256 sum = block[i][0];
      FP4MOE_UNROLL
      for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, block[i][c]);
      total[i] = _mm256_fmadd_ps(sum, scale, total[i]);
    }
  }
  FP4MOE_UNROLL
  for (int i = 0; i < MR; ++i) store_rows(y + i * ldy, total[i], rows);
}

}  // namespace

void nvfp4_gemm_8r_avx2(const PackedMatrix& w, const float* x, int64_t ldx, int64_t m, float* y,
                        int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  fp4_gemm_avx2<WeightFormat::kNvfp4>(w, x, ldx, m, y, ldy, tile_begin, tile_end);
}

void mxfp4_gemm_8r_avx2(const PackedMatrix& w, const float* x, int64_t ldx, int64_t m, float* y,
                        int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  fp4_gemm_avx2<WeightFormat::kMxfp4>(w, x, ldx, m, y, ldy, tile_begin, tile_end);
}

void fp8b128_gemm_8r_avx2(const PackedMatrix& w, const float* x, int64_t ldx, int64_t m, float* y,
                          int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  const int64_t k_blocks = (w.k + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  auto tile_scales = [&](int64_t t) {
    return w.fp8_scales + (t * kTileRows / kFp8ScaleBlock) * k_blocks;
  };
  if (m >= kPanelMinTokens) {
    panel_tiles(
        w,
        [&](int64_t t, int64_t k0, int64_t kc, float* panel, int64_t stride) {
          decode_panel_fp8(w.codes + t * w.chunks * kChunkBytes, tile_scales(t), k0, kc, panel,
                           stride);
        },
        1.0f, x, ldx, m, y, ldy, tile_begin, tile_end);
    return;
  }
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const uint8_t* tile = w.codes + t * w.chunks * kChunkBytes;
    const float* scales = tile_scales(t);
    const int rows = static_cast<int>(std::min<int64_t>(kTileRows, w.n - t * kTileRows));
    float* yt = y + t * kTileRows;
    for_token_groups<4>(m, [&](auto mr, int64_t i) {
      fp8_tile<decltype(mr)::value>(w, tile, scales, x + i * ldx, ldx, yt + i * ldy, ldy, rows);
    });
  }
}

}  // namespace fp4moe::kernels
