// Times MoeLayer::forward on a checkpoint's layers with fresh random activations per call, so
// each call routes to different experts, as decode does.
#include "model/bench_layers.h"

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
  // 1 GiB streamed: far past the last-level cache, so this is the DRAM figure decode faces. Read
  // before each round of calls, which it judges (dispatch::RoundBound: a VM's bandwidth changes
  // within seconds).
  dispatch::ReadProbe probe(pool, size_t{1} << 30);
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
    auto timed =
        dispatch::run_rounds(probe, options.min_seconds, 8, [&]() -> Result<dispatch::StepCost> {
          const int s = static_cast<int>(b.calls % kActivationSets);
          const auto t0 = std::chrono::steady_clock::now();
          FP4MOE_RETURN_IF_ERROR(
              moe->forward(xs.data() + s * options.batch * hidden, options.batch, y.data(), pool));
          ++b.calls;
          return dispatch::StepCost{
              static_cast<double>(moe->last_bytes_read()),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
        });
    if (!timed.ok()) return timed.error();
    const dispatch::RoundBound& bound = *timed;
    b.layer = layer;
    b.expert_scheme = loaded->expert_scheme();
    b.precision = dispatch::precision_name(options.precision);
    b.batch = options.batch;
    b.us = bound.seconds * 1e6 / static_cast<double>(b.calls);
    b.bytes_per_call = bound.bytes / static_cast<double>(b.calls);
    b.bandwidth_gbps = bound.bandwidth();
    b.bound_us = bound.bound_seconds * 1e6 / static_cast<double>(b.calls);
    b.ratio_to_bound = bound.ratio();
    results.push_back(b);
  }
  return results;
}

}  // namespace fp4moe::model
