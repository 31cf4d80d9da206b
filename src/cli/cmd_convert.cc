// `fp4moe convert SRC DST --to nvfp4|mxfp4`: MXFP4 -> NVFP4 losslessly, BF16/FP8 -> NVFP4 by the
// ModelOpt recipe, BF16/FP8 -> MXFP4 by the OCP rule; the routed experts by default.
#include <fmt/core.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>
#include <string_view>
#include <thread>

#include "check/check.h"
#include "checkpoint/writer.h"
#include "cli/cli_common.h"
#include "cli/command.h"
#include "convert/convert.h"
#include "engines/rules.h"

namespace fp4moe::cli {
namespace {

// SIGINT / SIGTERM: the first one says at once what happens next (write(2) is async-signal-safe)
// and asks the conversion to stop; it then removes its partial output and exits 128 + signal.
std::atomic<bool> g_interrupted{false};
std::atomic<int> g_signal{0};
extern "C" void on_interrupt(int sig) {
  const int saved_errno = errno;
  int expected = 0;
  if (g_signal.compare_exchange_strong(expected, sig)) {
    static const char kMessage[] =
        "\nfp4moe convert: interrupted, stopping and removing partial output (the destination is "
        "not replaced); interrupt again to stop at once and leave it for --clean-partial...\n";
    [[maybe_unused]] const auto n = ::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
  }
  g_interrupted.store(true);
  errno = saved_errno;
}

// Messages on stderr that never throw and never kill: the reader of a pipe may be gone (Ctrl-C
// reaches `fp4moe convert ... | tee log` whole), and cleanup must still run.
void say(std::string_view text) {
  [[maybe_unused]] const size_t n = std::fwrite(text.data(), 1, text.size(), stderr);
}

// Installs the handlers for the conversion and restores the previous ones on exit.
// SA_RESETHAND: a second SIGINT/SIGTERM takes the default action (stop at once; the partial
// directory is then reported by the next convert). A signal the parent set to be ignored (nohup,
// a background job) stays ignored. SIGPIPE is ignored while converting: a closed stderr pipe must
// not kill the process before it removes its partial output.
class InterruptScope {
 public:
  InterruptScope() {
    struct sigaction action {};
    action.sa_handler = on_interrupt;
    action.sa_flags = SA_RESETHAND;
    sigemptyset(&action.sa_mask);
    for (const auto& [sig, previous] :
         {std::pair{SIGINT, &previous_int_}, {SIGTERM, &previous_term_}}) {
      sigaction(sig, nullptr, previous);
      if (previous->sa_handler != SIG_IGN) sigaction(sig, &action, nullptr);
    }
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, &previous_pipe_);
  }
  ~InterruptScope() {
    sigaction(SIGINT, &previous_int_, nullptr);
    sigaction(SIGTERM, &previous_term_, nullptr);
    sigaction(SIGPIPE, &previous_pipe_, nullptr);
  }

 private:
  struct sigaction previous_int_ {
  }, previous_term_{}, previous_pipe_{};
};

struct ConvertArgs {
  std::string source, destination, to = "nvfp4", revision, dialect = "nvfp4", activation_amax;
  std::vector<std::string> modules, allow_findings, engines;
  bool force = false, json = false, clean_partial = false;
  double max_shard_gb = 5.0;
};

// The exit-code table: 0 ok, 1 the conversion failed (I/O, output check), 2 bad input or usage,
// 128 + signal when interrupted (130 SIGINT, 143 SIGTERM).
int exit_status(const Error& e) {
  switch (e.kind) {
    case ErrorKind::kBadInput:
      return 2;
    case ErrorKind::kFailed:
      return 1;
    case ErrorKind::kInterrupted:
      return 128 + (g_signal.load() != 0 ? g_signal.load() : SIGINT);
  }
  return 1;
}

// Removal of partial output or of a replaced destination: silent when it is quick, a progress
// line (once a second) once it has taken more than a second.
class RemovalPrinter {
 public:
  explicit RemovalPrinter(std::string what) : what_(std::move(what)) {}
  void operator()(uint64_t removed, uint64_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (!started_) {
      started_ = true;
      start_ = last_ = now;
      return;
    }
    if (now - start_ < std::chrono::seconds(1) || now - last_ < std::chrono::seconds(1)) return;
    last_ = now;
    say(fmt::format("fp4moe convert: removing {}: {:.2f} of {:.2f} GB\n", what_, removed / 1e9,
                    total / 1e9));
  }

 private:
  std::string what_;
  bool started_ = false;
  std::chrono::steady_clock::time_point start_, last_;
};

// Test hook: FP4MOE_TEST_PAUSE_AFTER_TENSORS=N stops after N source tensors, says so on stderr
// and waits for SIGINT/SIGTERM/SIGKILL, so tests interrupt at a known point without timing.
void maybe_pause(const convert::ConvertProgress& p) {
  static const long pause_after = [] {
    const char* env = std::getenv("FP4MOE_TEST_PAUSE_AFTER_TENSORS");
    return env != nullptr ? std::strtol(env, nullptr, 10) : -1L;
  }();
  if (pause_after < 0 || static_cast<long>(p.tensors_done) != pause_after) return;
  say(fmt::format("fp4moe convert: paused after {} tensors (FP4MOE_TEST_PAUSE_AFTER_TENSORS)\n",
                  p.tensors_done));
  std::fflush(stderr);
  while (!g_interrupted.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

// Partial output of earlier runs that were killed (SIGKILL, power loss) in the destination's
// parent: reported with its size, removed with --clean-partial.
void handle_stale_partials(const std::string& destination, bool clean) {
  const std::filesystem::path dest = checkpoint::resolve_destination(destination);
  // A destination moved aside by a replacement killed between its two renames (file systems
  // without renameat2 flags): never removed here, since it may be the only copy.
  for (const auto& aside : checkpoint::find_moved_aside(dest.parent_path())) {
    say(
        fmt::format("fp4moe convert: note: {} is a destination moved aside by a replacement that "
                    "did not finish; if the checkpoint it replaced is missing, rename it back\n",
                    aside.string()));
  }
  for (const auto& partial : checkpoint::find_stale_partials(dest.parent_path())) {
    if (g_interrupted.load()) return;  // interrupted while cleaning: the rest stays for next time
    if (clean) {
      RemovalPrinter printer("stale partial output " + partial.path.string());
      const Status st = checkpoint::remove_tree(
          partial.path, [&printer](uint64_t r, uint64_t t) { printer(r, t); });
      say(fmt::format("fp4moe convert: {} stale partial output {} ({:.2f} GB){}\n",
                      st.ok() ? "removed" : "could not remove", partial.path.string(),
                      partial.bytes / 1e9, st.ok() ? "" : ": " + st.error().message));
    } else {
      say(fmt::format(
          "fp4moe convert: note: {} ({:.2f} GB on disk) is partial output of an earlier "
          "run that did not finish; pass --clean-partial to remove it\n",
          partial.path.string(), partial.bytes / 1e9));
    }
  }
}

std::string eta_text(double seconds) {
  return seconds < 0 ? std::string("--") : fmt::format("{:.0f} s", seconds);
}

// A one-line progress bar on a terminal; a plain line per 10% otherwise (logs, CI).
class ProgressPrinter {
 public:
  ProgressPrinter() : tty_(isatty(STDERR_FILENO) != 0), start_(std::chrono::steady_clock::now()) {}
  void operator()(const convert::ConvertProgress& p) {
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double fraction = p.bytes_total ? static_cast<double>(p.bytes_done) / p.bytes_total : 1.0;
    const double rate = elapsed > 0 ? static_cast<double>(p.bytes_done) / elapsed : 0.0;
    // No estimate until a tenth of a second of work has been seen.
    const double eta =
        rate > 0 && elapsed > 0.1 ? static_cast<double>(p.bytes_total - p.bytes_done) / rate : -1.0;
    if (tty_) {
      const int width = 30;
      const int filled = static_cast<int>(fraction * width);
      say(fmt::format("\r[{}{}] {:5.1f}%  {:.2f}/{:.2f} GB  {:.2f} GB/s  ETA {} ",
                      std::string(static_cast<size_t>(filled), '#'),
                      std::string(static_cast<size_t>(width - filled), ' '), 100 * fraction,
                      p.bytes_done / 1e9, p.bytes_total / 1e9, rate / 1e9, eta_text(eta)));
      if (p.tensors_done == p.tensors_total) say(fmt::format("\n"));
    } else if (static_cast<int>(fraction * 10) > last_decile_ ||
               p.tensors_done == p.tensors_total) {
      last_decile_ = static_cast<int>(fraction * 10);
      say(fmt::format("convert: {:.0f}% ({:.2f}/{:.2f} GB, {:.2f} GB/s, ETA {})\n", 100 * fraction,
                      p.bytes_done / 1e9, p.bytes_total / 1e9, rate / 1e9, eta_text(eta)));
    }
  }

 private:
  bool tty_;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_;
};

// The launch flags that put NVFP4 MoE on a weight-only (W4A16) kernel, per engine, from the engine
// rules (src/engines/rules/*.json): the one place those facts live.
std::string weight_only_nvfp4_flags() {
  std::string out;
  for (const auto& engine : engines::all_engines()) {
    std::set<std::string> nvfp4_methods;  // the MoE methods the engine's rules say read NVFP4
    for (const auto& rule : engine.rules) {
      for (const auto& [role, c] : rule.modules) {
        if (c.reads == "nvfp4") nvfp4_methods.insert(c.method);
      }
    }
    for (const auto& b : engine.backends) {
      if (b.path != engines::Path::kW4A16 || b.flags.empty() || !nvfp4_methods.count(b.method)) {
        continue;
      }
      out +=
          fmt::format("  {} {}{}: {} ({}) [{}]\n", engine.name,
                      b.first.empty() ? "" : ">= ", b.first.empty() ? std::string("main") : b.first,
                      b.flags, b.method, b.source.cite());
    }
  }
  return out;
}

// `--engine`: the engine rules must route the output's experts right at each named engine version
// before the output is renamed into place. Returns the one-line conclusions for the report.
Status check_engines(const std::vector<engines::EngineAt>& targets,
                     const std::filesystem::path& dir, const detect::InspectedDirectory& inspected,
                     std::vector<std::string>& lines) {
  const engines::Facts facts = engines::make_facts(inspected, dir);
  std::vector<std::string> out;
  for (const auto& at : targets) {
    for (const auto& g : inspected.manifest.modules) {
      if (g.role != detect::Role::kRoutedExperts && g.role != detect::Role::kMtpExperts) continue;
      const engines::Verdict v = engines::evaluate(at, facts, g, "");
      const std::string rule = v.rule != nullptr ? " [rule " + v.rule->id + "]" : "";
      if (v.outcome == engines::Outcome::kWrong || v.outcome == engines::Outcome::kFails) {
        std::string fixes;
        for (const auto& f : v.fixes) fixes += "; fix: " + f;
        return Error{fmt::format("--engine {}: {} {} would be run wrong: {}{}{}", at.label(),
                                 detect::to_string(g.role), g.name, v.why, rule, fixes),
                     ErrorKind::kFailed};
      }
      out.push_back(fmt::format("{}: {} {} -> {} / {} ({}){}", at.label(),
                                detect::to_string(g.role), g.name, v.conclusion.quant_config,
                                v.conclusion.method, engines::outcome_name(v.outcome), rule));
    }
  }
  lines = std::move(out);
  return Status::Ok();
}

int run_convert(const ConvertArgs& args) {
  convert::ConvertOptions options;
  options.to = args.to == "mxfp4" ? convert::TargetFormat::kMxfp4 : convert::TargetFormat::kNvfp4;
  options.dialect =
      args.dialect == "w4a16_nvfp4" ? convert::Nvfp4Dialect::kW4A16 : convert::Nvfp4Dialect::kW4A4;
  if (!args.activation_amax.empty()) {
    auto amax = convert::read_activation_amax(args.activation_amax);
    if (!amax.ok()) {
      if (args.json) fmt::print("{}\n", error_json(amax.error()).dump(2));
      say(fmt::format("fp4moe convert: {}\n", amax.error().message));
      return exit_status(amax.error());
    }
    options.activation_amax = std::move(*amax);
  }
  std::vector<engines::EngineAt> targets;
  for (const auto& spec : args.engines) {
    auto at = engines::parse_engine_spec(spec);
    if (!at.ok()) {
      if (args.json) fmt::print("{}\n", error_json(at.error()).dump(2));
      say(fmt::format("fp4moe convert: --engine {}: {}\n", spec, at.error().message));
      return 2;
    }
    targets.push_back(*at);
  }
  std::vector<std::string> engine_lines;
  if (!targets.empty()) {
    options.check_output = [&](const std::filesystem::path& staged,
                               const detect::InspectedDirectory& inspected) {
      return check_engines(targets, staged, inspected, engine_lines);
    };
  }
  if (!args.modules.empty()) options.module_patterns = args.modules;
  options.force = args.force;
  options.allow_findings = args.allow_findings;
  options.max_shard_bytes = static_cast<uint64_t>(args.max_shard_gb * 1e9);
  options.cancel = &g_interrupted;
  ProgressPrinter printer;
  options.on_progress = [&printer](const convert::ConvertProgress& p) {
    printer(p);
    maybe_pause(p);
  };
  RemovalPrinter removal("partial output");
  options.on_remove_progress = [&removal](uint64_t r, uint64_t t) { removal(r, t); };
  InterruptScope interrupts;
  handle_stale_partials(args.destination, args.clean_partial);
  // SRC: a directory or a Hugging Face repo id (cli_common.h).
  auto source = checkpoint::resolve_checkpoint(args.source, args.revision);
  auto result = source.ok() ? convert::convert_checkpoint(source->path, args.destination, options)
                            : Result<convert::ConvertSummary>(source.error());
  if (!result.ok()) {
    if (args.json) fmt::print("{}\n", error_json(result.error()).dump(2));
    say(fmt::format("fp4moe convert: {}\n", result.error().message));
    return exit_status(result.error());
  }
  if (g_interrupted.load()) {
    // The signal came after the new checkpoint was renamed into place: it stands.
    say("fp4moe convert: the interrupt came after the new checkpoint was in place; it is kept\n");
  }
  const auto& s = *result;
  const auto& r = s.report;
  if (args.json) {
    nlohmann::json j = {
        {"source", args.source},
        {"destination", args.destination},
        {"to", args.to},
        {"dialect", args.to == "nvfp4" ? nlohmann::json(convert::dialect_name(s.dialect))
                                       : nlohmann::json(nullptr)},
        {"engine_rules", engine_lines},
        {"input_scales",
         {{"calibrated", s.input_scales_calibrated},
          {"uncalibrated_default", s.input_scales_default},
          {"default_value", s.input_scales_default > 0
                                ? nlohmann::json(convert::kDefaultActivationAmax / (6.0 * 448.0))
                                : nlohmann::json(nullptr)}}},
        {"modules_converted", s.modules_converted},
        {"modules_transcoded_losslessly", s.modules_transcoded},
        {"modules_quantized", s.modules_quantized},
        {"modules_relabeled", s.modules_relabeled},
        {"modules_dequantized_to_bf16", s.modules_dequantized},
        {"max_dequantize_rel_error", s.max_dequantize_rel_error},
        {"max_quantize_rel_error", s.max_quantize_rel_error},
        {"tensors_copied", s.tensors_copied},
        {"bytes_read", s.bytes_read},
        {"bytes_written", s.bytes_written},
        {"seconds", s.seconds},
        {"report",
         {{"blocks_total", r.blocks_total},
          {"blocks_lossless", r.blocks_lossless},
          {"blocks_requantized", r.blocks_requantized},
          {"blocks_all_zero", r.blocks_all_zero},
          {"lossless_fraction",
           r.blocks_total
               ? static_cast<double>(r.blocks_lossless + r.blocks_all_zero) / r.blocks_total
               : 1.0},
          {"max_abs_error", r.max_abs_error},
          {"max_rel_error", r.max_rel_error}}}};
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print(
      "converted {} modules to {} ({} MXFP4 transcoded losslessly, {} quantized, {} "
      "compressed-tensors NVFP4 re-labeled exactly), copied {} tensors, {:.2f} GB in {:.1f} s\n",
      s.modules_converted, args.to, s.modules_transcoded, s.modules_quantized, s.modules_relabeled,
      s.tensors_copied, s.bytes_read / 1e9, s.seconds);
  if (s.modules_transcoded > 0) {
    fmt::print(
        "transcode blocks: {} total, {} lossless, {} all-zero, {} requantized (max abs error "
        "{:.3g}, max rel error {:.3g})\n",
        r.blocks_total, r.blocks_lossless, r.blocks_all_zero, r.blocks_requantized, r.max_abs_error,
        r.max_rel_error);
  }
  if (s.modules_quantized > 0) {
    fmt::print(
        "quantized modules: worst relative L2 error {:.4f} against their exact values ({})\n",
        s.max_quantize_rel_error,
        args.to == "nvfp4" ? "NVIDIA ModelOpt NVFP4 recipe" : "OCP MXFP4, floor scales");
  }
  if (s.modules_dequantized > 0) {
    fmt::print(
        "{} FP8 block-128 modules left unconverted written in BF16 (NVIDIA's form for them): "
        "worst relative L2 rounding error {:.2e}\n",
        s.modules_dequantized, s.max_dequantize_rel_error);
  }
  for (const auto& line : engine_lines) fmt::print("engine rules: {}\n", line);
  if (args.to != "nvfp4") {
    fmt::print("wrote {} (config.json: expert_dtype fp4, DeepSeek-V4 stock layout)\n",
               args.destination);
    return 0;
  }
  const bool w4a4 = s.dialect == convert::Nvfp4Dialect::kW4A4;
  fmt::print("wrote {} (config.json and hf_quant_config.json: {}, {})\n", args.destination,
             convert::dialect_name(s.dialect),
             w4a4 ? "FP4 weights and declared FP4 activations with input_scale"
                  : "weight-only, no input_scale");
  if (w4a4 && s.input_scales_default > 0) {
    fmt::print(
        "warning: input_scale of {} modules is the UNCALIBRATED default {} (activation amax "
        "{:.0f}): weight-only NVFP4 MoE kernels (Marlin) ignore it; W4A4 kernels (the sm_100 "
        "defaults) would quantize activations with it. Calibrate with --activation-amax FILE, or "
        "serve with a weight-only MoE backend:\n{}",
        s.input_scales_default, convert::kDefaultActivationAmax / (6.0 * 448.0),
        convert::kDefaultActivationAmax, weight_only_nvfp4_flags());
  } else if (w4a4) {
    fmt::print("input_scale of {} modules calibrated from {}\n", s.input_scales_calibrated,
               args.activation_amax);
  }
  return 0;
}

const CommandRegistrar kConvert{
    {"convert", "Convert a checkpoint's modules to NVFP4 (MXFP4 losslessly) or to MXFP4",
     [](CLI::App& app) {
       app.footer(
           "Interrupted (130/143), the partial output is removed and the destination left as it "
           "was.");
       auto args = std::make_shared<ConvertArgs>();
       app.add_option("SRC", args->source,
                      "source checkpoint directory (never modified), or a Hugging Face repo id "
                      "read from the local hub cache")
           ->required();
       app.add_option("--revision", args->revision,
                      "with a repo id as SRC: branch, tag or commit hash (default main)");
       app.add_option("DST", args->destination, "destination directory (must not exist)")
           ->required();
       app.add_option("--to", args->to, "target format")->check(CLI::IsMember({"nvfp4", "mxfp4"}));
       app.add_option("--dialect", args->dialect,
                      "with --to nvfp4: nvfp4 (ModelOpt NVFP4, with input_scale; what the "
                      "DeepSeek-V4 paths of SGLang >= 0.5.14 and vLLM >= 0.22 route to NVFP4) or "
                      "w4a16_nvfp4 (weight-only, no input_scale; generic ModelOpt paths only)")
           ->check(CLI::IsMember({"nvfp4", "w4a16_nvfp4"}));
       app.add_option("--activation-amax", args->activation_amax,
                      "calibrated activation maxima per module glob (JSON, docs/CONVERT.md) for "
                      "the input_scale of the nvfp4 dialect; without it a flagged default is used");
       app.add_option("--engine", args->engines,
                      "sglang[@VERSION], vllm[@VERSION], trtllm, llamacpp, ktkernel (repeatable): "
                      "before the output is "
                      "renamed into place, the engine rules (docs/ENGINES.md) must route its "
                      "routed and MTP experts right at that version, else nothing is written "
                      "(exit 1, with the fix)")
           ->delimiter(',');
       app.add_option("--modules", args->modules,
                      "module globs to convert (default: the routed experts of the main layers, "
                      "named by the model family, e.g. layers.*.ffn.experts.* or "
                      "model.layers.*.mlp.experts.*; except for DeepSeek-V4 also the shared "
                      "experts and dense MLP, as NVIDIA's NVFP4 releases)");
       app.add_flag("--force", args->force,
                    "replace an existing destination checkpoint (swapped out only once the new one "
                    "is complete and checked)");
       app.add_option("--allow-findings", args->allow_findings,
                      "fp4moe check error findings (ids) to convert despite, e.g. scale_nan_code")
           ->allow_extra_args(false)
           ->delimiter(',')
           ->check([](const std::string& id) {
             return check::find_finding(id) != nullptr ? std::string()
                                                       : "unknown finding id '" + id + "'";
           });
       app.add_flag("--clean-partial", args->clean_partial,
                    "remove partial output that earlier killed runs left beside DST");
       app.add_option("--max-shard-gb", args->max_shard_gb, "shard size of the output");
       app.add_flag("--json", args->json, "print the report as JSON");
       return [args] { return run_convert(*args); };
     },
     30}};

}  // namespace
}  // namespace fp4moe::cli
