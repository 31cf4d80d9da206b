// `fp4moe inspect DIR|REPO_ID [--revision R] [--json]`: how every module of a checkpoint is
// quantized, with findings.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/cli_common.h"
#include "cli/command.h"
#include "detect/directory.h"

namespace fp4moe::cli {
namespace {

struct InspectOptions {
  CheckpointArg checkpoint;
  bool json = false;
};

// Exit status: 0 when inspected (findings included), 2 when the input cannot be read.
int run_inspect(const InspectOptions& opt) {
  auto resolved = resolve_checkpoint_arg(opt.checkpoint);
  if (!resolved.ok()) return report_error("inspect", resolved.error(), opt.json);
  auto inspected = detect::detect_directory(resolved->path);
  if (!inspected.ok()) return report_error("inspect", inspected.error(), opt.json);
  const detect::Manifest& manifest = inspected->manifest;
  std::string text;
  if (opt.json) {
    nlohmann::json j = detect::to_json(manifest);
    j["source"] = source_json(opt.checkpoint, *resolved);
    text = j.dump(2) + "\n";
  } else {
    if (!resolved->repo_id.empty()) {
      text = "checkpoint: " + resolved->repo_id + " @ " + resolved->revision + " (" +
             resolved->commit + ") -> " + resolved->path.string() + "\n";
    }
    text += detect::to_table(manifest);
  }
  std::fwrite(text.data(), 1, text.size(), stdout);
  return kExitOk;
}

const CommandRegistrar kInspect{{
    "inspect",
    "Say exactly how every module of a checkpoint is quantized (configs + tensor headers)",
    [](CLI::App& app) -> std::function<int()> {
      auto opt = std::make_shared<InspectOptions>();
      add_checkpoint_arg(app, opt->checkpoint, "dir",
                         "checkpoint (config.json, hf_quant_config.json, *.safetensors; configs "
                         "alone, or with model.safetensors.index.json, work too)");
      app.add_flag("--json", opt->json,
                   "print the manifest as JSON (the contract other tools read: docs/JSON.md)");
      return [opt] { return run_inspect(*opt); };
    },
    20,
}};

}  // namespace
}  // namespace fp4moe::cli
