// Portable scalar kernels over the kernel layout (types.h): the fallback on every host and the
// first oracle of the SIMD kernels. Same op order as the SIMD kernels: per-block float sums, then
// one multiply by the row's block scale, then the tensor scale.
#include <algorithm>
#include <cstring>

#include "formats/scalar.h"
#include "kernels/cpu/kernels_cpu.h"

namespace fp4moe::kernels {
namespace {

template <WeightFormat kFormat>
void fp4_gemm_scalar(const PackedMatrix& w, const float* x, int64_t ldx, int64_t m, float* y,
                     int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  const formats::DecodeTables& tables = formats::decode_tables();
  const int block_k = weight_format_k_block(kFormat);
  const int chunks_per_block = block_k / kFp4ChunkK;
  const int64_t k_blocks = w.k / block_k;
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const uint8_t* tile = w.codes + t * w.chunks * kChunkBytes;
    const uint8_t* scales = w.block_scales + t * k_blocks * kTileRows;
    const int rows = static_cast<int>(std::min<int64_t>(kTileRows, w.n - t * kTileRows));
    for (int64_t mi = 0; mi < m; ++mi) {
      const float* xr = x + mi * ldx;
      float total[kTileRows] = {};
      for (int64_t b = 0; b < k_blocks; ++b) {
        float block[kTileRows] = {};
        for (int c = 0; c < chunks_per_block; ++c) {
          const int64_t chunk = b * chunks_per_block + c;
          const uint8_t* bytes = tile + chunk * kChunkBytes;
          for (int kk = 0; kk < kFp4ChunkK; ++kk) {
            const float xv = xr[chunk * kFp4ChunkK + kk];
            for (int r = 0; r < kTileRows; ++r) {
              block[r] += xv * formats::decode_e2m1(fp4_chunk_code(bytes, r, kk));
            }
          }
        }
        for (int r = 0; r < kTileRows; ++r) {
          const uint8_t code = scales[b * kTileRows + r];
          const float scale =
              kFormat == WeightFormat::kNvfp4 ? tables.ue4m3[code] : tables.e8m0[code];
          total[r] += block[r] * scale;
        }
      }
      float* yr = y + mi * ldy + t * kTileRows;
      for (int r = 0; r < rows; ++r) yr[r] = total[r] * w.tensor_scale;
    }
  }
}

}  // namespace

void nvfp4_gemm_8r_scalar(const PackedMatrix& w, const float* x, int64_t ldx, int64_t m, float* y,
                          int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  fp4_gemm_scalar<WeightFormat::kNvfp4>(w, x, ldx, m, y, ldy, tile_begin, tile_end);
}

void mxfp4_gemm_8r_scalar(const PackedMatrix& w, const float* x, int64_t ldx, int64_t m, float* y,
                          int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  fp4_gemm_scalar<WeightFormat::kMxfp4>(w, x, ldx, m, y, ldy, tile_begin, tile_end);
}

void fp8b128_gemm_8r_scalar(const PackedMatrix& w, const float* x, int64_t ldx, int64_t m, float* y,
                            int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  const formats::DecodeTables& tables = formats::decode_tables();
  const int64_t k_blocks = (w.k + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const uint8_t* tile = w.codes + t * w.chunks * kChunkBytes;
    const float* scales = w.fp8_scales + (t * kTileRows / kFp8ScaleBlock) * k_blocks;
    const int rows = static_cast<int>(std::min<int64_t>(kTileRows, w.n - t * kTileRows));
    for (int64_t mi = 0; mi < m; ++mi) {
      const float* xr = x + mi * ldx;
      float total[kTileRows] = {};
      for (int64_t b = 0; b < k_blocks; ++b) {
        float block[kTileRows] = {};
        const int64_t k_end = std::min<int64_t>(w.k, (b + 1) * kFp8ScaleBlock);
        for (int64_t k = b * kFp8ScaleBlock; k < k_end; ++k) {
          const uint8_t* codes = tile + (k / kFp8ChunkK) * kChunkBytes + (k % kFp8ChunkK) * 8;
          for (int r = 0; r < kTileRows; ++r) block[r] += xr[k] * tables.e4m3[codes[r]];
        }
        for (int r = 0; r < kTileRows; ++r) total[r] += block[r] * scales[b];
      }
      std::memcpy(y + mi * ldy + t * kTileRows, total, sizeof(float) * rows);
    }
  }
}

}  // namespace fp4moe::kernels
