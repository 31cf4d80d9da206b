// Times MoeLayer::forward on a checkpoint's layers with fresh random activations per call, so
// each call routes to different experts, as decode does.
#include "model/bench_layers.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "core/thread_pool.h"
#include "dispatch/measure.h"
#include "model/moe_checkpoint.h"
#include "moe/moe_layer.h"

namespace fp4moe::model {

Result<std::vector<LayerBench>> bench_checkpoint_layers(const std::filesystem::path& path,
                                                        const LayerBenchOptions& options) {
  auto dir = checkpoint::CheckpointDir::open(path);
  if (!dir.ok()) return dir.error();
  auto info = read_moe_model(*dir);
  if (!info.ok()) return info.error();
  ThreadPool& pool = ThreadPool::global();
  // 1 GiB streamed: far past the last-level cache, so this is the DRAM figure decode faces.
  // Measured before and after all layers; the better figure is the reference for every layer
  // (the bandwidth of a shared host drifts; see dispatch::bench_gemm), so ratios err low.
  const double bandwidth_before = dispatch::measure_read_bandwidth_gbps(pool, size_t{1} << 30);
  std::vector<LayerBench> results;
  const std::vector<int> layers = options.layers.empty() ? info->moe_layers : options.layers;
  for (int layer : layers) {
    auto loaded = MoeCheckpointLayer::load(*dir, *info, layer);
    if (!loaded.ok()) return loaded.error();
    auto moe =
        moe::MoeLayer::create(loaded->config(), loaded->router(), loaded->experts(),
                              loaded->shared(), options.batch, std::nullopt, options.precision);
    if (!moe.ok()) return moe.error();
    const int64_t hidden = loaded->config().hidden;
    // A pool of activation sets prepared up front: no allocation or RNG in the timed loop.
    constexpr int kActivationSets = 64;
    std::mt19937 gen(options.seed + static_cast<uint32_t>(layer));
    std::normal_distribution<float> dist;
    std::vector<float> xs(static_cast<size_t>(kActivationSets * options.batch * hidden));
    for (float& v : xs) v = dist(gen);
    std::vector<float> y(static_cast<size_t>(options.batch * hidden));
    // One untimed call per set warms the page cache and the packed weights' TLB entries.
    for (int s = 0; s < kActivationSets; ++s) {
      FP4MOE_RETURN_IF_ERROR(
          moe->forward(xs.data() + s * options.batch * hidden, options.batch, y.data(), pool));
    }
    LayerBench b;
    double bytes = 0;
    const auto start = std::chrono::steady_clock::now();
    double elapsed = 0;
    while (elapsed < options.min_seconds || b.calls < 8) {
      const int s = static_cast<int>(b.calls % kActivationSets);
      FP4MOE_RETURN_IF_ERROR(
          moe->forward(xs.data() + s * options.batch * hidden, options.batch, y.data(), pool));
      bytes += static_cast<double>(moe->last_bytes_read());
      ++b.calls;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    b.layer = layer;
    b.expert_scheme = loaded->expert_scheme();
    b.precision = dispatch::precision_name(options.precision);
    b.batch = options.batch;
    b.us = elapsed * 1e6 / static_cast<double>(b.calls);
    b.bytes_per_call = bytes / static_cast<double>(b.calls);
    results.push_back(b);
  }
  const double bandwidth =
      std::max(bandwidth_before, dispatch::measure_read_bandwidth_gbps(pool, size_t{1} << 30));
  for (LayerBench& b : results) {
    b.bandwidth_gbps = bandwidth;
    b.bound_us = b.bytes_per_call / (bandwidth * 1e9) * 1e6;
    b.ratio_to_bound = b.us / b.bound_us;
  }
  return results;
}

}  // namespace fp4moe::model
