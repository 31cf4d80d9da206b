// Rows of a stacked tensor (gpt-oss gate_up_proj_blocks [E, 2I, K/32, 16], gate and up rows
// interleaved): pack_mxfp4_rows must give byte for byte what pack_mxfp4 gives for the same rows
// copied out, and refuse a selection that leaves the tensor. Seeded (FP4MOE_TEST_SEED replays).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "pack/pack.h"

namespace fp4moe::pack {
namespace {

uint32_t test_seed() {
  if (const char* s = std::getenv("FP4MOE_TEST_SEED")) return static_cast<uint32_t>(std::stoul(s));
  return 20261202;
}

void expect_same(const PackedWeights& a, const PackedWeights& b) {
  const kernels::PackedMatrix& x = a.view();
  const kernels::PackedMatrix& y = b.view();
  ASSERT_EQ(x.n, y.n);
  ASSERT_EQ(x.k, y.k);
  ASSERT_EQ(a.streamed_bytes(), b.streamed_bytes());
  const size_t codes = static_cast<size_t>(x.n_tiles * x.chunks * kernels::kChunkBytes);
  const size_t scales = static_cast<size_t>(x.n_tiles * (x.k / 32) * kernels::kTileRows);
  EXPECT_EQ(std::memcmp(x.codes, y.codes, codes), 0);
  EXPECT_EQ(std::memcmp(x.block_scales, y.block_scales, scales), 0);
}

TEST(PackRows, GptOssInterleavedGateUpAndStackedDown) {
  const uint32_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (set FP4MOE_TEST_SEED to replay)");
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255), scale(100, 140);
  // inter 12 (not a multiple of the 8-row tile: padding rows too), K 64, 3 experts.
  const int64_t experts = 3, inter = 12, k = 64, rows = experts * 2 * inter;
  std::vector<uint8_t> blocks(static_cast<size_t>(rows * k / 2)),
      scales(static_cast<size_t>(rows * k / 32));
  for (auto& b : blocks) b = static_cast<uint8_t>(byte(rng));
  for (auto& s : scales) s = static_cast<uint8_t>(scale(rng));
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t half = 0; half < 2; ++half) {
      SCOPED_TRACE("expert " + std::to_string(e) + (half == 0 ? " gate" : " up"));
      std::vector<uint8_t> own_codes, own_scales;
      for (int64_t i = 0; i < inter; ++i) {
        const int64_t row = e * 2 * inter + 2 * i + half;  // x[..., ::2] / x[..., 1::2]
        own_codes.insert(own_codes.end(), blocks.begin() + row * k / 2,
                         blocks.begin() + (row + 1) * k / 2);
        own_scales.insert(own_scales.end(), scales.begin() + row * k / 32,
                          scales.begin() + (row + 1) * k / 32);
      }
      auto want = pack_mxfp4("gathered", own_codes, own_scales, inter, k);
      ASSERT_TRUE(want.ok()) << want.error().message;
      auto got = pack_mxfp4_rows("stacked", blocks, scales, rows,
                                 RowSelection{e * 2 * inter + half, 2}, inter, k);
      ASSERT_TRUE(got.ok()) << got.error().message;
      expect_same(*got, *want);
    }
  }
  // Stride 1 over a whole expert is that expert's block of rows.
  auto all =
      pack_mxfp4_rows("stacked", blocks, scales, rows, RowSelection{2 * inter, 1}, 2 * inter, k);
  ASSERT_TRUE(all.ok());
  auto direct =
      pack_mxfp4("direct", std::span(blocks).subspan(2 * inter * k / 2, 2 * inter * k / 2),
                 std::span(scales).subspan(2 * inter * k / 32, 2 * inter * k / 32), 2 * inter, k);
  ASSERT_TRUE(direct.ok());
  expect_same(*all, *direct);
}

TEST(PackRows, SelectionsOutsideTheTensorAndNaNScalesAreErrors) {
  const int64_t rows = 8, k = 32;
  std::vector<uint8_t> blocks(rows * k / 2, 0x21), scales(rows * k / 32, 127);
  auto past = pack_mxfp4_rows("t", blocks, scales, rows, RowSelection{1, 2}, 5, k);
  ASSERT_FALSE(past.ok());
  EXPECT_NE(past.error().message.find("do not fit"), std::string::npos) << past.error().message;
  EXPECT_FALSE(pack_mxfp4_rows("t", blocks, scales, rows, RowSelection{0, 0}, 2, k).ok());
  EXPECT_FALSE(pack_mxfp4_rows("t", blocks, scales, rows + 1, RowSelection{0, 1}, 2, k).ok());
  // Only the selected rows' scales are read: a NaN in an unselected row is not this matrix's.
  scales[1] = 0xFF;  // row 1
  EXPECT_TRUE(pack_mxfp4_rows("t", blocks, scales, rows, RowSelection{0, 2}, 4, k).ok());
  auto nan = pack_mxfp4_rows("t", blocks, scales, rows, RowSelection{1, 2}, 4, k);
  ASSERT_FALSE(nan.ok());
  EXPECT_NE(nan.error().message.find("row 1"), std::string::npos) << nan.error().message;
}

}  // namespace
}  // namespace fp4moe::pack
