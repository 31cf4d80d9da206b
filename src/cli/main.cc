// The `fp4moe` executable: parses the command line and runs one registered subcommand.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "cli/cli_common.h"
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
  const std::string exit_table(fp4moe::cli::exit_status_help());
  // --json anywhere on the line asks for JSON, errors included (usage errors too).
  bool json = false;
  for (int i = 1; i < argc; ++i) json = json || std::string_view(argv[i]) == "--json";

  auto& commands = command_registry();
  std::sort(commands.begin(), commands.end(),
            [](const auto& a, const auto& b) { return a.order < b.order; });
  std::map<CLI::App*, std::function<int()>> runners;
  for (auto& command : commands) {
    CLI::App* sub = app.add_subcommand(command.name, command.summary);
    runners[sub] = command.setup(*sub);
    const std::string footer = sub->get_footer();
    sub->footer(footer.empty() ? exit_table : footer + "\n\n" + exit_table);
  }
  // Set after the subcommands exist: CLI11 copies a parent's footer into subcommands made later.
  app.footer(exit_table);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every usage error is 2 in the exit-code table (CLI11's own
    // codes, e.g. 105 for a value outside a set, are not).
    if (app.exit(e) == 0) return fp4moe::cli::kExitOk;
    if (json) {
      std::printf("%s\n", fp4moe::cli::error_json(fp4moe::Error{e.what()}).dump(2).c_str());
    }
    return fp4moe::cli::kExitBadInput;
  }
  for (auto& [sub, run] : runners) {
    if (sub->parsed()) {
      try {
        return run();
      } catch (const std::exception& e) {
        // Commands report bad input as error values; an exception here is a bug or exhaustion:
        // the operation failed.
        return fp4moe::cli::report_error(
            sub->get_name(),
            fp4moe::Error{std::string("internal error: ") + e.what(), fp4moe::ErrorKind::kFailed},
            json);
      }
    }
  }
  return fp4moe::cli::kExitBadInput;
}
