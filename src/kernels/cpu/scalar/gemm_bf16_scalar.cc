// Scalar kernels of the BF16-activation family (kernels/types.h): the family's arithmetic written
// out lane by lane (kernels/cpu/bf16_pair_dot.h), so the SIMD kernels are checked against it bit
// for bit. dispatch/ runs them only when the ISA is forced to scalar: a host without AVX512-BF16
// widens BF16 activations to F32 for its F32 kernels, which is faster than this.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "formats/scalar.h"
#include "kernels/cpu/bf16_pair_dot.h"
#include "kernels/cpu/kernels_cpu.h"

namespace fp4moe::kernels {
namespace {

constexpr int kBf16Chains = 4;  // chain q: the pair (2q, 2q + 1) of every 8-k chunk

template <WeightFormat kFormat>
void fp4_gemm_bf16_scalar(const PackedMatrix& w, const uint16_t* x, int64_t ldx, int64_t m,
                          float* y, int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  const formats::DecodeTables& tables = formats::decode_tables();
  const int block_k = weight_format_k_block(kFormat);
  const int chunks_per_block = block_k / kFp4ChunkK;
  const int64_t k_blocks = w.k / block_k;
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const uint8_t* tile = w.codes + t * w.chunks * kChunkBytes;
    const uint8_t* scales = w.block_scales + t * k_blocks * kTileRows;
    const int rows = static_cast<int>(std::min<int64_t>(kTileRows, w.n - t * kTileRows));
    for (int64_t mi = 0; mi < m; ++mi) {
      const uint16_t* xr = x + mi * ldx;
      float* yr = y + mi * ldy + t * kTileRows;
      for (int r = 0; r < rows; ++r) {
        float total = 0.0f;
        for (int64_t b = 0; b < k_blocks; ++b) {
          float chain[kBf16Chains] = {};
          for (int c = 0; c < chunks_per_block; ++c) {
            const int64_t chunk = b * chunks_per_block + c;
            const uint8_t* bytes = tile + chunk * kChunkBytes;
            const uint16_t* xk = xr + chunk * kFp4ChunkK;
            for (int q = 0; q < kBf16Chains; ++q) {
              chain[q] = bf16_pair_dot(chain[q], e2m1_bf16_bits(fp4_chunk_code(bytes, r, 2 * q)),
                                       e2m1_bf16_bits(fp4_chunk_code(bytes, r, 2 * q + 1)),
                                       xk[2 * q], xk[2 * q + 1]);
            }
          }
          const uint8_t code = scales[b * kTileRows + r];
          const float scale =
              kFormat == WeightFormat::kNvfp4 ? tables.ue4m3[code] : tables.e8m0[code];
          total = std::fma((chain[0] + chain[1]) + (chain[2] + chain[3]), scale, total);
        }
        yr[r] = total * w.tensor_scale;
      }
    }
  }
}

// FP8 block-128 (types.h): per row and 128-k scale block, chain 2 * (c % 2) + p takes the pair
// (4c + 2p, 4c + 2p + 1) of chunk c; every pair of the ceil(K / 4) chunks runs, the padding past K
// as +0 weights (pack/'s zero codes) times +0 activations (never read).
void fp8_gemm_bf16_scalar(const PackedMatrix& w, const uint16_t* x, int64_t ldx, int64_t m,
                          float* y, int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  constexpr int64_t kChunksPerBlock = kFp8ScaleBlock / kFp8ChunkK;
  const int64_t k_blocks = (w.k + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const uint8_t* tile = w.codes + t * w.chunks * kChunkBytes;
    const float* scales = w.fp8_scales + (t * kTileRows / kFp8ScaleBlock) * k_blocks;
    const int rows = static_cast<int>(std::min<int64_t>(kTileRows, w.n - t * kTileRows));
    for (int64_t mi = 0; mi < m; ++mi) {
      const uint16_t* xr = x + mi * ldx;
      auto xat = [&](int64_t k) { return k < w.k ? xr[k] : uint16_t{0}; };
      float* yr = y + mi * ldy + t * kTileRows;
      for (int r = 0; r < rows; ++r) {
        float total = 0.0f;
        for (int64_t b = 0; b < k_blocks; ++b) {
          float chain[kBf16Chains] = {};
          const int64_t c_end = std::min(w.chunks, (b + 1) * kChunksPerBlock);
          for (int64_t c = b * kChunksPerBlock; c < c_end; ++c) {
            const uint8_t* bytes = tile + c * kChunkBytes;  // byte j * 8 + r: row r, k 4c + j
            for (int p = 0; p < 2; ++p) {
              const int64_t k0 = kFp8ChunkK * c + 2 * p;
              float& acc = chain[2 * (c % 2) + p];
              acc = bf16_pair_dot(acc, e4m3_bf16_bits(bytes[2 * p * kTileRows + r]),
                                  e4m3_bf16_bits(bytes[(2 * p + 1) * kTileRows + r]), xat(k0),
                                  xat(k0 + 1));
            }
          }
          total = std::fma((chain[0] + chain[1]) + (chain[2] + chain[3]), scales[b], total);
        }
        yr[r] = total;
      }
    }
  }
}

}  // namespace

void nvfp4_gemm_bf16_8r_scalar(const PackedMatrix& w, const uint16_t* x, int64_t ldx, int64_t m,
                               float* y, int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  fp4_gemm_bf16_scalar<WeightFormat::kNvfp4>(w, x, ldx, m, y, ldy, tile_begin, tile_end);
}

void mxfp4_gemm_bf16_8r_scalar(const PackedMatrix& w, const uint16_t* x, int64_t ldx, int64_t m,
                               float* y, int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  fp4_gemm_bf16_scalar<WeightFormat::kMxfp4>(w, x, ldx, m, y, ldy, tile_begin, tile_end);
}

void fp8b128_gemm_bf16_8r_scalar(const PackedMatrix& w, const uint16_t* x, int64_t ldx, int64_t m,
                                 float* y, int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  fp8_gemm_bf16_scalar(w, x, ldx, m, y, ldy, tile_begin, tile_end);
}

}  // namespace fp4moe::kernels
