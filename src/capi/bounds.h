// Argument checks of the C ABI (fp4moe_c.h): element counts from a shape without overflow, and
// buffer-size checks that name the argument, all made before any caller memory is touched.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/status.h"

namespace fp4moe::capi {

// "[4, 32]", as every size message prints a shape.
std::string shape_string(int64_t rows, int64_t cols);

// rows * cols for a shape the layer below accepts, or an Error naming the shape when the product
// does not fit int64_t (formats/ and pack/ index with int64_t). `legal` false (a shape the layer
// below rejects with its own message) counts 0 elements, so no buffer is needed and that layer
// reports the shape instead of a size.
Result<size_t> element_count(int64_t rows, int64_t cols, bool legal);

// ceil(a / b) for a >= 0 without the overflow of (a + b - 1) / b.
inline int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// What the messages call one element of each buffer type.
template <class T>
constexpr std::string_view unit_name();
template <>
constexpr std::string_view unit_name<uint8_t>() {
  return "bytes";
}
template <>
constexpr std::string_view unit_name<uint16_t>() {
  return "uint16s";
}
template <>
constexpr std::string_view unit_name<float>() {
  return "floats";
}
template <>
constexpr std::string_view unit_name<int64_t>() {
  return "int64s";
}
template <>
constexpr std::string_view unit_name<double>() {
  return "doubles";
}

Error size_error(std::string_view name, size_t size, size_t needed, std::string_view unit,
                 std::string_view needer);
Error null_error(std::string_view name, size_t needed, std::string_view unit,
                 std::string_view needer);

// OK when the caller declared at least `needed` elements of T at `p` (`size`, in elements) and `p`
// is not null unless nothing is needed. `needer` ends the message: "the shape [4, 32]" gives
// "argument 'scales': 1 bytes, the shape [4, 32] needs 8".
template <class T>
Status check_buffer(std::string_view name, const T* p, size_t size, size_t needed,
                    std::string_view needer) {
  if (size < needed) return size_error(name, size, needed, unit_name<T>(), needer);
  if (p == nullptr && needed > 0) return null_error(name, needed, unit_name<T>(), needer);
  return Status::Ok();
}

// The span of `count` elements at `p` handed to the C++ API, never with a null data pointer: NULL
// is a valid C argument for an empty buffer, but the layers below may memcpy from an empty span,
// and memcpy with a null pointer is undefined even for 0 bytes.
template <class T>
std::span<T> span_of(T* p, size_t count) {
  static T empty{};
  return {p != nullptr ? p : &empty, count};
}

// Writes `message` into the caller's error buffer (NUL-terminated, cut to error_size bytes; none
// when error is null or error_size 0) and returns 1, the C ABI's failure value.
int fail(std::string_view message, char* error, size_t error_size);
// 0 for OK, else fail() with the error's message.
int finish(const Status& status, char* error, size_t error_size);

}  // namespace fp4moe::capi
