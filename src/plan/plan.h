// `fp4moe plan`: which kernel each module group of a manifest gets on a target, what hardware path
// that kernel uses, and a decode-time (batch 1) roofline estimate per token.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "detect/manifest.h"

namespace fp4moe::plan {

enum class Target { kCpu, kSm80, kSm89, kSm90, kSm100, kSm120 };
inline constexpr Target kAllTargets[] = {Target::kCpu,  Target::kSm80,  Target::kSm89,
                                         Target::kSm90, Target::kSm100, Target::kSm120};
std::string_view target_name(Target target);
Result<Target> parse_target(std::string_view name);

// What the kernel's inner loop runs on.
enum class HardwarePath {
  kNativeFp4TensorCores,  // block-scaled FP4 MMA (sm_100 tcgen05, sm_120 mma.sync kind::mxf4nvf4)
  kW4A16TensorCores,      // FP4/INT4 dequantized in registers, BF16 MMA (Marlin-class)
  kFp8TensorCores,        // FP8 MMA with block/tensor scales
  kW8A16TensorCores,      // FP8 dequantized in registers, BF16 MMA (pre-Hopper Marlin FP8)
  kBf16TensorCores,
  kCudaCoresOnly,  // per-(token, expert) dequantize + GEMV: the slow path
  kCpuSimd,        // fp4moe's CPU kernels
  kNotRunHere,     // outside what fp4moe runs on this target (CPU: non-MoE modules)
  kNoKernel,       // an error: nothing can run this scheme here
};
std::string_view path_name(HardwarePath path);

// Published peak figures of one target; each row cites its datasheet in plan.cc.
struct DeviceFigures {
  std::string_view gpu;
  double memory_gbps = 0;
  double bf16_tflops = 0;  // dense
  double fp8_tflops = 0;   // dense, 0 = no FP8 tensor cores
  double fp4_tflops = 0;   // dense, 0 = no FP4 tensor cores
  std::string_view source;
};

struct ModulePlan {
  detect::ModuleGroup group;
  std::string kernel;
  HardwarePath path = HardwarePath::kNoKernel;
  double bytes_per_token = 0;  // weight bytes read per decoded token at batch 1
  double time_us = 0;          // roofline estimate per token
  std::string note;            // why this kernel / path
};

struct Plan {
  Target target = Target::kCpu;
  DeviceFigures device;
  std::vector<ModulePlan> modules;
  std::vector<detect::Finding> findings;  // slow or missing paths
  double bytes_per_token = 0;
  double time_us = 0;
  bool has_error() const;
};

struct PlanOptions {
  double cpu_bandwidth_gbps = 0;  // measured in the run for --target cpu (0: not measured)
};

// `config` is config.json (for top_k and the expert count); the manifest comes from detect().
Plan make_plan(const detect::Manifest& manifest, const nlohmann::json& config, Target target,
               const PlanOptions& options);

nlohmann::json to_json(const Plan& plan);
std::string to_table(const Plan& plan);
// A self-contained HTML page (inline SVG, no scripts, no network): per module group, bytes read per
// token against estimated time per token, one series per target.
std::string to_html(const std::vector<Plan>& plans, std::string_view title);

}  // namespace fp4moe::plan
