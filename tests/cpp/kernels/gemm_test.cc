// Every kernel of kernel_list.inc x every ISA this host has x the shape classes, against the
// dequantize-then-FP64 reference (kernels/ref).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "dispatch/cpu_features.h"
#include "kernels/ref/reference.h"
#include "kernels/registry.h"
#include "test_weights.h"

namespace fp4moe {
namespace kernels {
// gtest prints a failing parameter with this instead of its bytes.
void PrintTo(const KernelInfo& k, std::ostream* os) { *os << k.name; }
}  // namespace kernels

namespace {

using kernels::KernelInfo;
using kernels::WeightFormat;

// Any FP32 summation of n products, in any order, differs from the exact sum by at most about
// n * 2^-24 times the sum of |products| (Higham's gamma_n): n = K for the worst order a kernel
// may use (the panel kernels sum K terms in one chain), +4 for the product, block-scale and
// tensor-scale roundings and the reference's own rounding of each dequantized weight. A wrong
// code or scale moves the result by a fixed fraction of the abs-sum, far above this for K < 10^4.
double fp32_sum_tolerance(int64_t k) { return static_cast<double>(k + 4) * std::ldexp(1.0, -24); }

struct Shape {
  int64_t m, n, k;
};

// Shape classes: M = 1, 2, 3, the 4-token tile of the direct kernels - 1, tile, tile + 1 (also the
// first M of the AVX-512 panel path, M >= 5), the 8-token tile of the AVX2 panel kernel (M >= 8)
// - 1, tile, tile + 1 (FP4 and FP8), 12 (one whole 12-token AVX-512 block), 13 (split 7 + 6), 17,
// 25 (past the 24-token block of a lone AVX-512 tile pair), 64, 256 (past the 96-token panel
// block); N = 1, an 8-row tile - 1 / + 1, an AVX-512 tile pair - 1 / + 1, and N crossing a 128-row
// FP8 scale block; K: the smallest legal, not a multiple of the chunk (FP8), a partial 128-block
// (FP8) and a large K (several 512-k panels).
std::vector<Shape> shapes_for(WeightFormat format) {
  const int64_t kb = kernels::weight_format_k_block(format);
  std::vector<int64_t> ks;
  if (format == WeightFormat::kFp8Block128) {
    ks = {1, 5, 130, 2048};
  } else {
    ks = {kb, 3 * kb, 2048};
  }
  const std::vector<int64_t> ns = {1, 7, 9, 15, 17, 136};
  std::vector<Shape> out;
  for (int64_t m : {1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 17, 25, 64, 256}) {
    for (size_t i = 0; i < ns.size(); ++i) {
      for (int64_t k : ks) {
        // Keep the FP64 reference affordable: the big M only with the smaller (N, K) pairs.
        if (m * ns[i] * k > (int64_t{1} << 24)) continue;
        out.push_back({m, ns[i], k});
      }
    }
  }
  return out;
}

class GemmKernelTest : public ::testing::TestWithParam<KernelInfo> {};

TEST_P(GemmKernelTest, MatchesFp64ReferenceOverShapeClasses) {
  const KernelInfo& kernel = GetParam();
  if (!dispatch::host_supports(kernel.isa)) {
    GTEST_SKIP() << "host lacks " << kernels::isa_name(kernel.isa) << " ("
                 << dispatch::cpu_features().summary() << ")";
  }
  const uint32_t seed =
      0x5EED0000u + static_cast<uint32_t>(kernel.format) * 16 + static_cast<uint32_t>(kernel.isa);
  std::mt19937 rng(seed);
  for (const Shape& s : shapes_for(kernel.format)) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " M=" + std::to_string(s.m) +
                 " N=" + std::to_string(s.n) + " K=" + std::to_string(s.k));
    testing::QuantizedMatrix w = testing::quantize_random(kernel.format, s.n, s.k, rng);
    const std::vector<float> x = testing::random_activations(s.m, s.k, rng);
    std::vector<double> want(s.m * s.n), scale(s.m * s.n);
    kernels::ref::gemm_f64(w.dequantized.data(), s.n, s.k, x.data(), s.m, want.data(),
                           scale.data());
    // Y has a wider row stride than N, poisoned, so a kernel writing past row N is caught.
    const int64_t ldy = s.n + 5;
    std::vector<float> y(s.m * ldy, std::nanf(""));
    kernel.fn(w.packed.view(), x.data(), s.k, s.m, y.data(), ldy, 0, w.packed.view().n_tiles);
    const double tol = fp32_sum_tolerance(s.k);
    int failures = 0;
    for (int64_t i = 0; i < s.m && failures < 5; ++i) {
      for (int64_t j = 0; j < ldy; ++j) {
        const float got = y[i * ldy + j];
        if (j >= s.n) {
          if (!std::isnan(got)) {
            ADD_FAILURE() << "wrote past N at [" << i << ", " << j << "]";
            ++failures;
          }
          continue;
        }
        const double bound = tol * scale[i * s.n + j] + 1e-30;
        if (!(std::fabs(got - want[i * s.n + j]) <= bound)) {
          ADD_FAILURE() << "y[" << i << ", " << j << "] = " << got << ", want " << want[i * s.n + j]
                        << " +- " << bound;
          ++failures;
        }
      }
    }
    if (failures > 0) return;
  }
}

// Splitting the tile range (as the thread pool does) must give the same bits as one call: each
// piece, run on a NaN-filled output, writes exactly its own rows with the whole call's bits and
// leaves every other row alone (a kernel that ignores tile_begin and rewrites earlier rows with
// the same values would still compose if the pieces shared one output).
TEST_P(GemmKernelTest, TileRangesComposeExactly) {
  const KernelInfo& kernel = GetParam();
  if (!dispatch::host_supports(kernel.isa)) GTEST_SKIP() << "host lacks this ISA";
  const uint32_t seed = 0xC0FFEEu + static_cast<uint32_t>(kernel.isa);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const int64_t n = 8 * 37 + 3, k = 256;
  testing::QuantizedMatrix w = testing::quantize_random(kernel.format, n, k, rng);
  const int64_t tiles = w.packed.view().n_tiles;
  // 3 tokens: the direct kernels; 13: the panel kernels (AVX2 from 8 tokens, AVX-512 from 5,
  // which block tiles in pairs of pairs and must cope with 1-3 tiles left over).
  for (const int64_t m : {3, 13}) {
    SCOPED_TRACE("M=" + std::to_string(m));
    const std::vector<float> x = testing::random_activations(m, k, rng);
    std::vector<float> whole(m * n);
    kernel.fn(w.packed.view(), x.data(), k, m, whole.data(), n, 0, tiles);
    // Odd boundaries on purpose: an AVX-512 kernel pairs tiles and must cope with a lone one.
    const int64_t bounds[] = {0, 5, 6, 17, tiles};
    for (size_t p = 0; p + 1 < std::size(bounds); ++p) {
      SCOPED_TRACE("tiles [" + std::to_string(bounds[p]) + ", " + std::to_string(bounds[p + 1]) +
                   ")");
      std::vector<float> piece(m * n, std::nanf(""));
      kernel.fn(w.packed.view(), x.data(), k, m, piece.data(), n, bounds[p], bounds[p + 1]);
      testing::expect_only_tile_range_written(piece, whole, m, n, bounds[p], bounds[p + 1]);
    }
  }
}

// The MXFP4 kernels only (E8M0 block scales), instantiated from their part of the kernel list.
class Mxfp4KernelTest : public ::testing::TestWithParam<KernelInfo> {};

// E8M0 scale code 0 is 2^-127 (a float32 subnormal), not 0: a row whose blocks all have code 0
// has outputs near 1e-37 (some smaller after cancellation), which a kernel reading the code as 0
// would zero.
TEST_P(Mxfp4KernelTest, E8m0ScaleCodeZeroIsTwoToTheMinus127) {
  const KernelInfo& kernel = GetParam();
  ASSERT_EQ(kernel.format, WeightFormat::kMxfp4);
  if (!dispatch::host_supports(kernel.isa)) GTEST_SKIP() << "host lacks this ISA";
  const uint32_t seed = 0xE8E0u + static_cast<uint32_t>(kernel.isa);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const int64_t m = 2, n = 16, k = 256;
  testing::QuantizedMatrix w = testing::quantize_random(kernel.format, n, k, rng);
  // Rows 3 and 12: every block gets scale code 0.
  for (int64_t row : {3, 12}) {
    for (int64_t b = 0; b < k / 32; ++b) w.scale_codes[row * (k / 32) + b] = 0;
  }
  ASSERT_TRUE(formats::dequantize_mxfp4("w", w.codes, w.scale_codes, n, k, w.dequantized).ok());
  auto packed = pack::pack_mxfp4("w", w.codes, w.scale_codes, n, k);
  ASSERT_TRUE(packed.ok());
  const std::vector<float> x = testing::random_activations(m, k, rng);
  std::vector<double> want(m * n), scale(m * n);
  kernels::ref::gemm_f64(w.dequantized.data(), n, k, x.data(), m, want.data(), scale.data());
  std::vector<float> y(m * n);
  kernel.fn(packed->view(), x.data(), k, m, y.data(), n, 0, packed->view().n_tiles);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t row : {3, 12}) {
      const double ref = want[i * n + row];
      // Far above the subnormal rounding (2^-149 per block) a zeroed output would be off by.
      ASSERT_GT(std::fabs(ref), 1e-40) << "the test needs an output well above 2^-149";
      const double subnormal_slack = static_cast<double>(k / 32 + 2) * 0x1p-149;
      EXPECT_NEAR(y[i * n + row], ref, fp32_sum_tolerance(k) * scale[i * n + row] + subnormal_slack)
          << "token " << i << " row " << row;
    }
  }
}

// The FP8 block-128 kernels only.
class Fp8KernelTest : public ::testing::TestWithParam<KernelInfo> {};

// FP8 weights with every finite E4M3 code (subnormals, both zeros, the largest) in every row,
// N = 24 (a tile pair and a lone tile), K = 261 (two 128-k scale blocks and a partial chunk).
struct Fp8EveryCode {
  static constexpr int64_t n = 24, k = 261;
  std::vector<float> dequantized = std::vector<float>(n * k);
  pack::PackedWeights packed;
};
Fp8EveryCode fp8_every_code() {
  Fp8EveryCode w;
  std::vector<uint8_t> codes(w.n * w.k);
  for (int64_t i = 0; i < w.n * w.k; ++i) {
    uint8_t c = static_cast<uint8_t>((i * 37 + i / w.k) % 256);
    if ((c & 0x7F) == 0x7F) c ^= 1;  // 0x7F / 0xFF are NaN
    codes[i] = c;
  }
  std::vector<float> scales(formats::fp8_block_scale_count(w.n, w.k));
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = std::ldexp(1.5f, static_cast<int>(i) - 9);
  if (!formats::dequantize_fp8_block128("w", codes, scales, w.n, w.k, w.dequantized).ok()) {
    throw std::runtime_error("dequantize_fp8_block128");
  }
  auto packed = pack::pack_fp8_block128("w", codes, scales, w.n, w.k);
  if (!packed.ok()) throw std::runtime_error(packed.error().message);
  w.packed = std::move(packed).value();
  return w;
}

// Every code, and tokens up to and past 2^16: the AVX-512 kernel's VBMI path at 1-4 tokens builds
// each weight's F32 bits from its code (times 2^-120) and runs on the tokens times 2^112, which it
// takes only where every |x| is below 2^16 (gemm_avx512.cc); above that it must fall back, not
// overflow, whether the large element lies in the check's 16-wide part or its tail (K % 16). The
// token rows have a wider stride than K.
TEST_P(Fp8KernelTest, EveryCodeAndTokensAroundTwoToThe16) {
  const KernelInfo& kernel = GetParam();
  ASSERT_EQ(kernel.format, WeightFormat::kFp8Block128);
  if (!dispatch::host_supports(kernel.isa)) GTEST_SKIP() << "host lacks this ISA";
  const uint32_t seed = 0xF8C0DEu + static_cast<uint32_t>(kernel.isa);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const Fp8EveryCode w = fp8_every_code();
  const int64_t n = w.n, k = w.k, ldx = k + 3;
  for (int64_t m : {1, 2, 3, 4}) {
    for (int variant = 0; variant < 4; ++variant) {
      SCOPED_TRACE("M=" + std::to_string(m) + " variant " + std::to_string(variant));
      std::vector<float> x = testing::random_activations(m, k, rng);
      // 1: magnitudes up to just below 2^16; 2: one element at 2^16 exactly; 3: one at -2^17
      // in the tail.
      if (variant >= 1) {
        for (int64_t i = 0; i < m * k; i += 7) x[i] = std::ldexp(x[i], 12);
        x[(m - 1) * k + 3] = -65535.996f;
      }
      if (variant == 2) x[(m - 1) * k + 200] = 65536.0f;
      if (variant == 3) x[(m - 1) * k + 258] = -131072.0f;
      std::vector<double> want(m * n), abs_sum(m * n);
      kernels::ref::gemm_f64(w.dequantized.data(), n, k, x.data(), m, want.data(), abs_sum.data());
      std::vector<float> xs(m * ldx, std::nanf(""));  // the padding is never read
      for (int64_t i = 0; i < m; ++i) std::copy_n(x.data() + i * k, k, xs.data() + i * ldx);
      std::vector<float> y(m * n, std::nanf(""));
      kernel.fn(w.packed.view(), xs.data(), ldx, m, y.data(), n, 0, w.packed.view().n_tiles);
      int failures = 0;
      for (int64_t o = 0; o < m * n && failures < 5; ++o) {
        const double bound = fp32_sum_tolerance(k) * abs_sum[o] + 1e-30;
        if (!(std::fabs(y[o] - want[o]) <= bound)) {
          ADD_FAILURE() << "y[" << o / n << ", " << o % n << "] = " << y[o] << ", want " << want[o]
                        << " +- " << bound;
          ++failures;
        }
      }
    }
  }
}

// A token's outputs do not depend on the other tokens: in particular, at 2 tokens the AVX-512
// kernel's VBMI path (both tokens below 2^16) and its FP16 route (the second token past 2^16)
// give the first token the same bits, as gemm_avx512.cc says (each product is the same real
// number, rounded once).
TEST_P(Fp8KernelTest, VbmiRouteKeepsTheBits) {
  const KernelInfo& kernel = GetParam();
  if (!dispatch::host_supports(kernel.isa)) GTEST_SKIP() << "host lacks this ISA";
  const uint32_t seed = 0xB175u + static_cast<uint32_t>(kernel.isa);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const Fp8EveryCode w = fp8_every_code();
  const int64_t n = w.n, k = w.k;
  std::vector<float> x = testing::random_activations(2, k, rng);
  for (int64_t i = 0; i < k; i += 5) x[i] = std::ldexp(x[i], (static_cast<int>(i) % 36) - 25);
  // Magnitudes 2^-25 .. 2^10 (|x| stays far below 2^16, so the first call takes the VBMI path).
  std::copy_n(x.data(), k, x.data() + k);  // token 1 = token 0
  std::vector<float> same(2 * n), mixed(2 * n);
  kernel.fn(w.packed.view(), x.data(), k, 2, same.data(), n, 0, w.packed.view().n_tiles);
  x[k + 17] = 1e6f;  // token 1 past 2^16
  kernel.fn(w.packed.view(), x.data(), k, 2, mixed.data(), n, 0, w.packed.view().n_tiles);
  EXPECT_EQ(0, std::memcmp(same.data(), mixed.data(), sizeof(float) * n))
      << "token 0's outputs changed with token 1's range";
}

std::string kernel_name(const ::testing::TestParamInfo<KernelInfo>& info) {
  return std::string(info.param.name);
}

INSTANTIATE_TEST_SUITE_P(AllKernels, GemmKernelTest,
                         ::testing::ValuesIn(kernels::all_kernels().begin(),
                                             kernels::all_kernels().end()),
                         kernel_name);

std::vector<KernelInfo> kernels_of(WeightFormat format) {
  std::vector<KernelInfo> out;
  for (const KernelInfo& k : kernels::all_kernels()) {
    if (k.format == format) out.push_back(k);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Mxfp4Kernels, Mxfp4KernelTest,
                         ::testing::ValuesIn(kernels_of(WeightFormat::kMxfp4)), kernel_name);
INSTANTIATE_TEST_SUITE_P(Fp8Kernels, Fp8KernelTest,
                         ::testing::ValuesIn(kernels_of(WeightFormat::kFp8Block128)), kernel_name);

}  // namespace
}  // namespace fp4moe
