// AVX2 W4A8 kernels and activation quantizer (types.h, "W4A8"); compiled with only the AVX2 flags.
//
// Per 32-byte chunk of a tile (8 rows x 8 k, types.h), dword r holds row r's 4 consecutive k (low
// nibbles: k 0-3, high: k 4-7) as loaded;
// one pshufb per nibble half maps codes to u = 2 * e2m1 + 12 in [0, 24] (pmaddubsw wants one
// unsigned operand). Per token: pmaddubsw(u, 4 activation codes broadcast) sums pairs of k in
// int16 (|.| <= 2 * 24 * 127 = 6096, so four of them still fit: 24384 < 32767), pmaddwd by ones
// makes the per-row int32 sum, and 12 * sum(q) taken off makes it sum((2 * e2m1) * q), exact.
// Then fma(float(sum), weight scale * activation scale, total) per block: the scalar W4A8 kernel's
// operations, so the bits agree with it.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/avx2/fp4_avx2.h"
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/cpu/mca.h"
#include "kernels/cpu/token_groups.h"

namespace fp4moe::kernels {
namespace {

// Fixed small loops fully unrolled so the decoded vectors and totals stay in registers (see
// gemm_avx2.cc).
#define FP4MOE_UNROLL _Pragma("GCC unroll 16")

using avx2::decode_block_scales;
using avx2::store_rows;

static_assert(kW4a8CodeOffset == 12, "the table below holds u = 2 * e2m1 + 12");

inline __m256i offset_e2m1_x2_lut() {
  return _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,  //
                          12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
}

inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm256_set1_epi32(v);
}

template <WeightFormat kFormat>
constexpr int kW4a8Block = kFormat == WeightFormat::kNvfp4 ? 16 : 32;
template <WeightFormat kFormat>
constexpr int kW4a8Chunks = kW4a8Block<kFormat> / kFp4ChunkK;  // 2 or 4: whole chunk pairs

// One K block of one tile, decoded: u codes, dword r = row r (lo: k 0-3 of each chunk, hi: 4-7).
template <int kChunks>
struct DecodedBlock {
  __m256i lo[kChunks], hi[kChunks];
};

template <int kChunks>
[[gnu::always_inline]] inline void decode_block(const uint8_t* block, DecodedBlock<kChunks>& d) {
  const __m256i lut = offset_e2m1_x2_lut();
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  prefetch_ahead(block, kChunks * kChunkBytes);
  FP4MOE_UNROLL
  for (int c = 0; c < kChunks; ++c) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + c * kChunkBytes));
    d.lo[c] = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, low4));
    d.hi[c] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
  }
}

// One token's codes for a block, 4 k per dword broadcast to every row: x[j] holds k 4j..4j+3.
template <int kChunks>
struct BlockActivations {
  __m256i x[2 * kChunks];
};

template <int kChunks>
[[gnu::always_inline]] inline void broadcast_block(const int8_t* q, BlockActivations<kChunks>& a) {
  FP4MOE_UNROLL
  for (int j = 0; j < 2 * kChunks; ++j) a.x[j] = broadcast4(q + 4 * j);
}

// sum(u * q) over the block per row, int32: four pmaddubsw results summed in int16 (<= 24384),
// then widened.
template <int kChunks>
[[gnu::always_inline]] inline __m256i block_dot(const DecodedBlock<kChunks>& d,
                                                const BlockActivations<kChunks>& a) {
  const __m256i ones16 = _mm256_set1_epi16(1);
  __m256i sum = _mm256_setzero_si256();
  FP4MOE_UNROLL
  for (int c = 0; c < kChunks; c += 2) {
    __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(d.lo[c], a.x[2 * c]),
                                 _mm256_maddubs_epi16(d.hi[c], a.x[2 * c + 1]));
    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(d.lo[c + 1], a.x[2 * c + 2]));
    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(d.hi[c + 1], a.x[2 * c + 3]));
    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, ones16));
  }
  return sum;
}

// total + float(sum + offset) * fl(weight scale * activation scale), offset = -12 * sum(q) (the
// `offsets` entry, types.h): the scalar kernel's fma, lane by lane.
inline __m256 accumulate_block(__m256i sum, __m256i offset, __m256 w_scale, __m256 act_scale,
                               __m256 total) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(sum, offset)),
                         _mm256_mul_ps(w_scale, act_scale), total);
}

// MR tokens (starting at token i0) against one tile, over all of K, totals in registers.
template <WeightFormat kFormat, int MR>
inline void w4a8_tile(const PackedMatrix& w, const uint8_t* tile, const uint8_t* scales,
                      const QuantizedActivations& x, int64_t i0, float* y, int64_t ldy, int rows) {
  constexpr int kBlock = kW4a8Block<kFormat>;
  constexpr int kChunks = kW4a8Chunks<kFormat>;
  const int64_t k_blocks = w.k / kBlock;
  __m256 total[MR];
  FP4MOE_UNROLL
  for (int i = 0; i < MR; ++i) total[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < k_blocks; ++b) {
    FP4MOE_MCA_BLOCK_BEGIN("w4a8", "avx2");
    DecodedBlock<kChunks> d;
    decode_block(tile + b * kChunks * kChunkBytes, d);
    const __m256 w_scale = decode_block_scales<kFormat>(scales + b * kTileRows);
    FP4MOE_UNROLL
    for (int i = 0; i < MR; ++i) {
      BlockActivations<kChunks> a;
      broadcast_block(x.q + (i0 + i) * x.ldq + b * kBlock, a);
      const int64_t s = (i0 + i) * x.lds + b;
      total[i] = accumulate_block(block_dot(d, a), _mm256_set1_epi32(x.offsets[s]), w_scale,
                                  _mm256_set1_ps(x.scales[s]), total[i]);
    }
    FP4MOE_MCA_BLOCK_END();
  }
  const __m256 out_scale = _mm256_set1_ps(w.tensor_scale * 0.5f);
  FP4MOE_UNROLL
  for (int i = 0; i < MR; ++i) {
    store_rows(y + (i0 + i) * ldy, _mm256_mul_ps(total[i], out_scale), rows);
  }
}

// Some tokens (kSomeTokensMin up to the wide path's threshold) against kTiles adjacent tiles: each
// block is decoded once into registers and every token (up to kSomeTokens per pass) runs over it,
// its F32 totals in an L1-resident array. Fewer decodes than w4a8_tile's groups of four, at one
// load and one store of a total per token and block; from 8 tokens on this measured faster (Zen 3,
// L2-resident weights). NVFP4 runs tiles in pairs (4 decoded vectors per tile; MXFP4 has 8): each
// broadcast, scale and offset then serve 16 rows (about +25% GFLOP/s at M = 16-64). Below the wide
// path's threshold its decode into registers costs less than the wide path's decode to L1.
constexpr int64_t kSomeTokens = 64;
constexpr int64_t kSomeTokensMin = 8;

template <WeightFormat kFormat, int kTiles>
inline void w4a8_tiles_some(const PackedMatrix& w, const uint8_t* tile, const uint8_t* scales,
                            const QuantizedActivations& x, int64_t m, float* y, int64_t ldy,
                            const int (&rows)[kTiles]) {
  constexpr int kBlock = kW4a8Block<kFormat>;
  constexpr int kChunks = kW4a8Chunks<kFormat>;
  const int64_t k_blocks = w.k / kBlock;
  const int64_t tile_bytes = w.chunks * kChunkBytes;
  const int64_t tile_scales = k_blocks * kTileRows;
  const __m256 out_scale = _mm256_set1_ps(w.tensor_scale * 0.5f);
  alignas(32) float totals[kSomeTokens * kTiles * kTileRows];
  for (int64_t i0 = 0; i0 < m; i0 += kSomeTokens) {
    const int64_t mb = std::min(kSomeTokens, m - i0);
    for (int64_t i = 0; i < mb * kTiles; ++i) {
      _mm256_store_ps(totals + i * kTileRows, _mm256_setzero_ps());
    }
    for (int64_t b = 0; b < k_blocks; ++b) {
      DecodedBlock<kChunks> d[kTiles];
      __m256 w_scale[kTiles];
      FP4MOE_UNROLL
      for (int t = 0; t < kTiles; ++t) {
        decode_block(tile + t * tile_bytes + b * kChunks * kChunkBytes, d[t]);
        w_scale[t] = decode_block_scales<kFormat>(scales + t * tile_scales + b * kTileRows);
      }
      for (int64_t i = 0; i < mb; ++i) {
        BlockActivations<kChunks> a;
        broadcast_block(x.q + (i0 + i) * x.ldq + b * kBlock, a);
        const int64_t s = (i0 + i) * x.lds + b;
        const __m256i offset = _mm256_set1_epi32(x.offsets[s]);
        const __m256 act_scale = _mm256_set1_ps(x.scales[s]);
        FP4MOE_UNROLL
        for (int t = 0; t < kTiles; ++t) {
          float* tot = totals + (i * kTiles + t) * kTileRows;
          _mm256_store_ps(tot, accumulate_block(block_dot(d[t], a), offset, w_scale[t], act_scale,
                                                _mm256_load_ps(tot)));
        }
      }
    }
    for (int64_t i = 0; i < mb; ++i) {
      FP4MOE_UNROLL
      for (int t = 0; t < kTiles; ++t) {
        store_rows(y + (i0 + i) * ldy + t * kTileRows,
                   _mm256_mul_ps(_mm256_load_ps(totals + (i * kTiles + t) * kTileRows), out_scale),
                   rows[t]);
      }
    }
  }
}

// Many tokens (from kManyTokensMin, the "wide" path): each K block of a tile is decoded once per
// pass of up to kPassTokens tokens and every token of the pass runs over it. The roles of the two
// pmaddubsw operands swap against the few-token path: the weights are the signed operand, 2 * e2m1
// in [-12, 12], so pmaddubsw reads them straight from the decoded L1 buffer as a memory operand,
// and the activations are the unsigned one, q + 128 in [1, 255] (packed once per slice, q ^ 0x80).
// Then sum((q + 128) * w) - 128 * sum(w) is sum(q * (2 * e2m1)), exact: |pair| <= 2 * 255 * 12 =
// 6120, four pairs summed in int16 <= 24480, and the weight-side correction -128 * sum(w) is
// decoded once per tile and block. Each block's F32 operations are the scalar kernel's (fma of
// float(sum) and fl(weight scale * activation scale) onto the total), so the bits agree with it.
//
// Blocking: per pass, kMaxTiles (4) tiles at a time, K in slices of kSliceBlocks blocks: the slice
// of the 4 tiles is decoded into a stack buffer (NVFP4 6 KiB, MXFP4 10 KiB: L1) with the pass's
// activation codes for the slice; then each token runs over the 4 tiles, its 4 F32 totals in
// registers over the slice (2 tokens at once spilled: llvm-mca znver3 and the measurement agree),
// and the pass's totals (tokens x 4 tiles) carry between slices in an L1 array. Each broadcast of 4
// activation codes feeds 4 tiles: per tile and block, 4 (NVFP4) or 8 (MXFP4) pmaddubsw with memory
// operands, the int16 adds, pmaddwd by ones, the correction, cvt, mul, fma.
// Thresholds measured against the path above on Zen 3 (2 threads, 4096 -> 14336): NVFP4 0.8x at 12
// tokens, even at 16, 1.2x at 32; MXFP4 even at 12, 1.3x at 32.
template <WeightFormat kFormat>
constexpr int64_t kManyTokensMin = kFormat == WeightFormat::kNvfp4 ? 24 : 12;
constexpr int64_t kPassTokens = 64;
constexpr int64_t kSliceBlocks = 8;  // NVFP4: 128 k, MXFP4: 256 k
constexpr int kMaxTiles = 4;

// One K block of one tile for the many-token path: w[j] holds k 4j..4j+3 of the block, dword r =
// row r, signed 2 * e2m1; corr = -128 * (the row's sum of w over the block), int32; the rows'
// block scales.
template <WeightFormat kFormat>
struct alignas(32) SignedBlock {
  __m256i w[2 * kW4a8Chunks<kFormat>];
  __m256i corr;
  __m256 scale;
};

template <WeightFormat kFormat>
[[gnu::always_inline]] inline void decode_signed_block(const uint8_t* block, const uint8_t* scales,
                                                       SignedBlock<kFormat>& d) {
  constexpr int kChunks = kW4a8Chunks<kFormat>;
  const __m256i lut = avx2::e2m1_x2_lut();
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i ones8 = _mm256_set1_epi8(1);
  prefetch_ahead(block, kChunks * kChunkBytes);
  __m256i sum16 = _mm256_setzero_si256();  // |.| <= 2 * kChunks * 24: no overflow
  FP4MOE_UNROLL
  for (int c = 0; c < kChunks; ++c) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + c * kChunkBytes));
    const __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, low4));
    const __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
    _mm256_store_si256(&d.w[2 * c], lo);
    _mm256_store_si256(&d.w[2 * c + 1], hi);
    sum16 = _mm256_add_epi16(
        sum16, _mm256_add_epi16(_mm256_maddubs_epi16(ones8, lo), _mm256_maddubs_epi16(ones8, hi)));
  }
  _mm256_store_si256(&d.corr, _mm256_madd_epi16(sum16, _mm256_set1_epi16(-128)));
  _mm256_store_ps(reinterpret_cast<float*>(&d.scale), decode_block_scales<kFormat>(scales));
}

// One token against kT tiles over the slice's nb blocks: dec[t * nb + b] is tile t's block b; the
// token's unsigned codes at xu, its scales at xs, its totals (kMaxTiles x 8 F32) at totals.
template <WeightFormat kFormat, int kT>
inline void w4a8_many_token(const SignedBlock<kFormat>* dec, int64_t nb, const uint8_t* xu,
                            const float* xs, float* totals) {
  constexpr int kB = kW4a8Block<kFormat>;
  constexpr int kChunks = kW4a8Chunks<kFormat>;
  const __m256i ones16 = _mm256_set1_epi16(1);
  __m256 total[kT];
  FP4MOE_UNROLL
  for (int t = 0; t < kT; ++t) total[t] = _mm256_load_ps(totals + t * kTileRows);
  for (int64_t b = 0; b < nb; ++b) {
    __m256i xv[2 * kChunks];
    FP4MOE_UNROLL
    for (int j = 0; j < 2 * kChunks; ++j) {
      xv[j] = broadcast4(reinterpret_cast<const int8_t*>(xu + b * kB + 4 * j));
    }
    const __m256 act_scale = _mm256_set1_ps(xs[b]);
    FP4MOE_UNROLL
    for (int t = 0; t < kT; ++t) {
      const SignedBlock<kFormat>& d = dec[t * nb + b];
      __m256i sum = d.corr;
      FP4MOE_UNROLL
      for (int j = 0; j < 2 * kChunks; j += 4) {
        __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(xv[j], d.w[j]),
                                     _mm256_maddubs_epi16(xv[j + 1], d.w[j + 1]));
        p = _mm256_add_epi16(p, _mm256_maddubs_epi16(xv[j + 2], d.w[j + 2]));
        p = _mm256_add_epi16(p, _mm256_maddubs_epi16(xv[j + 3], d.w[j + 3]));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, ones16));
      }
      total[t] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(d.scale, act_scale), total[t]);
    }
  }
  FP4MOE_UNROLL
  for (int t = 0; t < kT; ++t) _mm256_store_ps(totals + t * kTileRows, total[t]);
}

template <WeightFormat kFormat>
void w4a8_many(const PackedMatrix& w, const QuantizedActivations& x, int64_t m, float* y,
               int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  constexpr int kB = kW4a8Block<kFormat>;
  constexpr int kChunks = kW4a8Chunks<kFormat>;
  constexpr int64_t kSliceK = kSliceBlocks * kB;
  const int64_t k_blocks = w.k / kB;
  SignedBlock<kFormat> dec[kMaxTiles * kSliceBlocks];
  alignas(32) uint8_t xu[kPassTokens * kSliceK];
  alignas(32) float xs[kPassTokens * kSliceBlocks];
  alignas(32) float totals[kPassTokens * kMaxTiles * kTileRows];
  const __m128i flip = _mm_set1_epi8(static_cast<char>(0x80));
  const __m256 out_scale = _mm256_set1_ps(w.tensor_scale * 0.5f);
  for (int64_t i0 = 0; i0 < m; i0 += kPassTokens) {
    const int64_t mb = std::min(kPassTokens, m - i0);
    for (int64_t t0 = tile_begin; t0 < tile_end; t0 += kMaxTiles) {
      const int nt = static_cast<int>(std::min<int64_t>(kMaxTiles, tile_end - t0));
      std::fill_n(totals, mb * kMaxTiles * kTileRows, 0.0f);
      for (int64_t b0 = 0; b0 < k_blocks; b0 += kSliceBlocks) {
        const int64_t nb = std::min(kSliceBlocks, k_blocks - b0);
        for (int t = 0; t < nt; ++t) {
          const avx2::Fp4Tile at = avx2::fp4_tile_at(w, t0 + t);
          for (int64_t b = 0; b < nb; ++b) {
            decode_signed_block<kFormat>(at.codes + (b0 + b) * kChunks * kChunkBytes,
                                         at.scales + (b0 + b) * kTileRows, dec[t * nb + b]);
          }
        }
        // The pass's codes for the slice as q + 128, and their scales.
        for (int64_t i = 0; i < mb; ++i) {
          const int8_t* src = x.q + (i0 + i) * x.ldq + b0 * kB;
          for (int64_t kk = 0; kk < nb * kB; kk += 16) {
            _mm_store_si128(
                reinterpret_cast<__m128i*>(xu + i * kSliceK + kk),
                _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + kk)), flip));
          }
          std::memcpy(xs + i * kSliceBlocks, x.scales + (i0 + i) * x.lds + b0,
                      sizeof(float) * static_cast<size_t>(nb));
        }
        with_mr<kMaxTiles>(nt, [&](auto tiles) {
          constexpr int kT = decltype(tiles)::value;
          for (int64_t i = 0; i < mb; ++i) {
            w4a8_many_token<kFormat, kT>(dec, nb, xu + i * kSliceK, xs + i * kSliceBlocks,
                                         totals + i * kMaxTiles * kTileRows);
          }
        });
      }
      for (int64_t i = 0; i < mb; ++i) {
        for (int t = 0; t < nt; ++t) {
          store_rows(
              y + (i0 + i) * ldy + (t0 + t) * kTileRows,
              _mm256_mul_ps(_mm256_load_ps(totals + (i * kMaxTiles + t) * kTileRows), out_scale),
              avx2::tile_rows(w, t0 + t));
        }
      }
    }
  }
}

template <WeightFormat kFormat>
void w4a8_gemm_avx2(const PackedMatrix& w, const QuantizedActivations& x, int64_t m, float* y,
                    int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  if (m >= kManyTokensMin<kFormat>) {
    w4a8_many<kFormat>(w, x, m, y, ldy, tile_begin, tile_end);
    return;
  }
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    // Not a structured binding: the token lambdas below capture these (clang < 16 cannot).
    const avx2::Fp4Tile at = avx2::fp4_tile_at(w, t);
    const uint8_t* tile = at.codes;
    const uint8_t* scales = at.scales;
    const int rows = at.rows;
    float* yt = y + t * kTileRows;
    if (m >= kSomeTokensMin) {
      // NVFP4: tiles in pairs (the last one alone); MXFP4: one at a time.
      if (kFormat == WeightFormat::kNvfp4 && t + 1 < tile_end) {
        const int pair_rows[2] = {rows, avx2::tile_rows(w, t + 1)};
        w4a8_tiles_some<kFormat, 2>(w, tile, scales, x, m, yt, ldy, pair_rows);
        ++t;  // the pair's second tile is done too
      } else {
        const int one_rows[1] = {rows};
        w4a8_tiles_some<kFormat, 1>(w, tile, scales, x, m, yt, ldy, one_rows);
      }
      continue;
    }
    // Four tokens share one decode of each block (NVFP4: 4 decoded vectors + 4 totals stay in
    // registers; MXFP4's 8 + 4 + constants spill a few constants to memory operands).
    for_token_groups<4>(m, [&](auto mr, int64_t i) {
      w4a8_tile<kFormat, decltype(mr)::value>(w, tile, scales, x, i, yt, ldy, rows);
    });
  }
}

inline float horizontal_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

inline int32_t horizontal_sum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

}  // namespace

void nvfp4_gemm_w4a8_8r_avx2(const PackedMatrix& w, const QuantizedActivations& x, int64_t m,
                             float* y, int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  w4a8_gemm_avx2<WeightFormat::kNvfp4>(w, x, m, y, ldy, tile_begin, tile_end);
}

void mxfp4_gemm_w4a8_8r_avx2(const PackedMatrix& w, const QuantizedActivations& x, int64_t m,
                             float* y, int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  w4a8_gemm_avx2<WeightFormat::kMxfp4>(w, x, m, y, ldy, tile_begin, tile_end);
}

// Same operations as quantize_activations_int8_scalar (max of |x|, amax / 127, 127 / amax, one
// F32 multiply and a round-half-even conversion per element), 8 lanes at a time; block % 8 == 0.
void quantize_activations_int8_avx2(const float* x, int64_t ldx, int64_t m, int64_t k, int block,
                                    int8_t* q, float* scales, int32_t* offsets) {
  const int64_t blocks = k / block;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256i max_finite = _mm256_set1_epi32(0x7F7FFFFF);
  // Gathers byte 0 of each dword into the lane's first 4 bytes, then dwords 0 and 4 side by side.
  const __m256i low_bytes =
      _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1,
                       -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i pick = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + i * ldx + b * block;
      int8_t* qb = q + i * k + b * block;
      __m256 amax = _mm256_setzero_ps();
      __m256i non_finite = _mm256_setzero_si256();
      for (int j = 0; j < block; j += 8) {
        const __m256 a = _mm256_and_ps(_mm256_loadu_ps(xb + j), abs_mask);
        non_finite =
            _mm256_or_si256(non_finite, _mm256_cmpgt_epi32(_mm256_castps_si256(a), max_finite));
        amax = _mm256_max_ps(amax, a);
      }
      const int64_t s = i * blocks + b;
      const bool finite = _mm256_testz_si256(non_finite, non_finite) != 0;
      const float amax_f = horizontal_max(amax);
      if (!finite || amax_f == 0.0f) {
        scales[s] = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
        offsets[s] = 0;
        std::memset(qb, 0, static_cast<size_t>(block));
        continue;
      }
      // As the scalar quantizer: tiny blocks are pre-scaled by 2^64 so 127 / amax stays finite.
      const float pre_f = amax_f < kW4a8TinyAmax ? 0x1p64f : 1.0f;
      const __m256 pre = _mm256_set1_ps(pre_f);
      const __m256 inv = _mm256_set1_ps(127.0f / (amax_f * pre_f));
      __m256i total = _mm256_setzero_si256();
      for (int j = 0; j < block; j += 8) {
        const __m256i v =
            _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + j), pre), inv));
        total = _mm256_add_epi32(total, v);
        const __m256i packed = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, low_bytes), pick);
        _mm_storel_epi64(reinterpret_cast<__m128i*>(qb + j), _mm256_castsi256_si128(packed));
      }
      scales[s] = amax_f / 127.0f;
      offsets[s] = -kW4a8CodeOffset * horizontal_sum(total);
    }
  }
}

}  // namespace fp4moe::kernels
