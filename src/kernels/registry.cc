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
}  // namespace

std::span<const KernelInfo> all_kernels() { return kKernels; }

const KernelInfo* find_kernel(WeightFormat format, Isa isa) {
  for (const KernelInfo& k : kKernels) {
    if (k.format == format && k.isa == isa) return &k;
  }
  return nullptr;
}

}  // namespace fp4moe::kernels
