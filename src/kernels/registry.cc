// The kernel registry and the names of the kernel-facing enums.
#include "kernels/registry.h"

#include "kernels/cpu/kernels_cpu.h"

namespace fp4moe::kernels {

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx512Vnni:
      return "avx512_vnni";
    case Isa::kAvx512Bf16:
      return "avx512_bf16";
    case Isa::kAmxInt8:
      return "amx_int8";
  }
  return "?";
}

std::string_view weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::kNvfp4:
      return "nvfp4";
    case WeightFormat::kMxfp4:
      return "mxfp4";
    case WeightFormat::kFp8Block128:
      return "fp8_block";
  }
  return "?";
}

int weight_format_k_block(WeightFormat format) {
  switch (format) {
    case WeightFormat::kNvfp4:
      return 16;
    case WeightFormat::kMxfp4:
      return 32;
    case WeightFormat::kFp8Block128:
      return 1;  // any K; scales run per 128 with a partial last block
  }
  return 1;
}

namespace {
constexpr KernelInfo kKernels[] = {
#define FP4MOE_GEMM_KERNEL(fn, format, isa) {#fn, WeightFormat::format, Isa::isa, &fn},
#include "kernels/kernel_list.inc"
#undef FP4MOE_GEMM_KERNEL
};
constexpr W4A8KernelInfo kW4A8Kernels[] = {
#define FP4MOE_W4A8_KERNEL(fn, format, isa) {#fn, WeightFormat::format, Isa::isa, &fn},
#include "kernels/kernel_list.inc"
#undef FP4MOE_W4A8_KERNEL
};
constexpr Bf16KernelInfo kBf16Kernels[] = {
#define FP4MOE_BF16_KERNEL(fn, format, isa) {#fn, WeightFormat::format, Isa::isa, &fn},
#include "kernels/kernel_list.inc"
#undef FP4MOE_BF16_KERNEL
};
constexpr ActivationQuantizerInfo kQuantizers[] = {
#define FP4MOE_ACT_QUANTIZER(fn, isa) {#fn, Isa::isa, &fn},
#include "kernels/kernel_list.inc"
#undef FP4MOE_ACT_QUANTIZER
};
}  // namespace

std::span<const KernelInfo> all_kernels() { return kKernels; }
std::span<const W4A8KernelInfo> all_w4a8_kernels() { return kW4A8Kernels; }
std::span<const Bf16KernelInfo> all_bf16_kernels() { return kBf16Kernels; }
std::span<const ActivationQuantizerInfo> all_activation_quantizers() { return kQuantizers; }

const Bf16KernelInfo* find_bf16_kernel(WeightFormat format, Isa isa) {
  for (const Bf16KernelInfo& k : kBf16Kernels) {
    if (k.format == format && k.isa == isa) return &k;
  }
  return nullptr;
}

const W4A8KernelInfo* find_w4a8_kernel(WeightFormat format, Isa isa) {
  for (const W4A8KernelInfo& k : kW4A8Kernels) {
    if (k.format == format && k.isa == isa) return &k;
  }
  return nullptr;
}

const ActivationQuantizerInfo* find_activation_quantizer(Isa isa) {
  for (const ActivationQuantizerInfo& q : kQuantizers) {
    if (q.isa == isa) return &q;
  }
  return nullptr;
}

const KernelInfo* find_kernel(WeightFormat format, Isa isa) {
  for (const KernelInfo& k : kKernels) {
    if (k.format == format && k.isa == isa) return &k;
  }
  return nullptr;
}

namespace {
// The entry of `list` matching `match` with the highest ISA not above `isa`, or nullptr.
template <class Info, class Match>
const Info* best_at_or_below(std::span<const Info> list, Isa isa, Match match) {
  const Info* best = nullptr;
  for (const Info& info : list) {
    if (info.isa <= isa && match(info) && (best == nullptr || info.isa > best->isa)) best = &info;
  }
  return best;
}
}  // namespace

const KernelInfo* best_kernel(WeightFormat format, Isa isa) {
  return best_at_or_below(all_kernels(), isa,
                          [format](const KernelInfo& k) { return k.format == format; });
}

const W4A8KernelInfo* best_w4a8_kernel(WeightFormat format, Isa isa) {
  return best_at_or_below(all_w4a8_kernels(), isa,
                          [format](const W4A8KernelInfo& k) { return k.format == format; });
}

const Bf16KernelInfo* best_bf16_kernel(WeightFormat format, Isa isa) {
  return best_at_or_below(all_bf16_kernels(), isa,
                          [format](const Bf16KernelInfo& k) { return k.format == format; });
}

const ActivationQuantizerInfo* best_activation_quantizer(Isa isa) {
  return best_at_or_below(all_activation_quantizers(), isa,
                          [](const ActivationQuantizerInfo&) { return true; });
}

}  // namespace fp4moe::kernels
