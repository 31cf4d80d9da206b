// Tolerant parsing of Python-written config JSON (see json_util.h).
#include "detect/json_util.h"

namespace fp4moe::detect::jsonu {

Result<nlohmann::json> parse_config_json(std::string_view text, std::string_view what) {
  std::string clean;
  clean.reserve(text.size());
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      clean += c;
      if (c == '\\' && i + 1 < text.size()) {
        clean += text[++i];
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      clean += c;
      continue;
    }
    bool replaced = false;
    for (std::string_view token : {"-Infinity", "Infinity", "NaN"}) {
      if (text.substr(i, token.size()) == token) {
        clean += "null";
        i += token.size() - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) clean += c;
  }
  // Nesting is capped: configs nest 3-4 levels, and a hostile file must not exhaust the stack.
  constexpr int kMaxDepth = 64;
  int depth = 0;
  auto guard = [&](int, nlohmann::json::parse_event_t event, nlohmann::json&) {
    if (event == nlohmann::json::parse_event_t::object_start ||
        event == nlohmann::json::parse_event_t::array_start) {
      if (++depth > kMaxDepth) throw std::runtime_error("nesting deeper than 64 levels");
    } else if (event == nlohmann::json::parse_event_t::object_end ||
               event == nlohmann::json::parse_event_t::array_end) {
      --depth;
    }
    return true;
  };
  try {
    return nlohmann::json::parse(clean, guard);
  } catch (const std::exception& e) {
    return Error{std::string(what) + ": invalid JSON: " + e.what()};
  }
}

}  // namespace fp4moe::detect::jsonu
