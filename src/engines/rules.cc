// Parsing and evaluation of the embedded engine rules (src/engines/rules/*.json).
#include "engines/rules.h"

#include <fmt/core.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <regex>

#include "checkpoint/checkpoint_dir.h"
#include "core/check.h"
#include "engines/embedded.h"

namespace fp4moe::engines {
namespace {

using nlohmann::json;

std::string str(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  return it->dump();
}

std::vector<std::string> strings(const json& j, const char* key) {
  std::vector<std::string> out;
  auto it = j.find(key);
  if (it != j.end() && it->is_array()) {
    for (const auto& v : *it) out.push_back(v.is_string() ? v.get<std::string>() : v.dump());
  }
  return out;
}

Source parse_source(const json& j) {
  Source s;
  if (!j.is_object()) return s;
  s.file = str(j, "file");
  s.function = str(j, "function");
  s.version = str(j, "version");
  s.pr = str(j, "pr");
  s.commit = str(j, "commit");
  s.evidence = str(j, "evidence");
  s.also = str(j, "also");
  if (j.contains("line") && j["line"].is_number_integer()) s.line = j["line"].get<int>();
  return s;
}

Path parse_path(std::string_view name) {
  if (name == "native_fp4") return Path::kNativeFp4;
  if (name == "w4a16") return Path::kW4A16;
  if (name == "fp8") return Path::kFp8;
  if (name == "w8a16") return Path::kW8A16;
  if (name == "bf16") return Path::kBf16;
  if (name == "cpu") return Path::kCpu;
  return Path::kUnknown;
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// Every value at a dotted path; "*" expands over an object's values or an array's elements, a
// number indexes an array. Nothing found = absent.
void lookup(const json& node, const std::vector<std::string>& parts, size_t i,
            std::vector<json>& out) {
  if (node.is_null()) return;
  if (i == parts.size()) {
    out.push_back(node);
    return;
  }
  const std::string& p = parts[i];
  if (p == "*") {
    if (node.is_object() || node.is_array()) {
      for (const auto& v : node) lookup(v, parts, i + 1, out);
    }
    return;
  }
  if (node.is_object()) {
    auto it = node.find(p);
    if (it != node.end()) lookup(*it, parts, i + 1, out);
  } else if (node.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), ::isdigit)) {
    const size_t k = std::stoul(p);
    if (k < node.size()) lookup(node[k], parts, i + 1, out);
  }
}

std::vector<json> values_at(const json& root, std::string_view path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = path.find('.', start);
    parts.emplace_back(path.substr(start, dot == std::string_view::npos ? path.npos : dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  std::vector<json> out;
  lookup(root, parts, 0, out);
  // Arrays compare element-wise (config.architectures is a list).
  std::vector<json> flat;
  for (auto& v : out) {
    if (v.is_array()) {
      for (auto& e : v) flat.push_back(e);
    } else {
      flat.push_back(std::move(v));
    }
  }
  return flat;
}

// `module` holds the "module.*" facts of the group at hand, so that the checkpoint's facts (whole
// configs, megabytes for the largest) are never copied per module group.
bool holds(const json& cond, const json& root, const json& module) {
  if (cond.contains("all")) {
    return std::all_of(cond["all"].begin(), cond["all"].end(),
                       [&](const json& c) { return holds(c, root, module); });
  }
  if (cond.contains("any")) {
    return std::any_of(cond["any"].begin(), cond["any"].end(),
                       [&](const json& c) { return holds(c, root, module); });
  }
  if (cond.contains("not")) return !holds(cond["not"], root, module);
  const std::string op = str(cond, "op");
  const std::string fact = str(cond, "fact");
  const std::vector<json> vals = values_at(fact.rfind("module.", 0) == 0 ? module : root, fact);
  const json& want = cond.contains("value") ? cond["value"] : json();
  auto in_list = [&](const json& v) {
    return want.is_array() && std::find(want.begin(), want.end(), v) != want.end();
  };
  auto any = [&](auto pred) { return std::any_of(vals.begin(), vals.end(), pred); };
  if (op == "exists") return !vals.empty();
  if (op == "absent") return vals.empty();
  if (op == "eq") return any([&](const json& v) { return v == want; });
  if (op == "upper_eq" || op == "any_upper_eq") {
    return any([&](const json& v) {
      return v.is_string() && want.is_string() && upper(v.get<std::string>()) == want;
    });
  }
  if (op == "in" || op == "any_in") return any(in_list);
  if (op == "contains") {  // a substring of a string fact (a tensor name)
    return any([&](const json& v) {
      return v.is_string() && want.is_string() &&
             v.get<std::string>().find(want.get<std::string>()) != std::string::npos;
    });
  }
  if (op == "not_in") return !any(in_list);
  FP4MOE_CHECK(false && "unknown op in the engine rules (the rules test catches this)");
  return false;
}

Result<Engine> parse_engine_json(const json& j, std::string_view label) {
  if (!j.is_object() || !j.contains("engine") || !j.contains("rules") || !j.contains("backends")) {
    return Error{fmt::format("{}: an engine rules file needs engine, rules and backends", label)};
  }
  Engine e;
  e.id = str(j, "engine");
  e.name = str(j, "name");
  e.package = str(j, "package");
  e.repo = str(j, "repo");
  e.package_dir_in_checkout = str(j, "package_dir_in_checkout");
  e.releases_source = str(j, "releases_source");
  if (j.contains("device")) e.device = str(j, "device");
  if (e.device != "gpu" && e.device != "cpu") {
    return Error{fmt::format("{}: engine device must be gpu or cpu, not '{}'", label, e.device)};
  }
  e.releases = strings(j, "releases");
  e.ran = strings(j, "ran");
  if (j.contains("prs")) {
    for (const auto& p : j["prs"]) {
      e.prs.push_back({str(p, "id"), str(p, "title"), str(p, "merged"), str(p, "commit"),
                       str(p, "first_release"), strings(p, "markers")});
    }
  }
  if (j.contains("markers")) {
    for (const auto& m : j["markers"]) {
      e.markers.push_back({str(m, "id"), str(m, "file"), str(m, "text"), str(m, "first"),
                           str(m, "last"), str(m, "means")});
    }
  }
  for (const auto& r : j["rules"]) {
    Rule rule;
    rule.id = str(r, "id");
    rule.engine = e.id;
    rule.first = str(r, "first");
    rule.last = str(r, "last");
    rule.pr = str(r, "pr");
    rule.pr_absent = str(r, "pr_absent");
    rule.condition = str(r, "condition");
    rule.when = r.value("when", json::object());
    if (r.contains("modules")) {
      for (const auto& [role, c] : r["modules"].items()) {
        rule.modules[role] = {str(c, "quant_config"), str(c, "method"), str(c, "reads"),
                              str(c, "activation"),   str(c, "fails"),  str(c, "not_run")};
      }
    }
    rule.wrong_consequence = str(r, "wrong_consequence");
    rule.fixes = strings(r, "fixes");
    if (r.contains("ignored_flags")) {
      for (const auto& f : r["ignored_flags"]) {
        rule.ignored_flags.push_back({str(f, "flag"), str(f, "first"), str(f, "last"),
                                      str(f, "effect"), str(f, "evidence")});
      }
    }
    rule.source = parse_source(r.value("source", json::object()));
    if (rule.id.empty() || rule.source.file.empty() || rule.modules.empty()) {
      return Error{fmt::format("{}: rule '{}' needs id, modules and source.file", label, rule.id)};
    }
    e.rules.push_back(std::move(rule));
  }
  for (const auto& b : j["backends"]) {
    Backend be;
    be.id = str(b, "id");
    be.engine = e.id;
    be.method = str(b, "method");
    be.reads = str(b, "reads");
    be.first = str(b, "first");
    be.last = str(b, "last");
    be.flags = str(b, "flags");
    be.kernel = str(b, "kernel");
    be.precision = str(b, "precision");
    be.builds = str(b, "builds");
    be.archs = strings(b, "archs");
    be.runs_on = strings(b, "runs_on");
    be.rules = strings(b, "rules");
    be.path = parse_path(str(b, "path"));
    be.fixes = strings(b, "fixes");
    be.source = parse_source(b.value("source", json::object()));
    if (be.id.empty() || be.method.empty() || be.archs.empty() || be.source.file.empty()) {
      return Error{
          fmt::format("{}: backend '{}' needs id, method, archs and source.file", label, be.id)};
    }
    e.backends.push_back(std::move(be));
  }
  if (e.id != "*" && e.releases.empty()) {
    return Error{fmt::format("{}: engine '{}' lists no releases", label, e.id)};
  }
  return e;
}

struct Tables {
  std::vector<Engine> engines, cpu;
  Engine fallback;
};

const Tables& tables() {
  static const Tables t = [] {
    Tables out;
    for (const auto& file : embedded_rules()) {
      auto e = parse_engine(file.text, file.name);
      // The embedded files were validated by the build; a failure here is a broken invariant.
      FP4MOE_CHECK(e.ok());
      if (e->id == "*") {
        out.fallback = std::move(e).value();
      } else if (e->device == "cpu") {
        out.cpu.push_back(std::move(e).value());
      } else {
        out.engines.push_back(std::move(e).value());
      }
    }
    return out;
  }();
  return t;
}

bool has(const std::vector<std::string>& list, std::string_view v) {
  return std::find(list.begin(), list.end(), v) != list.end();
}

bool rule_applies(const Rule& r, const EngineAt& at) {
  if (!r.pr.empty()) return at.prs.count(r.pr) > 0;
  if (!r.pr_absent.empty()) return at.prs.count(r.pr_absent) == 0;
  return version_in(at.version, r.first, r.last);
}

std::string role_name(detect::Role role) { return std::string(detect::to_string(role)); }

}  // namespace

std::string Source::cite() const {
  std::string out = file;
  if (line > 0) out += fmt::format(":{}", line);
  if (!function.empty()) out += fmt::format(" ({})", function);
  if (!version.empty()) out += " @" + version;
  if (!pr.empty()) out += " PR #" + pr;
  if (!commit.empty()) out += " commit " + commit;
  if (!evidence.empty()) out += " [" + evidence + "]";
  return out;
}

std::string_view path_name(Path path) {
  switch (path) {
    case Path::kNativeFp4:
      return "native FP4 tensor cores";
    case Path::kW4A16:
      return "W4A16 tensor cores (Marlin-class)";
    case Path::kFp8:
      return "FP8 tensor cores";
    case Path::kW8A16:
      return "W8A16 tensor cores";
    case Path::kBf16:
      return "BF16 tensor cores";
    case Path::kCpu:
      return "CPU SIMD";
    case Path::kUnknown:
      return "unknown";
  }
  return "unknown";
}

std::string_view outcome_name(Outcome outcome) {
  switch (outcome) {
    case Outcome::kOk:
      return "ok";
    case Outcome::kWrong:
      return "wrong";
    case Outcome::kFails:
      return "fails";
    case Outcome::kUnknown:
      return "unknown";
    case Outcome::kNotRun:
      return "not_run";
  }
  return "unknown";
}

const Pr* Engine::find_pr(std::string_view pr_id) const {
  for (const auto& p : prs) {
    if (p.id == pr_id) return &p;
  }
  return nullptr;
}

const Marker* Engine::find_marker(std::string_view marker_id) const {
  for (const auto& m : markers) {
    if (m.id == marker_id) return &m;
  }
  return nullptr;
}

Result<Engine> parse_engine(std::string_view text, std::string_view label) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return Error{fmt::format("{}: not valid JSON", label)};
  return parse_engine_json(j, label);
}

const std::vector<Engine>& all_engines() { return tables().engines; }
const std::vector<Engine>& cpu_engines() { return tables().cpu; }
const Engine& format_fallback() { return tables().fallback; }

const Engine* find_engine(std::string_view engine_id) {
  for (const auto* list : {&all_engines(), &cpu_engines()}) {
    for (const auto& e : *list) {
      if (e.id == engine_id) return &e;
    }
  }
  return nullptr;
}

const Rule* find_rule(std::string_view rule_id) {
  for (const auto* list : {&all_engines(), &cpu_engines()}) {
    for (const auto& e : *list) {
      for (const auto& r : e.rules) {
        if (r.id == rule_id) return &r;
      }
    }
  }
  for (const auto& r : format_fallback().rules) {
    if (r.id == rule_id) return &r;
  }
  return nullptr;
}

int compare_versions(std::string_view a, std::string_view b) {
  if (a == b) return 0;
  if (a == "main") return 1;
  if (b == "main") return -1;
  // Components: numbers compare as numbers; "postN" sorts after the release, "rcN"/"devN" before.
  auto parts = [](std::string_view v) {
    std::vector<std::pair<int, long>> out;  // (rank, number): release 1, post 2, rc/dev 0
    size_t i = 0;
    while (i < v.size()) {
      while (i < v.size() && (v[i] == '.' || v[i] == '-' || v[i] == '+')) ++i;
      size_t j = i;
      while (j < v.size() && std::isalpha(static_cast<unsigned char>(v[j]))) ++j;
      const std::string_view word = v.substr(i, j - i);
      size_t k = j;
      while (k < v.size() && std::isdigit(static_cast<unsigned char>(v[k]))) ++k;
      const long n = k > j ? std::stol(std::string(v.substr(j, k - j))) : 0;
      if (k == i) break;
      out.push_back({word.empty() ? 1 : (word == "post" ? 2 : 0), n});
      i = k;
    }
    return out;
  };
  const auto pa = parts(a), pb = parts(b);
  for (size_t i = 0; i < std::max(pa.size(), pb.size()); ++i) {
    const std::pair<int, long> x = i < pa.size() ? pa[i] : std::pair<int, long>{1, -1};
    const std::pair<int, long> y = i < pb.size() ? pb[i] : std::pair<int, long>{1, -1};
    // A missing component: a release ends there (0.5.13 < 0.5.13.post1, 0.5.13rc1 < 0.5.13).
    if (x != y) {
      if (x.first != y.first) return x.first < y.first ? -1 : 1;
      return x.second < y.second ? -1 : 1;
    }
  }
  return 0;
}

bool version_in(std::string_view version, std::string_view first, std::string_view last) {
  if (!first.empty() && compare_versions(version, first) < 0) return false;
  if (!last.empty() && compare_versions(version, last) > 0) return false;
  return true;
}

std::string EngineAt::label() const {
  return engine == nullptr ? "?" : engine->name + " " + version;
}

EngineAt at_version(const Engine& engine, std::string_view version) {
  EngineAt at{&engine, std::string(version), {}};
  for (const auto& pr : engine.prs) {
    if (!pr.first_release.empty() && compare_versions(version, pr.first_release) >= 0) {
      at.prs.insert(pr.id);
    }
  }
  return at;
}

Result<EngineAt> parse_engine_spec(std::string_view spec) {
  const size_t at = spec.find('@');
  const std::string_view name = spec.substr(0, at);
  const Engine* engine = find_engine(name);
  if (engine == nullptr) {
    return Error{fmt::format(
        "unknown engine '{}': expected sglang, vllm or trtllm (GPU), llamacpp or ktkernel (CPU)",
        name)};
  }
  if (at == std::string_view::npos) return at_version(*engine, engine->newest());
  const std::string_view version = spec.substr(at + 1);
  if (!has(engine->releases, version)) {
    std::string known;
    for (const auto& r : engine->releases) known += (known.empty() ? "" : ", ") + r;
    return Error{
        fmt::format("{} {} is not a release the rules know ({})", engine->name, version, known)};
  }
  return at_version(*engine, version);
}

Facts make_facts(const detect::InspectedDirectory& inspected, const std::filesystem::path& dir) {
  Facts f;
  f.root = {{"config", inspected.config},
            {"hf_quant_config", inspected.hf_quant_config},
            {"tensor", json::object()}};
  // The engines' DeepSeek-V4 probe: the dtype of one routed expert's weight (not an MTP layer's).
  auto ckpt = checkpoint::CheckpointDir::open(dir);
  if (ckpt.ok()) {
    static const std::regex kExpert(
        R"((^|\.)layers\.\d+\.(ffn|mlp)\.experts\.\d+\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$)");
    for (const auto& t : ckpt->tensors()) {
      if (std::regex_search(t.info->name, kExpert) &&
          t.info->name.find("mtp") == std::string::npos) {
        f.root["tensor"]["routed_expert_dtype"] =
            std::string(checkpoint::dtype_name(t.info->dtype));
        f.root["tensor"]["routed_expert_tensor"] = t.info->name;
        break;
      }
    }
    // The routed experts' activation scales: all exactly 1.0 is a placeholder (fp4moe convert's
    // uncalibrated default; `fp4moe check` reports it as input_scale_default), which a W4A4
    // kernel would quantize activations with.
    int64_t scales = 0, ones = 0;
    for (const auto& t : ckpt->tensors()) {
      const std::string& n = t.info->name;
      constexpr std::string_view kSuffix = ".input_scale";
      if (n.size() <= kSuffix.size() ||
          n.compare(n.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0 ||
          n.find(".experts.") == std::string::npos || n.find("mtp") != std::string::npos ||
          t.info->dtype != checkpoint::DType::F32 || t.info->element_count != 1) {
        continue;
      }
      auto bytes = ckpt->data(t);
      if (!bytes.ok() || bytes->size() != sizeof(float)) continue;
      float value = 0;
      std::memcpy(&value, bytes->data(), sizeof value);
      ++scales;
      if (value == 1.0f) ++ones;
    }
    if (scales > 0) f.root["tensor"]["input_scale_placeholder"] = ones == scales;
  }
  return f;
}

Verdict evaluate(const EngineAt& at, const Facts& facts, const detect::ModuleGroup& group,
                 std::string_view arch) {
  Verdict v;
  const std::string role = role_name(group.role);
  const std::string scheme(detect::to_string(group.spec.scheme));
  const json module = {{"module", {{"scheme", scheme}, {"role", role}}}};
  for (const Engine* e : {at.engine, &format_fallback()}) {
    for (const auto& r : e->rules) {
      auto it = r.modules.find(role);
      if (it == r.modules.end()) it = r.modules.find("*");
      if (it == r.modules.end() || !rule_applies(r, at) || !holds(r.when, facts.root, module))
        continue;
      v.rule = &r;
      v.conclusion = it->second;
      break;
    }
    if (v.rule != nullptr) break;
  }
  if (v.rule == nullptr) {
    v.outcome = Outcome::kUnknown;
    v.why = fmt::format("no {} rule covers {} stored as {}", at.engine->name, role, scheme);
    if (!facts.root["tensor"].contains("routed_expert_dtype")) {
      v.why += " (no safetensors headers here: the engines' routed-expert dtype probe cannot run)";
    }
    return v;
  }
  const Conclusion& c = v.conclusion;
  if (!c.not_run.empty()) {
    v.outcome = Outcome::kNotRun;
    v.why = c.not_run;
    return v;
  }
  v.outcome = Outcome::kOk;
  if (!c.fails.empty()) {
    v.outcome = Outcome::kFails;
    v.why = c.fails;
  } else if (c.reads != scheme) {
    v.outcome = Outcome::kWrong;
    v.why = fmt::format("{} reads these {} bytes as {}", c.method, scheme, c.reads);
    if (!v.rule->wrong_consequence.empty()) v.why += ": " + v.rule->wrong_consequence;
  } else if (c.activation == "nvfp4" && group.spec.activation == detect::Activation::kNone) {
    v.outcome = Outcome::kWrong;
    v.why = fmt::format(
        "{} is W4A4 (NVFP4 activations) and expects input_scale, which these weight-only "
        "modules do not have",
        c.method);
  }
  if (v.outcome != Outcome::kOk) v.fixes = v.rule->fixes;
  if (arch.empty() || !c.fails.empty()) return v;
  for (const Engine* e : {at.engine, &format_fallback()}) {
    for (const auto& b : e->backends) {
      if (b.method != c.method || (!b.reads.empty() && b.reads != c.reads) ||
          !version_in(at.version, b.first, b.last) || !has(b.archs, arch) ||
          (!b.rules.empty() && !has(b.rules, v.rule->id))) {
        continue;
      }
      if (b.flags.empty()) {
        if (v.backend == nullptr) v.backend = &b;
      } else {
        v.alternatives.push_back(&b);
      }
    }
  }
  if (v.backend != nullptr && !v.backend->runs_on.empty() && !has(v.backend->runs_on, arch)) {
    if (v.outcome == Outcome::kOk) {
      v.outcome = Outcome::kFails;
      v.why =
          fmt::format("{} runs only on {}", v.backend->kernel, fmt::join(v.backend->runs_on, ", "));
    }
    for (const auto& fix : v.backend->fixes) v.fixes.push_back(fix);
  }
  // W4A4 on placeholder activation scales: the kernel runs, with uncalibrated activation scaling.
  const json& tensor = facts.root["tensor"];
  if (v.outcome == Outcome::kOk && c.activation == "nvfp4" && v.backend != nullptr &&
      v.backend->path == Path::kNativeFp4 && tensor.value("input_scale_placeholder", false)) {
    v.why = fmt::format(
        "every input_scale is the placeholder 1.0 (uncalibrated, fp4moe check: "
        "input_scale_default) and {} quantizes activations with it",
        v.backend->kernel);
    for (const Backend* alt : v.alternatives) {
      if (alt->path == Path::kW4A16) {
        v.fixes.push_back(fmt::format("launch with {}: {} ({}), which ignores input_scale",
                                      alt->flags, alt->kernel, alt->precision));
      }
    }
    v.fixes.push_back(
        "or calibrate: convert again from the source with `fp4moe convert SRC DST "
        "--activation-amax FILE` "
        "(docs/CONVERT.md)");
  }
  const bool path_unknown = v.backend == nullptr || v.backend->path == Path::kUnknown;
  if (v.outcome != Outcome::kOk || path_unknown) {
    for (const Backend* alt : v.alternatives) {
      if (alt->path == Path::kW4A16 || v.outcome == Outcome::kFails || path_unknown) {
        v.fixes.push_back(fmt::format("alternative: launch with {}: {} ({})", alt->flags,
                                      alt->kernel, alt->precision));
      }
    }
  }
  return v;
}

}  // namespace fp4moe::engines
