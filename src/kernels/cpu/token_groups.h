// The token loop every SIMD kernel driver shares. A register-blocked tile is instantiated per
// token count MR at compile time (its accumulators are MR registers), so a driver runs the tokens
// in groups of kMaxMr and then one group of the remainder.
//
// ISA-neutral integer code: each kernel file instantiates it with its own lambda, so no copy is
// shared between files compiled with different ISA flags.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

namespace fp4moe::kernels {

// Calls fn(std::integral_constant<int, MR>{}, i0) for token groups [i0, i0 + MR) covering
// [0, m): MR = kMaxMr while a whole group fits, then once MR = the remainder (1 .. kMaxMr - 1).
template <int kMaxMr, class Fn>
[[gnu::always_inline]] inline void for_token_groups(int64_t m, Fn&& fn) {
  int64_t i = 0;
  for (; i + kMaxMr <= m; i += kMaxMr) fn(std::integral_constant<int, kMaxMr>{}, i);
  const int64_t rest = m - i;
  [&]<int... kMr>(std::integer_sequence<int, kMr...>) {
    ((rest == kMr + 1 ? fn(std::integral_constant<int, kMr + 1>{}, i) : void()), ...);
  }
  (std::make_integer_sequence<int, kMaxMr - 1>{});
}

// Calls fn(std::integral_constant<int, MR>{}) for a runtime token count mr in [1, kMaxMr], so a
// driver that sizes its own groups (evenly, say) still runs a compile-time register block.
// A driver whose groups are never smaller than kMinMr passes it, so that only the register
// blocks it runs are instantiated (and compiled: the SIMDe-emulated build pays for each one).
template <int kMaxMr, int kMinMr = 1, class Fn>
[[gnu::always_inline]] inline void with_mr(int64_t mr, Fn&& fn) {
  static_assert(1 <= kMinMr && kMinMr <= kMaxMr);
  [&]<int... kMr>(std::integer_sequence<int, kMr...>) {
    ((mr == kMr + kMinMr ? fn(std::integral_constant<int, kMr + kMinMr>{}) : void()), ...);
  }
  (std::make_integer_sequence<int, kMaxMr - kMinMr + 1>{});
}

}  // namespace fp4moe::kernels
