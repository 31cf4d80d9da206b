// Host feature detection from cpuid and XCR0 (see cpu_features.h).
#include "dispatch/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>

namespace fp4moe::dispatch {
namespace {

// Linux (5.16+) enables the AMX tile-data state per process, on request (arch_prctl,
// Documentation/arch/x86/xstate.rst); a tile instruction before the grant raises SIGILL. The grant
// is process-wide and permanent, so asking once at detection covers every thread.
bool request_amx_permission() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  // xgetbv is only legal when cpuid says OSXSAVE; the caller checks.
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (uint64_t{edx} << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c & bit_OSXSAVE) != 0;
  uint64_t xcr0 = 0;
  f.fma = (c & bit_FMA) != 0;
  f.f16c = (c & bit_F16C) != 0;
  if (osxsave) {
    xcr0 = read_xcr0();
    f.os_ymm = (xcr0 & 0x6) == 0x6;    // SSE and AVX state
    f.os_zmm = (xcr0 & 0xE6) == 0xE6;  // plus opmask, ZMM_Hi256, Hi16_ZMM
  }
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = (b & bit_AVX2) != 0;
    f.avx512f = (b & bit_AVX512F) != 0;
    f.avx512bw = (b & bit_AVX512BW) != 0;
    f.avx512vl = (b & bit_AVX512VL) != 0;
    f.avx512dq = (b & bit_AVX512DQ) != 0;
    f.avx512vnni = (c & bit_AVX512VNNI) != 0;
    f.amx_tile = (d & (1u << 24)) != 0;  // CPUID.(7,0):EDX[24] AMX-TILE
    f.amx_int8 = (d & (1u << 25)) != 0;  // EDX[25] AMX-INT8
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) {
    f.avx512bf16 = (a & (1u << 5)) != 0;  // CPUID.(7,1):EAX[5] AVX512_BF16
  }
  // XTILECFG and XTILEDATA (XCR0 bits 17, 18) enabled by the OS, and the data state granted.
  if (f.amx_tile && f.amx_int8 && (xcr0 & 0x60000) == 0x60000) f.os_amx = request_amx_permission();
  return f;
}

std::atomic<int> g_forced{-1};  // test hook; -1 = not set
std::atomic<int> g_limit{-1};   // test hook: highest ISA host_supports() admits; -1 = not set

}  // namespace

std::string CpuFeatures::summary() const {
  std::string s;
  auto add = [&s](bool has, const char* name) {
    if (has) s += std::string(s.empty() ? "" : " ") + name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512dq, "avx512dq");
  add(avx512vnni, "avx512vnni");
  add(avx512bf16, "avx512bf16");
  add(amx_tile, "amx-tile");
  add(amx_int8, "amx-int8");
  s += os_zmm ? "; OS saves zmm" : (os_ymm ? "; OS saves ymm only" : "; OS saves no AVX state");
  if (amx_tile && amx_int8) s += os_amx ? "; OS grants AMX tiles" : "; OS does not grant AMX tiles";
#ifdef FP4MOE_EMULATE_AVX512
  s += "; AVX-512 kernels EMULATED by SIMDe (test build)";
#endif
  return s.empty() ? "no SIMD beyond SSE2" : s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

bool host_supports(kernels::Isa isa) {
  const int limit = g_limit.load(std::memory_order_acquire);
  if (limit >= 0 && static_cast<int>(isa) > limit) return false;
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case kernels::Isa::kScalar:
      return true;
    case kernels::Isa::kAvx2:
      return f.avx2 && f.fma && f.f16c && f.os_ymm;
    case kernels::Isa::kAvx512:
#ifdef FP4MOE_EMULATE_AVX512
      // Test build: the AVX-512 kernels were compiled for AVX2 against SIMDe (kernels/).
      return host_supports(kernels::Isa::kAvx2);
#else
      return f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.fma && f.f16c && f.os_zmm;
#endif
    case kernels::Isa::kAvx512Vnni:
#ifdef FP4MOE_EMULATE_AVX512
      return host_supports(kernels::Isa::kAvx512);
#else
      return f.avx512vnni && host_supports(kernels::Isa::kAvx512);
#endif
    case kernels::Isa::kAvx512Bf16:
#ifdef FP4MOE_EMULATE_AVX512
      return host_supports(kernels::Isa::kAvx512Vnni);
#else
      return f.avx512bf16 && host_supports(kernels::Isa::kAvx512Vnni);
#endif
    case kernels::Isa::kAmxInt8:
      // Never emulated: the AMX kernel files are always built for the real ISA (kernels/), so
      // this asks the real host, also in the emulated test build.
      return f.amx_tile && f.amx_int8 && f.os_amx && f.avx512bf16 && f.avx512vnni && f.avx512f &&
             f.avx512bw && f.avx512vl && f.avx512dq && f.fma && f.f16c && f.os_zmm &&
             host_supports(kernels::Isa::kAvx512Bf16);
  }
  return false;
}

std::vector<kernels::Isa> host_isas() {
  std::vector<kernels::Isa> out;
  for (kernels::Isa isa : kernels::kAllIsas) {
    if (host_supports(isa)) out.push_back(isa);
  }
  return out;
}

kernels::Isa best_host_isa() { return host_isas().back(); }

Result<kernels::Isa> parse_isa(std::string_view name) {
  for (kernels::Isa isa : kernels::kAllIsas) {
    if (kernels::isa_name(isa) == name) return isa;
  }
  return Error{"unknown ISA '" + std::string(name) +
               "' (expected scalar, avx2, avx512, avx512_vnni, avx512_bf16 or amx_int8)"};
}

std::optional<kernels::Isa> forced_isa() {
  const int hook = g_forced.load(std::memory_order_acquire);
  if (hook >= 0) return static_cast<kernels::Isa>(hook);
  static const std::optional<kernels::Isa> from_env = []() -> std::optional<kernels::Isa> {
    const char* env = std::getenv("FP4MOE_ISA");
    if (env == nullptr || *env == '\0') return std::nullopt;
    auto isa = parse_isa(env);
    if (!isa.ok()) return std::nullopt;  // LinearPlan::create reports the bad value
    return *isa;
  }();
  return from_env;
}

void set_forced_isa(std::optional<kernels::Isa> isa) {
  g_forced.store(isa ? static_cast<int>(*isa) : -1, std::memory_order_release);
}

void set_host_isa_limit_for_testing(std::optional<kernels::Isa> limit) {
  g_limit.store(limit ? static_cast<int>(*limit) : -1, std::memory_order_release);
}

}  // namespace fp4moe::dispatch
