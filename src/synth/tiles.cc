// Quantized sample pools and the tiling fills of synthetic checkpoints (see tiles.h).
#include "synth/tiles.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numbers>

#include "core/check.h"
#include "formats/block.h"
#include "formats/scalar.h"

namespace fp4moe::synth {

uint64_t Rng::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

float Rng::gaussian(float stddev) {
  // 53-bit uniforms in (0, 1]; the +1 keeps log() away from zero.
  const double u1 = static_cast<double>((next() >> 11) + 1) * 0x1.0p-53;
  const double u2 = static_cast<double>(next() >> 11) * 0x1.0p-53;
  return static_cast<float>(stddev * std::sqrt(-2.0 * std::log(u1)) *
                            std::cos(2.0 * std::numbers::pi * u2));
}

Pools make_pools(uint64_t seed, float stddev) {
  constexpr int64_t kRows = Pools::kPoolRows, kCols = Pools::kPoolCols;
  constexpr int64_t kCount = kRows * kCols;
  Rng rng(seed);
  std::vector<float> x(kCount);
  for (float& v : x) v = rng.gaussian(stddev);

  // The formats/ quantizers only fail on NaN/Inf or mismatched buffer sizes: neither can happen
  // with a finite sample and buffers sized here, so a failure is a broken invariant.
  Pools p;
  p.mxfp4_packed.resize(kCount / 2);
  p.mxfp4_scales.resize(kCount / 32);
  FP4MOE_CHECK(formats::quantize_mxfp4("synthetic sample", x, kRows, kCols,
                                       formats::MxScaleRule::kOcpFloor, p.mxfp4_packed,
                                       p.mxfp4_scales)
                   .ok());

  auto tensor_scale = formats::nvfp4_tensor_scale("synthetic sample", x);
  FP4MOE_CHECK(tensor_scale.ok());
  p.nvfp4_tensor_scale = *tensor_scale;
  p.nvfp4_packed.resize(kCount / 2);
  p.nvfp4_scales.resize(kCount / 16);
  FP4MOE_CHECK(formats::quantize_nvfp4("synthetic sample", x, kRows, kCols, p.nvfp4_tensor_scale,
                                       p.nvfp4_packed, p.nvfp4_scales)
                   .ok());

  // The FP8 pools see the same sample as one [128, 128 * kFp8Tiles] matrix: a row of tiles.
  constexpr int64_t kTileRows = Pools::kFp8Tile, kTileCols = kCount / Pools::kFp8Tile;
  p.fp8_ue8m0_q.resize(kCount);
  p.fp8_ue8m0_scales.resize(Pools::kFp8Tiles);
  FP4MOE_CHECK(formats::quantize_fp8_block128_ue8m0("synthetic sample", x, kTileRows, kTileCols,
                                                    p.fp8_ue8m0_q, p.fp8_ue8m0_scales)
                   .ok());
  p.fp8_f32_q.resize(kCount);
  std::vector<float> f32_scales(Pools::kFp8Tiles);
  FP4MOE_CHECK(formats::quantize_fp8_block128("synthetic sample", x, kTileRows, kTileCols,
                                              p.fp8_f32_q, f32_scales)
                   .ok());
  p.fp8_f32_scales.resize(f32_scales.size() * sizeof(float));
  std::memcpy(p.fp8_f32_scales.data(), f32_scales.data(), p.fp8_f32_scales.size());

  // safetensors is little-endian, as is every host this project builds for.
  static_assert(std::endian::native == std::endian::little);
  p.bf16.resize(kCount * 2);
  for (int64_t i = 0; i < kCount; ++i) {
    const uint16_t b = formats::encode_bf16(x[i]);
    std::memcpy(&p.bf16[i * 2], &b, 2);
  }
  const auto* x_bytes = reinterpret_cast<const uint8_t*>(x.data());
  p.f32.assign(x_bytes, x_bytes + x.size() * sizeof(float));
  return p;
}

checkpoint::CheckpointWriter::FillFn tile_bytes(std::span<const uint8_t> pool, uint64_t start) {
  FP4MOE_CHECK(!pool.empty());
  return [pool, start](uint64_t offset, std::span<std::byte> chunk) -> Status {
    size_t done = 0;
    uint64_t src = (start + offset) % pool.size();
    while (done < chunk.size()) {
      const size_t run = std::min<size_t>(chunk.size() - done, pool.size() - src);
      std::memcpy(chunk.data() + done, pool.data() + src, run);
      done += run;
      src = 0;  // wrapped
    }
    return Status::Ok();
  };
}

checkpoint::CheckpointWriter::FillFn tile_fp8_weight(std::span<const uint8_t> q, int64_t n,
                                                     int64_t k, uint64_t first_tile) {
  constexpr int64_t kTile = Pools::kFp8Tile, kTiles = Pools::kFp8Tiles;
  FP4MOE_CHECK(q.size() == static_cast<size_t>(kTile * kTile * kTiles));
  FP4MOE_CHECK(n > 0 && k > 0);
  const int64_t tiles_per_row = (k + kTile - 1) / kTile;
  return [q, k, first_tile, tiles_per_row](uint64_t offset, std::span<std::byte> chunk) -> Status {
    size_t done = 0;
    while (done < chunk.size()) {
      const uint64_t o = offset + done;
      const int64_t r = static_cast<int64_t>(o / k), c = static_cast<int64_t>(o % k);
      const uint64_t tile =
          (first_tile + static_cast<uint64_t>((r / kTile) * tiles_per_row + c / kTile)) % kTiles;
      // One tile row segment: up to the tile's right edge or the tensor's.
      const size_t run =
          std::min<size_t>({chunk.size() - done, static_cast<size_t>(kTile - c % kTile),
                            static_cast<size_t>(k - c)});
      const size_t src = static_cast<size_t>((r % kTile) * kTile * kTiles) +
                         static_cast<size_t>(tile * kTile) + static_cast<size_t>(c % kTile);
      std::memcpy(chunk.data() + done, q.data() + src, run);
      done += run;
    }
    return Status::Ok();
  };
}

}  // namespace fp4moe::synth
