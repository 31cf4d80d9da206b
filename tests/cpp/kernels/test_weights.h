// Test helpers: random weights quantized by formats/ (the checkpoint layout), their dequantized
// FP32 values (the reference's view) and the packed kernel layout.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "formats/block.h"
#include "kernels/types.h"
#include "pack/pack.h"

namespace fp4moe::testing {

struct QuantizedMatrix {
  kernels::WeightFormat format;
  int64_t n = 0, k = 0;
  std::vector<uint8_t> codes;        // checkpoint layout
  std::vector<uint8_t> scale_codes;  // NVFP4 / MXFP4 block scales
  std::vector<float> fp8_scales;     // FP8 block scales
  float tensor_scale = 1.0f;
  std::vector<float> dequantized;  // [n, k], what every kernel must multiply by
  pack::PackedWeights packed;
};

// Weights ~ N(0, 1) times a per-row magnitude spread over 2^-6 .. 2^6, so block scales vary.
inline std::vector<float> random_weights(int64_t n, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exp(-6, 6);
  std::vector<float> w(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r) {
    const float mag = std::ldexp(1.0f, exp(rng));
    for (int64_t c = 0; c < k; ++c) w[r * k + c] = mag * normal(rng);
  }
  return w;
}

// `w` [n, k] quantized by formats/ into `format`, dequantized and packed.
inline QuantizedMatrix quantize_weights(kernels::WeightFormat format, const std::vector<float>& w,
                                        int64_t n, int64_t k) {
  QuantizedMatrix q;
  q.format = format;
  q.n = n;
  q.k = k;
  q.dequantized.resize(w.size());
  auto must = [](const Status& s) {
    if (!s.ok()) throw std::runtime_error(s.error().message);
  };
  switch (format) {
    case kernels::WeightFormat::kNvfp4: {
      q.codes.resize(n * k / 2);
      q.scale_codes.resize(n * k / 16);
      auto ts = formats::nvfp4_tensor_scale("w", w);
      if (!ts.ok()) throw std::runtime_error(ts.error().message);
      q.tensor_scale = *ts;
      must(formats::quantize_nvfp4("w", w, n, k, q.tensor_scale, q.codes, q.scale_codes));
      must(formats::dequantize_nvfp4("w", q.codes, q.scale_codes, q.tensor_scale, n, k,
                                     q.dequantized));
      auto p = pack::pack_nvfp4("w", q.codes, q.scale_codes, q.tensor_scale, n, k);
      if (!p.ok()) throw std::runtime_error(p.error().message);
      q.packed = std::move(p).value();
      break;
    }
    case kernels::WeightFormat::kMxfp4: {
      q.codes.resize(n * k / 2);
      q.scale_codes.resize(n * k / 32);
      must(formats::quantize_mxfp4("w", w, n, k, formats::MxScaleRule::kOcpFloor, q.codes,
                                   q.scale_codes));
      must(formats::dequantize_mxfp4("w", q.codes, q.scale_codes, n, k, q.dequantized));
      auto p = pack::pack_mxfp4("w", q.codes, q.scale_codes, n, k);
      if (!p.ok()) throw std::runtime_error(p.error().message);
      q.packed = std::move(p).value();
      break;
    }
    case kernels::WeightFormat::kFp8Block128: {
      q.codes.resize(n * k);
      q.fp8_scales.resize(formats::fp8_block_scale_count(n, k));
      must(formats::quantize_fp8_block128("w", w, n, k, q.codes, q.fp8_scales));
      must(formats::dequantize_fp8_block128("w", q.codes, q.fp8_scales, n, k, q.dequantized));
      auto p = pack::pack_fp8_block128("w", q.codes, q.fp8_scales, n, k);
      if (!p.ok()) throw std::runtime_error(p.error().message);
      q.packed = std::move(p).value();
      break;
    }
  }
  return q;
}

inline QuantizedMatrix quantize_random(kernels::WeightFormat format, int64_t n, int64_t k,
                                       std::mt19937& rng) {
  return quantize_weights(format, random_weights(n, k, rng), n, k);
}

inline std::vector<float> random_activations(int64_t m, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (float& v : x) v = normal(rng);
  return x;
}

// A product over the tile range [tile_begin, tile_end) into a NaN-filled `piece` [m, n]: the rows
// of those tiles must equal `whole` bit for bit and every other output must still be NaN (a kernel
// writes only its own tiles, which the thread pool relies on). Reports at most 5 outputs.
inline void expect_only_tile_range_written(const std::vector<float>& piece,
                                           const std::vector<float>& whole, int64_t m, int64_t n,
                                           int64_t tile_begin, int64_t tile_end) {
  const int64_t row_begin = tile_begin * kernels::kTileRows;
  const int64_t row_end = std::min(n, tile_end * kernels::kTileRows);
  int failures = 0;
  for (int64_t i = 0; i < m && failures < 5; ++i) {
    for (int64_t j = 0; j < n && failures < 5; ++j) {
      const float got = piece[i * n + j];
      const bool mine = j >= row_begin && j < row_end;
      if (mine ? std::memcmp(&got, &whole[i * n + j], sizeof(float)) != 0 : !std::isnan(got)) {
        ADD_FAILURE() << "y[" << i << ", " << j << "] = " << got
                      << (mine ? ", the whole call gave " + std::to_string(whole[i * n + j])
                               : std::string(", outside the piece's rows"));
        ++failures;
      }
    }
  }
}

}  // namespace fp4moe::testing
