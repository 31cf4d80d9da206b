// Scalar codecs: the bit-exact source of truth for every element and scale type (see scalar.h).
#include "formats/scalar.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace fp4moe::formats {
namespace {

// Magnitude code of |a| (finite, > 0) rounded to nearest-even in a binary format with `man_bits`
// mantissa bits and exponent bias `bias` (subnormals included). The result may exceed the format's
// largest code: callers saturate. A mantissa that rounds up to 2.0 carries into the exponent field
// by the plain addition below, which is exactly the IEEE encoding of the next binade.
uint32_t round_to_nearest_even_magnitude(double a, int man_bits, int bias) {
  int frexp_exponent = 0;
  std::frexp(a, &frexp_exponent);  // a = f * 2^e with f in [0.5, 1)
  const int exponent = frexp_exponent - 1;
  const int min_normal_exponent = 1 - bias;
  if (exponent < min_normal_exponent) {
    // Subnormal: an integer count of the smallest step 2^(min_normal_exponent - man_bits); a count
    // of 2^man_bits is the smallest normal, whose code follows the subnormals contiguously.
    return static_cast<uint32_t>(std::nearbyint(std::ldexp(a, man_bits - min_normal_exponent)));
  }
  const double mantissa = std::ldexp(a, -exponent);  // [1, 2), exact
  const auto fraction =
      static_cast<uint32_t>(std::nearbyint((mantissa - 1.0) * static_cast<double>(1u << man_bits)));
  return (static_cast<uint32_t>(exponent + bias) << man_bits) + fraction;
}

bool sign_bit(float x) { return std::signbit(x); }

}  // namespace

uint8_t encode_e2m1(float x) {
  if (std::isnan(x)) return 0x7;  // no NaN in E2M1: saturate to +max (documented in scalar.h)
  const uint8_t sign = sign_bit(x) ? 0x8 : 0x0;
  const float a = std::fabs(x);
  // With only 8 magnitudes, RNE is a count of the rounding boundaries below |x| (the midpoints
  // between neighbours), plus one at the three midpoints whose upper neighbour has the even code.
  // Equivalent to the generic rounding above, checked exhaustively against ml_dtypes, and the hot
  // path of every FP4 quantizer.
  uint8_t magnitude = static_cast<uint8_t>((a > 0.25f) + (a > 0.75f) + (a > 1.25f) + (a > 1.75f) +
                                           (a > 2.5f) + (a > 3.5f) + (a > 5.0f));
  magnitude += static_cast<uint8_t>(a == 0.75f || a == 1.75f || a == 3.5f);
  return static_cast<uint8_t>(sign | magnitude);
}

float decode_e4m3(uint8_t code) {
  const uint8_t magnitude = code & 0x7F;
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  if (magnitude == 0x7F) return std::copysign(std::numeric_limits<float>::quiet_NaN(), sign);
  const int exponent_field = magnitude >> 3;
  const int mantissa = magnitude & 0x7;
  if (exponent_field == 0) return sign * std::ldexp(static_cast<float>(mantissa), -9);
  return sign * std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent_field - 7);
}

uint8_t encode_e4m3(float x) {
  const uint8_t sign = sign_bit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7F;
  const double a = std::fabs(static_cast<double>(x));
  if (a == 0.0) return sign;
  if (a > kE4M3Max) return sign | 0x7E;  // satfinite: also catches Inf
  const uint32_t magnitude = round_to_nearest_even_magnitude(a, /*man_bits=*/3, /*bias=*/7);
  return static_cast<uint8_t>(sign | (magnitude > 0x7E ? 0x7E : magnitude));
}

float decode_ue4m3(uint8_t code) {
  if (code & 0x80) return std::numeric_limits<float>::quiet_NaN();  // not a valid unsigned scale
  return decode_e4m3(code);
}

uint8_t encode_ue4m3(float x) {
  if (std::isnan(x)) return 0x7F;
  if (!(x > 0.0f)) return 0x00;  // negatives and -0 clamp to +0: a scale has no sign
  return encode_e4m3(x);
}

float decode_e8m0(uint8_t code) {
  if (code == kE8M0NaN) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(code) - 127);  // 2^-127 is a float32 subnormal: exact
}

uint8_t encode_e8m0(float x) {
  if (std::isnan(x)) return kE8M0NaN;
  if (!(x >= std::ldexp(1.0f, -127))) return 0x00;  // below the range, zero, negative: saturate
  if (std::isinf(x)) return 0xFE;
  int frexp_exponent = 0;
  const double fraction = std::frexp(static_cast<double>(x), &frexp_exponent);  // [0.5, 1)
  int exponent = frexp_exponent - 1;
  // No mantissa bit is left to be "even": a tie (mantissa exactly 1.5) rounds up, as ml_dtypes.
  if (fraction >= 0.75) ++exponent;
  const int code = exponent + 127;
  return static_cast<uint8_t>(code > 0xFE ? 0xFE : code);
}

uint16_t encode_bf16(float x) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x0040);  // keep sign, quiet
  // Round to nearest even on the 16 dropped bits; a carry into the exponent is the right result,
  // including overflow to Inf.
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

float decode_fp16(uint16_t bits) {
  const float sign = (bits & 0x8000) ? -1.0f : 1.0f;
  const int exponent_field = (bits >> 10) & 0x1F;
  const int mantissa = bits & 0x3FF;
  if (exponent_field == 0x1F) {
    return mantissa ? std::copysign(std::numeric_limits<float>::quiet_NaN(), sign)
                    : sign * std::numeric_limits<float>::infinity();
  }
  if (exponent_field == 0) return sign * std::ldexp(static_cast<float>(mantissa), -24);
  return sign * std::ldexp(1.0f + static_cast<float>(mantissa) / 1024.0f, exponent_field - 15);
}

uint16_t encode_fp16(float x) {
  const uint16_t sign = sign_bit(x) ? 0x8000 : 0x0000;
  if (std::isnan(x)) {
    // Keep the top payload bits and force quiet, as hardware conversions do.
    const uint32_t payload = (std::bit_cast<uint32_t>(x) >> 13) & 0x3FF;
    return static_cast<uint16_t>(sign | 0x7E00 | payload);
  }
  const double a = std::fabs(static_cast<double>(x));
  if (a == 0.0) return sign;
  if (std::isinf(a)) return sign | 0x7C00;
  const uint32_t magnitude = round_to_nearest_even_magnitude(a, /*man_bits=*/10, /*bias=*/15);
  return static_cast<uint16_t>(sign | (magnitude >= 0x7C00 ? 0x7C00 : magnitude));  // overflow: Inf
}

const DecodeTables& decode_tables() {
  static const DecodeTables tables = [] {
    DecodeTables t{};
    for (int code = 0; code < 256; ++code) {
      const auto byte = static_cast<uint8_t>(code);
      t.e4m3[code] = decode_e4m3(byte);
      t.ue4m3[code] = decode_ue4m3(byte);
      t.e8m0[code] = decode_e8m0(byte);
      t.e2m1_pair[code] = {decode_e2m1(low_nibble(byte)), decode_e2m1(high_nibble(byte))};
    }
    return t;
  }();
  return tables;
}

}  // namespace fp4moe::formats
