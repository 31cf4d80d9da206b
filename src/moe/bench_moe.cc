// The DeepSeek-V4-Flash MoE-layer benchmark (see bench_moe.h).
#include "moe/bench_moe.h"

#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "dispatch/measure.h"
#include "formats/scalar.h"
#include "kernels/registry.h"
#include "moe/moe_layer.h"
#include "pack/pack.h"

namespace fp4moe::moe {
namespace {

using Clock = std::chrono::steady_clock;

// DeepSeek-V4-Flash config.json (MOE_SEMANTICS.md §1).
constexpr int kExperts = 256;
constexpr int kTopK = 6;
constexpr int64_t kHidden = 4096;
constexpr int64_t kInter = 2048;

}  // namespace

nlohmann::ordered_json MoeBenchResult::to_json() const {
  return {{"layer", layer},
          {"format", format},
          {"isa", isa},
          {"precision", precision},
          {"batch", batch},
          {"threads", threads},
          {"calls", calls},
          {"us", us},
          {"bytes_per_call", bytes_per_call},
          {"bandwidth_gbps", bandwidth_gbps},
          {"bandwidth_min_gbps", bandwidth_min_gbps},
          {"bandwidth_max_gbps", bandwidth_max_gbps},
          {"bandwidth_rounds", bandwidth_rounds},
          {"bound_us", bound_us},
          {"ratio_to_bound", ratio_to_bound},
          {"pack_s_per_gb", pack_s_per_gb},
          {"phases", phases_json()}};
}

nlohmann::ordered_json MoeBenchResult::phases_json() const {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (int i = 0; i < kMoePhases; ++i) {
    out[std::string(moe_phase_name(static_cast<MoePhase>(i)))] = {{"us", phase_us[i]},
                                                                  {"share", phase_us[i] / us}};
  }
  out["handoffs"] = {{"us", handoff_us()},
                     {"share", handoff_us() / us},
                     {"pool_jobs", pool_jobs_per_call},
                     {"empty_job_us", empty_job_us}};
  return out;
}

std::string MoeBenchResult::phase_table() const {
  std::string out = "  phase            us/call   share\n";
  char buf[128];
  for (int i = 0; i < kMoePhases; ++i) {
    std::snprintf(buf, sizeof(buf), "  %-15s %8.1f  %5.1f%%\n",
                  std::string(moe_phase_name(static_cast<MoePhase>(i))).c_str(), phase_us[i],
                  100.0 * phase_us[i] / us);
    out += buf;
  }
  std::snprintf(buf, sizeof(buf), "  %-15s %8.1f  %5.1f%%  (%d pool jobs x %.1f us, empty)\n",
                "handoffs", handoff_us(), 100.0 * handoff_us() / us, pool_jobs_per_call,
                empty_job_us);
  out += buf;
  return out;
}

std::string MoeBenchResult::summary() const {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "%s, %s experts (%s), batch %lld: %.0f us per layer; %.1f MB read per call, "
                "bound %.0f us at the %.2f GB/s DRAM read bandwidth measured between its %d rounds "
                "(%.1f .. %.1f): %.2fx the bound (%d threads, %s)",
                layer.c_str(), format.c_str(), precision.c_str(), static_cast<long long>(batch), us,
                bytes_per_call / 1e6, bound_us, bandwidth_gbps, bandwidth_rounds,
                bandwidth_min_gbps, bandwidth_max_gbps, ratio_to_bound, threads, isa.c_str());
  return buf;
}

Result<MoeBenchResult> bench_moe_layer(kernels::WeightFormat routed_format,
                                       std::optional<kernels::Isa> isa, int64_t batch,
                                       size_t min_bandwidth_bytes, double min_seconds,
                                       ThreadPool& pool, dispatch::Precision precision) {
  if (batch < 1) return Error{"bench --moe: batch must be >= 1"};
  std::mt19937_64 rng(42);
  const dispatch::RandomMatrix up_src(routed_format, kInter, kHidden, rng);
  const dispatch::RandomMatrix down_src(routed_format, kHidden, kInter, rng);
  const dispatch::RandomMatrix shared_up_src(kernels::WeightFormat::kFp8Block128, kInter, kHidden,
                                             rng);
  const dispatch::RandomMatrix shared_down_src(kernels::WeightFormat::kFp8Block128, kHidden, kInter,
                                               rng);

  // Every expert gets its own copy: 256 x 3 matrices (about 3.4 GB in NVFP4), as in a checkpoint.
  std::vector<std::unique_ptr<pack::PackedWeights>> store;
  auto pack_copy =
      [&store](const dispatch::RandomMatrix& src) -> Result<const pack::PackedWeights*> {
    auto p = src.pack();
    if (!p.ok()) return p.error();
    store.push_back(std::make_unique<pack::PackedWeights>(std::move(p).value()));
    return store.back().get();
  };
  std::vector<ExpertWeights> experts(kExperts), shared(1);
  double packed_checkpoint_bytes = 0;
  const auto pack_t0 = Clock::now();
  for (int e = 0; e < kExperts + 1; ++e) {
    const bool is_shared = e == kExperts;
    ExpertWeights& w = is_shared ? shared[0] : experts[e];
    const dispatch::RandomMatrix& up = is_shared ? shared_up_src : up_src;
    const dispatch::RandomMatrix& down = is_shared ? shared_down_src : down_src;
    for (auto [slot, src] :
         {std::pair{&w.gate, &up}, std::pair{&w.up, &up}, std::pair{&w.down, &down}}) {
      auto p = pack_copy(*src);
      if (!p.ok()) return p.error();
      *slot = *p;
      packed_checkpoint_bytes += static_cast<double>(src->bytes());
    }
  }
  const double pack_s = std::chrono::duration<double>(Clock::now() - pack_t0).count();

  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> router_w(kExperts * kHidden), bias(kExperts);
  // BF16 values, as the checkpoint holds them (DeepSeek-V4-Flash: torch_dtype bfloat16; its router
  // gate is not quantized): the layer keeps them as BF16 (RouterWeights::weight_bf16).
  for (float& v : router_w) v = formats::decode_bf16(formats::encode_bf16(normal(rng) * 0.02f));
  for (float& v : bias) v = normal(rng) * 0.01f;
  MoeConfig config;
  config.hidden = kHidden;
  config.router = RouterConfig{
      kExperts, kTopK, ScoringFunc::kSqrtSoftplus, WeightRule::kScoresAtSelected, true, 1.5f, 1, 1};
  config.routed_activation = {GatedActivation::kSwiGlu, 10.0f, 1.702f};
  config.shared_activation = config.routed_activation;
  auto layer = MoeLayer::create(config, RouterWeights{router_w, {}, bias}, experts, shared, batch,
                                isa, precision);
  if (!layer.ok()) return layer.error();

  MoeBenchResult r;
  r.layer = "DeepSeek-V4-Flash MoE (256 experts, top-6, 1 shared FP8 expert, 4096 -> 2048)";
  r.format = kernels::weight_format_name(routed_format);
  r.precision = dispatch::precision_name(precision);
  r.batch = batch;
  r.threads = pool.size();
  r.pack_s_per_gb = pack_s / (packed_checkpoint_bytes / 1e9);
  // The routed experts' ISA, as their plans chose it (a W4A8 plan may sit below the exact one).
  auto routed_plan = dispatch::LinearPlan::create(store[0]->view(), isa, precision);
  if (!routed_plan.ok()) return routed_plan.error();
  r.isa = kernels::isa_name(routed_plan->isa());
  dispatch::ReadProbe probe(pool, std::max<size_t>(min_bandwidth_bytes, size_t{1} << 30));

  // Fresh random tokens every call, so the experts read change from call to call as in decode.
  std::vector<float> x(batch * kHidden), y(batch * kHidden);
  auto new_tokens = [&] {
    for (float& v : x) v = normal(rng);
  };
  new_tokens();
  FP4MOE_RETURN_IF_ERROR(layer->forward(x.data(), batch, y.data(), pool));  // warm-up
  // Timed calls in rounds (dispatch::run_rounds); drawing the tokens is not timed.
  double phase_s[kMoePhases] = {};
  auto timed = dispatch::run_rounds(probe, min_seconds, 1, [&]() -> Result<dispatch::StepCost> {
    new_tokens();
    const auto t0 = Clock::now();
    FP4MOE_RETURN_IF_ERROR(layer->forward(x.data(), batch, y.data(), pool));
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    const MoePhaseTimes& phases = layer->last_phase_times();
    for (int i = 0; i < kMoePhases; ++i) phase_s[i] += phases.seconds[i];
    r.pool_jobs_per_call = phases.pool_jobs;
    ++r.calls;
    return dispatch::StepCost{static_cast<double>(layer->last_bytes_read()), s};
  });
  if (!timed.ok()) return timed.error();
  const dispatch::RoundBound& bound = *timed;
  for (int i = 0; i < kMoePhases; ++i) {
    r.phase_us[i] = phase_s[i] / static_cast<double>(r.calls) * 1e6;
  }
  // The latency of one empty job on this pool: what each hand-off costs beyond its work.
  {
    constexpr int kJobs = 2000;
    const auto t0 = Clock::now();
    for (int i = 0; i < kJobs; ++i) pool.run(pool.size(), [](int64_t, int) {});
    r.empty_job_us = std::chrono::duration<double>(Clock::now() - t0).count() / kJobs * 1e6;
  }
  r.us = bound.seconds / static_cast<double>(r.calls) * 1e6;
  r.bytes_per_call = bound.bytes / static_cast<double>(r.calls);
  r.bandwidth_gbps = bound.bandwidth();
  r.bandwidth_min_gbps = bound.min_gbps;
  r.bandwidth_max_gbps = bound.max_gbps;
  r.bandwidth_rounds = bound.rounds;
  r.bound_us = bound.bound_seconds / static_cast<double>(r.calls) * 1e6;
  r.ratio_to_bound = bound.ratio();
  return r;
}

}  // namespace fp4moe::moe
