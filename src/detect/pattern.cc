// Module-name pattern matching: regex, glob and component-aligned bare names (see pattern.h).
#include "detect/pattern.h"

#include <re2/re2.h>

#include <utility>

namespace fp4moe::detect {

bool glob_match(std::string_view p, std::string_view s) {
  // Iterative matcher with one backtrack point for the last '*': linear for the patterns seen in
  // configs, and never recursive, so hostile patterns cannot exhaust the stack.
  size_t pi = 0, si = 0, star_p = std::string_view::npos, star_s = 0;
  auto class_match = [&](size_t& idx, char c) -> int {  // 1 match, 0 no match, -1 malformed
    size_t i = idx + 1;
    bool negate = i < p.size() && (p[i] == '!' || p[i] == '^');
    if (negate) ++i;
    bool found = false;
    bool first = true;
    while (i < p.size() && (first || p[i] != ']')) {
      first = false;
      if (i + 2 < p.size() && p[i + 1] == '-' && p[i + 2] != ']') {
        if (p[i] <= c && c <= p[i + 2]) found = true;
        i += 3;
      } else {
        if (p[i] == c) found = true;
        ++i;
      }
    }
    if (i >= p.size()) return -1;
    idx = i + 1;
    return found != negate ? 1 : 0;
  };
  while (si < s.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star_p = pi++;
      star_s = si;
      continue;
    }
    if (pi < p.size() && p[pi] == '[') {
      size_t next = pi;
      int m = class_match(next, s[si]);
      if (m == 1) {
        pi = next;
        ++si;
        continue;
      }
      if (m == -1 && s[si] == '[') {  // an unterminated '[' is a literal, as in fnmatch
        ++pi;
        ++si;
        continue;
      }
    } else if (pi < p.size() && (p[pi] == '?' || p[pi] == s[si])) {
      ++pi;
      ++si;
      continue;
    }
    if (star_p == std::string_view::npos) return false;
    pi = star_p + 1;
    si = ++star_s;
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

bool component_run_match(std::string_view needle, std::string_view name) {
  if (needle.empty()) return false;
  size_t pos = 0;
  while ((pos = name.find(needle, pos)) != std::string_view::npos) {
    const bool left = pos == 0 || name[pos - 1] == '.';
    const size_t end = pos + needle.size();
    const bool right = end == name.size() || name[end] == '.';
    if (left && right) return true;
    ++pos;
  }
  return false;
}

Result<Pattern> Pattern::parse(std::string text, std::string_view where) {
  Pattern p;
  if (text.empty()) {
    return Error{std::string(where) + ": empty module pattern"};
  }
  if (text.rfind("re:", 0) == 0) {
    p.kind_ = Kind::kRegex;
    re2::RE2::Options options;
    options.set_log_errors(false);
    auto regex = std::make_shared<const re2::RE2>(text.substr(3), options);
    if (!regex->ok()) {
      return Error{std::string(where) + ": pattern '" + text + "' is not a valid regex (RE2 " +
                   "syntax: Python's, without backreferences or lookaround): " + regex->error()};
    }
    p.regex_ = std::move(regex);
  } else if (text.find_first_of("*?[") != std::string::npos) {
    p.kind_ = Kind::kGlob;
  } else {
    p.kind_ = Kind::kName;
  }
  p.text_ = std::move(text);
  return p;
}

bool Pattern::matches(std::string_view module) const {
  switch (kind_) {
    case Kind::kRegex: {
      // Python re.match: anchored at the start only.
      return regex_->Match(re2::StringPiece(module.data(), module.size()), 0, module.size(),
                           re2::RE2::ANCHOR_START, nullptr, 0);
    }
    case Kind::kGlob:
      // A glob that names a container ("model.layers.*.self_attn") covers the modules inside it.
      for (size_t end = module.find('.'); end != std::string_view::npos;
           end = module.find('.', end + 1)) {
        if (glob_match(text_, module.substr(0, end))) return true;
      }
      return glob_match(text_, module);
    case Kind::kName:
      return component_run_match(text_, module);
  }
  return false;
}

bool Pattern::matches_substring(std::string_view module) const {
  return kind_ == Kind::kName ? module.find(text_) != std::string_view::npos : matches(module);
}

void PatternSet::add(Pattern pattern) {
  const size_t index = patterns_.size();
  if (pattern.kind() == Pattern::Kind::kName) {
    names_.emplace(pattern.text(), index);
  } else {
    others_.push_back(index);
  }
  patterns_.push_back(std::move(pattern));
}

const Pattern* PatternSet::match(std::string_view module) const {
  if (!names_.empty()) {
    // Every contiguous run of components: O(c^2) lookups, c ~ 8 for real module names.
    std::vector<size_t> starts{0};
    for (size_t i = 0; i < module.size(); ++i) {
      if (module[i] == '.') starts.push_back(i + 1);
    }
    for (size_t a = 0; a < starts.size(); ++a) {
      for (size_t b = a; b < starts.size(); ++b) {
        const size_t end = b + 1 < starts.size() ? starts[b + 1] - 1 : module.size();
        auto it = names_.find(std::string(module.substr(starts[a], end - starts[a])));
        if (it != names_.end()) return &patterns_[it->second];
      }
    }
  }
  for (size_t index : others_) {
    if (patterns_[index].matches(module)) return &patterns_[index];
  }
  return nullptr;
}

}  // namespace fp4moe::detect
