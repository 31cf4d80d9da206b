// The kernel registry, built from kernel_list.inc: look kernels up by format and ISA.
#pragma once

#include <span>
#include <string_view>

#include "kernels/types.h"

namespace fp4moe::kernels {

struct KernelInfo {
  std::string_view name;
  WeightFormat format;
  Isa isa;
  GemmKernel fn;
};

// Every kernel compiled into this build, in kernel_list.inc order (whether or not the host can run
// it: dispatch/ decides that).
std::span<const KernelInfo> all_kernels();
// The kernel for (format, isa), or nullptr when the list has none.
const KernelInfo* find_kernel(WeightFormat format, Isa isa);

// The W4A8 family (types.h), kept apart so nothing picks it by accident.
struct W4A8KernelInfo {
  std::string_view name;
  WeightFormat format;
  Isa isa;
  GemmW4A8Kernel fn;
};
std::span<const W4A8KernelInfo> all_w4a8_kernels();
const W4A8KernelInfo* find_w4a8_kernel(WeightFormat format, Isa isa);

// The BF16-activation family (types.h), kept apart as W4A8 is: only BF16 callers pick it.
struct Bf16KernelInfo {
  std::string_view name;
  WeightFormat format;
  Isa isa;
  GemmBf16Kernel fn;
};
std::span<const Bf16KernelInfo> all_bf16_kernels();
const Bf16KernelInfo* find_bf16_kernel(WeightFormat format, Isa isa);

struct ActivationQuantizerInfo {
  std::string_view name;
  Isa isa;
  QuantizeActivationsFn fn;
};
std::span<const ActivationQuantizerInfo> all_activation_quantizers();
const ActivationQuantizerInfo* find_activation_quantizer(Isa isa);

// What a host at ISA level `isa` runs (the levels are nested, types.h): the family's kernel of the
// highest ISA at or below `isa`, or nullptr when the family has none (W4A8 has no FP8 kernel).
// find_* above are exact lookups, for tests that name a kernel.
const KernelInfo* best_kernel(WeightFormat format, Isa isa);
const W4A8KernelInfo* best_w4a8_kernel(WeightFormat format, Isa isa);
const Bf16KernelInfo* best_bf16_kernel(WeightFormat format, Isa isa);
const ActivationQuantizerInfo* best_activation_quantizer(Isa isa);

}  // namespace fp4moe::kernels
