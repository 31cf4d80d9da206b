// `fp4moe check DIR`: are this checkpoint's numbers right? (check/check.h)
#include <fmt/core.h>
#include <unistd.h>

#include <memory>

#include "check/check.h"
#include "cli/cli_common.h"
#include "cli/command.h"

namespace fp4moe::cli {
namespace {

struct CheckArgs {
  CheckpointArg checkpoint;
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
  if (args.checkpoint.spec.empty()) {
    return report_error("check", Error{"DIR is required (see fp4moe check --help)"}, args.json);
  }
  auto resolved = resolve_checkpoint_arg(args.checkpoint);
  if (!resolved.ok()) return report_error("check", resolved.error(), args.json);
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
  auto report = check::check_checkpoint(resolved->path, options);
  if (tty) fmt::print(stderr, "\n");
  if (!report.ok()) return report_error("check", report.error(), args.json);
  if (args.json) {
    nlohmann::json j = check::to_json(*report);
    j["schema_version"] = detect::kJsonSchemaVersion;
    j["source"] = source_json(args.checkpoint, *resolved);
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("{}", check::to_text(*report));
  }
  return report->has_error() ? kExitFailed : kExitOk;
}

const CommandRegistrar kCheck{
    {"check", "Check a checkpoint's numbers: scales, conventions, gate/up pairs, exclusions",
     [](CLI::App& app) {
       auto args = std::make_shared<CheckArgs>();
       // DIR is checked in run_check: --findings-md needs none.
       add_checkpoint_arg(app, args->checkpoint, "DIR", "checkpoint (required)", false);
       app.add_flag("--full", args->full, "read every weight byte (default: a seeded sample)");
       app.add_option("--seed", args->seed, "seed of the weight sample (same seed, same rows)");
       app.add_option("--sample-rows", args->sample_rows, "rows sampled per weight tensor")
           ->check(CLI::Range(1, 1 << 20));
       app.add_option("--threads", args->threads, "threads (default: all cores)")
           ->check(CLI::Range(0, 1024));
       app.add_flag("--json", args->json, "print the report as JSON");
       app.add_flag("--findings-md", args->findings_md,
                    "print the finding table as the Markdown reference of docs/CHECK.md");
       app.footer(finding_list());
       return [args] { return run_check(*args); };
     },
     25}};

}  // namespace
}  // namespace fp4moe::cli
