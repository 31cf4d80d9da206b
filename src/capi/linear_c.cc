// fp4moe_linear (fp4moe_c.h): one product through pack/ + dispatch/ + the kernels, for the
// Python oracle tests of the exact and W4A8 kernel families.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include "capi/fp4moe_c.h"
#include "core/thread_pool.h"
#include "dispatch/cpu_features.h"
#include "dispatch/linear.h"
#include "pack/pack.h"

namespace {

int fail(const std::string& message, char* error, size_t error_size) {
  if (error != nullptr && error_size > 0) {
    const size_t n = std::min(error_size - 1, message.size());
    std::memcpy(error, message.data(), n);
    error[n] = '\0';
  }
  return 1;
}

}  // namespace

extern "C" int fp4moe_linear(const char* format, const char* precision, const char* isa,
                             const uint8_t* packed, const uint8_t* scales, float tensor_scale,
                             int64_t n, int64_t k, const float* x, int64_t m, float* y, char* error,
                             size_t error_size) {
  using fp4moe::dispatch::LinearPlan;
  if (format == nullptr || precision == nullptr)
    return fail("format and precision", error, error_size);
  if (n < 1 || k < 1 || m < 1) return fail("n, k and m must be positive", error, error_size);
  auto parsed_precision = fp4moe::dispatch::parse_precision(precision);
  if (!parsed_precision.ok()) return fail(parsed_precision.error().message, error, error_size);
  std::optional<fp4moe::kernels::Isa> chosen;
  if (isa != nullptr) {
    auto parsed = fp4moe::dispatch::parse_isa(isa);
    if (!parsed.ok()) return fail(parsed.error().message, error, error_size);
    chosen = *parsed;
  }
  const std::string f = format;
  const auto elements = static_cast<size_t>(n) * static_cast<size_t>(k);
  fp4moe::Result<fp4moe::pack::PackedWeights> weights = fp4moe::Error{"unknown format '" + f + "'"};
  if (f == "nvfp4" && k % 16 == 0) {
    weights = fp4moe::pack::pack_nvfp4("w", {packed, elements / 2}, {scales, elements / 16},
                                       tensor_scale, n, k);
  } else if (f == "mxfp4" && k % 32 == 0) {
    weights = fp4moe::pack::pack_mxfp4("w", {packed, elements / 2}, {scales, elements / 32}, n, k);
  } else if (f == "nvfp4" || f == "mxfp4") {
    weights =
        fp4moe::Error{"K = " + std::to_string(k) + " is not a multiple of the " + f + " block"};
  }
  if (!weights.ok()) return fail(weights.error().message, error, error_size);
  auto plan = LinearPlan::create(weights->view(), chosen, *parsed_precision);
  if (!plan.ok()) return fail(plan.error().message, error, error_size);
  fp4moe::ThreadPool pool(1);
  if (*parsed_precision == fp4moe::dispatch::Precision::kW4A8) {
    fp4moe::dispatch::QuantizedActivationBuffer buffer(m, k, plan->activation_block());
    plan->run_quantizing(x, k, m, y, n, buffer, pool);
  } else {
    plan->run(x, k, m, y, n, pool);
  }
  return 0;
}
