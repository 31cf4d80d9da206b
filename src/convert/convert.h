// Checkpoint conversion, streamed tensor by tensor through checkpoint/writer.h with the configs
// rewritten in the dialect engines read:
//   MXFP4 -> NVFP4  without loss (formats/transcode.h), gpt-oss's fused experts included
//   compressed-tensors NVFP4 -> ModelOpt NVFP4  exactly (re-labeled; reciprocal tensor scale)
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
#include "detect/directory.h"
#include "formats/transcode.h"

namespace fp4moe::convert {

struct ConvertProgress {
  uint64_t bytes_done = 0;  // source bytes consumed so far
  uint64_t bytes_total = 0;
  size_t tensors_done = 0;
  size_t tensors_total = 0;
};

enum class TargetFormat { kNvfp4, kMxfp4 };

// How converted NVFP4 modules are declared (docs/ENGINES.md has the contract per engine).
//   kW4A4:  ModelOpt `NVFP4`, what NVIDIA's DeepSeek-V4-Flash-NVFP4 says and the only spelling
//           the DeepSeek-V4 paths of released SGLang (0.5.14+) and vLLM (0.22+) route to their
//           NVFP4 MoE methods; it declares FP4 activations, so every module gets an
//           `input_scale` (calibrated from --activation-amax, or the documented default).
//   kW4A16: ModelOpt `W4A16_NVFP4`, weight-only, no `input_scale`; read by the generic ModelOpt
//           paths (modelopt_mixed), not by the DeepSeek-V4 ones.
enum class Nvfp4Dialect { kW4A4, kW4A16 };
std::string_view dialect_name(Nvfp4Dialect dialect);  // "NVFP4" / "W4A16_NVFP4"

// The activation amax assumed for a module no calibration covers: 6 * 448, so that
// input_scale = amax / (6 * 448) = 1.0 (ModelOpt's convention, FORMATS.md §2). Engines that run
// NVFP4 weights through a weight-only kernel (Marlin) never read it; W4A4 kernels quantize
// activations with it, so convert's report flags every module that got it as uncalibrated.
inline constexpr double kDefaultActivationAmax = 6.0 * 448.0;

// Calibrated activation maxima, per module glob (first match wins), read from a file by
// `read_activation_amax` (format in docs/CONVERT.md: {"format": "fp4moe.activation_amax.v1",
// "amax": [{"modules": GLOB, "amax": X}, ...]}).
struct ActivationAmax {
  std::string modules;  // fnmatch glob over module names, e.g. "layers.3.ffn.experts.*.w2"
  double amax = 0;      // finite, > 0
};
Result<std::vector<ActivationAmax>> read_activation_amax(const std::filesystem::path& file);

struct ConvertOptions {
  TargetFormat to = TargetFormat::kNvfp4;
  Nvfp4Dialect dialect = Nvfp4Dialect::kW4A4;
  // kW4A4 only: every converted module must match one entry; empty: the default amax for all.
  std::vector<ActivationAmax> activation_amax;
  // fnmatch globs over module names; empty: the routed experts of the main layers as model/'s
  // family table names them for this checkpoint (model::find_moe_naming), and for NVFP4 in the
  // plain ModelOpt form (every family but DeepSeek-V4) also the shared experts and the dense MLP,
  // as NVIDIA's NVFP4 releases of those families; plus every compressed-tensors NVFP4 module of a
  // compressed-tensors source. MTP/draft layers (`mtp.*`, DeepSeek-V3's layers from
  // num_hidden_layers on) are left out, as NVIDIA's NVFP4 checkpoints leave them.
  std::vector<std::string> module_patterns;
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
  // A further check of the complete output, after inspect and `fp4moe check` and before it is
  // renamed into place (cli/ uses it for `convert --engine`: the engine rules must route the
  // output right). An error fails the conversion as an output-check failure: nothing is published.
  std::function<Status(const std::filesystem::path& staged, const detect::InspectedDirectory&)>
      check_output;
};

struct ConvertSummary {
  formats::TranscodeReport report;  // MXFP4 -> NVFP4 transcodes, all groups merged
  size_t modules_converted = 0;
  size_t modules_transcoded = 0;  // of which MXFP4 -> NVFP4, losslessly
  size_t modules_quantized = 0;   // of which quantized from BF16 / FP8 values
  size_t modules_relabeled = 0;   // of which compressed-tensors NVFP4, re-labeled exactly
  // Plain ModelOpt form (Qwen3-MoE, MiniMax-M2, ...): FP8 block-128 linears not converted are
  // written in BF16, as NVIDIA's NVFP4 checkpoints of FP8 releases keep them (docs/CONVERT.md).
  size_t modules_dequantized = 0;
  double max_dequantize_rel_error = 0;  // worst ||bf16(w) - w|| / ||w|| of those
  double max_quantize_rel_error = 0;    // worst ||dequant(q) - w|| / ||w|| of a quantized module
  size_t tensors_copied = 0;
  Nvfp4Dialect dialect = Nvfp4Dialect::kW4A4;  // NVFP4 output only
  size_t input_scales_calibrated = 0;          // kW4A4: modules whose input_scale came from a file
  size_t input_scales_default = 0;             // kW4A4: modules given kDefaultActivationAmax
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
