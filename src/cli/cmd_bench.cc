// `fp4moe bench`: kernel and MoE-layer benchmarks that report ratios measured in the same run
// (GB/s against this machine's DRAM read bandwidth, time against the bytes/bandwidth bound).
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "cli/cli_common.h"
#include "cli/command.h"
#include "core/thread_pool.h"
#include "detect/manifest.h"
#include "dispatch/cpu_features.h"
#include "dispatch/measure.h"
#include "kernels/types.h"
#include "model/bench_layers.h"
#include "moe/bench_moe.h"

namespace fp4moe::cli {
namespace {

struct BenchOptions {
  bool gemv = false;
  bool moe = false;
  std::string format = "nvfp4";
  int64_t m = 1, k = 4096, n = 14336;
  std::string isa;
  std::string precision = "w4a16";
  std::string activations = "f32";  // --gemv: f32 | bf16
  bool json = false;
  double min_gib = 1.0;
  double seconds = 2.0;
  int repeat = 1;
  int64_t batch = 1;
  std::string checkpoint;   // --checkpoint DIR|REPO_ID: the checkpoint's own MoE layers
  std::string revision;     // with a repo id
  std::vector<int> layers;  // with --checkpoint; empty = every MoE layer
};

// `--checkpoint DIR`: each MoE layer of a real (or synthetic) checkpoint on this CPU.
int run_checkpoint_bench(const BenchOptions& o, dispatch::Precision precision) {
  model::LayerBenchOptions options;
  options.precision = precision;
  options.layers = o.layers;
  options.batch = o.batch;
  options.min_seconds = o.seconds;
  auto resolved = checkpoint::resolve_checkpoint(o.checkpoint, o.revision);
  if (!resolved.ok()) return report_error("bench", resolved.error(), o.json);
  auto results = model::bench_checkpoint_layers(resolved->path, options);
  if (!results.ok()) return report_error("bench", results.error(), o.json);
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const auto& b : *results) {
    if (o.json) {
      layers.push_back({{"layer", b.layer},
                        {"expert_scheme", b.expert_scheme},
                        {"precision", b.precision},
                        {"batch", b.batch},
                        {"calls", b.calls},
                        {"us", b.us},
                        {"bytes_per_call", b.bytes_per_call},
                        {"bandwidth_gbps", b.bandwidth_gbps},
                        {"bound_us", b.bound_us},
                        {"ratio_to_bound", b.ratio_to_bound}});
    } else {
      std::printf(
          "layer %d (%s experts, %s), batch %lld: %.0f us per call, %.1f MB read, bound %.0f us "
          "at %.2f GB/s measured in this run: %.2fx the bound (%lld calls)\n",
          b.layer, b.expert_scheme.c_str(), b.precision.c_str(), static_cast<long long>(b.batch),
          b.us, b.bytes_per_call / 1e6, b.bound_us, b.bandwidth_gbps, b.ratio_to_bound,
          static_cast<long long>(b.calls));
    }
  }
  if (o.json) {
    std::printf("%s\n", nlohmann::ordered_json{{"schema_version", detect::kJsonSchemaVersion},
                                               {"checkpoint", o.checkpoint},
                                               {"source",
                                                source_json({o.checkpoint, o.revision}, *resolved)},
                                               {"layers", layers}}
                            .dump()
                            .c_str());
  }
  return 0;
}

std::optional<kernels::WeightFormat> parse_format(const std::string& s) {
  for (kernels::WeightFormat f : kernels::kAllWeightFormats) {
    if (kernels::weight_format_name(f) == s) return f;
  }
  return std::nullopt;
}

// --repeat N: N whole rounds, each with its own bandwidth measurements, sorted by their ratio so
// the median round is in the middle (a shared host's DRAM bandwidth drifts by +-15% between runs,
// so one round's ratio is not a figure to report alone). `ratios` gets each round's ratio in the
// order the rounds ran (the JSON's "round_ratios", so a reader can check the median).
template <class RunOne, class Ratio>
auto sorted_rounds(int repeat, RunOne run_one, Ratio ratio, std::vector<double>& ratios)
    -> Result<std::vector<std::remove_cvref_t<decltype(*run_one())>>> {
  std::vector<std::remove_cvref_t<decltype(*run_one())>> rounds;
  for (int i = 0; i < repeat; ++i) {
    auto one = run_one();
    if (!one.ok()) return one.error();
    rounds.push_back(std::move(one).value());
    ratios.push_back(ratio(rounds.back()));
  }
  std::sort(rounds.begin(), rounds.end(),
            [&](const auto& a, const auto& b) { return ratio(a) < ratio(b); });
  return rounds;
}

int run_bench(const BenchOptions& o) {
  if (static_cast<int>(o.gemv) + static_cast<int>(o.moe) +
          static_cast<int>(!o.checkpoint.empty()) !=
      1) {
    return report_error("bench", Error{"choose exactly one of --gemv, --moe and --checkpoint DIR"},
                        o.json);
  }
  if (!o.revision.empty() && o.checkpoint.empty()) {
    return report_error("bench", Error{"--revision goes with --checkpoint REPO_ID"}, o.json);
  }
  const auto precision = dispatch::parse_precision(o.precision);
  if (!precision.ok()) return report_error("bench", precision.error(), o.json);
  if (!o.checkpoint.empty()) return run_checkpoint_bench(o, *precision);
  const auto format = parse_format(o.format);
  if (!format) {
    return report_error(
        "bench", Error{"unknown --format '" + o.format + "' (nvfp4, mxfp4, fp8_block)"}, o.json);
  }
  std::optional<kernels::Isa> isa;
  if (!o.isa.empty()) {
    auto parsed = dispatch::parse_isa(o.isa);
    if (!parsed.ok()) return report_error("bench", parsed.error(), o.json);
    isa = *parsed;
  }
  const size_t min_bytes = static_cast<size_t>(o.min_gib * double(size_t{1} << 30));
  ThreadPool& pool = ThreadPool::global();
  nlohmann::ordered_json j;
  if (o.gemv) {
    auto ratio = [](const dispatch::GemmBenchResult& g) { return g.bandwidth_ratio; };
    std::vector<double> round_ratios;
    auto sorted = sorted_rounds(
        o.repeat,
        [&] {
          return dispatch::bench_gemm(*format, isa, o.m, o.k, o.n, min_bytes, o.seconds, pool,
                                      *precision, o.activations == "bf16");
        },
        ratio, round_ratios);
    if (!sorted.ok()) return report_error("bench", sorted.error(), o.json);
    const auto& rounds = *sorted;
    const dispatch::GemmBenchResult* r = &rounds[rounds.size() / 2];
    j = {{"format", r->format},
         {"isa", r->isa},
         {"kernel", r->kernel},
         {"precision", r->precision},
         {"activations", r->activations},
         {"m", r->m},
         {"k", r->k},
         {"n", r->n},
         {"weight_bytes", r->weight_bytes},
         {"copies", r->copies},
         {"threads", r->threads},
         {"us", r->us},
         {"gbps", r->gbps},
         {"bandwidth_gbps", r->bandwidth_gbps},
         {"bandwidth_ratio", r->bandwidth_ratio},
         {"bandwidth_min_gbps", r->bandwidth_min_gbps},
         {"bandwidth_max_gbps", r->bandwidth_max_gbps},
         {"bandwidth_rounds", r->bandwidth_rounds},
         {"gflops", r->gflops},
         {"pack_s_per_gb", r->pack_s_per_gb},
         {"rounds", o.repeat},
         {"bandwidth_ratio_min", ratio(rounds.front())},
         {"bandwidth_ratio_max", ratio(rounds.back())},
         {"round_ratios", round_ratios}};
    if (!o.json) {
      std::printf(
          "%s %s %s activations m=%lld k=%lld n=%lld: %.1f us/product, %.2f GB/s = %.3f of the "
          "%.2f GB/s "
          "DRAM read bandwidth measured between its %d rounds (%.1f .. %.1f), %.1f GFLOP/s "
          "(%d copies of %zu bytes, %d threads; pack %.2f s/GB)\n",
          r->kernel.c_str(), r->format.c_str(), r->activations.c_str(),
          static_cast<long long>(r->m), static_cast<long long>(r->k), static_cast<long long>(r->n),
          r->us, r->gbps, r->bandwidth_ratio, r->bandwidth_gbps, r->bandwidth_rounds,
          r->bandwidth_min_gbps, r->bandwidth_max_gbps, r->gflops, r->copies, r->weight_bytes,
          r->threads, r->pack_s_per_gb);
      if (o.repeat > 1) {
        std::printf("  median of %d rounds; ratio %.3f .. %.3f\n", o.repeat, ratio(rounds.front()),
                    ratio(rounds.back()));
      }
      return 0;
    }
  } else {
    auto ratio = [](const moe::MoeBenchResult& m) { return m.ratio_to_bound; };
    std::vector<double> round_ratios;
    auto sorted = sorted_rounds(
        o.repeat,
        [&] {
          return moe::bench_moe_layer(*format, isa, o.batch, min_bytes, o.seconds, pool,
                                      *precision);
        },
        ratio, round_ratios);
    if (!sorted.ok()) return report_error("bench", sorted.error(), o.json);
    const auto& rounds = *sorted;
    const moe::MoeBenchResult* r = &rounds[rounds.size() / 2];
    j = r->to_json();
    j["rounds"] = o.repeat;
    j["ratio_to_bound_min"] = ratio(rounds.front());
    j["ratio_to_bound_max"] = ratio(rounds.back());
    j["round_ratios"] = round_ratios;
    if (!o.json) {
      std::printf("%s\n%s", r->summary().c_str(), r->phase_table().c_str());
      if (o.repeat > 1) {
        std::printf("  median of %d rounds; ratio to bound %.2fx .. %.2fx\n", o.repeat,
                    ratio(rounds.front()), ratio(rounds.back()));
      }
      return 0;
    }
  }
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

const CommandRegistrar registrar{Command{
    "bench", "Benchmark the CPU kernels and the MoE layer against measured DRAM bandwidth",
    [](CLI::App& app) -> std::function<int()> {
      auto o = std::make_shared<BenchOptions>();
      app.add_flag("--gemv", o->gemv, "One GEMM/GEMV Y = X . W^T over >= 1 GiB of weights");
      app.add_flag("--moe", o->moe,
                   "One DeepSeek-V4-Flash MoE layer (256 experts, top-6, 1 shared, 4096 -> 2048)");
      app.add_option("--format", o->format, "nvfp4 | mxfp4 | fp8_block")->capture_default_str();
      app.add_option("--m", o->m, "tokens (rows of X)")->capture_default_str();
      app.add_option("--k", o->k, "input features")->capture_default_str();
      app.add_option("--n", o->n, "output features")->capture_default_str();
      app.add_option("--batch", o->batch, "tokens per MoE layer call")->capture_default_str();
      app.add_option("--checkpoint", o->checkpoint,
                     "benchmark this checkpoint's own MoE layers: a directory, or a Hugging Face "
                     "repo id read from the local hub cache");
      app.add_option("--revision", o->revision,
                     "with --checkpoint REPO_ID: branch, tag or commit hash (default main)");
      app.add_option("--layers", o->layers, "with --checkpoint: layer indices (default: all)")
          ->delimiter(',');
      app.add_option("--isa", o->isa,
                     "force an ISA: scalar | avx2 | avx512 | avx512_vnni | avx512_bf16 | amx_int8");
      app.add_option("--precision", o->precision,
                     "w4a16 (exact: F32 activations) | w4a8 (int8 activations per block, the "
                     "separate W4A8 kernels; FP4 formats; an MoE layer's FP8 matrices take BF16 "
                     "activations)")
          ->capture_default_str();
      app.add_option(
             "--activations", o->activations,
             "--gemv with w4a16: f32 | bf16 (BF16 activations, run as a model's BF16 hidden "
             "states are: the BF16-activation kernels where the host has them)")
          ->check(CLI::IsMember({"f32", "bf16"}))
          ->capture_default_str();
      app.add_option("--min-gib", o->min_gib, "weight set streamed, GiB")->capture_default_str();
      app.add_option("--seconds", o->seconds, "minimum timed seconds")->capture_default_str();
      app.add_option("--repeat", o->repeat,
                     "--gemv/--moe: whole rounds, each with its own bandwidth measurement; the "
                     "median round is reported with the min and max ratio")
          ->check(CLI::Range(1, 99))
          ->capture_default_str();
      app.add_flag("--json", o->json, "print one JSON object");
      return [o] { return run_bench(*o); };
    },
    90}};

}  // namespace
}  // namespace fp4moe::cli
