// The BF16-activation family (kernels/types.h): every FP4MOE_BF16_KERNEL of kernel_list.inc x every
// ISA this host has x the shape classes, against three oracles: the scalar kernel bit for bit (it
// writes out vdpbf16ps's lane arithmetic, kernels/cpu/bf16_pair_dot.h), the FP64 product of the
// dequantized weights and the BF16 activations within the FP32 summation bound, and exact sums
// where every partial sum is representable (which also pins that no product is rounded).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "dispatch/cpu_features.h"
#include "formats/scalar.h"
#include "kernels/cpu/bf16_pair_dot.h"
#include "kernels/ref/reference.h"
#include "kernels/registry.h"
#include "test_weights.h"

namespace fp4moe {
namespace kernels {
void PrintTo(const Bf16KernelInfo& k, std::ostream* os) { *os << k.name; }
}  // namespace kernels

namespace {

using kernels::WeightFormat;

struct Shape {
  int64_t m, n, k;
};

// M = 1 .. 9 (the 4-token groups: whole, remainder 1-3, two groups + 1), 13, 64, 100 (FP8's panel
// path: a second chunk of tokens past 96, its groups of 6 and a remainder); N = 1, a tile - 1
// / + 1, a tile pair + 1, 136 (a lone last tile);
// K = one block, two (the one-token path's pipeline at its shortest), three blocks, 2048 + 3
// blocks. FP8 (any K, scales per 128): K = 1, 2, 3 and 2051 (partial chunks, an odd chunk count),
// 128, 260 and 1028 (whole chunks, the panel path from 5 tokens: whole scale blocks, a last
// partial one with an odd chunk count).
std::vector<Shape> bf16_shapes(WeightFormat format) {
  const int64_t kb = kernels::weight_format_k_block(format);
  std::vector<int64_t> ks = {kb, 2 * kb, 3 * kb, 2048 + 3 * kb};
  if (format == WeightFormat::kFp8Block128) ks.insert(ks.end(), {128, 260, 1028});
  std::vector<Shape> out;
  for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 64, 100}) {
    for (int64_t n : {1, 7, 9, 17, 136}) {
      for (int64_t k : ks) {
        if (m * n * k > (int64_t{1} << 23)) continue;
        out.push_back({m, n, k});
      }
    }
  }
  return out;
}

// N(0, 1) activations rounded to BF16; every 5th block of the first token holds BF16 subnormals
// (read as zero by vdpbf16ps and by the scalar kernel alike) so that flushing is compared too.
std::vector<uint16_t> random_bf16(int64_t m, int64_t k, int block, std::mt19937& rng) {
  const std::vector<float> x = testing::random_activations(m, k, rng);
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const bool tiny = static_cast<int64_t>(i) < k && (static_cast<int64_t>(i) / block) % 5 == 4;
    out[i] = formats::encode_bf16(tiny ? std::ldexp(x[i], -130) : x[i]);
  }
  return out;
}

class Bf16KernelTest : public ::testing::TestWithParam<kernels::Bf16KernelInfo> {};

TEST_P(Bf16KernelTest, MatchesScalarAndFp64OverShapeClasses) {
  const auto& kernel = GetParam();
  if (!dispatch::host_supports(kernel.isa)) {
    GTEST_SKIP() << "host lacks " << kernels::isa_name(kernel.isa) << " ("
                 << dispatch::cpu_features().summary() << ")";
  }
  const auto* scalar = kernels::find_bf16_kernel(kernel.format, kernels::Isa::kScalar);
  ASSERT_NE(scalar, nullptr);
  const int block = kernels::weight_format_k_block(kernel.format);
  const uint32_t seed =
      0xBF160000u + static_cast<uint32_t>(kernel.format) * 16 + static_cast<uint32_t>(kernel.isa);
  std::mt19937 rng(seed);
  for (const Shape& s : bf16_shapes(kernel.format)) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " M=" + std::to_string(s.m) +
                 " N=" + std::to_string(s.n) + " K=" + std::to_string(s.k));
    testing::QuantizedMatrix w = testing::quantize_random(kernel.format, s.n, s.k, rng);
    const std::vector<uint16_t> x = random_bf16(s.m, s.k, block, rng);
    const int64_t ldx = s.k + 8, ldy = s.n + 3;   // strides past the row; Y's padding poisoned
    std::vector<uint16_t> xs(s.m * ldx, 0x7FC0);  // NaN between rows: a read past K shows
    for (int64_t i = 0; i < s.m; ++i) {
      std::memcpy(&xs[i * ldx], &x[i * s.k], sizeof(uint16_t) * s.k);
    }
    std::vector<float> got(s.m * ldy, std::nanf("")), want(s.m * ldy, std::nanf(""));
    const int64_t tiles = w.packed.view().n_tiles;
    kernel.fn(w.packed.view(), xs.data(), ldx, s.m, got.data(), ldy, 0, tiles);
    scalar->fn(w.packed.view(), xs.data(), ldx, s.m, want.data(), ldy, 0, tiles);
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), sizeof(float) * got.size()))
        << "differs from the scalar BF16 kernel";

    // FP64 of the activations as the kernels read them (subnormals as zero).
    std::vector<float> xf(s.m * s.k);
    for (size_t i = 0; i < xf.size(); ++i) {
      xf[i] = kernels::bf16_flush_subnormal(formats::decode_bf16(x[i]));
    }
    std::vector<double> ref(s.m * s.n), abs_ref(s.m * s.n);
    kernels::ref::gemm_f64(w.dequantized.data(), s.n, s.k, xf.data(), s.m, ref.data(),
                           abs_ref.data());
    // Exact products; F32 roundings: a chain's additions (2 per pair), the chains' sums, one fma
    // per block and the tensor scale; below K + 4 roundings of the abs-sum, as the F32 family.
    const double tol = static_cast<double>(s.k + 4) * std::ldexp(1.0, -24);
    int failures = 0;
    for (int64_t i = 0; i < s.m && failures < 5; ++i) {
      for (int64_t j = 0; j < ldy; ++j) {
        const float y = got[i * ldy + j];
        if (j >= s.n) {
          if (!std::isnan(y)) ADD_FAILURE() << "wrote past N at [" << i << ", " << j << "]";
          continue;
        }
        const int64_t o = i * s.n + j;
        if (!(std::fabs(y - ref[o]) <= tol * abs_ref[o] + 1e-30)) {
          ADD_FAILURE() << "y[" << i << ", " << j << "] = " << y << ", FP64 " << ref[o];
          ++failures;
        }
      }
    }
    if (failures > 0) return;
  }
}

// Bit for bit against the scalar kernel where the order of the F32 sums shows: N(0, 1) BF16
// activations each scaled by 2^e, e uniform in [-20, 20], so a block's products span ~40 binades
// and the chains' additions, the chains' sum and the fma round. (With N(0, 1) activations alone a
// block's few products mostly sum exactly, and adding the chains in another order can go unseen.)
TEST_P(Bf16KernelTest, MatchesScalarWhereTheSumsRound) {
  const auto& kernel = GetParam();
  if (!dispatch::host_supports(kernel.isa)) {
    GTEST_SKIP() << "host lacks " << kernels::isa_name(kernel.isa);
  }
  const auto* scalar = kernels::find_bf16_kernel(kernel.format, kernels::Isa::kScalar);
  ASSERT_NE(scalar, nullptr);
  const uint32_t seed =
      0xBF16A000u + static_cast<uint32_t>(kernel.format) * 16 + static_cast<uint32_t>(kernel.isa);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> exponent(-20, 20);
  for (const Shape& s : bf16_shapes(kernel.format)) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " M=" + std::to_string(s.m) +
                 " N=" + std::to_string(s.n) + " K=" + std::to_string(s.k));
    testing::QuantizedMatrix w = testing::quantize_random(kernel.format, s.n, s.k, rng);
    const std::vector<float> x = testing::random_activations(s.m, s.k, rng);
    std::vector<uint16_t> xs(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      xs[i] = formats::encode_bf16(std::ldexp(x[i], exponent(rng)));
    }
    std::vector<float> got(s.m * s.n), want(s.m * s.n);
    const int64_t tiles = w.packed.view().n_tiles;
    kernel.fn(w.packed.view(), xs.data(), s.k, s.m, got.data(), s.n, 0, tiles);
    scalar->fn(w.packed.view(), xs.data(), s.k, s.m, want.data(), s.n, 0, tiles);
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), sizeof(float) * got.size()))
        << "differs from the scalar BF16 kernel";
  }
}

// Sums that are exact in F32 whatever their order: every block of a row has the same amax (its
// first weight, 8x the row's magnitude), hence one block scale per row; activations are
// integers / 256 below 1/2 (exact in BF16). Each product is then on a 2^-9 grid below 2^2, a row's
// sum of K <= 512 of them below 2^10: 19 bits, exact in every chain, and times the one scale (4
// significant bits) still exact. The output must equal fl(exact sum x scale x tensor scale), one
// rounding, computed here from the checkpoint codes in FP64. A product or sum rounded anywhere, or
// a weight decoded wrong, shows.
TEST_P(Bf16KernelTest, ExactWhereEverySumFitsF32) {
  const auto& kernel = GetParam();
  if (!dispatch::host_supports(kernel.isa)) GTEST_SKIP() << "host lacks this ISA";
  // Built from FP4 codes and one FP4 block scale per row; FP8's decode is pinned exhaustively
  // (E4m3Bf16Bits) and its products are exact by the same argument (4 + 8 significant bits).
  if (kernel.format == WeightFormat::kFp8Block128) GTEST_SKIP() << "FP4 formats only";
  const uint32_t seed = 0xE8AC7u + static_cast<uint32_t>(kernel.isa);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const int block = kernels::weight_format_k_block(kernel.format);
  std::uniform_int_distribution<int> small(-127, 127);
  for (int64_t m : {1, 3, 5}) {
    const int64_t n = 40, k = 512;
    std::vector<float> wv = testing::random_weights(n, k, rng);
    for (int64_t r = 0; r < n; ++r) {
      const float mag = std::fabs(wv[r * k]) + 1.0f;
      for (int64_t c = 0; c < k; ++c) {
        wv[r * k + c] = c % block == 0 ? 8.0f * mag : std::clamp(wv[r * k + c], -7 * mag, 7 * mag);
      }
    }
    testing::QuantizedMatrix w = testing::quantize_weights(kernel.format, wv, n, k);
    std::vector<uint16_t> x(m * k);
    std::vector<double> xd(m * k);
    for (int64_t i = 0; i < m * k; ++i) {
      xd[i] = small(rng) / 256.0;
      x[i] = formats::encode_bf16(static_cast<float>(xd[i]));
      ASSERT_EQ(formats::decode_bf16(x[i]), xd[i]);
    }
    std::vector<float> y(m * n);
    kernel.fn(w.packed.view(), x.data(), k, m, y.data(), n, 0, w.packed.view().n_tiles);
    for (int64_t r = 0; r < n; ++r) {
      const uint8_t scale_code = w.scale_codes[r * (k / block)];
      for (int64_t b = 1; b < k / block; ++b)
        ASSERT_EQ(w.scale_codes[r * (k / block) + b], scale_code);
      const double scale = kernel.format == WeightFormat::kNvfp4 ? formats::decode_ue4m3(scale_code)
                                                                 : formats::decode_e8m0(scale_code);
      for (int64_t i = 0; i < m; ++i) {
        double sum = 0;  // exact: 19 bits
        for (int64_t c = 0; c < k; ++c) {
          const uint8_t byte = w.codes[(r * k + c) / 2];
          sum += formats::decode_e2m1(c % 2 == 0 ? byte & 0xF : byte >> 4) * xd[i * k + c];
        }
        const float want = static_cast<float>(sum * scale * static_cast<double>(w.tensor_scale));
        EXPECT_EQ(y[i * n + r], want) << "token " << i << " row " << r;
      }
    }
  }
}

// Splitting the tile range (as the thread pool does) gives the whole call's bits for each piece's
// rows and writes nothing else.
TEST_P(Bf16KernelTest, TileRangesComposeExactly) {
  const auto& kernel = GetParam();
  if (!dispatch::host_supports(kernel.isa)) GTEST_SKIP() << "host lacks this ISA";
  const int block = kernels::weight_format_k_block(kernel.format);
  const uint32_t seed = 0xB16C5u + static_cast<uint32_t>(kernel.isa);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (int64_t m : {1, 3, 6}) {
    const int64_t n = 8 * 37 + 3, k = 4 * block;
    testing::QuantizedMatrix w = testing::quantize_random(kernel.format, n, k, rng);
    const std::vector<uint16_t> x = random_bf16(m, k, block, rng);
    const int64_t tiles = w.packed.view().n_tiles;
    std::vector<float> whole(m * n);
    kernel.fn(w.packed.view(), x.data(), k, m, whole.data(), n, 0, tiles);
    const int64_t bounds[] = {0, 5, 6, 17, tiles};
    for (size_t p = 0; p + 1 < std::size(bounds); ++p) {
      SCOPED_TRACE("M=" + std::to_string(m) + " tiles [" + std::to_string(bounds[p]) + ", " +
                   std::to_string(bounds[p + 1]) + ")");
      std::vector<float> piece(m * n, std::nanf(""));
      kernel.fn(w.packed.view(), x.data(), k, m, piece.data(), n, bounds[p], bounds[p + 1]);
      testing::expect_only_tile_range_written(piece, whole, m, n, bounds[p], bounds[p + 1]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, Bf16KernelTest,
                         ::testing::ValuesIn(kernels::all_bf16_kernels().begin(),
                                             kernels::all_bf16_kernels().end()),
                         [](const auto& info) { return std::string(info.param.name); });

// E4M3 to BF16 (the FP8 kernels' decode, their tables built from it): every code, against the
// library's E4M3 decoder; every value is exact in BF16 and normal there (DAZ never drops one).
TEST(E4m3Bf16Bits, EveryCodeIsItsE4m3ValueAsANormalBf16) {
  for (int code = 0; code < 256; ++code) {
    SCOPED_TRACE("code " + std::to_string(code));
    const uint16_t bits = kernels::e4m3_bf16_bits(code);
    const float want = formats::decode_e4m3(static_cast<uint8_t>(code));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(formats::decode_bf16(bits)));
      continue;
    }
    EXPECT_EQ(std::bit_cast<uint32_t>(formats::decode_bf16(bits)), std::bit_cast<uint32_t>(want));
    EXPECT_TRUE(want == 0 || std::fabs(want) >= std::numeric_limits<float>::min());
    EXPECT_EQ(kernels::bf16_flush_subnormal(formats::decode_bf16(bits)), want);
  }
}

// The lane arithmetic itself (bf16_pair_dot) against its definition on values where the order
// shows: the odd product first, each addition rounded, subnormals flushed.
TEST(Bf16PairDot, OddProductFirstEachAdditionRoundedSubnormalsFlushed) {
  const uint16_t one = 0x3F80;                                            // 1.0
  const uint16_t ulp_half = formats::encode_bf16(std::ldexp(1.0f, -24));  // half an ulp of 1
  const uint16_t three_quarters_ulp = formats::encode_bf16(std::ldexp(1.5f, -24));
  // acc = 1: + 1.5 * 2^-24 (odd) rounds up to 1 + 2^-23, then + 2^-24 (even) ties to even 1 +
  // 2^-22. Even first would give 1 (tie to even) then 1 + 2^-23.
  EXPECT_EQ(kernels::bf16_pair_dot(1.0f, ulp_half, three_quarters_ulp, one, one),
            1.0f + std::ldexp(1.0f, -22));
  // A BF16 subnormal activation reads as zero; a subnormal result is flushed.
  const uint16_t subnormal = 0x0040;  // 2^-127 as BF16
  EXPECT_EQ(kernels::bf16_pair_dot(0.0f, one, one, subnormal, 0), 0.0f);
  const uint16_t tiny = formats::encode_bf16(std::ldexp(1.0f, -100));
  EXPECT_EQ(kernels::bf16_pair_dot(0.0f, tiny, 0, tiny, 0), 0.0f);  // 2^-200 -> flushed
  EXPECT_EQ(kernels::bf16_pair_dot(0.0f, tiny, 0, formats::encode_bf16(std::ldexp(1.0f, -20)), 0),
            std::ldexp(1.0f, -120));
}

}  // namespace
}  // namespace fp4moe
