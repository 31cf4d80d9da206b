// C ABI over formats/: thin adapters from pointers and sizes to the C++ API (see fp4moe_c.h).
// Each entry point checks every buffer against its shape (capi/bounds.h) before the C++ API runs.
#include "capi/fp4moe_c.h"

#include <cmath>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "capi/bounds.h"
#include "formats/block.h"
#include "formats/scalar.h"
#include "formats/transcode.h"

namespace {

using fp4moe::Error;
using fp4moe::Result;
using fp4moe::Status;
using fp4moe::capi::check_buffer;
using fp4moe::capi::element_count;
using fp4moe::capi::finish;
using fp4moe::capi::shape_string;
using fp4moe::capi::span_of;
namespace f = fp4moe::formats;

// ---------------------------------------------------------------------------------------------
// Element codecs

// One row per element codec: its name and its byte (or uint16) encoder and decoder.
struct CodecRow {
  std::string_view name;
  uint8_t (*encode8)(float);
  float (*decode8)(uint8_t);
  uint16_t (*encode16)(float);  // set for the 16-bit codecs instead of the byte pair
  float (*decode16)(uint16_t);
};

const CodecRow kCodecs[] = {
    {"e2m1", f::encode_e2m1, f::decode_e2m1, nullptr, nullptr},
    {"e4m3", f::encode_e4m3, f::decode_e4m3, nullptr, nullptr},
    {"ue4m3", f::encode_ue4m3, f::decode_ue4m3, nullptr, nullptr},
    {"e8m0", f::encode_e8m0, f::decode_e8m0, nullptr, nullptr},
    {"bf16", nullptr, nullptr, f::encode_bf16, f::decode_bf16},
    {"fp16", nullptr, nullptr, f::encode_fp16, f::decode_fp16},
};

Result<const CodecRow*> parse_codec(const char* kind) {
  if (kind == nullptr) return Error{"argument 'kind' is null"};
  std::string names;
  for (const CodecRow& row : kCodecs) {
    if (row.name == kind) return &row;
    names += (names.empty() ? "" : ", ") + std::string(row.name);
  }
  return Error{"unknown kind '" + std::string(kind) + "' (expected one of " + names + ")"};
}

// Checks x (floats) and codes (bytes or uint16s, by codec) against n values.
Status check_codec_buffers(const CodecRow& codec, const float* x, size_t x_size, const void* codes,
                           size_t codes_size, size_t n) {
  const std::string needer = "the shape [" + std::to_string(n) + "]";
  FP4MOE_RETURN_IF_ERROR(check_buffer("x", x, x_size, n, needer));
  if (codec.encode16 != nullptr) {
    return check_buffer("codes", static_cast<const uint16_t*>(codes), codes_size, n, needer);
  }
  return check_buffer("codes", static_cast<const uint8_t*>(codes), codes_size, n, needer);
}

Status encode(const char* kind, const float* x, size_t x_size, void* codes, size_t codes_size,
              size_t n) {
  auto codec = parse_codec(kind);
  if (!codec.ok()) return codec.error();
  FP4MOE_RETURN_IF_ERROR(check_codec_buffers(**codec, x, x_size, codes, codes_size, n));
  const CodecRow& c = **codec;
  for (size_t i = 0; i < n; ++i) {
    if (c.encode16 != nullptr) {
      static_cast<uint16_t*>(codes)[i] = c.encode16(x[i]);
    } else {
      static_cast<uint8_t*>(codes)[i] = c.encode8(x[i]);
    }
  }
  return Status::Ok();
}

Status decode(const char* kind, const void* codes, size_t codes_size, float* x, size_t x_size,
              size_t n) {
  auto codec = parse_codec(kind);
  if (!codec.ok()) return codec.error();
  FP4MOE_RETURN_IF_ERROR(check_codec_buffers(**codec, x, x_size, codes, codes_size, n));
  const CodecRow& c = **codec;
  for (size_t i = 0; i < n; ++i) {
    x[i] = c.decode16 != nullptr ? c.decode16(static_cast<const uint16_t*>(codes)[i])
                                 : c.decode8(static_cast<const uint8_t*>(codes)[i]);
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Block formats

// Elements of an FP4 tensor [rows, cols] with `block` elements per scale: 0 for a shape formats/
// rejects (it reports the shape), an Error when the count overflows.
Result<size_t> fp4_elements(int64_t rows, int64_t cols, int block) {
  return element_count(rows, cols, rows >= 0 && cols > 0 && cols % block == 0);
}

// Elements per block scale, from the format table (formats/block.h).
const int kNvBlock = f::block_format_info(f::BlockFormat::kNvfp4).block_cols;
const int kMxBlock = f::block_format_info(f::BlockFormat::kMxfp4).block_cols;

Status quantize_nvfp4(const float* x, size_t x_size, int64_t rows, int64_t cols,
                      float tensor_scale_in, uint8_t* packed, size_t packed_size,
                      uint8_t* block_scales, size_t block_scales_size, float* tensor_scale_out) {
  auto count = fp4_elements(rows, cols, kNvBlock);
  if (!count.ok()) return count.error();
  const size_t n = *count;
  const std::string shape = "the shape " + shape_string(rows, cols);
  FP4MOE_RETURN_IF_ERROR(check_buffer("x", x, x_size, n, shape));
  FP4MOE_RETURN_IF_ERROR(check_buffer("packed", packed, packed_size, n / 2, shape));
  FP4MOE_RETURN_IF_ERROR(
      check_buffer("block_scales", block_scales, block_scales_size, n / kNvBlock, shape));
  FP4MOE_RETURN_IF_ERROR(check_buffer("tensor_scale_out", tensor_scale_out, 1, 1, "the result"));
  const std::span<const float> input = span_of(x, n);
  float tensor_scale = tensor_scale_in;
  if (std::isnan(tensor_scale)) {
    auto computed = f::nvfp4_tensor_scale("x", input);
    if (!computed.ok()) return computed.error();
    tensor_scale = *computed;
  }
  *tensor_scale_out = tensor_scale;
  return f::quantize_nvfp4("x", input, rows, cols, tensor_scale, span_of(packed, n / 2),
                           span_of(block_scales, n / kNvBlock));
}

Status dequantize_nvfp4(const uint8_t* packed, size_t packed_size, const uint8_t* block_scales,
                        size_t block_scales_size, float tensor_scale, int64_t rows, int64_t cols,
                        float* out, size_t out_size) {
  auto count = fp4_elements(rows, cols, kNvBlock);
  if (!count.ok()) return count.error();
  const size_t n = *count;
  const std::string shape = "the shape " + shape_string(rows, cols);
  FP4MOE_RETURN_IF_ERROR(check_buffer("packed", packed, packed_size, n / 2, shape));
  FP4MOE_RETURN_IF_ERROR(
      check_buffer("block_scales", block_scales, block_scales_size, n / kNvBlock, shape));
  FP4MOE_RETURN_IF_ERROR(check_buffer("out", out, out_size, n, shape));
  return f::dequantize_nvfp4("x", span_of(packed, n / 2), span_of(block_scales, n / kNvBlock),
                             tensor_scale, rows, cols, span_of(out, n));
}

Status quantize_mxfp4(const float* x, size_t x_size, int64_t rows, int64_t cols, int rule,
                      uint8_t* packed, size_t packed_size, uint8_t* scales, size_t scales_size) {
  auto count = fp4_elements(rows, cols, kMxBlock);
  if (!count.ok()) return count.error();
  const size_t n = *count;
  const std::string shape = "the shape " + shape_string(rows, cols);
  FP4MOE_RETURN_IF_ERROR(check_buffer("x", x, x_size, n, shape));
  FP4MOE_RETURN_IF_ERROR(check_buffer("packed", packed, packed_size, n / 2, shape));
  FP4MOE_RETURN_IF_ERROR(check_buffer("scales", scales, scales_size, n / kMxBlock, shape));
  const auto mx_rule = rule == 0 ? f::MxScaleRule::kOcpFloor : f::MxScaleRule::kRoundUp;
  return f::quantize_mxfp4("x", span_of(x, n), rows, cols, mx_rule, span_of(packed, n / 2),
                           span_of(scales, n / kMxBlock));
}

Status dequantize_mxfp4(const uint8_t* packed, size_t packed_size, const uint8_t* scales,
                        size_t scales_size, int64_t rows, int64_t cols, float* out,
                        size_t out_size) {
  auto count = fp4_elements(rows, cols, kMxBlock);
  if (!count.ok()) return count.error();
  const size_t n = *count;
  const std::string shape = "the shape " + shape_string(rows, cols);
  FP4MOE_RETURN_IF_ERROR(check_buffer("packed", packed, packed_size, n / 2, shape));
  FP4MOE_RETURN_IF_ERROR(check_buffer("scales", scales, scales_size, n / kMxBlock, shape));
  FP4MOE_RETURN_IF_ERROR(check_buffer("out", out, out_size, n, shape));
  return f::dequantize_mxfp4("x", span_of(packed, n / 2), span_of(scales, n / kMxBlock), rows, cols,
                             span_of(out, n));
}

// Elements and scale-grid cells of an FP8 block tensor: 0 for a shape formats/ rejects.
struct Fp8Counts {
  size_t elements = 0;
  size_t scales = 0;
};

Result<Fp8Counts> fp8_counts(int64_t rows, int64_t cols) {
  auto count = element_count(rows, cols, rows > 0 && cols > 0);
  if (!count.ok()) return count.error();
  if (*count == 0) return Fp8Counts{};
  // The grid has no more cells than the tensor has elements, so it fits too.
  const auto& info = f::block_format_info(f::BlockFormat::kFp8Block128);
  const int64_t grid =
      fp4moe::capi::ceil_div(rows, info.block_rows) * fp4moe::capi::ceil_div(cols, info.block_cols);
  return Fp8Counts{*count, static_cast<size_t>(grid)};
}

// The typed view of an FP8 block tensor's scales: F32 (ue8m0 = 0) or E8M0 bytes.
template <class Scale>
Status check_fp8_scales(const void* scales, size_t scales_size, size_t needed,
                        const std::string& shape) {
  return check_buffer("scales", static_cast<const Scale*>(scales), scales_size, needed, shape);
}

Status quantize_fp8_block128(const float* x, size_t x_size, int64_t rows, int64_t cols, int ue8m0,
                             uint8_t* q, size_t q_size, void* scales, size_t scales_size) {
  auto counts = fp8_counts(rows, cols);
  if (!counts.ok()) return counts.error();
  const size_t n = counts->elements;
  const size_t s = counts->scales;
  const std::string shape = "the shape " + shape_string(rows, cols);
  FP4MOE_RETURN_IF_ERROR(check_buffer("x", x, x_size, n, shape));
  FP4MOE_RETURN_IF_ERROR(check_buffer("q", q, q_size, n, shape));
  if (ue8m0) {
    FP4MOE_RETURN_IF_ERROR(check_fp8_scales<uint8_t>(scales, scales_size, s, shape));
    return f::quantize_fp8_block128_ue8m0("x", span_of(x, n), rows, cols, span_of(q, n),
                                          span_of(static_cast<uint8_t*>(scales), s));
  }
  FP4MOE_RETURN_IF_ERROR(check_fp8_scales<float>(scales, scales_size, s, shape));
  return f::quantize_fp8_block128("x", span_of(x, n), rows, cols, span_of(q, n),
                                  span_of(static_cast<float*>(scales), s));
}

Status dequantize_fp8_block128(const uint8_t* q, size_t q_size, const void* scales,
                               size_t scales_size, int64_t rows, int64_t cols, int ue8m0,
                               float* out, size_t out_size) {
  auto counts = fp8_counts(rows, cols);
  if (!counts.ok()) return counts.error();
  const size_t n = counts->elements;
  const size_t s = counts->scales;
  const std::string shape = "the shape " + shape_string(rows, cols);
  FP4MOE_RETURN_IF_ERROR(check_buffer("q", q, q_size, n, shape));
  if (ue8m0) {
    FP4MOE_RETURN_IF_ERROR(check_fp8_scales<uint8_t>(scales, scales_size, s, shape));
  } else {
    FP4MOE_RETURN_IF_ERROR(check_fp8_scales<float>(scales, scales_size, s, shape));
  }
  FP4MOE_RETURN_IF_ERROR(check_buffer("out", out, out_size, n, shape));
  if (ue8m0) {
    return f::dequantize_fp8_block128_ue8m0("x", span_of(q, n),
                                            span_of(static_cast<const uint8_t*>(scales), s), rows,
                                            cols, span_of(out, n));
  }
  return f::dequantize_fp8_block128("x", span_of(q, n),
                                    span_of(static_cast<const float*>(scales), s), rows, cols,
                                    span_of(out, n));
}

// ---------------------------------------------------------------------------------------------
// Transcoding

// An array argument of `count` entries (pointers, sizes or dimensions) must not be null.
Status check_array(std::string_view name, const void* array, size_t count) {
  if (array == nullptr && count > 0) {
    return Error{"argument '" + std::string(name) + "' is null, count " + std::to_string(count) +
                 " needs " + std::to_string(count) + " entries"};
  }
  return Status::Ok();
}

Result<f::TranscodeReport> transcode_mxfp4_to_nvfp4(
    size_t count, const uint8_t* const* packed, const size_t* packed_sizes,
    const uint8_t* const* scales, const size_t* scales_sizes, const int64_t* rows,
    const int64_t* cols, uint8_t* const* out_packed, const size_t* out_packed_sizes,
    uint8_t* const* out_block_scales, const size_t* out_block_scales_sizes,
    const float* tensor_scale_out, const int64_t* counts_out, size_t counts_out_size,
    const double* errors_out, size_t errors_out_size) {
  FP4MOE_RETURN_IF_ERROR(check_array("packed", packed, count));
  FP4MOE_RETURN_IF_ERROR(check_array("packed_sizes", packed_sizes, count));
  FP4MOE_RETURN_IF_ERROR(check_array("scales", scales, count));
  FP4MOE_RETURN_IF_ERROR(check_array("scales_sizes", scales_sizes, count));
  FP4MOE_RETURN_IF_ERROR(check_array("rows", rows, count));
  FP4MOE_RETURN_IF_ERROR(check_array("cols", cols, count));
  FP4MOE_RETURN_IF_ERROR(check_array("out_packed", out_packed, count));
  FP4MOE_RETURN_IF_ERROR(check_array("out_packed_sizes", out_packed_sizes, count));
  FP4MOE_RETURN_IF_ERROR(check_array("out_block_scales", out_block_scales, count));
  FP4MOE_RETURN_IF_ERROR(check_array("out_block_scales_sizes", out_block_scales_sizes, count));
  FP4MOE_RETURN_IF_ERROR(check_buffer("tensor_scale_out", tensor_scale_out, 1, 1, "the result"));
  FP4MOE_RETURN_IF_ERROR(check_buffer("counts_out", counts_out, counts_out_size, 4, "the report"));
  FP4MOE_RETURN_IF_ERROR(check_buffer("errors_out", errors_out, errors_out_size, 2, "the report"));
  std::vector<f::Mxfp4Source> sources(count);
  std::vector<f::Nvfp4Destination> destinations(count);
  for (size_t i = 0; i < count; ++i) {
    auto elements = fp4_elements(rows[i], cols[i], kMxBlock);
    if (!elements.ok()) return elements.error();
    const size_t n = *elements;
    const std::string shape = "the shape " + shape_string(rows[i], cols[i]);
    const std::string at = "[" + std::to_string(i) + "]";
    FP4MOE_RETURN_IF_ERROR(check_buffer("packed" + at, packed[i], packed_sizes[i], n / 2, shape));
    FP4MOE_RETURN_IF_ERROR(
        check_buffer("scales" + at, scales[i], scales_sizes[i], n / kMxBlock, shape));
    FP4MOE_RETURN_IF_ERROR(
        check_buffer("out_packed" + at, out_packed[i], out_packed_sizes[i], n / 2, shape));
    FP4MOE_RETURN_IF_ERROR(check_buffer("out_block_scales" + at, out_block_scales[i],
                                        out_block_scales_sizes[i], n / kNvBlock, shape));
    sources[i] = {"tensor" + std::to_string(i), span_of(packed[i], n / 2),
                  span_of(scales[i], n / kMxBlock), rows[i], cols[i]};
    destinations[i] = {span_of(out_packed[i], n / 2), span_of(out_block_scales[i], n / kNvBlock)};
  }
  return f::transcode_mxfp4_to_nvfp4(sources, destinations);
}

}  // namespace

extern "C" {

int fp4moe_abi_version(void) { return FP4MOE_C_ABI_VERSION; }

int fp4moe_encode(const char* kind, const float* x, size_t x_size, void* codes, size_t codes_size,
                  size_t n, char* error, size_t error_size) {
  return finish(encode(kind, x, x_size, codes, codes_size, n), error, error_size);
}

int fp4moe_decode(const char* kind, const void* codes, size_t codes_size, float* x, size_t x_size,
                  size_t n, char* error, size_t error_size) {
  return finish(decode(kind, codes, codes_size, x, x_size, n), error, error_size);
}

int fp4moe_quantize_nvfp4(const float* x, size_t x_size, int64_t rows, int64_t cols,
                          float tensor_scale_in, uint8_t* packed, size_t packed_size,
                          uint8_t* block_scales, size_t block_scales_size, float* tensor_scale_out,
                          char* error, size_t error_size) {
  return finish(quantize_nvfp4(x, x_size, rows, cols, tensor_scale_in, packed, packed_size,
                               block_scales, block_scales_size, tensor_scale_out),
                error, error_size);
}

int fp4moe_dequantize_nvfp4(const uint8_t* packed, size_t packed_size, const uint8_t* block_scales,
                            size_t block_scales_size, float tensor_scale, int64_t rows,
                            int64_t cols, float* out, size_t out_size, char* error,
                            size_t error_size) {
  return finish(dequantize_nvfp4(packed, packed_size, block_scales, block_scales_size, tensor_scale,
                                 rows, cols, out, out_size),
                error, error_size);
}

int fp4moe_quantize_mxfp4(const float* x, size_t x_size, int64_t rows, int64_t cols, int rule,
                          uint8_t* packed, size_t packed_size, uint8_t* scales, size_t scales_size,
                          char* error, size_t error_size) {
  return finish(
      quantize_mxfp4(x, x_size, rows, cols, rule, packed, packed_size, scales, scales_size), error,
      error_size);
}

int fp4moe_dequantize_mxfp4(const uint8_t* packed, size_t packed_size, const uint8_t* scales,
                            size_t scales_size, int64_t rows, int64_t cols, float* out,
                            size_t out_size, char* error, size_t error_size) {
  return finish(
      dequantize_mxfp4(packed, packed_size, scales, scales_size, rows, cols, out, out_size), error,
      error_size);
}

int fp4moe_quantize_fp8_block128(const float* x, size_t x_size, int64_t rows, int64_t cols,
                                 int ue8m0, uint8_t* q, size_t q_size, void* scales,
                                 size_t scales_size, char* error, size_t error_size) {
  return finish(quantize_fp8_block128(x, x_size, rows, cols, ue8m0, q, q_size, scales, scales_size),
                error, error_size);
}

int fp4moe_dequantize_fp8_block128(const uint8_t* q, size_t q_size, const void* scales,
                                   size_t scales_size, int64_t rows, int64_t cols, int ue8m0,
                                   float* out, size_t out_size, char* error, size_t error_size) {
  return finish(
      dequantize_fp8_block128(q, q_size, scales, scales_size, rows, cols, ue8m0, out, out_size),
      error, error_size);
}

int fp4moe_transcode_mxfp4_to_nvfp4(size_t count, const uint8_t* const* packed,
                                    const size_t* packed_sizes, const uint8_t* const* scales,
                                    const size_t* scales_sizes, const int64_t* rows,
                                    const int64_t* cols, uint8_t* const* out_packed,
                                    const size_t* out_packed_sizes,
                                    uint8_t* const* out_block_scales,
                                    const size_t* out_block_scales_sizes, float* tensor_scale_out,
                                    int64_t* counts_out, size_t counts_out_size, double* errors_out,
                                    size_t errors_out_size, char* error, size_t error_size) {
  auto result = transcode_mxfp4_to_nvfp4(count, packed, packed_sizes, scales, scales_sizes, rows,
                                         cols, out_packed, out_packed_sizes, out_block_scales,
                                         out_block_scales_sizes, tensor_scale_out, counts_out,
                                         counts_out_size, errors_out, errors_out_size);
  if (!result.ok()) return fp4moe::capi::fail(result.error().message, error, error_size);
  *tensor_scale_out = result->tensor_scale;
  counts_out[0] = result->blocks_total;
  counts_out[1] = result->blocks_lossless;
  counts_out[2] = result->blocks_requantized;
  counts_out[3] = result->blocks_all_zero;
  errors_out[0] = result->max_abs_error;
  errors_out[1] = result->max_rel_error;
  return 0;
}

}  // extern "C"
