// `fp4moe plan`: what an engine (SGLang, vLLM, TensorRT-LLM, by version; or fp4moe's own CPU
// kernels) detects in each module group of a manifest, the kernel and hardware path it runs on a
// target, and a batch-1 decode lower bound from the datasheet bandwidth.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "detect/manifest.h"
#include "engines/rules.h"

namespace fp4moe::plan {

enum class Target { kCpu, kSm80, kSm86, kSm89, kSm90, kSm100, kSm103, kSm120, kSm121 };
inline constexpr Target kAllTargets[] = {Target::kCpu,   Target::kSm80,  Target::kSm86,
                                         Target::kSm89,  Target::kSm90,  Target::kSm100,
                                         Target::kSm103, Target::kSm120, Target::kSm121};
std::string_view target_name(Target target);
Result<Target> parse_target(std::string_view name);

// What the kernel's inner loop runs on.
enum class HardwarePath {
  kNativeFp4TensorCores,  // block-scaled FP4 MMA (sm_100 tcgen05, sm_120 mma.sync kind::mxf4nvf4)
  kW4A16TensorCores,      // FP4/INT4 dequantized in registers, BF16 MMA (Marlin-class)
  kFp8TensorCores,        // FP8 MMA with block/tensor scales
  kW8A16TensorCores,      // FP8 dequantized in registers, BF16 MMA (pre-Hopper Marlin FP8)
  kBf16TensorCores,
  kUnknown,     // the engine's kernel for this module is not in the rules: no figure is given
  kCpuSimd,     // fp4moe's CPU kernels
  kNotRunHere,  // outside what fp4moe runs on this target (CPU: non-MoE modules, BF16 experts)
  kNoKernel,    // an error: nothing can run this scheme here
};
std::string_view path_name(HardwarePath path);

// Published figures of one GPU (or this CPU); each row of the GPU table cites its datasheet.
// A peak of 0 means the GPU has no such tensor cores or the cited datasheet does not give it.
struct DeviceFigures {
  std::string_view gpu;
  Target target = Target::kCpu;
  double memory_gb = 0;
  double memory_gbps = 0;
  double bf16_tflops = 0;  // dense
  double fp8_tflops = 0;   // dense
  double fp4_tflops = 0;   // dense
  std::string_view source;
};

// The sourced GPU table (`--gpu NAME[xN]`), and the GPU `--target` stands for on each arch.
const std::vector<DeviceFigures>& gpu_table();
DeviceFigures default_device(Target target);
struct GpuChoice {
  DeviceFigures device;
  int count = 1;
};
// "B200", "b200x8", "RTX PRO 6000x2", "rtx-5090": case, spaces, '-' and '_' do not matter.
Result<GpuChoice> parse_gpu(std::string_view spec);

// `--target T` and `--gpu NAME[xN]` as `plan` and `doctor` take them: a GPU sets the target, and
// both together must agree. `from` says which flag chose the target, for the report.
struct TargetChoice {
  Target target = Target::kCpu;
  std::optional<GpuChoice> gpu;
  std::string from;
};
// nullopt: neither flag was given (each command says what it does then); errors are bad input.
Result<std::optional<TargetChoice>> parse_target_choice(std::string_view target,
                                                        std::string_view gpu);

struct ModulePlan {
  detect::ModuleGroup group;
  std::string kernel;
  HardwarePath path = HardwarePath::kNoKernel;
  double bytes_per_token = 0;  // weight bytes read per decoded token at batch 1 (NaN: unknown)
  double time_us = 0;          // lower bound per token (NaN: unknown)
  std::string note;            // why this kernel / path
  // The engine's view (GPU targets).
  std::string outcome;  // ok, wrong, fails, unknown ("" on the CPU)
  std::string quant_config, method, reads, precision;
  std::string rule, rule_source, backend, backend_source;
  std::vector<std::string> fixes;
};

struct Plan {
  Target target = Target::kCpu;
  DeviceFigures device;
  int gpu_count = 1;
  std::string engine;        // "sglang", "vllm", "trtllm" or "fp4moe-cpu"
  std::string version;       // the engine version the rules were evaluated at
  std::string engine_label;  // "SGLang 0.5.23"
  std::vector<ModulePlan> modules;
  std::vector<detect::Finding> findings;
  double bytes_per_token = 0;
  double time_us = 0;  // NaN when a module's path is unknown
  bool has_error() const;
};

struct PlanOptions {
  double cpu_bandwidth_gbps = 0;  // measured in the run for --target cpu (0: not measured)
  std::optional<engines::EngineAt> engine;  // GPU targets: the engine (default: SGLang newest)
  const engines::Facts* facts = nullptr;    // null: config.json only (no dtype probe)
  std::optional<GpuChoice> gpu;             // overrides the target's default GPU
  bool engine_problems_are_errors = true;   // false in the side-by-side table: warnings
};

// `config` is config.json (for top_k and the expert count); the manifest comes from detect().
Plan make_plan(const detect::Manifest& manifest, const nlohmann::json& config, Target target,
               const PlanOptions& options);

// Whether the weights plus a KV-cache budget fit in the GPUs' memory.
struct Fit {
  std::optional<double> weights_gb;  // nullopt: unknown
  double kv_cache_gb = 0;
  double capacity_gb = 0;
  std::optional<bool> fits;
  std::string note;
};
Fit fit(const detect::Manifest& manifest, const DeviceFigures& device, int count,
        double kv_cache_gb);

nlohmann::json to_json(const Plan& plan);
// The whole `plan --json` document (docs/schema/plan.schema.json).
nlohmann::json to_json(const std::vector<Plan>& plans, std::string_view target_from,
                       const std::optional<Fit>& fit);
std::string to_table(const Plan& plan);
// One row per module group, one column per engine: what it detects, the path, the outcome.
std::string side_by_side_table(const std::vector<Plan>& plans);
// A self-contained HTML page (inline SVG, no scripts, no network): per module group, bytes read per
// token against the time bound per token, one series per target.
std::string to_html(const std::vector<Plan>& plans, std::string_view title);

}  // namespace fp4moe::plan
