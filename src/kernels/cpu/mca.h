// llvm-mca regions: one iteration of a kernel's K-block loop at one token (MR == 1), marked for
// scripts/kernel_mca.py, which compiles the kernel files with -DFP4MOE_MCA -S and runs llvm-mca
// on the marked loops per CPU model (the throughput model the kernel list's decode rows cite).
// Without FP4MOE_MCA (every real build) the markers are nothing: the library's code is unchanged.
//
// The macros read the enclosing kernel template's `MR` and `kFormat`: one region per weight
// format, named <format>_<kind>_m1_<isa>, e.g. nvfp4_exact_m1_avx2.
#pragma once

#ifdef FP4MOE_MCA
#define FP4MOE_MCA_ASM(text) __asm__ volatile(text ::: "memory")
#else
#define FP4MOE_MCA_ASM(text) ((void)0)
#endif

#define FP4MOE_MCA_BLOCK_BEGIN(kind, isa)                              \
  do {                                                                 \
    if constexpr (MR == 1 && kFormat == WeightFormat::kNvfp4) {        \
      FP4MOE_MCA_ASM("# LLVM-MCA-BEGIN nvfp4_" kind "_m1_" isa);       \
    } else if constexpr (MR == 1 && kFormat == WeightFormat::kMxfp4) { \
      FP4MOE_MCA_ASM("# LLVM-MCA-BEGIN mxfp4_" kind "_m1_" isa);       \
    }                                                                  \
  } while (0)
#define FP4MOE_MCA_BLOCK_END()                               \
  do {                                                       \
    if constexpr (MR == 1) FP4MOE_MCA_ASM("# LLVM-MCA-END"); \
  } while (0)
