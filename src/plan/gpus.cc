// The GPU table of `fp4moe plan --gpu NAME[xN]`: memory, bandwidth and dense tensor peaks, one
// datasheet per row. A peak the cited sheet does not give (or gives only with sparsity and no
// stated dense figure) is 0 and never used; the batch-1 bound reads the bandwidth only.
#include <fmt/core.h>

#include <cctype>
#include <charconv>

#include "plan/plan.h"

namespace fp4moe::plan {
namespace {

std::string normalize(std::string_view name) {
  std::string out;
  for (char c : name) {
    if (c == ' ' || c == '-' || c == '_') continue;
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

}  // namespace

const std::vector<DeviceFigures>& gpu_table() {
  static const std::vector<DeviceFigures> table = {
      {"A100 SXM4 80GB", Target::kSm80, 80, 2039, 312, 0, 0,
       "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM: 2039 GB/s, BF16 312 TFLOPS dense)"},
      {"RTX 3090", Target::kSm86, 24, 936, 71, 0, 0,
       "NVIDIA Ampere GA102 GPU architecture whitepaper, RTX 3090: 936 GB/s, BF16 tensor with "
       "FP32 accumulate 71 TFLOPS dense"},
      {"L40S", Target::kSm89, 48, 864, 362, 733, 0,
       "NVIDIA L40S datasheet: 864 GB/s; BF16 733 / FP8 1466 TFLOPS with sparsity, half dense"},
      {"H100 SXM5 80GB", Target::kSm90, 80, 3350, 989, 1979, 0,
       "NVIDIA H100 Tensor Core GPU datasheet (SXM: 3.35 TB/s; BF16 1979 / FP8 3958 TFLOPS with "
       "sparsity, half dense)"},
      {"H200 SXM 141GB", Target::kSm90, 141, 4800, 989, 1979, 0,
       "NVIDIA H200 Tensor Core GPU datasheet (SXM: 4.8 TB/s; BF16 1979 / FP8 3958 TFLOPS with "
       "sparsity, half dense)"},
      {"B200", Target::kSm100, 180, 8000, 2250, 4500, 9000,
       "NVIDIA HGX B200 specifications, per GPU: 180 GB, 8 TB/s; dense BF16 2.25 / FP8 4.5 / "
       "FP4 9 PFLOPS"},
      {"B300", Target::kSm103, 288, 8000, 0, 0, 0,
       "NVIDIA HGX B300 specifications, per GPU: 288 GB HBM3e, 8 TB/s (dense peaks not taken "
       "from it here)"},
      {"RTX PRO 6000 Blackwell", Target::kSm120, 96, 1792, 500, 1000, 2000,
       "NVIDIA RTX PRO 6000 Blackwell datasheet: 96 GB, 1792 GB/s; 4 PFLOPS FP4 with sparsity"},
      {"RTX 5090", Target::kSm120, 32, 1792, 0, 0, 1676,
       "NVIDIA GeForce RTX 5090 specifications: 32 GB GDDR7, 1792 GB/s; 3352 AI TOPS (FP4 with "
       "sparsity), half dense"},
      {"GB10", Target::kSm121, 128, 273, 0, 0, 500,
       "NVIDIA DGX Spark datasheet: 128 GB unified LPDDR5x, 273 GB/s; 1 PFLOP FP4 with sparsity, "
       "half dense"},
  };
  return table;
}

DeviceFigures default_device(Target target) {
  // The GPU --target stands for: the first row of its architecture.
  if (target == Target::kCpu) {
    return {"this CPU", Target::kCpu, 0, 0, 0, 0, 0, "memory read bandwidth measured in this run"};
  }
  for (const auto& d : gpu_table()) {
    if (d.target == target) return d;
  }
  return {};
}

Result<GpuChoice> parse_gpu(std::string_view spec) {
  auto find = [](std::string_view name) -> const DeviceFigures* {
    const std::string want = normalize(name);
    for (const auto& d : gpu_table()) {
      // A prefix is enough: "rtxpro6000" names "RTX PRO 6000 Blackwell", "h200" "H200 SXM 141GB".
      if (!want.empty() && normalize(d.gpu).rfind(want, 0) == 0) return &d;
    }
    return nullptr;
  };
  // The name alone first ("RTX 5090" ends in digits after an x), then NAME x COUNT.
  if (const DeviceFigures* d = find(spec)) return GpuChoice{*d, 1};
  const size_t x = spec.find_last_of("xX");
  if (x != std::string_view::npos && x + 1 < spec.size()) {
    const std::string_view digits = spec.substr(x + 1);
    int n = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    if (ec == std::errc() && end == digits.data() + digits.size()) {
      if (const DeviceFigures* d = find(spec.substr(0, x))) {
        if (n < 1 || n > 1024) {
          return Error{fmt::format("--gpu {}: the count must be 1..1024", spec)};
        }
        return GpuChoice{*d, n};
      }
    }
  }
  std::string known;
  for (const auto& d : gpu_table()) known += (known.empty() ? "" : ", ") + std::string(d.gpu);
  return Error{fmt::format("unknown GPU '{}': expected one of {} (optionally xN)", spec, known)};
}

Result<std::optional<TargetChoice>> parse_target_choice(std::string_view target,
                                                        std::string_view gpu) {
  std::optional<GpuChoice> g;
  if (!gpu.empty()) {
    auto parsed = parse_gpu(gpu);
    if (!parsed.ok()) return Error{parsed.error().message, ErrorKind::kBadInput};
    g = *parsed;
  }
  if (!target.empty()) {
    auto t = parse_target(target);
    if (!t.ok()) return Error{t.error().message, ErrorKind::kBadInput};
    if (g && g->device.target != *t) {
      return Error{fmt::format("--gpu {} is {}, not --target {}", gpu,
                               target_name(g->device.target), target),
                   ErrorKind::kBadInput};
    }
    return std::optional<TargetChoice>(TargetChoice{*t, g, fmt::format("--target {}", target)});
  }
  if (g) {
    return std::optional<TargetChoice>(TargetChoice{
        g->device.target, g, fmt::format("--gpu {} ({})", gpu, target_name(g->device.target))});
  }
  return std::optional<TargetChoice>();
}

}  // namespace fp4moe::plan
