// AVX-512 VNNI W4A8 kernels (types.h, "W4A8"); compiled with the AVX-512 and VNNI flags only.
//
// The AVX2 W4A8 kernel's arithmetic (cpu/avx2/w4a8_avx2.cc) on two 8-row tiles per zmm (16 rows):
// dword r of a chunk pair holds one row's 4 consecutive k as loaded (types.h), one pshufb per
// nibble half (vpermb with VBMI: lookup_u) maps codes to
// u = 2 * e2m1 + 12 in [0, 24], and one vpdpbusd per half adds u * q over those 4 k straight into
// the int32 sums. That replaces AVX2's pmaddubsw + int16 adds + pmaddwd + int32 add (VNNI is where
// this family pays). A chain that starts at -12 * sum(q) gives sum((2 * e2m1) * q) exactly per
// block, and fma(float(sum), fl(weight scale * activation scale), total) is the scalar kernel's
// operation, so the bits agree with it and with the AVX2 kernel. There is no AVX-512 W4A8 kernel
// without VNNI: such hosts run the AVX2 one (the ISA levels are nested, registry.h).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/avx2/fp4_avx2.h"
#include "kernels/cpu/avx512/fp4_avx512.h"
#include "kernels/cpu/avx512/vbmi.h"
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
using avx512::host_has_vbmi;
using avx512::load_pair;
using avx512::prefetch_pair_block;
using avx512::row_mask;
using avx512::vpermb;

static_assert(kW4a8CodeOffset == 12, "the table below holds u = 2 * e2m1 + 12");

inline __m512i offset_e2m1_x2_lut() {
  return _mm512_broadcast_i32x4(
      _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
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

// u for the low (kHigh false) or high nibble of each byte of v. With VBMI (kVbmi), vpermb reads
// only the low 6 bits of each index byte from a 64-byte table, and the 16-entry table repeated in
// each 16-byte lane is such a table, so no mask is needed first: two ALU operations fewer per
// chunk pair. Measured on the 2-core Zen 4 of stop 27, one token, one thread, 4096 x 256 in L2:
// NVFP4 29.3 -> 32.4 GB/s, MXFP4 32 -> 36.5. Hosts with VNNI and no VBMI (Cascade Lake) run the
// kVbmi = false instantiation; the entry points choose (avx512/vbmi.h).
template <bool kVbmi, bool kHigh>
[[gnu::always_inline]] inline __m512i lookup_u(__m512i v, __m512i lut) {
  const __m512i idx = kHigh ? _mm512_srli_epi16(v, 4) : v;
  if constexpr (kVbmi) {
    return vpermb(idx, lut);
  } else {
    return _mm512_shuffle_epi8(lut, _mm512_and_si512(idx, _mm512_set1_epi8(0x0F)));
  }
}

template <int kN, bool kVbmi, bool kPrefetch = true>
[[gnu::always_inline]] inline void decode_pair(const uint8_t* a, const uint8_t* b,
                                               DecodedPair<kN>& d) {
  const __m512i lut = offset_e2m1_x2_lut();
  if constexpr (kPrefetch) {
    prefetch_ahead(a, kN * kChunkBytes);
    prefetch_ahead(b, kN * kChunkBytes);
  }
  FP4MOE_UNROLL
  for (int c = 0; c < kN; ++c) {
    const __m512i v = load_pair(a + c * kChunkBytes, b == nullptr ? nullptr : b + c * kChunkBytes);
    d.lo[c] = lookup_u<kVbmi, false>(v, lut);
    d.hi[c] = lookup_u<kVbmi, true>(v, lut);
  }
}

// Block b of a tile pair: its codes decoded and its 16 rows' weight scales.
template <WeightFormat kFormat>
struct PairBlock {
  DecodedPair<kChunks<kFormat>> codes;
  __m512 w_scale;
};

template <WeightFormat kFormat, bool kVbmi, bool kPrefetch = true>
[[gnu::always_inline]] inline void decode_pair_block(const Fp4TilePair& p, int64_t b,
                                                     PairBlock<kFormat>& out) {
  const int64_t off = b * kChunks<kFormat> * kChunkBytes;
  decode_pair<kChunks<kFormat>, kVbmi, kPrefetch>(p.codes_a + off, p.b_codes(off), out.codes);
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
template <WeightFormat kFormat, bool kVbmi, int MR>
inline void w4a8_pair(const PackedMatrix& w, const Fp4TilePair& p, const QuantizedActivations& x,
                      int64_t i0, float* y, int64_t ldy) {
  const int64_t k_blocks = w.k / kBlock<kFormat>;
  __m512 total[MR];
  FP4MOE_UNROLL
  for (int i = 0; i < MR; ++i) total[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < k_blocks; ++b) {
    FP4MOE_MCA_BLOCK_BEGIN("w4a8", "avx512_vnni");
    PairBlock<kFormat> blk;
    decode_pair_block<kFormat, kVbmi>(p, b, blk);
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
// into an interleaved buffer (per group of kManyMr tokens and per block: the offsets, the scales,
// then the codes), so the inner loop addresses them from one pointer with constant displacements.
// Then each two tile pairs of the range (32 rows) decode their slice once into a buffer (u vectors
// and weight scales per block) and register blocks of kManyMr tokens run over it: per block and
// k group, one broadcast of a token's 4 codes feeds both pairs' vpdpbusd, each token's int32 sums
// are vpdpbusd chains that start at its offset entry (the 2 x MR chains interleaved in program
// order), then one cvt, mul and fma per pair into its totals, which stay in registers across the
// slice. Totals carry between slices in y itself (F32, stored and reloaded exactly); the last
// slice applies the output scale. The arithmetic per block is the scalar kernel's, so the bits
// agree with it.
// Slice length: kSliceK at every token count. Every slice but the first reloads each register
// block's totals from y and every slice stores them: at 96 tokens, 4096 -> 2048 and 2 threads, y is
// 2 x 384 KiB, so those reloads come from beyond L2. The activation buffer holds a whole pass's
// slice (16 groups x 2048 k of codes, with their scales and offsets: 288 KiB NVFP4, 240 KiB MXFP4,
// in L2). Before, a 48 KiB buffer set the slice (512 k at 96 tokens, up to 2048 for fewer); this
// one measured on the 2-core Zen 4, 2 threads, weights from DRAM, interleaved, GFLOP/s:
// NVFP4 4096 -> 2048 at 64 tokens 478-508 -> 481-521, at 256 485-510 -> 513-534, 2048 -> 4096 at
// 256 490-525 -> 531-541, 4096 -> 14336 at 64 447-486 -> 505-507; MXFP4 4096 -> 2048 at 64
// 596-622 -> 628-653, at 256 606-666 -> 629-642 (alike), 2048 -> 4096 at 256 624-659 -> 699-707,
// 4096 -> 14336 at 64 622-636 -> 517-651 (one low run). (Buffers of 96 and 384 KiB measured
// between the two.)
// Below 12 tokens the groups that decode into registers measured faster with the weights
// streaming from DRAM (4096 x 14336, 2 threads: 1.4 against 2.0 ms at M = 4, 3.4 against 3.0 at
// 12; 4096 x 2048 on the 2-core Zen 4, groups of <= 6, GFLOP/s MXFP4 / NVFP4: M = 5 468 / 409
// against 260 / 221, M = 10 476 / 388 against 396 / 341).
constexpr int64_t kManyTokensMin = 12;
// Tokens per register block: 2 pairs x MR int32 chains and F32 totals, the k group's two u vectors
// and the two weight-scale vectors fit the 32 registers.
constexpr int kManyMr = 6;
constexpr int kMaxPairs = 2;
constexpr int64_t kPassTokens = 16 * kManyMr;
constexpr int64_t kSliceK = 2048;

template <WeightFormat kFormat>
struct alignas(64) DecodedBlock {
  __m512i u[2 * kChunks<kFormat>];  // u[j]: k 4j .. 4j + 3 of the block, dword = row
  __m512 w_scale;
};

// One group of kManyMr tokens at one block.
template <WeightFormat kFormat>
struct alignas(64) TokenBlock {
  int32_t offset[kManyMr];
  float scale[kManyMr];
  int8_t q[kManyMr][kBlock<kFormat>];
};

// MXFP4's exponent path (w4a8_slice, kExp): its weight scales are powers of two, so where
// fl(weight scale * activation scale) is a normal float it is the activation scale with its
// exponent raised, exactly: an integer add of e << 23 to its bits (any of the four vector pipes)
// in place of vmulps (one of the two FMA pipes, which the vpdpbusd chains fill). A slice of tile
// pairs takes it when every weight scale is within 2^+-27 and every activation scale within
// 2^+-96 (or zero), so every product lies within 2^+-123; else the multiply. Measured on the
// 2-core Zen 4: a register-only loop of the 2 pairs x 6 tokens block, 72.3 -> 60.4 cycles per
// block; the kernel, one thread, 256 tokens, 4096 -> 2048 in L2, interleaved in a noisy hour,
// median 300 -> 311 GFLOP/s (258-314 against 261-344).
constexpr float kMinExpScale = 0x1p-27f, kMaxExpScale = 0x1p27f;
constexpr float kMinExpActScale = 0x1p-96f, kMaxExpActScale = 0x1p96f;

// Decodes blocks [b0, b0 + nb) of pair p into out, prefetching the same blocks of the pair
// `ahead` (the next tile set's, or none) as it goes: a slice is only part of a tile, so the
// decode's own prefetch (the bytes that follow) would fetch this tile's next slice, which is read
// only after every tile set of the range. Returns whether every weight scale is in the exponent
// path's range (MXFP4).
template <WeightFormat kFormat, bool kVbmi>
[[gnu::always_inline]] inline bool decode_slice(const Fp4TilePair& p, const Fp4TilePair* ahead,
                                                int64_t b0, int64_t nb,
                                                DecodedBlock<kFormat>* out) {
  constexpr int64_t kBlockBytes = kChunks<kFormat> * kChunkBytes;  // 64 or 128 per tile
  __mmask16 in_range = 0xFFFF;
  for (int64_t b = 0; b < nb; ++b) {
    if (ahead != nullptr) prefetch_pair_block(*ahead, b0 + b, kBlockBytes);
    PairBlock<kFormat> blk;
    decode_pair_block<kFormat, kVbmi, false>(p, b0 + b, blk);
    if constexpr (kFormat == WeightFormat::kMxfp4) {
      in_range &= _mm512_cmp_ps_mask(blk.w_scale, _mm512_set1_ps(kMinExpScale), _CMP_GE_OQ) &
                  _mm512_cmp_ps_mask(blk.w_scale, _mm512_set1_ps(kMaxExpScale), _CMP_LE_OQ);
    }
    FP4MOE_UNROLL
    for (int c = 0; c < kChunks<kFormat>; ++c) {
      _mm512_store_si512(&out[b].u[2 * c], blk.codes.lo[c]);
      _mm512_store_si512(&out[b].u[2 * c + 1], blk.codes.hi[c]);
    }
    _mm512_store_ps(reinterpret_cast<float*>(&out[b].w_scale), blk.w_scale);
  }
  // Only the pair's real rows count (a missing tile decodes with scale code 0; its rows are never
  // stored).
  return (in_range | static_cast<__mmask16>(~row_mask(p.rows))) == 0xFFFF;
}

// Token groups: mb tokens in `groups` groups of near-equal size (at most kManyMr each): group g
// holds tokens [group_start(g), group_start(g + 1)). Equal groups keep every register block wide
// (10 tokens run as 5 + 5, not 6 + 4).
constexpr int64_t group_start(int64_t mb, int64_t groups, int64_t g) { return mb * g / groups; }

// A pass holds at least kManyTokensMin tokens (a split into passes of <= kPassTokens only happens
// above kPassTokens), so no group is smaller than kManyMinMr: only those register blocks exist.
constexpr int kManyMinMr = 4;
constexpr bool groups_at_least(int64_t min_mr) {
  for (int64_t mb = kManyTokensMin; mb <= kPassTokens; ++mb) {
    const int64_t groups = (mb + kManyMr - 1) / kManyMr;
    for (int64_t g = 0; g < groups; ++g) {
      if (group_start(mb, groups, g + 1) - group_start(mb, groups, g) < min_mr) return false;
    }
  }
  return kPassTokens / 2 >= kManyTokensMin;  // the smallest pass of a split
}
static_assert(groups_at_least(kManyMinMr));

// Tokens [i0, i0 + mb) at blocks [b0, b0 + nb) into their groups: out[g * nb + b]. Returns whether
// every activation scale is in the exponent path's range (MXFP4).
template <WeightFormat kFormat>
inline bool pack_tokens(const QuantizedActivations& x, int64_t i0, int64_t mb, int64_t groups,
                        int64_t b0, int64_t nb, TokenBlock<kFormat>* out) {
  bool in_range = true;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t g0 = group_start(mb, groups, g), g1 = group_start(mb, groups, g + 1);
    for (int64_t i = g0; i < g1; ++i) {
      TokenBlock<kFormat>* tb = out + g * nb;
      const int r = static_cast<int>(i - g0);
      const int8_t* q = x.q + (i0 + i) * x.ldq + b0 * kBlock<kFormat>;
      const float* sc = x.scales + (i0 + i) * x.lds + b0;
      const int32_t* of = x.offsets + (i0 + i) * x.lds + b0;
      for (int64_t b = 0; b < nb; ++b) {
        tb[b].offset[r] = of[b];
        const float a = sc[b];
        if constexpr (kFormat == WeightFormat::kMxfp4) {
          // A zero scale's block has only zero codes and a zero offset, so its sum is 0 and any
          // finite scale gives the same +0 term: 1 keeps it in range. NaN is out of range.
          in_range = in_range && (a == 0.0f || (a >= kMinExpActScale && a <= kMaxExpActScale));
          tb[b].scale[r] = a == 0.0f ? 1.0f : a;
        } else {
          tb[b].scale[r] = a;
        }
        std::memcpy(tb[b].q[r], q + b * kBlock<kFormat>, kBlock<kFormat>);
      }
    }
  }
  return in_range;
}

// How a register block writes its NP tile pairs' rows of MR tokens (stride ldy), the same for
// every token group of a tile set: each group passes its own y beside it. (Copying this struct per
// group with y changed cost ~8% of the kernel on the 2-core Zen 4: the copy's zmm loads stalled on
// the narrow stores that had just written its fields.)
struct SliceOut {
  int64_t ldy;
  __mmask16 rows[kMaxPairs];
  int row_count[kMaxPairs];
  bool first, last;
  __m512 out_scale;
};

// The first `rows` floats at p, zeros after them, reading nothing past them (a plain masked load
// would do, but SIMDe, which the emulated test build runs this file through, lacks one).
inline __m512 load_rows(const float* p, int rows) {
  if (rows == 2 * kTileRows) return _mm512_loadu_ps(p);
  alignas(64) float tmp[2 * kTileRows] = {};
  std::memcpy(tmp, p, sizeof(float) * static_cast<size_t>(rows));
  return _mm512_load_ps(tmp);
}

// MR tokens over nb blocks of NP decoded pairs (d[p * stride + b]): totals start at zero (first
// slice) or at y, and end in y (times out_scale on the last slice).
template <WeightFormat kFormat, int NP, int MR, bool kExp>
[[gnu::always_inline]] inline void w4a8_slice(const DecodedBlock<kFormat>* d, int64_t stride,
                                              const TokenBlock<kFormat>* a, int64_t nb,
                                              const SliceOut& o, float* y) {
  constexpr int kU = 2 * kChunks<kFormat>;
  __m512 total[NP][MR];
  FP4MOE_UNROLL
  for (int p = 0; p < NP; ++p) {
    FP4MOE_UNROLL
    for (int i = 0; i < MR; ++i) {
      total[p][i] =
          o.first ? _mm512_setzero_ps() : load_rows(y + i * o.ldy + 16 * p, o.row_count[p]);
    }
  }
  for (int64_t b = 0; b < nb; ++b) {
    FP4MOE_MCA_BLOCK_BEGIN("w4a8_many", "avx512_vnni");
    const TokenBlock<kFormat>& t = a[b];
    __m512i acc[NP][MR];
    FP4MOE_UNROLL
    for (int p = 0; p < NP; ++p) {
      FP4MOE_UNROLL
      for (int i = 0; i < MR; ++i) acc[p][i] = _mm512_set1_epi32(t.offset[i]);
    }
    // k-major over the chains, so independent vpdpbusd follow each other in program order.
    FP4MOE_UNROLL
    for (int j = 0; j < kU; ++j) {
      __m512i u[NP];
      FP4MOE_UNROLL
      for (int p = 0; p < NP; ++p) u[p] = _mm512_load_si512(&d[p * stride + b].u[j]);
      FP4MOE_UNROLL
      for (int i = 0; i < MR; ++i) {
        const __m512i qv = broadcast4(t.q[i] + 4 * j);
        FP4MOE_UNROLL
        for (int p = 0; p < NP; ++p) acc[p][i] = _mm512_dpbusd_epi32(acc[p][i], u[p], qv);
      }
    }
    if constexpr (kExp) {
      // MXFP4 with every scale in range (w4a8_many): fl(2^e * a) = a * 2^e exactly, made by
      // adding e << 23 to a's bits; an integer add in place of the multiply.
      __m512i e[NP];
      FP4MOE_UNROLL
      for (int p = 0; p < NP; ++p) {
        e[p] = _mm512_sub_epi32(_mm512_load_si512(&d[p * stride + b].w_scale),
                                _mm512_castps_si512(_mm512_set1_ps(1.0f)));
      }
      FP4MOE_UNROLL
      for (int i = 0; i < MR; ++i) {
        int32_t a;
        std::memcpy(&a, &t.scale[i], sizeof a);
        FP4MOE_UNROLL
        for (int p = 0; p < NP; ++p) {
          const __m512 prod = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_set1_epi32(a), e[p]));
          total[p][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[p][i]), prod, total[p][i]);
        }
      }
    } else {
      FP4MOE_UNROLL
      for (int p = 0; p < NP; ++p) {
        const __m512 w_scale =
            _mm512_load_ps(reinterpret_cast<const float*>(&d[p * stride + b].w_scale));
        FP4MOE_UNROLL
        for (int i = 0; i < MR; ++i) {
          total[p][i] = accumulate_block(acc[p][i], w_scale, t.scale[i], total[p][i]);
        }
      }
    }
    FP4MOE_MCA_BLOCK_END();
  }
  FP4MOE_UNROLL
  for (int p = 0; p < NP; ++p) {
    FP4MOE_UNROLL
    for (int i = 0; i < MR; ++i) {
      _mm512_mask_storeu_ps(y + i * o.ldy + 16 * p, o.rows[p],
                            o.last ? _mm512_mul_ps(total[p][i], o.out_scale) : total[p][i]);
    }
  }
}

template <WeightFormat kFormat, bool kVbmi>
void w4a8_many(const PackedMatrix& w, const QuantizedActivations& x, int64_t m, float* y,
               int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  constexpr int kB = kBlock<kFormat>;
  constexpr int64_t kSliceBlocks = kSliceK / kB;
  const int64_t k_blocks = w.k / kB;
  DecodedBlock<kFormat> decoded[kMaxPairs * kSliceBlocks];
  // The activation buffer of the fullest pass (kPassTokens / kManyMr groups) lives on the heap,
  // once per thread: on the stack it would overflow a caller's small thread stack.
  thread_local std::vector<TokenBlock<kFormat>> act_buffer(kPassTokens / kManyMr * kSliceBlocks);
  TokenBlock<kFormat>* const act = act_buffer.data();
  SliceOut o;
  o.ldy = ldy;
  o.out_scale = _mm512_set1_ps(w.tensor_scale * 0.5f);
  // Passes of near-equal size, at most kPassTokens each.
  const int64_t passes = (m + kPassTokens - 1) / kPassTokens;
  for (int64_t pass = 0; pass < passes; ++pass) {
    const int64_t i0 = m * pass / passes, mb = m * (pass + 1) / passes - i0;
    const int64_t groups = (mb + kManyMr - 1) / kManyMr;
    int64_t starts[kPassTokens / kManyMr + 1];  // the groups' first tokens, then mb
    for (int64_t g = 0; g <= groups; ++g) starts[g] = group_start(mb, groups, g);
    for (int64_t b0 = 0; b0 < k_blocks; b0 += kSliceBlocks) {
      const int64_t nb = std::min(kSliceBlocks, k_blocks - b0);
      o.first = b0 == 0;
      o.last = b0 + nb == k_blocks;
      const bool act_in_range = pack_tokens(x, i0, mb, groups, b0, nb, act);
      // Two tile pairs (4 tiles) at a time; a range's last 1-3 tiles run as one or two pairs.
      for (int64_t t = tile_begin; t < tile_end; t += 2 * kMaxPairs) {
        const int np = t + 2 < tile_end ? 2 : 1;
        bool in_range = act_in_range;
        for (int p = 0; p < np; ++p) {
          const Fp4TilePair pair = avx512::fp4_tile_pair(w, t + 2 * p, tile_end);
          // The pair at the same place in the next set of the range: its blocks are fetched
          // while this one decodes.
          const int64_t tn = t + 2 * kMaxPairs + 2 * p;
          Fp4TilePair ahead;
          const Fp4TilePair* next = nullptr;
          if (tn < tile_end) {
            ahead = avx512::fp4_tile_pair(w, tn, tile_end);
            next = &ahead;
          }
          in_range = decode_slice<kFormat, kVbmi>(pair, next, b0, nb, decoded + p * nb) && in_range;
          o.rows[p] = row_mask(pair.rows);
          o.row_count[p] = pair.rows;
        }
        float* yt = y + i0 * ldy + t * kTileRows;
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t g0 = starts[g];
          float* yg = yt + g0 * ldy;
          const TokenBlock<kFormat>* ag = act + g * nb;
          with_mr<kManyMr, kManyMinMr>(starts[g + 1] - g0, [&](auto mr) {
            constexpr int kMr = decltype(mr)::value;
            const auto run = [&]<bool kExp>() {
              if (np == 2) {
                w4a8_slice<kFormat, 2, kMr, kExp>(decoded, nb, ag, nb, o, yg);
              } else {
                w4a8_slice<kFormat, 1, kMr, kExp>(decoded, nb, ag, nb, o, yg);
              }
            };
            if constexpr (kFormat == WeightFormat::kMxfp4) {
              if (in_range) {
                run.template operator()<true>();
                return;
              }
            }
            run.template operator()<false>();
          });
        }
      }
    }
  }
}

// ---- One token, one tile at a time ------------------------------------------------------------
// The pair kernel (w4a8_pair) reads four streams at once: two tiles' codes, 16 KiB apart at
// K = 4096, and their two scale streams. Here a thread reads one tile at a time: one code stream
// and one scale stream, each contiguous over its whole tile range. On the 2-core Zen 4 the
// hardware prefetchers keep such a stream far better ahead of a compute-heavy loop: a synthetic
// loop of this one's density read 28.5 GB/s from DRAM on one thread with one stream (and its side
// stream), 23.5 with two. Measured on the first such kernel, one thread, one token, 4096 -> 14336
// from DRAM, interleaved with the pair kernel, fraction of the read bandwidth measured between its
// rounds: MXFP4 0.78-0.82 against 0.68-0.73, NVFP4 0.65-0.77 against 0.68-0.71. At 2 or 4 tokens
// the pair kernel measured faster (the block end per token dominates), so this path is one token
// only. No software prefetch of the code stream: 4 KiB ahead measured slower here (one thread from
// DRAM, MXFP4 22.0-23.0 against 25.0-27.0 GB/s; NVFP4 alike). The thin scale stream beside it is
// prefetched in bursts of 4 lines (prefetch_tile_scales; its figures are in cpu/prefetch.h).
//
// The arithmetic, in 256-bit vectors: a chunk's dword r is row r (types.h), so the two vpermb of
// its nibbles give u for k 0-3 and 4-7 of the 8 rows, and two vpdpbusd take the token's codes of
// those k as dword broadcasts: per block, each row's int32 sum is one lane, started at the block's
// offset entry, with no lane to fold. Then cvt, fl(weight scale * activation scale) and the fma on
// 8 lanes, as the scalar kernel does, so the bits agree with it.
// Why 256 bits: Zen 4 runs a 512-bit operation as two 256-bit halves, so a zmm body costs what two
// ymm ones do, and 8-row tiles in 16-lane vectors need a fold per block (the first version of this
// path: one vpermb interleaving chunks c and c + 1 so that dword 2r + h held row r, chunk c + h,
// qword broadcasts of the token's codes, and per block a shift, an add and a vpmovqd before the
// 8-lane block end). One thread, one token, 4096 -> 256 in L2, interleaved runs on the 2-core
// Zen 4: that version NVFP4 30.1-31.9 and MXFP4 37.0-38.1 GB/s; this one 37.8-38.1 and 40.3-42.0
// (33.5-34.7 and 36.3-37.4 with the in-lane byte transpose the earlier chunk layout needed). Its
// body alone, in registers (bench_peaks' w4a8_tile mix, bench/peers/peaks_decode_avx512.cc), reads
// 72.7 GB/s per core there, the 512-bit body 57.5. On a host with full-width 512-bit units (Intel)
// the shuffle port takes 4 ymm vpermb per 64 bytes where the zmm version took 3 plus its fold's
// vpmovqd: not measured.
// The loop is two stages, unrolled by two, so no vector rotates between iterations: block b + 1
// is decoded and dotted while block b is finished (three stages with rotating registers measured
// 33.5 against 33.9-34.7 with the transpose; one dot chain per block NVFP4 33.7-37.4, MXFP4
// 35.1-37.1).
template <WeightFormat kFormat, bool kPrescaled>
inline void w4a8_tile(const PackedMatrix& w, int64_t t, const QuantizedActivations& x,
                      const float* act_scales, float* y) {
  constexpr int MR = 1;                       // one token (read by the mca.h markers)
  constexpr int kC = kChunks<kFormat>;        // 32-byte chunks per block: 2 or 4
  using Codes4 [[gnu::may_alias]] = int32_t;  // 4 of the token's codes
  const int64_t k_blocks = w.k / kBlock<kFormat>;
  const avx2::Fp4Tile tile = avx2::fp4_tile_at(w, t);
  const int8_t* q = x.q;
  const int32_t* offsets = x.offsets;
  const __m256i lut = _mm512_castsi512_si256(offset_e2m1_x2_lut());
  __m256 total = _mm256_setzero_ps();
  // Block b's int32 sums, dword r = row r.
  const auto dot = [&](int64_t b) {
    prefetch_tile_scales(tile.scales, b);
    __m256i lo = _mm256_set1_epi32(offsets[b]), hi = _mm256_setzero_si256();
    FP4MOE_UNROLL
    for (int c = 0; c < kC; ++c) {
      const __m256i v = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(tile.codes + (b * kC + c) * kChunkBytes));
      const int8_t* qc = q + b * kBlock<kFormat> + c * kFp4ChunkK;
      lo = _mm256_dpbusd_epi32(lo, vpermb(v, lut),
                               _mm256_set1_epi32(*reinterpret_cast<const Codes4*>(qc)));
      hi = _mm256_dpbusd_epi32(hi, vpermb(_mm256_srli_epi16(v, 4), lut),
                               _mm256_set1_epi32(*reinterpret_cast<const Codes4*>(qc + 4)));
    }
    return _mm256_add_epi32(lo, hi);
  };
  const auto finish = [&](int64_t b, __m256i rows) {
    const __m256 w_scale = kPrescaled
                               ? avx2::nvfp4_scale_bits(tile.scales + b * kTileRows)
                               : avx2::decode_block_scales<kFormat>(tile.scales + b * kTileRows);
    total = _mm256_fmadd_ps(_mm256_cvtepi32_ps(rows),
                            _mm256_mul_ps(w_scale, _mm256_set1_ps(act_scales[b])), total);
  };
  __m256i s0 = dot(0);
  int64_t b = 0;
  for (; b + 2 < k_blocks; b += 2) {
    FP4MOE_MCA_BLOCK_BEGIN("w4a8_tile", "avx512_vnni");
    const __m256i s1 = dot(b + 1);
    finish(b, s0);
    s0 = dot(b + 2);
    finish(b + 1, s1);
    FP4MOE_MCA_BLOCK_END();
  }
  if (b + 1 < k_blocks) {
    const __m256i s1 = dot(b + 1);
    finish(b, s0);
    s0 = s1;
    ++b;
  }
  finish(b, s0);
  avx2::store_rows(y + t * kTileRows, _mm256_mul_ps(total, _mm256_set1_ps(w.tensor_scale * 0.5f)),
                   tile.rows);
}

// NVFP4's weight scale is bits(code << 20) * 2^120 (fp4_avx2.h). Where the activation scale a is
// below 2^8, a * 2^120 is exact and finite, so fl(bits(code << 20) * fl(a * 2^120)) and the
// scalar kernel's fl(fl(bits(code << 20) * 2^120) * a) round the same real product: one vmulps
// fewer per block, with the same bits. Fills `out` with a * 2^120 per block and returns whether
// every |scale| is in that range (NaN is not).
inline bool prescale_nvfp4(const float* scales, int64_t blocks, std::vector<float>& out) {
  out.resize(static_cast<size_t>(blocks));
  bool in_range = true;  // no short-circuit: a branch per scale made a 256-long dependency chain
  for (int64_t b = 0; b < blocks; ++b) {
    in_range &= std::fabs(scales[b]) < 0x1p8f;
    out[static_cast<size_t>(b)] = scales[b] * 0x1p120f;
  }
  return in_range;
}

template <WeightFormat kFormat>
void w4a8_one_token(const PackedMatrix& w, const QuantizedActivations& x, float* y,
                    int64_t tile_begin, int64_t tile_end) {
  // The pipelined tile loop starts at block 0: K holds at least one block (pack/ checks it).
  FP4MOE_CHECK(w.k >= kBlock<kFormat>);
  if constexpr (kFormat == WeightFormat::kNvfp4) {
    thread_local std::vector<float> prescaled;
    if (prescale_nvfp4(x.scales, w.k / kBlock<kFormat>, prescaled)) {
      for (int64_t t = tile_begin; t < tile_end; ++t) {
        w4a8_tile<kFormat, true>(w, t, x, prescaled.data(), y);
      }
      return;
    }
  }
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    w4a8_tile<kFormat, false>(w, t, x, x.scales, y);
  }
}

template <WeightFormat kFormat, bool kVbmi>
void w4a8_gemm_avx512_vnni(const PackedMatrix& w, const QuantizedActivations& x, int64_t m,
                           float* y, int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  if (m >= kManyTokensMin) {
    w4a8_many<kFormat, kVbmi>(w, x, m, y, ldy, tile_begin, tile_end);
    return;
  }
  // One token: one tile at a time where vpermb is there.
  if constexpr (kVbmi) {
    if (m == 1) {
      w4a8_one_token<kFormat>(w, x, y, tile_begin, tile_end);
      return;
    }
  }
  // Near-equal groups of at most kFewMr tokens, each decoding the pair once (groups of at most 4
  // decoded twice at M = 5 or 6, three times at 10; 2-core Zen 4, 4096 x 2048 from DRAM, GFLOP/s
  // MXFP4 / NVFP4: M = 5 333 / 298 -> 468 / 409, M = 6 403 / 359 -> 470 / 373, M = 10 429 / 391 ->
  // 476 / 388). MXFP4 at 5-6 tokens spills a few registers (8 decoded vectors), and still gains.
  constexpr int kFewMr = 6;
  const int64_t groups = (m + kFewMr - 1) / kFewMr;
  for (int64_t t = tile_begin; t < tile_end; t += 2) {
    const Fp4TilePair p = avx512::fp4_tile_pair(w, t, tile_end);
    float* yt = y + p.first_row;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t i0 = group_start(m, groups, g), i1 = group_start(m, groups, g + 1);
      with_mr<kFewMr>(i1 - i0, [&](auto mr) {
        w4a8_pair<kFormat, kVbmi, decltype(mr)::value>(w, p, x, i0, yt, ldy);
      });
    }
  }
}

// The VBMI instantiation where the host has VBMI (always in the SIMDe-emulated build, whose
// vpermb is SIMDe's; FP4MOE_NO_VBMI turns it off there too).
template <WeightFormat kFormat>
void w4a8_gemm_vnni_entry(const PackedMatrix& w, const QuantizedActivations& x, int64_t m, float* y,
                          int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  if (host_has_vbmi()) {
    w4a8_gemm_avx512_vnni<kFormat, true>(w, x, m, y, ldy, tile_begin, tile_end);
    return;
  }
  w4a8_gemm_avx512_vnni<kFormat, false>(w, x, m, y, ldy, tile_begin, tile_end);
}

}  // namespace

void nvfp4_gemm_w4a8_16r_avx512_vnni(const PackedMatrix& w, const QuantizedActivations& x,
                                     int64_t m, float* y, int64_t ldy, int64_t tile_begin,
                                     int64_t tile_end) {
  w4a8_gemm_vnni_entry<WeightFormat::kNvfp4>(w, x, m, y, ldy, tile_begin, tile_end);
}

void mxfp4_gemm_w4a8_16r_avx512_vnni(const PackedMatrix& w, const QuantizedActivations& x,
                                     int64_t m, float* y, int64_t ldy, int64_t tile_begin,
                                     int64_t tile_end) {
  w4a8_gemm_vnni_entry<WeightFormat::kMxfp4>(w, x, m, y, ldy, tile_begin, tile_end);
}

}  // namespace fp4moe::kernels
