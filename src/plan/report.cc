// The engine views of `fp4moe plan`: the side-by-side table of every engine's newest release, the
// whole --json document, and whether the weights plus a KV-cache budget fit on the GPUs.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "plan/plan.h"

namespace fp4moe::plan {

Fit fit(const detect::Manifest& manifest, const DeviceFigures& device, int count,
        double kv_cache_gb) {
  Fit f;
  f.kv_cache_gb = kv_cache_gb;
  f.capacity_gb = device.memory_gb * count;
  if (manifest.total_bytes) f.weights_gb = static_cast<double>(*manifest.total_bytes) / 1e9;
  if (f.weights_gb && f.capacity_gb > 0) {
    f.fits = *f.weights_gb + kv_cache_gb <= f.capacity_gb;
    f.note = fmt::format(
        "{:.1f} GB of weights ({}) + {:.1f} GB KV-cache budget {} {:.0f} GB on {} x {}; the "
        "engine's activations, CUDA graphs and reserve are not counted",
        *f.weights_gb, manifest.total_bytes_source, kv_cache_gb,
        *f.fits ? "fit in" : "DO NOT fit in", f.capacity_gb, count, device.gpu);
  } else {
    f.note = "the weights' size is unknown (configs without shapes): no fit is computed";
  }
  return f;
}

nlohmann::json to_json(const std::vector<Plan>& plans, std::string_view target_from,
                       const std::optional<Fit>& fit) {
  nlohmann::json out = {{"schema_version", 1},
                        {"target", plans.empty() ? "" : std::string(target_name(plans[0].target))},
                        {"target_from", target_from},
                        {"plans", nlohmann::json::array()}};
  for (const auto& p : plans) out["plans"].push_back(to_json(p));
  if (fit) {
    out["fit"] = {{"weights_gb", fit->weights_gb ? nlohmann::json(*fit->weights_gb) : nullptr},
                  {"kv_cache_gb", fit->kv_cache_gb},
                  {"capacity_gb", fit->capacity_gb},
                  {"fits", fit->fits ? nlohmann::json(*fit->fits) : nullptr},
                  {"note", fit->note}};
  }
  return out;
}

std::string side_by_side_table(const std::vector<Plan>& plans) {
  if (plans.empty()) return "";
  const Plan& first = plans.front();
  std::string out =
      fmt::format("target {} ({}{}; {:.0f} GB/s; source: {})\n", target_name(first.target),
                  first.device.gpu, first.gpu_count > 1 ? fmt::format(" x{}", first.gpu_count) : "",
                  first.device.memory_gbps, first.device.source);
  out += "each engine at its newest release the rules know; `--engine NAME[@VERSION]` for one\n";
  // Module groups whose every engine says the same (w1, w2, w3 of one expert) share a block.
  auto key = [&](size_t i) {
    std::string k = fmt::format("{}|{}", detect::to_string(first.modules[i].group.role),
                                detect::to_string(first.modules[i].group.spec.scheme));
    for (const auto& p : plans) {
      if (i >= p.modules.size()) continue;
      const ModulePlan& m = p.modules[i];
      k += "|" + m.outcome + m.method + m.reads + m.kernel + m.note;
    }
    return k;
  };
  for (size_t i = 0; i < first.modules.size();) {
    size_t j = i + 1;
    while (j < first.modules.size() && key(j) == key(i)) ++j;
    std::string names;
    for (size_t k = i; k < j; ++k) names += (k > i ? ", " : "") + first.modules[k].group.name;
    const auto& g = first.modules[i].group;
    out += fmt::format("{} {} ({})\n", detect::to_string(g.role), names,
                       detect::to_string(g.spec.scheme));
    for (const auto& p : plans) {
      if (i >= p.modules.size()) continue;
      const ModulePlan& m = p.modules[i];
      out +=
          fmt::format("  {:<22} {:<7} {}{} -> {} [{}{}]\n", p.engine_label, m.outcome,
                      m.method.empty() ? "-" : m.method, m.reads.empty() ? "" : " reads " + m.reads,
                      m.kernel, path_name(m.path), m.precision.empty() ? "" : "; " + m.precision);
    }
    i = j;
  }
  for (const auto& p : plans) {
    // kt-kernel runs the routed experts only, fp4moe's CPU kernels the MoE layers: their bound
    // covers what they run, which the line says.
    const bool partial = std::any_of(p.modules.begin(), p.modules.end(), [](const ModulePlan& m) {
      return m.path == HardwarePath::kNotRunHere && m.group.role != detect::Role::kEmbedding;
    });
    out += fmt::format(
        "{}: decode at batch 1 (MTP excluded{}): lower bound {} us per token\n", p.engine_label,
        partial ? "; only the modules it runs" : "",
        std::isnan(p.time_us) ? std::string("unknown") : fmt::format("{:.1f}", p.time_us));
  }
  std::set<std::string> seen;  // a finding of the checkpoint itself comes once, not per engine
  for (const auto& p : plans) {
    for (const auto& f : p.findings) {
      if (f.severity == detect::Severity::kInfo && f.code == "engine_unknown") continue;
      if (!seen.insert(f.code + f.message).second) continue;
      out += fmt::format("{}: [{}] {}\n", detect::to_string(f.severity), f.code, f.message);
    }
  }
  return out;
}

}  // namespace fp4moe::plan
