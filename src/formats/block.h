// Block-scaled formats: one table row per format, and whole-tensor quantize/dequantize for each.
//
// Tensors are seen as row-major [rows, cols] float32 matrices; `cols` is the innermost dimension,
// the one blocks run along (K, the input features, for a linear layer's weight [N, K]); `rows` is
// the product of all outer dimensions. Packed FP4 data is [rows, cols/2] with element 2i in the low
// nibble. Callers own every buffer: these functions stream and never allocate per tensor.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "core/status.h"

namespace fp4moe::formats {

enum class BlockFormat : uint8_t {
  kNvfp4,             // 16 x E2M1 + UE4M3 block scale + F32 per-tensor scale (NVIDIA ModelOpt)
  kMxfp4,             // 32 x E2M1 + E8M0 block scale (OCP Microscaling v1.0)
  kFp8Block128,       // 128x128 x E4M3 + F32 dequant scale (DeepSeek-V3 `weight_scale_inv`)
  kFp8Block128Ue8m0,  // 128x128 x E4M3 + E8M0 power-of-two scale (DeepSeek-V3.2/V4 `scale`)
};

enum class ElementType : uint8_t { kE2M1, kE4M3 };
enum class ScaleType : uint8_t { kUe4m3, kE8m0, kF32 };

struct BlockFormatInfo {
  BlockFormat format;
  std::string_view name;
  int block_rows;  // 1 for vector blocks, 128 for the FP8 2-D blocks
  int block_cols;  // elements along the innermost dimension
  ElementType element;
  ScaleType scale;
  int bytes_per_block;    // packed elements + one block scale (the per-tensor scale not included)
  bool has_tensor_scale;  // an extra F32 per-tensor scale (NVFP4's weight_scale_2)
};

// The format table. Adding a format = adding a row here plus its quantize/dequantize below.
std::span<const BlockFormatInfo> block_formats();
const BlockFormatInfo& block_format_info(BlockFormat format);

// MXFP4 has two incompatible scale rules under one name (FORMATS.md §2).
enum class MxScaleRule : uint8_t {
  kOcpFloor,  // X = 2^(floor(log2 amax) - 2): the OCP v1.0 rule; may clip the block max (default)
  kRoundUp,   // X = 2^ceil(log2(amax / 6)): cuBLAS RCEIL / TRT-LLM; never clips
};
std::string_view mx_scale_rule_name(MxScaleRule rule);

// ---------------------------------------------------------------------------------------------
// NVFP4. The recipe and op order of NVIDIA ModelOpt's NVFP4QTensor, in float32:
//   tensor_scale = amax(W) / (6 * 448)                      (stored as weight_scale_2)
//   block scale  = e4m3((amax_block / 6) / tensor_scale)    (1.0 where amax_block == 0)
//   element      = e2m1(x / (float(block scale) * tensor_scale))

// amax(x) / (6 * 448); an error naming `tensor` and the flat position of the first NaN or Inf.
Result<float> nvfp4_tensor_scale(std::string_view tensor, std::span<const float> x);
// The tensor scale for a known amax (e.g. max over w1 and w3 so they can share it).
float nvfp4_tensor_scale_from_amax(float amax);

// packed: rows*cols/2 bytes; block_scales: rows*cols/16 UE4M3 bytes. `tensor_scale` may come from
// a group of tensors. An all-zero tensor (tensor_scale 0) gives zero codes and block scales 1.0.
Status quantize_nvfp4(std::string_view tensor, std::span<const float> x, int64_t rows, int64_t cols,
                      float tensor_scale, std::span<uint8_t> packed,
                      std::span<uint8_t> block_scales);
// out[i] = e2m1(q) * (float(block scale) * tensor_scale): the block's scale product first, as
// ModelOpt's NVFP4QTensor.dequantize does (the order changes float32 rounding, so it is pinned).
Status dequantize_nvfp4(std::string_view tensor, std::span<const uint8_t> packed,
                        std::span<const uint8_t> block_scales, float tensor_scale, int64_t rows,
                        int64_t cols, std::span<float> out);

// ---------------------------------------------------------------------------------------------
// MXFP4: element = e2m1(x / X) with X from `rule`; an all-zero block gets X = 1.0 (code 127).
Status quantize_mxfp4(std::string_view tensor, std::span<const float> x, int64_t rows, int64_t cols,
                      MxScaleRule rule, std::span<uint8_t> packed, std::span<uint8_t> scales);
// out = e2m1(q) * 2^(s - 127); a scale of 0xFF (NaN) decodes as NaN, as the spec says.
Status dequantize_mxfp4(std::string_view tensor, std::span<const uint8_t> packed,
                        std::span<const uint8_t> scales, int64_t rows, int64_t cols,
                        std::span<float> out);

// ---------------------------------------------------------------------------------------------
// FP8 block 128x128 (DeepSeek-V3): scale = amax_block / 448, q = e4m3(x / scale), stored scale is
// the dequant multiplier ("weight_scale_inv"). Edge blocks may be partial: the scale grid is
// [ceil(rows/128), ceil(cols/128)], as DeepSeek stores it. An all-zero block gets scale 1.0.
int64_t fp8_block_scale_count(int64_t rows, int64_t cols);
Status quantize_fp8_block128(std::string_view tensor, std::span<const float> x, int64_t rows,
                             int64_t cols, std::span<uint8_t> q, std::span<float> scales);
Status dequantize_fp8_block128(std::string_view tensor, std::span<const uint8_t> q,
                               std::span<const float> scales, int64_t rows, int64_t cols,
                               std::span<float> out);
// UE8M0 variant (DeepSeek-V3.2/V4 `scale_fmt: ue8m0`): scale = 2^ceil(log2(amax_block / 448)).
Status quantize_fp8_block128_ue8m0(std::string_view tensor, std::span<const float> x, int64_t rows,
                                   int64_t cols, std::span<uint8_t> q, std::span<uint8_t> scales);
Status dequantize_fp8_block128_ue8m0(std::string_view tensor, std::span<const uint8_t> q,
                                     std::span<const uint8_t> scales, int64_t rows, int64_t cols,
                                     std::span<float> out);

}  // namespace fp4moe::formats
