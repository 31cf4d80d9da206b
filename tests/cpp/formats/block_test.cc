// Block formats: the format table, bad input, and round trips of each whole-tensor quantizer.
#include "formats/block.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "formats/scalar.h"
#include "formats/transcode.h"

namespace fp4moe::formats {
namespace {

constexpr uint32_t kSeed = 20261129;
// NVFP4 elements, in units of the block's E2M1 step: float32 rounding of the scale product, of
// x / (s * scale_2) and of y moves a value by a few ulps of the block's largest value (6 units);
// 6 * 2^-21 is 4x that, and far below the 1/4 unit of one wrong code.
constexpr double kFloat32SlackUnits = 6.0 * 0x1p-21;

std::vector<float> random_tensor(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(gen);
  return x;
}

// Independent expectations (double arithmetic, FORMATS.md), so a test does not measure the
// quantizers' error in the scale the quantizer itself picked.

// The UE4M3 code of v > 0 rounded to nearest, ties to even, saturated at 448: the grid step is
// 2^(e-3) in the binade [2^e, 2^(e+1)) for e >= -6, and 2^-9 (subnormals) below 2^-6.
uint8_t expected_ue4m3_code(double v) {
  const int e = std::max(static_cast<int>(std::floor(std::log2(v))), -6);
  const double step = std::ldexp(1.0, e - 3);
  const double r = std::min(std::nearbyint(v / step) * step, 448.0);  // FE_TONEAREST: ties even
  if (r < std::ldexp(1.0, -6)) return static_cast<uint8_t>(r / std::ldexp(1.0, -9));
  const int re = static_cast<int>(std::floor(std::log2(r)));
  return static_cast<uint8_t>(((re + 7) << 3) | static_cast<int>(r / std::ldexp(1.0, re) * 8 - 8));
}

// Half the gap between the two E2M1 magnitudes around v >= 0 (grid 0, .5, 1, 1.5, 2, 3, 4, 6):
// the most a round-to-nearest code can be off. Past 6 (saturation) the top gap's half.
double e2m1_half_gap(double v) { return v < 2.0 ? 0.25 : (v < 4.0 ? 0.5 : 1.0); }

// Half the gap between the two E4M3 magnitudes around 0 <= v <= 448.
double e4m3_half_gap(double v) {
  const int e = v < std::ldexp(1.0, -6) ? -6 : static_cast<int>(std::floor(std::log2(v)));
  return std::ldexp(1.0, e - 4);
}

TEST(FormatTable, RowsDescribeTheFormats) {
  ASSERT_EQ(block_formats().size(), 4u);
  const auto& nv = block_format_info(BlockFormat::kNvfp4);
  EXPECT_EQ(nv.block_cols, 16);
  EXPECT_EQ(nv.bytes_per_block, 9);  // 8 bytes of nibbles + 1 UE4M3
  EXPECT_TRUE(nv.has_tensor_scale);
  const auto& mx = block_format_info(BlockFormat::kMxfp4);
  EXPECT_EQ(mx.block_cols, 32);
  EXPECT_EQ(mx.bytes_per_block, 17);  // 4.25 bits per weight
  EXPECT_EQ(mx.scale, ScaleType::kE8m0);
  EXPECT_EQ(block_format_info(BlockFormat::kFp8Block128).block_rows, 128);
  EXPECT_EQ(mx_scale_rule_name(MxScaleRule::kOcpFloor), "ocp_floor");
}

TEST(Nvfp4, BadShapeNamesTensor) {
  std::vector<float> x(2 * 40, 1.0f);
  std::vector<uint8_t> packed(40), scales(5);
  const Status s = quantize_nvfp4("layers.0.w1", x, 2, 40, 1.0f, packed, scales);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("layers.0.w1"), std::string::npos);
  EXPECT_NE(s.error().message.find("not a multiple of the NVFP4 block size 16"), std::string::npos);
}

TEST(Nvfp4, NaNNamesPositionAndWritesNothing) {
  std::vector<float> x(64, 1.0f);
  x[2 * 32 / 2 + 5] = NAN;  // row 1, col 5 of [2, 32]
  std::vector<uint8_t> packed(32, 0xAB), scales(4, 0xCD);
  const Status s = quantize_nvfp4("w", x, 2, 32, 1.0f, packed, scales);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("NaN at element [1, 5]"), std::string::npos)
      << s.error().message;
  for (uint8_t b : packed) EXPECT_EQ(b, 0xAB);
  for (uint8_t b : scales) EXPECT_EQ(b, 0xCD);
}

TEST(Nvfp4, RoundTripErrorWithinHalfStep) {
  const int64_t rows = 33, cols = 4096;
  auto x = random_tensor(rows * cols, kSeed);
  std::fill(x.begin() + 16, x.begin() + 32, 0.0f);  // block 1: all zero
  auto scale = nvfp4_tensor_scale("w", x);
  ASSERT_TRUE(scale.ok());
  // The recipe's two float32 steps (ModelOpt's op order, FORMATS.md §2): scale_2 = amax / (6*448)
  // and each block's ratio amax_block / (6 * scale_2); the E4M3 rounding of the ratio is done above
  // in double.
  float amax = 0.0f;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const float scale_2 = amax / (6.0f * 448.0f);
  ASSERT_EQ(*scale, scale_2);
  std::vector<uint8_t> packed(x.size() / 2), scales(x.size() / 16);
  ASSERT_TRUE(quantize_nvfp4("w", x, rows, cols, *scale, packed, scales).ok());
  std::vector<float> y(x.size());
  ASSERT_TRUE(dequantize_nvfp4("w", packed, scales, *scale, rows, cols, y).ok());
  for (size_t b = 0; b < x.size() / 16; ++b) {
    float block_max = 0.0f;
    for (size_t i = b * 16; i < b * 16 + 16; ++i) block_max = std::max(block_max, std::fabs(x[i]));
    const uint8_t code =
        expected_ue4m3_code(block_max == 0.0f ? 1.0 : block_max / (6.0f * scale_2));
    ASSERT_EQ(scales[b], code) << "block " << b << " amax " << block_max << " seed " << kSeed;
    const double unit = double(decode_ue4m3(code)) * scale_2;  // one E2M1 unit in this block
    for (size_t i = b * 16; i < b * 16 + 16; ++i) {
      const double bound = (e2m1_half_gap(std::fabs(x[i]) / unit) + kFloat32SlackUnits) * unit;
      ASSERT_LE(std::fabs(double(x[i]) - y[i]), bound) << "seed " << kSeed << " i " << i;
    }
  }
}

TEST(Mxfp4, RoundTripAndZeroBlockScale) {
  const int64_t rows = 7, cols = 160;
  auto x = random_tensor(rows * cols, kSeed + 1);
  std::fill(x.begin(), x.begin() + 32, 0.0f);
  std::vector<uint8_t> packed(x.size() / 2), scales(x.size() / 32);
  ASSERT_TRUE(quantize_mxfp4("w", x, rows, cols, MxScaleRule::kOcpFloor, packed, scales).ok());
  std::vector<float> y(x.size());
  ASSERT_TRUE(dequantize_mxfp4("w", packed, scales, rows, cols, y).ok());
  for (size_t b = 0; b < x.size() / 32; ++b) {
    double amax = 0.0;
    for (size_t i = b * 32; i < b * 32 + 32; ++i) amax = std::max(amax, std::fabs(double(x[i])));
    // OCP floor: X = 2^(floor(log2 amax) - 2); an all-zero block X = 1.0 (code 127).
    const int exponent = amax == 0.0 ? 0 : static_cast<int>(std::floor(std::log2(amax))) - 2;
    ASSERT_EQ(scales[b], exponent + 127) << "block " << b << " amax " << amax;
    const double X = std::ldexp(1.0, exponent);
    for (size_t i = b * 32; i < b * 32 + 32; ++i) {
      const double v = std::fabs(double(x[i])) / X;  // exact: X is a power of two
      if (v > 6.0) {
        // OCP floor puts amax in [4X, 8X): values past 6X clip to +-6X (up to 25% off).
        ASSERT_EQ(y[i], std::copysign(6.0 * X, x[i])) << "seed " << kSeed + 1 << " i " << i;
      } else {
        // Division and product by a power of two are exact: only the E2M1 rounding is left.
        ASSERT_LE(std::fabs(double(x[i]) - y[i]), e2m1_half_gap(v) * X)
            << "seed " << kSeed + 1 << " i " << i;
      }
    }
  }
}

TEST(Fp8Block, PartialEdgeBlocksAndUe8m0Scales) {
  const int64_t rows = 129, cols = 257;
  const auto x = random_tensor(rows * cols, kSeed + 2);
  ASSERT_EQ(fp8_block_scale_count(rows, cols), 2 * 3);
  std::vector<uint8_t> q(x.size()), scales(6);
  ASSERT_TRUE(quantize_fp8_block128_ue8m0("w", x, rows, cols, q, scales).ok());
  std::vector<float> y(x.size());
  ASSERT_TRUE(dequantize_fp8_block128_ue8m0("w", q, scales, rows, cols, y).ok());
  for (int64_t br = 0; br < 2; ++br) {
    for (int64_t bc = 0; bc < 3; ++bc) {
      // Block (br, bc) covers rows [128 br, min(128 br + 128, rows)), the same for columns.
      const int64_t r1 = std::min<int64_t>(128 * br + 128, rows);
      const int64_t c1 = std::min<int64_t>(128 * bc + 128, cols);
      double amax = 0.0;
      for (int64_t r = 128 * br; r < r1; ++r) {
        for (int64_t c = 128 * bc; c < c1; ++c) {
          amax = std::max(amax, std::fabs(double(x[r * cols + c])));
        }
      }
      // UE8M0: S = 2^ceil(log2(amax / 448)), the power of two at or above the FP8 scale.
      const int exponent = static_cast<int>(std::ceil(std::log2(amax / 448.0)));
      ASSERT_EQ(scales[br * 3 + bc], exponent + 127) << "block " << br << "," << bc;
      const double S = std::ldexp(1.0, exponent);
      for (int64_t r = 128 * br; r < r1; ++r) {
        for (int64_t c = 128 * bc; c < c1; ++c) {
          const size_t i = r * cols + c;
          // x / S <= 448 and S is a power of two: only the E4M3 rounding is left.
          ASSERT_LE(std::fabs(double(x[i]) - y[i]), e4m3_half_gap(std::fabs(double(x[i])) / S) * S)
              << "seed " << kSeed + 2 << " [" << r << ", " << c << "]";
        }
      }
    }
  }
}

TEST(Transcode, RejectsShapeAndReportsCounts) {
  std::vector<uint8_t> packed(16, 0x21), scales(1, 120);
  std::vector<uint8_t> out_packed(16), out_scales(2);
  Mxfp4Source src{"experts.0.w1", packed, scales, 1, 32};
  Nvfp4Destination dst{out_packed, out_scales};
  auto report = transcode_mxfp4_to_nvfp4({&src, 1}, {&dst, 1});
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->blocks_total, 2);
  EXPECT_EQ(report->blocks_lossless, 2);
  EXPECT_EQ(report->tensor_scale, std::ldexp(1.0f, 120 - 127 - 8));
  EXPECT_EQ(out_scales[0], encode_e4m3(256.0f));  // 2^8: k == k_max sits at the top

  Mxfp4Source bad{"experts.0.w3", packed, scales, 1, 48};
  auto error = transcode_mxfp4_to_nvfp4({&bad, 1}, {&dst, 1});
  ASSERT_FALSE(error.ok());
  EXPECT_NE(error.error().message.find("experts.0.w3"), std::string::npos);
}

}  // namespace
}  // namespace fp4moe::formats
