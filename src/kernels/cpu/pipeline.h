// The software-pipelined K-block loop of the AVX512-BF16 one-token tile path (gemm_bf16_avx512.cc;
// the VNNI W4A8 one writes its two stages out, unrolled by two: w4a8_avx512_vnni.cc).
// On Zen 4 their loops are bound by shuffle throughput, and the out-of-order window alone did not
// overlap one block's decode with the previous block's dot and block end: issuing the stages of
// different blocks side by side in program order did (the figures are in the kernel files).
//
// ISA-neutral: each kernel file instantiates it with its own lambdas, so no copy is shared between
// files compiled with different ISA flags (as token_groups.h).
#pragma once

#include <algorithm>
#include <cstdint>

namespace fp4moe::kernels {

// Runs blocks [0, blocks) (blocks >= 1) as decode(b) -> w, dot(b, w) -> s, finish(b, s), each
// block's calls in that order, finish in block order:
//  - kStages 3: iteration b decodes block b + 2, dots block b + 1, finishes block b (the last
//    iterations decode the last block again instead of branching: its bytes are in bounds);
//  - kStages 2: iteration b decodes and dots block b + 1 and finishes block b (for a decoded
//    block too large to keep two of in registers).
// begin() / end() bracket each full iteration (the llvm-mca region markers of mca.h).
template <int kStages, class Decode, class Dot, class Finish, class Begin, class End>
[[gnu::always_inline]] inline void pipelined_k_blocks(int64_t blocks, Decode&& decode, Dot&& dot,
                                                      Finish&& finish, Begin&& begin, End&& end) {
  static_assert(kStages == 2 || kStages == 3);
  auto sum = dot(0, decode(0));
  if constexpr (kStages == 3) {
    auto w = decode(std::min<int64_t>(1, blocks - 1));
    for (int64_t b = 0; b + 1 < blocks; ++b) {
      begin();
      auto w_next = decode(std::min<int64_t>(b + 2, blocks - 1));
      auto next = dot(b + 1, w);
      finish(b, sum);
      sum = next;
      w = w_next;
      end();
    }
  } else {
    for (int64_t b = 0; b + 1 < blocks; ++b) {
      begin();
      auto next = dot(b + 1, decode(b + 1));
      finish(b, sum);
      sum = next;
      end();
    }
  }
  finish(blocks - 1, sum);
}

}  // namespace fp4moe::kernels
