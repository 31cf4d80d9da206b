// Block formats: the format table, bad input, and round trips of each whole-tensor quantizer.
#include "formats/block.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "formats/scalar.h"
#include "formats/transcode.h"

namespace fp4moe::formats {
namespace {

constexpr uint32_t kSeed = 20261129;

std::vector<float> random_tensor(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(gen);
  return x;
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
  const auto x = random_tensor(rows * cols, kSeed);
  auto scale = nvfp4_tensor_scale("w", x);
  ASSERT_TRUE(scale.ok());
  std::vector<uint8_t> packed(x.size() / 2), scales(x.size() / 16);
  ASSERT_TRUE(quantize_nvfp4("w", x, rows, cols, *scale, packed, scales).ok());
  std::vector<float> y(x.size());
  ASSERT_TRUE(dequantize_nvfp4("w", packed, scales, *scale, rows, cols, y).ok());
  for (size_t b = 0; b < x.size() / 16; ++b) {
    const float step = decode_ue4m3(scales[b]) * *scale;  // the E2M1 grid spacing is <= 2 steps
    for (size_t i = b * 16; i < b * 16 + 16; ++i) {
      ASSERT_LE(std::fabs(x[i] - y[i]), step * 1.0f + 1e-6f) << "seed " << kSeed << " i " << i;
    }
  }
}

TEST(Mxfp4, RoundTripAndZeroBlockScale) {
  const int64_t rows = 7, cols = 160;
  auto x = random_tensor(rows * cols, kSeed + 1);
  std::fill(x.begin(), x.begin() + 32, 0.0f);
  std::vector<uint8_t> packed(x.size() / 2), scales(x.size() / 32);
  ASSERT_TRUE(quantize_mxfp4("w", x, rows, cols, MxScaleRule::kOcpFloor, packed, scales).ok());
  EXPECT_EQ(scales[0], 127);  // all-zero block: X = 1.0
  std::vector<float> y(x.size());
  ASSERT_TRUE(dequantize_mxfp4("w", packed, scales, rows, cols, y).ok());
  for (size_t i = 0; i < x.size(); ++i) {
    const float scale = decode_e8m0(scales[i / 32]);
    // OCP floor may clip the block maximum by up to 25% (values in (6X, 8X) become 6X).
    ASSERT_LE(std::fabs(x[i] - y[i]), 2.0f * scale) << "seed " << kSeed + 1 << " i " << i;
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
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_NEAR(x[i], y[i], std::fabs(x[i]) * 0.0625f + 1e-3f) << "seed " << kSeed + 2;
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
