// Kernel path vs reference for each MoE layer of a checkpoint.
#include "model/verify.h"

#include <chrono>
#include <cmath>
#include <random>

#include "core/thread_pool.h"
#include "model/moe_checkpoint.h"
#include "moe/moe_layer.h"

namespace fp4moe::model {

Result<std::vector<LayerVerification>> verify_checkpoint(const std::filesystem::path& path,
                                                         const VerifyOptions& options) {
  auto dir = checkpoint::CheckpointDir::open(path);
  if (!dir.ok()) return dir.error();
  auto info = read_moe_model(*dir);
  if (!info.ok()) return info.error();
  std::vector<int> layers = options.layers.empty() ? info->moe_layers : options.layers;
  std::vector<LayerVerification> results;
  for (int layer : layers) {
    if (std::find(info->moe_layers.begin(), info->moe_layers.end(), layer) ==
        info->moe_layers.end()) {
      return Error{path.string() + ": layer " + std::to_string(layer) +
                   " is not a score-routed MoE "
                   "layer of this checkpoint (hash-routed layers need token ids)"};
    }
    auto loaded = MoeCheckpointLayer::load(*dir, *info, layer);
    if (!loaded.ok()) return loaded.error();
    auto moe = moe::MoeLayer::create(loaded->config(), loaded->router(), loaded->experts(),
                                     loaded->shared(), options.tokens, options.isa);
    if (!moe.ok())
      return Error{path.string() + ": layer " + std::to_string(layer) + ": " + moe.error().message};
    const int64_t hidden = loaded->config().hidden;
    std::mt19937 gen(options.seed + static_cast<uint32_t>(layer));
    std::normal_distribution<float> dist(0.0f, 1.0f);  // post-RMSNorm activations are O(1)
    std::vector<float> x(static_cast<size_t>(options.tokens * hidden)), y(x.size());
    for (float& v : x) v = dist(gen);
    const auto start = std::chrono::steady_clock::now();
    FP4MOE_RETURN_IF_ERROR(moe->forward(x.data(), options.tokens, y.data(), ThreadPool::global()));
    LayerVerification v;
    v.kernel_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    auto ref = reference_forward(*loaded, x.data(), options.tokens, moe->ids());
    if (!ref.ok()) return ref.error();
    double err2 = 0, ref2 = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      const double d = static_cast<double>(y[i]) - ref->y[i];
      err2 += d * d;
      ref2 += ref->y[i] * ref->y[i];
      v.max_abs_error = std::max(v.max_abs_error, std::fabs(d));
      v.max_abs_reference = std::max(v.max_abs_reference, std::fabs(ref->y[i]));
    }
    v.layer = layer;
    v.expert_scheme = loaded->expert_scheme();
    v.shared_scheme = loaded->shared_scheme();
    v.kernels = moe->describe();
    v.tokens = options.tokens;
    v.rel_l2_error = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
    v.routing_ties = ref->routing_ties;
    v.routing_mismatches = ref->routing_mismatches;
    v.ok = v.rel_l2_error <= kVerifyRelTolerance && v.routing_mismatches == 0 &&
           std::isfinite(v.rel_l2_error);
    results.push_back(v);
  }
  return results;
}

}  // namespace fp4moe::model
