// Typed, error-returning access to config JSON: a key of the wrong type is bad input, not a crash.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"

namespace fp4moe::detect::jsonu {

// The member `key` of `obj`, or nullptr when obj is not an object, the key is missing or null.
inline const nlohmann::json* member(const nlohmann::json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

inline Result<std::optional<int64_t>> get_int(const nlohmann::json& obj, std::string_view key,
                                              std::string_view where) {
  const nlohmann::json* v = member(obj, key);
  if (v == nullptr) return std::optional<int64_t>{};
  if (v->is_number_integer() || v->is_number_unsigned())
    return std::optional<int64_t>{v->get<int64_t>()};
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (d == static_cast<double>(static_cast<int64_t>(d))) {
      return std::optional<int64_t>{static_cast<int64_t>(d)};
    }
  }
  return Error{std::string(where) + ": '" + std::string(key) + "' must be an integer, got " +
               v->dump()};
}

inline Result<std::optional<std::string>> get_string(const nlohmann::json& obj,
                                                     std::string_view key, std::string_view where) {
  const nlohmann::json* v = member(obj, key);
  if (v == nullptr) return std::optional<std::string>{};
  if (v->is_string()) return std::optional<std::string>{v->get<std::string>()};
  return Error{std::string(where) + ": '" + std::string(key) + "' must be a string, got " +
               v->dump()};
}

inline Result<std::optional<bool>> get_bool(const nlohmann::json& obj, std::string_view key,
                                            std::string_view where) {
  const nlohmann::json* v = member(obj, key);
  if (v == nullptr) return std::optional<bool>{};
  if (v->is_boolean()) return std::optional<bool>{v->get<bool>()};
  return Error{std::string(where) + ": '" + std::string(key) + "' must be a boolean, got " +
               v->dump()};
}

}  // namespace fp4moe::detect::jsonu
