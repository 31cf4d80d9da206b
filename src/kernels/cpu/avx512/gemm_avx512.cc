// AVX-512 (F/BW/VL/DQ) kernels over the kernel layout (types.h): the AVX2 kernels' products and
// sums on two 8-row tiles at once so one zmm holds 16 output rows; FP4 codes are decoded by a
// 16-entry vpermps table (transposed_code_ps), FP8 by the AVX2 kernels' FP16 route. Compiled with
// only the AVX-512 flags; dispatch/ calls them only when cpuid and XCR0 (opmask + zmm state) allow.
//
// No VNNI / BF16 / VBMI variants: these kernels are W4A16 (the decoded weight times the F32
// activation, accumulated in F32). VNNI is an int8 dot product: it pays in the W4A8 kernels
// (cpu/avx512_vnni/), not here; vdpbf16ps would round F32 activations to BF16 and flushes
// subnormals, so it runs in the BF16-activation family (cpu/avx512_bf16/), for BF16 callers only;
// VBMI's vpermb makes bytes, and vpermps already gives the floats.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "formats/scalar.h"
#include "kernels/cpu/avx512/fp4_avx512.h"
#include "kernels/cpu/avx512/vbmi.h"
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/cpu/mca.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/token_groups.h"

namespace fp4moe::kernels {
namespace {

using avx512::decode_block_scales;
using avx512::Fp4TilePair;
using avx512::fp8_chunk_rows;
using avx512::fp8_pair_at;
using avx512::Fp8Pair;
using avx512::load_pair;
using avx512::row_mask;

#define FP4MOE_UNROLL_ALL _Pragma("GCC unroll 32")

constexpr float kFp4DecodeFactor = 1.0f / 33554432.0f;  // 2^-25: undoes (2 * e2m1) << 24

// The 16 E2M1 codes (formats::kE2M1Values) as F32 times 2^25, -0 as +0: the floats the AVX2
// kernels' top-byte decode makes ((2 * e2m1) << 24 as an int32; the 2^-25 above undoes it).
// vpermps looks a code up straight from the low 4 bits of a dword.
constexpr std::array<float, 16> e2m1_x2_top_byte() {
  std::array<float, 16> t{};
  for (size_t c = 0; c < t.size(); ++c) t[c] = formats::kE2M1Values[c] * 0x1p25f + 0.0f;
  return t;
}
alignas(64) constexpr std::array<float, 16> kE2m1x2TopByte = e2m1_x2_top_byte();
static_assert(kE2m1x2TopByte[15] == -0xcp24f && std::bit_cast<uint32_t>(kE2m1x2TopByte[8]) == 0);

// k in [0, 8) of a chunk pair, 16 rows: dword r holds row
// r's bytes for k 0-3 (low nibbles) and 4-7 (high nibbles), so k's code is the low 4 bits of the
// dword shifted right by 8 * (k % 4) + 4 * (k / 4), which is all vpermps reads of an index. One
// shift and one vpermps per 16 weights, where the AVX2 kernels' top-byte decode (pshufb into the
// top byte, cvtdq2ps) also needs two table pshufb and three masks per chunk pair: on the 2-core
// Zen 4 of stop 27, one token, one thread in L2, NVFP4 4096 x 256 went from 11.5 to 13.3-13.6 GB/s.
// Called in fully unrolled loops, so kk and the shift are constants.
[[gnu::always_inline]] inline __m512 transposed_code_ps(__m512i t, __m512 lut, int kk) {
  const int shift = 8 * (kk % 4) + 4 * (kk / 4);
  return _mm512_permutexvar_ps(shift == 0 ? t : _mm512_srli_epi32(t, shift), lut);
}

template <WeightFormat kFormat, int MR>
inline void fp4_pair(const PackedMatrix& w, const Fp4TilePair& p, const float* x, int64_t ldx,
                     float* y, int64_t ldy) {
  // 32 zmm registers: 4 independent FMA chains per token at every MR (see gemm_avx2.cc).
  constexpr int kChains = 4;
  constexpr int kChunksPerBlock = (kFormat == WeightFormat::kNvfp4 ? 16 : 32) / kFp4ChunkK;
  const int64_t k_blocks = w.chunks / kChunksPerBlock;
  const __m512 lut = _mm512_load_ps(kE2m1x2TopByte.data());
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
      const __m512i t = load_pair(p.codes_a + off, p.b_codes(off));
      const float* xk = x + (b * kChunksPerBlock + c) * kFp4ChunkK;
      FP4MOE_UNROLL_ALL
      for (int kk = 0; kk < kFp4ChunkK; ++kk) {
        const __m512 wv = transposed_code_ps(t, lut, kk);
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

// ---- Many tokens: decode a panel of each tile pair once, then register-blocked pure FMAs. -------
// From kPanelMinTokens tokens on, the tile pairs of a row block are decoded once per K slice into
// an L1 panel of F32 weights with their block scales applied (e2m1 x UE4M3 or x E8M0, times the
// 2^25 of the decode, is exact in F32), which every token then reads: per k, kPanelPairs weight
// loads, one broadcast per token and kPanelPairs FMAs per token, nothing else on the FMA ports.
// Each output is then one F32 chain over K (no per-block partial sums), the order the tests allow
// (tests/cpp/kernels/gemm_test.cc); the tensor scale and 2^-25 are applied at the end.
constexpr int64_t kPanelMinTokens = 5;
constexpr int kPanelPairs = 2;          // zmm of rows per register block: 32 rows, two tile pairs
constexpr int kPanelAccumulators = 24;  // kPanelPairs x 12 tokens (2 x 24 for a lone pair)
constexpr int64_t kPanelK = 128;        // k per slice: 128 x 32 rows x 4 B = a 16 KiB panel
constexpr int64_t kPanelTokens = 96;    // tokens whose sums (96 x 32 rows x 4 B) sit in L1
constexpr int64_t kPanelXBytes = 1 << 20;  // activations of a token chunk, kept in L2

// Rows of tile pair p, k in [k0, k0 + kc), into panel[k - k0][lane] (row stride `ld` floats).
template <WeightFormat kFormat>
inline void decode_pair_panel(const Fp4TilePair& p, int64_t k0, int64_t kc, float* panel,
                              int64_t ld) {
  constexpr int kChunksPerBlock = (kFormat == WeightFormat::kNvfp4 ? 16 : 32) / kFp4ChunkK;
  const __m512 lut = _mm512_load_ps(kE2m1x2TopByte.data());
  const int64_t b0 = k0 / (kChunksPerBlock * kFp4ChunkK);
  const int64_t blocks = kc / (kChunksPerBlock * kFp4ChunkK);
  const int64_t slice_off = k0 / kFp4ChunkK * kChunkBytes;
  prefetch_ahead(p.codes_a + slice_off, kc / kFp4ChunkK * kChunkBytes);
  prefetch_ahead(p.b_codes(slice_off), kc / kFp4ChunkK * kChunkBytes);
  for (int64_t b = b0; b < b0 + blocks; ++b) {
    const __m512 scale = decode_block_scales<kFormat>(p.scales_a + b * kTileRows, p.b_scales(b));
    FP4MOE_UNROLL_ALL
    for (int c = 0; c < kChunksPerBlock; ++c) {
      const int64_t chunk = b * kChunksPerBlock + c;
      const __m512i t = load_pair(p.codes_a + chunk * kChunkBytes, p.b_codes(chunk * kChunkBytes));
      float* out = panel + (chunk * kFp4ChunkK - k0) * ld;
      FP4MOE_UNROLL_ALL
      for (int kk = 0; kk < kFp4ChunkK; ++kk) {
        _mm512_store_ps(out + kk * ld, _mm512_mul_ps(transposed_code_ps(t, lut, kk), scale));
      }
    }
  }
}

// Rows of an FP8 pair, k in [k0, k0 + kc) (k0 a multiple of 128, kc <= 128: one scale block), into
// panel[k - k0][lane] times the block's scale: e4m3 x scale rounded once to F32 (the one rounding
// of a weight, inside the tests' (K + 4) * 2^-24 bound). Past K the codes are zero padding.
inline void decode_fp8_panel(const Fp8Pair& p, int64_t k0, int64_t kc, float* panel, int64_t ld) {
  const __m512 scale = _mm512_set1_ps(p.scales[k0 / kFp8ScaleBlock] * 256.0f);
  const int64_t c0 = k0 / kFp8ChunkK, c1 = (k0 + kc + kFp8ChunkK - 1) / kFp8ChunkK;
  prefetch_ahead(p.codes_a + c0 * kChunkBytes, (c1 - c0) * kChunkBytes);
  prefetch_ahead(p.codes_b == nullptr ? nullptr : p.codes_b + c0 * kChunkBytes,
                 (c1 - c0) * kChunkBytes);
  for (int64_t c = c0; c < c1; ++c) {
    __m512 wk[kFp8ChunkK];
    fp8_chunk_rows(p.codes_a + c * kChunkBytes,
                   p.codes_b == nullptr ? nullptr : p.codes_b + c * kChunkBytes, wk);
    float* out = panel + (c * kFp8ChunkK - k0) * ld;
    FP4MOE_UNROLL_ALL
    for (int j = 0; j < kFp8ChunkK; ++j) _mm512_store_ps(out + j * ld, _mm512_mul_ps(wk[j], scale));
  }
}

// acc[i][r] += sum over k < kc of panel[k][r] * x[i][k], for MR tokens and R zmm of rows.
template <int R, int MR>
inline void panel_fma(const float* panel, int64_t kc, const float* x, int64_t ldx, float* acc) {
  __m512 a[MR][R];
  FP4MOE_UNROLL_ALL
  for (int i = 0; i < MR; ++i) {
    FP4MOE_UNROLL_ALL
    for (int r = 0; r < R; ++r) a[i][r] = _mm512_load_ps(acc + (i * R + r) * 16);
  }
  for (int64_t k = 0; k < kc; ++k) {
    __m512 wv[R];
    FP4MOE_UNROLL_ALL
    for (int r = 0; r < R; ++r) wv[r] = _mm512_load_ps(panel + (k * R + r) * 16);
    FP4MOE_UNROLL_ALL
    for (int i = 0; i < MR; ++i) {
      const __m512 xb = _mm512_set1_ps(x[i * ldx + k]);
      FP4MOE_UNROLL_ALL
      for (int r = 0; r < R; ++r) a[i][r] = _mm512_fmadd_ps(wv[r], xb, a[i][r]);
    }
  }
  FP4MOE_UNROLL_ALL
  for (int i = 0; i < MR; ++i) {
    FP4MOE_UNROLL_ALL
    for (int r = 0; r < R; ++r) _mm512_store_ps(acc + (i * R + r) * 16, a[i][r]);
  }
}

// R tile pairs (R * 16 rows, the last pair possibly lone or partial) for m <= kPanelTokens tokens.
// Pair is Fp4TilePair (NVFP4, MXFP4) or Fp8Pair (FP8 block-128).
template <WeightFormat kFormat, class Pair, int R>
void pairs_panel(const PackedMatrix& w, const Pair (&pairs)[R], const float* x, int64_t ldx,
                 int64_t m, float* y, int64_t ldy) {
  constexpr int kMaxMr = kPanelAccumulators / R;
  constexpr int64_t ld = R * 16;
  alignas(64) float panel[kPanelK * ld];
  alignas(64) float acc[kPanelTokens * ld];
  // Token blocks of at most kMaxMr, as even as possible (13 tokens: 7 + 6, not 12 + 1).
  const int64_t blocks = (m + kMaxMr - 1) / kMaxMr;
  std::memset(acc, 0, sizeof(float) * m * ld);
  for (int64_t k0 = 0; k0 < w.k; k0 += kPanelK) {
    const int64_t kc = std::min(kPanelK, w.k - k0);
    FP4MOE_UNROLL_ALL
    for (int r = 0; r < R; ++r) {
      if constexpr (kFormat == WeightFormat::kFp8Block128) {
        decode_fp8_panel(pairs[r], k0, kc, panel + r * 16, ld);
      } else {
        decode_pair_panel<kFormat>(pairs[r], k0, kc, panel + r * 16, ld);
      }
    }
    int64_t i = 0;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int mr = static_cast<int>(m / blocks + (blk < m % blocks ? 1 : 0));
      with_mr<kMaxMr>(mr, [&](auto kmr) {
        panel_fma<R, decltype(kmr)::value>(panel, kc, x + i * ldx + k0, ldx, acc + i * ld);
      });
      i += mr;
    }
  }
  // FP8's scales were applied in the panel; FP4's tensor scale and decode factor are applied here.
  const __m512 out_scale = _mm512_set1_ps(
      kFormat == WeightFormat::kFp8Block128 ? 1.0f : w.tensor_scale * kFp4DecodeFactor);
  for (int64_t i = 0; i < m; ++i) {
    FP4MOE_UNROLL_ALL
    for (int r = 0; r < R; ++r) {
      _mm512_mask_storeu_ps(y + i * ldy + pairs[r].first_row, row_mask(pairs[r].rows),
                            _mm512_mul_ps(_mm512_load_ps(acc + i * ld + r * 16), out_scale));
    }
  }
}

// Fewer tokens: groups of up to 4 tokens against each tile pair. Kept out of the driver so that it
// compiles to the same instructions as before the panel path existed (inlined beside it, GCC
// laid it out differently and `fp4moe bench` at M = 4, one thread, measured 2-5% slower).
template <WeightFormat kFormat>
[[gnu::noinline]] void fp4_gemm_grouped(const PackedMatrix& w, const float* x, int64_t ldx,
                                        int64_t m, float* y, int64_t ldy, int64_t tile_begin,
                                        int64_t tile_end) {
  for (int64_t t = tile_begin; t < tile_end; t += 2) {
    const Fp4TilePair p = avx512::fp4_tile_pair(w, t, tile_end);
    float* yt = y + p.first_row;
    for_token_groups<4>(m, [&](auto mr, int64_t i) {
      fp4_pair<kFormat, decltype(mr)::value>(w, p, x + i * ldx, ldx, yt + i * ldy, ldy);
    });
  }
}

// The panel path over a tile range: token chunks outermost, so that a chunk's activations stay in
// L2 while the tile range's weights stream past them: at most kPanelTokens tokens and about
// kPanelXBytes of X per chunk, the chunks as even as possible.
template <WeightFormat kFormat>
void panel_gemm(const PackedMatrix& w, const float* x, int64_t ldx, int64_t m, float* y,
                int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  const int64_t cap = std::clamp<int64_t>(kPanelXBytes / (w.k * int64_t{sizeof(float)}),
                                          kPanelAccumulators / kPanelPairs, kPanelTokens);
  const int64_t chunks = (m + cap - 1) / cap;
  for (int64_t c = 0, m0 = 0; c < chunks; ++c) {
    const int64_t mb = m / chunks + (c < m % chunks ? 1 : 0);
    const float* xc = x + m0 * ldx;
    float* yc = y + m0 * ldy;
    int64_t t = tile_begin;
    if constexpr (kFormat == WeightFormat::kFp8Block128) {
      // Pairs only from an even tile (one 128-row scale block): an odd start runs alone.
      if (t % 2 == 1 && t < tile_end) {
        const Fp8Pair pairs[1] = {fp8_pair_at(w, t, false)};
        pairs_panel<kFormat, Fp8Pair, 1>(w, pairs, xc, ldx, mb, yc, ldy);
        ++t;
      }
      for (; t + 2 * kPanelPairs <= tile_end; t += 2 * kPanelPairs) {
        Fp8Pair pairs[kPanelPairs];
        for (int r = 0; r < kPanelPairs; ++r) pairs[r] = fp8_pair_at(w, t + 2 * r, true);
        pairs_panel<kFormat, Fp8Pair, kPanelPairs>(w, pairs, xc, ldx, mb, yc, ldy);
      }
      for (; t < tile_end; t += 2) {
        const Fp8Pair pairs[1] = {fp8_pair_at(w, t, t + 1 < tile_end)};
        pairs_panel<kFormat, Fp8Pair, 1>(w, pairs, xc, ldx, mb, yc, ldy);
      }
    } else {
      for (; t + 2 * kPanelPairs <= tile_end; t += 2 * kPanelPairs) {
        Fp4TilePair pairs[kPanelPairs];
        for (int r = 0; r < kPanelPairs; ++r) {
          pairs[r] = avx512::fp4_tile_pair(w, t + 2 * r, tile_end);
        }
        pairs_panel<kFormat, Fp4TilePair, kPanelPairs>(w, pairs, xc, ldx, mb, yc, ldy);
      }
      // The last 1-3 tiles: one pair at a time (the last one possibly lone).
      for (; t < tile_end; t += 2) {
        const Fp4TilePair pairs[1] = {avx512::fp4_tile_pair(w, t, tile_end)};
        pairs_panel<kFormat, Fp4TilePair, 1>(w, pairs, xc, ldx, mb, yc, ldy);
      }
    }
    m0 += mb;
  }
}

template <WeightFormat kFormat>
void fp4_gemm_avx512(const PackedMatrix& w, const float* x, int64_t ldx, int64_t m, float* y,
                     int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  if (m < kPanelMinTokens) {
    fp4_gemm_grouped<kFormat>(w, x, ldx, m, y, ldy, tile_begin, tile_end);
    return;
  }
  panel_gemm<kFormat>(w, x, ldx, m, y, ldy, tile_begin, tile_end);
}

// FP8 at 1-4 tokens with VBMI: the FP16 route's vcvtph2ps (1.7 cycles per zmm on the 2-core
// Zen 4) bounds its loop there (a register-only copy of it: 12.5 cycles per chunk of 16 rows x
// 4 k, 7.3 with the conversions left out). Instead the F32 bits are put together from bytes:
// (code & 0x7F) << 20, with the sign at bit 31, is the E4M3 value times 2^-120 exactly (F32's
// exponent bias is 120 more than E4M3's, and F32 subnormals hold E4M3's, as in
// decode_block_scales' UE4M3). Per chunk two byte tables are made (byte 2 of each dword:
// code << 4; byte 3: sign | code bits 4-6) and one zero-masked vpermt2b per k gathers the 16 rows'
// dwords: 9.6 cycles per chunk in the same register-only copy; the kernel, one thread, one token,
// 4096 -> 128 in L2, interleaved: 18.0 -> 20.9-21.3 GB/s. The tokens are multiplied by 2^112 once
// per call (fp8_prescale), so each product (w * 2^-120) * (x * 2^112) is the FP16 route's
// (w * 2^-8) * x, the same real number, rounded the same: the bits do not change
// (Fp8KernelTest.VbmiRouteKeepsTheBits), with DAZ off, as the library leaves it: E4M3's
// subnormal codes are F32 subnormals here, which DAZ would read as zero.
constexpr std::array<uint8_t, 64> fp8_gather_table(int j) {
  std::array<uint8_t, 64> t{};
  for (int o = 0; o < 64; ++o) {
    const int r = o / 4, byte = o % 4;  // dword r = row r (a: 0-7, b: 8-15); its byte
    const int src = (r < kTileRows ? 0 : kChunkBytes) + j * kTileRows + r % kTileRows;
    t[o] = static_cast<uint8_t>(byte == 3 ? 64 + src : src);  // bit 6 picks the second table
  }
  return t;
}
alignas(64) constexpr std::array<std::array<uint8_t, 64>, kFp8ChunkK> kFp8Gather = {
    fp8_gather_table(0), fp8_gather_table(1), fp8_gather_table(2), fp8_gather_table(3)};
constexpr __mmask64 kFp8HighBytes = 0xCCCCCCCCCCCCCCCCull;  // bytes 2 and 3 of each dword

// The 16 rows of an FP8 tile pair at the 4 k of one chunk, as F32 times 2^-120.
inline void fp8_chunk_rows_vbmi(const uint8_t* a, const uint8_t* b, __m512 (&wk)[kFp8ChunkK]) {
  const __m512i v = load_pair(a, b);
  // Byte 2: the code's low nibble (mantissa and the exponent's low bit) in its high nibble.
  const __m512i lo = _mm512_and_si512(_mm512_slli_epi16(v, 4), _mm512_set1_epi8(-16));
  // Byte 3: the sign in bit 7 and the exponent's high 3 bits in bits 0-2 (0xD8: C ? B : A).
  const __m512i hi =
      _mm512_ternarylogic_epi32(_mm512_srli_epi16(_mm512_and_si512(v, _mm512_set1_epi8(0x70)), 4),
                                v, _mm512_set1_epi8(static_cast<char>(0x80)), 0xD8);
  FP4MOE_UNROLL_ALL
  for (int j = 0; j < kFp8ChunkK; ++j) {
    wk[j] = _mm512_castsi512_ps(avx512::vpermt2b_maskz(
        kFp8HighBytes, lo, _mm512_load_si512(kFp8Gather[static_cast<size_t>(j)].data()), hi));
  }
}

template <int MR, bool kTail, bool kVbmi>
inline void fp8_chunk(const uint8_t* a, const uint8_t* b, const float* xk, int64_t ldx, int valid_k,
                      __m512 (&block)[MR][4]) {
  __m512 wk[kFp8ChunkK];
  if constexpr (kVbmi) {
    fp8_chunk_rows_vbmi(a, b, wk);
  } else {
    fp8_chunk_rows(a, b, wk);
  }
  for (int j = 0; j < kFp8ChunkK; ++j) {
    if (kTail && j >= valid_k) break;
    for (int i = 0; i < MR; ++i) {
      block[i][j] = _mm512_fmadd_ps(wk[j], _mm512_set1_ps(xk[i * ldx + j]), block[i][j]);
    }
  }
}

template <int MR, bool kVbmi>
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
      fp8_chunk<MR, false, kVbmi>(tile_a + off, tile_b == nullptr ? nullptr : tile_b + off,
                                  x + c * kFp8ChunkK, ldx, kFp8ChunkK, block);
    }
    if (b == k_blocks - 1 && tail_k != 0) {
      const int64_t off = full_chunks * kChunkBytes;
      fp8_chunk<MR, true, kVbmi>(tile_a + off, tile_b == nullptr ? nullptr : tile_b + off,
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

// 1-4 tokens: the tokens times 2^112 (exact where every |x| < 2^16; fp8_chunk_rows_vbmi) into
// `scaled` [m, k]. Returns false where some |x| is larger, Inf or NaN.
inline bool fp8_prescale(const float* x, int64_t ldx, int64_t m, int64_t k,
                         std::vector<float>& scaled) {
  scaled.resize(static_cast<size_t>(m * k));
  const __m512 bound = _mm512_set1_ps(0x1p16f), factor = _mm512_set1_ps(0x1p112f);
  __mmask16 in_range = 0xFFFF;  // ordered compares: NaN is out of range
  bool tail_in_range = true;
  for (int64_t i = 0; i < m; ++i) {
    const float* xi = x + i * ldx;
    float* out = scaled.data() + i * k;
    int64_t kk = 0;
    for (; kk + 16 <= k; kk += 16) {
      const __m512 v = _mm512_loadu_ps(xi + kk);
      in_range &= _mm512_cmp_ps_mask(_mm512_abs_ps(v), bound, _CMP_LT_OQ);
      _mm512_storeu_ps(out + kk, _mm512_mul_ps(v, factor));
    }
    for (; kk < k; ++kk) {
      tail_in_range &= std::fabs(xi[kk]) < 0x1p16f;
      out[kk] = xi[kk] * 0x1p112f;
    }
  }
  return in_range == 0xFFFF && tail_in_range;
}

template <bool kVbmi>
void fp8_small_m(const PackedMatrix& w, const float* x, int64_t ldx, int64_t m, float* y,
                 int64_t ldy, int64_t tile_begin, int64_t tile_end) {
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
      fp8_pair<decltype(mr)::value, kVbmi>(w, tile_a, tile_b, scales, x + i * ldx, ldx,
                                           yt + i * ldy, ldy, rows);
    });
    t += pair ? 2 : 1;
  }
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
  if (m >= kPanelMinTokens) {
    panel_gemm<WeightFormat::kFp8Block128>(w, x, ldx, m, y, ldy, tile_begin, tile_end);
    return;
  }
  if (avx512::host_has_vbmi()) {
    thread_local std::vector<float> scaled;
    if (fp8_prescale(x, ldx, m, w.k, scaled)) {
      fp8_small_m<true>(w, scaled.data(), w.k, m, y, ldy, tile_begin, tile_end);
      return;
    }
  }
  fp8_small_m<false>(w, x, ldx, m, y, ldy, tile_begin, tile_end);
}

}  // namespace fp4moe::kernels
