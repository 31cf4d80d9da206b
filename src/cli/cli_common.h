// What every command shares: the exit-code table, error reporting (stderr, and with --json an
// error object on stdout), and the checkpoint argument (a directory or a Hugging Face repo id,
// with --revision).
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "checkpoint/hf_cache.h"
#include "core/status.h"

namespace fp4moe::cli {

// The exit-code table of every command (README "Exit status", `fp4moe --help`).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;         // a check failed: an error finding, past tolerance,
                                              // a wrong path, an output check, an I/O error
inline constexpr int kExitBadInput = 2;       // bad input or usage
inline constexpr int kExitInterrupted = 130;  // SIGINT (143: SIGTERM, where a command handles it)

// The table as --help prints it.
std::string_view exit_status_help();

// ErrorKind -> exit status: bad input 2, failed 1, interrupted 130.
int exit_code(const Error& error);
std::string_view error_kind_name(ErrorKind kind);  // "bad_input", "failed", "interrupted"

// {"schema_version": N, "error": {"kind": "bad_input|failed|interrupted", "message": "..."}}
nlohmann::json error_json(const Error& error);

// Prints "fp4moe <command>: <message>" on stderr and, when `json`, the error object on stdout;
// returns the exit status for the error's kind.
int report_error(std::string_view command, const Error& error, bool json);

// A checkpoint argument and its --revision.
struct CheckpointArg {
  std::string spec;
  std::string revision;
};

// Adds the positional `name` and `--revision` to `app`.
void add_checkpoint_arg(CLI::App& app, CheckpointArg& arg, const std::string& name,
                        const std::string& what, bool required = true);

// The directory the argument names (checkpoint::resolve_checkpoint).
Result<checkpoint::ResolvedCheckpoint> resolve_checkpoint_arg(const CheckpointArg& arg);

// {"argument", "path", "repo_id", "revision", "commit"} for --json output.
nlohmann::json source_json(const CheckpointArg& arg, const checkpoint::ResolvedCheckpoint& r);

}  // namespace fp4moe::cli
