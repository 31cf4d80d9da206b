// Internal text helpers shared by the safetensors reader and writer: strict UTF-8 checking and
// JSON string escaping.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace fp4moe::checkpoint {

// Strict UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF).
// Returns the offset of the first invalid byte, or nullopt when all of `bytes` is valid.
std::optional<size_t> find_invalid_utf8(std::span<const std::byte> bytes);
inline std::optional<size_t> find_invalid_utf8(std::string_view s) {
  return find_invalid_utf8(std::as_bytes(std::span<const char>(s.data(), s.size())));
}

// Appends `s` (valid UTF-8) as a JSON string literal: quotes, and escapes for '"', '\\' and
// control characters; other characters are written as they are.
void append_json_string(std::string& out, std::string_view s);

}  // namespace fp4moe::checkpoint
