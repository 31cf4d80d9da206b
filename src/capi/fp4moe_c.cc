// C ABI over formats/: thin adapters from pointers and sizes to the C++ API (see fp4moe_c.h).
#include "capi/fp4moe_c.h"

#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "formats/block.h"
#include "formats/scalar.h"
#include "formats/transcode.h"

namespace {

using fp4moe::Error;
using fp4moe::Status;
namespace f = fp4moe::formats;

int report(const Error& e, char* error, size_t error_size) {
  if (error != nullptr && error_size > 0) {
    const size_t n = std::min(error_size - 1, e.message.size());
    std::memcpy(error, e.message.data(), n);
    error[n] = '\0';
  }
  return 1;
}

int finish(const Status& status, char* error, size_t error_size) {
  return status.ok() ? 0 : report(status.error(), error, error_size);
}

size_t elements(int64_t rows, int64_t cols) {
  return rows > 0 && cols > 0 ? static_cast<size_t>(rows) * static_cast<size_t>(cols) : 0;
}

// Sizes are derived here from the shape so a shape error is reported, not a size mismatch abort.
bool divisible(int64_t cols, int block) { return cols > 0 && cols % block == 0; }

}  // namespace

extern "C" {

int fp4moe_encode(const char* kind, const float* x, void* codes, size_t n) {
  const std::string k = kind;
  auto* bytes = static_cast<uint8_t*>(codes);
  auto* halves = static_cast<uint16_t*>(codes);
  for (size_t i = 0; i < n; ++i) {
    if (k == "e2m1")
      bytes[i] = f::encode_e2m1(x[i]);
    else if (k == "e4m3")
      bytes[i] = f::encode_e4m3(x[i]);
    else if (k == "ue4m3")
      bytes[i] = f::encode_ue4m3(x[i]);
    else if (k == "e8m0")
      bytes[i] = f::encode_e8m0(x[i]);
    else if (k == "bf16")
      halves[i] = f::encode_bf16(x[i]);
    else if (k == "fp16")
      halves[i] = f::encode_fp16(x[i]);
    else
      return 1;
  }
  return 0;
}

int fp4moe_decode(const char* kind, const void* codes, float* x, size_t n) {
  const std::string k = kind;
  const auto* bytes = static_cast<const uint8_t*>(codes);
  const auto* halves = static_cast<const uint16_t*>(codes);
  for (size_t i = 0; i < n; ++i) {
    if (k == "e2m1")
      x[i] = f::decode_e2m1(bytes[i]);
    else if (k == "e4m3")
      x[i] = f::decode_e4m3(bytes[i]);
    else if (k == "ue4m3")
      x[i] = f::decode_ue4m3(bytes[i]);
    else if (k == "e8m0")
      x[i] = f::decode_e8m0(bytes[i]);
    else if (k == "bf16")
      x[i] = f::decode_bf16(halves[i]);
    else if (k == "fp16")
      x[i] = f::decode_fp16(halves[i]);
    else
      return 1;
  }
  return 0;
}

int fp4moe_quantize_nvfp4(const float* x, int64_t rows, int64_t cols, float tensor_scale_in,
                          uint8_t* packed, uint8_t* block_scales, float* tensor_scale_out,
                          char* error, size_t error_size) {
  const size_t n = divisible(cols, 16) ? elements(rows, cols) : 0;
  std::span<const float> input(x, n);
  float tensor_scale = tensor_scale_in;
  if (std::isnan(tensor_scale)) {
    auto computed = f::nvfp4_tensor_scale("x", input);
    if (!computed.ok()) return report(computed.error(), error, error_size);
    tensor_scale = *computed;
  }
  *tensor_scale_out = tensor_scale;
  return finish(f::quantize_nvfp4("x", input, rows, cols, tensor_scale, {packed, n / 2},
                                  {block_scales, n / 16}),
                error, error_size);
}

int fp4moe_dequantize_nvfp4(const uint8_t* packed, const uint8_t* block_scales, float tensor_scale,
                            int64_t rows, int64_t cols, float* out, char* error,
                            size_t error_size) {
  const size_t n = divisible(cols, 16) ? elements(rows, cols) : 0;
  return finish(f::dequantize_nvfp4("x", {packed, n / 2}, {block_scales, n / 16}, tensor_scale,
                                    rows, cols, {out, n}),
                error, error_size);
}

int fp4moe_quantize_mxfp4(const float* x, int64_t rows, int64_t cols, int rule, uint8_t* packed,
                          uint8_t* scales, char* error, size_t error_size) {
  const size_t n = divisible(cols, 32) ? elements(rows, cols) : 0;
  const auto mx_rule = rule == 0 ? f::MxScaleRule::kOcpFloor : f::MxScaleRule::kRoundUp;
  return finish(
      f::quantize_mxfp4("x", {x, n}, rows, cols, mx_rule, {packed, n / 2}, {scales, n / 32}), error,
      error_size);
}

int fp4moe_dequantize_mxfp4(const uint8_t* packed, const uint8_t* scales, int64_t rows,
                            int64_t cols, float* out, char* error, size_t error_size) {
  const size_t n = divisible(cols, 32) ? elements(rows, cols) : 0;
  return finish(f::dequantize_mxfp4("x", {packed, n / 2}, {scales, n / 32}, rows, cols, {out, n}),
                error, error_size);
}

int fp4moe_quantize_fp8_block128(const float* x, int64_t rows, int64_t cols, int ue8m0, uint8_t* q,
                                 void* scales, char* error, size_t error_size) {
  const size_t n = elements(rows, cols);
  const auto s = static_cast<size_t>(n ? f::fp8_block_scale_count(rows, cols) : 0);
  if (ue8m0) {
    return finish(f::quantize_fp8_block128_ue8m0("x", {x, n}, rows, cols, {q, n},
                                                 {static_cast<uint8_t*>(scales), s}),
                  error, error_size);
  }
  return finish(
      f::quantize_fp8_block128("x", {x, n}, rows, cols, {q, n}, {static_cast<float*>(scales), s}),
      error, error_size);
}

int fp4moe_dequantize_fp8_block128(const uint8_t* q, const void* scales, int64_t rows, int64_t cols,
                                   int ue8m0, float* out, char* error, size_t error_size) {
  const size_t n = elements(rows, cols);
  const auto s = static_cast<size_t>(n ? f::fp8_block_scale_count(rows, cols) : 0);
  if (ue8m0) {
    return finish(f::dequantize_fp8_block128_ue8m0(
                      "x", {q, n}, {static_cast<const uint8_t*>(scales), s}, rows, cols, {out, n}),
                  error, error_size);
  }
  return finish(f::dequantize_fp8_block128("x", {q, n}, {static_cast<const float*>(scales), s},
                                           rows, cols, {out, n}),
                error, error_size);
}

int fp4moe_transcode_mxfp4_to_nvfp4(size_t count, const uint8_t* const* packed,
                                    const uint8_t* const* scales, const int64_t* rows,
                                    const int64_t* cols, uint8_t* const* out_packed,
                                    uint8_t* const* out_block_scales, float* tensor_scale_out,
                                    int64_t* counts_out, double* errors_out, char* error,
                                    size_t error_size) {
  std::vector<f::Mxfp4Source> sources(count);
  std::vector<f::Nvfp4Destination> destinations(count);
  for (size_t i = 0; i < count; ++i) {
    const size_t n = divisible(cols[i], 32) ? elements(rows[i], cols[i]) : 0;
    sources[i] = {
        "tensor" + std::to_string(i), {packed[i], n / 2}, {scales[i], n / 32}, rows[i], cols[i]};
    destinations[i] = {{out_packed[i], n / 2}, {out_block_scales[i], n / 16}};
  }
  auto result = f::transcode_mxfp4_to_nvfp4(sources, destinations);
  if (!result.ok()) return report(result.error(), error, error_size);
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
