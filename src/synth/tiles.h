// Fast valid data for synthetic checkpoints: one Gaussian sample quantized once per format, whose
// packed bytes and scales are tiled (from a random block offset) into every tensor.
//
// Tiling keeps data valid because it moves whole quantization blocks: a tensor's block i takes the
// pool's block (offset + i) mod blocks, for the packed elements and the scale alike, so every
// element still sits next to the scale it was quantized with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "checkpoint/writer.h"

namespace fp4moe::synth {

// SplitMix64 (Steele et al.): tiny and specified bit for bit, so one seed gives the same bytes on
// every platform (the std:: distributions are implementation-defined).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  float gaussian(float stddev);  // Box-Muller on two draws

 private:
  uint64_t state_;
};

// The quantized sample, in every form a layout needs. The sample is [kPoolRows, kPoolCols] row
// major; FP4 blocks run along the columns; the FP8 pools see it as kFp8Tiles tiles of 128x128.
struct Pools {
  static constexpr int64_t kPoolRows = 256;
  static constexpr int64_t kPoolCols = 4096;  // 2^20 elements: ~1M, quantized in well under 1 s
  static constexpr int64_t kFp8Tile = 128;
  static constexpr int64_t kFp8Tiles = kPoolRows * kPoolCols / (kFp8Tile * kFp8Tile);

  std::vector<uint8_t> mxfp4_packed, mxfp4_scales;     // E2M1 pairs; E8M0 per 32 (OCP floor rule)
  std::vector<uint8_t> nvfp4_packed, nvfp4_scales;     // E2M1 pairs; UE4M3 per 16
  float nvfp4_tensor_scale = 0;                        // ModelOpt weight_scale_2 of the sample
  std::vector<uint8_t> fp8_ue8m0_q, fp8_ue8m0_scales;  // [128, 128*kFp8Tiles] E4M3; E8M0 per tile
  std::vector<uint8_t> fp8_f32_q;                      // same, F32 scales
  std::vector<uint8_t> fp8_f32_scales;                 // kFp8Tiles float32, as bytes
  std::vector<uint8_t> bf16;                           // the sample as BF16
  std::vector<uint8_t> f32;                            // the sample as F32
};

// Quantizes a Gaussian sample (std `stddev`, seeded) with the formats/ codecs.
Pools make_pools(uint64_t seed, float stddev);

// Tensor byte o is pool[(start + o) mod pool.size()]. `pool` must outlive the returned function.
checkpoint::CheckpointWriter::FillFn tile_bytes(std::span<const uint8_t> pool, uint64_t start);

// An FP8 weight [n, k] whose 128x128 tile (i, j) is pool tile (first_tile + i * ceil(k/128) + j)
// mod kFp8Tiles of `q` ([128, 128 * kFp8Tiles]); edge tiles take the top-left part of a pool tile,
// whose scale still covers it. The matching scale grid is tile_bytes(scales, first_tile * width).
checkpoint::CheckpointWriter::FillFn tile_fp8_weight(std::span<const uint8_t> q, int64_t n,
                                                     int64_t k, uint64_t first_tile);

}  // namespace fp4moe::synth
