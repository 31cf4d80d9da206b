// Detection: evaluates the config claims on every module, checks them against the tensors, groups
// the result into a manifest and explains every disagreement as a finding.
#include "detect/detect.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>

#include "detect/arch.h"
#include "detect/claims.h"
#include "detect/sizes.h"

namespace fp4moe::detect {
namespace {

struct Module {
  std::string name;
  Role role;
  int64_t multiplicity = 1;
  Claim claim;
  const TensorModule* tensors = nullptr;
  SchemeSpec spec;  // final
};

// "model.layers.12.mlp.experts.7.w1" -> "model.layers.*.mlp.experts.*.w1"
std::string group_name(std::string_view name) {
  std::string out;
  size_t start = 0;
  while (start <= name.size()) {
    size_t dot = name.find('.', start);
    if (dot == std::string_view::npos) dot = name.size();
    std::string_view comp = name.substr(start, dot - start);
    const bool digits = !comp.empty() && std::all_of(comp.begin(), comp.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c));
    });
    if (!out.empty()) out += '.';
    out += digits ? std::string("*") : std::string(comp);
    start = dot + 1;
  }
  return out;
}

bool is_quantized(Scheme s) {
  return s != Scheme::kBf16 && s != Scheme::kAbsent && s != Scheme::kUnknown;
}

// A representative subset for pattern diagnostics: expert 0 stands for every expert.
bool representative(std::string_view name) {
  const size_t pos = name.find("experts.");
  if (pos == std::string_view::npos) return true;
  const size_t idx = pos + 8;
  return idx >= name.size() || !std::isdigit(static_cast<unsigned char>(name[idx])) ||
         (name[idx] == '0' && (idx + 1 == name.size() || name[idx + 1] == '.'));
}

// Without config.json: reconstruct the family and layer count from the module names the
// quantization config mentions. Role existence is then unverified (a finding says so).
ArchInfo arch_from_patterns(const ConfigClaims& claims) {
  ArchInfo a = claims.arch;
  std::string all;
  int max_layer = -1;
  auto scan = [&](const std::string& text) {
    all += text + "\n";
    size_t pos = 0;
    while ((pos = text.find("layers.", pos)) != std::string::npos) {
      pos += 7;
      int v = 0, digits = 0;
      while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos])) &&
             digits < 6) {
        v = v * 10 + (text[pos++] - '0');
        ++digits;
      }
      if (digits > 0) max_layer = std::max(max_layer, v);
    }
  };
  for (const auto& p : claims.primary.excludes.patterns()) scan(p.text());
  for (const auto& r : claims.primary.rules) scan(r.pattern.text());
  auto has = [&](std::string_view s) { return all.find(s) != std::string::npos; };
  if (has("kv_a_proj_with_mqa") || has("q_a_proj"))
    a.family = Family::kDeepseekV3;
  else if (has("block_sparse_moe"))
    a.family = Family::kMiniMax;
  else if (has("linear_attn") || has("language_model.layers"))
    a.family = Family::kQwen35;
  else if (has("backbone."))
    a.family = Family::kNemotronH;
  else if (has("ffn."))
    a.family = Family::kDeepseekV4;
  else
    a.family = Family::kQwen3;
  const families::FamilyNaming& row = families::first_row(a.family);
  a.layer_prefix = std::string(row.layer_prefix);
  a.lm_head_name = std::string(row.lm_head);
  a.embed_name = std::string(row.embed);
  a.num_layers = max_layer + 1;
  a.n_routed_experts = 1;
  a.shared_experts = true;
  a.names_assumed = true;
  for (int l = 0; l < a.num_layers; ++l) {
    LayerShape s;
    s.mixer = a.family == Family::kDeepseekV3 ? LayerShape::Mixer::kMla
                                              : LayerShape::Mixer::kSelfAttention;
    s.moe = true;
    s.dense_mlp = true;
    a.layers.push_back(s);
  }
  return a;
}

// "model.layers.3.mlp.experts.17.w1" -> "model.layers.3.mlp.experts.0.w1": a per-expert entry is
// matched against the expert-0 module that stands for every expert in the diagnostics.
std::string expert_zero(std::string_view name) {
  std::string out(name);
  size_t pos = 0;
  while ((pos = out.find("experts.", pos)) != std::string::npos) {
    pos += 8;
    size_t end = pos;
    while (end < out.size() && std::isdigit(static_cast<unsigned char>(out[end]))) ++end;
    if (end > pos && (end == out.size() || out[end] == '.')) out.replace(pos, end - pos, "0");
  }
  return out;
}

// Whether a pattern matches a representative module, per-expert entries included.
bool matches_rep(const Pattern& p, std::string_view module) {
  if (p.matches(module)) return true;
  if (p.kind() != Pattern::Kind::kName || p.text().find("experts.") == std::string::npos) {
    return false;
  }
  return component_run_match(expert_zero(p.text()), module);
}

bool has_weight_matrix(const TensorModule& m) {
  for (const char* part : {"weight", "weight_packed", "qweight", "_blocks"}) {
    if (m.parts.count(part)) return true;
  }
  return false;
}

std::string scheme_list(const std::map<Scheme, int64_t>& counts) {
  std::string out;
  for (const auto& [s, n] : counts) {
    if (!out.empty()) out += ", ";
    out += std::to_string(n) + " " + std::string(to_string(s));
  }
  return out;
}

}  // namespace

Result<Manifest> detect(const DetectInput& in) {
  if (in.config.is_null() && in.hf_quant_config.is_null()) {
    return Error{"neither config.json nor hf_quant_config.json was given: nothing to inspect"};
  }
  auto arch_r = read_arch(in.config);
  if (!arch_r.ok()) return arch_r.error();
  auto claims_r = read_claims(in.config, in.hf_quant_config, arch_r.value());
  if (!claims_r.ok()) return claims_r.error();
  ConfigClaims& claims = claims_r.value();
  Manifest man;
  auto find = [&](Severity s, std::string code, std::string msg) {
    man.findings.push_back({s, std::move(code), std::move(msg)});
  };
  man.findings = claims.arch.findings;
  man.findings.insert(man.findings.end(), claims.findings.begin(), claims.findings.end());
  man.findings.insert(man.findings.end(), in.notes.begin(), in.notes.end());
  man.dialect = claims.primary.dialect;
  if (claims.sidecar) man.dialect += " + " + claims.sidecar->dialect;

  ArchInfo& arch = claims.arch;
  if (!arch.has_config) {
    arch = arch_from_patterns(claims);
    find(Severity::kWarning, "no_config_json",
         "no config.json: the architecture (" + std::string(to_string(arch.family)) + " naming, " +
             std::to_string(arch.num_layers) +
             " layers) is reconstructed from the module names in the quantization config, so "
             "which roles exist is not verified and MTP layers cannot be told apart");
  }

  // Inventory.
  std::vector<Module> modules;
  TensorEvidence ev;
  man.tensors_checked = in.tensors.has_value() && !in.tensor_names_only;
  man.tensor_evidence = man.tensors_checked ? TensorEvidenceKind::kHeaders
                        : in.tensors        ? TensorEvidenceKind::kIndexNames
                                            : TensorEvidenceKind::kNone;
  if (in.tensors) {
    ev = classify_tensors(*in.tensors);
    for (const auto& tm : ev.modules) {
      Module m;
      m.name = tm.name;
      m.role = classify_module(tm.name, arch);
      m.tensors = &tm;
      modules.push_back(std::move(m));
    }
    for (const auto& u : ev.unknown_dtypes) {
      find(Severity::kWarning, "unknown_dtype",
           "tensor " + u + " has a dtype this tool does not know");
    }
  } else {
    // The naming convention under which the config's own patterns match the most modules.
    int best = 0;
    size_t best_hits = 0;
    for (int c = 0; c < families::convention_count(arch.family); ++c) {
      auto synth = synthesize_modules(arch, c);
      size_t hits = 0;
      auto count = [&](const Pattern& p) {
        for (const auto& s : synth) {
          if (p.matches(s.name)) {
            ++hits;
            return;
          }
        }
      };
      for (const auto& p : claims.primary.excludes.patterns()) count(p);
      for (const auto& r : claims.primary.rules) {
        if (!r.linear_class) count(r.pattern);
      }
      if (c == 0 || hits > best_hits) {
        best = c;
        best_hits = hits;
      }
    }
    for (auto& s : synthesize_modules(arch, best)) {
      Module m;
      m.name = s.name;
      m.multiplicity = s.multiplicity;
      m.role = classify_module(s.name, arch);
      modules.push_back(std::move(m));
    }
    if (families::convention_count(arch.family) > 1) {
      find(Severity::kInfo, "naming_convention",
           "configs only: module names taken as " +
               std::string(convention_name(arch.family, best)) +
               ", the convention under which the config's own patterns match");
    }
    if (arch.names_assumed && arch.has_config) {
      find(Severity::kInfo, "names_assumed",
           "configs only: the module names of model_type '" + arch.model_type +
               "' are not confirmed by a checkpoint this tool has seen; roles were evaluated on "
               "assumed names (" +
               std::string(to_string(arch.family)) + " layout)");
    }
    find(Severity::kInfo, "tensors_not_checked",
         "no safetensors headers were read: every scheme below is what the configs claim, not "
         "what the weights hold");
  }

  // Claims and the final answer per module.
  for (auto& m : modules) {
    m.claim = claims.claim(m.name, m.role);
    m.spec = m.claim.spec;
    if (m.tensors && m.tensors->names_only) {
      // Names that cannot tell, or tell the claimed scheme: the claim (with its group size,
      // scale type and activation) stands. Names that tell another scheme win, as tensors do.
      const Scheme named = m.tensors->spec.scheme;
      if (named != Scheme::kUnknown && named != m.claim.spec.scheme) m.spec = m.tensors->spec;
    } else if (m.tensors) {
      m.spec = m.tensors->spec;
      const SchemeSpec& c = m.claim.spec;
      // The activation is a config fact unless the tensors say it (input scales).
      if (m.spec.scheme == c.scheme && m.spec.activation != Activation::kNvfp4 &&
          m.spec.activation != Activation::kFp8Static && c.activation != Activation::kUnknown) {
        m.spec.activation = c.activation;
      }
    }
  }

  // Config vs tensors, aggregated per (role, claim, tensor).
  if (in.tensors) {
    std::map<std::tuple<Role, Scheme, Scheme>, std::pair<int64_t, const Module*>> mismatch;
    for (const auto& m : modules) {
      if (m.claim.spec.scheme != m.spec.scheme) {
        auto& e = mismatch[{m.role, m.claim.spec.scheme, m.spec.scheme}];
        if (e.first++ == 0) e.second = &m;
      }
    }
    for (const auto& [key, e] : mismatch) {
      const auto& [role, claimed, actual] = key;
      const Module& ex = *e.second;
      Severity sev = Severity::kWarning;
      std::string consequence;
      if (claimed == Scheme::kUnknown) {
        // The configs say nothing this module's format can be read from: nothing disagrees, so
        // nothing to report (the group's config_scheme 'unknown' and tensor_scheme say it).
        continue;
      } else if (actual == Scheme::kUnknown) {
        consequence =
            "the tensors are in a layout this tool does not recognize; do not trust "
            "the config's claim until they are checked";
      } else if (is_quantized(claimed) && is_quantized(actual)) {
        sev = Severity::kError;
        consequence =
            "a loader that reads only the config loads these weights wrong (wrong "
            "kernel, wrong dequantization); `fp4moe plan DIR --target sm_100` shows what each "
            "engine's newest release reads (your GPU's sm_XX; --engine E@V for one version)";
      } else if (is_quantized(actual)) {
        sev = Severity::kError;
        consequence = "a loader that follows the config treats quantized bytes as " +
                      std::string(to_string(claimed)) + " weights";
      } else {
        consequence =
            "a loader that follows the config expects quantized tensors that are not "
            "there and fails to load";
      }
      find(sev, "config_tensor_mismatch",
           std::string(to_string(role)) + ": config says " + std::string(to_string(claimed)) +
               " (" + ex.claim.source + ") but tensors are " + std::string(to_string(actual)) +
               " (" + (ex.tensors ? ex.tensors->evidence : "") + "; " + std::to_string(e.first) +
               " module(s), e.g. " + ex.name + "): " + consequence +
               ". This report gives the tensors' format.");
    }
  }

  // config.json vs hf_quant_config.json.
  if (claims.sidecar) {
    std::map<std::tuple<Role, Scheme, Scheme>, int64_t> diff;
    for (const auto& m : modules) {
      const Claim other = claims.claim(*claims.sidecar, m.name, m.role);
      if (other.spec.scheme != m.claim.spec.scheme) {
        diff[{m.role, m.claim.spec.scheme, other.spec.scheme}] += m.multiplicity;
      }
    }
    for (const auto& [key, n] : diff) {
      const auto& [role, a, b] = key;
      find(Severity::kWarning, "config_sources_disagree",
           std::string(to_string(role)) + ": config.json says " + std::string(to_string(a)) +
               " (SGLang and vLLM read it) but hf_quant_config.json says " +
               std::string(to_string(b)) + " (TensorRT-LLM reads it), for " + std::to_string(n) +
               " module(s)");
    }
  }

  // Pattern diagnostics on the primary section's lists.
  bool rules_name_nothing = false;  // no quantized_layers/targets entry names any module
  std::string rules_example;
  {
    std::vector<const Module*> reps;
    for (const auto& m : modules) {
      if (representative(m.name)) reps.push_back(&m);
    }
    // A per-expert bare name ("...experts.17.w1") is judged as the expert-0 name that stands for
    // every expert among the representatives, so its exactness and its hits are those of the
    // module it names. Lists of real checkpoints repeat one name per expert (tens of thousands of
    // entries, a few hundred distinct after this step): each distinct name is matched once.
    struct PatternEval {
      const Module* first_hit = nullptr;
      const Module* extra = nullptr;  // a module it is a substring of, without matching it
      bool exact_any = false;
      std::vector<const Module*> hits;
    };
    std::unordered_map<std::string, PatternEval> evals;
    const auto evaluate = [&](const Pattern& p) -> const PatternEval& {
      const bool name = p.kind() == Pattern::Kind::kName;
      std::string key = name ? expert_zero(p.text()) : p.text();
      key.insert(0, 1, static_cast<char>('0' + static_cast<int>(p.kind())));
      auto [it, fresh] = evals.try_emplace(std::move(key));
      if (!fresh) return it->second;
      PatternEval& e = it->second;
      std::optional<Pattern> zero;
      if (name && it->first.compare(1, std::string::npos, p.text()) != 0) {
        auto parsed = Pattern::parse(it->first.substr(1), "expert 0 of " + p.text());
        if (parsed.ok()) zero = std::move(*parsed);
      }
      const Pattern& q = zero ? *zero : p;
      for (const Module* m : reps) {
        const bool hit = zero ? q.matches(m->name) : matches_rep(p, m->name);
        if (hit) {
          e.hits.push_back(m);
          if (!e.first_hit) e.first_hit = m;
        }
        if (name) {
          e.exact_any = e.exact_any || q.matches_exact(m->name);
          if (!hit && !e.extra && q.matches_substring(m->name)) e.extra = m;
        }
      }
      return e;
    };
    // Aggregated: one finding per kind of semantic difference, with a count and an example.
    std::vector<std::string> unmatched, component_only, substring_extra, digit_star;
    for (const auto& p : claims.primary.excludes.patterns()) {
      const PatternEval& e = evaluate(p);
      const Module* first_hit = e.first_hit;
      const Module* extra = e.extra;
      const bool exact_any = e.exact_any;
      const std::vector<const Module*>& hits = e.hits;
      if (!first_hit) unmatched.push_back("'" + p.text() + "'");
      if (p.kind() == Pattern::Kind::kName && first_hit && !exact_any) {
        component_only.push_back("'" + p.text() + "' -> " + first_hit->name);
      }
      if (extra) substring_extra.push_back("'" + p.text() + "' -> " + extra->name);
      // "model.layers.1*" also catches layers 10-19: flag a digit before a trailing star.
      const std::string& t = p.text();
      if (p.kind() == Pattern::Kind::kGlob && t.size() >= 2 && t.back() == '*' &&
          std::isdigit(static_cast<unsigned char>(t[t.size() - 2]))) {
        const std::string stem = t.substr(0, t.size() - 1);
        for (const Module* m : hits) {
          const char next = m->name.size() > stem.size() ? m->name[stem.size()] : '.';
          if (std::isdigit(static_cast<unsigned char>(next))) {
            digit_star.push_back("'" + t + "' -> " + m->name);
            break;
          }
        }
      }
    }
    auto examples = [](const std::vector<std::string>& v) {
      std::string out;
      for (size_t i = 0; i < v.size() && i < 3; ++i) out += (i ? "; " : "") + v[i];
      return out + (v.size() > 3 ? "; ..." : "");
    };
    const std::string list = claims.primary.file + " " + claims.primary.excludes_key;
    if (!component_only.empty()) {
      find(Severity::kInfo, "pattern_semantics",
           std::to_string(component_only.size()) + " bare name(s) in " + list +
               " match only as a trailing/inner name component (" + examples(component_only) +
               "): a loader that compares full names exactly (compressed-tensors ignore, "
               "exact-name lookups) would not exclude those modules");
    }
    if (!substring_extra.empty()) {
      find(Severity::kWarning, "pattern_semantics",
           std::to_string(substring_extra.size()) + " name(s) in " + list +
               " are also substrings of other modules (" + examples(substring_extra) +
               "): a loader that matches names as substrings (HF transformers "
               "modules_to_not_convert) leaves those modules unquantized too");
    }
    if (!digit_star.empty()) {
      find(Severity::kWarning, "pattern_semantics",
           std::to_string(digit_star.size()) + " pattern(s) in " + list +
               " end in a digit and '*' and so also match other layers (" + examples(digit_star) +
               "); probably meant '<prefix>.*'");
    }
    // Without tensors the inventory holds linear layers only, so patterns naming norms or
    // buffers would always look unmatched: report unmatched patterns against real tensors only.
    if (!unmatched.empty() && in.tensors) {
      find(Severity::kInfo, "pattern_unmatched",
           std::to_string(unmatched.size()) + " pattern(s) in " + list +
               " match no module in the tensors (" + examples(unmatched) +
               "); harmless, but check the names are what the producer meant");
    }
    std::vector<std::string> rules_unmatched;
    size_t rules_total = 0;
    for (const auto& r : claims.primary.rules) {
      if (r.linear_class) continue;
      ++rules_total;
      if (!evaluate(r.pattern).first_hit) rules_unmatched.push_back("'" + r.pattern.text() + "'");
    }
    if (!rules_unmatched.empty()) {
      // None matching means the declared formats apply to nothing: a naming mismatch.
      const bool none = rules_unmatched.size() == rules_total;
      rules_name_nothing = none;
      rules_example = examples(rules_unmatched);
      find(none ? Severity::kWarning : Severity::kInfo, "pattern_unmatched",
           std::to_string(rules_unmatched.size()) + " of " + std::to_string(rules_total) +
               " quantized_layers/targets entries in " + claims.primary.file + " match no module " +
               (in.tensors ? std::string("in the tensors") : std::string("of the architecture")) +
               " (" + examples(rules_unmatched) + ")" +
               (none ? ": the formats they declare apply to nothing" : ""));
    }
  }

  // A config whose per-module entries name none of the modules (another naming: a VLM wrapper's
  // prefix, a family this tool names differently) says nothing about any module: where the
  // configs decide (no headers, or index names that cannot tell), the answer is unknown, never
  // the "not listed, so not quantized" default.
  if (rules_name_nothing) {
    std::set<std::string_view> roles;
    for (auto& m : modules) {
      const bool from_claim =
          !m.tensors || (m.tensors->names_only && m.tensors->spec.scheme == Scheme::kUnknown);
      if (!from_claim || m.role == Role::kOther || m.role == Role::kEmbedding ||
          m.role == Role::kRouter) {
        continue;
      }
      m.spec = {Scheme::kUnknown, Activation::kUnknown, 0, ScaleType::kUnknown};
      m.claim.spec = m.spec;
      m.claim.source = "no entry of " + claims.primary.file + " names this module";
      roles.insert(to_string(m.role));
    }
    if (!roles.empty()) {
      std::string list;
      for (std::string_view r : roles) list += (list.empty() ? "" : ", ") + std::string(r);
      find(Severity::kWarning, "roles_unnamed",
           "no quantized_layers/targets entry of " + claims.primary.file +
               " names a module of this checkpoint as this tool names them (" + rules_example +
               "): the format of " + list +
               " is unknown, not assumed unquantized; the shards' headers (or the index's tensor "
               "names) tell it");
    }
  }

  // Group, with bytes: exact from the headers, else estimated from the config's dimensions.
  const ModelDims dims = read_dims(in.config);
  std::map<std::tuple<Role, std::string, Scheme, Scheme, int, int>, ModuleGroup> groups;
  std::map<std::tuple<Role, std::string, Scheme, Scheme, int, int>, std::string> unknown_why;
  for (const auto& m : modules) {
    const bool named = m.tensors && m.tensors->names_only;
    const bool checked = m.tensors && !named;
    const Scheme tensor = m.tensors ? m.tensors->spec.scheme : Scheme::kUnknown;
    auto key = std::tuple{m.role,
                          group_name(m.name),
                          m.spec.scheme,
                          m.claim.spec.scheme,
                          m.spec.group_size,
                          static_cast<int>(m.spec.activation)};
    ModuleGroup& g = groups[key];
    if (g.module_count == 0) {
      g.role = m.role;
      g.name = std::get<1>(key);
      g.spec = m.spec;
      g.config_scheme = m.claim.spec.scheme;
      if (checked || (named && tensor != Scheme::kUnknown)) g.tensor_scheme = tensor;
      g.config_source = m.claim.source;
      g.tensor_source = m.tensors ? m.tensors->evidence : "";
      g.bytes = 0;
      g.bytes_source = checked ? "safetensors headers"
                               : "estimate: config dimensions x " +
                                     std::string(to_string(m.spec.scheme)) + " bytes per weight";
    }
    g.module_count += m.multiplicity;
    if (m.tensors) g.tensor_count += static_cast<int64_t>(m.tensors->parts.size());
    if (checked) {
      *g.bytes += m.tensors->bytes;
      continue;
    }
    if (!g.bytes) continue;
    if (m.tensors && !has_weight_matrix(*m.tensors)) {
      // Index names of vectors only (attention sinks, biases): a few KB, not a matrix.
      g.bytes_source += " (vectors without a weight matrix counted as 0)";
      continue;
    }
    const std::optional<int64_t> params = module_params(m.name, m.role, arch, dims);
    const std::optional<double> per = bytes_per_param(m.spec, dims);
    if (params && per) {
      *g.bytes += static_cast<int64_t>(static_cast<double>(*params) * *per) * m.multiplicity;
    } else {
      g.bytes.reset();
      g.bytes_source = !per ? "unknown: the scheme is " + std::string(to_string(m.spec.scheme))
                            : "unknown: the config gives no shape for " + m.name;
    }
  }
  for (auto& [k, g] : groups) man.modules.push_back(std::move(g));

  // Total bytes: the headers' sum, else the index's total_size, else the estimates' sum.
  {
    int64_t sum = 0, planned_unknown = 0;
    for (const auto& g : man.modules) {
      if (g.bytes) {
        sum += *g.bytes;
      } else if (g.role != Role::kOther) {
        ++planned_unknown;
      }
    }
    if (man.tensors_checked) {
      man.total_bytes = sum;
      man.total_bytes_source = "safetensors headers";
    } else if (in.index_total_size) {
      man.total_bytes = static_cast<int64_t>(*in.index_total_size);
      man.total_bytes_source = "model.safetensors.index.json metadata.total_size";
      // The estimate (linear layers, embedding, head) should come close below the total (norms
      // and biases are small); far off means the dimensions or the schemes are not what the
      // configs say.
      if (planned_unknown == 0 && sum > 0 && *man.total_bytes > 0) {
        const double ratio = static_cast<double>(sum) / static_cast<double>(*man.total_bytes);
        if (ratio < 0.8 || ratio > 1.05) {
          find(Severity::kWarning, "size_estimate_off",
               "the module sizes estimated from the config's dimensions add up to " +
                   std::to_string(sum) + " bytes, " + std::to_string(ratio * 100).substr(0, 5) +
                   "% of the index's metadata.total_size (" + std::to_string(*man.total_bytes) +
                   "): per-group bytes (and plan's bytes per token) are off by as much");
        }
      }
    } else if (planned_unknown == 0 && !modules.empty()) {
      man.total_bytes = sum;
      man.total_bytes_source = "estimate: config dimensions x bytes per weight of each scheme";
    } else {
      man.total_bytes_source =
          std::to_string(planned_unknown) + " module group(s) of unknown size; no index total_size";
    }
  }

  // Summary.
  auto summarize = [&](Role role) -> Scheme {
    // Without config.json (and without tensors) every layer is assumed to have shared experts
    // and a dense MLP so that the declaration can be evaluated on them; whether the model has
    // them is not known (no_config_json), so the summary says unknown, not their claimed format.
    if (!arch.has_config && !in.tensors &&
        (role == Role::kSharedExperts || role == Role::kDenseMlp)) {
      return Scheme::kUnknown;
    }
    std::map<Scheme, int64_t> counts;
    std::set<std::string> bf16_names;
    for (const auto& m : modules) {
      if (m.role != role) continue;
      counts[m.spec.scheme] += m.multiplicity;
      if (m.spec.scheme == Scheme::kBf16) bf16_names.insert(group_name(m.name));
    }
    if (counts.empty()) {
      const bool mtp_unknown =
          role == Role::kMtpExperts && !in.tensors && arch.num_mtp_layers > 0 &&
          arch.n_routed_experts > 0 &&
          (!arch.mtp_names_known ||
           (arch.family == Family::kDeepseekV4 &&
            modules.end() == std::find_if(modules.begin(), modules.end(), [](const Module& m) {
              return m.role == Role::kMtpOther;
            })));
      if (mtp_unknown) {
        find(Severity::kInfo, "mtp_unknown",
             "the config declares " + std::to_string(arch.num_mtp_layers) +
                 " MTP layer(s) but this tool does not know how this checkpoint names them, so "
                 "their experts' format is unknown from configs alone");
        return Scheme::kUnknown;
      }
      if (!arch.has_config && role == Role::kMtpExperts) return Scheme::kUnknown;
      return Scheme::kAbsent;
    }
    if (counts.count(Scheme::kUnknown)) return Scheme::kUnknown;
    std::map<Scheme, int64_t> quantized;
    for (const auto& [s, n] : counts) {
      if (is_quantized(s)) quantized[s] = n;
    }
    if (quantized.empty()) return Scheme::kBf16;
    auto best = std::max_element(quantized.begin(), quantized.end(),
                                 [](const auto& a, const auto& b) { return a.second < b.second; });
    if (quantized.size() > 1) {
      find(Severity::kWarning, "mixed_role",
           std::string(to_string(role)) + " mixes quantized formats (" + scheme_list(counts) +
               " modules): the summary shows the most common; see modules for each group");
    } else if (counts.count(Scheme::kBf16)) {
      std::string names;
      for (const auto& n : bf16_names) {
        if (names.size() > 160) {
          names += ", ...";
          break;
        }
        names += (names.empty() ? "" : ", ") + n;
      }
      find(Severity::kInfo, "partially_quantized",
           std::string(to_string(role)) + " is " + std::string(to_string(best->first)) +
               " except " + std::to_string(counts[Scheme::kBf16]) +
               " module(s) left unquantized (" + names + ")");
    }
    return best->first;
  };
  man.summary.routed_experts = summarize(Role::kRoutedExperts);
  man.summary.shared_experts = summarize(Role::kSharedExperts);
  man.summary.attention = summarize(Role::kAttention);
  man.summary.dense_mlp = summarize(Role::kDenseMlp);
  man.summary.lm_head = summarize(Role::kLmHead);
  man.summary.mtp_experts = summarize(Role::kMtpExperts);

  if (is_quantized(man.summary.mtp_experts) && is_quantized(man.summary.routed_experts) &&
      man.summary.mtp_experts != man.summary.routed_experts) {
    // The module globs convert takes (--modules), from the expert groups' own names:
    // layers.*.ffn.experts.*.w1 -> layers.*.ffn.experts.*
    auto expert_globs = [&](Role role) {
      std::set<std::string> globs;
      for (const auto& m : modules) {
        if (m.role != role) continue;
        const std::string g = group_name(m.name);
        const size_t dot = g.rfind('.');
        globs.insert(dot == std::string::npos ? g : g.substr(0, dot));
      }
      std::string out;
      for (const auto& g : globs) out += " '" + g + "'";
      return out;
    };
    find(Severity::kWarning, "mtp_experts_differ",
         "MTP experts are " + std::string(to_string(man.summary.mtp_experts)) +
             " while the routed experts are " + std::string(to_string(man.summary.routed_experts)) +
             ": the MTP (draft) layers need their own kernels and must not get the routed "
             "experts' (known misroute: vLLM #49133 gave ignored mtp.* experts NVFP4 kernels). "
             "For an engine that runs them with the routed experts' kernel, convert them too, "
             "from the checkpoint they came from (SRC): `fp4moe convert SRC DST --to " +
             std::string(to_string(man.summary.routed_experts)) + " --modules" +
             expert_globs(Role::kRoutedExperts) + expert_globs(Role::kMtpExperts) +
             "`; one that reads them as they are (SGLang's DeepSeek-V4 hybrid path) needs them "
             "left so: `fp4moe plan DIR --target sm_100` (your GPU's sm_XX) shows what each engine "
             "does with them");
  }

  // KV cache.
  man.summary.kv_cache = claims.primary.kv;
  if (claims.sidecar && claims.sidecar->kv_declared && claims.primary.kv_declared &&
      claims.sidecar->kv != claims.primary.kv) {
    find(Severity::kWarning, "kv_cache_disagree",
         "KV cache: " + claims.primary.kv_source + " but " + claims.sidecar->kv_source +
             "; SGLang/vLLM follow config.json, TensorRT-LLM follows hf_quant_config.json");
  } else if (claims.sidecar && claims.sidecar->kv_declared && !claims.primary.kv_declared) {
    man.summary.kv_cache = claims.sidecar->kv;
    find(Severity::kInfo, "kv_cache_sidecar",
         "KV cache declared only in " + claims.sidecar->kv_source);
  }
  if (in.tensors) {
    const bool scales = !ev.kv_scale_tensors.empty();
    if (scales && !is_quantized(man.summary.kv_cache)) {
      find(Severity::kWarning, "kv_scales_undeclared",
           "tensors carry KV-cache scales (e.g. " + ev.kv_scale_tensors.front() +
               ") but the configs declare no quantized KV cache: a loader following the config "
               "ignores the calibrated scales");
    } else if (!scales && is_quantized(man.summary.kv_cache)) {
      find(Severity::kInfo, "kv_scales_missing",
           "the configs declare a quantized KV cache but no k_scale/v_scale tensors exist: "
           "the KV cache is then quantized without calibrated scales, which may clip");
    }
  }
  return man;
}

}  // namespace fp4moe::detect
