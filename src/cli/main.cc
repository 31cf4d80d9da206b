// The `fp4moe` executable: parses the command line and runs one registered subcommand.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>

#include "cli/command.h"

namespace fp4moe::cli {

std::vector<Command>& command_registry() {
  static std::vector<Command> commands;
  return commands;
}

}  // namespace fp4moe::cli

int main(int argc, char** argv) {
  using fp4moe::cli::command_registry;
  CLI::App app{
      "fp4moe: detect, route, convert and run FP4 Mixture-of-Experts checkpoints "
      "(MXFP4, NVFP4, FP8 block)"};
  app.set_version_flag("--version", std::string("fp4moe ") + FP4MOE_VERSION);
  app.require_subcommand(1);

  auto& commands = command_registry();
  std::sort(commands.begin(), commands.end(),
            [](const auto& a, const auto& b) { return a.order < b.order; });
  std::map<CLI::App*, std::function<int()>> runners;
  for (auto& command : commands) {
    CLI::App* sub = app.add_subcommand(command.name, command.summary);
    runners[sub] = command.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every usage error is 2 in the exit-code table (CLI11's own
    // codes, e.g. 105 for a value outside a set, are not).
    return app.exit(e) == 0 ? 0 : 2;
  }
  for (auto& [sub, run] : runners) {
    if (sub->parsed()) {
      try {
        return run();
      } catch (const std::exception& e) {
        // Commands report bad input as error values; an exception here is a bug or exhaustion.
        std::fprintf(stderr, "fp4moe %s: internal error: %s\n", sub->get_name().c_str(), e.what());
        return 2;
      }
    }
  }
  return 2;
}
