// Exhaustive tests of the scalar codecs over their whole code spaces, plus the documented choices.
#include "formats/scalar.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace fp4moe::formats {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

bool same_bits(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

TEST(E2M1, TableMatchesFormatsSheet) {
  // FORMATS.md §1: codes 0..7 = +{0, 0.5, 1, 1.5, 2, 3, 4, 6}; 8..15 the same negated.
  const float expected[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(decode_e2m1(static_cast<uint8_t>(c)), expected[c]) << "code " << c;
    EXPECT_EQ(decode_e2m1(static_cast<uint8_t>(c + 8)), -expected[c]) << "code " << c + 8;
  }
  EXPECT_TRUE(std::signbit(decode_e2m1(8)));
}

TEST(E2M1, EveryCodeRoundTrips) {
  for (int c = 0; c < 16; ++c) {
    const auto code = static_cast<uint8_t>(c);
    EXPECT_EQ(encode_e2m1(decode_e2m1(code)), code) << "code " << c;
  }
}

TEST(E2M1, TiesToEvenAndSaturation) {
  EXPECT_EQ(encode_e2m1(0.25f), 0x0);  // 0 | 0.5: even is 0
  EXPECT_EQ(encode_e2m1(0.75f), 0x2);  // 0.5 | 1: even is 1.0 (code 2)
  EXPECT_EQ(encode_e2m1(1.25f), 0x2);  // 1 | 1.5
  EXPECT_EQ(encode_e2m1(1.75f), 0x4);  // 1.5 | 2
  EXPECT_EQ(encode_e2m1(2.5f), 0x4);   // 2 | 3
  EXPECT_EQ(encode_e2m1(3.5f), 0x6);   // 3 | 4
  EXPECT_EQ(encode_e2m1(5.0f), 0x6);   // 4 | 6
  EXPECT_EQ(encode_e2m1(5.0001f), 0x7);
  EXPECT_EQ(encode_e2m1(1e30f), 0x7);
  EXPECT_EQ(encode_e2m1(kInf), 0x7);
  EXPECT_EQ(encode_e2m1(-kInf), 0xF);
  EXPECT_EQ(encode_e2m1(kNaN), 0x7);
  EXPECT_EQ(encode_e2m1(-0.0f), 0x8);
  EXPECT_EQ(encode_e2m1(-0.1f), 0x8);
  EXPECT_EQ(encode_e2m1(std::numeric_limits<float>::denorm_min()), 0x0);
}

TEST(E4M3, EveryByteRoundTripsAndNaNIsOnly0x7F) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    const float v = decode_e4m3(code);
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(v)) << "code " << c;
      continue;
    }
    EXPECT_TRUE(std::isfinite(v)) << "code " << c;
    EXPECT_EQ(encode_e4m3(v), code) << "code " << c;
  }
}

TEST(E4M3, RangeAndSubnormals) {
  EXPECT_EQ(decode_e4m3(0x7E), 448.0f);
  EXPECT_EQ(decode_e4m3(0x08), std::ldexp(1.0f, -6));  // min normal
  EXPECT_EQ(decode_e4m3(0x01), std::ldexp(1.0f, -9));  // min subnormal
  EXPECT_EQ(decode_e4m3(0x07), 7 * std::ldexp(1.0f, -9));
  // The 18 exact powers of two 2^-9 .. 2^8 (FORMATS.md §1).
  for (int e = -9; e <= 8; ++e) {
    EXPECT_EQ(decode_e4m3(encode_e4m3(std::ldexp(1.0f, e))), std::ldexp(1.0f, e)) << e;
  }
  EXPECT_EQ(encode_e4m3(464.0f), 0x7E);  // tie between 448 and 480 (not finite): even is 448
  EXPECT_EQ(encode_e4m3(1e9f), 0x7E);    // saturating
  EXPECT_EQ(encode_e4m3(-kInf), 0xFE);
  EXPECT_EQ(encode_e4m3(kNaN), 0x7F);
  EXPECT_EQ(encode_e4m3(-kNaN), 0xFF);
  EXPECT_EQ(encode_e4m3(std::ldexp(1.0f, -10)), 0x00);  // tie 0 | 2^-9: even is 0
  EXPECT_EQ(encode_e4m3(std::ldexp(1.5f, -10)), 0x01);
  EXPECT_EQ(encode_e4m3(-0.0f), 0x80);
}

TEST(UE4M3, SignedCodesAreInvalidAndNegativesClamp) {
  for (int c = 0; c < 128; ++c) {
    const auto code = static_cast<uint8_t>(c);
    EXPECT_TRUE(same_bits(decode_ue4m3(code), decode_e4m3(code)) ||
                (std::isnan(decode_ue4m3(code)) && c == 0x7F));
    if (c != 0x7F) {
      EXPECT_EQ(encode_ue4m3(decode_ue4m3(code)), code);
    }
  }
  for (int c = 128; c < 256; ++c) EXPECT_TRUE(std::isnan(decode_ue4m3(static_cast<uint8_t>(c))));
  EXPECT_EQ(encode_ue4m3(-3.0f), 0x00);
  EXPECT_EQ(encode_ue4m3(kNaN), 0x7F);
}

TEST(E8M0, EveryByte) {
  for (int c = 0; c < 255; ++c) {
    const auto code = static_cast<uint8_t>(c);
    EXPECT_EQ(decode_e8m0(code), std::ldexp(1.0f, c - 127)) << c;
    EXPECT_EQ(encode_e8m0(decode_e8m0(code)), code) << c;
  }
  EXPECT_TRUE(std::isnan(decode_e8m0(0xFF)));
  EXPECT_EQ(encode_e8m0(kNaN), 0xFF);
  EXPECT_EQ(encode_e8m0(1.5f), 128);  // tie rounds up
  EXPECT_EQ(encode_e8m0(1.4999f), 127);
  EXPECT_EQ(encode_e8m0(0.0f), 0x00);  // saturate low
  EXPECT_EQ(encode_e8m0(-4.0f), 0x00);
  EXPECT_EQ(encode_e8m0(kInf), 0xFE);  // saturate high
}

TEST(BF16, EveryPatternRoundTripsAndRoundsToNearestEven) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    const float v = decode_bf16(h);
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(decode_bf16(encode_bf16(v))));
      continue;
    }
    EXPECT_EQ(encode_bf16(v), h) << bits;
  }
  EXPECT_EQ(encode_bf16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie, even stays
  EXPECT_EQ(encode_bf16(std::bit_cast<float>(0x3F818000u)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(encode_bf16(std::numeric_limits<float>::max()), 0x7F80);  // overflow to Inf
}

TEST(FP16, EveryPatternRoundTripsAndOverflowsToInf) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    const float v = decode_fp16(h);
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(decode_fp16(encode_fp16(v))));
      continue;
    }
    EXPECT_EQ(encode_fp16(v), h) << bits;
  }
  EXPECT_EQ(encode_fp16(65519.0f), 0x7BFF);
  EXPECT_EQ(encode_fp16(65520.0f), 0x7C00);
  EXPECT_EQ(encode_fp16(std::ldexp(1.0f, -25)), 0x0000);  // tie 0 | 2^-24: even
  EXPECT_EQ(encode_fp16(std::ldexp(1.5f, -25)), 0x0001);
}

TEST(PackedE2M1, EveryByteSplitsLowNibbleFirst) {
  const DecodeTables& t = decode_tables();
  for (int c = 0; c < 256; ++c) {
    const auto byte = static_cast<uint8_t>(c);
    EXPECT_TRUE(same_bits(t.e2m1_pair[c][0], decode_e2m1(byte & 0xF)));
    EXPECT_TRUE(same_bits(t.e2m1_pair[c][1], decode_e2m1(byte >> 4)));
    EXPECT_EQ(pack_e2m1_pair(encode_e2m1(t.e2m1_pair[c][0]), encode_e2m1(t.e2m1_pair[c][1])), byte);
  }
}

}  // namespace
}  // namespace fp4moe::formats
