// One lane of AVX512-BF16's vdpbf16ps, written out: the arithmetic of the BF16-activation kernel
// family (kernels/types.h). The scalar kernels of the family run it, and the SIMDe-emulated test
// build uses it in place of SIMDe's own vdpbf16ps (tests/emulation/simde_avx512/immintrin.h), so
// every kernel of the family gives the same bits on every host the tests reach.
//
// The definition (Intel SDM, VDPBF16PS): the odd pair's product is added first, then the even
// pair's, each addition rounded to nearest-even; BF16 inputs that are subnormal read as zero (DAZ)
// and subnormal results are flushed to zero (FTZ); MXCSR is neither read nor written. Checked on
// the 2-core Zen 4 of stop 28 over 3.2 million random lanes, subnormal inputs included: no
// difference (the even-first order differed in 6% of lanes, one rounding of the exact sum in 4%).
// A product of two BF16 values is exact in F32 (8 + 8 significant bits), so it does not matter
// whether the compiler fuses the multiply into the add.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "formats/scalar.h"

namespace fp4moe::kernels {

// The E2M1 value of `code` as BF16 bits (exact: E2M1 has 1 mantissa bit, BF16 7), -0 as +0 as
// the F32 kernels' tables have it (an exact zero product either way).
constexpr uint16_t e2m1_bf16_bits(int code) {
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(formats::kE2M1Values[code & 0xF] + 0.0f) >>
                               16);
}
static_assert(e2m1_bf16_bits(1) == 0x3F00 && e2m1_bf16_bits(7) == 0x40C0 &&
              e2m1_bf16_bits(15) == 0xC0C0 && e2m1_bf16_bits(8) == 0);

// The E4M3 (FP8) value of `code` as BF16 bits, exact: E4M3 has at most 4 significant bits, and
// its subnormals (m * 2^-9) are BF16 normals, so vdpbf16ps's DAZ never sees them. -0 stays -0 (the
// sign bit is OR-ed in, as the AVX512-BF16 kernel does), NaN (S.1111.111) a quiet BF16 NaN here
// and in the VBMI tables (pack/ rejects NaN codes, so no kernel meets one: the FP16 route would
// read them as +-480).
constexpr uint16_t e4m3_bf16_bits(int code) {
  const int sign = (code & 0x80) << 8, mag = code & 0x7F, e = mag >> 3, m = mag & 7;
  if (mag == 0x7F) return static_cast<uint16_t>(sign | 0x7FC0);
  if (mag == 0) return static_cast<uint16_t>(sign);
  if (e > 0) return static_cast<uint16_t>(sign | (e + 120) << 7 | m << 4);
  const int p = m >= 4 ? 2 : m >= 2 ? 1 : 0;  // m * 2^-9 = (m / 2^p) * 2^(p - 9), normalized
  return static_cast<uint16_t>(sign | (118 + p) << 7 | ((m << (7 - p)) & 0x7F));
}
static_assert(e4m3_bf16_bits(0x38) == 0x3F80 && e4m3_bf16_bits(0x7E) == 0x43E0 &&
              e4m3_bf16_bits(0x01) == 0x3B00 && e4m3_bf16_bits(0x83) == 0xBBC0 &&
              e4m3_bf16_bits(0x80) == 0x8000);

// Zero (of the same sign) for an F32 subnormal, the value itself otherwise.
inline float bf16_flush_subnormal(float v) {
  return std::fabs(v) < std::numeric_limits<float>::min() ? std::copysign(0.0f, v) : v;
}

// acc + a_odd * b_odd, then + a_even * b_even, as vdpbf16ps computes one F32 lane.
inline float bf16_pair_dot(float acc, uint16_t a_even, uint16_t a_odd, uint16_t b_even,
                           uint16_t b_odd) {
  auto value = [](uint16_t bits) { return bf16_flush_subnormal(formats::decode_bf16(bits)); };
  acc = bf16_flush_subnormal(acc + value(a_odd) * value(b_odd));
  return bf16_flush_subnormal(acc + value(a_even) * value(b_even));
}

}  // namespace fp4moe::kernels
