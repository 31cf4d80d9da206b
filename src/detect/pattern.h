// Module-name patterns of quantization configs (ignore / exclude_modules / modules_to_not_convert /
// targets / quantized_layers keys) and the semantics this tool gives each dialect.
//
// Our semantics (documented because engines differ; see `alternative_matches`):
//   "re:<regex>"  Python re.match: anchored at the start, not at the end (compressed-tensors),
//                 matched by RE2 in linear time (Python syntax less lookaround/backreferences).
//   glob          a pattern with * ? or [..]: fnmatch over the whole name or over a dotted
//                 prefix of it (a container: "model.layers.*.self_attn" covers q_proj inside);
//                 `*` crosses dots, so "model.layers.1*" also matches layers 10-19.
//   bare name     matches when its dot-separated components are a contiguous run of the module's
//                 components: "lm_head" matches "language_model.lm_head", "layers.0.ffn.experts"
//                 (a whole-container key) matches "layers.0.ffn.experts.17.w1", "gate" matches
//                 "mlp.gate" but not "mlp.gate_proj".
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace re2 {
class RE2;
}

namespace fp4moe::detect {

class Pattern {
 public:
  enum class Kind { kRegex, kGlob, kName };

  // `where` names the config entry for error messages ("config.json quantization_config.ignore").
  static Result<Pattern> parse(std::string text, std::string_view where);

  Kind kind() const { return kind_; }
  const std::string& text() const { return text_; }
  bool matches(std::string_view module) const;

  // Other readings engines use: exact string equality (compressed-tensors for non-regex entries,
  // exact-name lookups) and plain substring containment (`name in module`, as in HF transformers'
  // modules_to_not_convert). Only meaningful for kName.
  bool matches_exact(std::string_view module) const { return module == text_; }
  bool matches_substring(std::string_view module) const;

 private:
  Kind kind_ = Kind::kName;
  std::string text_;
  // RE2: linear time in the module name whatever the pattern (a config is untrusted input; a
  // backtracking engine takes exponential time on "re:(.*.*)*z"). Shared: patterns are copied
  // into rule lists.
  std::shared_ptr<const re2::RE2> regex_;
};

// fnmatch-style glob: * (any run, dots included), ? (one char), [abc] / [!abc] / [a-z].
bool glob_match(std::string_view pattern, std::string_view text);

// True when `needle`'s components are a contiguous run of `name`'s dot-separated components.
bool component_run_match(std::string_view needle, std::string_view name);

// A list of patterns with a fast path for bare names (most exclude lists are hundreds of exact
// names): they are looked up by every contiguous component run of the module name.
class PatternSet {
 public:
  void add(Pattern pattern);
  bool empty() const { return patterns_.empty(); }
  size_t size() const { return patterns_.size(); }
  const std::vector<Pattern>& patterns() const { return patterns_; }
  // The first pattern that matches, or nullptr.
  const Pattern* match(std::string_view module) const;

 private:
  std::vector<Pattern> patterns_;
  std::unordered_map<std::string, size_t> names_;  // bare-name pattern -> index
  std::vector<size_t> others_;                     // indices of regex and glob patterns
};

}  // namespace fp4moe::detect
