// Subcommand registry: each cmd_*.cc file registers itself, so adding a command touches one file.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace fp4moe::cli {

// Adds the subcommand's options to `app` and returns the callback that runs it; the callback
// returns the process exit status.
using CommandSetup = std::function<std::function<int()>(CLI::App& app)>;

struct Command {
  std::string name;
  std::string summary;
  CommandSetup setup;
  int order;  // position in --help
};

std::vector<Command>& command_registry();

struct CommandRegistrar {
  explicit CommandRegistrar(Command command) { command_registry().push_back(std::move(command)); }
};

}  // namespace fp4moe::cli
