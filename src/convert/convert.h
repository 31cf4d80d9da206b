// Checkpoint conversion, streamed tensor by tensor through checkpoint/writer.h with the configs
// rewritten in the dialect engines read:
//   MXFP4 -> NVFP4  without loss (formats/transcode.h)
//   BF16 or FP8 block -> NVFP4  by NVIDIA ModelOpt's recipe (formats/block.h)
//   BF16 or FP8 block -> MXFP4  by the OCP rule, in DeepSeek-V4's stock layout
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/writer.h"
#include "core/status.h"
#include "formats/transcode.h"

namespace fp4moe::convert {

// The routed experts of the main layers, as DeepSeek-V3/V4, Kimi and GLM name them. MTP/draft
// layers (`mtp.*`) are left out, as NVIDIA's DeepSeek-V4 NVFP4 checkpoint leaves them MXFP4.
inline const std::vector<std::string> kDefaultModulePatterns = {"layers.*.ffn.experts.*",
                                                                "model.layers.*.mlp.experts.*"};

struct ConvertProgress {
  uint64_t bytes_done = 0;  // source bytes consumed so far
  uint64_t bytes_total = 0;
  size_t tensors_done = 0;
  size_t tensors_total = 0;
};

enum class TargetFormat { kNvfp4, kMxfp4 };

struct ConvertOptions {
  TargetFormat to = TargetFormat::kNvfp4;
  std::vector<std::string> module_patterns = kDefaultModulePatterns;  // fnmatch globs
  // Replace an existing destination: it must be a checkpoint directory (config.json or
  // *.safetensors) or empty, and it is swapped out atomically only after the new one is complete
  // and checked, so a failed or interrupted run leaves it exactly as it was.
  bool force = false;
  uint64_t max_shard_bytes = 5'000'000'000;
  std::function<void(const ConvertProgress&)> on_progress;  // after each source tensor
  // Set (e.g. by SIGINT) to stop: the partial output is removed, the destination left as it was,
  // and the error is ErrorKind::kInterrupted.
  const std::atomic<bool>* cancel = nullptr;
  // Progress of removing partial output (after an error or cancel) or a replaced destination.
  checkpoint::RemoveProgressFn on_remove_progress;
  // `fp4moe check` runs on the source before anything is written and on the output before it is
  // renamed into place; an error finding refuses the source / fails the output unless its id is
  // listed here (proceeding on purpose, e.g. to re-quantize a module with a NaN scale away).
  std::vector<std::string> allow_findings;
};

struct ConvertSummary {
  formats::TranscodeReport report;  // MXFP4 -> NVFP4 transcodes, all groups merged
  size_t modules_converted = 0;
  size_t modules_transcoded = 0;      // of which MXFP4 -> NVFP4, losslessly
  size_t modules_quantized = 0;       // of which quantized from BF16 / FP8 values
  double max_quantize_rel_error = 0;  // worst ||dequant(q) - w|| / ||w|| of a quantized module
  size_t tensors_copied = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  double seconds = 0.0;
  nlohmann::json config;           // the config.json written
  nlohmann::json hf_quant_config;  // the hf_quant_config.json written
};

// Converts the modules of `source` matching the patterns and copies everything else verbatim.
// NVFP4 output uses ModelOpt's tensor names (weight U8, weight_scale F8_E4M3 per 16,
// weight_scale_2 F32); w1/w3 (gate/up) of one expert share one weight_scale_2. MXFP4 output uses
// DeepSeek-V4's (weight I8, scale F8_E8M0 per 32). The source's own scale tensors are dropped.
// Errors name the module and reason. On any error or cancel nothing is left: the destination is
// as it was before (absent, or with `force` the old checkpoint, untouched), no partial directory
// remains. The source must pass `fp4moe check` (error findings refuse it, quoted, unless allowed);
// the output is opened, inspected and checked before it is renamed into place (an error finding
// there is an ErrorKind::kFailed error).
Result<ConvertSummary> convert_checkpoint(const std::filesystem::path& source,
                                          const std::filesystem::path& destination,
                                          const ConvertOptions& options);

}  // namespace fp4moe::convert
