// fp4moe_linear (fp4moe_c.h): one product through pack/ + dispatch/ + the kernels, for the
// Python oracle tests of the exact and W4A8 kernel families. Every buffer is checked against the
// shape (capi/bounds.h) before pack/ reads it.
#include <optional>
#include <string>
#include <string_view>

#include "capi/bounds.h"
#include "capi/fp4moe_c.h"
#include "core/thread_pool.h"
#include "dispatch/cpu_features.h"
#include "dispatch/linear.h"
#include "kernels/types.h"
#include "pack/pack.h"

namespace {

using fp4moe::Error;
using fp4moe::Result;
using fp4moe::Status;
using fp4moe::capi::check_buffer;
using fp4moe::capi::element_count;
using fp4moe::capi::shape_string;
using fp4moe::kernels::WeightFormat;

// The kernels' format names ("nvfp4", "mxfp4", "fp8_block"): one table, kernels/types.h.
Result<WeightFormat> parse_format(std::string_view name) {
  for (WeightFormat format : fp4moe::kernels::kAllWeightFormats) {
    if (fp4moe::kernels::weight_format_name(format) == name) return format;
  }
  return Error{"unknown format '" + std::string(name) + "' (expected nvfp4, mxfp4 or fp8_block)"};
}

// Checks the weight buffers of W [n, k] in `format` and packs them.
Result<fp4moe::pack::PackedWeights> pack_weights(WeightFormat format, const uint8_t* packed,
                                                 size_t packed_size, const void* scales,
                                                 size_t scales_size, float tensor_scale, int64_t n,
                                                 int64_t k, size_t elements) {
  const std::string shape = "the shape " + shape_string(n, k);
  const auto n_rows = static_cast<size_t>(n);
  switch (format) {
    case WeightFormat::kNvfp4:
    case WeightFormat::kMxfp4: {
      const int block = fp4moe::kernels::weight_format_k_block(format);
      if (k % block != 0) {
        return Error{"K = " + std::to_string(k) + " is not a multiple of the " +
                     std::string(fp4moe::kernels::weight_format_name(format)) + " block (" +
                     std::to_string(block) + ")"};
      }
      const auto* scale_bytes = static_cast<const uint8_t*>(scales);
      const size_t scale_count = n_rows * static_cast<size_t>(k / block);
      FP4MOE_RETURN_IF_ERROR(check_buffer("packed", packed, packed_size, elements / 2, shape));
      FP4MOE_RETURN_IF_ERROR(check_buffer("scales", scale_bytes, scales_size, scale_count, shape));
      if (format == WeightFormat::kNvfp4) {
        return fp4moe::pack::pack_nvfp4("w", {packed, elements / 2}, {scale_bytes, scale_count},
                                        tensor_scale, n, k);
      }
      return fp4moe::pack::pack_mxfp4("w", {packed, elements / 2}, {scale_bytes, scale_count}, n,
                                      k);
    }
    case WeightFormat::kFp8Block128: {
      const auto* scale_floats = static_cast<const float*>(scales);
      const auto grid =
          static_cast<size_t>(fp4moe::capi::ceil_div(n, fp4moe::kernels::kFp8ScaleBlock) *
                              fp4moe::capi::ceil_div(k, fp4moe::kernels::kFp8ScaleBlock));
      FP4MOE_RETURN_IF_ERROR(check_buffer("packed", packed, packed_size, elements, shape));
      FP4MOE_RETURN_IF_ERROR(check_buffer("scales", scale_floats, scales_size, grid, shape));
      return fp4moe::pack::pack_fp8_block128("w", {packed, elements}, {scale_floats, grid}, n, k);
    }
  }
  return Error{"unknown format"};
}

Status linear(const char* format, const char* precision, const char* isa, const uint8_t* packed,
              size_t packed_size, const void* scales, size_t scales_size, float tensor_scale,
              int64_t n, int64_t k, const float* x, size_t x_size, int64_t m, float* y,
              size_t y_size) {
  using fp4moe::dispatch::LinearPlan;
  if (format == nullptr) return Error{"argument 'format' is null"};
  if (precision == nullptr) return Error{"argument 'precision' is null"};
  auto parsed_format = parse_format(format);
  if (!parsed_format.ok()) return parsed_format.error();
  auto parsed_precision = fp4moe::dispatch::parse_precision(precision);
  if (!parsed_precision.ok()) return parsed_precision.error();
  std::optional<fp4moe::kernels::Isa> chosen;
  if (isa != nullptr) {
    auto parsed = fp4moe::dispatch::parse_isa(isa);
    if (!parsed.ok()) return parsed.error();
    chosen = *parsed;
  }
  if (n < 1 || k < 1 || m < 1) {
    return Error{"n, k and m must be positive, got n = " + std::to_string(n) +
                 ", k = " + std::to_string(k) + ", m = " + std::to_string(m)};
  }
  auto weight_elements = element_count(n, k, true);
  if (!weight_elements.ok()) return weight_elements.error();
  auto x_elements = element_count(m, k, true);
  if (!x_elements.ok()) return x_elements.error();
  auto y_elements = element_count(m, n, true);
  if (!y_elements.ok()) return y_elements.error();
  FP4MOE_RETURN_IF_ERROR(
      check_buffer("x", x, x_size, *x_elements, "the shape " + shape_string(m, k)));
  FP4MOE_RETURN_IF_ERROR(
      check_buffer("y", y, y_size, *y_elements, "the shape " + shape_string(m, n)));
  auto weights = pack_weights(*parsed_format, packed, packed_size, scales, scales_size,
                              tensor_scale, n, k, *weight_elements);
  if (!weights.ok()) return weights.error();
  auto plan = LinearPlan::create(weights->view(), chosen, *parsed_precision);
  if (!plan.ok()) return plan.error();
  if (plan->precision() != *parsed_precision) {  // a caller must never get another product
    return Error{"the plan computes " +
                 std::string(fp4moe::dispatch::precision_name(plan->precision())) + ", not the " +
                 std::string(fp4moe::dispatch::precision_name(*parsed_precision)) + " asked for"};
  }
  fp4moe::ThreadPool pool(1);
  if (plan->precision() == fp4moe::dispatch::Precision::kW4A8) {
    fp4moe::dispatch::QuantizedActivationBuffer buffer(m, k, plan->activation_block());
    plan->run_quantizing(x, k, m, y, n, buffer, pool);
  } else {
    plan->run(x, k, m, y, n, pool);
  }
  return Status::Ok();
}

}  // namespace

extern "C" int fp4moe_linear(const char* format, const char* precision, const char* isa,
                             const uint8_t* packed, size_t packed_size, const void* scales,
                             size_t scales_size, float tensor_scale, int64_t n, int64_t k,
                             const float* x, size_t x_size, int64_t m, float* y, size_t y_size,
                             char* error, size_t error_size) {
  return fp4moe::capi::finish(linear(format, precision, isa, packed, packed_size, scales,
                                     scales_size, tensor_scale, n, k, x, x_size, m, y, y_size),
                              error, error_size);
}
