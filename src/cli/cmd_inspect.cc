// `fp4moe inspect DIR [--json]`: how every module of a checkpoint is quantized, with findings.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "detect/directory.h"

namespace fp4moe::cli {
namespace {

struct InspectOptions {
  std::string dir;
  bool json = false;
};

// Exit status: 0 when inspected (findings included), 2 when the input cannot be read.
int run_inspect(const InspectOptions& opt) {
  auto inspected = detect::detect_directory(opt.dir);
  if (!inspected.ok()) {
    std::fprintf(stderr, "fp4moe inspect: %s\n", inspected.error().message.c_str());
    return 2;
  }
  const detect::Manifest& manifest = inspected->manifest;
  const std::string text =
      opt.json ? detect::to_json(manifest).dump(2) + "\n" : detect::to_table(manifest);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

const CommandRegistrar kInspect{{
    "inspect",
    "Say exactly how every module of a checkpoint is quantized (configs + tensor headers)",
    [](CLI::App& app) -> std::function<int()> {
      auto opt = std::make_shared<InspectOptions>();
      app.add_option("dir", opt->dir,
                     "checkpoint directory (config.json, hf_quant_config.json, *.safetensors; "
                     "configs alone work too)")
          ->required();
      app.add_flag("--json", opt->json,
                   "print the manifest as JSON (the contract other tools read)");
      return [opt] { return run_inspect(*opt); };
    },
    20,
}};

}  // namespace
}  // namespace fp4moe::cli
