// `fp4moe plan DIR [--target T | --gpu NAME[xN]] [--engine NAME[@VERSION]]`: what an engine
// detects in every module group, the kernel and hardware path it runs, and where that is wrong,
// the fix; without --engine one column per engine (its newest release). A batch-1 decode lower
// bound from the datasheet bandwidth; `--html FILE` draws all targets on one self-contained page.
#include <fmt/core.h>

#include <cmath>
#include <fstream>
#include <memory>

#include "cli/cli_common.h"
#include "cli/command.h"
#include "core/thread_pool.h"
#include "detect/directory.h"
#include "dispatch/measure.h"
#include "engines/rules.h"
#include "plan/plan.h"

namespace fp4moe::cli {
namespace {

struct PlanArgs {
  CheckpointArg checkpoint;
  std::string target, gpu, engine, html;
  double kv_cache_gb = 0;
  bool json = false;
};

double cpu_bandwidth_gbps() {
  // All threads of the pool, a buffer far past the last-level cache: what decode can stream.
  return dispatch::measure_read_bandwidth_gbps(ThreadPool::global(), size_t{512} << 20);
}

int run_plan(const PlanArgs& args) {
  auto bad = [&](std::string message) {
    return report_error("plan", Error{std::move(message), ErrorKind::kBadInput}, args.json);
  };
  auto choice = plan::parse_target_choice(args.target, args.gpu);
  if (!choice.ok()) return bad(choice.error().message);
  plan::Target target = plan::Target::kCpu;
  std::optional<plan::GpuChoice> gpu;
  std::string target_from = "default (no --target or --gpu): fp4moe's CPU kernels on this host";
  if (*choice) {
    target = (*choice)->target;
    gpu = (*choice)->gpu;
    target_from = (*choice)->from;
  }
  std::optional<engines::EngineAt> engine;
  if (!args.engine.empty()) {
    auto e = engines::parse_engine_spec(args.engine);
    if (!e.ok()) return bad(e.error().message);
    const bool cpu_engine = e->engine->device == "cpu";
    if (target == plan::Target::kCpu && !cpu_engine) {
      return bad(fmt::format(
          "--engine {} plans a GPU serving engine: give --target sm_XX or --gpu NAME (on the CPU: "
          "llamacpp or ktkernel)",
          args.engine));
    }
    if (target != plan::Target::kCpu && cpu_engine) {
      return bad(fmt::format("--engine {}: {} runs on the CPU: give --target cpu", args.engine,
                             e->engine->name));
    }
    engine = *e;
  }
  auto resolved = resolve_checkpoint_arg(args.checkpoint);
  if (!resolved.ok()) return report_error("plan", resolved.error(), args.json);
  auto inspected = detect::detect_directory(resolved->path);
  if (!inspected.ok()) return report_error("plan", inspected.error(), args.json);
  const engines::Facts facts = engines::make_facts(*inspected, resolved->path);

  plan::PlanOptions options;
  options.facts = &facts;
  options.gpu = gpu;
  const bool needs_cpu = target == plan::Target::kCpu || !args.html.empty();
  if (needs_cpu) options.cpu_bandwidth_gbps = cpu_bandwidth_gbps();
  std::vector<plan::Plan> plans;
  if (engine) {
    options.engine = engine;
    plans.push_back(plan::make_plan(inspected->manifest, inspected->config, target, options));
  } else {
    // Side by side: on the CPU, fp4moe's own kernels first, then llama.cpp and kt-kernel (their
    // problems are warnings: fp4moe's route decides the exit status); on a GPU, every engine.
    if (target == plan::Target::kCpu) {
      plans.push_back(plan::make_plan(inspected->manifest, inspected->config, target, options));
    }
    options.engine_problems_are_errors = false;
    const auto& list =
        target == plan::Target::kCpu ? engines::cpu_engines() : engines::all_engines();
    for (const auto& e : list) {
      options.engine = engines::at_version(e, e.newest());
      plans.push_back(plan::make_plan(inspected->manifest, inspected->config, target, options));
    }
  }
  std::optional<plan::Fit> fit;
  if (target != plan::Target::kCpu) {
    fit = plan::fit(inspected->manifest, plans.front().device, plans.front().gpu_count,
                    args.kv_cache_gb);
  }
  if (!args.html.empty()) {
    std::vector<plan::Plan> all;
    plan::PlanOptions html_options = options;
    html_options.gpu.reset();
    html_options.engine = engine && engine->engine->device == "gpu" ? engine : std::nullopt;
    for (plan::Target t : plan::kAllTargets) {
      all.push_back(plan::make_plan(inspected->manifest, inspected->config, t, html_options));
    }
    std::ofstream out(args.html, std::ios::binary | std::ios::trunc);
    out << plan::to_html(all, "fp4moe plan: " + args.checkpoint.spec);
    if (!out) {
      return report_error("plan",
                          Error{args.html + ": cannot write the HTML report", ErrorKind::kFailed},
                          args.json);
    }
  }
  bool error = false;
  for (const auto& p : plans) error = error || p.has_error();
  if (args.json) {
    fmt::print("{}\n", plan::to_json(plans, target_from, fit).dump(2));
    return error ? kExitFailed : kExitOk;
  }
  fmt::print("target: {}\n", target_from);
  fmt::print("{}",
             plans.size() == 1 ? plan::to_table(plans.front()) : plan::side_by_side_table(plans));
  if (fit) fmt::print("fit: {}\n", fit->note);
  if (!args.html.empty()) fmt::print("wrote {}\n", args.html);
  return error ? kExitFailed : kExitOk;
}

const CommandRegistrar kPlan{
    {"plan",
     "What SGLang, vLLM, TensorRT-LLM (by version) detect in each module, which kernel they run, "
     "and the fix where that is wrong",
     [](CLI::App& app) {
       auto args = std::make_shared<PlanArgs>();
       add_checkpoint_arg(
           app, args->checkpoint, "DIR",
           "checkpoint directory or Hugging Face repo id (configs alone are enough)");
       app.add_option("--target", args->target,
                      "cpu (default: fp4moe's CPU kernels), sm_80, sm_86, sm_89, sm_90, sm_100, "
                      "sm_103, sm_120 or sm_121 (the GPU of that arch in the --gpu table)");
       app.add_option("--gpu", args->gpu,
                      "NAME[xN] from the sourced table: A100, RTX 3090, L40S, H100, H200, B200, "
                      "B300, RTX PRO 6000, RTX 5090, GB10; N GPUs for the fit and the bound");
       app.add_option("--engine", args->engine,
                      "sglang[@VERSION], vllm[@VERSION] or trtllm on a GPU target, llamacpp or "
                      "ktkernel on --target cpu: that engine only (default: every engine's newest "
                      "release side by side; on the CPU beside fp4moe's own kernels)");
       app.add_option("--kv-cache-gb", args->kv_cache_gb,
                      "KV-cache budget added to the weights for the fit (default 0)")
           ->check(CLI::NonNegativeNumber);
       app.add_flag("--json", args->json, "print the plan as JSON (docs/schema/plan.schema.json)");
       app.add_option("--html", args->html,
                      "also write a self-contained page of the time bounds, all targets");
       return [args] { return run_plan(*args); };
     },
     20}};

}  // namespace
}  // namespace fp4moe::cli
