// Software prefetch for the streaming kernels, shared by every SIMD kernel file (prefetcht1 is
// baseline x86-64, so the helper carries no ISA flags of its own).
//
// Why software prefetch: tiles are contiguous, so fetching `kPrefetchDistance` bytes past the
// block being decoded runs ahead into the next tiles. Measured on a 2-core Zen 3 streaming from
// DRAM, the AVX2 W4A8 GEMV went from ~0.8 to ~0.95 of the read bandwidth (hardware prefetchers
// alone fall behind two compute-heavy streams); 2-4 KiB ahead was best.
//
// Why into L2 (prefetcht1), not L1 (prefetcht0): measured on a 2-core Zen 4 (AVX-512), same
// binaries but for the hint, interleaved, one token, weights from DRAM: NVFP4 W4A8 (VNNI)
// 4096 -> 14336 went from 16.6-17.6 to 21.4-22.5 GB/s on 1 thread and from 28.4-29.3 to
// 30.9-33.6 GB/s on 2; the FP8 exact GEMV 2048 -> 4096 from 20.7-22.4 to 27.2-29.4 GB/s; the
// DeepSeek-V4-Flash MoE layer at batch 1 from 4600-4887 to 3525-4095 us (NVFP4) and from
// 4222-4546 to 3637-4011 us (MXFP4). The L1 hint at 1, 4 or 8 KiB, no software prefetch and the
// non-temporal hint measured alike (the old figures); the L2 hint at 2 or 8 KiB a little slower
// and at 16 KiB no better than L1. Zen 3 was measured with the L1 hint only. The many-token
// kernels' prefetch of the next tile set (prefetch_pair_block) stays in L1: it is read next.
//
// Why `always_inline` (and tested by tests/python/test_kernel_objects.py): GCC 12 infers that a
// function whose only statements are prefetches has no side effects, marks it `const`, and then
// deletes every call to it as dead code. The AVX-512 W4A8 kernels shipped that way: their
// prefetch helper was an ordinary inline function and not one prefetch instruction was left.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/types.h"

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
    _mm_prefetch(reinterpret_cast<const char*>(base + static_cast<uintptr_t>(off)), _MM_HINT_T1);
  }
}

// The block-scale stream of a one-tile kernel (one byte per row per K block, contiguous over the
// thread's tiles beside the code stream). Called once per block with the tile's scales and the
// block index; once per kScalePrefetchBlocks blocks (4 lines of scales) it prefetches the next
// 4 lines, kScalePrefetchDistance bytes ahead, into L1.
// Why: the hardware prefetchers kept the code stream ahead but not this thin side stream beside
// it. A synthetic loop on the 2-core Zen 4, one thread, 1 GiB in 2 MiB pages, 4 vpermb per 64
// bytes of code: 33 GB/s with the code stream alone; 27-28 with 8 bytes of side stream per 64
// (NVFP4's density), also when each side line was prefetched one at a time 128-256 bytes ahead;
// 33 with it prefetched 4 lines at a time, 256 bytes ahead (512: 32-33; 768: 27). The kernel, VNNI
// W4A8 one-tile path, one token, one thread, 4096 -> 14336 from DRAM, interleaved, fraction of
// the bandwidth measured between its rounds: NVFP4 0.70-0.85 without (23-26 GB/s), 0.71-0.82 with
// one line per 8 blocks 256 bytes ahead, 0.88-0.94 (30.1-31.0 GB/s) with 4 lines per 32 blocks 256
// ahead (0.89-0.90 at 128 ahead, 0.74-0.78 at 512); MXFP4 0.75-0.85 without, 0.93-0.95 with one
// line, 0.94-0.97 (32.1-33.3 GB/s) with the bursts.
inline constexpr int64_t kScalePrefetchBlocks = 32;
inline constexpr int64_t kScalePrefetchDistance = 256;
[[gnu::always_inline]] inline void prefetch_tile_scales(const uint8_t* scales, int64_t b) {
  constexpr int64_t kLines = kScalePrefetchBlocks * kTileRows / 64;
  static_assert(kLines * 64 == kScalePrefetchBlocks * kTileRows, "whole lines of scales");
  static_assert((kScalePrefetchBlocks & (kScalePrefetchBlocks - 1)) == 0, "a power of two");
  if ((b & (kScalePrefetchBlocks - 1)) != 0) return;
  const uintptr_t at = reinterpret_cast<uintptr_t>(scales) + static_cast<uintptr_t>(b * kTileRows) +
                       static_cast<uintptr_t>(kScalePrefetchDistance);
#pragma GCC unroll 4
  for (int64_t l = 0; l < kLines; ++l) {
    _mm_prefetch(reinterpret_cast<const char*>(at + static_cast<uintptr_t>(64 * l)), _MM_HINT_T0);
  }
}

}  // namespace
}  // namespace fp4moe::kernels
