// AMX W4A8 kernels (types.h, "W4A8"); compiled with the AVX-512, VNNI and AMX-TILE/AMX-INT8 flags.
//
// The tile unit does the integer part: per K block (16 k for NVFP4, 32 for MXFP4) one TDPBSSD
// multiplies 16 tokens' int8 activation codes (tile A, 16 rows x block bytes, read in place from
// the quantized activations) by 16 weight rows' codes 2 * e2m1 (tile B, block / 4 rows x 64 bytes:
// dword n of a row holds row n's 4 consecutive k, the layout TDPBSSD wants), giving the exact
// int32 sums of 16 tokens x 16 rows. The sums are stored to an L1 buffer and the vector unit
// applies the scales: per token, fma(float(sum), fl(weight scale * activation scale), total), the
// scalar kernel's operation per block and in block order, so the bits agree with it and with the
// other W4A8 kernels. The signed product needs no code offset (the VNNI kernel's u = 2 * e2m1 + 12
// and its offsets entry are not used here).
//
// Cost per block and 16 x 16 outputs (measured on Sapphire Rapids, one core, L1-resident loops):
// a tile product takes 16 cycles on the TMUL whatever the block's K (K = 16, 32 and 64 all ran at
// ~4.9 ns), so an NVFP4 block uses a quarter of the tile unit and an MXFP4 block half. Getting the
// sums out is what bounds the loop: zero + loads + product + the 1 KiB tile store ran at ~9 ns
// per block, the 16 x (cvt, mul, fma) scaling alone at ~9 ns, and the two did not overlap (~19 ns
// together; reading the tile-stored sums back costs ~7 ns by itself, and neither more C tiles, a
// later read nor a fence changed that). So this kernel is 1.0-1.2x the VNNI one for NVFP4 and
// 1.1-1.6x for MXFP4 from 12-16 tokens (bench: fp4moe bench --gemv, 2 threads), not the 4-8x a
// 64-k tile product would suggest; the tile unit pays only where one scale covers a long K.
//
// Blocking: passes of up to kPassTiles token tiles; per pass, K slices of kSliceBlocks blocks; per
// slice the pass's activation scales are transposed once ([tile][block][token]), then each tile
// pair (16 rows) decodes its slice once into a stack buffer (B tiles and the 16 rows' weight
// scales per block), prefetching the next pair's same blocks, and every token tile of the pass
// runs over it: 16 F32 totals in registers, two tile sets alternating (the next block's product is
// issued before this block's sums are read), totals carried between slices in y. A call of fewer
// than 16 tokens configures A and C tiles of that many rows (read in place); a partial last tile
// of a larger call is copied into a zero-padded buffer. Below kAmxTokensMin tokens (12 for MXFP4,
// 16 for NVFP4) the VNNI kernel runs.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/amx/tile_config.h"
#include "kernels/cpu/avx512/fp4_avx512.h"
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/cpu/token_groups.h"

namespace fp4moe::kernels {
namespace {

#define FP4MOE_UNROLL _Pragma("GCC unroll 16")

using avx512::decode_block_scales;
using avx512::Fp4TilePair;
using avx512::load_pair;
using avx512::prefetch_pair_block;
using avx512::row_mask;

constexpr int kTileTokens = 16;  // rows of tiles A and C
// Blocks per K slice (1024 k of NVFP4, 2048 of MXFP4) and token tiles per pass: the slice's
// decoded pair (20 or 36 KiB) and one token tile's codes stay in L1/L2 while the pass's tiles run.
constexpr int64_t kSliceBlocks = 64;
constexpr int64_t kPassTiles = 8;

template <WeightFormat kFormat>
constexpr int kBlock = kFormat == WeightFormat::kNvfp4 ? 16 : 32;
// Fewest tokens the tile path runs (below, the VNNI kernel): a tile product of M rows costs ~M/16
// of a whole one but never less than ~3 ns, and the sums still cost a tile store each. Measured
// (4096x2048 and 2048x4096, 2 threads): MXFP4 1.1x the VNNI kernel at 12 tokens, 0.9x at 8;
// NVFP4 0.9x at 12-15, 1.0-1.2x from 16.
template <WeightFormat kFormat>
constexpr int64_t kAmxTokensMin = kFormat == WeightFormat::kNvfp4 ? 16 : 12;

// Tile registers: C (sums) 0 and 1, A (activations) 2 and 3, B (weights) 4 and 5; the two sets
// alternate by block. `tokens` rows of A and C: 16, or all of a call's tokens when it has fewer.
template <WeightFormat kFormat>
void load_tile_config(int tokens) {
  amx::TileConfig c;
  for (int s = 0; s < 2; ++s) {
    c.tile(s, tokens, 64);                   // tokens x 16 int32 sums
    c.tile(2 + s, tokens, kBlock<kFormat>);  // one block of codes per token
    c.tile(4 + s, kBlock<kFormat> / 4, 64);  // block / 4 rows of 16 rows x 4 k
  }
  amx::load_tile_config(c);
}

// 2 * e2m1(code) as int8, for the signed tile product.
inline __m512i e2m1_x2_lut() {
  return _mm512_broadcast_i32x4(
      _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12));
}

// One block of a tile pair: B tile rows (row 2c: k 8c..8c+3, row 2c + 1: k 8c+4..8c+7, dword n =
// pair row n) and the 16 rows' weight scales. A missing second tile decodes as zeros.
template <WeightFormat kFormat>
struct alignas(64) DecodedBlock {
  int8_t codes[kBlock<kFormat> / 4][64];
  float w_scale[16];
};

// Decodes blocks [b0, b0 + nb) of pair p, prefetching the same blocks of `ahead` (the next pair
// of the range, or none): the slice's own next bytes are the next slice, read much later.
template <WeightFormat kFormat>
void decode_slice(const Fp4TilePair& p, const Fp4TilePair* ahead, int64_t b0, int64_t nb,
                  DecodedBlock<kFormat>* out) {
  constexpr int kChunks = kBlock<kFormat> / kFp4ChunkK;
  constexpr int64_t kBlockBytes = kChunks * kChunkBytes;  // 64 or 128 per tile
  const __m512i lut = e2m1_x2_lut();
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t off = (b0 + b) * kBlockBytes;
    if (ahead != nullptr) prefetch_pair_block(*ahead, b0 + b, kBlockBytes);
    DecodedBlock<kFormat>& d = out[b];
    FP4MOE_UNROLL
    for (int c = 0; c < kChunks; ++c) {
      const __m512i v =
          load_pair(p.codes_a + off + c * kChunkBytes, p.b_codes(off + c * kChunkBytes));
      _mm512_store_si512(d.codes[2 * c], _mm512_shuffle_epi8(lut, _mm512_and_si512(v, low4)));
      _mm512_store_si512(d.codes[2 * c + 1],
                         _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), low4)));
    }
    _mm512_store_ps(d.w_scale, decode_block_scales<kFormat>(p.scales_a + (b0 + b) * kTileRows,
                                                            p.b_scales(b0 + b)));
  }
}

// tilestored with the stored bytes as the asm's output operand. GCC's _tile_stored clobbers all
// memory, which forces the register-blocked totals to the stack around every block; this tells
// the compiler exactly what changes.
#define FP4MOE_TILE_STORE(tile, buf)                                           \
  __asm__ volatile("tilestored %%tmm" #tile ", (%1,%2,1)"                      \
                   : "=m"(*reinterpret_cast<int32_t(*)[kTileTokens][16]>(buf)) \
                   : "r"(static_cast<void*>(buf)), "r"(static_cast<int64_t>(16 * 4)))

// Where a token tile writes: its MT tokens' rows of one pair, totals starting at zero (first slice)
// or at y, ending in y (times out_scale on the last slice).
struct TileOut {
  float* y;
  int64_t ldy;
  __mmask16 rows;
  bool first, last;
  __m512 out_scale;
};

// MT tokens (a 16-token tile whose rows past MT are ignored) over nb decoded blocks. a: the tile's
// codes at the slice's first block (row stride lda); sc: their activation scales, [block][token].
template <WeightFormat kFormat, int MT>
[[gnu::always_inline]] inline void token_tile(const DecodedBlock<kFormat>* d, int64_t nb,
                                              const int8_t* a, int64_t lda,
                                              const float (*sc)[kTileTokens], const TileOut& o) {
  constexpr int kB = kBlock<kFormat>;
  __m512 total[MT];
  FP4MOE_UNROLL
  for (int i = 0; i < MT; ++i) {
    total[i] = o.first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(o.rows, o.y + i * o.ldy);
  }
  alignas(64) int32_t sums0[kTileTokens][16], sums1[kTileTokens][16];
  // Block blk's sums (stored in s) scaled into the totals. A macro, not a lambda: a lambda's
  // reference to `total` kept the totals on the stack.
#define FP4MOE_SCALE_SUMS(blk, s)                                                               \
  do {                                                                                          \
    const __m512 w_scale = _mm512_load_ps(d[blk].w_scale);                                      \
    FP4MOE_UNROLL                                                                               \
    for (int i = 0; i < MT; ++i) {                                                              \
      total[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(s[i])),                   \
                                 _mm512_mul_ps(w_scale, _mm512_set1_ps(sc[blk][i])), total[i]); \
    }                                                                                           \
  } while (0)
  // Block blk's product into tile set S: C = tmm S, A = tmm 2 + S, B = tmm 4 + S.
#define FP4MOE_AMX_ISSUE(blk, C, A, B) \
  do {                                 \
    _tile_zero(C);                     \
    _tile_loadd(A, a + (blk)*kB, lda); \
    _tile_loadd(B, d[blk].codes, 64);  \
    _tile_dpbssd(C, A, B);             \
  } while (0)
  FP4MOE_AMX_ISSUE(0, 0, 2, 4);
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    FP4MOE_AMX_ISSUE(b + 1, 1, 3, 5);
    FP4MOE_TILE_STORE(0, sums0);
    FP4MOE_SCALE_SUMS(b, sums0);
    if (b + 2 < nb) FP4MOE_AMX_ISSUE(b + 2, 0, 2, 4);
    FP4MOE_TILE_STORE(1, sums1);
    FP4MOE_SCALE_SUMS(b + 1, sums1);
  }
  if (b < nb) {  // odd nb: the last block went into set 0
    FP4MOE_TILE_STORE(0, sums0);
    FP4MOE_SCALE_SUMS(b, sums0);
  }
#undef FP4MOE_AMX_ISSUE
#undef FP4MOE_SCALE_SUMS
  FP4MOE_UNROLL
  for (int i = 0; i < MT; ++i) {
    _mm512_mask_storeu_ps(o.y + i * o.ldy, o.rows,
                          o.last ? _mm512_mul_ps(total[i], o.out_scale) : total[i]);
  }
}

template <WeightFormat kFormat>
void w4a8_amx(const PackedMatrix& w, const QuantizedActivations& x, int64_t m, float* y,
              int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  constexpr int kB = kBlock<kFormat>;
  const int64_t k_blocks = w.k / kB;
  DecodedBlock<kFormat> decoded[kSliceBlocks];
  // The pass's activation scales, [token tile][block][token]: one pointer and constant offsets
  // in the inner loop.
  alignas(64) float scales[kPassTiles][kSliceBlocks][kTileTokens];
  // A partial last token tile is copied here so that tile loads read no row past m; its other
  // rows are zeroed once (read, ignored).
  // A call of fewer than 16 tokens configures tiles of that many rows instead, read in place.
  alignas(64) int8_t partial[kTileTokens * kSliceBlocks * kB];
  const int tile_rows = static_cast<int>(std::min<int64_t>(m, kTileTokens));
  const bool copy_partial = m > kTileTokens && m % kTileTokens != 0;
  if (copy_partial) std::memset(partial, 0, sizeof partial);
  TileOut o;
  o.ldy = ldy;
  o.out_scale = _mm512_set1_ps(w.tensor_scale * 0.5f);
  load_tile_config<kFormat>(tile_rows);
  for (int64_t p0 = 0; p0 < m; p0 += kPassTiles * kTileTokens) {
    const int64_t mp = std::min<int64_t>(kPassTiles * kTileTokens, m - p0);
    const int64_t tiles = (mp + kTileTokens - 1) / kTileTokens;
    const int64_t rest = mp % kTileTokens;  // tokens of a partial last tile, or 0
    for (int64_t b0 = 0; b0 < k_blocks; b0 += kSliceBlocks) {
      const int64_t nb = std::min(kSliceBlocks, k_blocks - b0);
      o.first = b0 == 0;
      o.last = b0 + nb == k_blocks;
      for (int64_t i = 0; i < mp; ++i) {
        const float* src = x.scales + (p0 + i) * x.lds + b0;
        for (int64_t b = 0; b < nb; ++b) scales[i / kTileTokens][b][i % kTileTokens] = src[b];
      }
      if (copy_partial && rest != 0) {
        for (int64_t i = 0; i < rest; ++i) {
          std::memcpy(partial + i * nb * kB, x.q + (p0 + mp - rest + i) * x.ldq + b0 * kB,
                      static_cast<size_t>(nb * kB));
        }
      }
      for (int64_t t = tile_begin; t < tile_end; t += 2) {
        const Fp4TilePair pair = avx512::fp4_tile_pair(w, t, tile_end);
        Fp4TilePair ahead;
        const Fp4TilePair* next = nullptr;
        if (t + 2 < tile_end) {
          ahead = avx512::fp4_tile_pair(w, t + 2, tile_end);
          next = &ahead;
        }
        decode_slice(pair, next, b0, nb, decoded);
        amx::stores_before_tile_reads();  // decoded tiles and copied codes, read by tile loads
        o.rows = row_mask(pair.rows);
        for (int64_t tt = 0; tt < tiles; ++tt) {
          const int64_t i0 = p0 + tt * kTileTokens;
          TileOut ot = o;
          ot.y = y + i0 * ldy + pair.first_row;
          if (tt + 1 < tiles || rest == 0) {
            token_tile<kFormat, kTileTokens>(decoded, nb, x.q + i0 * x.ldq + b0 * kB, x.ldq,
                                             scales[tt], ot);
          } else {
            const int8_t* a = copy_partial ? partial : x.q + i0 * x.ldq + b0 * kB;
            const int64_t lda = copy_partial ? nb * kB : x.ldq;
            with_mr<kTileTokens - 1>(rest, [&](auto mt) {
              token_tile<kFormat, decltype(mt)::value>(decoded, nb, a, lda, scales[tt], ot);
            });
          }
        }
      }
    }
  }
  _tile_release();
}

}  // namespace

void nvfp4_gemm_w4a8_16r_amx(const PackedMatrix& w, const QuantizedActivations& x, int64_t m,
                             float* y, int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  if (m < kAmxTokensMin<WeightFormat::kNvfp4>) {
    nvfp4_gemm_w4a8_16r_avx512_vnni(w, x, m, y, ldy, tile_begin, tile_end);
    return;
  }
  w4a8_amx<WeightFormat::kNvfp4>(w, x, m, y, ldy, tile_begin, tile_end);
}

void mxfp4_gemm_w4a8_16r_amx(const PackedMatrix& w, const QuantizedActivations& x, int64_t m,
                             float* y, int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  if (m < kAmxTokensMin<WeightFormat::kMxfp4>) {
    mxfp4_gemm_w4a8_16r_avx512_vnni(w, x, m, y, ldy, tile_begin, tile_end);
    return;
  }
  w4a8_amx<WeightFormat::kMxfp4>(w, x, m, y, ldy, tile_begin, tile_end);
}

}  // namespace fp4moe::kernels
