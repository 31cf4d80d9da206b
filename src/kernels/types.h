// The kernel-facing types: weight formats, ISAs, and the packed ("kernel layout") weight view.
//
// Kernels see raw pointers and shapes only; they never see checkpoint layouts or files. pack/ is
// the only code that turns a checkpoint layout into the layout documented here.
#pragma once

#include <cstdint>
#include <string_view>

namespace fp4moe::kernels {

// Instruction sets with their own kernel files. Each ISA's files are compiled with only its flags.
// The ISAs are nested levels: a host with one has every earlier one, so a kernel family that has
// no kernel at a level uses its kernel of the highest level below (registry.h, best_kernel).
enum class Isa : uint8_t {
  kScalar,      // portable C++, the fallback on every x86-64 and the SIMD kernels' first oracle
  kAvx2,        // AVX2 + FMA + F16C (Haswell, Zen 1+)
  kAvx512,      // AVX-512 F/BW/VL/DQ (Skylake-SP, Zen 4+)
  kAvx512Vnni,  // AVX-512 above + VNNI's int8 dot product (Cascade Lake, Ice Lake, Zen 4+)
  kAvx512Bf16,  // AVX-512 VNNI above + AVX512-BF16's vdpbf16ps (Cooper Lake, Zen 4+; Ice Lake
                // has VNNI without it, so it stays at the level above)
  kAmxInt8,     // AVX-512 BF16 above + AMX-TILE/AMX-INT8 tile products, with the OS's permission
                // (Sapphire Rapids and later Xeons, which all have AVX512-BF16)
};
inline constexpr Isa kAllIsas[] = {Isa::kScalar,     Isa::kAvx2,       Isa::kAvx512,
                                   Isa::kAvx512Vnni, Isa::kAvx512Bf16, Isa::kAmxInt8};
std::string_view isa_name(Isa isa);

// Weight formats the CPU kernels consume (checkpoint variants map onto these in pack/).
enum class WeightFormat : uint8_t {
  kNvfp4,        // E2M1 + UE4M3 per 16 along K + F32 tensor scale
  kMxfp4,        // E2M1 + E8M0 per 32 along K
  kFp8Block128,  // E4M3 + F32 scale per 128x128 (E8M0 scales are widened to F32 by pack/)
};
inline constexpr WeightFormat kAllWeightFormats[] = {WeightFormat::kNvfp4, WeightFormat::kMxfp4,
                                                     WeightFormat::kFp8Block128};
std::string_view weight_format_name(WeightFormat format);
// Elements of K per scale along K, and the K granularity a matrix must have.
int weight_format_k_block(WeightFormat format);

// ------------------------------------------------------------------------------------------------
// Kernel layout ("row-interleaved tiles"). Rows are grouped in tiles of kTileRows = 8 output rows;
// N is padded to a whole tile with zero rows. SIMD lanes hold ROWS, not K: one 8-float vector is
// the 8 rows of a tile at one k, so a product is FMA(weights, broadcast(x[k])) with no horizontal
// sum, and a vector of 8 block scales (one per row) applies to a whole block at once.
//
// FP4 (NVFP4, MXFP4): a tile is K/8 chunks of 32 bytes; chunk c covers k = 8c .. 8c+7 for 8 rows.
//   Dword r of a chunk (bytes 4r + j, j = 0..3) holds row r: byte j's low nibble = k 8c + j, its
//   high nibble = k 8c + 4 + j.
//   Why: a row's 8 codes are one dword, the lane of its row, with no shuffle: the int8 dot
//   products (vpdpbusd, pmaddubsw + pmaddwd) take a row's 4 k per dword directly after the 16-entry
//   byte lookup of each nibble; the AVX-512 exact kernel shifts a dword's nibble of k to the bottom
//   and looks 16 rows' F32 weights up by one vpermps; the AVX2 exact kernel moves one k's 8 decoded
//   bytes to the top byte of 8 int32 lanes by one in-lane pshufb (rows 0-3 in the low 128-bit
//   lane, 4-7 in the high one).
//   Block scales: per tile, per K block (16 for NVFP4, 32 for MXFP4), 8 bytes = the 8 rows' raw
//   UE4M3 / E8M0 codes, tile-major: scales[(tile * k_blocks + block) * 8 + row].
// FP8 block-128: a tile is ceil(K/4) chunks of 32 bytes; chunk c covers k = 4c .. 4c+3 for 8 rows;
//   byte 8*j + r holds row r at k = 4c + j (plain [k][row] order); K is padded to a multiple of 4
//   with zero codes. Why: an in-lane byte unpack with zero turns 8 codes into 8 words whose high
//   byte is the code, a shift and mask make them FP16 (E4M3 fits FP16 exactly, subnormals too) and
//   one vcvtph2ps makes the 8 rows' floats (with VBMI, at 1-4 tokens all below 2^16, the AVX-512
//   kernel gathers each row's F32 bits from two byte tables of the same chunk instead). Scales: F32
//   [ceil(N/128), ceil(K/128)], the checkpoint grid (a tile never straddles two 128-row blocks
//   since 128 % 8 == 0).
inline constexpr int kTileRows = 8;
inline constexpr int kFp4ChunkK = 8;  // K elements per 32-byte FP4 chunk

// The byte of an FP4 chunk that holds tile row `row` (0..7) at k offset `j` (0..3; the same byte's
// high nibble holds offset j + 4): the map above, written once for pack/ and the scalar kernels.
constexpr int fp4_chunk_byte(int row, int j) { return 4 * row + j; }
// The code of tile row `row` at k offset `kk` (0..7) in an FP4 chunk.
inline uint8_t fp4_chunk_code(const uint8_t* chunk, int row, int kk) {
  const uint8_t byte = chunk[fp4_chunk_byte(row, kk % 4)];
  return kk < 4 ? (byte & 0xF) : (byte >> 4);
}
inline constexpr int kFp8ChunkK = 4;  // K elements per 32-byte FP8 chunk
inline constexpr int kChunkBytes = 32;
inline constexpr int kFp8ScaleBlock = 128;

struct PackedMatrix {
  WeightFormat format;
  int64_t n;                    // output features (rows)
  int64_t k;                    // input features
  int64_t n_tiles;              // ceil(n / kTileRows)
  int64_t chunks;               // 32-byte chunks per tile along K
  const uint8_t* codes;         // n_tiles * chunks * 32 bytes
  const uint8_t* block_scales;  // FP4: n_tiles * (k / k_block) * 8 codes; FP8: unused
  const float* fp8_scales;      // FP8: [ceil(n/128), ceil(k/128)] F32; FP4: unused
  float tensor_scale;           // NVFP4 weight_scale_2; 1 for the other formats
};

// Y[m, n] = sum_k X[m, k] * W[n, k] for rows n in tiles [tile_begin, tile_end), m < M.
// X is F32 with row stride ldx; Y is F32 with row stride ldy, overwritten (never accumulated).
// Threads split the tile range; a kernel allocates nothing and keeps no state.
using GemmKernel = void (*)(const PackedMatrix& w, const float* x, int64_t ldx, int64_t m, float* y,
                            int64_t ldy, int64_t tile_begin, int64_t tile_end);

// ------------------------------------------------------------------------------------------------
// BF16 activations: a separate kernel family for callers whose activations are BF16 (a model's
// hidden states), never chosen for F32 ones. Every product w * x is exact in F32 (an E2M1 value
// has 2 significant bits, a BF16 one 8), so this is an exact product of the BF16 inputs like the
// F32 family's, summed in another order, the order of AVX512-BF16's vdpbf16ps, which the scalar
// kernel of the family follows bit for bit (kernels/cpu/bf16_pair_dot.h):
//  - per row and K block, 4 chains; chain q takes the pair (k, k + 1) = (8c + 2q, 8c + 2q + 1) of
//    every 8-k chunk c of the block, in chunk order: acc = fl(fl(acc + w[k+1] x[k+1]) + w[k] x[k]),
//    with subnormal inputs and results flushed to zero (vdpbf16ps: DAZ, FTZ, round to nearest);
//  - the block's sum (c0 + c1) + (c2 + c3), times the F32 block scale, added to the row's total by
//    one fma (chains and total start at zero); the output is the total times the tensor scale.
//  - FP8 block-128 (E4M3 is exact in BF16, subnormals included): per row and 128-k scale block,
//    chain 2 * (c % 2) + p takes the pair (4c + 2p, 4c + 2p + 1) of each 4-k chunk c of the block
//    (a pair past K as +0 weights times +0 activations), the same sum and fma with the block's F32
//    scale; the output is the total (no tensor scale).
// Outside the exactness statement: activations below 2^-126 (BF16 subnormals, read as zero) and
// partial sums below 2^-126 (flushed), both only perturb contributions below ~1e-38 before scaling.
using GemmBf16Kernel = void (*)(const PackedMatrix& w, const uint16_t* x, int64_t ldx, int64_t m,
                                float* y, int64_t ldy, int64_t tile_begin, int64_t tile_end);

// ------------------------------------------------------------------------------------------------
// W4A8 ("activations in int8", the llama.cpp q8 scheme): a separate, named kernel family, never
// chosen unless asked for. Each token's activations are quantized per K block (the weight format's
// block: 16 for NVFP4, 32 for MXFP4) to int8 codes q = round_half_even(x * fl(127 / amax)) (F32
// products, the reciprocal rounded first) with the F32 scale amax / 127 (0 for an all-zero block,
// NaN for a block holding Inf or NaN, so the output says so). Weight codes and activation codes
// are multiplied in integers, exactly; each block's integer sum times fl(weight block scale *
// activation scale) is accumulated in F32.
// Error against the exact W4A16 product: per output, at most sum over blocks of
// (amax_block / 254) * sum |w| over the block, plus the FP32 summation error (tests/ check it).
// Outside that statement: blocks with amax below ~2^-119 (their scale amax / 127 is an F32
// subnormal and keeps fewer bits) and scale products that underflow (E8M0 weight scales near
// 2^-127); both only perturb contributions below ~1e-35.
// The SIMD W4A8 kernels hold weight codes as u = 2 * e2m1 + kW4a8CodeOffset, in [0, 24]: the
// int8 dot products (pmaddubsw, vpdpbusd) want one unsigned operand. Then sum(u * q) plus the
// block's `offsets` entry, -kW4a8CodeOffset * sum(q), is sum((2 * e2m1) * q) exactly, and a kernel
// starts its int32 sum at that entry (a broadcast load, nothing computed per token).
inline constexpr int32_t kW4a8CodeOffset = 12;
// Every activation quantizer pre-scales a block whose amax is below this by 2^64 (exact), so
// 127 / amax stays finite.
inline constexpr float kW4a8TinyAmax = 0x1p-64f;
struct QuantizedActivations {
  const int8_t* q;         // [m, k] codes, row stride ldq
  const float* scales;     // [m, k / block] F32 scales, row stride lds
  const int32_t* offsets;  // [m, k / block] -kW4a8CodeOffset * (sum of the block's codes), lds
  int64_t ldq, lds;
};

// y[i, n] for tokens i < m and rows n in tiles [tile_begin, tile_end), as GemmKernel.
using GemmW4A8Kernel = void (*)(const PackedMatrix& w, const QuantizedActivations& x, int64_t m,
                                float* y, int64_t ldy, int64_t tile_begin, int64_t tile_end);
// Quantizes x [m, k] (row stride ldx) per `block` into q (stride k), scales and offsets (stride
// k / block). Every ISA's quantizer gives the same bits.
using QuantizeActivationsFn = void (*)(const float* x, int64_t ldx, int64_t m, int64_t k, int block,
                                       int8_t* q, float* scales, int32_t* offsets);

}  // namespace fp4moe::kernels
