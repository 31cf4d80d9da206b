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

// Dense (no sparsity) peak figures. The CPU row is filled from the bandwidth measured in the run.
DeviceFigures device_figures(Target target) {
  switch (target) {
    case Target::kCpu:
      return {"this CPU", 0, 0, 0, 0, "memory read bandwidth measured in this run"};
    case Target::kSm80:
      return {"A100 SXM4 80GB", 2039, 312, 0, 0, "NVIDIA A100 Tensor Core GPU datasheet"};
    case Target::kSm89:
      return {"L40S", 864, 362, 733, 0, "NVIDIA L40S datasheet (dense = half the sparse figure)"};
    case Target::kSm90:
      return {"H100 SXM5 80GB", 3350, 989, 1979, 0, "NVIDIA H100 Tensor Core GPU datasheet"};
    case Target::kSm100:
      return {"B200", 8000, 2250, 4500, 9000, "NVIDIA HGX B200 specifications, per GPU, dense"};
    case Target::kSm120:
      return {"RTX PRO 6000 Blackwell",
              1792,
              500,
              1000,
              2000,
              "NVIDIA RTX PRO 6000 Blackwell datasheet (4 PFLOPS FP4 with sparsity; 1792 GB/s)"};
  }
  return {};
}

// The slow path of the seed: per-(token, expert) dequantize + GEMV on CUDA cores measured ~7x
// slower than a Marlin-class kernel (../shared/FORMATS.md §5). Applied on top of the roofline.
constexpr double kCudaCoresSlowdown = 7.0;

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

Route route_gpu(Scheme scheme, Target target) {
  const bool blackwell = target == Target::kSm100 || target == Target::kSm120;
  const bool fp8_cores = target != Target::kSm80;
  switch (scheme) {
    case Scheme::kNvfp4:
      if (target == Target::kSm100) {
        return {HardwarePath::kNativeFp4TensorCores,
                "NVFP4 grouped GEMM (tcgen05.mma kind::mxf4nvf4)", ""};
      }
      if (target == Target::kSm120) {
        return {HardwarePath::kNativeFp4TensorCores,
                "NVFP4 grouped GEMM (mma.sync kind::mxf4nvf4.block_scale m16n8k64)", ""};
      }
      return {HardwarePath::kW4A16TensorCores, "Marlin-class W4A16 NVFP4 GEMM",
              "no FP4 tensor cores: NVFP4 is dequantized to BF16 in registers"};
    case Scheme::kMxfp4:
      if (target == Target::kSm100) {
        return {HardwarePath::kNativeFp4TensorCores, "MXFP4 grouped GEMM (tcgen05.mma kind::mxf4)",
                ""};
      }
      if (target == Target::kSm120) {
        return {HardwarePath::kCudaCoresOnly, "per-(token, expert) MXFP4 dequant + GEMV",
                "the engines ship no MXFP4 MoE grouped-GEMM kernel for sm_120; convert to NVFP4 "
                "(fp4moe convert --to nvfp4, lossless) for the native FP4 tensor-core path"};
      }
      return {HardwarePath::kW4A16TensorCores, "Marlin-class W4A16 MXFP4 GEMM",
              "no FP4 tensor cores: MXFP4 is dequantized to BF16 in registers"};
    case Scheme::kFp8Block:
    case Scheme::kFp8Tensor:
    case Scheme::kFp8Channel:
      if (fp8_cores)
        return {HardwarePath::kFp8TensorCores, "FP8 scaled GEMM (DeepGEMM / CUTLASS)", ""};
      return {HardwarePath::kW8A16TensorCores, "Marlin-class W8A16 FP8 GEMM",
              "sm_80 has no FP8 tensor cores: FP8 is dequantized to BF16"};
    case Scheme::kMxfp8:
      if (blackwell) return {HardwarePath::kFp8TensorCores, "MXFP8 block-scaled GEMM", ""};
      return {HardwarePath::kW8A16TensorCores, "W8A16 MXFP8 GEMM (dequantized to BF16)",
              "no block-scaled FP8 MMA before Blackwell"};
    case Scheme::kInt4:
      return {HardwarePath::kW4A16TensorCores, "Marlin W4A16 INT4 GEMM", ""};
    case Scheme::kBf16:
      return {HardwarePath::kBf16TensorCores, "BF16 GEMM (cuBLAS)", ""};
    case Scheme::kAbsent:
    case Scheme::kUnknown:
      break;
  }
  return {HardwarePath::kNoKernel, "none", "the scheme is unknown: no kernel can be chosen"};
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
    case HardwarePath::kCudaCoresOnly:
      return d.bf16_tflops;
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
    case Target::kSm89:
      return "sm_89";
    case Target::kSm90:
      return "sm_90";
    case Target::kSm100:
      return "sm_100";
    case Target::kSm120:
      return "sm_120";
  }
  return "?";
}

Result<Target> parse_target(std::string_view name) {
  for (Target t : kAllTargets) {
    if (target_name(t) == name) return t;
  }
  return Error{
      fmt::format("unknown target '{}': expected one of cpu, sm_80, sm_89, sm_90, sm_100, "
                  "sm_120",
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
    case HardwarePath::kCudaCoresOnly:
      return "CUDA cores only";
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

Plan make_plan(const detect::Manifest& manifest, const nlohmann::json& config, Target target,
               const PlanOptions& options) {
  Plan plan;
  plan.target = target;
  plan.device = device_figures(target);
  if (target == Target::kCpu) plan.device.memory_gbps = options.cpu_bandwidth_gbps;
  const int64_t top_k = config_int(config, {"num_experts_per_tok", "moe_topk", "top_k"});
  const int64_t experts = config_int(
      config, {"n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts"});
  const int64_t vocab = config_int(config, {"vocab_size"});
  for (const auto& group : manifest.modules) {
    if (group.role == Role::kOther || group.spec.scheme == Scheme::kAbsent) continue;
    ModulePlan m;
    m.group = group;
    Route route = target == Target::kCpu ? route_cpu(group.spec.scheme, group.role)
                                         : route_gpu(group.spec.scheme, target);
    if (group.role == Role::kEmbedding) {
      route = {HardwarePath::kNotRunHere, "row gather",
               "an embedding is a table lookup, not a GEMM"};
    }
    m.path = route.path;
    m.kernel = route.kernel;
    m.note = route.note;
    // Batch-1 decode reads each dense module once per token, top_k of the routed experts, and one
    // row of the embedding table.
    double fraction = 1.0;
    if ((group.role == Role::kRoutedExperts || group.role == Role::kMtpExperts) && top_k > 0 &&
        experts > 0) {
      fraction = static_cast<double>(top_k) / static_cast<double>(experts);
    }
    if (group.role == Role::kEmbedding)
      fraction = vocab > 0 ? 1.0 / static_cast<double>(vocab) : 0.0;
    m.bytes_per_token = static_cast<double>(group.bytes) * fraction;
    const double flops = 2.0 * m.bytes_per_token / bytes_per_param(group.spec.scheme);
    const double bandwidth = plan.device.memory_gbps * 1e9;
    const double peak = tflops_of(plan.device, m.path) * 1e12;
    double seconds = bandwidth > 0 ? m.bytes_per_token / bandwidth : 0.0;
    if (peak > 0) seconds = std::max(seconds, flops / peak);
    if (m.path == HardwarePath::kCudaCoresOnly) seconds *= kCudaCoresSlowdown;
    if (m.path == HardwarePath::kNoKernel) seconds = 0;
    if (m.path == HardwarePath::kNotRunHere && group.role != Role::kEmbedding) seconds = 0;
    m.time_us = seconds * 1e6;
    const std::string what = fmt::format("{} ({}, {})", group.name, detect::to_string(group.role),
                                         detect::to_string(group.spec.scheme));
    switch (m.path) {
      case HardwarePath::kNoKernel:
        plan.findings.push_back(
            {detect::Severity::kError, "no_kernel",
             fmt::format("{}: no kernel on {}: {}", what, target_name(target), m.note)});
        break;
      case HardwarePath::kCudaCoresOnly:
        plan.findings.push_back(
            {detect::Severity::kWarning, "slow_path",
             fmt::format("{}: runs on CUDA cores only on {} (~{:.0f}x slower than "
                         "a tensor-core kernel): {}",
                         what, target_name(target), kCudaCoresSlowdown, m.note)});
        break;
      case HardwarePath::kW4A16TensorCores:
      case HardwarePath::kW8A16TensorCores:
        if (!m.note.empty()) {
          plan.findings.push_back({detect::Severity::kInfo, "weight_only_path",
                                   fmt::format("{}: {} on {}", what, m.note, target_name(target))});
        }
        break;
      case HardwarePath::kNativeFp4TensorCores:
      case HardwarePath::kFp8TensorCores:
      case HardwarePath::kBf16TensorCores:
      case HardwarePath::kCpuSimd:
      case HardwarePath::kNotRunHere:
        break;
    }
    if (group.role != Role::kMtpExperts && group.role != Role::kMtpOther) {
      plan.bytes_per_token += m.bytes_per_token;
      plan.time_us += m.time_us;
    }
    plan.modules.push_back(std::move(m));
  }
  if (!manifest.tensors_checked) {
    plan.findings.push_back({detect::Severity::kInfo, "no_tensor_sizes",
                             "the tensors were not checked (configs only): bytes and times are 0"});
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
                       {"note", m.note}});
  }
  nlohmann::json findings = nlohmann::json::array();
  for (const auto& f : plan.findings) {
    findings.push_back(
        {{"severity", detect::to_string(f.severity)}, {"code", f.code}, {"message", f.message}});
  }
  return {{"target", target_name(plan.target)},
          {"device",
           {{"gpu", plan.device.gpu},
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

std::string to_table(const Plan& plan) {
  std::string out = fmt::format("target {} ({}; {:.0f} GB/s", target_name(plan.target),
                                plan.device.gpu, plan.device.memory_gbps);
  if (plan.target != Target::kCpu) {
    out += fmt::format(", BF16 {:.0f} / FP8 {:.0f} / FP4 {:.0f} TFLOPS", plan.device.bf16_tflops,
                       plan.device.fp8_tflops, plan.device.fp4_tflops);
  }
  out += fmt::format("; source: {})\n", plan.device.source);
  out += fmt::format("{:<16} {:<42} {:<11} {:<34} {:>12} {:>10}  {}\n", "role", "modules", "scheme",
                     "hardware path", "MB/token", "us/token", "kernel");
  for (const auto& m : plan.modules) {
    out += fmt::format("{:<16} {:<42} {:<11} {:<34} {:>12.3f} {:>10.2f}  {}\n",
                       detect::to_string(m.group.role), m.group.name,
                       detect::to_string(m.group.spec.scheme), path_name(m.path),
                       m.bytes_per_token / 1e6, m.time_us, m.kernel);
  }
  out += fmt::format(
      "decode at batch 1 (MTP excluded): {:.1f} MB read per token, roofline {:.1f} us "
      "per token ({:.0f} tokens/s)\n",
      plan.bytes_per_token / 1e6, plan.time_us, plan.time_us > 0 ? 1e6 / plan.time_us : 0.0);
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
      if (m.bytes_per_token <= 0 || m.time_us <= 0) continue;
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
      if (m.bytes_per_token <= 0 || m.time_us <= 0) continue;
      const bool slow = m.path == HardwarePath::kCudaCoresOnly;
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
      html << "<tr" << (m.path == HardwarePath::kCudaCoresOnly ? " class='slow'" : "") << "><td>"
           << target_name(p.target) << "</td><td>" << detect::to_string(m.group.role) << "</td><td>"
           << html_escape(m.group.name) << "</td><td>" << detect::to_string(m.group.spec.scheme)
           << "</td><td>" << path_name(m.path) << "</td><td>"
           << fmt::format("{:.3f}", m.bytes_per_token / 1e6) << "</td><td>"
           << fmt::format("{:.2f}", m.time_us) << "</td><td>" << html_escape(m.kernel)
           << "</td></tr>\n";
    }
  }
  html << "</table></body></html>\n";
  return html.str();
}

}  // namespace fp4moe::plan
