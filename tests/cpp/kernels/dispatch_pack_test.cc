// Dispatch (ISA detection, forcing, describe) and pack/ (layout and bad input); the thread pool has
// tests/cpp/core/
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "dispatch/cpu_features.h"
#include "dispatch/linear.h"
#include "dispatch/measure.h"
#include "formats/scalar.h"
#include "kernels/registry.h"
#include "pack/pack.h"
#include "test_weights.h"

namespace fp4moe {
namespace {

using kernels::Isa;
using kernels::WeightFormat;

// Every format has an exact kernel of its own at scalar, AVX2 and AVX-512; at every ISA level
// (avx512_vnni included, which has W4A8 kernels only) best_kernel finds the highest one at or
// below it. The FP4 formats likewise have a W4A8 kernel at every level, FP8 none at any.
TEST(Dispatch, EveryFormatHasAKernelAtEveryIsaLevel) {
  for (WeightFormat f : kernels::kAllWeightFormats) {
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
      EXPECT_NE(kernels::find_kernel(f, isa), nullptr)
          << kernels::weight_format_name(f) << " " << kernels::isa_name(isa);
    }
    for (Isa isa : kernels::kAllIsas) {
      SCOPED_TRACE(std::string(kernels::weight_format_name(f)) + " " +
                   std::string(kernels::isa_name(isa)));
      const kernels::KernelInfo* exact = kernels::best_kernel(f, isa);
      ASSERT_NE(exact, nullptr);
      EXPECT_LE(exact->isa, isa);
      for (const kernels::KernelInfo& k : kernels::all_kernels()) {
        if (k.format == f && k.isa <= isa) {
          EXPECT_LE(k.isa, exact->isa) << k.name;
        }
      }
      const kernels::W4A8KernelInfo* w4a8 = kernels::best_w4a8_kernel(f, isa);
      EXPECT_EQ(w4a8 != nullptr, f != WeightFormat::kFp8Block128);
      if (w4a8 != nullptr) {
        EXPECT_LE(w4a8->isa, isa);
      }
      const kernels::ActivationQuantizerInfo* quantizer = kernels::best_activation_quantizer(isa);
      ASSERT_NE(quantizer, nullptr);
      EXPECT_LE(quantizer->isa, isa);
    }
  }
  EXPECT_EQ(kernels::best_w4a8_kernel(WeightFormat::kNvfp4, Isa::kAvx512Vnni)->isa,
            Isa::kAvx512Vnni);
  EXPECT_EQ(kernels::best_w4a8_kernel(WeightFormat::kNvfp4, Isa::kAvx512)->isa, Isa::kAvx2);
  EXPECT_EQ(kernels::best_kernel(WeightFormat::kMxfp4, Isa::kAvx512Vnni)->isa, Isa::kAvx512);
}

// Resets the dispatch test hooks when a test ends, also when an ASSERT returns early, so no later
// test runs forced or under an ISA limit.
struct DispatchHooksReset {
  ~DispatchHooksReset() {
    dispatch::set_forced_isa(std::nullopt);
    dispatch::set_host_isa_limit_for_testing(std::nullopt);
  }
};

// Under each ISA limit the host can meet (as on an older CPU), a forced ISA at or below the limit
// gets the plan of that level, and one above it is an Error that says so: on any host, both
// branches run (an AVX-512 host has no unsupported ISA of its own).
TEST(Dispatch, ForcedIsaIsUsedAndUnsupportedIsaIsAnError) {
  DispatchHooksReset reset;
  std::mt19937 rng(1);
  testing::QuantizedMatrix w = testing::quantize_random(WeightFormat::kMxfp4, 16, 64, rng);
  const std::vector<Isa> real = dispatch::host_isas();
  int refused = 0;
  for (Isa limit : real) {
    dispatch::set_host_isa_limit_for_testing(limit);
    const std::vector<Isa> limited(real.begin(), std::find(real.begin(), real.end(), limit) + 1);
    EXPECT_EQ(dispatch::host_isas(), limited) << "limit " << kernels::isa_name(limit);
    for (Isa isa : kernels::kAllIsas) {
      SCOPED_TRACE(std::string("limit ") + std::string(kernels::isa_name(limit)) + ", forced " +
                   std::string(kernels::isa_name(isa)));
      dispatch::set_forced_isa(isa);
      auto plan = dispatch::LinearPlan::create(w.packed.view());
      if (isa <= limit) {
        ASSERT_TRUE(plan.ok()) << plan.error().message;
        EXPECT_EQ(plan->kernel().isa, kernels::best_kernel(WeightFormat::kMxfp4, isa)->isa);
        EXPECT_EQ(plan->isa(), plan->kernel().isa);
        EXPECT_NE(plan->describe().find(plan->kernel().name), std::string::npos);
        EXPECT_NE(plan->describe().find("forced"), std::string::npos) << plan->describe();
      } else {
        ASSERT_FALSE(plan.ok()) << plan->describe();
        EXPECT_NE(plan.error().message.find("ISA " + std::string(kernels::isa_name(isa)) +
                                            " is not supported by this host"),
                  std::string::npos)
            << plan.error().message;
        ++refused;
      }
    }
    // Not forced: the best level under the limit.
    dispatch::set_forced_isa(std::nullopt);
    if (!dispatch::forced_isa()) {  // FP4MOE_ISA in the environment would force one
      auto best = dispatch::LinearPlan::create(w.packed.view());
      ASSERT_TRUE(best.ok()) << best.error().message;
      EXPECT_EQ(best->kernel().isa, kernels::best_kernel(WeightFormat::kMxfp4, limit)->isa);
    }
  }
  EXPECT_GT(refused, 0) << "the unsupported-ISA branch never ran";
  dispatch::set_host_isa_limit_for_testing(std::nullopt);
  EXPECT_EQ(dispatch::host_isas(), real);
  auto best = dispatch::LinearPlan::create(w.packed.view());
  ASSERT_TRUE(best.ok());
  if (!dispatch::forced_isa()) {
    EXPECT_EQ(best->kernel().isa,
              kernels::best_kernel(WeightFormat::kMxfp4, dispatch::best_host_isa())->isa);
  }
}

// The W4A8 family covers other ISA levels than the exact one: a W4A8 plan, forced or named, runs
// the family's kernel of the highest level at or below the chosen one and says so; its exact
// kernel is chosen the same way; FP8 has no W4A8 kernel at all.
TEST(Dispatch, W4a8PlansUseTheFamilysBestKernelAtOrBelowTheIsa) {
  std::mt19937 rng(2);
  for (WeightFormat f : {WeightFormat::kNvfp4, WeightFormat::kMxfp4}) {
    testing::QuantizedMatrix w = testing::quantize_random(f, 16, 64, rng);
    for (Isa isa : dispatch::host_isas()) {
      dispatch::set_forced_isa(isa);
      auto plan =
          dispatch::LinearPlan::create(w.packed.view(), std::nullopt, dispatch::Precision::kW4A8);
      ASSERT_TRUE(plan.ok()) << plan.error().message;
      EXPECT_EQ(plan->precision(), dispatch::Precision::kW4A8);
      const kernels::W4A8KernelInfo* expected = kernels::best_w4a8_kernel(f, isa);
      ASSERT_NE(expected, nullptr);
      EXPECT_EQ(plan->kernel_name(), expected->name);
      EXPECT_EQ(plan->isa(), expected->isa);
      EXPECT_EQ(plan->kernel().isa, kernels::best_kernel(f, isa)->isa);
      if (expected->isa != isa) {
        EXPECT_NE(plan->describe().find("no W4A8 kernel for"), std::string::npos)
            << plan->describe();
      }
      auto named = dispatch::LinearPlan::create(w.packed.view(), isa, dispatch::Precision::kW4A8);
      ASSERT_TRUE(named.ok()) << named.error().message;
      EXPECT_EQ(named->kernel_name(), expected->name);
    }
    dispatch::set_forced_isa(std::nullopt);
  }
  testing::QuantizedMatrix fp8 = testing::quantize_random(WeightFormat::kFp8Block128, 16, 64, rng);
  auto plan =
      dispatch::LinearPlan::create(fp8.packed.view(), std::nullopt, dispatch::Precision::kW4A8);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.error().message.find("W4A8"), std::string::npos) << plan.error().message;
}

// host_isas() is every ISA of the full list the host supports, in increasing order, scalar first;
// best_host_isa() the highest of them (derived here from host_supports(), not from host_isas()).
TEST(Dispatch, ScalarIsAlwaysAvailableAndBestIsLast) {
  const std::vector<Isa> isas = dispatch::host_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), Isa::kScalar);
  std::vector<Isa> supported;
  Isa highest = Isa::kScalar;
  for (Isa isa : kernels::kAllIsas) {
    if (!dispatch::host_supports(isa)) continue;
    supported.push_back(isa);
    if (isa > highest) highest = isa;
  }
  EXPECT_EQ(isas, supported);
  for (size_t i = 1; i < isas.size(); ++i) {
    EXPECT_LT(isas[i - 1], isas[i]) << "host_isas() not strictly increasing at " << i;
  }
  EXPECT_EQ(dispatch::best_host_isa(), highest);
  EXPECT_FALSE(dispatch::parse_isa("sse9").ok());
  EXPECT_EQ(*dispatch::parse_isa("avx2"), Isa::kAvx2);
}

// tile_tasks: one task per thread at least where there are that many tiles (else one per tile,
// and one for none); more only while each keeps kMinTilesPerTask tiles, at most four per thread,
// and always a whole number per thread, so no thread is left a task longer than the others.
TEST(Dispatch, TileTasksAreWholeTasksPerThread) {
  struct Case {
    int64_t tiles;
    int threads;
    int64_t tasks;
  };
  const int64_t kMin = dispatch::kMinTilesPerTask;
  for (const Case& c :
       {Case{0, 2, 1}, Case{1, 2, 1}, Case{3, 8, 3}, Case{8, 8, 8}, Case{9, 8, 8}, Case{256, 2, 2},
        Case{384, 2, 2}, Case{512, 2, 4}, Case{720, 2, 4}, Case{1792, 2, 8}, Case{1 << 20, 2, 8},
        Case{2200, 16, 16}, Case{2 * 16 * kMin, 16, 32}, Case{1, 1, 1}, Case{1 << 20, 1, 4}}) {
    const int64_t tasks = dispatch::tile_tasks(c.tiles, c.threads);
    EXPECT_EQ(tasks, c.tasks) << c.tiles << " tiles, " << c.threads << " threads";
    if (c.tiles >= c.threads) {
      EXPECT_EQ(tasks % c.threads, 0) << c.tiles << " tiles, " << c.threads << " threads";
    }
    if (tasks > c.threads) {
      EXPECT_GE(c.tiles / tasks, kMin) << c.tiles << " tiles, " << c.threads << " threads";
    }
  }
}

// On every ISA the host has: a threaded run gives the one-thread bits, and each of its tasks (the
// tile ranges tile_tasks() cuts, run here one at a time through run_tiles on a NaN-filled output)
// writes exactly its own rows with those bits. The second half is what makes the first one sound:
// a kernel rewriting rows outside its range writes equal values there, which no single threaded
// run can show, but it races with the task that owns them.
TEST(Dispatch, ThreadedRunMatchesOneThreadBitForBit) {
  std::mt19937 rng(2);
  const int64_t m = 2, k = 128;
  testing::QuantizedMatrix w = testing::quantize_random(WeightFormat::kNvfp4, 8 * 50 + 1, k, rng);
  const std::vector<float> x = testing::random_activations(m, k, rng);
  ThreadPool single(1), pool(3);
  for (Isa isa : dispatch::host_isas()) {
    SCOPED_TRACE("isa " + std::string(kernels::isa_name(isa)));
    auto plan = dispatch::LinearPlan::create(w.packed.view(), isa);
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    std::vector<float> one(m * w.n), many(m * w.n);
    plan->run(x.data(), k, m, one.data(), w.n, single);
    plan->run(x.data(), k, m, many.data(), w.n, pool);
    EXPECT_EQ(one, many);
    const int64_t tiles = plan->n_tiles();
    const int64_t tasks = dispatch::tile_tasks(tiles, pool.size());
    ASSERT_GT(tasks, 1);
    // The ranges tile_tasks() cuts, and finer fixed ones (short ranges, odd starts, the lone last
    // tile) that do not depend on it.
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (int64_t t = 0; t < tasks; ++t)
      ranges.emplace_back(tiles * t / tasks, tiles * (t + 1) / tasks);
    for (int64_t b = 0; b < tiles; b += 5) ranges.emplace_back(b, std::min(tiles, b + 5));
    ranges.emplace_back(tiles - 1, tiles);
    for (const auto& [begin, end] : ranges) {
      std::vector<float> piece(m * w.n, std::nanf(""));
      plan->run_tiles(x.data(), k, m, piece.data(), w.n, begin, end);
      SCOPED_TRACE("task tiles [" + std::to_string(begin) + ", " + std::to_string(end) + ")");
      testing::expect_only_tile_range_written(piece, one, m, w.n, begin, end);
    }
  }
}

TEST(Dispatch, Bf16ActivationsRunTheBf16KernelOrTheF32OneOnTheirValues) {
  // run_bf16: on a host with the BF16-activation kernels, their
  // result (the scalar one's bits, kernels/types.h); otherwise the F32 kernel's result for F32
  // inputs holding the same values, bit for bit (BF16 -> F32 is exact). The F32 values are
  // widened here by hand (BF16 is the top half of an F32), not by the formats::decode_bf16 that
  // run_bf16 itself uses. Then again with the host limited to plain AVX-512 (no BF16 kernel).
  std::mt19937 rng(3);
  testing::QuantizedMatrix w = testing::quantize_random(WeightFormat::kMxfp4, 40, 96, rng);
  const auto* scalar = kernels::find_bf16_kernel(WeightFormat::kMxfp4, kernels::Isa::kScalar);
  ASSERT_NE(scalar, nullptr);
  for (bool limited : {false, true}) {
    if (limited) dispatch::set_host_isa_limit_for_testing(kernels::Isa::kAvx512);
    auto plan = dispatch::LinearPlan::create(w.packed.view());
    ASSERT_TRUE(plan.ok());
    if (!dispatch::forced_isa()) {  // the best ISA: a BF16 kernel exactly where the host has one
      EXPECT_EQ(plan->bf16_kernel() != nullptr, dispatch::host_supports(kernels::Isa::kAvx512Bf16))
          << plan->describe();
    }
    for (int64_t m : {3, 7}) {
      SCOPED_TRACE("M=" + std::to_string(m) + (limited ? " host limited to avx512" : ""));
      std::vector<float> x = testing::random_activations(m, 96, rng);
      std::vector<uint16_t> x16(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        x16[i] = formats::encode_bf16(x[i]);
        x[i] = std::bit_cast<float>(uint32_t{x16[i]} << 16);
      }
      std::vector<float> want(m * 40), from_bf16(m * 40), scratch(m * 96);
      if (plan->bf16_kernel() != nullptr) {
        scalar->fn(w.packed.view(), x16.data(), 96, m, want.data(), 40, 0, w.packed.view().n_tiles);
      } else {
        plan->run(x.data(), 96, m, want.data(), 40, ThreadPool::global());
      }
      plan->run_bf16(x16.data(), m, from_bf16.data(), 40, scratch, ThreadPool::global());
      EXPECT_EQ(want, from_bf16);
    }
  }
  dispatch::set_host_isa_limit_for_testing(std::nullopt);
}

TEST(Pack, OneNonzeroElementLandsWhereTheKernelsReadIt) {
  // Every (row, k) of a 9 x 32 MXFP4 matrix in turn holds the code for 1.0 (all else zero); the
  // MXFP4 kernel of every host ISA with x = e_k must return exactly row's one-hot.
  const int64_t n = 9, k = 32;
  std::vector<uint8_t> scales(n, 127);  // 2^0
  for (int64_t row = 0; row < n; ++row) {
    for (int64_t col = 0; col < k; ++col) {
      std::vector<uint8_t> codes(n * k / 2, 0);
      codes[row * k / 2 + col / 2] = static_cast<uint8_t>(col % 2 == 0 ? 0x2 : 0x20);
      auto w = pack::pack_mxfp4("one-hot", codes, scales, n, k);
      ASSERT_TRUE(w.ok());
      std::vector<float> x(k, 0.0f), y(n);
      x[col] = 1.0f;
      for (Isa isa : dispatch::host_isas()) {
        // Reset per ISA: a kernel that writes nothing must not inherit the previous ISA's result.
        std::fill(y.begin(), y.end(), std::nanf(""));
        kernels::best_kernel(WeightFormat::kMxfp4, isa)
            ->fn(w->view(), x.data(), k, 1, y.data(), n, 0, w->view().n_tiles);
        for (int64_t r = 0; r < n; ++r) {
          ASSERT_EQ(y[r], r == row ? 1.0f : 0.0f)
              << "row " << row << " col " << col << " isa " << kernels::isa_name(isa);
        }
      }
    }
  }
}

// Each bad input is changed from a valid one in exactly one way, and the valid one is shown to
// pack first, so every error below is caused by the one change it names.
TEST(Pack, BadInputIsAnErrorNamingTheTensor) {
  const auto expect_error = [](const auto& result, std::string_view reason) {
    ASSERT_FALSE(result.ok()) << reason;
    EXPECT_NE(result.error().message.find(reason), std::string::npos) << result.error().message;
  };
  std::vector<uint8_t> codes(8 * 16 / 2), scales(8, 0x38);
  ASSERT_TRUE(pack::pack_nvfp4("w", codes, scales, 1.0f, 8, 16).ok());
  auto bad_k = pack::pack_nvfp4("layers.0.w1", codes, scales, 1.0f, 8, 24);
  expect_error(bad_k, "layers.0.w1");
  expect_error(bad_k, "multiple");
  std::vector<uint8_t> short_codes(codes.size() - 1);
  expect_error(pack::pack_nvfp4("w", short_codes, scales, 1.0f, 8, 16),
               "packed codes has 63 elements, expected 64");
  expect_error(pack::pack_nvfp4("w", codes, scales, NAN, 8, 16), "tensor scale is not finite");
  std::vector<uint8_t> bad_scales = scales;
  bad_scales[3] = 0x7F;
  expect_error(pack::pack_nvfp4("w", codes, bad_scales, 1.0f, 8, 16),
               "block scale 3 (row 3) is code 127");
  bad_scales[3] = 0xB8;  // sign bit: not an unsigned scale
  expect_error(pack::pack_nvfp4("w", codes, bad_scales, 1.0f, 8, 16),
               "block scale 3 (row 3) is code 184");
  std::vector<uint8_t> mx_codes(4 * 32 / 2), mx_scales(4, 127);
  ASSERT_TRUE(pack::pack_mxfp4("w", mx_codes, mx_scales, 4, 32).ok());
  std::vector<uint8_t> mx_nan = mx_scales;
  mx_nan[2] = 0xFF;
  expect_error(pack::pack_mxfp4("w", mx_codes, mx_nan, 4, 32), "block scale 2 (row 2) is code 255");
  expect_error(pack::pack_mxfp4("w", std::span<const uint8_t>(), std::span<const uint8_t>(), 0, 32),
               "shape [0, 32] must be positive");
  std::vector<uint8_t> fp8(3 * 5, 0x38);
  ASSERT_TRUE(pack::pack_fp8_block128("w", fp8, std::vector<float>{1.0f}, 3, 5).ok());
  std::vector<uint8_t> fp8_nan = fp8;
  fp8_nan[7] = 0xFF;
  expect_error(pack::pack_fp8_block128("w", fp8_nan, std::vector<float>{1.0f}, 3, 5),
               "element [1, 2] is an E4M3 NaN");
  expect_error(pack::pack_fp8_block128("w", fp8, std::vector<float>{INFINITY}, 3, 5),
               "block scale 0 is not finite");
  ASSERT_TRUE(pack::pack_fp8_block128_ue8m0("w", fp8, std::vector<uint8_t>{127}, 3, 5).ok());
  expect_error(pack::pack_fp8_block128_ue8m0("w", fp8, std::vector<uint8_t>{0xFF}, 3, 5),
               "block scale 0 is the E8M0 NaN (0xFF)");
}

TEST(Pack, Fp8Ue8m0ScalesWidenExactly) {
  std::vector<uint8_t> fp8(2 * 3, 0x38);  // 1.0
  auto w = pack::pack_fp8_block128_ue8m0("w", fp8, std::vector<uint8_t>{130}, 2, 3);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->view().fp8_scales[0], 8.0f);
}

// Rounds judged by their own bandwidth: 1 GB in 0.05 s at 40 GB/s (bound 0.025 s) and 1 GB in
// 0.1 s at 20 GB/s (bound 0.05 s): 2 GB in 0.15 s against a 0.075 s bound. One figure for the run
// (2 GB / 0.075 s = 26.7 GB/s) would not be the mean of the probes (30), and the ratio is the
// time over the bounds, not the time over the run's bytes at the best probe (2 GB / 40 = 0.05 s).
TEST(RoundBound, EachRoundIsJudgedByTheBandwidthBesideIt) {
  dispatch::RoundBound b;
  b.add(1e9, 0.05, 40.0);
  b.add(1e9, 0.10, 20.0);
  EXPECT_EQ(b.rounds, 2);
  EXPECT_DOUBLE_EQ(b.bound_seconds, 0.075);
  EXPECT_DOUBLE_EQ(b.ratio(), 2.0);
  EXPECT_NEAR(b.bandwidth(), 2e9 / 0.075 / 1e9, 1e-9);
  EXPECT_NEAR(b.gbps() / b.bandwidth(), 1.0 / b.ratio(), 1e-12);
  EXPECT_EQ(b.min_gbps, 20.0);
  EXPECT_EQ(b.max_gbps, 40.0);
}

TEST(ReadProbe, ReadsItsWholeBufferAtAPositiveRate) {
  ThreadPool pool(2);
  dispatch::ReadProbe probe(pool, (size_t{8} << 20) + 100);
  EXPECT_EQ(probe.bytes(), size_t{8} << 20);  // whole 4 KiB pages
  const double gbps = probe.gbps(2);
  EXPECT_GT(gbps, 0.0);
  EXPECT_TRUE(std::isfinite(gbps));
  const double huge = probe.huge_fraction();
  EXPECT_TRUE(huge == -1.0 || (huge >= 0.0 && huge <= 1.0)) << huge;
}

}  // namespace
}  // namespace fp4moe
