// `fp4moe check DIR`: are this checkpoint's numbers right? (check/check.h)
#include <fmt/core.h>
#include <unistd.h>

#include <memory>

#include "check/check.h"
#include "cli/command.h"

namespace fp4moe::cli {
namespace {

struct CheckArgs {
  std::string dir;
  bool full = false, json = false, findings_md = false;
  uint64_t seed = 0x5eed;
  int sample_rows = 16;
  int threads = 0;
};

std::string finding_list() {
  std::string out = "Finding ids (severity): ";
  bool first = true;
  for (const auto& f : check::finding_table()) {
    out += fmt::format("{}{} ({})", first ? "" : ", ", f.id, detect::to_string(f.severity));
    first = false;
  }
  return out + ". docs/CHECK.md says what each means, its engine consequence and its fix.";
}

int run_check(const CheckArgs& args) {
  if (args.findings_md) {
    fmt::print("{}", check::findings_markdown());
    return 0;
  }
  if (args.dir.empty()) {
    fmt::print(stderr, "fp4moe check: DIR is required (see fp4moe check --help)\n");
    return 2;
  }
  check::CheckOptions options;
  options.full = args.full;
  options.seed = args.seed;
  options.sample_rows = args.sample_rows;
  options.threads = args.threads;
  const bool tty = isatty(STDERR_FILENO) != 0 && !args.json;
  if (tty) {
    options.on_progress = [](uint64_t done, uint64_t total) {
      fmt::print(stderr, "\rcheck: {:.2f} GB read of {:.2f} GB in the checkpoint", done / 1e9,
                 total / 1e9);
    };
  }
  auto report = check::check_checkpoint(args.dir, options);
  if (tty) fmt::print(stderr, "\n");
  if (!report.ok()) {
    if (args.json) {
      fmt::print("{}\n", nlohmann::json{{"error", report.error().message}}.dump(2));
    }
    fmt::print(stderr, "fp4moe check: {}\n", report.error().message);
    return 2;
  }
  if (args.json) {
    fmt::print("{}\n", check::to_json(*report).dump(2));
  } else {
    fmt::print("{}", check::to_text(*report));
  }
  return report->has_error() ? 1 : 0;
}

const CommandRegistrar kCheck{
    {"check", "Check a checkpoint's numbers: scales, conventions, gate/up pairs, exclusions",
     [](CLI::App& app) {
       auto args = std::make_shared<CheckArgs>();
       // DIR is checked in run_check: --findings-md needs none.
       app.add_option("DIR", args->dir, "checkpoint directory (required)");
       app.add_flag("--full", args->full, "read every weight byte (default: a seeded sample)");
       app.add_option("--seed", args->seed, "seed of the weight sample (same seed, same rows)");
       app.add_option("--sample-rows", args->sample_rows, "rows sampled per weight tensor")
           ->check(CLI::Range(1, 1 << 20));
       app.add_option("--threads", args->threads, "threads (default: all cores)")
           ->check(CLI::Range(0, 1024));
       app.add_flag("--json", args->json, "print the report as JSON");
       app.add_flag("--findings-md", args->findings_md,
                    "print the finding table as the Markdown reference of docs/CHECK.md");
       app.footer(finding_list() +
                  "\nExit status: 0 no error finding, 1 an error finding, 2 bad input or usage.");
       return [args] { return run_check(*args); };
     },
     25}};

}  // namespace
}  // namespace fp4moe::cli
