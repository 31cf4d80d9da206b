// `fp4moe plan DIR --target T`: the kernel and hardware path of every module group, with a
// batch-1 decode roofline; `--html FILE` draws all targets on one self-contained page.
#include <fmt/core.h>

#include <fstream>
#include <memory>

#include "cli/command.h"
#include "core/thread_pool.h"
#include "detect/directory.h"
#include "dispatch/measure.h"
#include "plan/plan.h"

namespace fp4moe::cli {
namespace {

struct PlanArgs {
  std::string dir, target = "cpu", html;
  bool json = false;
};

double cpu_bandwidth_gbps() {
  // All threads of the pool, a buffer far past the last-level cache: what decode can stream.
  return dispatch::measure_read_bandwidth_gbps(ThreadPool::global(), size_t{512} << 20);
}

int run_plan(const PlanArgs& args) {
  auto target = plan::parse_target(args.target);
  if (!target.ok()) {
    fmt::print(stderr, "fp4moe plan: {}\n", target.error().message);
    return 2;
  }
  auto inspected = detect::detect_directory(args.dir);
  if (!inspected.ok()) {
    fmt::print(stderr, "fp4moe plan: {}\n", inspected.error().message);
    return 1;
  }
  plan::PlanOptions options;
  const bool needs_cpu = *target == plan::Target::kCpu || !args.html.empty();
  if (needs_cpu) options.cpu_bandwidth_gbps = cpu_bandwidth_gbps();
  const plan::Plan result =
      plan::make_plan(inspected->manifest, inspected->config, *target, options);
  if (!args.html.empty()) {
    std::vector<plan::Plan> plans;
    for (plan::Target t : plan::kAllTargets) {
      plans.push_back(plan::make_plan(inspected->manifest, inspected->config, t, options));
    }
    std::ofstream out(args.html, std::ios::binary | std::ios::trunc);
    out << plan::to_html(plans, "fp4moe plan: " + args.dir);
    if (!out) {
      fmt::print(stderr, "fp4moe plan: {}: cannot write the HTML report\n", args.html);
      return 1;
    }
  }
  if (args.json) {
    fmt::print("{}\n", plan::to_json(result).dump(2));
  } else {
    fmt::print("{}", plan::to_table(result));
    if (!args.html.empty()) fmt::print("wrote {}\n", args.html);
  }
  return result.has_error() ? 1 : 0;
}

const CommandRegistrar kPlan{
    {"plan", "Show the kernel and hardware path each module gets on a target, with a roofline",
     [](CLI::App& app) {
       auto args = std::make_shared<PlanArgs>();
       app.add_option("DIR", args->dir, "checkpoint directory (configs alone are enough)")
           ->required();
       app.add_option("--target", args->target, "cpu, sm_80, sm_89, sm_90, sm_100 or sm_120");
       app.add_flag("--json", args->json, "print the plan as JSON");
       app.add_option("--html", args->html,
                      "also write a self-contained roofline page, all targets");
       return [args] { return run_plan(*args); };
     },
     20}};

}  // namespace
}  // namespace fp4moe::cli
