// What the host CPU and OS support (cpuid + XCR0), and which kernel ISA to use: the best one the
// host has, unless FP4MOE_ISA or the test hook forces one.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "kernels/types.h"

namespace fp4moe::dispatch {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
  bool amx_tile = false, amx_int8 = false;
  bool os_ymm = false;          // XCR0 has SSE+AVX state: the OS saves ymm registers
  bool os_zmm = false;          // XCR0 also has opmask + zmm state
  bool os_amx = false;          // XCR0 has tile state and the OS granted this process tile data
  std::string summary() const;  // e.g. "avx2 fma f16c; no avx512f (cpuid)"
};
const CpuFeatures& cpu_features();

// Whether the host can run `isa`'s kernels (and not above the test limit, if one is set).
bool host_supports(kernels::Isa isa);
std::vector<kernels::Isa> host_isas();  // scalar first, best last
kernels::Isa best_host_isa();

Result<kernels::Isa> parse_isa(std::string_view name);
// The ISA forced by the test hook, else by FP4MOE_ISA (read once), else none.
std::optional<kernels::Isa> forced_isa();
// Test hook: force an ISA for plans created afterwards (nullopt: back to FP4MOE_ISA / best).
void set_forced_isa(std::optional<kernels::Isa> isa);
// Test hook: make host_supports() (and so host_isas(), best_host_isa() and plans) treat every ISA
// above `limit` as missing, as on an older CPU, so tests reach the unsupported-ISA paths on any
// host (nullopt: the real host again). Never used outside tests.
void set_host_isa_limit_for_testing(std::optional<kernels::Isa> limit);

}  // namespace fp4moe::dispatch
