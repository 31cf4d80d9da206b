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

static_assert(kW4a8CodeOffset == 12, "the table below holds u = 2 * e2m1 + 12");

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
// (|.| <= 32 * 24 * 128 + 12 * 32 * 128): the low-nibble chain starts at the block's offset entry
// (types.h) instead of zero; two independent vpdpbusd chains (low and high nibble halves) for
// latency.
template <int kN>
[[gnu::always_inline]] inline __m512i block_dot(const DecodedPair<kN>& d, const int8_t* q,
                                                int32_t offset) {
  __m512i lo = _mm512_set1_epi32(offset), hi = _mm512_setzero_si512();
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
          block_dot(blk.codes, x.q + (i0 + i) * x.ldq + b * kBlock<kFormat>, x.offsets[s]),
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

// Many tokens (m >= kManyTokensMin): K is cut into slices; for each pass of up to kPassTokens
// tokens and each slice, the tokens' activation codes, scales and offsets are first copied once
// into an interleaved buffer (per group of kManyMr tokens and per block: 8 offsets, 8 scales, then
// 8 x block codes), so the inner loop addresses them from one pointer with constant displacements.
// Then each tile pair of the range decodes its slice once into an L1/L2 buffer (u vectors and
// weight scales per block) and register blocks of kManyMr tokens run over it: per block the
// decoded vectors are loaded once into registers, each token's int32 sum is one vpdpbusd chain
// that starts at its offset entry (the chains interleaved in program order), then one cvt, mul and
// fma into its total, which stays in a register across the slice. Totals carry between slices in
// y itself (F32, stored and reloaded exactly); the last slice applies the output scale. The
// arithmetic per block is the scalar kernel's, so the bits agree with it.
// Slice length: the activation buffer holds kActBytes of codes, so the fewer the tokens the longer
// the slice (whole K for the MoE's few tokens per expert, up to kMaxSliceK).
constexpr int64_t kManyTokensMin = 4;
// Tokens per register block: its int32 chains and F32 totals (2 x MR zmm) plus the block's u
// vectors and weight scales fit the 32 registers, and MR independent vpdpbusd chains keep both
// vpdpbusd ports busy through their latency.
template <WeightFormat kFormat>
constexpr int kManyMr = kFormat == WeightFormat::kNvfp4 ? 8 : 8;
constexpr int64_t kPassTokens = 64;
constexpr int64_t kActBytes = 32 * 1024;
constexpr int64_t kMinSliceK = 512;
constexpr int64_t kMaxSliceK = 4096;

template <WeightFormat kFormat>
struct alignas(64) DecodedBlock {
  __m512i u[2 * kChunks<kFormat>];  // u[j]: k 4j .. 4j + 3 of the block, dword = row
  __m512 w_scale;
};

// One group of kManyMr tokens at one block.
template <WeightFormat kFormat>
struct alignas(64) TokenBlock {
  int32_t offset[kManyMr<kFormat>];
  float scale[kManyMr<kFormat>];
  int8_t q[kManyMr<kFormat>][kBlock<kFormat>];
};

template <WeightFormat kFormat>
[[gnu::always_inline]] inline void decode_slice(const Fp4TilePair& p, int64_t b0, int64_t nb,
                                                DecodedBlock<kFormat>* out) {
  for (int64_t b = 0; b < nb; ++b) {
    PairBlock<kFormat> blk;
    decode_pair_block(p, b0 + b, blk);
    FP4MOE_UNROLL
    for (int c = 0; c < kChunks<kFormat>; ++c) {
      _mm512_store_si512(&out[b].u[2 * c], blk.codes.lo[c]);
      _mm512_store_si512(&out[b].u[2 * c + 1], blk.codes.hi[c]);
    }
    _mm512_store_ps(reinterpret_cast<float*>(&out[b].w_scale), blk.w_scale);
  }
}

// Tokens [i0, i0 + mb) at blocks [b0, b0 + nb) into groups of kManyMr: out[g * nb + b].
template <WeightFormat kFormat>
inline void pack_tokens(const QuantizedActivations& x, int64_t i0, int64_t mb, int64_t b0,
                        int64_t nb, TokenBlock<kFormat>* out) {
  for (int64_t i = 0; i < mb; ++i) {
    TokenBlock<kFormat>* g = out + (i / kManyMr<kFormat>) * nb;
    const int r = static_cast<int>(i % kManyMr<kFormat>);
    const int8_t* q = x.q + (i0 + i) * x.ldq + b0 * kBlock<kFormat>;
    const float* sc = x.scales + (i0 + i) * x.lds + b0;
    const int32_t* of = x.offsets + (i0 + i) * x.lds + b0;
    for (int64_t b = 0; b < nb; ++b) {
      g[b].offset[r] = of[b];
      g[b].scale[r] = sc[b];
      std::memcpy(g[b].q[r], q + b * kBlock<kFormat>, kBlock<kFormat>);
    }
  }
}

// MR tokens (rows of y, stride ldy) over nb decoded blocks: totals start at zero (first slice) or
// at y, and end in y (times out_scale on the last slice).
template <WeightFormat kFormat, int MR>
[[gnu::always_inline]] inline void w4a8_slice(const DecodedBlock<kFormat>* d,
                                              const TokenBlock<kFormat>* a, int64_t nb, float* y,
                                              int64_t ldy, __mmask16 rows, bool first, bool last,
                                              __m512 out_scale) {
  constexpr int kU = 2 * kChunks<kFormat>;
  __m512 total[MR];
  FP4MOE_UNROLL
  for (int i = 0; i < MR; ++i) {
    total[i] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(rows, y + i * ldy);
  }
  for (int64_t b = 0; b < nb; ++b) {
    FP4MOE_MCA_BLOCK_BEGIN("w4a8_many", "avx512_vnni");
    __m512i u[kU];
    FP4MOE_UNROLL
    for (int j = 0; j < kU; ++j) u[j] = _mm512_load_si512(&d[b].u[j]);
    const __m512 w_scale = _mm512_load_ps(reinterpret_cast<const float*>(&d[b].w_scale));
    const TokenBlock<kFormat>& t = a[b];
    // k-major over the MR chains, so independent vpdpbusd follow each other in program order.
    __m512i acc[MR];
    FP4MOE_UNROLL
    for (int i = 0; i < MR; ++i) acc[i] = _mm512_set1_epi32(t.offset[i]);
    FP4MOE_UNROLL
    for (int j = 0; j < kU; ++j) {
      FP4MOE_UNROLL
      for (int i = 0; i < MR; ++i) {
        acc[i] = _mm512_dpbusd_epi32(acc[i], u[j], broadcast4(t.q[i] + 4 * j));
      }
    }
    FP4MOE_UNROLL
    for (int i = 0; i < MR; ++i) total[i] = accumulate_block(acc[i], w_scale, t.scale[i], total[i]);
    FP4MOE_MCA_BLOCK_END();
  }
  FP4MOE_UNROLL
  for (int i = 0; i < MR; ++i) {
    _mm512_mask_storeu_ps(y + i * ldy, rows, last ? _mm512_mul_ps(total[i], out_scale) : total[i]);
  }
}

template <WeightFormat kFormat>
void w4a8_many(const PackedMatrix& w, const QuantizedActivations& x, int64_t m, float* y,
               int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  constexpr int kB = kBlock<kFormat>;
  constexpr int64_t kMaxSliceBlocks = kMaxSliceK / kB;
  constexpr int64_t kMaxGroupBlocks = kActBytes / (kManyMr<kFormat> * kB);  // groups x blocks per slice
  const int64_t k_blocks = w.k / kB;
  const __m512 out_scale = _mm512_set1_ps(w.tensor_scale * 0.5f);
  DecodedBlock<kFormat> decoded[kMaxSliceBlocks];
  TokenBlock<kFormat> act[kMaxGroupBlocks];
  for (int64_t i0 = 0; i0 < m; i0 += kPassTokens) {
    const int64_t mb = std::min(kPassTokens, m - i0);
    const int64_t groups = (mb + kManyMr<kFormat> - 1) / kManyMr<kFormat>;
    const int64_t slice_blocks =
        std::clamp(kMaxGroupBlocks / groups, kMinSliceK / kB, kMaxSliceBlocks);
    for (int64_t b0 = 0; b0 < k_blocks; b0 += slice_blocks) {
      const int64_t nb = std::min(slice_blocks, k_blocks - b0);
      const bool first = b0 == 0, last = b0 + nb == k_blocks;
      pack_tokens(x, i0, mb, b0, nb, act);
      for (int64_t t = tile_begin; t < tile_end; t += 2) {
        const Fp4TilePair p = avx512::fp4_tile_pair(w, t, tile_end);
        decode_slice(p, b0, nb, decoded);
        float* yt = y + i0 * ldy + p.first_row;
        const __mmask16 rows = row_mask(p.rows);
        for_token_groups<kManyMr<kFormat>>(mb, [&](auto mr, int64_t i) {
          w4a8_slice<kFormat, decltype(mr)::value>(decoded, act + (i / kManyMr<kFormat>) * nb, nb,
                                                   yt + i * ldy, ldy, rows, first, last,
                                                   out_scale);
        });
      }
    }
  }
}

template <WeightFormat kFormat>
void w4a8_gemm_avx512_vnni(const PackedMatrix& w, const QuantizedActivations& x, int64_t m,
                           float* y, int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  if (m >= kManyTokensMin) {
    w4a8_many<kFormat>(w, x, m, y, ldy, tile_begin, tile_end);
    return;
  }
  for (int64_t t = tile_begin; t < tile_end; t += 2) {
    const Fp4TilePair p = avx512::fp4_tile_pair(w, t, tile_end);
    float* yt = y + p.first_row;
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
