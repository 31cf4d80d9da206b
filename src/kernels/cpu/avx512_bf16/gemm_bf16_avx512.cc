// AVX512-BF16 kernels of the BF16-activation family (kernels/types.h): FP4 weights decoded to BF16
// and multiplied by BF16 activations with vdpbf16ps, two 8-row tiles per zmm (16 rows) as the
// AVX-512 F32 kernels run them. Compiled with the AVX-512 VNNI flags plus -mavx512bf16; dispatch/
// calls them only where cpuid says AVX512_BF16 (and the OS saves zmm state).
//
// Why a family of its own: vdpbf16ps does 32 multiply-adds per instruction where an F32 FMA does
// 16, and a code becomes a 16-bit BF16 weight by one vpermw per 32 weights where the F32 kernels
// need one vpermps per 16; but it rounds nothing only when the activations already are BF16, so
// F32 callers keep the F32 kernels (types.h states the order of its sums).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/avx2/fp4_avx2.h"
#include "kernels/cpu/avx512/fp4_avx512.h"
#include "kernels/cpu/avx512/vbmi.h"
#include "kernels/cpu/bf16_pair_dot.h"
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/cpu/mca.h"
#include "kernels/cpu/pipeline.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/token_groups.h"

namespace fp4moe::kernels {
namespace {

using avx512::decode_block_scales;
using avx512::Fp4TilePair;
using avx512::load_pair;
using avx512::row_mask;

// vpermw reads the low 5 bits of each index word; a code sits in bits 0-3 with a neighbour's bit
// in bit 4, so the 16 BF16 values of E2M1 are repeated to fill the 32 entries.
constexpr std::array<uint16_t, 32> e2m1_bf16_table() {
  std::array<uint16_t, 32> t{};
  for (int i = 0; i < 32; ++i) t[i] = e2m1_bf16_bits(i % 16);
  return t;
}
alignas(64) constexpr std::array<uint16_t, 32> kE2m1Bf16 = e2m1_bf16_table();

// In-lane byte shuffles of a chunk pair (types.h: byte 4r + j of a 16-byte lane holds lane row r,
// k j in its low nibble and k j + 4 in its high one). Dword r of the result holds row r's bytes of
// k j0 and j0 + 1 in the low bytes of its two words, zero above: vpermw then makes the BF16 pair
// (k j0, k j0 + 1), and after a 4-bit word shift the pair (k j0 + 4, k j0 + 5). The pairs are
// consecutive k, so each meets its activation pair as one dword broadcast from memory.
inline __m512i pair_bytes_ctrl(int j0) {
  alignas(16) int8_t c[16];
  for (int r = 0; r < 4; ++r) {
    c[4 * r + 0] = static_cast<int8_t>(fp4_chunk_byte(r, j0));
    c[4 * r + 1] = static_cast<int8_t>(0x80);
    c[4 * r + 2] = static_cast<int8_t>(fp4_chunk_byte(r, j0 + 1));
    c[4 * r + 3] = static_cast<int8_t>(0x80);
  }
  return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(c)));
}

// The activation pair (x[k], x[k + 1]) as one dword, in every lane.
[[gnu::always_inline]] inline __m512bh pair_broadcast(const uint16_t* xk) {
  int32_t v;
  std::memcpy(&v, xk, sizeof(v));
  return (__m512bh)_mm512_set1_epi32(v);
}

template <WeightFormat kFormat, int MR>
inline void bf16_pair(const PackedMatrix& w, const Fp4TilePair& p, const uint16_t* x, int64_t ldx,
                      float* y, int64_t ldy) {
  constexpr int kChains = 4;  // chain q: k pair (2q, 2q + 1) of each chunk (types.h)
  constexpr int kChunksPerBlock = (kFormat == WeightFormat::kNvfp4 ? 16 : 32) / kFp4ChunkK;
  const int64_t k_blocks = w.chunks / kChunksPerBlock;
  const __m512i lut = _mm512_load_si512(kE2m1Bf16.data());
  const __m512i ctrl01 = pair_bytes_ctrl(0);
  const __m512i ctrl23 = pair_bytes_ctrl(2);
  __m512 total[MR];
  for (int i = 0; i < MR; ++i) total[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < k_blocks; ++b) {
    FP4MOE_MCA_BLOCK_BEGIN("bf16", "avx512_bf16");
    __m512 chain[MR][kChains];
    for (int i = 0; i < MR; ++i) {
      for (int c = 0; c < kChains; ++c) chain[i][c] = _mm512_setzero_ps();
    }
    const int64_t block_off = b * kChunksPerBlock * kChunkBytes;
    prefetch_ahead(p.codes_a + block_off, kChunksPerBlock * kChunkBytes);
    prefetch_ahead(p.b_codes(block_off), kChunksPerBlock * kChunkBytes);
    for (int c = 0; c < kChunksPerBlock; ++c) {
      const int64_t chunk = b * kChunksPerBlock + c;
      const __m512i raw =
          load_pair(p.codes_a + chunk * kChunkBytes, p.b_codes(chunk * kChunkBytes));
      const __m512i t01 = _mm512_shuffle_epi8(raw, ctrl01);
      const __m512i t23 = _mm512_shuffle_epi8(raw, ctrl23);
      const __m512bh wk[kChains] = {
          (__m512bh)_mm512_permutexvar_epi16(t01, lut),
          (__m512bh)_mm512_permutexvar_epi16(t23, lut),
          (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(t01, 4), lut),
          (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(t23, 4), lut),
      };
      const uint16_t* xk = x + chunk * kFp4ChunkK;
      for (int i = 0; i < MR; ++i) {
        for (int q = 0; q < kChains; ++q) {
          chain[i][q] = _mm512_dpbf16_ps(chain[i][q], wk[q], pair_broadcast(xk + i * ldx + 2 * q));
        }
      }
    }
    const __m512 scale = decode_block_scales<kFormat>(p.scales_a + b * kTileRows, p.b_scales(b));
    for (int i = 0; i < MR; ++i) {
      const __m512 sum = _mm512_add_ps(_mm512_add_ps(chain[i][0], chain[i][1]),
                                       _mm512_add_ps(chain[i][2], chain[i][3]));
      total[i] = _mm512_fmadd_ps(sum, scale, total[i]);
    }
    FP4MOE_MCA_BLOCK_END();
  }
  const __m512 out_scale = _mm512_set1_ps(w.tensor_scale);
  for (int i = 0; i < MR; ++i) {
    _mm512_mask_storeu_ps(y + i * ldy, row_mask(p.rows), _mm512_mul_ps(total[i], out_scale));
  }
}

// ---- One token, one tile at a time (VBMI) ----------------------------------------------------
// As the W4A8 VNNI kernel's one-token path (cpu/avx512_vnni/w4a8_avx512_vnni.cc): a thread reads
// one tile's code stream and its scale stream, not a pair's four. Per chunk (8 rows x 8 k) one
// vpermb builds 32 index words, word p of dword 2r + q holding row r's byte of k 2q + p: vpermw
// makes the BF16 pairs (k 2q, 2q + 1) of chains 0 and 1 (dword 2r + q = row r, chain q) from the
// low nibbles, and after a 4-bit word shift those of chains 2 and 3 (k 4 + 2q + p, the same bytes'
// high nibbles). Their activation pairs alternate across the dwords: one qword broadcast of
// x[8c .. 8c + 3], and one of x[8c + 4 .. 8c + 7]. Each lane is one row's chain q, added chunk by
// chunk in vdpbf16ps's order; per block, adjacent lanes swapped and added give c0 + c1 and
// c2 + c3 in both lanes of a row, their sum (c0 + c1) + (c2 + c3), and, on the rows' 8 lanes,
// the fma with the block scale: the family's order (types.h), so the bits are the scalar
// kernel's.
// Measured on the 2-core Zen 4, one token, 4096 -> 14336 from DRAM, interleaved with the pair
// kernel (FP4MOE_NO_VBMI): 2 threads in the ~36 GB/s mode, 0.92-0.95 of the bandwidth against
// 0.87-0.89 (NVFP4 968-986 against 1037-1069 us); one thread MXFP4 19.7-20.0 against
// 18.4-18.7 GB/s, NVFP4 17.7-18.2 against 18.0-18.4. More work per byte (in L2, one thread: MXFP4
// 21.6 against 23.6 GB/s, NVFP4 18.9 against 22.9), so one token only. Code-stream prefetch 4 KiB
// ahead measured alike (within noise), and is left out as in the W4A8 one-tile path. (Those
// figures predate the software pipelining in bf16_tile, which took one thread, one token,
// 4096 -> 256 in L2 from NVFP4 ~18 to ~20 GB/s and MXFP4 ~20 to ~22.5, interleaved runs.)
// The scale stream is prefetched (prefetch_tile_scales, cpu/prefetch.h): one thread, one token,
// 4096 -> 14336 from DRAM, interleaved: NVFP4 19.9 -> 20.9-21.1 GB/s, MXFP4 21.8-22.5 ->
// 22.6-22.9 (this loop, not the stream, bounds it at one thread).
// Its body alone, in registers (bench_peaks' bf16_tile mix, bench/peers/peaks_decode_avx512.cc),
// reads 29.2 GB/s per core on that Zen 4, where this kernel reads ~21.5 (NVFP4) in L2: the block
// end and the loads take the rest. Tried on it and not kept (one thread, one token, 4096 -> 256 in
// L2, NVFP4, interleaved with this code's 21.5-21.6 GB/s): one vpermb building words of both
// chunks and three word shifts (8, 12 bits for chunk c + 1) in place of two vpermb and two shifts,
// 20.7-21.0; the block end's lane fold by two vpermt2ps (chains 0/2 and 1/3 side by side) and a
// half add in place of two vpermilps, two adds and the vpmovqd, 19.8-20.3; block ends two at a
// time (block b's chains held, both blocks' folds by four vpermt2ps, one zmm scale decode),
// alike (20.6-21.0 against 20.4-21.5).
// The vpermb controls for the low (chunk_half 0) and high 32 bytes of a 64-byte load, computed at
// compile time (they are loaded once per tile).
constexpr std::array<uint8_t, 64> tile_word_table(int chunk_half) {
  std::array<uint8_t, 64> c{};
  for (int w = 0; w < 32; ++w) {
    const int d = w / 2, p = w % 2, r = d / 2, q = d % 2;
    const auto byte = static_cast<uint8_t>(32 * chunk_half + fp4_chunk_byte(r, 2 * q + p));
    c[2 * w] = byte;
    c[2 * w + 1] = byte;  // any byte: vpermw reads bits 0-4, and bit 4 is a don't-care (table)
  }
  return c;
}
alignas(64) constexpr std::array<uint8_t, 64> kTileWordLo = tile_word_table(0);
alignas(64) constexpr std::array<uint8_t, 64> kTileWordHi = tile_word_table(1);

[[gnu::always_inline]] inline __m512bh qword_broadcast(const uint16_t* xk) {
  int64_t v;
  std::memcpy(&v, xk, sizeof(v));
  return (__m512bh)_mm512_set1_epi64(v);
}

template <WeightFormat kFormat>
inline void bf16_tile(const PackedMatrix& w, int64_t t, const uint16_t* x, float* y) {
  constexpr int MR = 1;  // one token (read by the mca.h markers)
  constexpr int kChunksPerBlock = (kFormat == WeightFormat::kNvfp4 ? 16 : 32) / kFp4ChunkK;
  const int64_t k_blocks = w.chunks / kChunksPerBlock;
  const avx2::Fp4Tile tile = avx2::fp4_tile_at(w, t);
  const __m512i lut = _mm512_load_si512(kE2m1Bf16.data());
  const __m512i ctrl[2] = {_mm512_load_si512(kTileWordLo.data()),
                           _mm512_load_si512(kTileWordHi.data())};
  __m256 total = _mm256_setzero_ps();
  struct Chains {
    __m512 c01, c23;
  };
  constexpr int kChunkPairs = kChunksPerBlock / 2;
  // Block b's weights as BF16 pairs: [chunk pair][half] for chains 0-1 and 2-3.
  struct Weights {
    __m512i w01[kChunkPairs][2], w23[kChunkPairs][2];
  };
  const auto decode = [&](int64_t b) {
    prefetch_tile_scales(tile.scales, b);
    Weights wt;
    for (int cp = 0; cp < kChunkPairs; ++cp) {
      const int64_t chunk = b * kChunksPerBlock + 2 * cp;
      const __m512i raw = _mm512_loadu_si512(tile.codes + chunk * kChunkBytes);
      for (int h = 0; h < 2; ++h) {
        const __m512i idx = avx512::vpermb(ctrl[h], raw);
        wt.w01[cp][h] = _mm512_permutexvar_epi16(idx, lut);
        wt.w23[cp][h] = _mm512_permutexvar_epi16(_mm512_srli_epi16(idx, 4), lut);
      }
    }
    return wt;
  };
  // Block b's chains: each row's (c0, c1) and (c2, c3) in its two lanes.
  const auto dot = [&](int64_t b, const Weights& wt) {
    Chains c{_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int cp = 0; cp < kChunkPairs; ++cp) {
      for (int h = 0; h < 2; ++h) {
        const uint16_t* xk = x + (b * kChunksPerBlock + 2 * cp + h) * kFp4ChunkK;
        c.c01 = _mm512_dpbf16_ps(c.c01, (__m512bh)wt.w01[cp][h], qword_broadcast(xk));
        c.c23 = _mm512_dpbf16_ps(c.c23, (__m512bh)wt.w23[cp][h], qword_broadcast(xk + 4));
      }
    }
    return c;
  };
  const auto finish = [&](int64_t b, const Chains& c) {
    const __m512 sum = _mm512_add_ps(_mm512_add_ps(c.c01, _mm512_permute_ps(c.c01, 0xB1)),
                                     _mm512_add_ps(c.c23, _mm512_permute_ps(c.c23, 0xB1)));
    // Each row's sum is in its even lane (both lanes hold it): those 8 lanes, then the fma.
    const __m256 rows = _mm256_castsi256_ps(_mm512_cvtepi64_epi32(_mm512_castps_si512(sum)));
    total = _mm256_fmadd_ps(rows, avx2::decode_block_scales<kFormat>(tile.scales + b * kTileRows),
                            total);
  };
  // Software-pipelined as the W4A8 one-tile path. NVFP4 (one chunk pair per block) in three
  // stages: block b + 2 decoded, b + 1 dotted, b finished. MXFP4's decoded block is twice the
  // registers, and three stages spilled (one thread, 4096 -> 256 in L2: 23.1 -> 14.2 GB/s), so
  // two: block b + 1 decoded and dotted while b is finished.
  pipelined_k_blocks<kChunkPairs == 1 ? 3 : 2>(
      k_blocks, decode, dot, finish, [] { FP4MOE_MCA_BLOCK_BEGIN("bf16_tile", "avx512_bf16"); },
      [] { FP4MOE_MCA_BLOCK_END(); });
  avx2::store_rows(y + t * kTileRows, _mm256_mul_ps(total, _mm256_set1_ps(w.tensor_scale)),
                   tile.rows);
}

template <WeightFormat kFormat>
void fp4_gemm_bf16_avx512(const PackedMatrix& w, const uint16_t* x, int64_t ldx, int64_t m,
                          float* y, int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  // The pipelined tile loop starts at block 0: K holds at least one block (pack/ checks it).
  FP4MOE_CHECK(m != 1 || w.k >= weight_format_k_block(kFormat));
  if (m == 1 && avx512::host_has_vbmi()) {
    for (int64_t t = tile_begin; t < tile_end; ++t) bf16_tile<kFormat>(w, t, x, y);
    return;
  }
  for (int64_t t = tile_begin; t < tile_end; t += 2) {
    const Fp4TilePair p = avx512::fp4_tile_pair(w, t, tile_end);
    float* yt = y + p.first_row;
    for_token_groups<4>(m, [&](auto mr, int64_t i) {
      bf16_pair<kFormat, decltype(mr)::value>(w, p, x + i * ldx, ldx, yt + i * ldy, ldy);
    });
  }
}

// ---- FP8 block-128 (types.h: chain 2 * (c % 2) + p takes chunk c's k pair p) -------------------
// With VBMI: E4M3 to BF16 by two 128-entry byte tables, the low and the high byte of each
// magnitude's BF16 bits (vpermt2b reads 7 index bits, so the code's sign is ignored; it is OR-ed
// into the high byte), then one vpermt2b per k pair gathers each row's two BF16 words into its
// dword: dword R (rows 0-7 tile a, 8-15 tile b) = (w[R][k], w[R][k + 1]). Five vpermt2b, one
// ternlog and two vdpbf16ps per 64 bytes, where the F32 kernel's VBMI route needs four vpermt2b,
// five shift and mask operations and four FMAs (a register-only copy of each on the 2-core Zen 4:
// 5.5-6.1 against 8.2-9.1 cycles per 64 bytes). Without VBMI: the F32 kernels' FP16 route, times
// 2^8 (exact), whose high words are the BF16 values (4 significant bits: the low words are zero).
constexpr std::array<uint8_t, 128> e4m3_bf16_byte_table(int byte) {
  std::array<uint8_t, 128> t{};
  for (int code = 0; code < 128; ++code) {
    t[static_cast<size_t>(code)] = static_cast<uint8_t>(e4m3_bf16_bits(code) >> (8 * byte));
  }
  return t;
}
alignas(64) constexpr std::array<uint8_t, 128> kE4m3Bf16Lo = e4m3_bf16_byte_table(0);
alignas(64) constexpr std::array<uint8_t, 128> kE4m3Bf16Hi = e4m3_bf16_byte_table(1);

// vpermt2b control over (lo, hi) for k pair p of a chunk pair: byte 4R + 2i + h is byte h of the
// BF16 of row R at k 2p + i, whose code sits at byte 8 (2p + i) + R % 8 of tile a or b's chunk.
constexpr std::array<uint8_t, 64> fp8_pair_gather_table(int p) {
  std::array<uint8_t, 64> c{};
  for (int o = 0; o < 64; ++o) {
    const int row = o / 4, i = (o / 2) % 2, h = o % 2;
    const int src = (row < kTileRows ? 0 : kChunkBytes) + kTileRows * (2 * p + i) + row % kTileRows;
    c[static_cast<size_t>(o)] = static_cast<uint8_t>(src + 64 * h);
  }
  return c;
}
alignas(64) constexpr std::array<uint8_t, 64> kFp8Gather01 = fp8_pair_gather_table(0);
alignas(64) constexpr std::array<uint8_t, 64> kFp8Gather23 = fp8_pair_gather_table(1);

constexpr int64_t kFp8ChunksPerBlock = kFp8ScaleBlock / kFp8ChunkK;

// 64 code bytes as BF16 pairs: w[0] = k (0, 1), w[1] = k (2, 3) of each dword's row, the rows as
// the gather tables place them (kFp8Gather*: a chunk pair's 16 rows; kFp8TileGather*: one tile's
// chunks c and c + 1, further down).
template <bool kVbmi>
struct Fp8Bf16Decoder {
  __m512i t0, t1, t2, t3, g01, g23;
  explicit Fp8Bf16Decoder(const uint8_t* gather01 = kFp8Gather01.data(),
                          const uint8_t* gather23 = kFp8Gather23.data()) {
    if constexpr (kVbmi) {
      t0 = _mm512_load_si512(kE4m3Bf16Lo.data());
      t1 = _mm512_load_si512(kE4m3Bf16Lo.data() + 64);
      t2 = _mm512_load_si512(kE4m3Bf16Hi.data());
      t3 = _mm512_load_si512(kE4m3Bf16Hi.data() + 64);
      g01 = _mm512_load_si512(gather01);
      g23 = _mm512_load_si512(gather23);
    }
  }
  // VBMI: the codes already in a register.
  [[gnu::always_inline]] void decode_bytes(__m512i v, __m512bh (&w)[2]) const {
    const __m512i lo = avx512::vpermt2b(t0, v, t1);
    const __m512i hi = _mm512_ternarylogic_epi32(avx512::vpermt2b(t2, v, t3), v,
                                                 _mm512_set1_epi8(static_cast<char>(0x80)), 0xD8);
    w[0] = (__m512bh)avx512::vpermt2b(lo, g01, hi);
    w[1] = (__m512bh)avx512::vpermt2b(lo, g23, hi);
  }
  // A chunk pair: 32 bytes of tile a, 32 of tile b (or zeros).
  [[gnu::always_inline]] void decode(const uint8_t* a, const uint8_t* b, __m512bh (&w)[2]) const {
    if constexpr (kVbmi) {
      decode_bytes(load_pair(a, b), w);
    } else {
      __m512 f[kFp8ChunkK];
      avx512::fp8_chunk_rows(a, b, f);  // the values times 2^-8
      const __m512 undo = _mm512_set1_ps(256.0f);
      __m512i bits[kFp8ChunkK];
      for (int j = 0; j < kFp8ChunkK; ++j) bits[j] = _mm512_castps_si512(_mm512_mul_ps(f[j], undo));
      // Each value's BF16 is its F32 high word (its low word is zero): row R's dword takes k's in
      // its low word and k + 1's in its high word.
      constexpr __mmask32 kOddWords = 0xAAAAAAAAu;
      w[0] = (__m512bh)_mm512_mask_blend_epi16(kOddWords, _mm512_srli_epi32(bits[0], 16), bits[1]);
      w[1] = (__m512bh)_mm512_mask_blend_epi16(kOddWords, _mm512_srli_epi32(bits[2], 16), bits[3]);
    }
  }
};

// MR tokens against an FP8 tile pair (or a lone tile) over all of K.
template <int MR, bool kVbmi>
inline void fp8_bf16_pair(const PackedMatrix& w, const avx512::Fp8Pair& p, const uint16_t* x,
                          int64_t ldx, float* y, int64_t ldy) {
  constexpr int64_t kChunksPerBlock = kFp8ChunksPerBlock;
  const Fp8Bf16Decoder<kVbmi> dec;
  const int64_t k_blocks = (w.k + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  // The last chunk's activations, zero past K (a partial chunk never reads past the row).
  alignas(8) uint16_t tail[MR][kFp8ChunkK] = {};
  const int64_t full_chunks = w.k / kFp8ChunkK;
  for (int i = 0; i < MR; ++i) {
    for (int64_t k = full_chunks * kFp8ChunkK; k < w.k; ++k) {
      tail[i][k - full_chunks * kFp8ChunkK] = x[i * ldx + k];
    }
  }
  const auto xpair = [&](int i, int64_t c, int pr) -> __m512bh {
    return pair_broadcast(c < full_chunks ? x + i * ldx + c * kFp8ChunkK + 2 * pr
                                          : &tail[i][2 * pr]);
  };
  __m512 total[MR];
  for (int i = 0; i < MR; ++i) total[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < k_blocks; ++b) {
    __m512 chain[MR][4];
    for (int i = 0; i < MR; ++i) {
      for (int q = 0; q < 4; ++q) chain[i][q] = _mm512_setzero_ps();
    }
    const int64_t c0 = b * kChunksPerBlock, c_end = std::min(w.chunks, c0 + kChunksPerBlock);
    prefetch_ahead(p.codes_a + c0 * kChunkBytes, (c_end - c0) * kChunkBytes);
    prefetch_ahead(p.codes_b == nullptr ? nullptr : p.codes_b + c0 * kChunkBytes,
                   (c_end - c0) * kChunkBytes);
    // Whole chunk pairs (c0 is even), then a last odd chunk or one partial in K.
    const int64_t pairs_end = c0 + (std::min(c_end, full_chunks) - c0) / 2 * 2;
    int64_t c = c0;
    for (; c < pairs_end; c += 2) {
      __m512bh wk[2][2];
      for (int h = 0; h < 2; ++h) {
        const int64_t off = (c + h) * kChunkBytes;
        dec.decode(p.codes_a + off, p.codes_b == nullptr ? nullptr : p.codes_b + off, wk[h]);
      }
      for (int i = 0; i < MR; ++i) {
        const uint16_t* xk = x + i * ldx + c * kFp8ChunkK;
        for (int h = 0; h < 2; ++h) {
          for (int pr = 0; pr < 2; ++pr) {
            chain[i][2 * h + pr] = _mm512_dpbf16_ps(chain[i][2 * h + pr], wk[h][pr],
                                                    pair_broadcast(xk + kFp8ChunkK * h + 2 * pr));
          }
        }
      }
    }
    for (; c < c_end; ++c) {
      __m512bh wk[2];
      const int64_t off = c * kChunkBytes;
      dec.decode(p.codes_a + off, p.codes_b == nullptr ? nullptr : p.codes_b + off, wk);
      const int h = static_cast<int>(c % 2);
      for (int i = 0; i < MR; ++i) {
        for (int pr = 0; pr < 2; ++pr) {
          chain[i][2 * h + pr] = _mm512_dpbf16_ps(chain[i][2 * h + pr], wk[pr], xpair(i, c, pr));
        }
      }
    }
    const __m512 scale = _mm512_set1_ps(p.scales[b]);
    for (int i = 0; i < MR; ++i) {
      const __m512 sum = _mm512_add_ps(_mm512_add_ps(chain[i][0], chain[i][1]),
                                       _mm512_add_ps(chain[i][2], chain[i][3]));
      total[i] = _mm512_fmadd_ps(sum, scale, total[i]);
    }
  }
  for (int i = 0; i < MR; ++i) _mm512_mask_storeu_ps(y + i * ldy, row_mask(p.rows), total[i]);
}

// One token, one tile at a time (VBMI): a zmm holds 64 consecutive bytes of ONE tile, chunks c and
// c + 1, so a thread reads one code stream, as the FP4 one-tile paths do (their comment in
// w4a8_avx512_vnni.cc). The gather puts row r's pair of chunk c + h in dword 2r + h, the token's
// pairs of chunks c and c + 1 meet it as one qword broadcast (its activations reordered once per
// call, each 8 k as 0, 1, 4, 5, 2, 3, 6, 7, zero past K), and per block adjacent lanes are added:
// lane 2r holds chains (0, 1) and lane 2r + 1 chains (2, 3) of row r, so (c0 + c1) + (c2 + c3) is
// the family's sum. A last odd chunk runs on the even lanes only (masked vdpbf16ps).
constexpr std::array<uint8_t, 64> fp8_tile_gather_table(int p) {
  std::array<uint8_t, 64> c{};
  for (int o = 0; o < 64; ++o) {
    const int dword = o / 4, r = dword / 2, half = dword % 2, i = (o / 2) % 2, h = o % 2;
    c[static_cast<size_t>(o)] =
        static_cast<uint8_t>(kChunkBytes * half + kTileRows * (2 * p + i) + r + 64 * h);
  }
  return c;
}
alignas(64) constexpr std::array<uint8_t, 64> kFp8TileGather01 = fp8_tile_gather_table(0);
alignas(64) constexpr std::array<uint8_t, 64> kFp8TileGather23 = fp8_tile_gather_table(1);

// x [k] as 8-k groups (0, 1, 4, 5, 2, 3, 6, 7), zero past K, into `out` (ceil(K / 8) * 8).
inline void reorder_fp8_token(const uint16_t* x, int64_t k, std::vector<uint16_t>& out) {
  const int64_t groups = (k + 7) / 8;
  out.assign(static_cast<size_t>(groups * 8), 0);
  constexpr int kFrom[8] = {0, 1, 4, 5, 2, 3, 6, 7};
  for (int64_t g = 0; g < groups; ++g) {
    for (int j = 0; j < 8; ++j) {
      const int64_t kk = 8 * g + kFrom[j];
      if (kk < k) out[static_cast<size_t>(8 * g + j)] = x[kk];
    }
  }
}

inline void fp8_bf16_tile(const PackedMatrix& w, int64_t t, const uint16_t* xr, float* y) {
  constexpr int64_t kChunksPerBlock = kFp8ChunksPerBlock;
  const int64_t k_blocks = (w.k + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  const uint8_t* codes = w.codes + t * w.chunks * kChunkBytes;
  const float* scales = w.fp8_scales + (t * kTileRows / kFp8ScaleBlock) * k_blocks;
  const Fp8Bf16Decoder<true> dec(kFp8TileGather01.data(), kFp8TileGather23.data());
  __m256 total = _mm256_setzero_ps();
  for (int64_t b = 0; b < k_blocks; ++b) {
    const int64_t c0 = b * kChunksPerBlock, c_end = std::min(w.chunks, c0 + kChunksPerBlock);
    __m512 acc01 = _mm512_setzero_ps(), acc23 = _mm512_setzero_ps();
    int64_t c = c0;
    for (; c + 2 <= c_end; c += 2) {
      __m512bh wk[2];
      dec.decode_bytes(_mm512_loadu_si512(codes + c * kChunkBytes), wk);
      acc01 = _mm512_dpbf16_ps(acc01, wk[0], qword_broadcast(xr + 2 * kFp8ChunkK * (c / 2)));
      acc23 = _mm512_dpbf16_ps(acc23, wk[1], qword_broadcast(xr + 2 * kFp8ChunkK * (c / 2) + 4));
    }
    if (c < c_end) {  // a last odd chunk: its pairs in the even lanes, the odd lanes untouched
      __m512bh wk[2];
      dec.decode_bytes(_mm512_zextsi256_si512(_mm256_loadu_si256(
                           reinterpret_cast<const __m256i*>(codes + c * kChunkBytes))),
                       wk);
      // Merged by a masked move: GCC 12 compiles _mm512_mask_dpbf16_ps with the constant mask
      // 0x5555 as kmovw of 0x55 (the constant cut to 8 bits), leaving lanes 8-15 unwritten.
      constexpr __mmask16 kEven = 0x5555;
      const __m512bh x01 = qword_broadcast(xr + 2 * kFp8ChunkK * (c / 2));
      const __m512bh x23 = qword_broadcast(xr + 2 * kFp8ChunkK * (c / 2) + 4);
      acc01 = _mm512_mask_mov_ps(acc01, kEven, _mm512_dpbf16_ps(acc01, wk[0], x01));
      acc23 = _mm512_mask_mov_ps(acc23, kEven, _mm512_dpbf16_ps(acc23, wk[1], x23));
    }
    const __m512 s = _mm512_add_ps(acc01, acc23);  // lane 2r: c0 + c1, lane 2r + 1: c2 + c3
    const __m512 sum = _mm512_add_ps(s, _mm512_permute_ps(s, 0xB1));
    const __m256 rows = _mm256_castsi256_ps(_mm512_cvtepi64_epi32(_mm512_castps_si512(sum)));
    total = _mm256_fmadd_ps(rows, _mm256_set1_ps(scales[b]), total);
  }
  avx2::store_rows(y + t * kTileRows, total,
                   static_cast<int>(std::min<int64_t>(kTileRows, w.n - t * kTileRows)));
}

// FP8 from kFp8PanelMinTokens tokens on (K a multiple of 4): per tile pair and 128-k block the
// block's chunks are decoded once into an L1 panel of BF16 pairs (32 chunks x 2 zmm, 4 KiB), then
// each group of up to 6 tokens runs over it: 24 chains (6 tokens x 4) fed by the panel's weights
// and each activation pair as an embedded broadcast, then per token the block's sum is fma'd into
// its total, which waits in an L1 array (16 rows per token) between blocks. Tokens in chunks of
// kFp8PanelTokens, outermost: their activations (<= 768 KiB at K = 4096) stay in L2 while the
// tile range's weights stream past. The group path below re-decodes the block per 4 tokens.
constexpr int64_t kFp8PanelMinTokens = 5;
constexpr int64_t kFp8PanelTokens = 96;

template <int MR>
inline void fp8_bf16_panel_group(const __m512i (*panel)[2], int64_t n_chunks, const uint16_t* x,
                                 int64_t ldx, float scale, bool first, float (*totals)[16]) {
  __m512 chain[MR][4];
  for (int i = 0; i < MR; ++i) {
    for (int q = 0; q < 4; ++q) chain[i][q] = _mm512_setzero_ps();
  }
  const auto chunk = [&](int64_t c, int h) {
    const __m512bh w01 = (__m512bh)_mm512_load_si512(&panel[c][0]);
    const __m512bh w23 = (__m512bh)_mm512_load_si512(&panel[c][1]);
    for (int i = 0; i < MR; ++i) {
      const uint16_t* xk = x + i * ldx + c * kFp8ChunkK;
      chain[i][2 * h] = _mm512_dpbf16_ps(chain[i][2 * h], w01, pair_broadcast(xk));
      chain[i][2 * h + 1] = _mm512_dpbf16_ps(chain[i][2 * h + 1], w23, pair_broadcast(xk + 2));
    }
  };
  int64_t c = 0;
  for (; c + 2 <= n_chunks; c += 2) {
    chunk(c, 0);
    chunk(c + 1, 1);
  }
  if (c < n_chunks) chunk(c, 0);  // a block's chunks start even: the last odd one is a 0 chunk
  const __m512 s = _mm512_set1_ps(scale);
  for (int i = 0; i < MR; ++i) {
    const __m512 sum = _mm512_add_ps(_mm512_add_ps(chain[i][0], chain[i][1]),
                                     _mm512_add_ps(chain[i][2], chain[i][3]));
    const __m512 prev = first ? _mm512_setzero_ps() : _mm512_load_ps(totals[i]);
    _mm512_store_ps(totals[i], _mm512_fmadd_ps(sum, s, prev));
  }
}

template <bool kVbmi>
void fp8_bf16_panel(const PackedMatrix& w, const uint16_t* x, int64_t ldx, int64_t m, float* y,
                    int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  const Fp8Bf16Decoder<kVbmi> dec;
  const int64_t k_blocks = (w.k + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  alignas(64) __m512i panel[kFp8ChunksPerBlock][2];
  alignas(64) float totals[kFp8PanelTokens][16];
  for (int64_t i0 = 0; i0 < m; i0 += kFp8PanelTokens) {
    const int64_t mc = std::min(kFp8PanelTokens, m - i0);
    for (int64_t t = tile_begin; t < tile_end;) {
      const bool pair = t + 1 < tile_end && t % 2 == 0;  // one 128-row scale block
      const avx512::Fp8Pair p = avx512::fp8_pair_at(w, t, pair);
      for (int64_t b = 0; b < k_blocks; ++b) {
        const int64_t c0 = b * kFp8ChunksPerBlock;
        const int64_t n = std::min(w.chunks, c0 + kFp8ChunksPerBlock) - c0;
        prefetch_ahead(p.codes_a + c0 * kChunkBytes, n * kChunkBytes);
        prefetch_ahead(p.codes_b == nullptr ? nullptr : p.codes_b + c0 * kChunkBytes,
                       n * kChunkBytes);
        for (int64_t c = 0; c < n; ++c) {
          const int64_t off = (c0 + c) * kChunkBytes;
          __m512bh wk[2];
          dec.decode(p.codes_a + off, p.codes_b == nullptr ? nullptr : p.codes_b + off, wk);
          _mm512_store_si512(&panel[c][0], (__m512i)wk[0]);
          _mm512_store_si512(&panel[c][1], (__m512i)wk[1]);
        }
        for_token_groups<6>(mc, [&](auto mr, int64_t g) {
          fp8_bf16_panel_group<decltype(mr)::value>(panel, n, x + (i0 + g) * ldx + c0 * kFp8ChunkK,
                                                    ldx, p.scales[b], b == 0, totals + g);
        });
      }
      for (int64_t i = 0; i < mc; ++i) {
        _mm512_mask_storeu_ps(y + (i0 + i) * ldy + p.first_row, row_mask(p.rows),
                              _mm512_load_ps(totals[i]));
      }
      t += pair ? 2 : 1;
    }
  }
}

template <bool kVbmi>
void fp8_gemm_bf16_avx512(const PackedMatrix& w, const uint16_t* x, int64_t ldx, int64_t m,
                          float* y, int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  if (m >= kFp8PanelMinTokens && w.k % kFp8ChunkK == 0) {
    fp8_bf16_panel<kVbmi>(w, x, ldx, m, y, ldy, tile_begin, tile_end);
    return;
  }
  if (kVbmi && m == 1) {
    thread_local std::vector<uint16_t> reordered;
    reorder_fp8_token(x, w.k, reordered);
    for (int64_t t = tile_begin; t < tile_end; ++t) fp8_bf16_tile(w, t, reordered.data(), y);
    return;
  }
  for (int64_t t = tile_begin; t < tile_end;) {
    // Pairs only from an even tile: both then lie in one 128-row scale block.
    const bool pair = t + 1 < tile_end && t % 2 == 0;
    const avx512::Fp8Pair p = avx512::fp8_pair_at(w, t, pair);
    float* yt = y + p.first_row;
    for_token_groups<4>(m, [&](auto mr, int64_t i) {
      fp8_bf16_pair<decltype(mr)::value, kVbmi>(w, p, x + i * ldx, ldx, yt + i * ldy, ldy);
    });
    t += pair ? 2 : 1;
  }
}

}  // namespace

void nvfp4_gemm_bf16_16r_avx512_bf16(const PackedMatrix& w, const uint16_t* x, int64_t ldx,
                                     int64_t m, float* y, int64_t ldy, int64_t tile_begin,
                                     int64_t tile_end) {
  fp4_gemm_bf16_avx512<WeightFormat::kNvfp4>(w, x, ldx, m, y, ldy, tile_begin, tile_end);
}

void mxfp4_gemm_bf16_16r_avx512_bf16(const PackedMatrix& w, const uint16_t* x, int64_t ldx,
                                     int64_t m, float* y, int64_t ldy, int64_t tile_begin,
                                     int64_t tile_end) {
  fp4_gemm_bf16_avx512<WeightFormat::kMxfp4>(w, x, ldx, m, y, ldy, tile_begin, tile_end);
}

void fp8b128_gemm_bf16_16r_avx512_bf16(const PackedMatrix& w, const uint16_t* x, int64_t ldx,
                                       int64_t m, float* y, int64_t ldy, int64_t tile_begin,
                                       int64_t tile_end) {
  if (avx512::host_has_vbmi()) {
    fp8_gemm_bf16_avx512<true>(w, x, ldx, m, y, ldy, tile_begin, tile_end);
  } else {
    fp8_gemm_bf16_avx512<false>(w, x, ldx, m, y, ldy, tile_begin, tile_end);
  }
}

}  // namespace fp4moe::kernels
