// `fp4moe convert SRC DST --to nvfp4|mxfp4`: MXFP4 -> NVFP4 losslessly, BF16/FP8 -> NVFP4 by the
// ModelOpt recipe, BF16/FP8 -> MXFP4 by the OCP rule; the routed experts by default.
#include <fmt/core.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "convert/convert.h"

namespace fp4moe::cli {
namespace {

std::atomic<bool> g_interrupted{false};
extern "C" void on_interrupt(int) { g_interrupted.store(true); }

struct ConvertArgs {
  std::string source, destination, to = "nvfp4";
  std::vector<std::string> modules;
  bool force = false, json = false;
  double max_shard_gb = 5.0;
};

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
      fmt::print(stderr, "\r[{}{}] {:5.1f}%  {:.2f}/{:.2f} GB  {:.2f} GB/s  ETA {} ",
                 std::string(static_cast<size_t>(filled), '#'),
                 std::string(static_cast<size_t>(width - filled), ' '), 100 * fraction,
                 p.bytes_done / 1e9, p.bytes_total / 1e9, rate / 1e9, eta_text(eta));
      if (p.tensors_done == p.tensors_total) fmt::print(stderr, "\n");
    } else if (static_cast<int>(fraction * 10) > last_decile_ ||
               p.tensors_done == p.tensors_total) {
      last_decile_ = static_cast<int>(fraction * 10);
      fmt::print(stderr, "convert: {:.0f}% ({:.2f}/{:.2f} GB, {:.2f} GB/s, ETA {})\n",
                 100 * fraction, p.bytes_done / 1e9, p.bytes_total / 1e9, rate / 1e9,
                 eta_text(eta));
    }
  }

 private:
  bool tty_;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_;
};

int run_convert(const ConvertArgs& args) {
  convert::ConvertOptions options;
  options.to = args.to == "mxfp4" ? convert::TargetFormat::kMxfp4 : convert::TargetFormat::kNvfp4;
  if (!args.modules.empty()) options.module_patterns = args.modules;
  options.force = args.force;
  options.max_shard_bytes = static_cast<uint64_t>(args.max_shard_gb * 1e9);
  options.cancel = &g_interrupted;
  ProgressPrinter printer;
  options.on_progress = [&printer](const convert::ConvertProgress& p) { printer(p); };
  auto previous = std::signal(SIGINT, on_interrupt);
  auto previous_term = std::signal(SIGTERM, on_interrupt);
  auto result = convert::convert_checkpoint(args.source, args.destination, options);
  std::signal(SIGINT, previous);
  std::signal(SIGTERM, previous_term);
  if (!result.ok()) {
    fmt::print(stderr, "fp4moe convert: {}\n", result.error().message);
    return 1;
  }
  const auto& s = *result;
  const auto& r = s.report;
  if (args.json) {
    nlohmann::json j = {
        {"source", args.source},
        {"destination", args.destination},
        {"to", args.to},
        {"modules_converted", s.modules_converted},
        {"modules_transcoded_losslessly", s.modules_transcoded},
        {"modules_quantized", s.modules_quantized},
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
      "converted {} modules to {} ({} MXFP4 transcoded losslessly, {} quantized), copied {} "
      "tensors, {:.2f} GB in {:.1f} s\n",
      s.modules_converted, args.to, s.modules_transcoded, s.modules_quantized, s.tensors_copied,
      s.bytes_read / 1e9, s.seconds);
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
  fmt::print("wrote {} ({})\n", args.destination,
             args.to == "nvfp4" ? "config.json and hf_quant_config.json: W4A16_NVFP4, weight-only"
                                : "config.json: expert_dtype fp4, DeepSeek-V4 stock layout");
  return 0;
}

const CommandRegistrar kConvert{
    {"convert", "Convert a checkpoint's modules to NVFP4 (MXFP4 losslessly) or to MXFP4",
     [](CLI::App& app) {
       auto args = std::make_shared<ConvertArgs>();
       app.add_option("SRC", args->source, "source checkpoint directory (never modified)")
           ->required();
       app.add_option("DST", args->destination, "destination directory (must not exist)")
           ->required();
       app.add_option("--to", args->to, "target format")->check(CLI::IsMember({"nvfp4", "mxfp4"}));
       app.add_option("--modules", args->modules,
                      "module globs to convert (default: routed experts, layers.*.ffn.experts.*)");
       app.add_flag("--force", args->force, "replace an existing destination");
       app.add_option("--max-shard-gb", args->max_shard_gb, "shard size of the output");
       app.add_flag("--json", args->json, "print the report as JSON");
       return [args] { return run_convert(*args); };
     },
     30}};

}  // namespace
}  // namespace fp4moe::cli
