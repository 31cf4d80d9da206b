// Portable W4A8 kernels and the activation quantizer (types.h, "W4A8"): the fallback and the
// bit-exact oracle of the SIMD W4A8 kernels. Per block: the exact integer sum of (2 * e2m1) * q,
// then one fma(float(sum), weight_scale * activation_scale, total), in block order, the same
// operations the SIMD kernels do lane by lane, so every ISA gives the same bits.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>

#include "formats/scalar.h"
#include "kernels/cpu/kernels_cpu.h"

namespace fp4moe::kernels {
namespace {

// 2 * e2m1(code): integers in [-12, 12], so weight x activation products are exact in int32.

constexpr int8_t kE2m1Times2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

template <WeightFormat kFormat>
void w4a8_gemm_scalar(const PackedMatrix& w, const QuantizedActivations& x, int64_t m, float* y,
                      int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  const formats::DecodeTables& tables = formats::decode_tables();
  const int block_k = weight_format_k_block(kFormat);
  const int chunks_per_block = block_k / kFp4ChunkK;
  const int64_t k_blocks = w.k / block_k;
  // The decoded values are 2 * e2m1; the 1/2 is folded into the final scale (exact).
  const float out_scale = w.tensor_scale * 0.5f;
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const uint8_t* tile = w.codes + t * w.chunks * kChunkBytes;
    const uint8_t* scales = w.block_scales + t * k_blocks * kTileRows;
    const int rows = static_cast<int>(std::min<int64_t>(kTileRows, w.n - t * kTileRows));
    for (int64_t mi = 0; mi < m; ++mi) {
      const int8_t* q = x.q + mi * x.ldq;
      float total[kTileRows] = {};
      for (int64_t b = 0; b < k_blocks; ++b) {
        int32_t sum[kTileRows] = {};
        for (int c = 0; c < chunks_per_block; ++c) {
          const int64_t chunk = b * chunks_per_block + c;
          const uint8_t* bytes = tile + chunk * kChunkBytes;
          for (int kk = 0; kk < kFp4ChunkK; ++kk) {
            const int32_t qv = q[chunk * kFp4ChunkK + kk];
            for (int r = 0; r < kTileRows; ++r)
              sum[r] += kE2m1Times2[fp4_chunk_code(bytes, r, kk)] * qv;
          }
        }
        const float act_scale = x.scales[mi * x.lds + b];
        for (int r = 0; r < kTileRows; ++r) {
          const uint8_t code = scales[b * kTileRows + r];
          const float w_scale =
              kFormat == WeightFormat::kNvfp4 ? tables.ue4m3[code] : tables.e8m0[code];
          total[r] = std::fma(static_cast<float>(sum[r]), w_scale * act_scale, total[r]);
        }
      }
      float* yr = y + mi * ldy + t * kTileRows;
      for (int r = 0; r < rows; ++r) yr[r] = total[r] * out_scale;
    }
  }
}

}  // namespace

void nvfp4_gemm_w4a8_8r_scalar(const PackedMatrix& w, const QuantizedActivations& x, int64_t m,
                               float* y, int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  w4a8_gemm_scalar<WeightFormat::kNvfp4>(w, x, m, y, ldy, tile_begin, tile_end);
}

void mxfp4_gemm_w4a8_8r_scalar(const PackedMatrix& w, const QuantizedActivations& x, int64_t m,
                               float* y, int64_t ldy, int64_t tile_begin, int64_t tile_end) {
  w4a8_gemm_scalar<WeightFormat::kMxfp4>(w, x, m, y, ldy, tile_begin, tile_end);
}

void quantize_activations_int8_scalar(const float* x, int64_t ldx, int64_t m, int64_t k, int block,
                                      int8_t* q, float* scales, int32_t* offsets) {
  const int64_t blocks = k / block;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + i * ldx + b * block;
      int8_t* qb = q + i * k + b * block;
      float amax = 0.0f;
      bool finite = true;
      for (int j = 0; j < block; ++j) {
        const float a = std::fabs(xb[j]);
        finite = finite && a <= FLT_MAX;
        amax = std::max(amax, a);
      }
      const int64_t s = i * blocks + b;
      if (!finite || amax == 0.0f) {
        // NaN makes every output of this token NaN, as the exact product would be non-finite.
        scales[s] = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
        offsets[s] = 0;
        std::fill(qb, qb + block, int8_t{0});
        continue;
      }
      // 127 / amax overflows for amax below ~2^-122: such blocks are first scaled by 2^64 (exact).
      const float pre = amax < kW4a8TinyAmax ? 0x1p64f : 1.0f;
      const float inv = 127.0f / (amax * pre);
      int32_t total = 0;
      for (int j = 0; j < block; ++j) {
        // |x * inv| <= 127 * (1 + 2^-22): the nearest-even integer is within [-127, 127].
        const auto v = static_cast<int32_t>(std::nearbyint((xb[j] * pre) * inv));
        qb[j] = static_cast<int8_t>(v);
        total += v;
      }
      scales[s] = amax / 127.0f;
      offsets[s] = -kW4a8CodeOffset * total;
    }
  }
}

}  // namespace fp4moe::kernels
