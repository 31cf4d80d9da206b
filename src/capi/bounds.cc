// Argument checks of the C ABI (bounds.h).
#include "capi/bounds.h"

#include <algorithm>
#include <cstring>

namespace fp4moe::capi {

std::string shape_string(int64_t rows, int64_t cols) {
  return "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
}

Result<size_t> element_count(int64_t rows, int64_t cols, bool legal) {
  if (!legal || rows <= 0 || cols <= 0) return size_t{0};
  int64_t count = 0;
  if (__builtin_mul_overflow(rows, cols, &count)) {
    return Error{"the shape " + shape_string(rows, cols) + " has more elements than fit int64_t"};
  }
  return static_cast<size_t>(count);
}

Error size_error(std::string_view name, size_t size, size_t needed, std::string_view unit,
                 std::string_view needer) {
  return Error{"argument '" + std::string(name) + "': " + std::to_string(size) + " " +
               std::string(unit) + ", " + std::string(needer) + " needs " + std::to_string(needed)};
}

Error null_error(std::string_view name, size_t needed, std::string_view unit,
                 std::string_view needer) {
  return Error{"argument '" + std::string(name) + "' is null, " + std::string(needer) + " needs " +
               std::to_string(needed) + " " + std::string(unit)};
}

int fail(std::string_view message, char* error, size_t error_size) {
  if (error != nullptr && error_size > 0) {
    const size_t n = std::min(error_size - 1, message.size());
    std::memcpy(error, message.data(), n);
    error[n] = '\0';
  }
  return 1;
}

int finish(const Status& status, char* error, size_t error_size) {
  return status.ok() ? 0 : fail(status.error().message, error, error_size);
}

}  // namespace fp4moe::capi
