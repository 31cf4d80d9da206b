// Bit-exact scalar codecs between float32 and the element/scale types of FP4/FP8 checkpoints.
//
// Every encoder rounds to nearest, ties to even (RNE). Choices where the specs leave room:
//  - E2M1 (no Inf/NaN): |x| beyond 6 saturates to +-6; +-Inf saturate to +-6; NaN encodes as +6
//    (0x7), which is what PTX cvt.rn.satfinite.e2m1x2.f32 produces. Block quantizers reject NaN
//    before it gets here. The sign of zero is kept: -0.0 and negatives that round to zero give 0x8.
//  - E4M3fn (no Inf): saturating: |x| > 448 and +-Inf give +-448 (0x7E/0xFE); NaN gives 0x7F with
//    the input's sign (0x7F/0xFF). Subnormals m*2^-9 are exact; values below 2^-10 round to +-0.
//  - UE4M3 (NVFP4 block scale): the E4M3 codes with sign 0. Negative inputs and -0 encode as +0;
//    NaN as 0x7F. Decoding a byte with the sign bit set gives NaN: it is not a valid unsigned
//    scale.
//  - E8M0 (MX scale, 2^(x-127)): RNE on log2 in the mantissa sense: 2^k*(1+f) rounds up when f >
//  0.5
//    and at f == 0.5 to the even exponent field. Values below 2^-127 (zero, negatives, subnormal
//    float32) give 0x00 (2^-127, the smallest scale); values at or above 2^127.5 and +Inf give
//    0xFE (2^127, saturating); NaN gives 0xFF, the only NaN.
//  - BF16, FP16: IEEE semantics: overflow to Inf, NaN stays a quiet NaN with its sign, subnormals.
#pragma once

#include <array>
#include <bit>
#include <cstdint>

namespace fp4moe::formats {

// --- E2M1 (FP4): sign, 2 exponent bits, 1 mantissa bit, bias 1. 16 codes, low 4 bits used.
inline constexpr std::array<float, 16> kE2M1Values = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,
                                                      4.0f,  6.0f,  -0.0f, -0.5f, -1.0f, -1.5f,
                                                      -2.0f, -3.0f, -4.0f, -6.0f};
inline constexpr float kE2M1Max = 6.0f;
inline float decode_e2m1(uint8_t code) { return kE2M1Values[code & 0xF]; }
uint8_t encode_e2m1(float x);

// --- E4M3fn (FP8): sign, 4 exponent bits, 3 mantissa bits, bias 7, no Inf, NaN = S.1111.111.
inline constexpr float kE4M3Max = 448.0f;
float decode_e4m3(uint8_t code);
uint8_t encode_e4m3(float x);

// --- UE4M3: unsigned E4M3, the NVFP4 block scale.
float decode_ue4m3(uint8_t code);
uint8_t encode_ue4m3(float x);

// --- E8M0 / UE8M0: 2^(code-127), code 0xFF = NaN.
inline constexpr uint8_t kE8M0NaN = 0xFF;
float decode_e8m0(uint8_t code);
uint8_t encode_e8m0(float x);

// --- BF16 and FP16 (IEEE half), as raw 16-bit patterns.
inline float decode_bf16(uint16_t bits) { return std::bit_cast<float>(uint32_t{bits} << 16); }
uint16_t encode_bf16(float x);
float decode_fp16(uint16_t bits);
uint16_t encode_fp16(float x);

// --- Packed E2M1 pairs: element 2i in the LOW nibble, 2i+1 in the HIGH nibble (FORMATS.md §2).
inline uint8_t pack_e2m1_pair(uint8_t even, uint8_t odd) {
  return static_cast<uint8_t>((even & 0xF) | ((odd & 0xF) << 4));
}
inline uint8_t low_nibble(uint8_t byte) { return byte & 0xF; }
inline uint8_t high_nibble(uint8_t byte) { return byte >> 4; }

// Decode tables built once from the codecs above, for loops and kernels that want a lookup.
struct DecodeTables {
  std::array<float, 256> e4m3;
  std::array<float, 256> ue4m3;
  std::array<float, 256> e8m0;
  std::array<std::array<float, 2>, 256> e2m1_pair;  // packed byte -> {element 2i, element 2i+1}
};
const DecodeTables& decode_tables();

}  // namespace fp4moe::formats
