// The exit-code table, error objects and the checkpoint argument shared by every command.
#include "cli/cli_common.h"

#include <cstdio>

#include "detect/manifest.h"

namespace fp4moe::cli {

std::string_view exit_status_help() {
  return "Exit status (every command):\n"
         "  0    ok\n"
         "  1    a check failed (an error finding, past tolerance, no kernel on the path, an\n"
         "       output check, an I/O error)\n"
         "  2    bad input or usage (an unreadable or contradictory checkpoint, a bad option)\n"
         "  130  interrupted (SIGINT; 143 for SIGTERM)\n"
         "With --json, an error also prints {\"schema_version\": N, \"error\": {\"kind\": "
         "\"bad_input|failed|interrupted\", \"message\": ...}} on stdout.";
}

int exit_code(const Error& error) {
  switch (error.kind) {
    case ErrorKind::kBadInput:
      return kExitBadInput;
    case ErrorKind::kFailed:
      return kExitFailed;
    case ErrorKind::kInterrupted:
      return kExitInterrupted;
  }
  return kExitFailed;
}

std::string_view error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kBadInput:
      return "bad_input";
    case ErrorKind::kFailed:
      return "failed";
    case ErrorKind::kInterrupted:
      return "interrupted";
  }
  return "failed";
}

nlohmann::json error_json(const Error& error) {
  return {{"schema_version", detect::kJsonSchemaVersion},
          {"error", {{"kind", error_kind_name(error.kind)}, {"message", error.message}}}};
}

int report_error(std::string_view command, const Error& error, bool json) {
  if (json) {
    const std::string text = error_json(error).dump(2) + "\n";
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  }
  std::fprintf(stderr, "fp4moe %.*s: %s\n", static_cast<int>(command.size()), command.data(),
               error.message.c_str());
  return exit_code(error);
}

void add_checkpoint_arg(CLI::App& app, CheckpointArg& arg, const std::string& name,
                        const std::string& what, bool required) {
  CLI::Option* opt = app.add_option(
      name, arg.spec,
      what +
          ": a directory, or a Hugging Face repo id (org/name) read from the local hub cache "
          "($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub)");
  if (required) opt->required();
  app.add_option("--revision", arg.revision,
                 "with a repo id: the branch, tag or commit hash in the cache (default main)");
}

Result<checkpoint::ResolvedCheckpoint> resolve_checkpoint_arg(const CheckpointArg& arg) {
  return checkpoint::resolve_checkpoint(arg.spec, arg.revision);
}

nlohmann::json source_json(const CheckpointArg& arg, const checkpoint::ResolvedCheckpoint& r) {
  auto or_null = [](const std::string& s) {
    return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s);
  };
  return {{"argument", arg.spec},
          {"path", r.path.string()},
          {"repo_id", or_null(r.repo_id)},
          {"revision", or_null(r.revision)},
          {"commit", or_null(r.commit)}};
}

}  // namespace fp4moe::cli
