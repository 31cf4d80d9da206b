// Whole-tensor quantize/dequantize for the block formats of block.h, and the format table.
#include "formats/block.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>

#include "formats/scalar.h"

namespace fp4moe::formats {
namespace {

constexpr int kNvfp4Block = 16;
constexpr int kMxfp4Block = 32;
constexpr int kFp8Block = 128;
constexpr uint8_t kUe4m3One = 0x38;  // 1.0: ModelOpt's scale for an all-zero block
constexpr uint8_t kE8m0One = 127;    // 2^0

constexpr std::array<BlockFormatInfo, 4> kBlockFormats = {{
    {BlockFormat::kNvfp4, "nvfp4", 1, kNvfp4Block, ElementType::kE2M1, ScaleType::kUe4m3,
     kNvfp4Block / 2 + 1, true},
    {BlockFormat::kMxfp4, "mxfp4", 1, kMxfp4Block, ElementType::kE2M1, ScaleType::kE8m0,
     kMxfp4Block / 2 + 1, false},
    {BlockFormat::kFp8Block128, "fp8_block128", kFp8Block, kFp8Block, ElementType::kE4M3,
     ScaleType::kF32, kFp8Block* kFp8Block + 4, false},
    {BlockFormat::kFp8Block128Ue8m0, "fp8_block128_ue8m0", kFp8Block, kFp8Block, ElementType::kE4M3,
     ScaleType::kE8m0, kFp8Block* kFp8Block + 1, false},
}};

Error shape_error(std::string_view tensor, int64_t rows, int64_t cols, std::string_view format,
                  int block) {
  return Error{"tensor '" + std::string(tensor) + "' [" + std::to_string(rows) + ", " +
               std::to_string(cols) + "]: last dimension " + std::to_string(cols) +
               " is not a multiple of the " + std::string(format) + " block size " +
               std::to_string(block)};
}

Status check_block_shape(std::string_view tensor, int64_t rows, int64_t cols,
                         std::string_view format, int block) {
  if (rows < 0 || cols <= 0 || cols % block != 0) {
    return shape_error(tensor, rows, cols, format, block);
  }
  return Status::Ok();
}

// Finds the first NaN or Inf of a row-major [rows, cols] tensor (flat when cols is 0): quantizing
// one would write garbage scales silently, so it is an error that says where it is.
Status check_finite(std::string_view tensor, std::span<const float> x, int64_t cols) {
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) {
      const auto flat = static_cast<int64_t>(i);
      const std::string where =
          cols > 0 ? "[" + std::to_string(flat / cols) + ", " + std::to_string(flat % cols) + "]"
                   : std::to_string(flat);
      return Error{"tensor '" + std::string(tensor) + "': " + (std::isnan(x[i]) ? "NaN" : "Inf") +
                   " at element " + where + "; cannot quantize a non-finite value"};
    }
  }
  return Status::Ok();
}

float block_amax(const float* x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
}

size_t checked_size(int64_t rows, int64_t cols) {
  FP4MOE_CHECK(rows >= 0 && cols >= 0);
  return static_cast<size_t>(rows) * static_cast<size_t>(cols);
}

// Unbiased exponent of the power of two 2^floor(log2(a)), a > 0 finite (float32 subnormals too).
int floor_log2(float a) {
  int e = 0;
  std::frexp(a, &e);
  return e - 1;
}

// ceil(log2(a)) for a > 0 finite: floor, plus one unless a is a power of two.
int ceil_log2(float a) {
  const int e = floor_log2(a);
  return std::ldexp(1.0f, e) == a ? e : e + 1;
}

// E8M0 code of 2^exponent, clamped to the finite codes.
uint8_t e8m0_code(int exponent) { return static_cast<uint8_t>(std::clamp(exponent + 127, 0, 254)); }

}  // namespace

std::span<const BlockFormatInfo> block_formats() { return kBlockFormats; }

const BlockFormatInfo& block_format_info(BlockFormat format) {
  for (const auto& info : kBlockFormats) {
    if (info.format == format) return info;
  }
  FP4MOE_CHECK(false && "format missing from kBlockFormats");
  return kBlockFormats[0];
}

std::string_view mx_scale_rule_name(MxScaleRule rule) {
  switch (rule) {
    case MxScaleRule::kOcpFloor:
      return "ocp_floor";
    case MxScaleRule::kRoundUp:
      return "round_up";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// NVFP4

float nvfp4_tensor_scale_from_amax(float amax) { return amax / (6.0f * 448.0f); }

Result<float> nvfp4_tensor_scale(std::string_view tensor, std::span<const float> x) {
  FP4MOE_RETURN_IF_ERROR(check_finite(tensor, x, /*cols=*/0));
  float amax = 0.0f;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  return nvfp4_tensor_scale_from_amax(amax);
}

Status quantize_nvfp4(std::string_view tensor, std::span<const float> x, int64_t rows, int64_t cols,
                      float tensor_scale, std::span<uint8_t> packed,
                      std::span<uint8_t> block_scales) {
  FP4MOE_RETURN_IF_ERROR(check_block_shape(tensor, rows, cols, "NVFP4", kNvfp4Block));
  const size_t count = checked_size(rows, cols);
  FP4MOE_CHECK(x.size() == count && packed.size() == count / 2 &&
               block_scales.size() == count / kNvfp4Block);
  FP4MOE_RETURN_IF_ERROR(check_finite(tensor, x, cols));
  if (!(tensor_scale >= 0.0f) || !std::isfinite(tensor_scale)) {
    return Error{"tensor '" + std::string(tensor) + "': NVFP4 tensor scale " +
                 std::to_string(tensor_scale) + " is not a finite non-negative number"};
  }
  // ModelOpt computes 6 * scale_2 once, in float32, and divides each block amax by it.
  const float six_tensor_scale = 6.0f * tensor_scale;
  const size_t blocks = count / kNvfp4Block;
  for (size_t b = 0; b < blocks; ++b) {
    const float* block = x.data() + b * kNvfp4Block;
    const float amax = block_amax(block, kNvfp4Block);
    uint8_t* out = packed.data() + b * (kNvfp4Block / 2);
    if (tensor_scale == 0.0f) {
      // A zero tensor scale means an all-zero tensor. ModelOpt would emit NaN scales (0/0); we
      // choose ModelOpt's zero-block answer instead: scale 1.0 and zero codes.
      block_scales[b] = kUe4m3One;
      std::fill(out, out + kNvfp4Block / 2, uint8_t{0});
      continue;
    }
    // ModelOpt sets the scale to 1.0 where amax_block / (6 * scale_2) is exactly 0 (an all-zero
    // block, or one so small against the tensor that the float32 quotient underflows).
    const float ratio = amax / six_tensor_scale;
    const uint8_t scale_code = ratio == 0.0f ? kUe4m3One : encode_ue4m3(ratio);
    block_scales[b] = scale_code;
    // A scale that rounds to 0 in E4M3 gives divisor 0 and codes +-6 (or 6 for 0/0, NaN sorting
    // last as in ModelOpt's searchsorted); they dequantize to 0, exactly as ModelOpt's export.
    const float divisor = decode_ue4m3(scale_code) * tensor_scale;
    for (int i = 0; i < kNvfp4Block; i += 2) {
      const float even = block[i] / divisor;
      const float odd = block[i + 1] / divisor;
      // ModelOpt's _cast_fp4 takes the sign from (x < 0): an exact -0.0 becomes +0 (code 0).
      const uint8_t q_even = even == 0.0f ? uint8_t{0} : encode_e2m1(even);
      const uint8_t q_odd = odd == 0.0f ? uint8_t{0} : encode_e2m1(odd);
      out[i / 2] = pack_e2m1_pair(q_even, q_odd);
    }
  }
  return Status::Ok();
}

Status dequantize_nvfp4(std::string_view tensor, std::span<const uint8_t> packed,
                        std::span<const uint8_t> block_scales, float tensor_scale, int64_t rows,
                        int64_t cols, std::span<float> out) {
  FP4MOE_RETURN_IF_ERROR(check_block_shape(tensor, rows, cols, "NVFP4", kNvfp4Block));
  const size_t count = checked_size(rows, cols);
  FP4MOE_CHECK(out.size() == count && packed.size() == count / 2 &&
               block_scales.size() == count / kNvfp4Block);
  const DecodeTables& tables = decode_tables();
  const size_t blocks = count / kNvfp4Block;
  for (size_t b = 0; b < blocks; ++b) {
    const float scale = tables.ue4m3[block_scales[b]] * tensor_scale;
    const uint8_t* in = packed.data() + b * (kNvfp4Block / 2);
    float* dst = out.data() + b * kNvfp4Block;
    for (int i = 0; i < kNvfp4Block / 2; ++i) {
      const auto& pair = tables.e2m1_pair[in[i]];
      dst[2 * i] = pair[0] * scale;
      dst[2 * i + 1] = pair[1] * scale;
    }
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// MXFP4

namespace {

// E8M0 code of the block scale X for a block with maximum magnitude `amax` > 0.
uint8_t mx_scale_code(float amax, MxScaleRule rule) {
  int exponent = 0;
  switch (rule) {
    case MxScaleRule::kOcpFloor:
      // OCP MX v1.0: X = 2^(floor(log2(amax)) - emax_elem), emax of E2M1 = 2.
      exponent = floor_log2(amax) - 2;
      break;
    case MxScaleRule::kRoundUp:
      // X = 2^ceil(log2(amax / 6)), the quotient rounded in float32 as the GPU recipes compute it.
      exponent = ceil_log2(amax / 6.0f);
      break;
  }
  return e8m0_code(exponent);
}

}  // namespace

Status quantize_mxfp4(std::string_view tensor, std::span<const float> x, int64_t rows, int64_t cols,
                      MxScaleRule rule, std::span<uint8_t> packed, std::span<uint8_t> scales) {
  FP4MOE_RETURN_IF_ERROR(check_block_shape(tensor, rows, cols, "MXFP4", kMxfp4Block));
  const size_t count = checked_size(rows, cols);
  FP4MOE_CHECK(x.size() == count && packed.size() == count / 2 &&
               scales.size() == count / kMxfp4Block);
  FP4MOE_RETURN_IF_ERROR(check_finite(tensor, x, cols));
  const size_t blocks = count / kMxfp4Block;
  for (size_t b = 0; b < blocks; ++b) {
    const float* block = x.data() + b * kMxfp4Block;
    const float amax = block_amax(block, kMxfp4Block);
    const uint8_t code = amax == 0.0f ? kE8m0One : mx_scale_code(amax, rule);
    scales[b] = code;
    const float scale = decode_e8m0(code);
    uint8_t* out = packed.data() + b * (kMxfp4Block / 2);
    for (int i = 0; i < kMxfp4Block; i += 2) {
      // Division by a power of two is exact unless it underflows float32, which the scale choice
      // rules out for the block's large elements; tiny ones round to zero in E2M1 regardless.
      out[i / 2] = pack_e2m1_pair(encode_e2m1(block[i] / scale), encode_e2m1(block[i + 1] / scale));
    }
  }
  return Status::Ok();
}

Status dequantize_mxfp4(std::string_view tensor, std::span<const uint8_t> packed,
                        std::span<const uint8_t> scales, int64_t rows, int64_t cols,
                        std::span<float> out) {
  FP4MOE_RETURN_IF_ERROR(check_block_shape(tensor, rows, cols, "MXFP4", kMxfp4Block));
  const size_t count = checked_size(rows, cols);
  FP4MOE_CHECK(out.size() == count && packed.size() == count / 2 &&
               scales.size() == count / kMxfp4Block);
  const DecodeTables& tables = decode_tables();
  const size_t blocks = count / kMxfp4Block;
  for (size_t b = 0; b < blocks; ++b) {
    const float scale = tables.e8m0[scales[b]];
    const uint8_t* in = packed.data() + b * (kMxfp4Block / 2);
    float* dst = out.data() + b * kMxfp4Block;
    for (int i = 0; i < kMxfp4Block / 2; ++i) {
      const auto& pair = tables.e2m1_pair[in[i]];
      dst[2 * i] = pair[0] * scale;
      dst[2 * i + 1] = pair[1] * scale;
    }
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// FP8 block 128x128

int64_t fp8_block_scale_count(int64_t rows, int64_t cols) {
  return ((rows + kFp8Block - 1) / kFp8Block) * ((cols + kFp8Block - 1) / kFp8Block);
}

namespace {

Status check_fp8_shape(std::string_view tensor, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) {
    return Error{"tensor '" + std::string(tensor) +
                 "': FP8 block tensor needs a positive shape, got [" + std::to_string(rows) + ", " +
                 std::to_string(cols) + "]"};
  }
  return Status::Ok();
}

// Visits each 128x128 block (partial at the edges) with its index in the scale grid.
template <class Fn>
void for_each_fp8_block(int64_t rows, int64_t cols, Fn&& fn) {
  const int64_t grid_cols = (cols + kFp8Block - 1) / kFp8Block;
  for (int64_t r0 = 0; r0 < rows; r0 += kFp8Block) {
    for (int64_t c0 = 0; c0 < cols; c0 += kFp8Block) {
      const int64_t r1 = std::min(rows, r0 + kFp8Block);
      const int64_t c1 = std::min(cols, c0 + kFp8Block);
      fn((r0 / kFp8Block) * grid_cols + c0 / kFp8Block, r0, r1, c0, c1);
    }
  }
}

float fp8_block_amax(std::span<const float> x, int64_t cols, int64_t r0, int64_t r1, int64_t c0,
                     int64_t c1) {
  float amax = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    amax = std::max(amax, block_amax(x.data() + r * cols + c0, static_cast<int>(c1 - c0)));
  }
  return amax;
}

void fp8_block_encode(std::span<const float> x, int64_t cols, int64_t r0, int64_t r1, int64_t c0,
                      int64_t c1, float scale, std::span<uint8_t> q) {
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = c0; c < c1; ++c) q[r * cols + c] = encode_e4m3(x[r * cols + c] / scale);
  }
}

void fp8_block_decode(std::span<const uint8_t> q, int64_t cols, int64_t r0, int64_t r1, int64_t c0,
                      int64_t c1, float scale, std::span<float> out) {
  const DecodeTables& tables = decode_tables();
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = c0; c < c1; ++c) out[r * cols + c] = tables.e4m3[q[r * cols + c]] * scale;
  }
}

}  // namespace

namespace {

// The four FP8 entry points differ only in how a block's scale is chosen and stored.
template <class Scale, class Choose>
Status quantize_fp8_blocks(std::string_view tensor, std::span<const float> x, int64_t rows,
                           int64_t cols, std::span<uint8_t> q, std::span<Scale> scales,
                           Choose choose_scale) {
  FP4MOE_RETURN_IF_ERROR(check_fp8_shape(tensor, rows, cols));
  FP4MOE_CHECK(x.size() == checked_size(rows, cols) && q.size() == x.size() &&
               scales.size() == static_cast<size_t>(fp8_block_scale_count(rows, cols)));
  FP4MOE_RETURN_IF_ERROR(check_finite(tensor, x, cols));
  for_each_fp8_block(rows, cols, [&](int64_t s, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    const auto [stored, scale] = choose_scale(fp8_block_amax(x, cols, r0, r1, c0, c1));
    scales[s] = stored;
    fp8_block_encode(x, cols, r0, r1, c0, c1, scale, q);
  });
  return Status::Ok();
}

template <class Scale, class ToFloat>
Status dequantize_fp8_blocks(std::string_view tensor, std::span<const uint8_t> q,
                             std::span<const Scale> scales, int64_t rows, int64_t cols,
                             std::span<float> out, ToFloat to_float) {
  FP4MOE_RETURN_IF_ERROR(check_fp8_shape(tensor, rows, cols));
  FP4MOE_CHECK(out.size() == checked_size(rows, cols) && q.size() == out.size() &&
               scales.size() == static_cast<size_t>(fp8_block_scale_count(rows, cols)));
  for_each_fp8_block(rows, cols, [&](int64_t s, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    fp8_block_decode(q, cols, r0, r1, c0, c1, to_float(scales[s]), out);
  });
  return Status::Ok();
}

}  // namespace

Status quantize_fp8_block128(std::string_view tensor, std::span<const float> x, int64_t rows,
                             int64_t cols, std::span<uint8_t> q, std::span<float> scales) {
  return quantize_fp8_blocks(tensor, x, rows, cols, q, scales, [](float amax) {
    const float scale = amax == 0.0f ? 1.0f : amax / kE4M3Max;
    return std::pair{scale, scale};
  });
}

Status dequantize_fp8_block128(std::string_view tensor, std::span<const uint8_t> q,
                               std::span<const float> scales, int64_t rows, int64_t cols,
                               std::span<float> out) {
  return dequantize_fp8_blocks(tensor, q, scales, rows, cols, out, [](float s) { return s; });
}

Status quantize_fp8_block128_ue8m0(std::string_view tensor, std::span<const float> x, int64_t rows,
                                   int64_t cols, std::span<uint8_t> q, std::span<uint8_t> scales) {
  return quantize_fp8_blocks(tensor, x, rows, cols, q, scales, [](float amax) {
    // 2^ceil(log2(amax / 448)): the power of two at or above the FP8 scale, so nothing clips.
    const uint8_t code = amax == 0.0f ? kE8m0One : e8m0_code(ceil_log2(amax / kE4M3Max));
    return std::pair{code, decode_e8m0(code)};
  });
}

Status dequantize_fp8_block128_ue8m0(std::string_view tensor, std::span<const uint8_t> q,
                                     std::span<const uint8_t> scales, int64_t rows, int64_t cols,
                                     std::span<float> out) {
  return dequantize_fp8_blocks(tensor, q, scales, rows, cols, out,
                               [](uint8_t code) { return decode_e8m0(code); });
}

}  // namespace fp4moe::formats
