// Software prefetch for the streaming kernels, shared by every SIMD kernel file (prefetcht0 is
// baseline x86-64, so the helper carries no ISA flags of its own).
//
// Why software prefetch: tiles are contiguous, so fetching `kPrefetchDistance` bytes past the
// block being decoded runs ahead into the next tiles. Measured on a 2-core Zen 3 streaming from
// DRAM, the AVX2 W4A8 GEMV went from ~0.8 to ~0.95 of the read bandwidth (hardware prefetchers
// alone fall behind two compute-heavy streams); 2-4 KiB ahead was best.
//
// Why `always_inline` (and tested by tests/python/test_kernel_objects.py): GCC 12 infers that a
// function whose only statements are prefetches has no side effects, marks it `const`, and then
// deletes every call to it as dead code. The AVX-512 W4A8 kernels shipped that way: their
// prefetch helper was an ordinary inline function and not one prefetch instruction was left.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace fp4moe::kernels {
namespace {

inline constexpr int64_t kPrefetchDistance = 4096;

// Prefetches the lines kPrefetchDistance past [p, p + bytes). The address is formed as an
// integer: p + distance may lie past the allocation, which is fine for a prefetch (it never
// faults) but not for C++ pointer arithmetic. A null p prefetches nothing.
[[gnu::always_inline]] inline void prefetch_ahead(const uint8_t* p, int64_t bytes) {
  if (p == nullptr) return;
  const uintptr_t base = reinterpret_cast<uintptr_t>(p) + kPrefetchDistance;
  for (int64_t off = 0; off < bytes; off += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(base + static_cast<uintptr_t>(off)), _MM_HINT_T0);
  }
}

}  // namespace
}  // namespace fp4moe::kernels
