// `fp4moe demo`: the README's main job. Tells the project's story on an embedded default: a
// DeepSeek-V4-Flash routed expert in the stock MXFP4 layout, made NVFP4 losslessly.
#include <fmt/core.h>

#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include "cli/command.h"
#include "formats/block.h"
#include "formats/transcode.h"

namespace fp4moe::cli {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// DeepSeek-V4-Flash (../shared/corpus/deepseek-ai__DeepSeek-V4-Flash/config.json): hidden 4096,
// moe_intermediate_size 2048; each routed expert has w1, w3 [2048, 4096] and w2 [4096, 2048].
constexpr int64_t kHidden = 4096;
constexpr int64_t kExpertWidth = 2048;

struct ExpertTensor {
  std::string name;
  int64_t rows, cols;
  std::vector<uint8_t> packed, scales;
};

int run_demo(uint32_t seed) {
  fmt::print("fp4moe demo: one DeepSeek-V4-Flash routed expert, stock MXFP4 -> NVFP4 (seed {})\n\n",
             seed);
  // 1. Synthesize the expert as the stock checkpoint stores it: I8-packed E2M1 + E8M0 per 32.
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 0.02f);  // the init scale of such models' weights
  std::vector<ExpertTensor> expert = {
      {"layers.0.ffn.experts.0.w1.weight", kExpertWidth, kHidden, {}, {}},
      {"layers.0.ffn.experts.0.w3.weight", kExpertWidth, kHidden, {}, {}},
      {"layers.0.ffn.experts.0.w2.weight", kHidden, kExpertWidth, {}, {}}};
  auto start = Clock::now();
  for (auto& t : expert) {
    std::vector<float> w(static_cast<size_t>(t.rows * t.cols));
    for (float& v : w) v = dist(gen);
    t.packed.resize(w.size() / 2);
    t.scales.resize(w.size() / 32);
    const Status s = formats::quantize_mxfp4(t.name, w, t.rows, t.cols,
                                             formats::MxScaleRule::kOcpFloor, t.packed, t.scales);
    if (!s.ok()) {
      fmt::print(stderr, "fp4moe demo: {}\n", s.error().message);
      return 1;
    }
  }
  fmt::print("1. quantized 3 expert matrices to MXFP4 (OCP floor scales) in {:.2f} s\n",
             seconds_since(start));

  // 2. Transcode: w1 and w3 share one tensor scale (they feed one fused GEMM), w2 has its own.
  size_t packed_bytes = 0;
  formats::TranscodeReport total;
  start = Clock::now();
  std::vector<std::vector<uint8_t>> nv_packed(3), nv_scales(3);
  std::vector<float> tensor_scales;
  for (const std::vector<int>& group : {std::vector<int>{0, 1}, std::vector<int>{2}}) {
    std::vector<formats::Mxfp4Source> sources;
    std::vector<formats::Nvfp4Destination> destinations;
    for (int i : group) {
      auto& t = expert[static_cast<size_t>(i)];
      nv_packed[static_cast<size_t>(i)].resize(t.packed.size());
      nv_scales[static_cast<size_t>(i)].resize(t.packed.size() / 8);
      sources.push_back({t.name, t.packed, t.scales, t.rows, t.cols});
      destinations.push_back({nv_packed[static_cast<size_t>(i)], nv_scales[static_cast<size_t>(i)]});
      packed_bytes += t.packed.size() + t.scales.size();
    }
    auto report = formats::transcode_mxfp4_to_nvfp4(sources, destinations);
    if (!report.ok()) {
      fmt::print(stderr, "fp4moe demo: {}\n", report.error().message);
      return 1;
    }
    for (size_t k = 0; k < group.size(); ++k) tensor_scales.push_back(report->tensor_scale);
    total.merge(*report);
  }
  const double transcode_s = seconds_since(start);
  fmt::print("2. transcoded to NVFP4 in {:.3f} s ({:.2f} GB/s of MXFP4 weights)\n", transcode_s,
             static_cast<double>(packed_bytes) / transcode_s / 1e9);
  fmt::print("   blocks: {} total, {} lossless, {} requantized, {} all-zero; max abs error {:.3g}\n",
             total.blocks_total, total.blocks_lossless, total.blocks_requantized,
             total.blocks_all_zero, total.max_abs_error);

  // 3. Check: NVFP4 dequantizes to exactly the MXFP4 values, bit for bit.
  size_t mismatches = 0;
  for (size_t i = 0; i < expert.size(); ++i) {
    const auto& t = expert[i];
    std::vector<float> a(static_cast<size_t>(t.rows * t.cols)), b(a.size());
    FP4MOE_CHECK(formats::dequantize_mxfp4(t.name, t.packed, t.scales, t.rows, t.cols, a).ok());
    FP4MOE_CHECK(formats::dequantize_nvfp4(t.name, nv_packed[i], nv_scales[i], tensor_scales[i],
                                           t.rows, t.cols, b)
                     .ok());
    for (size_t j = 0; j < a.size(); ++j) mismatches += std::bit_cast<uint32_t>(a[j]) != std::bit_cast<uint32_t>(b[j]);
  }
  fmt::print("3. dequantized both: {} of {} values differ ({})\n", mismatches,
             3 * kHidden * kExpertWidth, mismatches == 0 ? "lossless" : "NOT lossless");
  return mismatches == 0 ? 0 : 1;
}

const CommandRegistrar kDemo{{"demo",
                              "Run the end-to-end story on an embedded DeepSeek-V4-Flash expert",
                              [](CLI::App& app) {
                                auto seed = std::make_shared<uint32_t>(20261129);
                                app.add_option("--seed", *seed, "random seed of the weights");
                                return [seed] { return run_demo(*seed); };
                              },
                              100}};

}  // namespace
}  // namespace fp4moe::cli
