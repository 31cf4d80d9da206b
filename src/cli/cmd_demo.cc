// `fp4moe demo`: the README's main job. The whole story on an embedded default: a reduced
// DeepSeek-V4-Flash checkpoint in the stock MXFP4 layout is inspected, planned for sm_120 (what
// each engine's newest release detects and runs, from the engine rules), converted losslessly to
// NVFP4, inspected and planned again, verified and benchmarked on this CPU, before and after. It
// prints only what it measured or can source: no speed-up is estimated for the GPU.
#include <fmt/core.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <memory>

#include "cli/command.h"
#include "convert/convert.h"
#include "detect/directory.h"
#include "engines/rules.h"
#include "model/bench_layers.h"
#include "model/verify.h"
#include "plan/plan.h"
#include "synth/synth.h"

namespace fp4moe::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct DemoArgs {
  std::string dir;
  int layers = 2;
  int experts = 16;
  uint32_t seed = 20261129;
  bool keep = false;
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Removes the demo's working directory on every exit path unless --keep.
struct WorkDir {
  fs::path path;
  bool keep;
  ~WorkDir() {
    std::error_code ec;
    if (!keep && !path.empty()) fs::remove_all(path, ec);
  }
};

struct Side {  // one checkpoint's results: before (MXFP4) or after (NVFP4)
  std::string routed;
  std::vector<std::pair<std::string, std::string>> engine_routes;  // label -> "outcome: path"
  double full_bytes_per_token = 0;
  double full_bound_us = 0;  // bytes / datasheet bandwidth
  double worst_rel_error = 0;
  bool verified = false;
  double layer_us = 0, layer_ratio = 0, bandwidth = 0;
  double w4a8_layer_us = 0, w4a8_layer_ratio = 0;  // the same layers on the W4A8 kernels
};

const plan::ModulePlan* routed_plan(const plan::Plan& p) {
  for (const auto& m : p.modules) {
    if (m.group.role == detect::Role::kRoutedExperts) return &m;
  }
  return nullptr;
}

Result<Side> examine(const fs::path& dir, const fs::path& full_size_dir, const char* label) {
  Side side;
  auto inspected = detect::detect_directory(dir);
  if (!inspected.ok()) return inspected.error();
  const auto& summary = inspected->manifest.summary;
  side.routed = std::string(detect::to_string(summary.routed_experts));
  fmt::print("  inspect: routed experts {}, shared experts {}, MTP experts {}  ({})\n", side.routed,
             detect::to_string(summary.shared_experts), detect::to_string(summary.mtp_experts),
             inspected->manifest.dialect);
  // The findings this story is about (all of them: fp4moe inspect DIR).
  for (const auto& f : inspected->manifest.findings) {
    if (f.severity == detect::Severity::kError || f.code == "quant_method_hides_moe_format" ||
        f.code == "mtp_experts_differ") {
      fmt::print("    {} [{}]: {}\n", detect::to_string(f.severity), f.code, f.message);
    }
  }
  // What each engine's newest release detects in the routed experts and runs on sm_120.
  const engines::Facts facts = engines::make_facts(*inspected, dir);
  for (const auto& engine : engines::all_engines()) {
    plan::PlanOptions options;
    options.facts = &facts;
    options.engine = engines::at_version(engine, engine.newest());
    const plan::Plan p =
        plan::make_plan(inspected->manifest, inspected->config, plan::Target::kSm120, options);
    if (const auto* routed = routed_plan(p)) {
      fmt::print("  {} on sm_120: routed experts -> {} reads {}: {}, {} [{}]\n", p.engine_label,
                 routed->method.empty() ? "-" : routed->method,
                 routed->reads.empty() ? "?" : routed->reads, routed->outcome, routed->kernel,
                 plan::path_name(routed->path));
      side.engine_routes.push_back(
          {p.engine_label, fmt::format("{}: {}", routed->outcome, plan::path_name(routed->path))});
    }
  }
  // The same layout at full size (43 layers x 256 experts, header-only): the real model's bytes
  // per token, and the bound they put on decode at the datasheet bandwidth.
  auto full = detect::detect_directory(full_size_dir);
  if (!full.ok()) return full.error();
  const plan::Plan fp = plan::make_plan(full->manifest, full->config, plan::Target::kSm120, {});
  side.full_bytes_per_token = fp.bytes_per_token;
  side.full_bound_us = fp.bytes_per_token / (fp.device.memory_gbps * 1e3);
  fmt::print(
      "  full-size {} layout: {:.0f} MB of weights read per token at batch 1; at {} ({:.0f} GB/s, "
      "datasheet) no decode step is faster than {:.0f} us\n",
      label, fp.bytes_per_token / 1e6, fp.device.gpu, fp.device.memory_gbps, side.full_bound_us);

  model::VerifyOptions verify_options;
  auto verified = model::verify_checkpoint(dir, verify_options);
  if (!verified.ok()) return verified.error();
  side.verified = true;
  for (const auto& v : *verified) {
    side.verified = side.verified && v.ok;
    side.worst_rel_error = std::max(side.worst_rel_error, v.rel_l2_error);
  }
  fmt::print(
      "  verify on this CPU: {} layers, {} tokens each, worst rel L2 error {:.2e} (tolerance "
      "{:g}): {}\n",
      verified->size(), verify_options.tokens, side.worst_rel_error, model::kVerifyRelTolerance,
      side.verified ? "ok" : "FAILED");
  model::LayerBenchOptions bench_options;
  bench_options.min_seconds = 0.3;
  auto benched = model::bench_checkpoint_layers(dir, bench_options);
  if (!benched.ok()) return benched.error();
  for (const auto& b : *benched) {
    side.layer_us += b.us / static_cast<double>(benched->size());
    side.layer_ratio += b.ratio_to_bound / static_cast<double>(benched->size());
    side.bandwidth = b.bandwidth_gbps;
  }
  fmt::print(
      "  bench on this CPU, batch 1: {:.0f} us per MoE layer, {:.2f}x the bytes/bandwidth bound "
      "({:.1f} GB/s measured in this run)\n",
      side.layer_us, side.layer_ratio, side.bandwidth);
  // The separate W4A8 family (int8 activations per block, its own error bound): not what verify
  // checks against 1e-4, but what a CPU decode would run when that bound is acceptable.
  bench_options.precision = dispatch::Precision::kW4A8;
  auto w4a8 = model::bench_checkpoint_layers(dir, bench_options);
  if (!w4a8.ok()) return w4a8.error();
  for (const auto& b : *w4a8) {
    side.w4a8_layer_us += b.us / static_cast<double>(w4a8->size());
    side.w4a8_layer_ratio += b.ratio_to_bound / static_cast<double>(w4a8->size());
  }
  fmt::print(
      "  the same on the W4A8 kernels (int8 activations): {:.0f} us per MoE layer, {:.2f}x the "
      "bound\n",
      side.w4a8_layer_us, side.w4a8_layer_ratio);
  return side;
}

int fail(const Error& e) {
  fmt::print(stderr, "fp4moe demo: {}\n", e.message);
  return 1;
}

#define FP4MOE_RETURN_IF_ERROR_INT(expr)                       \
  do {                                                         \
    const Status demo_status_ = (expr);                        \
    if (!demo_status_.ok()) return fail(demo_status_.error()); \
  } while (0)

int run_demo(const DemoArgs& args) {
  const auto start = Clock::now();
  WorkDir work{args.dir, args.keep};
  if (work.path.empty()) {
    std::string templ = (fs::temp_directory_path() / "fp4moe-demo-XXXXXX").string();
    if (mkdtemp(templ.data()) == nullptr) return fail(Error{"cannot create a temporary directory"});
    work.path = templ;
  } else {
    std::error_code ec;
    if (fs::exists(work.path, ec))
      return fail(Error{work.path.string() + ": exists; pass a new directory"});
    fs::create_directories(work.path, ec);
    if (ec) return fail(Error{work.path.string() + ": " + ec.message()});
  }
  const fs::path stock = work.path / "dsv4-flash-mxfp4";
  const fs::path converted = work.path / "dsv4-flash-nvfp4";
  const fs::path stock_full = work.path / "full-size-mxfp4";
  const fs::path nvidia_full = work.path / "full-size-nvfp4";

  fmt::print("fp4moe demo: DeepSeek-V4-Flash, stock MXFP4 experts -> NVFP4 (work dir {})\n\n",
             work.path.string());
  synth::SynthOptions small;
  small.layers = args.layers;
  small.experts = args.experts;
  small.seed = args.seed;
  auto t = Clock::now();
  FP4MOE_RETURN_IF_ERROR_INT(synth::write_synthetic(synth::Layout::kDsv4Mxfp4, stock, small));
  synth::SynthOptions full;
  full.full_size = true;
  FP4MOE_RETURN_IF_ERROR_INT(synth::write_synthetic(synth::Layout::kDsv4Mxfp4, stock_full, full));
  FP4MOE_RETURN_IF_ERROR_INT(synth::write_synthetic(synth::Layout::kDsv4Nvfp4, nvidia_full, full));
  fmt::print(
      "0. synthesized the stock layout: {} layers x {} experts at the real expert shapes "
      "(hidden 4096, width 2048), real names and config, in {:.1f} s; plus full-size "
      "header-only (sparse) copies of both layouts for the real model's figures\n\n",
      args.layers, args.experts, seconds_since(t));

  fmt::print("1. the stock checkpoint, as DeepSeek ships it\n");
  auto before = examine(stock, stock_full, "stock");
  if (!before.ok()) return fail(before.error());

  fmt::print("\n2. fp4moe convert --to nvfp4 (lossless: nibbles kept, scales rewritten)\n");
  convert::ConvertOptions convert_options;
  t = Clock::now();
  auto report = convert::convert_checkpoint(stock, converted, convert_options);
  if (!report.ok()) return fail(report.error());
  const auto& r = report->report;
  fmt::print(
      "  {} modules, {:.2f} GB in {:.1f} s; blocks: {} total, {} bit-exact, {} all-zero, {} "
      "requantized (max abs error {:.3g})\n",
      report->modules_converted, report->bytes_read / 1e9, seconds_since(t), r.blocks_total,
      r.blocks_lossless, r.blocks_all_zero, r.blocks_requantized, r.max_abs_error);

  fmt::print("\n3. the converted checkpoint\n");
  auto after = examine(converted, nvidia_full, "NVFP4");
  if (!after.ok()) return fail(after.error());

  fmt::print("\n4. comparison                      stock MXFP4                  converted NVFP4\n");
  for (size_t i = 0; i < before->engine_routes.size() && i < after->engine_routes.size(); ++i) {
    fmt::print("   sm_120 routed, {:<17} {:<28} {}\n", before->engine_routes[i].first,
               before->engine_routes[i].second, after->engine_routes[i].second);
  }
  fmt::print("   sm_120 decode bound, full model {:<28} {}\n",
             fmt::format("{:.0f} us/token", before->full_bound_us),
             fmt::format("{:.0f} us/token", after->full_bound_us));
  fmt::print("   CPU verify, worst rel L2 error  {:<28} {}\n",
             fmt::format("{:.2e}", before->worst_rel_error),
             fmt::format("{:.2e}", after->worst_rel_error));
  fmt::print("   CPU MoE layer, batch 1          {:<28} {}\n",
             fmt::format("{:.0f} us ({:.2f}x bound)", before->layer_us, before->layer_ratio),
             fmt::format("{:.0f} us ({:.2f}x bound)", after->layer_us, after->layer_ratio));
  fmt::print(
      "   CPU MoE layer, batch 1, W4A8    {:<28} {}\n",
      fmt::format("{:.0f} us ({:.2f}x bound)", before->w4a8_layer_us, before->w4a8_layer_ratio),
      fmt::format("{:.0f} us ({:.2f}x bound)", after->w4a8_layer_us, after->w4a8_layer_ratio));
  fmt::print("   lossless                        -                            {}\n",
             r.blocks_requantized == 0 ? "every block bit-exact" : "some blocks requantized");
  fmt::print("\ndone in {:.1f} s{}\n", seconds_since(start),
             args.keep ? ", checkpoints kept in " + work.path.string() : "");
  const bool ok = before->verified && after->verified && r.blocks_requantized == 0;
  return ok ? 0 : 1;
}

const CommandRegistrar kDemo{
    {"demo", "Tell the whole story on an embedded reduced DeepSeek-V4-Flash",
     [](CLI::App& app) {
       auto args = std::make_shared<DemoArgs>();
       app.add_option("--dir", args->dir, "work directory (default: a new temporary one)");
       app.add_option("--layers", args->layers, "MoE layers to synthesize")
           ->check(CLI::Range(1, 43));
       app.add_option("--experts", args->experts, "routed experts per layer")
           ->check(CLI::Range(6, 256));
       app.add_option("--seed", args->seed, "random seed of the weights");
       app.add_flag("--keep", args->keep, "keep the checkpoints");
       return [args] { return run_demo(*args); };
     },
     100}};

}  // namespace
}  // namespace fp4moe::cli
