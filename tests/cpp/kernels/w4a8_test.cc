// The W4A8 family (kernels/types.h): every activation quantizer and W4A8 kernel of
// kernel_list.inc x every ISA this host has, against three oracles: the scalar implementation bit
// for bit (the SIMD kernels promise the same operations), an FP64 product of the dequantized
// weights and the dequantized int8 activations (the arithmetic itself), and the exact W4A16 FP64
// product within the stated W4A8 error bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "dispatch/cpu_features.h"
#include "kernels/ref/reference.h"
#include "kernels/registry.h"
#include "test_weights.h"

namespace fp4moe {
namespace kernels {
void PrintTo(const W4A8KernelInfo& k, std::ostream* os) { *os << k.name; }
void PrintTo(const ActivationQuantizerInfo& q, std::ostream* os) { *os << q.name; }
}  // namespace kernels

namespace {

using kernels::WeightFormat;

struct Quantized {
  std::vector<int8_t> q;
  std::vector<float> scales;
  std::vector<int32_t> offsets;
  kernels::QuantizedActivations view(int64_t k, int block) const {
    return {q.data(), scales.data(), offsets.data(), k, k / block};
  }
};

Quantized quantize_with(kernels::QuantizeActivationsFn fn, const std::vector<float>& x, int64_t m,
                        int64_t k, int block) {
  Quantized out;
  out.q.resize(m * k);
  out.scales.resize(m * (k / block));
  out.offsets.resize(out.scales.size());
  fn(x.data(), k, m, k, block, out.q.data(), out.scales.data(), out.offsets.data());
  return out;
}

// Activations with the awkward blocks: all zero, one Inf, one NaN, subnormals only, a lone
// outlier, and ordinary N(0, 1) blocks.
std::vector<float> awkward_activations(int64_t m, int64_t k, int block, std::mt19937& rng) {
  std::vector<float> x = testing::random_activations(m, k, rng);
  const int64_t blocks = m * (k / block);
  for (int64_t b = 0; b < blocks; ++b) {
    float* xb = x.data() + b * block;
    switch (b % 7) {
      case 1:
        std::fill(xb, xb + block, 0.0f);
        break;
      case 2:
        xb[block / 2] = std::numeric_limits<float>::infinity();
        break;
      case 3:
        xb[1] = std::nanf("");
        break;
      case 4:
        for (int j = 0; j < block; ++j) xb[j] = std::ldexp(xb[j], -140);  // subnormal
        break;
      case 5:
        xb[0] = 1e30f;
        break;
      default:
        break;
    }
  }
  return x;
}

class ActivationQuantizerTest : public ::testing::TestWithParam<kernels::ActivationQuantizerInfo> {
};

TEST_P(ActivationQuantizerTest, MatchesScalarBitsAndTheDefinition) {
  const auto& quantizer = GetParam();
  if (!dispatch::host_supports(quantizer.isa)) GTEST_SKIP() << "host lacks this ISA";
  const auto* scalar = kernels::find_activation_quantizer(kernels::Isa::kScalar);
  ASSERT_NE(scalar, nullptr);
  const uint32_t seed = 0xA8A8u + static_cast<uint32_t>(quantizer.isa);
  std::mt19937 rng(seed);
  for (int block : {16, 32}) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " block " + std::to_string(block));
    const int64_t m = 5, k = block * 21;
    const std::vector<float> x = awkward_activations(m, k, block, rng);
    const Quantized got = quantize_with(quantizer.fn, x, m, k, block);
    const Quantized want = quantize_with(scalar->fn, x, m, k, block);
    EXPECT_EQ(got.q, want.q);
    EXPECT_EQ(got.offsets, want.offsets);
    ASSERT_EQ(got.scales.size(), want.scales.size());
    for (size_t s = 0; s < got.scales.size(); ++s) {
      EXPECT_EQ(std::isnan(got.scales[s]), std::isnan(want.scales[s])) << "block " << s;
      if (!std::isnan(want.scales[s])) {
        EXPECT_EQ(got.scales[s], want.scales[s]) << "block " << s;
      }
    }
    // The definition, in double: q = nearest-even(x * 127 / amax), scale amax / 127; a block with
    // Inf or NaN has a NaN scale; an all-zero block scale 0.
    for (int64_t s = 0; s < m * (k / block); ++s) {
      const float* xb = x.data() + s * block;
      double amax = 0;
      bool finite = true;
      int32_t sum = 0;
      for (int j = 0; j < block; ++j) {
        finite = finite && std::isfinite(xb[j]);
        amax = std::max(amax, std::fabs(static_cast<double>(xb[j])));
      }
      if (!finite) {
        EXPECT_TRUE(std::isnan(got.scales[s])) << "block " << s;
        continue;
      }
      if (amax == 0) {
        EXPECT_EQ(got.scales[s], 0.0f);
        continue;
      }
      // F32 rounding of amax / 127; a subnormal scale keeps fewer bits (absolute 2^-149).
      EXPECT_NEAR(got.scales[s], amax / 127, std::max(amax / 127 * 1e-6, 0x1p-149))
          << "block " << s;
      for (int j = 0; j < block; ++j) {
        const int8_t q = got.q[s * block + j];
        sum += q;
        EXPECT_LE(std::abs(int{q}), 127);
        // Within half a step (plus the F32 rounding of 127 / amax and of the product).
        EXPECT_LE(std::fabs(xb[j] / amax * 127.0 - q), 0.5 + 1e-5) << "block " << s << " j " << j;
      }
      EXPECT_EQ(got.offsets[s], -kernels::kW4a8CodeOffset * sum) << "block " << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, ActivationQuantizerTest,
                         ::testing::ValuesIn(kernels::all_activation_quantizers().begin(),
                                             kernels::all_activation_quantizers().end()),
                         [](const auto& info) { return std::string(info.param.name); });

struct Shape {
  int64_t m, n, k;
};

// M = 1, 2, 3, the 4-token group - 1 / itself / + 1, 6 (the VNNI few-token path's whole group of
// 6), 7, 8, 11 (its two groups, 5 + 6), 13 (the VNNI many-token path from
// 12; an AMX tile of 13 rows for MXFP4; the AVX2 wide path for MXFP4, from 24 for NVFP4), 16 (one
// whole AMX token tile), 17 (a tile and one token), 31, 33, 64, 97 (two VNNI passes), 256; N = 1, a
// tile - 1 / + 1, 17, 136; K = one block, two (the one-token paths' pipeline
// with no full-loop block), three blocks, 2048 (one AMX slice), and 2048 + 3 blocks
// (a second slice of odd length).
std::vector<Shape> w4a8_shapes(WeightFormat format) {
  const int64_t kb = kernels::weight_format_k_block(format);
  std::vector<Shape> out;
  for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 11, 13, 16, 17, 31, 33, 64, 97, 256}) {
    for (int64_t n : {1, 7, 9, 17, 136}) {
      for (int64_t k : {kb, 2 * kb, 3 * kb, int64_t{2048}, 2048 + 3 * kb}) {
        if (m * n * k > (int64_t{1} << 24)) continue;
        out.push_back({m, n, k});
      }
    }
  }
  return out;
}

class W4A8KernelTest : public ::testing::TestWithParam<kernels::W4A8KernelInfo> {};

TEST_P(W4A8KernelTest, MatchesScalarAndFp64OraclesOverShapeClasses) {
  const auto& kernel = GetParam();
  if (!dispatch::host_supports(kernel.isa)) GTEST_SKIP() << "host lacks this ISA";
  const auto* scalar = kernels::find_w4a8_kernel(kernel.format, kernels::Isa::kScalar);
  const auto* quantizer = kernels::find_activation_quantizer(kernels::Isa::kScalar);
  ASSERT_NE(scalar, nullptr);
  const int block = kernels::weight_format_k_block(kernel.format);
  const uint32_t seed =
      0x4A8000u + static_cast<uint32_t>(kernel.format) * 16 + static_cast<uint32_t>(kernel.isa);
  std::mt19937 rng(seed);
  for (const Shape& s : w4a8_shapes(kernel.format)) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " M=" + std::to_string(s.m) +
                 " N=" + std::to_string(s.n) + " K=" + std::to_string(s.k));
    testing::QuantizedMatrix w = testing::quantize_random(kernel.format, s.n, s.k, rng);
    const std::vector<float> x = testing::random_activations(s.m, s.k, rng);
    const Quantized xq = quantize_with(quantizer->fn, x, s.m, s.k, block);
    const kernels::QuantizedActivations view = xq.view(s.k, block);
    const int64_t ldy = s.n + 3;  // poisoned padding catches writes past N
    std::vector<float> got(s.m * ldy, std::nanf("")), want(s.m * ldy, std::nanf(""));
    const int64_t tiles = w.packed.view().n_tiles;
    kernel.fn(w.packed.view(), view, s.m, got.data(), ldy, 0, tiles);
    scalar->fn(w.packed.view(), view, s.m, want.data(), ldy, 0, tiles);
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), sizeof(float) * got.size()))
        << "differs from the scalar W4A8 kernel";

    // FP64 oracles: x_hat = q * scale (what the kernel multiplies by) and x itself.
    std::vector<float> x_hat(s.m * s.k);
    for (int64_t i = 0; i < s.m * s.k; ++i) {
      x_hat[i] = static_cast<float>(xq.q[i]) * xq.scales[i / block];
    }
    std::vector<double> ref_hat(s.m * s.n), abs_hat(s.m * s.n), ref(s.m * s.n), abs_ref(s.m * s.n);
    kernels::ref::gemm_f64(w.dequantized.data(), s.n, s.k, x_hat.data(), s.m, ref_hat.data(),
                           abs_hat.data());
    kernels::ref::gemm_f64(w.dequantized.data(), s.n, s.k, x.data(), s.m, ref.data(),
                           abs_ref.data());
    // The integer sums are exact; what is left is F32 rounding: x_hat's own rounding, the scale
    // product, one fma per block and the final scale: (blocks + 4) * 2^-24 of the abs-sum.
    const double fp32_tol = static_cast<double>(s.k / block + 4) * std::ldexp(1.0, -24);
    int failures = 0;
    for (int64_t i = 0; i < s.m && failures < 5; ++i) {
      for (int64_t j = 0; j < ldy; ++j) {
        const float y = got[i * ldy + j];
        if (j >= s.n) {
          if (!std::isnan(y)) ADD_FAILURE() << "wrote past N at [" << i << ", " << j << "]";
          continue;
        }
        const int64_t o = i * s.n + j;
        if (!(std::fabs(y - ref_hat[o]) <= fp32_tol * abs_hat[o] + 1e-30)) {
          ADD_FAILURE() << "y[" << i << ", " << j << "] = " << y << ", FP64 of the quantized "
                        << "activations " << ref_hat[o];
          ++failures;
        }
        // The stated W4A8 bound: sum over blocks of (amax / 254) * sum |w|, + the F32 term.
        double bound = fp32_tol * abs_ref[o];
        for (int64_t b = 0; b < s.k / block; ++b) {
          double amax = 0, wsum = 0;
          for (int64_t kk = b * block; kk < (b + 1) * block; ++kk) {
            amax = std::max(amax, std::fabs(static_cast<double>(x[i * s.k + kk])));
            wsum += std::fabs(static_cast<double>(w.dequantized[j * s.k + kk]));
          }
          bound += amax / 254.0 * wsum * (1 + 1e-6);
        }
        if (!(std::fabs(y - ref[o]) <= bound + 1e-30)) {
          ADD_FAILURE() << "y[" << i << ", " << j << "] = " << y << ", exact W4A16 " << ref[o]
                        << " +- " << bound;
          ++failures;
        }
      }
    }
    if (failures > 0) return;
  }
}

// Splitting the tile range (as the thread pool does) must give the same bits as one call, also
// where the many-token path pairs tiles and a boundary splits a pair: each piece, run on a
// NaN-filled output, writes exactly its own rows with the whole call's bits and leaves every
// other row alone (a kernel that ignores tile_begin would still compose on one shared output).
TEST_P(W4A8KernelTest, TileRangesComposeExactly) {
  const auto& kernel = GetParam();
  if (!dispatch::host_supports(kernel.isa)) GTEST_SKIP() << "host lacks this ISA";
  const int block = kernels::weight_format_k_block(kernel.format);
  const uint32_t seed = 0xB10C5u + static_cast<uint32_t>(kernel.isa);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const auto* quantizer = kernels::find_activation_quantizer(kernels::Isa::kScalar);
  for (int64_t m : {3, 11, 13, 17, 35}) {
    const int64_t n = 8 * 37 + 3, k = 4 * block;
    testing::QuantizedMatrix w = testing::quantize_random(kernel.format, n, k, rng);
    const std::vector<float> x = testing::random_activations(m, k, rng);
    const Quantized xq = quantize_with(quantizer->fn, x, m, k, block);
    const int64_t tiles = w.packed.view().n_tiles;
    std::vector<float> whole(m * n);
    kernel.fn(w.packed.view(), xq.view(k, block), m, whole.data(), n, 0, tiles);
    const int64_t bounds[] = {0, 5, 6, 17, tiles};
    for (size_t p = 0; p + 1 < std::size(bounds); ++p) {
      SCOPED_TRACE("M=" + std::to_string(m) + " tiles [" + std::to_string(bounds[p]) + ", " +
                   std::to_string(bounds[p + 1]) + ")");
      std::vector<float> piece(m * n, std::nanf(""));
      kernel.fn(w.packed.view(), xq.view(k, block), m, piece.data(), n, bounds[p], bounds[p + 1]);
      testing::expect_only_tile_range_written(piece, whole, m, n, bounds[p], bounds[p + 1]);
    }
  }
}

// A NaN scale (an activation block holding Inf or NaN) makes that token's outputs NaN, as the
// exact product would be; the other tokens are untouched.
TEST_P(W4A8KernelTest, NonFiniteActivationsPoisonOnlyTheirToken) {
  const auto& kernel = GetParam();
  if (!dispatch::host_supports(kernel.isa)) GTEST_SKIP() << "host lacks this ISA";
  const int block = kernels::weight_format_k_block(kernel.format);
  std::mt19937 rng(77);
  // 3 tokens (token groups), 13 (one AMX tile of 13 rows for MXFP4), 19 (a whole 16-token tile
  // and a partial one) and 27 (the AVX2 wide path for NVFP4 too); token 1 and the partial tile's
  // first token (16) are poisoned.
  for (int64_t m : {3, 13, 19, 27}) {
    SCOPED_TRACE("M=" + std::to_string(m));
    const int64_t n = 24, k = 4 * block;
    testing::QuantizedMatrix w = testing::quantize_random(kernel.format, n, k, rng);
    std::vector<float> x = testing::random_activations(m, k, rng);
    x[1 * k + block + 2] = std::numeric_limits<float>::infinity();
    if (m > 16) x[16 * k + 3] = -std::numeric_limits<float>::infinity();
    const auto* quantizer = kernels::best_activation_quantizer(kernel.isa);
    ASSERT_NE(quantizer, nullptr);
    const Quantized xq = quantize_with(quantizer->fn, x, m, k, block);
    std::vector<float> y(m * n);
    kernel.fn(w.packed.view(), xq.view(k, block), m, y.data(), n, 0, w.packed.view().n_tiles);
    for (int64_t i = 0; i < m; ++i) {
      const bool poisoned = i == 1 || i == 16;
      for (int64_t j = 0; j < n; ++j) {
        EXPECT_EQ(std::isnan(y[i * n + j]), poisoned) << "y[" << i << ", " << j << "]";
        if (!poisoned) {
          EXPECT_TRUE(std::isfinite(y[i * n + j])) << "y[" << i << ", " << j << "]";
        }
      }
    }
  }
}

// Scales at the edges: the VNNI kernel's MXFP4 many-token path adds exponents instead of
// multiplying the scales where every product stays a normal float, and multiplies elsewhere
// (w4a8_avx512_vnni.cc: weight scales within 2^+-27, activation scales within 2^+-96 or zero; the
// choice is made per slice of 4 tiles). So the weights are 5 sets of 4 tiles, each set with one
// kind of block scale code in every third block: set 0 the quantizer's own; set 1 the edges inside
// (MXFP4 E8M0 100 and 154); set 2 just outside (99, 155); set 3 the subnormal 2^-127 (code 0);
// set 4 2^127 (254), whose products overflow. NVFP4 (whose kernels take no such path) gets E4M3
// 0, 1, 0x7E and 0x08 in the same places. Activation blocks are scaled by 2^e, with zero blocks
// among them; in variant 1 token 5's blocks (the last token's below M = 6) have scales outside
// the range (subnormal, or above 2^96), so its pass (the first of two at M = 97) multiplies
// throughout. Every output must match the scalar kernel bit for bit (M = 1 and 5 run the other
// paths at the same edges). At M = 1 two more variants check the VNNI one-token path's NVFP4
// pre-scaled activation scales (a * 2^120, taken where every scale is below 2^8): in variant 2
// every scale is below 2^8, one of them 255.9 (a * 2^120 just under FLT_MAX); variant 3 adds one
// of exactly 2^8, so the call must multiply as the scalar kernel does (pre-scaled, it would
// overflow).
TEST_P(W4A8KernelTest, MatchesScalarAtTheEdgesOfTheScaleRanges) {
  const auto& kernel = GetParam();
  if (!dispatch::host_supports(kernel.isa)) GTEST_SKIP() << "host lacks this ISA";
  if (kernel.format != WeightFormat::kNvfp4 && kernel.format != WeightFormat::kMxfp4) GTEST_SKIP();
  const bool mx = kernel.format == WeightFormat::kMxfp4;
  const int block = kernels::weight_format_k_block(kernel.format);
  const auto* scalar = kernels::find_w4a8_kernel(kernel.format, kernels::Isa::kScalar);
  const auto* quantizer = kernels::find_activation_quantizer(kernels::Isa::kScalar);
  const uint32_t seed = 0xED6E5u + static_cast<uint32_t>(kernel.isa);
  std::mt19937 rng(seed);
  const std::vector<std::vector<uint8_t>> set_codes =
      mx ? std::vector<std::vector<uint8_t>>{{}, {100, 154}, {99, 155}, {0}, {254}}
         : std::vector<std::vector<uint8_t>>{{}, {0x7E}, {1}, {0}, {0x08}};
  // Activation exponents: scales (amax / 127) within 2^+-96 ...
  const std::vector<int> inside = {-88, -60, -20, 0, 20, 60, 88};
  // ... and outside (below 2^-96, subnormal, or above 2^96).
  const std::vector<int> outside = {-130, -110, -92, 98, 110};
  // M = 1's variants 2 and 3: scales (of N(0, 1) blocks) far below 2^8.
  const std::vector<int> small = {-40, -10, 0, 10};
  const int64_t tiles = 4 * static_cast<int64_t>(set_codes.size());
  const int64_t n = tiles * kernels::kTileRows, k = 24 * block, blocks = k / block;
  testing::QuantizedMatrix w = testing::quantize_random(kernel.format, n, k, rng);
  for (int64_t r = 0; r < n; ++r) {
    const std::vector<uint8_t>& codes = set_codes[r / (4 * kernels::kTileRows)];
    for (int64_t b = 0; b < blocks && !codes.empty(); b += 3) {
      w.scale_codes[r * blocks + b] = codes[(r + b) % codes.size()];
    }
  }
  auto packed = mx ? pack::pack_mxfp4("w", w.codes, w.scale_codes, n, k)
                   : pack::pack_nvfp4("w", w.codes, w.scale_codes, w.tensor_scale, n, k);
  ASSERT_TRUE(packed.ok()) << packed.error().message;
  const kernels::PackedMatrix pw = packed->view();
  // M = 1: the one-token paths; 5: the few-token ones; 13, 40, 97: the many-token one.
  for (int64_t m : {1, 5, 13, 40, 97}) {
    for (int variant = 0; variant < (m == 1 ? 4 : 2); ++variant) {
      SCOPED_TRACE("seed " + std::to_string(seed) + " M=" + std::to_string(m) + " variant " +
                   std::to_string(variant));
      std::vector<float> x = testing::random_activations(m, k, rng);
      std::uniform_int_distribution<size_t> pick(0, inside.size() - 1);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t b = 0; b < blocks; ++b) {
          float* xb = x.data() + i * k + b * block;
          const bool out = variant == 1 && i == std::min<int64_t>(5, m - 1);
          int e = out ? outside[static_cast<size_t>(b) % outside.size()] : inside[pick(rng)];
          if (variant >= 2) e = small[static_cast<size_t>(b) % small.size()];
          for (int j = 0; j < block; ++j) xb[j] = (i + b) % 5 == 1 ? 0.0f : std::ldexp(xb[j], e);
        }
      }
      if (variant >= 2) {
        x[7 * block] = 127.0f * 255.9f;                         // scale 255.9
        if (variant == 3) x[9 * block + 1] = -127.0f * 256.0f;  // scale 2^8
      }
      const Quantized xq = quantize_with(quantizer->fn, x, m, k, block);
      const kernels::QuantizedActivations view = xq.view(k, block);
      std::vector<float> got(m * n, std::nanf("")), want(m * n, std::nanf(""));
      kernel.fn(pw, view, m, got.data(), n, 0, tiles);
      scalar->fn(pw, view, m, want.data(), n, 0, tiles);
      int reported = 0;
      for (int64_t o = 0; o < m * n && reported < 5; ++o) {
        if (std::memcmp(&got[o], &want[o], sizeof(float)) != 0) {
          ADD_FAILURE() << "y[" << o / n << ", " << o % n << "] = " << got[o] << ", scalar "
                        << want[o];
          ++reported;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, W4A8KernelTest,
                         ::testing::ValuesIn(kernels::all_w4a8_kernels().begin(),
                                             kernels::all_w4a8_kernels().end()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace fp4moe
