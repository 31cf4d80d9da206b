// Kernel routing per (scheme, target) and the batch-1 decode roofline of `fp4moe plan`.
#include "plan/plan.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "dispatch/cpu_features.h"
#include "kernels/registry.h"

namespace fp4moe::plan {
namespace {

using detect::Role;
using detect::Scheme;

double bytes_per_param(Scheme scheme) {
  switch (scheme) {
    case Scheme::kNvfp4:
      return 0.5 + 1.0 / 16;  // nibble + UE4M3 per 16
    case Scheme::kMxfp4:
      return 0.5 + 1.0 / 32;  // nibble + E8M0 per 32
    case Scheme::kFp8Block:
      return 1.0 + 4.0 / 16384;  // byte + F32 per 128x128
    case Scheme::kFp8Tensor:
      return 1.0;
    case Scheme::kFp8Channel:
      return 1.0;
    case Scheme::kMxfp8:
      return 1.0 + 1.0 / 32;
    case Scheme::kInt4:
      return 0.5 + 2.0 / 128;
    case Scheme::kBf16:
      return 2.0;
    case Scheme::kAbsent:
      return 2.0;
    case Scheme::kUnknown:
      return 2.0;
  }
  return 2.0;
}

struct Route {
  HardwarePath path;
  std::string kernel;
  std::string note;
};

bool is_moe_role(Role role) {
  return role == Role::kRoutedExperts || role == Role::kSharedExperts || role == Role::kDenseMlp ||
         role == Role::kMtpExperts;
}

HardwarePath from_engine_path(engines::Path path) {
  switch (path) {
    case engines::Path::kNativeFp4:
      return HardwarePath::kNativeFp4TensorCores;
    case engines::Path::kW4A16:
      return HardwarePath::kW4A16TensorCores;
    case engines::Path::kFp8:
      return HardwarePath::kFp8TensorCores;
    case engines::Path::kW8A16:
      return HardwarePath::kW8A16TensorCores;
    case engines::Path::kBf16:
      return HardwarePath::kBf16TensorCores;
    case engines::Path::kCpu:
      return HardwarePath::kCpuSimd;
    case engines::Path::kUnknown:
      return HardwarePath::kUnknown;
  }
  return HardwarePath::kUnknown;
}

// What the engine at its version detects for this module group and which kernel it runs on the
// target's architecture: all from the rules (src/engines/rules/*.json).
Route route_engine(const engines::EngineAt& engine, const engines::Facts& facts,
                   const detect::ModuleGroup& group, Target target, ModulePlan& m) {
  const engines::Verdict v = engines::evaluate(engine, facts, group, target_name(target));
  m.outcome = std::string(engines::outcome_name(v.outcome));
  m.quant_config = v.conclusion.quant_config;
  m.method = v.conclusion.method;
  m.reads = v.conclusion.reads;
  m.fixes = v.fixes;
  if (v.rule != nullptr) {
    m.rule = v.rule->id;
    m.rule_source = v.rule->source.cite();
  }
  if (v.backend != nullptr) {
    m.backend = v.backend->id;
    m.backend_source = v.backend->source.cite();
    m.precision = v.backend->precision;
    if (!v.backend->builds.empty()) m.method = v.backend->builds;
  }
  if (v.rule == nullptr) return {HardwarePath::kUnknown, "unknown", v.why};
  if (v.outcome == engines::Outcome::kNotRun) return {HardwarePath::kNotRunHere, "-", v.why};
  if (!v.conclusion.fails.empty()) return {HardwarePath::kNoKernel, "none", v.why};
  if (v.backend == nullptr) {
    std::string why =
        fmt::format("{} has no kernel row for {} / {} on {}: unknown", engine.engine->name,
                    v.conclusion.method, v.conclusion.reads, target_name(target));
    if (!v.why.empty()) why = v.why + "; " + why;
    return {HardwarePath::kUnknown, "unknown", why};
  }
  const HardwarePath path = v.outcome == engines::Outcome::kFails
                                ? HardwarePath::kNoKernel
                                : from_engine_path(v.backend->path);
  return {path, v.backend->kernel, v.why};
}

Route route_cpu(Scheme scheme, Role role) {
  std::optional<kernels::WeightFormat> format;
  if (scheme == Scheme::kNvfp4) format = kernels::WeightFormat::kNvfp4;
  if (scheme == Scheme::kMxfp4) format = kernels::WeightFormat::kMxfp4;
  if (scheme == Scheme::kFp8Block) format = kernels::WeightFormat::kFp8Block128;
  if (!is_moe_role(role)) {
    return {HardwarePath::kNotRunHere, "-",
            "fp4moe runs the MoE layer on the CPU, not this module"};
  }
  if (!format && scheme == Scheme::kBf16) {
    return {HardwarePath::kNotRunHere, "-",
            "fp4moe's CPU kernels run FP4 and FP8 experts; this BF16 module is not run here"};
  }
  if (!format) {
    return {HardwarePath::kNoKernel, "none",
            fmt::format("fp4moe has no CPU kernel for {}", detect::to_string(scheme))};
  }
  const kernels::Isa isa = dispatch::forced_isa().value_or(dispatch::best_host_isa());
  const kernels::KernelInfo* kernel = kernels::best_kernel(*format, isa);
  if (kernel == nullptr) {
    return {HardwarePath::kNoKernel, "none",
            fmt::format("no {} kernel for ISA {}", kernels::weight_format_name(*format),
                        kernels::isa_name(isa))};
  }
  return {HardwarePath::kCpuSimd, std::string(kernel->name),
          kernel->isa == isa
              ? fmt::format("selected for this host's best ISA ({})", kernels::isa_name(isa))
              : fmt::format("selected for this host's best ISA ({}): the {} kernel, the best at or "
                            "below it",
                            kernels::isa_name(isa), kernels::isa_name(kernel->isa))};
}

double tflops_of(const DeviceFigures& d, HardwarePath path) {
  switch (path) {
    case HardwarePath::kNativeFp4TensorCores:
      return d.fp4_tflops;
    case HardwarePath::kFp8TensorCores:
      return d.fp8_tflops;
    case HardwarePath::kW4A16TensorCores:
    case HardwarePath::kW8A16TensorCores:
    case HardwarePath::kBf16TensorCores:
      return d.bf16_tflops;
    case HardwarePath::kUnknown:
    case HardwarePath::kCpuSimd:
    case HardwarePath::kNotRunHere:
    case HardwarePath::kNoKernel:
      return 0;
  }
  return 0;
}

int64_t config_int(const nlohmann::json& config, std::initializer_list<const char*> keys) {
  for (const nlohmann::json* c :
       {&config, config.contains("text_config") ? &config["text_config"] : nullptr}) {
    if (c == nullptr || !c->is_object()) continue;
    for (const char* key : keys) {
      if (c->contains(key) && (*c)[key].is_number_integer()) return (*c)[key].get<int64_t>();
    }
  }
  return 0;
}

// Module names come from checkpoint files, which are untrusted: escape them in HTML.
std::string html_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '\'':
        out += "&#39;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

std::string_view target_name(Target target) {
  switch (target) {
    case Target::kCpu:
      return "cpu";
    case Target::kSm80:
      return "sm_80";
    case Target::kSm86:
      return "sm_86";
    case Target::kSm89:
      return "sm_89";
    case Target::kSm90:
      return "sm_90";
    case Target::kSm100:
      return "sm_100";
    case Target::kSm103:
      return "sm_103";
    case Target::kSm120:
      return "sm_120";
    case Target::kSm121:
      return "sm_121";
  }
  return "?";
}

Result<Target> parse_target(std::string_view name) {
  for (Target t : kAllTargets) {
    if (target_name(t) == name) return t;
  }
  return Error{
      fmt::format("unknown target '{}': expected one of cpu, sm_80, sm_86, sm_89, sm_90, sm_100, "
                  "sm_103, sm_120, sm_121",
                  name)};
}

std::string_view path_name(HardwarePath path) {
  switch (path) {
    case HardwarePath::kNativeFp4TensorCores:
      return "native FP4 tensor cores";
    case HardwarePath::kW4A16TensorCores:
      return "W4A16 tensor cores (Marlin-class)";
    case HardwarePath::kFp8TensorCores:
      return "FP8 tensor cores";
    case HardwarePath::kW8A16TensorCores:
      return "W8A16 tensor cores";
    case HardwarePath::kBf16TensorCores:
      return "BF16 tensor cores";
    case HardwarePath::kUnknown:
      return "unknown";
    case HardwarePath::kCpuSimd:
      return "CPU SIMD";
    case HardwarePath::kNotRunHere:
      return "not run here";
    case HardwarePath::kNoKernel:
      return "NO KERNEL";
  }
  return "?";
}

bool Plan::has_error() const {
  return std::any_of(findings.begin(), findings.end(),
                     [](const auto& f) { return f.severity == detect::Severity::kError; });
}

namespace {

// One finding per module group whose engine route is wrong, fails or is unknown, with the rule
// and the fixes.
void add_engine_findings(Plan& plan, const ModulePlan& m, const std::string& what, Target target,
                         const PlanOptions& options) {
  // An ok route with a note and fixes: the kernel runs but on placeholder activation scales.
  if (m.outcome == "not_run") return;  // another engine runs it (the note says which)
  if (m.outcome == "ok" && (m.note.empty() || m.fixes.empty())) return;
  std::string message =
      fmt::format("{}: {} on {}: {}", what, plan.engine_label, target_name(target), m.note);
  if (!m.rule.empty()) message += fmt::format(" [rule {}: {}]", m.rule, m.rule_source);
  for (const auto& fix : m.fixes) message += "; fix: " + fix;
  if (m.outcome == "ok") {
    plan.findings.push_back(
        {detect::Severity::kWarning, "engine_input_scale_placeholder", message});
    return;
  }
  if (m.outcome == "unknown") {
    plan.findings.push_back({detect::Severity::kInfo, "engine_unknown", message});
    return;
  }
  plan.findings.push_back(
      {options.engine_problems_are_errors ? detect::Severity::kError : detect::Severity::kWarning,
       m.outcome == "wrong" ? "engine_wrong_path" : "engine_fails", message});
}

}  // namespace

Plan make_plan(const detect::Manifest& manifest, const nlohmann::json& config, Target target,
               const PlanOptions& options) {
  Plan plan;
  plan.target = target;
  plan.device =
      options.gpu && target != Target::kCpu ? options.gpu->device : default_device(target);
  plan.gpu_count = options.gpu && target != Target::kCpu ? options.gpu->count : 1;
  if (target == Target::kCpu) plan.device.memory_gbps = options.cpu_bandwidth_gbps;
  const engines::EngineAt engine = options.engine.value_or(
      engines::at_version(engines::all_engines().front(), engines::all_engines().front().newest()));
  // On the CPU target: fp4moe's own kernels, or a CPU engine's rules when one is given.
  const bool own_cpu =
      target == Target::kCpu && !(options.engine && options.engine->engine->device == "cpu");
  if (own_cpu) {
    plan.engine = "fp4moe-cpu";
    plan.engine_label = "fp4moe CPU kernels";
  } else {
    plan.engine = engine.engine->id;
    plan.version = engine.version;
    plan.engine_label = engine.label();
  }
  engines::Facts config_only{
      {{"config", config}, {"hf_quant_config", nullptr}, {"tensor", nlohmann::json::object()}}};
  const engines::Facts& facts = options.facts != nullptr ? *options.facts : config_only;
  const int64_t top_k = config_int(config, {"num_experts_per_tok", "moe_topk", "top_k"});
  const int64_t experts = config_int(
      config, {"n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts"});
  const int64_t vocab = config_int(config, {"vocab_size"});
  for (const auto& group : manifest.modules) {
    if (group.role == Role::kOther || group.spec.scheme == Scheme::kAbsent) continue;
    ModulePlan m;
    m.group = group;
    Route route = own_cpu ? route_cpu(group.spec.scheme, group.role)
                          : route_engine(engine, facts, group, target, m);
    if (group.role == Role::kEmbedding) {
      route = {HardwarePath::kNotRunHere, "row gather",
               "an embedding is a table lookup, not a GEMM"};
    }
    m.path = route.path;
    m.kernel = route.kernel;
    m.note = route.note;
    if (own_cpu && m.path == HardwarePath::kCpuSimd) {
      // route_cpu picks the exact family (kernels/types.h): weights decoded, activations in F32.
      m.precision = group.spec.scheme == Scheme::kFp8Block
                        ? "W8A16: FP8 decoded exactly, F32 activations and sums"
                        : "W4A16: FP4 decoded exactly, F32 activations and sums";
    }
    // Batch-1 decode reads each dense module once per token, top_k of the routed experts, and one
    // row of the embedding table.
    double fraction = 1.0;
    if ((group.role == Role::kRoutedExperts || group.role == Role::kMtpExperts) && top_k > 0 &&
        experts > 0) {
      fraction = static_cast<double>(top_k) / static_cast<double>(experts);
    }
    if (group.role == Role::kEmbedding)
      fraction = vocab > 0 ? 1.0 / static_cast<double>(vocab) : 0.0;
    // Unknown bytes (a shape the config does not give) stay NaN: printed "unknown", null in JSON.
    m.bytes_per_token = group.bytes ? static_cast<double>(*group.bytes) * fraction : std::nan("");
    const double flops = 2.0 * m.bytes_per_token / bytes_per_param(group.spec.scheme);
    // A lower bound: the datasheet bandwidth of all the GPUs, fully used. No per-path efficiency
    // is applied (none is sourced); a path whose kernel is unknown gets no figure at all.
    const double bandwidth = plan.device.memory_gbps * 1e9 * plan.gpu_count;
    const double peak = tflops_of(plan.device, m.path) * 1e12 * plan.gpu_count;
    double seconds = bandwidth > 0 ? m.bytes_per_token / bandwidth : 0.0;
    if (peak > 0) seconds = std::max(seconds, flops / peak);
    const bool engine_problem = m.outcome == "wrong" || m.outcome == "fails";
    if (m.path == HardwarePath::kUnknown || engine_problem) seconds = std::nan("");
    if (m.path == HardwarePath::kNoKernel) seconds = own_cpu ? 0 : std::nan("");
    if (m.path == HardwarePath::kNotRunHere && group.role != Role::kEmbedding) seconds = 0;
    m.time_us = seconds * 1e6;
    const std::string what = fmt::format("{} ({}, {})", group.name, detect::to_string(group.role),
                                         detect::to_string(group.spec.scheme));
    switch (m.path) {
      case HardwarePath::kNoKernel:
        if (own_cpu) {  // an engine's failure is an engine finding below
          plan.findings.push_back(
              {detect::Severity::kError, "no_kernel",
               fmt::format("{}: no kernel on {}: {}", what, target_name(target), m.note)});
        }
        break;
      case HardwarePath::kUnknown:
      case HardwarePath::kW4A16TensorCores:
      case HardwarePath::kW8A16TensorCores:
      case HardwarePath::kNativeFp4TensorCores:
      case HardwarePath::kFp8TensorCores:
      case HardwarePath::kBf16TensorCores:
      case HardwarePath::kCpuSimd:
      case HardwarePath::kNotRunHere:
        break;
    }
    if (!own_cpu) add_engine_findings(plan, m, what, target, options);
    if (group.role != Role::kMtpExperts && group.role != Role::kMtpOther) {
      plan.bytes_per_token += m.bytes_per_token;
      plan.time_us += m.time_us;
    }
    plan.modules.push_back(std::move(m));
  }
  if (!manifest.tensors_checked) {
    plan.findings.push_back({detect::Severity::kInfo, "no_tensor_sizes",
                             "the safetensors headers were not read: bytes are estimated from "
                             "the config's dimensions (inspect --json: bytes_source), unknown "
                             "where the config gives no shape"});
  }
  return plan;
}

nlohmann::json to_json(const Plan& plan) {
  nlohmann::json modules = nlohmann::json::array();
  for (const auto& m : plan.modules) {
    modules.push_back({{"role", detect::to_string(m.group.role)},
                       {"name", m.group.name},
                       {"scheme", detect::to_string(m.group.spec.scheme)},
                       {"kernel", m.kernel},
                       {"path", path_name(m.path)},
                       {"bytes_per_token", m.bytes_per_token},
                       {"time_us", m.time_us},
                       {"note", m.note},
                       {"outcome", m.outcome},
                       {"quant_config", m.quant_config},
                       {"method", m.method},
                       {"reads", m.reads},
                       {"precision", m.precision},
                       {"rule", m.rule},
                       {"rule_source", m.rule_source},
                       {"backend", m.backend},
                       {"backend_source", m.backend_source},
                       {"fixes", m.fixes}});
  }
  nlohmann::json findings = nlohmann::json::array();
  for (const auto& f : plan.findings) {
    findings.push_back(
        {{"severity", detect::to_string(f.severity)}, {"code", f.code}, {"message", f.message}});
  }
  return {{"target", target_name(plan.target)},
          {"engine", plan.engine},
          {"version", plan.version},
          {"engine_label", plan.engine_label},
          {"gpu_count", plan.gpu_count},
          {"device",
           {{"gpu", plan.device.gpu},
            {"memory_gb", plan.device.memory_gb},
            {"memory_gbps", plan.device.memory_gbps},
            {"bf16_tflops", plan.device.bf16_tflops},
            {"fp8_tflops", plan.device.fp8_tflops},
            {"fp4_tflops", plan.device.fp4_tflops},
            {"source", plan.device.source}}},
          {"modules", modules},
          {"bytes_per_token", plan.bytes_per_token},
          {"time_us_per_token", plan.time_us},
          {"findings", findings}};
}

namespace {
// A figure, or "unknown" when it is not known (NaN).
std::string or_unknown(double v, int precision) {
  return std::isnan(v) ? std::string("unknown") : fmt::format("{:.{}f}", v, precision);
}
}  // namespace

std::string to_table(const Plan& plan) {
  std::string out =
      fmt::format("{} on target {} ({}{}; {:.0f} GB/s", plan.engine_label, target_name(plan.target),
                  plan.device.gpu, plan.gpu_count > 1 ? fmt::format(" x{}", plan.gpu_count) : "",
                  plan.device.memory_gbps);
  if (plan.target != Target::kCpu) {
    out += fmt::format(", BF16 {:.0f} / FP8 {:.0f} / FP4 {:.0f} TFLOPS", plan.device.bf16_tflops,
                       plan.device.fp8_tflops, plan.device.fp4_tflops);
  }
  out += fmt::format("; source: {})\n", plan.device.source);
  out += fmt::format("{:<16} {:<42} {:<11} {:<34} {:>12} {:>10}  {}\n", "role", "modules", "scheme",
                     "hardware path", "MB/token", "us/token", "kernel");
  for (const auto& m : plan.modules) {
    out += fmt::format("{:<16} {:<42} {:<11} {:<34} {:>12} {:>10}  {}\n",
                       detect::to_string(m.group.role), m.group.name,
                       detect::to_string(m.group.spec.scheme), path_name(m.path),
                       or_unknown(m.bytes_per_token / 1e6, 3), or_unknown(m.time_us, 2), m.kernel);
    if (!m.outcome.empty()) {
      out += fmt::format("    {}: {}{}{} -> {}{}{}\n", plan.engine, m.quant_config,
                         m.quant_config.empty() ? "" : " / ", m.method.empty() ? "-" : m.method,
                         m.outcome, m.rule.empty() ? "" : " [rule " + m.rule + "]",
                         m.note.empty() ? "" : ": " + m.note);
    }
  }
  out += fmt::format(
      "decode at batch 1 (MTP excluded): {} MB read per token, lower bound {} us "
      "per token (at most {} tokens/s; datasheet bandwidth, no efficiency applied)\n",
      or_unknown(plan.bytes_per_token / 1e6, 1), or_unknown(plan.time_us, 1),
      plan.time_us > 0 ? or_unknown(1e6 / plan.time_us, 0) : std::string("unknown"));
  for (const auto& f : plan.findings) {
    out += fmt::format("{}: [{}] {}\n", detect::to_string(f.severity), f.code, f.message);
  }
  return out;
}

std::string to_html(const std::vector<Plan>& plans, std::string_view title) {
  // Log-log axes over every point of every plan.
  double min_b = 1e300, max_b = 0, min_t = 1e300, max_t = 0;
  for (const auto& p : plans) {
    for (const auto& m : p.modules) {
      if (!(m.bytes_per_token > 0) || !(m.time_us > 0)) continue;  // also unknown (NaN)
      min_b = std::min(min_b, m.bytes_per_token), max_b = std::max(max_b, m.bytes_per_token);
      min_t = std::min(min_t, m.time_us), max_t = std::max(max_t, m.time_us);
    }
  }
  if (max_b <= 0) min_b = 1, max_b = 10, min_t = 1, max_t = 10;
  const double lb0 = std::floor(std::log10(min_b)),
               lb1 = std::ceil(std::log10(max_b)) + (min_b == max_b);
  const double lt0 = std::floor(std::log10(min_t)),
               lt1 = std::ceil(std::log10(max_t)) + (min_t == max_t);
  const int w = 760, h = 460, left = 70, bottom = 50, top = 20, right = 200;
  auto x_of = [&](double b) {
    return left + (std::log10(b) - lb0) / (lb1 - lb0) * (w - left - right);
  };
  auto y_of = [&](double t) {
    return h - bottom - (std::log10(t) - lt0) / (lt1 - lt0) * (h - top - bottom);
  };
  static const char* kColors[] = {"#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02"};
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << w << "' height='" << h
      << "' font-family='sans-serif' font-size='12'>\n";
  svg << "<rect x='" << left << "' y='" << top << "' width='" << (w - left - right) << "' height='"
      << (h - top - bottom) << "' fill='none' stroke='#888'/>\n";
  for (double e = lb0; e <= lb1; ++e) {
    svg << "<text x='" << x_of(std::pow(10, e)) << "' y='" << (h - bottom + 16)
        << "' text-anchor='middle'>1e" << e << "</text>\n";
  }
  for (double e = lt0; e <= lt1; ++e) {
    svg << "<text x='" << (left - 6) << "' y='" << y_of(std::pow(10, e)) + 4
        << "' text-anchor='end'>1e" << e << "</text>\n";
  }
  svg << "<text x='" << (left + (w - left - right) / 2) << "' y='" << (h - 10)
      << "' text-anchor='middle'>weight bytes read per token</text>\n";
  svg << "<text x='16' y='" << (top + (h - top - bottom) / 2) << "' transform='rotate(-90 16 "
      << (top + (h - top - bottom) / 2)
      << ")' text-anchor='middle'>estimated us per token</text>\n";
  for (size_t i = 0; i < plans.size(); ++i) {
    const char* color = kColors[i % 6];
    svg << "<text x='" << (w - right + 16) << "' y='" << (top + 16 + 18 * static_cast<int>(i))
        << "' fill='" << color << "'>&#9679; " << target_name(plans[i].target) << " ("
        << plans[i].device.gpu << ")</text>\n";
    for (const auto& m : plans[i].modules) {
      if (!(m.bytes_per_token > 0) || !(m.time_us > 0)) continue;  // also unknown (NaN)
      const bool slow = m.outcome == "wrong" || m.outcome == "fails";
      svg << "<circle cx='" << x_of(m.bytes_per_token) << "' cy='" << y_of(m.time_us) << "' r='"
          << (slow ? 7 : 5) << "' fill='" << color << "'"
          << (slow ? " stroke='red' stroke-width='2'" : "") << "><title>"
          << target_name(plans[i].target) << " " << html_escape(m.group.name) << ": "
          << path_name(m.path) << ", " << fmt::format("{:.3f}", m.bytes_per_token / 1e6) << " MB, "
          << fmt::format("{:.2f}", m.time_us) << " us</title></circle>\n";
    }
  }
  svg << "</svg>\n";
  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>" << html_escape(title)
       << "</title>\n<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
          "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}.slow{color:#c00}</style>"
          "</head><body>\n<h1>"
       << html_escape(title)
       << "</h1>\n<p>Each point is one module group on one target: weight bytes read per "
          "decoded token (batch 1) against the roofline time estimate. Circled in red: "
          "CUDA-cores-only paths.</p>\n"
       << svg.str()
       << "<table><tr><th>target</th><th>role</th><th>modules</th><th>scheme</th>"
          "<th>hardware path</th><th>MB/token</th><th>us/token</th><th>kernel</th></tr>\n";
  for (const auto& p : plans) {
    for (const auto& m : p.modules) {
      html << "<tr" << (m.outcome == "wrong" || m.outcome == "fails" ? " class='slow'" : "")
           << "><td>" << target_name(p.target) << "</td><td>" << detect::to_string(m.group.role)
           << "</td><td>" << html_escape(m.group.name) << "</td><td>"
           << detect::to_string(m.group.spec.scheme) << "</td><td>" << path_name(m.path)
           << "</td><td>" << or_unknown(m.bytes_per_token / 1e6, 3) << "</td><td>"
           << or_unknown(m.time_us, 2) << "</td><td>" << html_escape(m.kernel) << "</td></tr>\n";
    }
  }
  html << "</table></body></html>\n";
  return html.str();
}

}  // namespace fp4moe::plan
