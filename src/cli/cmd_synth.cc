// `fp4moe synth LAYOUT DIR`: writes a small (or full-size, sparse) synthetic checkpoint of a real
// layout and says what it wrote.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/sparse_fixture.h"
#include "cli/cli_common.h"
#include "cli/command.h"
#include "synth/synth.h"

namespace fp4moe::cli {
namespace {

namespace fs = std::filesystem;

struct SynthCliOptions {
  std::string layout;
  std::string dir;
  bool list_layouts = false;
  synth::SynthOptions synth;
};

// Exit status (the table of cli_common.h): 0 written, 1 the write or its read-back failed, 2 bad
// arguments (an unknown layout, an existing destination).
int run_synth(const SynthCliOptions& opt) {
  if (opt.list_layouts) {  // one name per line: the list tests and scripts read (no drift)
    for (const synth::LayoutInfo& info : synth::layouts()) {
      std::printf("%.*s\n", static_cast<int>(info.name.size()), info.name.data());
    }
    return 0;
  }
  if (opt.layout.empty() || opt.dir.empty()) {
    return report_error("synth", Error{"LAYOUT and DIR are required (or --list-layouts)"}, false);
  }
  auto layout = synth::parse_layout(opt.layout);
  if (!layout.ok()) return report_error("synth", layout.error(), false);
  if (Status s = synth::write_synthetic(*layout, opt.dir, opt.synth); !s.ok()) {
    return report_error("synth", s.error(), false);
  }
  // Report from what is on disk, read back as any tool would.
  auto written = checkpoint::CheckpointDir::open(opt.dir);
  if (!written.ok()) {
    return report_error(
        "synth", Error{"reading back: " + written.error().message, ErrorKind::kFailed}, false);
  }
  uint64_t on_disk = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(opt.dir, ec)) {
    if (auto bytes = checkpoint::allocated_bytes(entry.path()); bytes.ok()) on_disk += *bytes;
  }
  std::printf(
      "wrote %s (%s%s): %zu tensors in %zu shard(s), %llu tensor bytes, %llu bytes on disk\n",
      opt.dir.c_str(), opt.layout.c_str(), opt.synth.full_size ? ", full size, sparse" : "",
      written->tensors().size(), written->shard_count(),
      static_cast<unsigned long long>(written->total_tensor_bytes()),
      static_cast<unsigned long long>(on_disk));
  return 0;
}

const CommandRegistrar kSynth{{
    "synth",
    "Write a synthetic checkpoint of a real FP4/FP8 MoE layout (small, or full-size sparse)",
    [](CLI::App& app) -> std::function<int()> {
      auto opt = std::make_shared<SynthCliOptions>();
      std::string names;
      for (const synth::LayoutInfo& info : synth::layouts()) {
        names += "\n  " + std::string(info.name) + ": " + std::string(info.description);
      }
      app.add_option("layout", opt->layout, "layout:" + names);
      app.add_option("dir", opt->dir, "output directory (must not exist)");
      app.add_flag("--list-layouts", opt->list_layouts, "print the layout names, one per line");
      app.add_option("--layers", opt->synth.layers, "MoE layers (small layouts)")
          ->capture_default_str();
      app.add_option("--experts", opt->synth.experts, "routed experts per layer (small layouts)")
          ->capture_default_str();
      app.add_flag("--full-size", opt->synth.full_size,
                   "real layer and expert counts, every tensor a file hole (header-only use)");
      app.add_option("--seed", opt->synth.seed, "seed of the random data")->capture_default_str();
      return [opt] { return run_synth(*opt); };
    },
    15,
}};

}  // namespace
}  // namespace fp4moe::cli
